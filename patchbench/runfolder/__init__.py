"""One reader and one writer for every file of a run folder (docs/design.md, "The run folder";
docs/CONTRACTS.md). Reading migrates older schemas and fits the manifest's settings (each fix
noted in ``RunManifest.config_notes``); a newer schema raises :class:`SchemaTooNew` (exit 2)."""

from __future__ import annotations

import json
import os
import shlex
import types
import typing
from pathlib import Path
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from patchbench import records
from patchbench.config.schema import sections
from patchbench.errors import ConfigError
from patchbench.runfolder.models import (
    CELL_SCHEMA,
    MANIFEST_SCHEMA,
    SUMMARY_SCHEMA,
    CellRecord,
    RunManifest,
    SuiteSummary,
)


class RunFolderError(ConfigError):
    """A run-folder file cannot be used (missing or unreadable manifest); names the file (exit 2)."""

    kind = "run folder error"


class SchemaTooNew(RunFolderError):
    """A file was written by a newer patchbench; names the file and both schema versions (exit 2)."""

    def __init__(self, path: Path, found: int, supported: int):
        super().__init__(
            f"{path}: written with schema version {found}, this patchbench reads up to "
            f"version {supported}; update patchbench to read this run folder"
        )
        self.path, self.found, self.supported = Path(path), found, supported


# -- migrations ------------------------------------------------------------------------------


def _version_of(raw: dict) -> int:
    """Schema version of a raw dict: ``schema_version``, else the old ``schema`` key, else 1."""
    v = raw.get("schema_version", raw.get("schema", 1))
    try:
        return int(v)
    except (TypeError, ValueError):
        return 1


def _cell_1_to_2(raw: dict) -> dict:
    """``schema_version`` added; the in-server mrope probe's counts (``mrope_probe``, in timed
    cells) become ``instrumented`` / ``instrumentation``."""
    raw.pop("schema", None)
    if raw.get("server") is None:
        raw["server"] = {}
    if "mrope_probe" in raw:
        raw.setdefault("instrumentation", {"sync_probe": raw.pop("mrope_probe") or {}})
        raw.setdefault("instrumented", True)
    return raw


def _schema_key_renamed(raw: dict) -> dict:
    """``schema`` renamed ``schema_version`` (written by ``_upgrade``)."""
    raw.pop("schema", None)
    return raw


def _keys_declared(raw: dict) -> dict:
    """Every key declared from this version on: nothing renamed; :func:`_upgrade` then drops
    the keys the current version does not declare."""
    return raw


def _optional_keys_added(raw: dict) -> dict:
    """Optional keys added (manifest 5: ``host.cpu_usable``, 6: ``machine``, 7:
    ``machine.driver``; cell 4: ``load_avg_1m``, 5: ``gpu.driver``, ``gpu.devices``,
    ``server_metrics``, ``server_config``): an older
    file reads as it is, without them."""
    return raw


def _declared_only(model: type[BaseModel], raw: Any) -> Any:
    """``raw`` without the keys that ``model`` (and every model inside it) does not declare or
    never writes (``exclude``)."""
    if not isinstance(raw, dict):
        return raw
    out = {}
    for name, f in model.model_fields.items():
        if f.exclude:
            continue
        key = f.alias or name
        if key in raw:
            out[key] = _fit(f.annotation, raw[key])
    return out


