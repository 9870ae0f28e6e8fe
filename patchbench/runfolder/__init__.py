"""The typed run-folder model: one reader and one writer for every file of a run folder.

Layout (docs/CONTRACTS.md, "Run folder")::

    RUN/manifest.json                       RunManifest
    RUN/<variant>/rep<k>/cell.json          CellRecord
    RUN/<variant>/rep<k>/<suite>/summary.json   SuiteSummary
    RUN/compare.json                        patchbench.comparison.Comparison

Every model carries ``schema_version``. Reading (:func:`read_manifest`, :func:`read_cell`,
:func:`read_summary`):

- a file written by an older schema is migrated on read (the returned model has the current
  version, ``migrated_from`` says which one it was);
- a file written by a newer schema raises :class:`SchemaTooNew` naming the file and both versions
  (exit 2: this patchbench is too old for the folder);
- a cell or summary file that is not JSON or does not have the model's shape gives a record with
  ``status="unreadable"`` and a note naming the file, so the rest of a report still renders; an
  unreadable manifest raises :class:`RunFolderError` (nothing can be read without it).

Writing (:func:`write_manifest`, :func:`write_cell`, :func:`write_summary`) always goes through
:func:`patchbench.records.write_json` (atomic) and stamps the current schema version.
Models keep unknown keys (``extra="allow"``): older folders carry keys this version dropped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from patchbench import records
from patchbench.errors import ConfigError

#: current schema versions (bump together with a migration in ``_migrate_*``)
MANIFEST_SCHEMA = 2
CELL_SCHEMA = 2
SUMMARY_SCHEMA = 2

CellStatus = Literal["ok", "failed", "incomplete", "interrupted", "running", "unreadable"]
SuiteStatus = Literal["ok", "incomplete", "failed", "unreadable"]


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


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class ServerRecord(_Model):
    """The server of one cell: pid (process-group leader), pgid, lifecycle events
    (``[{"t": seconds, "event": ...}]`` as the server module records them), the command line."""

    pid: int | None = None
    pgid: int | None = None
    events: list[Any] = Field(default_factory=list)
    command: list[str] | str | None = None


class CellRecord(_Model):
    """``RUN/<variant>/rep<k>/cell.json``: what happened in one (variant, repeat) cell.

    index: position in the run's schedule (None in old folders); status: ok | failed | incomplete
    | interrupted | running | unreadable; suites: {suite: its summary status}; timings_s:
    {step: seconds} (``server_start``, ``suite:<name>``, ``flush:<name>``, ``server_stop``,
    ``cell``); started_at / ended_at: UTC ISO stamps; instrumented: in-server instrumentation ran
    in this cell (its timings feed no verdict); cell_kind: "timed" (timings feed verdicts) or
    "correctness" (instrumented / untimed suites only); instrumentation: {suite: what that
    suite's collect() returned}; notes: reader notes (e.g. why the record is unreadable).
    """

    schema_version: int = CELL_SCHEMA
    variant: str = ""
    repeat: int = 0
    index: int | None = None
    status: CellStatus = "ok"
    error: str | None = None
    suites: dict[str, str] = Field(default_factory=dict)
    timings_s: dict[str, float | None] = Field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None
    server: ServerRecord = Field(default_factory=ServerRecord)
    instrumented: bool = False
    cell_kind: Literal["timed", "correctness"] = "timed"
    instrumentation: dict[str, dict[str, Any]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    migrated_from: int | None = None


class SuiteSummary(_Model):
    """``RUN/<variant>/rep<k>/<suite>/summary.json``: one suite's result in one cell.

    status: ok | incomplete | failed | unreadable; metrics: {name_with_unit: float or None};
    errors / warnings: lines for the report; meta: anything else the suite kept; bounds:
    {metric: "lower" | "upper"} for values that only bound the true value (absent: exact).
    """

    schema_version: int = SUMMARY_SCHEMA
    suite: str = ""
    status: SuiteStatus = "ok"
    metrics: dict[str, float | None] = Field(default_factory=dict)
    errors: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)
    bounds: dict[str, Literal["lower", "upper"]] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    migrated_from: int | None = None


class RunManifest(_Model):
    """``RUN/manifest.json``: the run as a whole.

    config: the resolved config (``Config.model_dump(mode="json")``: ``variants``, ``baseline``,
    ``schedule``, ``suites``, ``compare``, ...); patches: {variant: [{"name", "sha256"}]};
    cells: the schedule's cells as last recorded (each a cell.json-like dict with at least
    ``variant``, ``repeat``, ``status``); started_at / ended_at: UTC ISO stamps (ended_at None
    while running); interrupted: the run was stopped by a signal.
    """

    schema_version: int = MANIFEST_SCHEMA
    run_id: str = ""
    config_path: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    sglang_version: str | None = None
    model: str | None = None
    patches: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    overlays: dict[str, Any] = Field(default_factory=dict)
    git_sha: str | None = None
    host: dict[str, Any] = Field(default_factory=dict)
    gpu: Any = None
    environment: dict[str, Any] = Field(default_factory=dict)
    cells: list[dict[str, Any]] = Field(default_factory=list)
    started_at: str | None = None
    ended_at: str | None = None
    interrupted: bool = False
    timings_s: dict[str, Any] = Field(default_factory=dict)
    migrated_from: int | None = None

    # -- conveniences used by the analysis (read-only views of ``config``) --------------------
    @property
    def variants(self) -> dict[str, list[str]]:
        """{variant: patch names} from the config (baseline first when the config says so)."""
        v = self.config.get("variants") or {}
        if isinstance(v, dict):
            return {
                k: list(p.get("patches", p) if isinstance(p, dict) else (p or []))
                for k, p in v.items()
            }
        return {}

    @property
    def baseline(self) -> str:
        """Name of the baseline variant (the config's ``baseline``, else the first variant)."""
        return self.config.get("baseline") or next(iter(self.variants), "baseline")

    @property
    def repeats(self) -> int:
        """``schedule.repeats`` of the config (1 when absent; for a sequential schedule
        ``{min, max, step}`` its ``min``; the rounds that really ran are read from the cells)."""
        r = (self.config.get("schedule") or {}).get("repeats") or 1
        if isinstance(r, dict):
            r = r.get("min") or 1
        return int(r)

    @property
    def suites(self) -> list[str]:
        """Suite names of the config, in config order."""
        return list((self.config.get("suites") or {}).keys())


# -- migrations ------------------------------------------------------------------------------


def _version_of(raw: dict) -> int:
    """Schema version of a raw dict: ``schema_version``, else the old ``schema`` key, else 1."""
    v = raw.get("schema_version", raw.get("schema", 1))
    try:
        return int(v)
    except (TypeError, ValueError):
        return 1


def _migrate_cell(raw: dict) -> dict:
    """Version 1 -> 2: no ``schema_version``; the in-server mrope probe's counts lived under
    ``mrope_probe`` and ran inside timed cells (now ``instrumented`` / ``instrumentation``)."""
    raw = dict(raw)
    raw.pop("schema", None)
    if raw.get("server") is None:
        raw["server"] = {}
    if "mrope_probe" in raw:
        raw.setdefault("instrumentation", {"sync_probe": raw.get("mrope_probe") or {}})
        raw.setdefault("instrumented", True)
    return raw


def _migrate_summary(raw: dict) -> dict:
    """Version 1 -> 2: only ``schema_version`` added."""
    raw = dict(raw)
    raw.pop("schema", None)
    return raw


def _migrate_manifest(raw: dict) -> dict:
    """Version 1 (``"schema": 1`` or no key) -> 2: ``schema`` renamed ``schema_version``."""
    raw = dict(raw)
    raw.pop("schema", None)
    return raw


_MIGRATIONS = {
    "cell": (CELL_SCHEMA, _migrate_cell),
    "summary": (SUMMARY_SCHEMA, _migrate_summary),
    "manifest": (MANIFEST_SCHEMA, _migrate_manifest),
}


def _upgrade(kind: str, raw: dict, path: Path) -> dict:
    current, migrate = _MIGRATIONS[kind]
    found = _version_of(raw)
    if found > current:
        raise SchemaTooNew(path, found, current)
    if found < current:
        raw = migrate(raw)
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


def _why(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ())) or "(top level)"
    return f"key {loc}: {err.get('msg')} (found {err.get('input')!r})"[:300]


