"""The nightly history: every metric of every night, in one SQLite file (stdlib ``sqlite3``), and
what the page and the ``history`` command read from it.

One night = one run folder (:func:`night_from_run`, so a night that could not be recorded can be
appended later from its folder). Schema version 4 (``meta.schema_version``; the tables are in
docs/nightly.md): ``nights``, ``metric_values``, ``repeat_values``, ``comparisons`` (the report's
verdicts), and the derived ``noise``, ``change_points``, ``night_builds``, ``confirmations``
created by the first night that writes them. A version-1 to -3 file is migrated on open (its
nights' ``machine`` NULL: unknown), a newer one refused.

Only valid values are read back: a repeat value a suite marked (its summary incomplete or failed,
the metric withheld in ``meta.not_judged``) is stored with its ``status`` and ``reason`` and read
as None in :attr:`Night.values`, its own entry in :attr:`Night.set_aside`. That is the ONE filter
(:func:`night_from_run` for tonight, :meth:`History.nights` for the nights before): every gate,
reference, noise estimate, change point, trend and page reads ``Night.values``.

Each night is appended in ONE transaction; recording a run_id that is already there changes
nothing. Errors are :class:`HistoryError` subclasses naming the file (exit 3); the file is never
modified or replaced then.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from patchbench.analysis.comparison import Comparison, read_comparison
from patchbench.config.schema import run_id_problem
from patchbench.errors import EXIT_USAGE, EnvironmentNotReady, UsageError
from patchbench.runfolder import RunFolderError, RunManifest, read_cell, read_manifest, read_summary

SCHEMA_VERSION = 4
#: versions this code migrates on open (``version -> what changed``)
_MIGRATABLE = {
    1: "repeat_values.repeat became the run's repeat index; NULL values allowed",
    2: "repeat_values.status and .reason: a value a suite marked not valid (NULL: valid)",
    3: "nights.machine: the machine identity the night ran on (NULL: unknown)",
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nights (
    run_id TEXT PRIMARY KEY, night_utc TEXT NOT NULL, config_name TEXT NOT NULL,
    git_sha TEXT, sglang_version TEXT, baseline TEXT NOT NULL, status TEXT NOT NULL,
    run_dir TEXT, recorded_utc TEXT NOT NULL, machine TEXT);
CREATE INDEX IF NOT EXISTS nights_by_config ON nights (config_name, night_utc);
CREATE TABLE IF NOT EXISTS metric_values (
    run_id TEXT NOT NULL REFERENCES nights(run_id), variant TEXT NOT NULL, suite TEXT NOT NULL,
    metric TEXT NOT NULL, unit TEXT, better TEXT, median REAL, n_repeats INTEGER NOT NULL,
    PRIMARY KEY (run_id, variant, suite, metric));
CREATE TABLE IF NOT EXISTS repeat_values (
    run_id TEXT NOT NULL REFERENCES nights(run_id), variant TEXT NOT NULL, suite TEXT NOT NULL,
    metric TEXT NOT NULL, repeat INTEGER NOT NULL, value REAL, status TEXT, reason TEXT,
    PRIMARY KEY (run_id, variant, suite, metric, repeat));
CREATE TABLE IF NOT EXISTS comparisons (
    run_id TEXT NOT NULL REFERENCES nights(run_id), variant TEXT NOT NULL, baseline TEXT NOT NULL,
    suite TEXT NOT NULL, metric TEXT NOT NULL, change_pct REAL, ci_low_pct REAL,
    ci_high_pct REAL, ci_method TEXT, verdict TEXT,
    PRIMARY KEY (run_id, variant, suite, metric));
"""
_TABLES = ("meta", "nights", "metric_values", "repeat_values", "comparisons")

Key = tuple[str, str, str]
"""(variant, suite, metric)"""

#: what a set-aside value's ``status`` says: the suite's summary status ("incomplete": its
#: checks found the run invalid, e.g. streams a stall bunched; "failed"), or "withheld" (the
#: suite left the metric out of an ok run on purpose, ``meta.not_judged``)
SET_ASIDE = ("incomplete", "failed", "withheld")


@dataclass(frozen=True)
class SetAside:
    """A repeat value that is stored but never read as a measurement: ``status`` (one of
    :data:`SET_ASIDE`), ``value`` (the metric's unit; None when the suite wrote none) and
    ``reason`` (the suite's first error, or why it withheld the metric)."""

    status: str
    value: float | None
    reason: str


