"""Building a Config from a YAML file (:func:`load_config`), a mapping (:func:`config_from_mapping`)
or another config (:func:`derive`); every problem one line of a ConfigError naming file and line,
key path, what was found and what is allowed."""

from __future__ import annotations

import copy
import math
import os
import re
import reprlib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from patchbench import inputs
from patchbench.config.schema import ROUNDS_KEY, Config, parse_rounds, sections
from patchbench.errors import ConfigError, PatchError
from patchbench.inputs import line_of, read_text_file, read_yaml_mapping
from patchbench.patches import diffs, manifest
from patchbench.suite import get_suite, suite_names, suite_params_model

#: where a key path is, for messages: ``(key path) -> "file:line"`` (or just a name)
Where = Callable[[tuple], str]

#: location items pydantic adds for the members of a union (not keys of the YAML)
_UNION_TAGS = {"str", "DiffPatch", "GitSource", "WheelSource", "function-plain[_section()]"}
#: the member of the ``sglang:`` union a mapping means, by the key it has
_SOURCE_KEYS = {"GitSource": "git", "WheelSource": "wheel"}
_KEY_IN_MESSAGE = re.compile(r"^((?:variants|server|baseline)(?:\.[\w.-]+?)*(?:\[\d+\])?)(?::| is)")


def file_where(path: Path, text: str) -> Where:
    """The :data:`Where` of a YAML file: ``path:line`` of the key path (``path`` alone when the
    text does not have it)."""

    def where(loc: tuple) -> str:
        line = line_of(text, loc) if loc else None
        return f"{path}:{line}" if line else str(path)

    return where


def load_config(path: str | os.PathLike, *, check_files: bool = True) -> Config:
    """Load and validate a YAML config (its ``source`` is the file); :class:`ConfigError` naming
    the file, key and line for any problem."""
    path = Path(path)
    text, raw = read_yaml_mapping(
        path, ConfigError, "name, sglang, model, variants, suites, ...", "config file"
    )
    cfg = config_from_mapping(raw, file_where(path, text), check_files=check_files)
    cfg.source = path.resolve()
    return cfg


def config_from_mapping(
    raw: dict[str, Any], where: str | Where = "config", *, check_files: bool = True
) -> Config:
    """Validate a config mapping as :func:`load_config` validates a file: the models, every
    suite's parameters and ``rounds``, no infinite value where a finite one is needed, a balanced
    order for timed suites and (``check_files``) every named patch and diff file. ``where``: the
    origin in messages (a name or a :data:`Where`). Raises :class:`ConfigError`, one line per
    problem."""
    at: Where = (lambda loc: str(where)) if isinstance(where, (str, os.PathLike)) else where
    raw = dict(raw)
    problems: list[str] = []
    # the two sections first, so that their errors keep their full key path
    for name, model in sections().items():
        if isinstance(raw.get(name), dict):
            try:
                raw[name] = model.model_validate(raw[name])
            except ValidationError as e:
                problems.append(format_errors(at, e, raw, (name,)))
                raw[name] = None
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        problems.append(format_errors(at, e, raw))
        raise ConfigError("\n".join(problems)) from None
    known = suite_names()
    for name, params in cfg.suites.items():
        if name not in known:
            problems.append(
                f"{at(('suites', name))}: unknown suite '{name}' under suites; "
                f"allowed: {', '.join(known)}"
            )
            continue
        problems += _suite_problems(cfg, name, dict(params or {}), at)
    for loc, v in _infinite_values(cfg, ()) + [
        hit for name, p in cfg.suite_params.items() for hit in _infinite_values(p, ("suites", name))
    ]:
        problems.append(
            f"{at(loc)}: key '{'.'.join(str(x) for x in loc)}': {v} is not a usable value (an "
            "infinite time, count or limit never ends); write a finite number"
        )
    problems += _balance_problems(cfg, at)
    problems += _decide_on_problems(cfg, at)
    if check_files:
        problems += _patch_problems(cfg, raw, at)
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


def derive(cfg: Config, changes: dict[str, Any], *, check_files: bool = True) -> Config:
    """A new config: ``cfg`` with dotted keys set (``{"schedule.repeats": 3, "variants": {...}}``,
    :func:`set_dotted`), validated by :func:`config_from_mapping` (messages name ``cfg``'s
    source); no ``source``. ``repeats: auto`` stays unless ``changes`` sets the repeats."""
    raw = cfg.model_dump(mode="json")
    if cfg.schedule.auto:
        raw["schedule"]["repeats"] = "auto"
    for key, value in changes.items():
        try:
            set_dotted(raw, key, value)
        except ValueError as e:
            raise ConfigError(f"{cfg.source or cfg.name}: {e}") from None
    return config_from_mapping(
        raw, f"{cfg.source or cfg.name} (with {', '.join(changes)})", check_files=check_files
    )