# -- readers ---------------------------------------------------------------------------------


def _path(p: str | os.PathLike, name: str) -> Path:
    p = Path(p)
    return p / name if p.is_dir() else p


def read_manifest(path: str | os.PathLike) -> RunManifest:
    """The manifest of a run folder (``path`` = the folder or its ``manifest.json``).

    Raises RunFolderError naming the file when it is missing, not JSON or mis-shaped;
    SchemaTooNew when it was written by a newer patchbench.
    """
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
    try:
        return RunManifest.model_validate(raw)
    except ValidationError as e:
        raise RunFolderError(f"{p}: {_why(e)}") from None


def _validated(p: Path, kind: str, model: type[BaseModel]) -> tuple[Any, str | None]:
    """(``p`` read, upgraded and validated as ``model``, None), or (None, why it is unreadable);
    :class:`SchemaTooNew` propagates."""
    try:
        return model.model_validate(_upgrade(kind, _load(p), p)), None
    except SchemaTooNew:
        raise
    except ValidationError as e:
        return None, _why(e)
    except (OSError, ValueError) as e:
        return None, str(e)


def read_cell(path: str | os.PathLike, *, variant: str = "", repeat: int = 0) -> CellRecord | None:
    """The record of one cell (``path`` = the cell folder or its ``cell.json``).

    None when the file does not exist. A file that is not JSON or not shaped like a CellRecord
    gives ``CellRecord(status="unreadable", notes=[<file and why>])`` with ``variant`` /
    ``repeat`` from the arguments. Raises SchemaTooNew for a newer schema.
    """
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
    """One suite's summary in one cell (``path`` = the suite folder or its ``summary.json``).

    None when the file does not exist; ``status="unreadable"`` with a note naming the file when
    it is not JSON or mis-shaped (a metric that is not a number, an unknown status ...). Raises
    SchemaTooNew for a newer schema.
    """
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
    d = model.model_dump(mode="json")
    if d.get("migrated_from") is None:
        d.pop("migrated_from", None)
    return d


