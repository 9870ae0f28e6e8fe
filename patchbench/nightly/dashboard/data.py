"""What the dashboard and ``patchbench history`` read from a nightly history (patchbench/nightly/history.py)
and from each night's run folder (``nightly.json``), as plain data: no HTML here.

Every reader takes an open :class:`patchbench.nightly.history.History`; :func:`open_history` opens one for
reading and refuses a missing file (a usage error, exit 2) rather than creating an empty one.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.errors import UsageError
from patchbench.nightly.history import (
    BUILD_COLUMNS,
    History,
    Night,
    read_change_points,
    read_night_builds,
)


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


def _night_builds(h: History, run_id: str) -> list[dict[str, Any]]:
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
    gates: its GateResult dicts (patchbench/nightly/gates/results.py); builds: :func:`_night_builds`;
    release: the sglang release(s) the night ran, ``/``-joined when variants differ."""

    run_id: str
    night_utc: str
    config_name: str
    status: str
    sglang_version: str | None
    run_dir: str | None
    outcome: str | None = None
    exit_code: int | None = None
    headline: str = ""
    failing: list[dict[str, Any]] = field(default_factory=list)
    gates: list[dict[str, Any]] = field(default_factory=list)
    builds: list[dict[str, Any]] = field(default_factory=list)

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
        return {
            "run_id": self.run_id,
            "night_utc": self.night_utc,
            "config_name": self.config_name,
            "status": self.status,
            "release": self.release,
            "patch_state": self.patch_state,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "headline": self.headline,
            "run_dir": self.run_dir,
            "run_folder_present": self.folder_present,
            "failing": self.failing,
            "builds": self.builds,
        }


def night_infos(h: History, config_name: str | None = None) -> list[NightInfo]:
    """Every recorded night (of one config), oldest first, with its nightly.json's outcome."""
    sql = "SELECT run_id, night_utc, config_name, status, sglang_version, run_dir FROM nights"
    args: tuple = ()
    if config_name is not None:
        sql += " WHERE config_name = ?"
        args = (config_name,)
    out = []
    for row in _rows(h, sql + " ORDER BY night_utc, run_id", args):
        n = NightInfo(*row)
        js = read_nightly_json(n.run_dir)
        if js is not None:
            n.outcome = js.get("outcome")
            n.exit_code = js.get("exit_code")
            n.headline = str(js.get("headline") or "")
            n.failing = list(js.get("failing") or [])
            n.gates = list(js.get("gates") or [])
        n.builds = _night_builds(h, n.run_id)
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


def metrics_of(nights: list[Night], infos: list[NightInfo]) -> list[tuple[str, str]]:
    """The (suite, metric) pairs a config's page shows: the gated ones (any night's
    ``nightly.json`` gates), else every metric recorded."""
    have = {(s, m) for n in nights for (_v, s, m) in n.values}
    gated = {(g.get("suite"), g.get("metric")) for i in infos for g in i.gates}
    shown = sorted(have & gated)
    return shown or sorted(have)


def variants_of(nights: list[Night], suite: str, metric: str) -> list[str]:
    """Variants with values of (suite, metric), the baseline of the latest night first."""
    got = sorted({v for n in nights for (v, s, m) in n.values if (s, m) == (suite, metric)})
    base = nights[-1].baseline if nights else ""
    return ([base] if base in got else []) + [v for v in got if v != base]


def change_points(h: History, config_name: str) -> list[dict[str, Any]]:
    """The change points the latest night found (:func:`patchbench.nightly.history.read_change_points`)."""
    return read_change_points(h, config_name)


__all__ = [
    "BUILD_COLUMNS",
    "NightInfo",
    "Point",
    "change_points",
    "config_names",
    "metrics_of",
    "night_infos",
    "open_history",
    "read_nightly_json",
    "series",
    "variants_of",
]