def _fit(tp: Any, value: Any) -> Any:
    """``value`` with undeclared keys dropped wherever the annotation ``tp`` holds a model."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _declared_only(tp, value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list and isinstance(value, list) and args:
        return [_fit(args[0], v) for v in value]
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return {k: _fit(args[1], v) for k, v in value.items()}
    if origin in (Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(value, dict) and models:  # the member that declares most of its keys
            return _declared_only(
                max(models, key=lambda m: len(set(value) & set(m.model_fields))), value
            )
        lists = [a for a in args if typing.get_origin(a) is list]
        if isinstance(value, list) and lists:
            return _fit(lists[0], value)
    return value


#: {kind: (model, {version: step to version + 1})}; older versions then lose undeclared keys
_MIGRATIONS: dict[str, tuple[type[BaseModel], dict[int, Any]]] = {
    "cell": (
        CellRecord,
        {1: _cell_1_to_2, 2: _keys_declared, 3: _optional_keys_added, 4: _optional_keys_added},
    ),
    "summary": (SuiteSummary, {1: _schema_key_renamed}),
    "manifest": (
        RunManifest,
        {
            1: _schema_key_renamed,
            2: _keys_declared,
            3: _keys_declared,
            4: _optional_keys_added,
            5: _optional_keys_added,
            6: _optional_keys_added,
        },  # fmt: skip
    ),
}
_CURRENT = {"cell": CELL_SCHEMA, "summary": SUMMARY_SCHEMA, "manifest": MANIFEST_SCHEMA}


def _upgrade(kind: str, raw: dict, path: Path) -> dict:
    model, steps = _MIGRATIONS[kind]
    current, found = _CURRENT[kind], _version_of(raw)
    if found > current:
        raise SchemaTooNew(path, found, current)
    if found < current:
        raw = dict(raw)
        for v in range(max(found, 1), current):
            raw = steps[v](raw)
        raw = _declared_only(model, raw)
        raw["migrated_from"] = found
    raw["schema_version"] = current
    return raw


def _load(path: Path) -> dict:
    """Raw JSON object of ``path``; raises ValueError (with the reason) when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, found {type(raw).__name__}")
    return raw


def why_invalid(e: ValidationError) -> str:
    """The first problem of a validation error as one line: the key, the message, the value."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ())) or "(top level)"
    return f"key {loc}: {err.get('msg')} (found {err.get('input')!r})"[:300]


# -- readers ---------------------------------------------------------------------------------


def _path(p: str | os.PathLike, name: str) -> Path:
    p = Path(p)
    return p / name if p.is_dir() else p


def read_manifest(path: str | os.PathLike) -> RunManifest:
    """The manifest of a run folder (the folder or its ``manifest.json``). Raises RunFolderError
    naming the file when it is missing, not JSON or mis-shaped; SchemaTooNew."""
    if not Path(path).exists():
        raise RunFolderError(
            f"{path}: no such folder; a run folder is what `patchbench bench` writes "
            "(results/<stamp>-<config name>/)"
        )
    p = _path(path, "manifest.json")
    if not p.exists():
        raise RunFolderError(
            f"{p}: no manifest.json; a run folder is what `patchbench bench` "
            "writes (results/<stamp>-<config name>/)"
        )
    try:
        raw = _load(p)
    except (OSError, ValueError) as e:
        raise RunFolderError(f"{p}: {e}") from None
    raw = _upgrade("manifest", raw, p)
    notes = _fit_settings(raw.get("config"))
    try:
        m = RunManifest.model_validate(raw)
    except ValidationError as e:
        raise RunFolderError(f"{p}: {why_invalid(e)}") from None
    m.config_notes = notes
    return m


def resume_command(
    run_dir: str | os.PathLike,
    config_path: str | os.PathLike | None = None,
    port: int | None = None,
    prog: str = "patchbench",
) -> str:
    """The one command line that resumes ``run_dir``: ``PROG bench [CONFIG] --resume RUN [--port
    N]``. ``config_path``: the config's file (None for a config built in memory, as ``ab``'s: the
    manifest holds it); ``port``: the ``--port`` the run was given (``RunManifest.port``); the
    results folder is the run folder's parent. Paths are quoted for a POSIX shell."""
    words = ["bench", *([str(config_path)] if config_path else []), "--resume", str(run_dir)]
    words += ["--port", str(port)] if port else []
    return f"{prog} {shlex.join(words)}"


#: stored settings keys that were read by nothing (removing them changes no result)
SILENT_DROPS = {"compare": {"retokenized_change_share"}}