def set_dotted(raw: dict, key: str, value: Any) -> None:
    """Set ``key`` (``a.b.c``) in the nested mapping ``raw`` (a deep copy of ``value``), making
    mappings on the way. ValueError when a part is empty or holds something else."""
    parts = key.split(".")
    if not all(parts):
        raise ValueError(f"'{key}' is not a dotted key (empty part)")
    node = raw
    for i, p in enumerate(parts[:-1]):
        nxt = node.get(p)
        if nxt is None:
            nxt = node[p] = {}
        elif not isinstance(nxt, dict):
            raise ValueError(
                f"'{'.'.join(parts[: i + 1])}' holds {type(nxt).__name__}, not a "
                f"mapping, so '{key}' cannot be set"
            )
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)


# ----------------------------------------------------------------------------- sequential looks
def sequential_primaries(cfg: Config) -> list[tuple[str, str, Any, float]]:
    """[(suite, metric, MetricInfo, margin %)] of the primaries that grow with a sequential run's
    looks: run-level metrics with a direction of timed suites in every round (others gain
    nothing from more repeats). A margin of 0: no equivalence stop. Unknown suites are skipped
    (their own problem)."""
    every = list(range(cfg.schedule.max_repeats))
    out = []
    for s in cfg.suites:
        if s not in suite_names() or s not in cfg.suite_params:
            continue
        obj = get_suite(s)
        if not obj.timed or cfg.rounds_of(s) != every:
            continue
        for m, info in obj.declarations(cfg.suite_params[s]).items():
            if info.primary and info.kind == "run" and info.better in ("higher", "lower"):
                out.append((s, m, info, float(cfg.compare.margin_for(s, m, info.margin) or 0.0)))
    return out


def _decide_on_problems(cfg: Config, at: Where) -> list[str]:
    """``schedule.repeats.decide_on``: each name (``metric`` or ``suite.metric``) must be one of
    :func:`sequential_primaries`, named once."""
    seq = cfg.schedule.sequential
    if seq is None or not seq.decide_on:
        return []
    prim = sequential_primaries(cfg)
    names = {m for _, m, _, _ in prim} | {f"{s}.{m}" for s, m, _, _ in prim}
    allowed = ", ".join(m for _, m, _, _ in prim) or "none (no run-level primary in every round)"
    problems = []
    loc = ("schedule", "repeats", "decide_on")
    for i, x in enumerate(seq.decide_on):
        if x not in names:
            problems.append(
                f"{at(loc)}: schedule.repeats.decide_on[{i}]: '{x}' is not a run-level primary "
                f"measured in every round; allowed: {allowed} (or suite.metric)"
            )
    matched = [{f"{s}.{m}" for s, m, _, _ in prim if x in (m, f"{s}.{m}")} for x in seq.decide_on]
    flat = [k for ks in matched for k in ks]
    if len(flat) != len(set(flat)):
        problems.append(f"{at(loc)}: schedule.repeats.decide_on names a primary twice")
    return problems


# ----------------------------------------------------------------------------- suites
def _suite_problems(cfg: Config, name: str, own: dict, at: Where) -> list[str]:
    """Validate suite ``name``'s parameters into ``cfg.suite_params`` and its core ``rounds``
    key into ``cfg.suite_rounds``; the problems."""
    problems = []
    timed = bool(get_suite(name).timed)
    model = suite_params_model(name)
    if ROUNDS_KEY in own:  # a core key, not one of the suite's parameters
        key = f"suites.{name}.{ROUNDS_KEY}"
        try:
            cfg.suite_rounds[name] = parse_rounds(
                own.pop(ROUNDS_KEY),
                cfg.schedule.max_repeats,
                key,
                floor=cfg.nightly.min_repeats if cfg.schedule.auto else None,
            )
            if cfg.suite_rounds[name] != "all" and not timed:
                raise ValueError(
                    f"{key}: suite '{name}' runs only in the untimed correctness cells "
                    "(one per variant), never in timed rounds; remove the key"
                )
        except ValueError as e:
            problems.append(f"{at(('suites', name, ROUNDS_KEY))}: {e}")
    try:
        cfg.suite_params[name] = model.model_validate(own)
    except ValidationError as e:
        msg = format_errors(at, e, own, ("suites", name))
        allowed = ", ".join([*model.model_fields, ROUNDS_KEY])
        problems.append(
            msg if "allowed keys:" in msg else f"{msg}\n  (suite '{name}' accepts: {allowed})"
        )
    return problems


