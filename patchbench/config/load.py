"""Loading a config file: :func:`load_config` reads the YAML (:mod:`patchbench.inputs`), validates
it against the models (:mod:`patchbench.config.schema`), each suite's parameters against the
suite's ``Params`` and the patches the variants name against ``patches/``, and turns every problem
into one line of a :class:`patchbench.errors.ConfigError` naming the file, the key path, the line,
what was found and what is allowed.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

import patchbench.config.schedule as _sched
from patchbench import inputs
from patchbench import suite as _suite
from patchbench.config.schema import SECTIONS, Config
from patchbench.errors import ConfigError, PatchError
from patchbench.inputs import line_of, read_text_file, read_yaml_mapping
from patchbench.patches import diffs, manifest
from patchbench.suite import suite_names


def _params_model(name: str) -> type[BaseModel]:
    """The ``Params`` model of the registered suite ``name``. KeyError when unknown."""
    return _suite.suite_params_model(name)


def _suite_is_timed(name: str) -> bool:
    """False for a suite that runs only in the untimed correctness cells (``Suite.timed``)."""
    return bool(_suite.get_suite(name).timed)


#: location items pydantic adds for the members of a union (not keys of the YAML)
_UNION_TAGS = {"str", "DiffPatch", "GitSource", "WheelSource", "function-plain[_section()]"}
#: the member of the ``sglang:`` union a mapping means, by the key it has
_SOURCE_KEYS = {"GitSource": "git", "WheelSource": "wheel"}


def _clean_loc(loc: tuple) -> tuple:
    return tuple(x for x in loc if not (isinstance(x, str) and (x in _UNION_TAGS or "[" in x)))


_KEY_IN_MESSAGE = re.compile(r"^((?:variants|server|baseline)(?:\.[\w.-]+?)*(?:\[\d+\])?)(?::| is)")


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


def _format_errors(path: Path, text: str, err: ValidationError, prefix: tuple = ()) -> str:
    lines = []
    seen = set()
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
            parent = _value_at(raw_loc[: raw_loc.index(member)], err)
            if not isinstance(parent, dict) or (
                _SOURCE_KEYS[member] not in parent and set(_SOURCE_KEYS.values()) & set(parent)
            ):
                continue
        loc = prefix + _clean_loc(raw_loc)
        text_ = e["msg"].removeprefix("Value error, ")
        if not loc and e["type"] == "value_error":
            mloc = _loc_of_message(text_)
            where = line_of(text, mloc) if mloc else None
            msg = f"{path}:{where}: {text_}" if where else f"{path}: {text_}"
            if msg not in seen:
                seen.add(msg)
                lines.append(msg)
            continue
        key = ".".join(str(x) for x in loc) or "(top level)"
        where = line_of(text, loc)
        at = f"{path}:{where}" if where else f"{path}"
        if e["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            allowed = f"; allowed keys: {', '.join(parent)}" if parent else ""
            msg = f"{at}: unknown key '{key}'{allowed}"
        elif e["type"] == "missing":
            msg = f"{at}: missing required key '{key}'"
        else:
            got_s = _short_repr(got) if not isinstance(got, dict) else "a mapping"
            hint = ""
            if e["type"] == "string_type" and isinstance(got, (int, float, bool)):
                hint = f'; quote it: "{str(got).lower() if isinstance(got, bool) else got}"'
            elif e["type"] in ("int_type", "float_type") and isinstance(got, bool):
                hint = "; a boolean is not a number"
            # a message that already quotes the value ("..., got 0") does not repeat it
            said = f"got {got!r}" in text_ or f"got {got}" in text_
            tail = f" (got {got_s}{hint})" if not said or hint else ""
            msg = f"{at}: key '{key}': {text_}{tail}"
        if msg not in seen:  # a union reports one problem per member
            seen.add(msg)
            lines.append(msg)
    return "\n".join(lines)


def _value_at(loc: tuple, err: ValidationError) -> Any:
    """The input value at key path ``loc`` of the data ``err`` was raised for (None if absent)."""
    data: Any = getattr(err, "_patchbench_input", None)
    for k in _clean_loc(loc):
        if isinstance(data, dict) and k in data:
            data = data[k]
        elif isinstance(data, list) and isinstance(k, int) and k < len(data):
            data = data[k]
        else:
            return None
    return data


def _short_repr(value: Any) -> str:
    """``repr`` cut to about 80 characters the way :mod:`reprlib` cuts it: lists keep their
    first items and their closing bracket (``['--port=1234', '--x', ...]``)."""
    r = reprlib.Repr()
    r.maxlist = r.maxtuple = 4
    r.maxstring = r.maxother = 60
    return r.repr(value)


def _model_at(loc: tuple) -> list[str]:
    """Allowed keys of the model at a key path (for 'unknown key' messages)."""
    if loc[:1] == ("suites",):
        rest = [k for k in loc[1:] if not isinstance(k, int)]
        if not rest:
            return suite_names()
        if rest[0] not in suite_names():
            return []
        model: Any = _params_model(rest[0])
        for k in rest[1:]:
            f = model.model_fields.get(k)
            ann = f.annotation if f else None
            if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                return []
            model = ann
        core = [_sched.ROUNDS_KEY] if len(rest) == 1 else []
        return [k for k in model.model_fields] + core
    model = Config
    keys = list(loc)
    while keys:
        key = keys.pop(0)
        if isinstance(key, int):
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or key not in fields:
            return []
        if model is Config and key in ("compare", "nightly"):
            model = SECTIONS[key]
            continue
        ann = fields[key].annotation
        if typing.get_origin(ann) is dict:  # name -> model: skip the name
            ann = typing.get_args(ann)[1]
            if keys:
                keys.pop(0)
            elif not keys:
                return []
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if model is None:
            return []
    return [k for k, f in model.model_fields.items() if not f.exclude]


def _infinite_values(model: BaseModel, loc: tuple) -> list[tuple[tuple, float]]:
    """Every ``(key path, value)`` under ``model`` (nested models, lists and mappings of them)
    that is an infinite float where the field's own default is not infinite: infinity is a
    setting only where it is the default's meaning (``serving.request_rate``: all at once);
    elsewhere (timeouts, stall limits, pauses, temperatures) it waits or counts forever."""
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
        elif isinstance(v, dict):  # mappings of models (variants); raw mappings such as
            for k, x in v.items():  # ``suites`` are checked through their validated models
                if isinstance(x, BaseModel):
                    walk(x, (*at, k), None)

    for name, field in type(model).model_fields.items():
        if field.exclude:
            continue
        walk(getattr(model, name, None), (*loc, field.alias or name), field.default)
    return out


def load_config(path: str | os.PathLike, *, check_files: bool = True) -> Config:
    """Load and validate a YAML config.

    Validates the file (see :func:`read_yaml_mapping`), the top level, every suite's parameters
    against the suite's ``Params``, the ``compare`` and ``nightly`` sections against their models,
    and (``check_files``) that every named patch exists as ``patches/<name>/`` with a valid manifest
    that supports the config's release, and that every diff named directly exists and changes
    only what a patch may (:func:`patchbench.patches.diffs.inspect_diff`).

    Returns a :class:`Config` whose ``suite_params`` holds the validated suite models.
    Raises :class:`ConfigError` naming the file, key and line for any problem.
    """
    path = Path(path)
    text, raw = read_yaml_mapping(
        path, ConfigError, "name, sglang, model, variants, suites, ...", "config file"
    )
    problems: list[str] = []
    # the two sections first, so that their errors keep their full key path
    for section in ("compare", "nightly"):
        if section in raw and isinstance(raw[section], dict):
            try:
                raw[section] = SECTIONS[section].model_validate(raw[section])
            except ValidationError as e:
                problems.append(_format_errors(path, text, e, (section,)))
                raw[section] = None
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as e:
        e._patchbench_input = raw  # type: ignore[attr-defined] # for _value_at
        problems.append(_format_errors(path, text, e))
        raise ConfigError("\n".join(problems)) from None
    cfg.source = path.resolve()
    known = suite_names()
    for name, params in cfg.suites.items():
        if name not in known:
            where = line_of(text, ("suites", name))
            problems.append(
                f"{path}:{where or ''}: unknown suite '{name}' under suites; "
                f"allowed: {', '.join(known)}"
            )
            continue
        model = _params_model(name)
        own = dict(params or {})
        if _sched.ROUNDS_KEY in own:  # a core key, not one of the suite's parameters
            rounds = own.pop(_sched.ROUNDS_KEY)
            key = f"suites.{name}.{_sched.ROUNDS_KEY}"
            where = line_of(text, ("suites", name, _sched.ROUNDS_KEY))
            try:
                cfg.suite_rounds[name] = _sched.parse_rounds(
                    rounds,
                    cfg.schedule.max_repeats,
                    key,
                    floor=cfg.nightly.min_repeats if cfg.schedule.auto else None,
                )
                if cfg.suite_rounds[name] != "all" and not _suite_is_timed(name):
                    raise ValueError(
                        f"{key}: suite '{name}' runs only in the untimed correctness cells "
                        "(one per variant), never in timed rounds; remove the key"
                    )
            except ValueError as e:
                problems.append(f"{path}:{where or ''}: {e}")
        try:
            cfg.suite_params[name] = model.model_validate(own)
        except ValidationError as e:
            msg = _format_errors(path, text, e, ("suites", name))
            allowed = ", ".join([*model.model_fields, _sched.ROUNDS_KEY])
            problems.append(
                msg
                if "allowed keys:" in msg  # an unknown key lists them already
                else f"{msg}\n  (suite '{name}' accepts: {allowed})"
            )
    for loc, v in _infinite_values(cfg, ()) + [
        hit for name, p in cfg.suite_params.items() for hit in _infinite_values(p, ("suites", name))
    ]:
        key = ".".join(str(x) for x in loc)
        problems.append(
            f"{path}:{line_of(text, loc) or ''}: key '{key}': {v} is not a usable value (an "
            "infinite time, count or limit never ends); write a finite number"
        )
    problems += _check_balance(cfg, path, text, known)
    if check_files:
        problems += _check_patches(cfg, path, text)
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


def _check_balance(cfg: Config, path: Path, text: str, known: list[str]) -> list[str]:
    """``schedule.order: sequential`` (every round runs the variants in the same order: a drift
    during the run moves later arms more) is refused for timed suites unless
    ``schedule.unbalanced_reason`` says why."""
    if cfg.schedule.order != "sequential" or cfg.schedule.unbalanced_reason:
        return []
    timed = [s for s in cfg.suites if s in known and _suite_is_timed(s)]
    if not timed:
        return []
    where = line_of(text, ("schedule", "order"))
    return [
        f"{path}:{where or ''}: schedule.order: sequential runs the variants in the same order "
        f"every round, so a drift during the run biases the timed suites ({', '.join(timed)}); "
        "use order: interleaved, or give the reason in schedule.unbalanced_reason (the report's "
        "Methods repeat it)"
    ]


def _check_patches(cfg: Config, path: Path, text: str) -> list[str]:
    """Problems with the patches the variants name (missing, invalid manifest, no diff for the
    config's release, a diff file that is missing or changes what no patch may)."""
    problems = []
    for variant, spec in cfg.variants.items():
        key = (
            ("variants", variant, "patches")
            if line_of(text, ("variants", variant, "patches"))
            else ("variants", variant)
        )
        for i, p in enumerate(spec.patches):
            where = line_of(text, key + (i,)) or line_of(text, ("variants", variant))
            at = f"{path}:{where or ''}: variants.{variant}.patches[{i}]"
            if isinstance(p, str):
                d = inputs.PATCHES_DIR / p
                if not (d / "manifest.yaml").is_file():
                    have = manifest.available_patches()
                    problems.append(
                        f"{at}: patch '{p}' not found (expected {d}/manifest.yaml); "
                        f"available: {', '.join(have) or 'none'}"
                    )
                    continue
                release = cfg.release_of(variant)
                try:
                    m = manifest.load_manifest(p)
                    if release is not None:  # a build resolved at run time is checked then
                        m.release(release)
                except PatchError as e:
                    problems.append(f"{at}: {e}")
            else:
                f = cfg.resolve_path(p.diff)
                if f.is_dir():
                    problems.append(f"{at}: diff {f} is a directory, not a diff file")
                elif not f.is_file():
                    problems.append(
                        f"{at}: diff file {f} does not exist (relative paths resolve "
                        f"against {inputs.REPO_ROOT})"
                    )
                else:
                    try:
                        diffs.inspect_diff(
                            read_text_file(f, PatchError, "diff file"), source=str(f)
                        )
                    except PatchError as e:
                        problems.append(f"{at}: {e}")
    return problems
