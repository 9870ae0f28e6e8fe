"""A run folder read for the analysis (:class:`RunData`: manifest, cells, suite summaries, the
rounds each suite ran in, the A/A variants), through :mod:`patchbench.runfolder` only."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from patchbench import runfolder
from patchbench.runfolder import CellRecord, RunManifest, SuiteSummary
from patchbench.suite import get_suite, unit_of

#: the values no measurement can give, by the unit a metric's name declares (its suffix; a
#: sweep point's ``name@key`` by its name): (lowest, highest), both allowed. A rate is 0 (nothing
#: finished in time: a goodput) or at least one in 11.6 days (1e-6 per s, longer than any run's
#: timeout) and at most 1e9 per s (no server comes near); a latency or duration lies in
#: [0, 1e7] ms (2.8 h: no request outlives a suite's timeout), [0, 1e10] us, [0, 1e7] s; an
#: accuracy in [0, 1]; a count is never negative. Shares and percentages are left as they are
#: (an overhead share may be below 0). A value outside, or not a finite number, is left out of
#: the analysis with a note naming it and its file (:func:`impossible`).
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "tok/s": (1e-6, 1e9),
    "req/s": (1e-6, 1e9),
    "ms": (0.0, 1e7),
    "us": (0.0, 1e10),
    "s": (0.0, 1e7),
    "acc": (0.0, 1.0),
    "count": (0.0, math.inf),
}


def impossible(metric: str, x: float | None) -> str | None:
    """Why ``x`` cannot be a measured value of ``metric`` (:data:`PLAUSIBLE`); None when it can
    (or is None: no value)."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return "not a finite number"
    unit = unit_of(metric.split("@", 1)[0])
    lo, hi = PLAUSIBLE.get(unit, (-math.inf, math.inf))
    if unit in ("tok/s", "req/s") and x == 0:
        return None
    if x < lo:
        return f"below {lo:g} {unit}"
    if x > hi:
        return f"above {hi:g} {unit}"
    return None


@dataclass
class RunData:
    """A run folder as the analysis reads it: manifest, cells, summaries (all typed)."""

    run_dir: Path
    manifest: RunManifest
    baseline: str
    variants: list[str]  # baseline first
    aa_variants: list[str]
    repeats: int
    suites: list[str]
    cells: dict[tuple[str, int], CellRecord | None]
    summaries: dict[tuple[str, int, str], SuiteSummary | None]
    notes: list[str] = field(default_factory=list)
    #: suite -> the timed rounds it ran in (``suites.<name>.rounds``; absent: every round)
    rounds: dict[str, list[int]] = field(default_factory=dict)
    #: suites that run only in the untimed correctness cells (``Suite.timed`` False): their one
    #: "repeat" (k = 0) is ``<variant>/correctness``
    correctness_only: list[str] = field(default_factory=list)
    #: variant -> its correctness cell (None: none ran)
    corr_cells: dict[str, CellRecord | None] = field(default_factory=dict)
    #: (variant, repeat, suite, metric) -> why its value was left out (:func:`impossible`)
    left_out: dict[tuple[str, int, str, str], str] = field(default_factory=dict)

    def rounds_of(self, suite: str) -> list[int]:
        """The repeat indices that hold ``suite``'s data ([0] for a correctness-only suite)."""
        if suite in self.correctness_only:
            return [0]
        return [k for k in self.rounds.get(suite, range(self.repeats)) if k < self.repeats]

    def _cell(self, v: str, k: int, suite: str | None = None) -> CellRecord | None:
        if suite is not None and suite in self.correctness_only:
            return self.corr_cells.get(v)
        return self.cells.get((v, k))

    def cell_status(self, v: str, k: int, suite: str | None = None) -> str:
        c = self._cell(v, k, suite)
        return "missing" if c is None else c.status

    def suite_status(self, v: str, k: int, suite: str) -> str:
        cs = self.cell_status(v, k, suite)
        if cs != "ok":
            return cs
        s = self.summaries.get((v, k, suite))
        return "missing" if s is None else s.status

    def timed(self, v: str, k: int, suite: str | None = None) -> bool:
        c = self._cell(v, k, suite)
        return c is None or (c.cell_kind == "timed" and not c.instrumented)

    def value(self, v: str, k: int, suite: str, metric: str) -> float | None:
        if self.suite_status(v, k, suite) != "ok":
            return None
        x = self.summaries[(v, k, suite)].metrics.get(metric)
        return None if x is None or not math.isfinite(x) else float(x)

    def not_judged(self, v: str, k: int, suite: str, metric: str) -> str | None:
        """Why the suite left ``metric`` out of this cell on purpose (``meta.not_judged``, e.g. a
        load the client did not deliver); None when it did not."""
        s = self.summaries.get((v, k, suite))
        if s is None or s.status != "ok":
            return None
        why = (s.meta.get("not_judged") or {}).get(metric)
        return str(why) if why else None

    def why_not_ok(self, v: str, k: int, suite: str) -> str:
        """The cell's or suite's status when it is not "ok", with the suite's first error up to
        its first " (" (e.g. "incomplete: bunched: 20 of 20 requests got all tokens in one
        read"): its values feed no verdict; "ok" when it is ok."""
        st = self.suite_status(v, k, suite)
        s = self.summaries.get((v, k, suite))
        if st == "ok" or s is None or not s.errors or self.cell_status(v, k, suite) != "ok":
            return st
        head = (s.errors[0].strip().splitlines() or [""])[0].split(" (")[0]
        return f"{st}: {head[:120]}" if head else st

    def bound(self, v: str, k: int, suite: str, metric: str) -> str | None:
        """ "lower" / "upper" when the summary marks the value a bound; None when exact."""
        s = self.summaries.get((v, k, suite))
        return None if s is None else s.bounds.get(metric)

    def suite_dir(self, v: str, k: int, suite: str) -> Path:
        if suite in self.correctness_only:
            return self.run_dir / v / "correctness" / suite
        return self.run_dir / v / f"rep{k}" / suite