def _balance_problems(cfg: Config, at: Where) -> list[str]:
    """``order: sequential`` (a drift moves later arms more) is refused for timed suites unless
    ``schedule.unbalanced_reason`` says why."""
    if cfg.schedule.order != "sequential" or cfg.schedule.unbalanced_reason:
        return []
    timed = [s for s in cfg.suites if s in suite_names() and get_suite(s).timed]
    if not timed:
        return []
    return [
        f"{at(('schedule', 'order'))}: schedule.order: sequential runs the variants in the same "
        f"order every round, so a drift during the run biases the timed suites "
        f"({', '.join(timed)}); use order: interleaved, or give the reason in "
        "schedule.unbalanced_reason (the report's Methods repeat it)"
    ]


def _patch_problems(cfg: Config, raw: dict, at: Where) -> list[str]:
    """Problems of the patches the variants name: missing, invalid manifest, no diff for the
    release, a diff file that is missing or changes what no patch may."""
    problems = []
    for variant, spec in cfg.variants.items():
        long_form = isinstance((raw.get("variants") or {}).get(variant), dict)
        for i, p in enumerate(spec.patches):
            loc = ("variants", variant) + (("patches", i) if long_form else (i,))
            head = f"{at(loc)}: variants.{variant}.patches[{i}]"
            if isinstance(p, str):
                d = inputs.PATCHES_DIR / p
                if not (d / "manifest.yaml").is_file():
                    have = manifest.available_patches()
                    problems.append(
                        f"{head}: patch '{p}' not found (expected {d}/manifest.yaml); "
                        f"available: {', '.join(have) or 'none'}"
                    )
                    continue
                release = cfg.release_of(variant)
                try:
                    m = manifest.load_manifest(p)
                    if release is not None:  # a build resolved at run time is checked then
                        m.release(release)
                except PatchError as e:
                    problems.append(f"{head}: {e}")
                continue
            f = cfg.resolve_path(p.diff)
            if f.is_dir():
                problems.append(f"{head}: diff {f} is a directory, not a diff file")
            elif not f.is_file():
                problems.append(
                    f"{head}: diff file {f} does not exist (relative paths resolve "
                    f"against {inputs.REPO_ROOT})"
                )
            else:
                try:
                    diffs.inspect_diff(read_text_file(f, PatchError, "diff file"), source=str(f))
                except PatchError as e:
                    problems.append(f"{head}: {e}")
    return problems


def _infinite_values(model: BaseModel, loc: tuple) -> list[tuple[tuple, float]]:
    """Every ``(key path, value)`` under ``model`` that is an infinite float where the field's
    default is not infinite (infinity is a setting only where it is the default's meaning, e.g.
    ``serving.request_rate``; a timeout or limit would wait or count forever)."""
    out: list[tuple[tuple, float]] = []

    def walk(v: Any, at: tuple, default: Any) -> None:
        if isinstance(v, float) and math.isinf(v):
            if not (isinstance(default, float) and math.isinf(default)):
                out.append((at, v))
        elif isinstance(v, BaseModel):
            out.extend(_infinite_values(v, at))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, (*at, i), None)
        elif isinstance(v, dict):  # mappings of models (variants); raw ``suites`` mappings are
            for k, x in v.items():  # checked through their validated models
                if isinstance(x, BaseModel):
                    walk(x, (*at, k), None)

    for name, field in type(model).model_fields.items():
        if not field.exclude:
            walk(getattr(model, name, None), (*loc, field.alias or name), field.default)
    return out


# ----------------------------------------------------------------------------- messages
def _clean_loc(loc: tuple) -> tuple:
    return tuple(x for x in loc if not (isinstance(x, str) and (x in _UNION_TAGS or "[" in x)))


def _loc_of_message(msg: str) -> tuple:
    """The key path a model-level message starts with (``variants.v.server_args[2]: ...``)."""
    m = _KEY_IN_MESSAGE.match(msg)
    if not m:
        return ()
    out: list = []
    for part in m.group(1).split("."):
        idx = re.fullmatch(r"(.*)\[(\d+)\]", part)
        out += [idx.group(1), int(idx.group(2))] if idx else [part]
    return tuple(out)