def _fit_settings(config: Any) -> dict[str, list[str]]:
    """Fit a stored config's ``compare`` and ``nightly`` settings in place (module docstring);
    {section: notes}."""
    notes: dict[str, list[str]] = {}
    if not isinstance(config, dict):
        return notes
    for name, model in sections().items():
        raw = config.get(name)
        if not isinstance(raw, dict):
            continue
        kept = {k: v for k, v in raw.items() if k in model.model_fields}
        # keys that never changed a result leave without a note
        dropped = sorted(set(raw) - set(kept) - SILENT_DROPS.get(name, set()))
        if dropped:
            notes.setdefault(name, []).append(
                f"{name} settings {', '.join(dropped)} are no longer used and were ignored"
            )
        try:
            model.model_validate(kept)
        except ValidationError as e:
            notes.setdefault(name, []).append(
                f"{name} settings of the manifest are invalid ({e.errors()[0]['msg']}); "
                "defaults used"
            )
            kept = {}
        config[name] = kept
    return notes


def _validated(p: Path, kind: str, model: type[BaseModel]) -> tuple[Any, str | None]:
    """(``p`` read, upgraded and validated as ``model``, None), or (None, why it is unreadable);
    :class:`SchemaTooNew` propagates."""
    try:
        return model.model_validate(_upgrade(kind, _load(p), p)), None
    except SchemaTooNew:
        raise
    except ValidationError as e:
        return None, why_invalid(e)
    except (OSError, ValueError) as e:
        return None, str(e)


def read_cell(path: str | os.PathLike, *, variant: str = "", repeat: int = 0) -> CellRecord | None:
    """The record of one cell (the folder or its ``cell.json``); None when absent; an unreadable
    one is ``status="unreadable"`` with a note (``variant`` / ``repeat`` from the arguments).
    Raises SchemaTooNew."""
    p = _path(path, "cell.json")
    if not p.exists():
        return None
    rec, why = _validated(p, "cell", CellRecord)
    if rec is not None:
        return rec
    return CellRecord(
        variant=variant,
        repeat=repeat,
        status="unreadable",
        error=f"{p}: unreadable: {why}",
        notes=[f"{p}: unreadable: {why}"],
    )


def read_summary(path: str | os.PathLike, *, suite: str = "") -> SuiteSummary | None:
    """One suite's summary in one cell (the folder or its ``summary.json``); None when absent; an
    unreadable one is ``status="unreadable"`` with a note. Raises SchemaTooNew."""
    p = _path(path, "summary.json")
    if not p.exists():
        return None
    rec, why = _validated(p, "summary", SuiteSummary)
    if rec is not None:
        return rec
    return SuiteSummary(
        suite=suite or p.parent.name,
        status="unreadable",
        errors=[f"{p}: unreadable: {why}"],
        notes=[f"{p}: unreadable: {why}"],
    )


# -- writers ---------------------------------------------------------------------------------


def _dump(model: BaseModel) -> dict:
    return model.model_dump(mode="json", by_alias=True)


def write_manifest(run_dir: str | os.PathLike, manifest: RunManifest) -> Path:
    """Write ``RUN/manifest.json`` atomically; returns its path (ResultsWriteError when it
    cannot)."""
    manifest.schema_version = MANIFEST_SCHEMA
    return records.write_json(Path(run_dir) / "manifest.json", _dump(manifest))


def write_cell(cell_dir: str | os.PathLike, record: CellRecord) -> Path:
    """Write ``<cell_dir>/cell.json`` atomically (current schema version); returns its path."""
    record.schema_version = CELL_SCHEMA
    return records.write_json(Path(cell_dir) / "cell.json", _dump(record))


def write_summary(suite_dir: str | os.PathLike, summary: SuiteSummary | dict) -> Path:
    """Validate and write ``<suite_dir>/summary.json`` atomically (a SuiteSummary or a dict;
    ValidationError before anything is written); returns its path."""
    s = summary if isinstance(summary, SuiteSummary) else SuiteSummary.model_validate(summary)
    s.schema_version = SUMMARY_SCHEMA
    return records.write_json(Path(suite_dir) / "summary.json", _dump(s))


def json_schemas() -> dict[str, dict]:
    """JSON Schema of each run-folder model (docs/CONTRACTS.md)."""
    return {
        "manifest.json": RunManifest.model_json_schema(),
        "cell.json": CellRecord.model_json_schema(),
        "summary.json": SuiteSummary.model_json_schema(),
    }