def read_run(run_dir: str | os.PathLike) -> RunData:
    """Read a run folder. Raises RunFolderError / SchemaTooNew (exit 2) for the manifest; a
    missing cell is status "missing", an unreadable one "unreadable"."""
    run_dir = Path(run_dir)
    man = runfolder.read_manifest(run_dir)
    cfg = man.config
    variants = list(cfg.variants if cfg else []) or sorted(
        {c.variant for c in man.cells if c.variant}
    )
    if not variants:
        raise runfolder.RunFolderError(
            f"{run_dir / 'manifest.json'}: no variants in config.variants or cells"
        )
    baseline = man.baseline if man.baseline in variants else variants[0]
    variants = [baseline] + [v for v in variants if v != baseline]
    repeats = man.repeats
    for v in variants:
        for d in (run_dir / v).glob("rep*"):
            m = re.fullmatch(r"rep(\d+)", d.name)
            if m and d.is_dir():
                repeats = max(repeats, int(m.group(1)) + 1)
    suites = man.suites or sorted(
        {p.parent.name for v in variants for p in (run_dir / v).glob("rep*/*/summary.json")}
    )
    recorded = man.variant_diffs  # bench's own record, else the config's identity
    aa = [
        v
        for v in variants[1:]
        if (recorded[v].aa if v in recorded else cfg is not None and cfg.is_aa(v))
    ]
    data = RunData(run_dir, man, baseline, variants, aa, repeats, suites, {}, {})
    data.rounds, data.correctness_only = suite_schedule(man, suites, repeats)
    _read_cells(data)
    return data


def _read_cells(data: RunData) -> None:
    """Fill ``data``'s cells and summaries (a suite's only where it was scheduled) and notes."""
    for v in data.variants:
        corr = data.run_dir / v / "correctness"
        cc = data.corr_cells[v] = runfolder.read_cell(corr, variant=v, repeat=0)
        data.notes += cc.notes if cc is not None else []
        for s in data.correctness_only:
            sm = data.summaries[(v, 0, s)] = runfolder.read_summary(corr / s, suite=s)
            data.notes += sm.notes if sm is not None else []
            _leave_out_impossible(data, v, 0, s, corr / s)
        for k in range(data.repeats):
            cdir = data.run_dir / v / f"rep{k}"
            c = data.cells[(v, k)] = runfolder.read_cell(cdir, variant=v, repeat=k)
            data.notes += c.notes if c is not None else []
            for s in data.suites:
                if s in data.correctness_only or k not in data.rounds.get(s, range(data.repeats)):
                    continue
                sm = data.summaries[(v, k, s)] = runfolder.read_summary(cdir / s, suite=s)
                data.notes += sm.notes if sm is not None else []
                _leave_out_impossible(data, v, k, s, cdir / s)


def _leave_out_impossible(data: RunData, v: str, k: int, suite: str, sdir: Path) -> None:
    """Drop the impossible values of one summary (:func:`impossible`) from its metrics, with a
    note in ``data.notes`` and the reason in ``data.left_out`` (the rows say it)."""
    sm = data.summaries.get((v, k, suite))
    if sm is None:
        return
    for metric, x in list(sm.metrics.items()):
        why = impossible(metric, x)
        if why is None:
            continue
        del sm.metrics[metric]
        note = f"impossible value {metric} = {x!r} ({why}) in {sdir / 'summary.json'}; left out"
        data.left_out[(v, k, suite, metric)] = note
        data.notes.append(note)


def suite_schedule(
    man: RunManifest, suites: list[str], repeats: int
) -> tuple[dict[str, list[int]], list[str]]:
    """({suite: its timed rounds below ``repeats``}, [correctness-only suites]) from the
    manifest's ``suite_rounds``, else the config."""
    from patchbench.config.schema import resolve_rounds

    recorded = man.suite_rounds
    cfg_suites = man.config.suites if man.config is not None else {}
    rounds: dict[str, list[int]] = {}
    corr: list[str] = []
    for s in suites:
        got = recorded.get(s)
        if got == "correctness" or (got is None and not _suite_timed(s)):
            corr.append(s)
            continue
        if isinstance(got, list):
            rounds[s] = [int(k) for k in got if int(k) < repeats]
        else:
            spec = (
                (cfg_suites.get(s) or {}).get("rounds")
                if isinstance(cfg_suites.get(s), dict)
                else None
            )
            rounds[s] = resolve_rounds(spec, repeats)
    return rounds, corr


def _suite_timed(name: str) -> bool:
    """The registered suite's ``timed`` flag (True for a suite that cannot be loaded)."""
    try:
        return bool(get_suite(name).timed)
    except Exception:  # noqa: BLE001 - an unknown suite is read like a timed one
        return True
