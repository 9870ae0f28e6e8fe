"""The matrix file (docs/scale-out.md, "The matrix file"): its schema, its expansion into units
with stable ids (:func:`unit_id`), and their configs, validated in memory; an error names the unit
and the matrix line that set the key, or the base config's line."""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from patchbench.config import LATEST, Config, config_from_mapping, sglang_label
from patchbench.config.load import Where, format_errors, set_dotted
from patchbench.errors import ConfigError
from patchbench.inputs import FOLDER_NAME, REPO_ROOT, line_of, read_yaml_mapping

#: the special axis that routes a unit instead of setting a config key
GPU_AXIS = "gpu_type"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Resources(_Strict):
    """What one unit asks of a node: a count, or "node" (every GPU/CPU of the smallest node that
    can take it: a timing run owns its node)."""

    num_gpus: int | float | Literal["node"] = "node"
    num_cpus: int | float | Literal["node"] = "node"

    @field_validator("num_gpus", "num_cpus")
    @classmethod
    def _positive(cls, v):
        if not isinstance(v, str) and v < 0:
            raise ValueError('must be >= 0 or "node"')
        return v


class UnitEntry(_Strict):
    """One explicit unit: a config file, the GPU type it runs on, dotted keys set on top."""

    config: str
    gpu_type: str | None = None
    set: dict[str, Any] = Field(default_factory=dict)


class MatrixSpec(_Strict):
    """The validated matrix file (see the module docstring)."""

    name: str
    description: str = ""
    base: str | None = None
    axes: dict[str, list[Any]] = Field(default_factory=dict)
    set: dict[str, Any] = Field(default_factory=dict)
    exclude: list[dict[str, Any]] = Field(default_factory=list)
    units: list[UnitEntry] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not FOLDER_NAME.match(v):
            raise ValueError(
                "use letters, digits, '.', '_' and '-' (it names the matrix run folder)"
            )
        return v


@dataclass
class Unit:
    """One expanded unit: ``labels`` ({axis or "config": value}); ``gpu_type``: the Ray
    ``accelerator_type`` it needs (None: any); ``overrides``: {dotted key: value} set on the
    base or listed config at ``config_path``; ``config``: the validated result."""

    id: str
    labels: dict[str, Any]
    gpu_type: str | None
    overrides: dict[str, Any]
    config_path: Path
    config: Config

    @property
    def sglang(self) -> str:
        """The unit's pin (every variant runs this release)."""
        return str(self.config.sglang_of(self.config.baseline))


@dataclass
class Matrix:
    """A loaded matrix: ``path`` (the file), ``spec`` (:class:`MatrixSpec`), ``units``."""

    path: Path
    spec: MatrixSpec
    units: list[Unit]


def _slug_part(v: Any) -> str:
    if isinstance(v, str):
        s = v.rstrip("/").rsplit("/", 1)[-1] if ("/" in v and not v.startswith("-")) else v
    elif isinstance(v, (list, tuple)):
        s = "-".join(_slug_part(x) for x in v) or "none"
    elif isinstance(v, dict):
        s = "-".join(f"{k}-{_slug_part(x)}" for k, x in v.items()) or "none"
    elif v is None:
        s = "none"
    else:
        s = str(v).lower()
    s = re.sub(r"[^a-z0-9.]+", "-", s.lower()).strip("-.")
    return s[:24].strip("-.") or "x"


def unit_id(labels: dict[str, Any]) -> str:
    """``<slug of the values>-<8 hex of the sha256 of the canonical JSON of labels>``, e.g.
    ``qwen2.5-vl-3b-instruct_h200-1a2b3c4d``: the same exactly when the labels are."""
    canon = json.dumps(
        labels, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str
    )
    h = hashlib.sha256(canon.encode()).hexdigest()[:8]
    slug = "_".join(_slug_part(v) for v in labels.values())[:60].strip("_-.") or "unit"
    return f"{slug}-{h}"


def _resolve(p: str) -> Path:
    q = Path(os.path.expanduser(p))
    return q if q.is_absolute() else REPO_ROOT / q


def is_matrix_file(path: str | os.PathLike) -> bool:
    """True for a YAML mapping with ``axes``, ``units`` or ``base`` and no ``variants`` (a matrix
    rather than a config). ConfigError for an unreadable or invalid YAML file."""
    _, raw = read_yaml_mapping(Path(path), ConfigError, "a config or a matrix", "config file")
    return "variants" not in raw and any(k in raw for k in ("axes", "units", "base"))


def _where(path: Path, text: str, *loc: str | int) -> str:
    """``<path>:<line>`` of the key path ``loc`` in the matrix file (no line when not found)."""
    return f"{path}:{line_of(text, loc) or ''}"