def _value_at(data: Any, loc: tuple) -> Any:
    """The value at key path ``loc`` of ``data`` (None if absent)."""
    for k in _clean_loc(loc):
        if isinstance(data, dict) and k in data:
            data = data[k]
        elif isinstance(data, list) and isinstance(k, int) and k < len(data):
            data = data[k]
        else:
            return None
    return data


def _short_repr(value: Any) -> str:
    """``repr`` cut to about 80 characters, lists keeping their first items and closing bracket."""
    r = reprlib.Repr()
    r.maxlist = r.maxtuple = 4
    r.maxstring = r.maxother = 60
    return r.repr(value)


def format_errors(
    at: Where, err: ValidationError, data: Any, prefix: tuple = (), model: type = Config
) -> str:
    """One line per problem of ``err`` (raised validating ``data`` as ``model``, found at key
    path ``prefix`` of a config): where, the key, the message, what was found and, for an
    unknown key, what is allowed."""
    lines: list[str] = []
    for e in err.errors():
        raw_loc = tuple(e["loc"])
        got = e.get("input")
        # a union member that does not fit the input's kind says nothing useful
        if raw_loc[-1:] == ("str",) and isinstance(got, dict):
            continue
        if raw_loc[-1:] == ("DiffPatch",) and not isinstance(got, dict):
            continue
        member = next((x for x in raw_loc if x in _SOURCE_KEYS), None)
        if member is not None:  # a mapping under sglang: report only the member it names
            parent = _value_at(data, raw_loc[: raw_loc.index(member)])
            if not isinstance(parent, dict) or (
                _SOURCE_KEYS[member] not in parent and set(_SOURCE_KEYS.values()) & set(parent)
            ):
                continue
        loc = prefix + _clean_loc(raw_loc)
        text = e["msg"].removeprefix("Value error, ")
        if not loc and e["type"] == "value_error":
            lines.append(f"{at(_loc_of_message(text))}: {text}")
            continue
        key = ".".join(str(x) for x in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            allowed = allowed_keys(loc[:-1], model)
            msg = f"unknown key '{key}'" + (
                f"; allowed keys: {', '.join(allowed)}" if allowed else ""
            )
        elif e["type"] == "missing":
            msg = f"missing required key '{key}'"
        else:
            hint = ""
            if e["type"] == "string_type" and isinstance(got, (int, float, bool)):
                hint = f'; quote it: "{str(got).lower() if isinstance(got, bool) else got}"'
            elif e["type"] in ("int_type", "float_type") and isinstance(got, bool):
                hint = "; a boolean is not a number"
            # a message that already quotes the value ("..., got 0") does not repeat it
            said = f"got {got!r}" in text or f"got {got}" in text
            shown = _short_repr(got) if not isinstance(got, dict) else "a mapping"
            msg = f"key '{key}': {text}" + (f" (got {shown}{hint})" if not said or hint else "")
        lines.append(f"{at(loc)}: {msg}")
    return "\n".join(dict.fromkeys(lines))  # a union reports one problem per member


def allowed_keys(loc: tuple, model: Any = Config) -> list[str]:
    """The keys ``model`` allows at key path ``loc`` (for 'unknown key' messages; [] when
    unknown); a config's ``suites.<name>`` are the suite's ``Params``."""
    if model is Config and loc[:1] == ("suites",):
        rest = [k for k in loc[1:] if not isinstance(k, int)]
        if not rest:
            return suite_names()
        if rest[0] not in suite_names():
            return []
        model: Any = suite_params_model(rest[0])
        for k in rest[1:]:
            f = model.model_fields.get(k)
            ann = f.annotation if f else None
            if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                return []
            model = ann
        return [*model.model_fields] + ([ROUNDS_KEY] if len(rest) == 1 else [])
    keys = list(loc)
    while keys:
        key = keys.pop(0)
        if isinstance(key, int):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or key not in fields:
            return []
        if model is Config and key in ("compare", "nightly"):
            model = sections()[key]
            continue
        ann = fields[key].annotation
        if typing.get_origin(ann) is list:
            ann = typing.get_args(ann)[0]
        elif typing.get_origin(ann) is dict:  # name -> model: skip the name
            ann = typing.get_args(ann)[1]
            if not keys:
                return []
            keys.pop(0)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return [k for k, f in model.model_fields.items() if not f.exclude]