def write_manifest(run_dir: str | os.PathLike, manifest: RunManifest | dict) -> Path:
    """Validate and write ``RUN/manifest.json`` atomically; returns its path.
    Raises pydantic.ValidationError for a dict of the wrong shape (before anything is written)."""
    m = manifest if isinstance(manifest, RunManifest) else RunManifest.model_validate(manifest)
    m.schema_version = MANIFEST_SCHEMA
    return records.write_json(Path(run_dir) / "manifest.json", _dump(m))


def write_cell(cell_dir: str | os.PathLike, record: CellRecord | dict) -> Path:
    """Validate and write ``<cell_dir>/cell.json`` atomically; returns its path."""
    r = record if isinstance(record, CellRecord) else CellRecord.model_validate(record)
    r.schema_version = CELL_SCHEMA
    return records.write_json(Path(cell_dir) / "cell.json", _dump(r))


def write_summary(suite_dir: str | os.PathLike, summary: SuiteSummary | dict) -> Path:
    """Validate and write ``<suite_dir>/summary.json`` atomically; returns its path.
    Accepts a SuiteSummary or a dict such as ``SuiteResult.to_json(suite)``."""
    s = summary if isinstance(summary, SuiteSummary) else SuiteSummary.model_validate(summary)
    s.schema_version = SUMMARY_SCHEMA
    return records.write_json(Path(suite_dir) / "summary.json", _dump(s))


def json_schemas() -> dict[str, dict]:
    """JSON Schema of each run-folder model (docs/CONTRACTS.md is checked against these)."""
    return {
        "manifest.json": RunManifest.model_json_schema(),
        "cell.json": CellRecord.model_json_schema(),
        "summary.json": SuiteSummary.model_json_schema(),
    }