def load_matrix(path: str | os.PathLike) -> Matrix:
    """Load, expand and validate a matrix file; units in file order (the first axis slowest).
    Raises :class:`patchbench.errors.ConfigError` (exit 2) listing every problem with its file,
    key and line (for a unit's config: the unit and the matrix or base config line)."""
    path = Path(path)
    text, raw = read_yaml_mapping(path, ConfigError, "name, base, axes, set, units, ...")
    where = functools.partial(_where, path, text)
    spec = _validated_spec(raw, where)
    problems = _spec_problems(spec, path, where)
    if problems:
        raise ConfigError("\n".join(problems))
    plans = _plans(spec, where, problems)
    if problems:
        raise ConfigError("\n".join(problems))
    units = _units(path, spec, plans, where, problems)
    if problems:
        raise ConfigError("\n".join(problems))
    if not units:
        raise ConfigError(f"{path}: the matrix has no units")
    return Matrix(path, spec, units)


def _validated_spec(raw: dict, where) -> MatrixSpec:
    """``raw`` as a :class:`MatrixSpec`, else ConfigError with one line per problem."""
    try:
        return MatrixSpec.model_validate(raw)
    except ValidationError as e:
        msg = format_errors(lambda loc: where(*loc), e, raw, model=MatrixSpec)
        raise ConfigError(msg) from None


def _spec_problems(spec: MatrixSpec, path: Path, where) -> list[str]:
    """What is wrong with a schema-valid matrix file as a whole."""
    problems: list[str] = []
    if spec.units and (spec.base or spec.axes):
        problems.append(f"{where('units')}: give either base/axes or units, not both")
    if not spec.units and not spec.base:
        problems.append(
            f"{path}: give a base config with axes, or a list of units "
            "(see `units:` / `base:` in docs/scale-out.md)"
        )
    if spec.axes and not spec.base:
        problems.append(f"{where('axes')}: axes need a base config (base: configs/....yaml)")
    for key, values in spec.axes.items():
        if not values:
            problems.append(f"{where('axes', key)}: axes.{key}: give at least one value")
        canon = [json.dumps(v, sort_keys=True, default=str) for v in values]
        for i, c in enumerate(canon):
            if c in canon[:i]:
                problems.append(
                    f"{where('axes', key, i)}: axes.{key}[{i}]: {values[i]!r} is listed twice"
                )
        if key == GPU_AXIS and not all(isinstance(v, str) and v for v in values):
            problems.append(
                f"{where('axes', key)}: axes.{key}: GPU types are names such as H200 "
                "(Ray's accelerator_type)"
            )
    if GPU_AXIS in spec.set:
        problems.append(
            f"{where('set', GPU_AXIS)}: set.{GPU_AXIS}: the GPU type is an axis or a "
            "unit's gpu_type, not a config key"
        )
    for i, ex in enumerate(spec.exclude):
        for k, v in ex.items():
            if k not in spec.axes:
                problems.append(
                    f"{where('exclude', i, k)}: exclude[{i}].{k}: not an axis "
                    f"(axes: {', '.join(spec.axes) or 'none'})"
                )
            elif v not in spec.axes[k]:
                problems.append(
                    f"{where('exclude', i, k)}: exclude[{i}].{k}: {v!r} is not one of "
                    f"axes.{k}'s values"
                )
    return problems


class _Plan(NamedTuple):
    """One unit before its config is merged: the base or listed config, what distinguishes it,
    its GPU type, the dotted keys set on its config and {dotted key: matrix file:line}."""

    config_path: Path
    labels: dict[str, Any]
    gpu_type: str | None
    overrides: dict[str, Any]
    lines: dict[str, str]


def _plans(spec: MatrixSpec, where, problems: list[str]) -> list[_Plan]:
    """The units in file order: every combination not excluded, or the listed units."""
    set_lines = {k: where("set", k) for k in spec.set}
    if not spec.base:
        plans = []
        for i, u in enumerate(spec.units):
            labels: dict[str, Any] = {"config": u.config}
            if u.gpu_type:
                labels[GPU_AXIS] = u.gpu_type
            if u.set:
                labels["set"] = u.set
            lines = {**set_lines, **{k: where("units", i, "set", k) for k in u.set}}
            overrides = {**spec.set, **u.set}
            plans.append(_Plan(_resolve(u.config), labels, u.gpu_type, overrides, lines))
        return plans
    base = _resolve(spec.base)
    keys = list(spec.axes)
    plans, used_ex = [], set()
    for combo in itertools.product(*(range(len(spec.axes[k])) for k in keys)):
        labels = {k: spec.axes[k][i] for k, i in zip(keys, combo, strict=True)}
        hit = [
            j for j, ex in enumerate(spec.exclude) if all(labels.get(k) == v for k, v in ex.items())
        ]
        if hit:
            used_ex.update(hit)
            continue
        overrides = {**spec.set, **{k: v for k, v in labels.items() if k != GPU_AXIS}}
        lines = {**set_lines, **{k: where("axes", k, i) for k, i in zip(keys, combo, strict=True)}}
        plans.append(_Plan(base, labels, labels.get(GPU_AXIS), overrides, lines))
    for j in range(len(spec.exclude)):
        if j not in used_ex:
            problems.append(f"{where('exclude', j)}: exclude[{j}] matches no combination")
    return plans