class HistoryError(EnvironmentNotReady):
    """The history file cannot be used; ``path`` names it (exit 3). Nothing in it was changed."""

    def __init__(self, path: Path, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


class RunIdRefused(HistoryError):
    """A night's run id cannot be recorded: it must name a folder (``..``, ``/`` or an empty id
    would make the dashboard write or delete outside its own folder); nothing was written
    (exit 2, "run id refused")."""

    exit_code = EXIT_USAGE
    kind = "run id refused"


class HistoryLocked(HistoryError):
    """Another process holds a lock on the history file for longer than the timeout."""


class HistoryCorrupt(HistoryError):
    """The file is not an SQLite database or fails its integrity check (it is left untouched)."""


class HistorySchemaError(HistoryError):
    """The file's schema version is not one this patchbench reads, or its tables are missing."""


@dataclass
class SameRunEffect:
    """The report's verdict on one (variant, suite, metric) of a night (a row of compare.json,
    :class:`patchbench.analysis.comparison.Row`) against the night's baseline.

    Stored: ``change_pct`` / ``ci_low_pct`` / ``ci_high_pct`` (the change and its interval at the
    level the verdict used, in %; None when the row has none or its change is not in %),
    ``ci_method``, ``verdict``. Tonight's only (not stored): ``p_value`` (two-sided),
    ``confidence`` (the interval's level) and ``relative``: (change, low, high) in % of the
    baseline's value whatever the row's unit (accuracy points, exact differences)."""

    baseline: str
    change_pct: float | None
    ci_low_pct: float | None
    ci_high_pct: float | None
    ci_method: str | None = None
    verdict: str | None = None
    p_value: float | None = field(default=None, compare=False)
    confidence: float | None = field(default=None, compare=False)
    relative: tuple[float | None, float | None, float | None] | None = field(
        default=None, compare=False
    )

    @property
    def pct(self) -> tuple[float | None, float | None, float | None]:
        """(change, low, high) in %: :attr:`relative`, else the stored percent numbers."""
        return self.relative or (self.change_pct, self.ci_low_pct, self.ci_high_pct)


@dataclass
class Night:
    """One night's numbers, as recorded (or read from a run folder before recording).

    values: (variant, suite, metric) -> one VALID value per repeat index (the metric's unit),
    None where that repeat has none or its value is set aside; set_aside: (variant, suite,
    metric) -> {repeat index: :class:`SetAside`}, the values a suite marked not valid (never in
    ``values``); units / better: (suite, metric) -> unit and direction; comparisons: (variant,
    suite, metric) -> :class:`SameRunEffect`; aa_variants: A/A copies of the baseline; status:
    "ok", or "partial" when some cells failed or a suite marked a run; machine: the identity of
    the machine it ran on (:attr:`patchbench.runfolder.models.MachineInfo.key`; None: unknown).
    """

    run_id: str
    night_utc: str
    config_name: str
    baseline: str
    git_sha: str | None = None
    sglang_version: str | None = None
    status: str = "ok"
    run_dir: str | None = None
    machine: str | None = None
    values: dict[Key, list[float | None]] = field(default_factory=dict)
    set_aside: dict[Key, dict[int, SetAside]] = field(default_factory=dict)
    units: dict[tuple[str, str], str] = field(default_factory=dict)
    better: dict[tuple[str, str], str] = field(default_factory=dict)
    comparisons: dict[Key, SameRunEffect] = field(default_factory=dict)
    aa_variants: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def median(self, key: Key) -> float | None:
        """Median over the repeats of (variant, suite, metric), or None when there is none."""
        vals = [v for v in self.values.get(key, []) if v is not None]
        return statistics.median(vals) if vals else None

    @property
    def variants(self) -> list[str]:
        """Variants with values, the baseline first."""
        seen = sorted({k[0] for k in self.values} | {k[0] for k in self.comparisons})
        return (
            [self.baseline] + [v for v in seen if v != self.baseline]
            if self.baseline in seen
            else seen
        )


# ---------------------------------------------------------------------------------------------
# reading a run folder


def utc_iso(value: str) -> str | None:
    """``YYYY-MM-DDTHH:MM:SSZ`` from an ISO-8601 stamp (any offset; naive = UTC), else None."""
    try:
        dt = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


_RUN_STAMP = re.compile(r"^(\d{8}T\d{6})Z-")


def _stamp_utc(name: str) -> str | None:
    """``YYYY-MM-DDTHH:MM:SSZ`` of a ``<UTC stamp>Z-...`` run folder name, else None."""
    m = _RUN_STAMP.match(name)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y%m%dT%H%M%S").strftime("%Y-%m-%dT%H:%M:%SZ")


def _night_utc(manifest: RunManifest, run: Path) -> str:
    """The run's start: the typed manifest's ``started_at`` (every manifest patchbench wrote has
    it; older schemas are migrated by patchbench.runfolder); for a folder whose manifest lacks
    it, the ``<UTC stamp>Z-<config>`` folder name that ``bench`` gives every run. Raises
    ValueError naming the file and the key when neither gives a time."""
    if manifest.started_at:
        got = utc_iso(manifest.started_at)
        if got is None:
            raise ValueError(
                f"{run / 'manifest.json'}: started_at is {manifest.started_at!r}, "
                f"not an ISO-8601 time (e.g. 2026-01-01T03:00:00Z)"
            )
        return got
    stamp = _stamp_utc(run.name)
    if stamp is not None:
        return stamp
    raise ValueError(
        f"{run / 'manifest.json'}: no started_at, and the folder name {run.name!r} "
        f"does not start with a UTC stamp (YYYYMMDDTHHMMSSZ-): the night's time is "
        f"unknown"
    )


def night_from_run(run_dir: str | os.PathLike, comparison: Comparison | None = None) -> Night:
    """One night from a run folder: values from every ok ``summary.json`` of a timed cell that did
    not fail (``values[key][k]`` is repeat k's, None where it has none, so variants pair by
    index), the report's verdicts, units and directions from compare.json (or ``comparison``),
    time, config, git SHA and release from the manifest (the folder's name without one).
    Failed cells and suites go to ``Night.problems`` (status "partial"). Raises
    FileNotFoundError (no folder), ValueError (no time; an unreadable compare.json),
    patchbench.runfolder.SchemaTooNew (a newer manifest).
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run folder")
    if (run / "manifest.json").is_file():
        manifest = read_manifest(run)
    else:
        manifest = RunManifest(run_id=run.name)
    if comparison is None and (run / "compare.json").is_file():
        try:
            comparison = read_comparison(run)
        except RunFolderError as e:
            raise ValueError(str(e)) from None
    cmp = comparison or Comparison()
    cfg = manifest.config
    baseline = cmp.baseline or (manifest.baseline if manifest.config else None)
    night = Night(
        run_id=str(cmp.run_id or manifest.run_id or run.name),
        night_utc=_night_utc(manifest, run),
        config_name=str((cfg.name if cfg else None) or _config_of_folder(run.name)),
        baseline=str(baseline) if baseline else "",
        git_sha=manifest.git_sha,
        sglang_version=manifest.sglang_version or (cfg.sglang if cfg else None),
        run_dir=str(run.resolve()),
        machine=manifest.machine.key if manifest.machine is not None else None,
        aa_variants=list(cmp.aa_variants),
    )
    _add_cell_values(night, run)
    add_comparison(night, cmp)
    return night


def _config_of_folder(name: str) -> str:
    """The config name a run folder's name carries (``<UTC stamp>Z-<config>``), else the name."""
    return re.sub(r"^\d{8}T\d{6}Z-", "", name) or name


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a summary's ``metrics``."""
    return {
        m: float(v)
        for m, v in metrics.items()
        if not isinstance(v, bool) and isinstance(v, (int, float))
    }


def _add_cell_values(night: Night, run: Path) -> None:
    """Every timed, not failed cell's ok summaries into ``night.values`` (by repeat index), the
    values a suite marked into ``night.set_aside`` (a summary not ok: each of its metrics; an ok
    one: each metric of its ``meta.not_judged``, "withheld"); failed cells and suites not ok
    into ``night.problems`` (the night is then "partial")."""
    found: dict[Key, dict[int, float]] = {}
    aside: dict[Key, dict[int, SetAside]] = {}
    for cell_dir in sorted(
        run.glob("*/rep*"), key=lambda p: (p.parent.name, _rep_index(p.name) or 0)
    ):
        rep = _rep_index(cell_dir.name)
        if rep is None or not cell_dir.is_dir():
            continue
        variant = cell_dir.parent.name
        cell = read_cell(cell_dir, variant=variant, repeat=rep)
        if cell is not None and cell.cell_kind == "correctness":
            continue  # instrumented cells: their timings feed no verdict
        if cell is not None and cell.status in ("failed", "unreadable"):
            night.problems.append(f"{variant}/rep{rep}: cell {cell.status}: {cell.error or '?'}")
            continue
        for summary_path in sorted(cell_dir.glob("*/summary.json")):
            suite = summary_path.parent.name
            summary = read_summary(summary_path, suite=suite)
            if summary is None:
                continue
            numbers = _numbers(summary.metrics)
            if summary.status != "ok":
                why = "; ".join(summary.errors) or "no reason given"
                night.problems.append(f"{variant}/rep{rep}/{suite}: {summary.status}: {why}")
                first = summary.errors[0].splitlines()[0] if summary.errors else why
                for metric, value in numbers.items():
                    aside.setdefault((variant, suite, metric), {})[rep] = SetAside(
                        summary.status, value, first
                    )
                continue
            withheld = summary.meta.get("not_judged")
            withheld = withheld if isinstance(withheld, dict) else {}
            for metric in withheld:
                aside.setdefault((variant, suite, str(metric)), {})[rep] = SetAside(
                    "withheld", numbers.get(metric), str(withheld[metric])
                )
            for metric, value in numbers.items():
                if metric not in withheld:
                    found.setdefault((variant, suite, metric), {})[rep] = value
    for key in sorted(found.keys() | aside.keys()):
        reps = found.get(key, {}).keys() | aside.get(key, {}).keys()
        night.values[key] = [found.get(key, {}).get(k) for k in range(max(reps) + 1)]
    night.set_aside = aside
    if night.problems:
        night.status = "partial"


def add_comparison(night: Night, cmp: Comparison) -> None:
    """The comparison's rows into ``night``: units, directions, the report's verdicts, and the
    repeats of a (variant, suite, metric) the summaries did not give (a run folder without
    summaries, or a comparison alone)."""
    for r in cmp.rows:
        if r.unit:
            night.units[(r.suite, r.metric)] = r.unit
        night.better[(r.suite, r.metric)] = r.better
        pct = r.change_unit == "%"
        per = 1.0 if pct else None
        if not pct and r.baseline_value:  # points and exact differences as % of the baseline
            per = (1.0 if r.change_unit == "pt" else 100.0) / abs(r.baseline_value)
        night.comparisons[(r.variant, r.suite, r.metric)] = SameRunEffect(
            baseline=cmp.baseline or night.baseline,
            change_pct=r.change if pct else None,
            ci_low_pct=r.low if pct else None,
            ci_high_pct=r.high if pct else None,
            ci_method=r.method,
            verdict=r.verdict,
            p_value=r.p_value,
            confidence=r.confidence,
            relative=None
            if per is None
            else tuple(None if x is None else x * per for x in (r.change, r.low, r.high)),
        )
        for who, reps in ((night.baseline, r.baseline_repeats), (r.variant, r.variant_repeats)):
            if who and reps and (who, r.suite, r.metric) not in night.values:
                night.values[(who, r.suite, r.metric)] = [
                    None if x is None else float(x) for x in reps
                ]
    if not night.baseline and night.values:
        night.baseline = sorted({k[0] for k in night.values})[0]


def _rep_index(name: str) -> int | None:
    m = re.fullmatch(r"rep(\d+)", name)
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------------------------
# the database


def _now_utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class History:
    """The history file, opened (and created with the current schema when it does not exist).

    ``History(path, timeout_s=10)``; use as a context manager or call :meth:`close`.
    Raises :class:`HistoryLocked`, :class:`HistoryCorrupt` or :class:`HistorySchemaError` (each
    naming the path) when the file cannot be used; the file is never deleted or rewritten then.
    """

    def __init__(self, path: str | os.PathLike, *, timeout_s: float = 10.0):
        self.path = Path(path).expanduser()
        self.timeout_s = timeout_s
        if self.path.is_dir():
            raise HistoryError(
                self.path,
                "is a folder; the history must be a file path "
                "(e.g. ~/.cache/patchbench/history.sqlite)",
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HistoryError(self.path, f"cannot create its folder: {e}") from None
        try:
            self._db = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
        except sqlite3.Error as e:
            raise self._wrap(e, "open") from None
        try:
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA synchronous = FULL")
            self._init_schema()
        except HistoryError:
            self._db.close()
            raise
        except sqlite3.Error as e:
            self._db.close()
            raise self._wrap(e, "open") from None

    # -- errors --------------------------------------------------------------------------------

    def _wrap(self, e: sqlite3.Error, doing: str) -> HistoryError:
        msg = str(e)
        if "locked" in msg or "busy" in msg:
            return HistoryLocked(
                self.path,
                f"locked by another process for more than "
                f"{self.timeout_s:g} s while trying to {doing} ({msg}); "
                f"retry later, or find the process holding it "
                f"(fuser {self.path})",
            )
        if isinstance(e, sqlite3.DatabaseError) and (
            "not a database" in msg or "malformed" in msg or "corrupt" in msg or "disk image" in msg
        ):
            return HistoryCorrupt(
                self.path,
                f"is not a readable SQLite database ({msg}); it was "
                f"left untouched: restore it from a backup, or move it "
                f"aside to start a new history",
            )
        return HistoryError(self.path, f"cannot {doing}: {msg}")

    # -- schema --------------------------------------------------------------------------------

    def _init_schema(self) -> None:
        tables = {
            r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                self._db.executemany(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                    [("schema_version", str(SCHEMA_VERSION)), ("created_utc", _now_utc())],
                )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            return
        if "meta" not in tables:
            raise HistorySchemaError(
                self.path,
                f"has tables {sorted(tables)} but no 'meta' table: not a patchbench history",
            )
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row and str(row[0]).isdigit() else None
        if version in _MIGRATABLE and not [t for t in _TABLES if t not in tables]:
            self._migrate(version)
            version = SCHEMA_VERSION
        if version != SCHEMA_VERSION:
            raise HistorySchemaError(
                self.path,
                f"schema version {row[0] if row else 'missing'}; this patchbench reads "
                f"version {SCHEMA_VERSION} (written by a "
                f"{'newer' if version and version > SCHEMA_VERSION else 'different'} "
                f"patchbench?)",
            )
        missing = [t for t in _TABLES if t not in tables]
        if missing:
            raise HistorySchemaError(self.path, f"tables missing: {', '.join(missing)}")
        check = self._db.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise HistoryCorrupt(
                self.path,
                f"integrity check failed ({check[0] if check else '?'}); "
                f"it was left untouched: restore it from a backup",
            )

    def _migrate(self, version: int) -> None:
        """Bring a file of an older schema version to :data:`SCHEMA_VERSION` in one
        transaction (a crash leaves the old version): ``repeat_values`` gets its ``status`` and
        ``reason`` columns (NULL: every value recorded before was read as valid), ``nights`` its
        ``machine`` (NULL: unknown, a reference only for nights of unknown machine)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for tab, col in (("repeat_values", "status"), ("repeat_values", "reason"),
                             ("nights", "machine")):  # fmt: skip
                if col not in {r[1] for r in self._db.execute(f"PRAGMA table_info({tab})")}:
                    self._db.execute(f"ALTER TABLE {tab} ADD COLUMN {col} TEXT")
            self._db.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    (f"migrated_from_{version}_utc", _now_utc()),
                ],
            )
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    @property
    def schema_version(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0])

    # -- writing -------------------------------------------------------------------------------

    def record(self, night: Night) -> bool:
        """Append one night in one transaction.

        Returns True when it was appended, False when its run_id was already there (nothing
        changed). Raises :class:`RunIdRefused` (exit 2) for a run id that cannot name a folder
        (:func:`patchbench.config.schema.run_id_problem`), :class:`HistoryLocked` (the
        transaction could not start or commit within the timeout) or another
        :class:`HistoryError`; either way the file holds none of the night.
        """
        problem = run_id_problem(night.run_id)
        if problem:
            raise RunIdRefused(
                self.path,
                f"night {night.run_id!r} (run folder {night.run_dir}) not recorded: its run id "
                f"names a folder of the dashboard's site: {problem}",
            )
        rows_values, rows_repeats, rows_cmp = _rows_of(night)
        try:
            self._db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise self._wrap(e, "start the night's transaction") from None
        try:
            if self._db.execute(
                "SELECT 1 FROM nights WHERE run_id = ?", (night.run_id,)
            ).fetchone():
                self._db.execute("ROLLBACK")
                return False
            self._db.execute(
                "INSERT INTO nights (run_id, night_utc, config_name, git_sha, sglang_version, "
                "baseline, status, run_dir, recorded_utc, machine) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    night.run_id,
                    night.night_utc,
                    night.config_name,
                    night.git_sha,
                    night.sglang_version,
                    night.baseline,
                    night.status,
                    night.run_dir,
                    _now_utc(),
                    night.machine,
                ),
            )
            self._db.executemany(
                "INSERT INTO metric_values VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows_values
            )
            self._db.executemany(
                "INSERT INTO repeat_values (run_id, variant, suite, metric, repeat, value, "
                "status, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows_repeats,
            )
            self._db.executemany(
                "INSERT INTO comparisons VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows_cmp
            )
            self._db.execute("COMMIT")
        except BaseException as e:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise self._wrap(e, "append the night") from None
            raise
        return True

    # -- reading -------------------------------------------------------------------------------

    def nights(
        self,
        config_name: str,
        *,
        before_utc: str | None = None,
        exclude_run_id: str | None = None,
        limit: int | None = None,
    ) -> list[Night]:
        """Recorded nights of one config, oldest first.

        before_utc: only nights strictly earlier (ISO-8601 UTC, as stored); exclude_run_id: leave
        one run out (tonight's); limit: only the latest ``limit`` of those.
        """
        try:
            return list(self._nights(config_name, before_utc, exclude_run_id, limit))
        except sqlite3.Error as e:
            raise self._wrap(e, "read") from None

    def each_night(self, config_name: str) -> Iterator[Night]:
        """:meth:`nights` of one config one at a time, oldest first (a long history read
        without holding every repeat of every night)."""
        try:
            yield from self._nights(config_name, None, None, None)
        except sqlite3.Error as e:
            raise self._wrap(e, "read") from None

    def _nights(
        self,
        config_name: str,
        before_utc: str | None,
        exclude_run_id: str | None,
        limit: int | None,
    ) -> Iterator[Night]:
        q = (
            "SELECT run_id, night_utc, config_name, baseline, git_sha, sglang_version, status, "
            "run_dir, machine FROM nights WHERE config_name = ?"
        )
        args: list[Any] = [config_name]
        if before_utc is not None:
            q += " AND night_utc < ?"
            args.append(before_utc)
        if exclude_run_id is not None:
            q += " AND run_id != ?"
            args.append(exclude_run_id)
        q += " ORDER BY night_utc DESC, run_id DESC"
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        rows = self._db.execute(q, args).fetchall()
        for row in reversed(rows):
            n = Night(*row)
            for variant, suite, metric, unit, better in self._db.execute(
                "SELECT variant, suite, metric, unit, better FROM metric_values WHERE run_id = ?",
                (n.run_id,),
            ):
                n.values[(variant, suite, metric)] = []
                if unit:
                    n.units[(suite, metric)] = unit
                if better:
                    n.better[(suite, metric)] = better
            for variant, suite, metric, rep, value, status, reason in self._db.execute(
                "SELECT variant, suite, metric, repeat, value, status, reason FROM repeat_values "
                "WHERE run_id = ? ORDER BY variant, suite, metric, repeat",
                (n.run_id,),
            ):
                # THE filter: a value a suite marked is never read as a measurement
                vals = n.values.setdefault((variant, suite, metric), [])
                vals += [None] * (rep + 1 - len(vals))
                if status is None:
                    vals[rep] = value
                else:
                    n.set_aside.setdefault((variant, suite, metric), {})[rep] = SetAside(
                        status, value, reason or ""
                    )
            for variant, baseline, suite, metric, chg, lo, hi, method, verdict in self._db.execute(
                "SELECT variant, baseline, suite, metric, change_pct, ci_low_pct, ci_high_pct, "
                "ci_method, verdict FROM comparisons WHERE run_id = ?",
                (n.run_id,),
            ):
                n.comparisons[(variant, suite, metric)] = SameRunEffect(
                    baseline, chg, lo, hi, method, verdict
                )
            yield n

    def count_nights(self, config_name: str | None = None) -> int:
        """Number of recorded nights (of one config, or all)."""
        try:
            if config_name is None:
                return self._db.execute("SELECT COUNT(*) FROM nights").fetchone()[0]
            return self._db.execute(
                "SELECT COUNT(*) FROM nights WHERE config_name = ?", (config_name,)
            ).fetchone()[0]
        except sqlite3.Error as e:
            raise self._wrap(e, "read") from None

    def backup(self, dest: str | os.PathLike) -> Path:
        """Copy the database consistently (sqlite3 online backup API) to ``dest``; returns it."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            with sqlite3.connect(str(dest)) as out:
                self._db.backup(out)
            out.close()
        except sqlite3.Error as e:
            raise self._wrap(e, f"back up to {dest}") from None
        return dest

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _rows_of(night: Night) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """The rows one night adds to metric_values, repeat_values and comparisons."""
    rows_values = []
    rows_repeats = []
    for variant, suite, metric in sorted(night.values.keys() | night.set_aside.keys()):
        vals = night.values.get((variant, suite, metric), [])
        rows_values.append(
            (
                night.run_id,
                variant,
                suite,
                metric,
                night.units.get((suite, metric)),
                night.better.get((suite, metric)),
                night.median((variant, suite, metric)),
                sum(1 for v in vals if v is not None),
            )
        )
        aside = night.set_aside.get((variant, suite, metric), {})
        for i in range(max(len(vals), max(aside, default=-1) + 1)):
            a = aside.get(i)
            v = vals[i] if i < len(vals) else None
            row = (v, None, None) if a is None else (a.value, a.status, a.reason)
            rows_repeats.append((night.run_id, variant, suite, metric, i, *row))
    rows_cmp = [
        (
            night.run_id,
            variant,
            c.baseline,
            suite,
            metric,
            c.change_pct,
            c.ci_low_pct,
            c.ci_high_pct,
            c.ci_method,
            c.verdict,
        )
        for (variant, suite, metric), c in sorted(night.comparisons.items())
    ]
    return rows_values, rows_repeats, rows_cmp


def dump_json(night: Night) -> dict:
    """A JSON-ready view of a night (for nightly.json): values keyed ``variant/suite/metric``, and
    the values set aside (:class:`SetAside`) by repeat index."""
    return {
        "run_id": night.run_id,
        "night_utc": night.night_utc,
        "config_name": night.config_name,
        "git_sha": night.git_sha,
        "sglang_version": night.sglang_version,
        "baseline": night.baseline,
        "status": night.status,
        "machine": night.machine,
        "problems": night.problems,
        "values": {
            f"{v}/{s}/{m}": {
                "repeats": vals,
                "median": night.median((v, s, m)),
                "n": sum(1 for x in vals if x is not None),
                "unit": night.units.get((s, m)),
            }
            for (v, s, m), vals in sorted(night.values.items())
        },
        "set_aside": {
            f"{v}/{s}/{m}": {
                str(k): {"status": a.status, "value": a.value, "reason": a.reason}
                for k, a in sorted(by_rep.items())
            }
            for (v, s, m), by_rep in sorted(night.set_aside.items())
        },
    }


# ---------------------------------------------------------------------------------------------
# derived tables: the learned noise, the change points, the builds (sglang release and patch state
# per variant) and the confirmation runs of each night (for a dashboard page).
# Created on first write (CREATE TABLE IF NOT EXISTS); they add to schema version 2 without
# changing its tables, and can be rebuilt from the nights (patchbench/nightly/noise.py,
# patchbench/nightly/changepoints.py).

_DERIVED = """
CREATE TABLE IF NOT EXISTS noise (
    config_name TEXT NOT NULL, run_id TEXT NOT NULL, suite TEXT NOT NULL, metric TEXT NOT NULL,
    source TEXT, nights INTEGER, repeats REAL, run_cv_pct REAL, pair_cv_pct REAL,
    night_cv_pct REAL, df REAL, repeats_needed INTEGER,
    PRIMARY KEY (config_name, run_id, suite, metric));
CREATE TABLE IF NOT EXISTS change_points (
    config_name TEXT NOT NULL, detected_run_id TEXT NOT NULL, variant TEXT NOT NULL,
    suite TEXT NOT NULL, metric TEXT NOT NULL, run_id TEXT NOT NULL, start_utc TEXT,
    end_run_id TEXT, end_utc TEXT, nights INTEGER, before REAL, after REAL, size_pct REAL,
    worse INTEGER, confirmed INTEGER,
    PRIMARY KEY (config_name, detected_run_id, variant, suite, metric, run_id));
CREATE TABLE IF NOT EXISTS night_builds (
    run_id TEXT NOT NULL, variant TEXT NOT NULL, sglang_release TEXT, patch TEXT NOT NULL,
    state TEXT, detail TEXT,
    PRIMARY KEY (run_id, variant, patch));
CREATE TABLE IF NOT EXISTS confirmations (
    config_name TEXT NOT NULL, run_id TEXT NOT NULL, variant TEXT NOT NULL, suite TEXT NOT NULL,
    metric TEXT NOT NULL, last_green_run_id TEXT, old_release TEXT, new_release TEXT,
    change_pct REAL, ci_low_pct REAL, ci_high_pct REAL, p_value REAL, alpha REAL,
    repeats INTEGER, verdict TEXT, confirm_run_dir TEXT,
    PRIMARY KEY (config_name, run_id, variant, suite, metric));
CREATE TABLE IF NOT EXISTS red_gates (
    config_name TEXT NOT NULL, run_id TEXT NOT NULL, gate TEXT NOT NULL, kind TEXT NOT NULL,
    variant TEXT NOT NULL, suite TEXT NOT NULL, metric TEXT NOT NULL, level REAL,
    change_pct REAL, new INTEGER, since_run_id TEXT, since_utc TEXT,
    PRIMARY KEY (config_name, run_id, gate, kind, variant, suite, metric))
"""

NOISE_COLUMNS = tuple(
    "suite metric source nights repeats run_cv_pct pair_cv_pct night_cv_pct df repeats_needed".split()
)
CHANGE_COLUMNS = tuple(
    "variant suite metric run_id start_utc end_run_id end_utc nights before after size_pct worse "
    "confirmed".split()
)
#: columns added to a derived table after it was first written: (table, column, type); a table
#: without one gets it (ALTER TABLE ... ADD COLUMN) before the next write, its older rows NULL
_ADDED_COLUMNS = (("change_points", "confirmed", "INTEGER"),)


BUILD_COLUMNS = ("run_id", "variant", "sglang_release", "patch", "state", "detail")
CONFIRM_COLUMNS = tuple(
    "variant suite metric last_green_run_id old_release new_release change_pct ci_low_pct "
    "ci_high_pct p_value alpha repeats verdict confirm_run_dir".split()
)


def _write_derived(
    h: History, table: str, config_name: str | None, run_id: str, rows: list[tuple]
) -> None:
    """Replace the rows of night ``run_id`` (and ``config_name``, for tables keyed by it) in
    ``table`` with ``rows``, creating the derived tables first. One transaction."""
    key = "detected_run_id" if table == "change_points" else "run_id"
    db = h._db
    try:
        db.execute("BEGIN IMMEDIATE")
        for stmt in _DERIVED.split(";"):
            if stmt.strip():
                db.execute(stmt)
        for tab, col, typ in _ADDED_COLUMNS:
            if col not in {r[1] for r in db.execute(f"PRAGMA table_info({tab})")}:
                db.execute(f"ALTER TABLE {tab} ADD COLUMN {col} {typ}")
        if config_name is None:
            db.execute(f"DELETE FROM {table} WHERE {key} = ?", (run_id,))
        else:
            db.execute(
                f"DELETE FROM {table} WHERE config_name = ? AND {key} = ?", (config_name, run_id)
            )
        if rows:
            marks = ", ".join("?" * len(rows[0]))
            db.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        db.execute("COMMIT")
    except sqlite3.Error as e:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise h._wrap(e, f"write {table}") from None


def record_noise(h: History, config_name: str, run_id: str, rows: list[dict]) -> None:
    """Store the noise the night ``run_id`` was gated with (one dict per (suite, metric) with the
    keys of :data:`NOISE_COLUMNS`, as :meth:`patchbench.nightly.noise.Noise.to_json` gives plus
    ``repeats_needed``), replacing what that night had. One transaction; raises
    :class:`HistoryError`."""
    _write_derived(
        h,
        "noise",
        config_name,
        run_id,
        [(config_name, run_id, *(r.get(c) for c in NOISE_COLUMNS)) for r in rows],
    )


def record_change_points(h: History, config_name: str, run_id: str, points: list[dict]) -> None:
    """Store the change points the night ``run_id`` found over the whole history (dicts with the
    keys of :data:`CHANGE_COLUMNS`, :meth:`patchbench.nightly.changepoints.ChangePoint.to_json`),
    replacing what that night had found. One transaction; raises :class:`HistoryError`."""
    rows = [
        (
            config_name,
            run_id,
            *(
                int(p[c]) if c in ("worse", "confirmed") and p.get(c) is not None else p.get(c)
                for c in CHANGE_COLUMNS
            ),
        )
        for p in points
    ]
    _write_derived(h, "change_points", config_name, run_id, rows)


def _read_derived(h: History, table: str, config_name: str, where: str, args: tuple) -> list[dict]:
    db = h._db
    try:
        if not db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        ).fetchone():
            return []
        cur = db.execute(
            f"SELECT * FROM {table} WHERE config_name = ?{where}", (config_name, *args)
        )
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
    except sqlite3.Error as e:
        raise h._wrap(e, f"read {table}") from None


def read_noise(h: History, config_name: str, run_id: str | None = None) -> list[dict]:
    """The stored noise rows of a config (of one night with ``run_id``), as dicts with
    ``config_name``, ``run_id`` and :data:`NOISE_COLUMNS`; [] when none were stored."""
    where, args = (" AND run_id = ?", (run_id,)) if run_id else ("", ())
    return _read_derived(h, "noise", config_name, where, args)


def read_change_points(
    h: History, config_name: str, detected_run_id: str | None = None
) -> list[dict]:
    """The change points of a config as found by the night ``detected_run_id`` (default: the
    latest night that looked, one that stored change points or noise: the job stores both
    together, so a night that found none hides an older night's), dicts with ``config_name``,
    ``detected_run_id`` and
    :data:`CHANGE_COLUMNS` (``worse`` and ``confirmed`` 1 / 0 / None, ``confirmed`` None in rows
    stored before it existed); [] when none were stored."""
    if detected_run_id is None:
        rows = _read_derived(h, "change_points", config_name, "", ())
        if not rows:
            return []
        nights = {r.run_id: r.night_utc for r in h.nights(config_name)}
        looked = {r["detected_run_id"] for r in rows} | {
            r["run_id"] for r in read_noise(h, config_name)
        }
        detected_run_id = max(looked, key=lambda x: (nights.get(x, ""), x))
    return _read_derived(
        h, "change_points", config_name, " AND detected_run_id = ?", (detected_run_id,)
    )


def record_night_builds(h: History, run_id: str, rows: list[dict]) -> None:
    """Store what each variant of night ``run_id`` ran (dicts with the keys of
    :data:`BUILD_COLUMNS` but ``run_id``: ``variant``; ``sglang_release``, the resolved release,
    never "latest"; ``patch``, a patch's name or "" for a variant without patches; ``state``,
    ``applies`` / ``contained`` / ``conflicts`` / ``unavailable`` or "" without a patch;
    ``detail``, e.g. the conflicting hunk), replacing what that night had. One transaction;
    raises :class:`HistoryError`."""
    _write_derived(
        h,
        "night_builds",
        None,
        run_id,
        [
            (run_id, *(r.get(c) if c != "patch" else r.get(c) or "" for c in BUILD_COLUMNS[1:]))
            for r in rows
        ],  # fmt: skip
    )


def read_night_builds(
    h: History, config_name: str | None = None, run_id: str | None = None
) -> list[dict]:
    """The stored build rows (dicts of :data:`BUILD_COLUMNS`) of night ``run_id``, or of every
    night of ``config_name`` (joined with ``nights``), or all; [] when none were stored. Raises
    :class:`HistoryError`."""
    db = h._db
    cols = ", ".join(f"b.{c}" for c in BUILD_COLUMNS)
    sql, args = f"SELECT {cols} FROM night_builds b", ()
    if run_id is not None:
        sql, args = sql + " WHERE b.run_id = ?", (run_id,)
    elif config_name is not None:
        sql += " JOIN nights n ON n.run_id = b.run_id WHERE n.config_name = ?"
        args = (config_name,)
    try:
        if not db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'night_builds'"
        ).fetchone():
            return []
        rows = db.execute(sql + " ORDER BY b.run_id, b.variant, b.patch", args).fetchall()
    except sqlite3.Error as e:
        raise h._wrap(e, "read night_builds") from None
    return [dict(zip(BUILD_COLUMNS, row, strict=True)) for row in rows]


def record_confirmation(h: History, config_name: str, run_id: str, rows: list[dict]) -> None:
    """Store the paired results of night ``run_id``'s confirmation run (dicts with the keys of
    :data:`CONFIRM_COLUMNS`, :func:`patchbench.nightly.confirm.Confirmation.rows`), replacing
    what that night had. One transaction; raises :class:`HistoryError`."""
    _write_derived(
        h,
        "confirmations",
        config_name,
        run_id,
        [(config_name, run_id, *(r.get(c) for c in CONFIRM_COLUMNS)) for r in rows],
    )


RED_COLUMNS = tuple(
    "gate kind variant suite metric level change_pct new since_run_id since_utc".split()
)


def record_red(h: History, config_name: str, run_id: str, rows: list[dict]) -> None:
    """Store the gates that failed on night ``run_id`` with their story (dicts with the keys of
    :data:`RED_COLUMNS`, :meth:`patchbench.nightly.story.RedLine.row`), replacing what that
    night had. One transaction; raises :class:`HistoryError`."""
    _write_derived(
        h,
        "red_gates",
        config_name,
        run_id,
        [
            (config_name, run_id, *(int(r[c]) if c == "new" else r.get(c) for c in RED_COLUMNS))
            for r in rows
        ],
    )


def read_red(h: History, config_name: str) -> dict[str, list[dict]]:
    """Every stored failing gate of a config: run id -> its rows (dicts with ``config_name``,
    ``run_id`` and :data:`RED_COLUMNS`); {} when none were stored."""
    out: dict[str, list[dict]] = {}
    for r in _read_derived(h, "red_gates", config_name, "", ()):
        out.setdefault(r["run_id"], []).append(r)
    return out


def read_confirmations(h: History, config_name: str, run_id: str | None = None) -> list[dict]:
    """The stored confirmation rows of a config (of one night with ``run_id``), dicts with
    ``config_name``, ``run_id`` and :data:`CONFIRM_COLUMNS`; [] when none were stored."""
    where, args = (" AND run_id = ?", (run_id,)) if run_id else ("", ())
    return _read_derived(h, "confirmations", config_name, where, args)


# ---------------------------------------------------------------------------------------------
# reading for the page and the history command (no HTML here): the history and each night's
# run folder nightly.json


def open_history(path: str | Path) -> History:
    """Open an existing history file. Raises UsageError (exit 2) when ``path`` is not a file,
    :class:`patchbench.nightly.history.HistoryError` (exit 3) when it is not a usable history."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"{p}: no such history file (PATCHBENCH_HISTORY or the nightly's path)")
    return History(p)


def _rows(h: History, sql: str, args: tuple = ()) -> list[tuple]:
    try:
        return h._db.execute(sql, args).fetchall()
    except sqlite3.Error as e:
        raise h._wrap(e, "read") from None


def night_builds_of(h: History, run_id: str) -> list[dict[str, Any]]:
    """The release and patch state each variant of night ``run_id`` ran with: dicts with the
    keys of :data:`patchbench.nightly.history.BUILD_COLUMNS`
    (:func:`patchbench.nightly.history.read_night_builds`), sorted by variant; [] for a night recorded
    without them (a history written before the table existed)."""
    return sorted(read_night_builds(h, run_id=run_id), key=lambda b: str(b["variant"]))


def config_names(h: History) -> list[str]:
    """Every config (history key) with a recorded night, sorted."""
    return [r[0] for r in _rows(h, "SELECT DISTINCT config_name FROM nights ORDER BY config_name")]


def read_nightly_json(run_dir: str | None) -> dict[str, Any] | None:
    """A run folder's ``nightly.json`` as a dict, or None when the folder or file is gone or
    unreadable."""
    if not run_dir:
        return None
    path = Path(run_dir) / "nightly.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass
class NightInfo:
    """One recorded night as the page and the history command show it.

    outcome: ``nightly.json``'s outcome ("green", "red", "underpowered", "run failed", ...), None
    when the run folder or its nightly.json is gone; exit_code / headline likewise; failing /
    gates: its GateResult dicts (patchbench/nightly/gates.py); builds: :func:`night_builds_of`;
    release: the sglang release(s) the night ran, ``/``-joined when variants differ; machine:
    the identity of the machine it ran on (None: unknown); story:
    nightly.json's ``story`` (:class:`patchbench.nightly.story.Story`), schedule_hours: its
    ``settings.schedule_hours``."""

    run_id: str
    night_utc: str
    config_name: str
    status: str
    sglang_version: str | None
    run_dir: str | None
    machine: str | None = None
    outcome: str | None = None
    exit_code: int | None = None
    headline: str = ""
    failing: list[dict[str, Any]] = field(default_factory=list)
    gates: list[dict[str, Any]] = field(default_factory=list)
    builds: list[dict[str, Any]] = field(default_factory=list)
    story: dict[str, Any] | None = None
    schedule_hours: float | None = None
    gated: frozenset[tuple[str, str]] = frozenset()  # (suite, metric) of its gates

    @property
    def release(self) -> str:
        rel = sorted({str(b["sglang_release"]) for b in self.builds if b.get("sglang_release")})
        return "/".join(rel) if rel else (self.sglang_version or "?")

    @property
    def patch_state(self) -> str:
        """``variant: state`` per variant with a patch state recorded, "" when none is."""
        return ", ".join(
            f"{b['variant']}: {b['state']}" + (f" ({b['detail']})" if b.get("detail") else "")
            for b in self.builds
            if b.get("state")
        )

    @property
    def folder_present(self) -> bool:
        return bool(self.run_dir) and Path(str(self.run_dir)).is_dir()

    def to_json(self) -> dict[str, Any]:
        keys = (
            "run_id night_utc config_name status release machine patch_state outcome exit_code "
            "headline"
        )
        out = {k: getattr(self, k) for k in keys.split()}
        return out | {"run_dir": self.run_dir, "run_folder_present": self.folder_present,
                      "failing": self.failing, "builds": self.builds}  # fmt: skip


def night_infos(
    h: History, config_name: str | None = None, *, slim: bool = False
) -> list[NightInfo]:
    """Every recorded night (of one config), oldest first, with its nightly.json's outcome.
    ``slim``: every night but the newest keeps no gate dicts, only :attr:`NightInfo.gated` (a
    page over thousands of nights)."""
    sql = (
        "SELECT run_id, night_utc, config_name, status, sglang_version, run_dir, machine FROM "
        "nights"
    )
    args: tuple = ()
    if config_name is not None:
        sql += " WHERE config_name = ?"
        args = (config_name,)
    out: list[NightInfo] = []
    gated_sets: dict[frozenset, frozenset] = {}
    for row in _rows(h, sql + " ORDER BY night_utc, run_id", args):
        n = NightInfo(*row)
        js = read_nightly_json(n.run_dir)
        if js is not None:
            n.outcome = js.get("outcome")
            n.exit_code = js.get("exit_code")
            n.headline = str(js.get("headline") or "")
            n.failing = list(js.get("failing") or [])
            n.gates = list(js.get("gates") or [])
            n.story = js.get("story") if isinstance(js.get("story"), dict) else None
            hours = (js.get("settings") or {}).get("schedule_hours")
            n.schedule_hours = float(hours) if isinstance(hours, (int, float)) else None
        n.builds = night_builds_of(h, n.run_id)
        pairs = frozenset((g.get("suite"), g.get("metric")) for g in n.gates)
        n.gated = gated_sets.setdefault(pairs, pairs)  # one object per distinct set
        if slim and out:
            out[-1].gates = []
        out.append(n)
    return out


@dataclass
class Point:
    """One night of a series: the median of its repeats and their spread (metric unit)."""

    run_id: str
    night_utc: str
    median: float
    low: float
    high: float
    n: int

    @property
    def spread_pct(self) -> float | None:
        """(high - low) / median in percent; None for a zero median."""
        return 100.0 * (self.high - self.low) / self.median if self.median else None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "night_utc": self.night_utc,
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "spread_pct": self.spread_pct,
            "n": self.n,
        }


def series(nights: list[Night], variant: str, suite: str, metric: str) -> list[Point]:
    """The nightly series of (variant, suite, metric): one :class:`Point` per night with at
    least one value, oldest first (``nights`` as :meth:`History.nights` gives them)."""
    out = []
    for n in nights:
        vals = [v for v in n.values.get((variant, suite, metric), []) if v is not None]
        if vals:
            out.append(
                Point(
                    n.run_id, n.night_utc, statistics.median(vals), min(vals), max(vals), len(vals)
                )
            )
    return out


def variants_of(nights: list[Night], suite: str, metric: str) -> list[str]:
    """Variants with values of (suite, metric), the baseline of the latest night first."""
    got = sorted({v for n in nights for (v, s, m) in n.values if (s, m) == (suite, metric)})
    base = nights[-1].baseline if nights else ""
    return ([base] if base in got else []) + [v for v in got if v != base]