def _units(
    path: Path, spec: MatrixSpec, plans: list[_Plan], where, problems: list[str]
) -> list[Unit]:
    """The validated unit of every plan; a unit with a problem is left out, its problem added."""
    units: list[Unit] = []
    seen: dict[str, int] = {}
    bases: dict[Path, tuple[str, dict]] = {}
    for n, plan in enumerate(plans):
        uid = unit_id(plan.labels)
        if uid in seen:
            problems.append(
                f"{path}: units {seen[uid] + 1} and {n + 1} are the same "
                f"({uid}); list each combination once"
            )
            continue
        seen[uid] = n
        if plan.config_path not in bases:
            try:
                bases[plan.config_path] = read_yaml_mapping(
                    plan.config_path,
                    ConfigError,
                    "name, sglang, model, variants, suites, ...",
                    "config file",
                )
            except ConfigError as e:
                key = ("base",) if spec.base else ("units", n, "config")
                problems.append(f"{where(*key)}: {e}")
                bases[plan.config_path] = ("", {})
                continue
        base_text, base_raw = bases[plan.config_path]
        if base_raw:
            unit = _merged_unit(plan, uid, base_text, base_raw, path, problems)
            if unit is not None:
                units.append(unit)
    return units


def _unit_where(plan: _Plan, base_text: str) -> Where:
    """Where a key of a unit's config is: the matrix line that set it (axes or ``set``), else
    the line of its base config."""

    def at(loc: tuple) -> str:
        dotted = ".".join(str(x) for x in loc)
        src = next(
            (
                k
                for k in sorted(plan.overrides, key=len, reverse=True)
                if dotted == k
                or dotted.startswith(k + ".")
                or (dotted and k.startswith(dotted + "."))
            ),
            None,
        )
        if src is not None:
            return f"{plan.lines.get(src, '')} (set by the matrix: {src})"
        return f"{plan.config_path}:{(line_of(base_text, loc) if loc else None) or ''}"

    return at


def _merged_unit(
    plan: _Plan, uid: str, base_text: str, base_raw: dict, path: Path, problems: list[str]
) -> Unit | None:
    """The unit of ``plan`` (its base config with its overrides set, validated); None, its
    problems added, when it does not validate."""
    merged = copy.deepcopy(base_raw)
    bad = False
    for k, v in plan.overrides.items():
        try:
            set_dotted(merged, k, v)
        except ValueError as e:
            problems.append(f"{plan.lines.get(k, path)}: unit {uid}: {e}")
            bad = True
    if bad:
        return None
    try:
        cfg = config_from_mapping(merged, _unit_where(plan, base_text))
    except ConfigError as e:
        shown = ", ".join(f"{k}={v}" for k, v in plan.labels.items())
        problems.append(
            f"unit {uid} ({shown}): its config does not validate:\n"
            + "\n".join(f"  {line}" for line in str(e).splitlines())
        )
        return None
    if cfg.schedule.auto:
        at = plan.lines.get("schedule.repeats") or str(plan.config_path)
        problems.append(
            f"{at}: unit {uid}: schedule.repeats: auto is for a single nightly config "
            "(`patchbench nightly CONFIG`); a matrix unit runs a fixed number: set "
            "schedule.repeats to a number (in the matrix's set or the unit's config)"
        )
        return None
    specs = {v: cfg.sglang_of(v) for v in cfg.variants}
    if (
        any(not isinstance(x, str) or x == LATEST for x in specs.values())
        or len(set(map(str, specs.values()))) != 1
    ):
        shown = ", ".join(sorted({sglang_label(x) for x in specs.values()}))
        problems.append(
            f"{plan.config_path}: unit {uid}: sglang {shown}: a matrix unit runs one release "
            "for all its variants (environments are made per release); name a release such as "
            '"0.5.23", or run a git checkout, a wheel, latest or mixed builds with `bench`'
        )
        return None
    return Unit(uid, plan.labels, plan.gpu_type, plan.overrides, plan.config_path, cfg)
