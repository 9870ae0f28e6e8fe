"""The calibration's trials: each simulated run judged by the comparison code, and the counts.

:func:`compare_trial` hands a trial (:mod:`tools.calibration.model`) to the comparison
(:func:`patchbench.analysis.build.build_comparison`: the suites' declarations, the MMMU pairing
contract, paired t on log ratios, ``min_repeats``, TOST, Holm across each variant's primaries,
Newcombe for accuracy, exact deterministic counts, the A/A downgrade); :func:`run_row` runs the
seeded trials of a row and counts the verdicts of the primaries (:class:`Counts`).

By default the comparison runs on in-memory run data (``RunData`` handed to
``build_comparison`` with ``suites=`` :func:`memory_suites`: the suites' real declarations; the
MMMU pair hook replaced by the same per-question average over repeats that
``patchbench.suites.mmmu.pair_repeats`` computes; the serving and sync-probe hooks return None
because no per-request files exist in memory, and they feed only descriptive intervals and report
sections). ``via_folders`` writes each trial as a run folder (:mod:`tests.synthetic`, MMMU
records.jsonl included) and runs ``patchbench.analysis.build.compare_run`` end to end instead (~100x
slower).
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from patchbench import suite as suite_mod
from patchbench.analysis import build as analysis
from patchbench.analysis.comparison import CompareSettings, Comparison
from patchbench.analysis.rundata import RunData
from patchbench.run.plan import plan_cells
from patchbench.runfolder import CellRecord, RunManifest, SuiteSummary
from tools.calibration.model import (
    BASELINE,
    EFFECT_VARIANT,
    PATCHES,
    PRIMARIES,
    SCENARIO_KEY,
    SUITES,
    THR,
    VARIANTS,
    Model,
    Trial,
    simulate,
    truncate,
)
from tools.calibration.stopping import SeqPlan, schedule_of


def _config(tr: Trial, settings: CompareSettings, plan: SeqPlan | None = None) -> dict:
    return {
        "name": "calibration",
        "sglang": "0.5.1.post3",
        "model": {"path": "calibration", "tiny": True},
        "variants": VARIANTS,
        "baseline": BASELINE,
        "schedule": {
            "repeats": tr.repeats if plan is None else schedule_of(plan),
            "order": tr.order,
            **({"seed": tr.order_seed} if tr.order == "randomized" else {}),
        },
        "suites": {s: {} for s in SUITES},
        "compare": settings.model_dump(mode="json"),
    }


def _summary_metrics(tr: Trial, v: str, k: int, s: str, secondaries: bool) -> dict[str, float]:
    vals = tr.metrics[(v, k)][s]
    return dict(vals) if secondaries else {x: vals[x] for x in PRIMARIES[s] if x in vals}


def run_data(
    tr: Trial,
    settings: CompareSettings,
    secondaries: bool = False,
    mmmu_first: int = 0,
    plan: SeqPlan | None = None,
) -> RunData:
    """The trial as :class:`patchbench.analysis.rundata.RunData` (what ``read_run`` returns for the same
    run folder: typed manifest, cells, summaries; A/A variants as ``read_run`` finds them).
    secondaries: put every simulated metric in the summaries, not only the primaries (secondary
    rows change no primary verdict and no A/A check; they only cost time). mmmu_first: the MMMU
    suite ran only in the first round (``suites.mmmu.rounds: first``): its summaries and pairing
    hold repeat 0 only, as ``read_run`` finds such a run. plan: a sequential design, written as
    the config's schedule (the analysis then replays its rule on the trial's rounds)."""
    mmmu_ks = set(range(min(int(mmmu_first), tr.repeats))) if mmmu_first else set(range(tr.repeats))

    def ran(s: str, k: int) -> bool:
        return s != "mmmu" or k in mmmu_ks

    cells = plan_cells(tr.variants, tr.repeats, tr.order, seed=tr.order_seed)
    cells_meta = [{"variant": c.variant, "repeat": c.repeat, "status": "ok"} for c in cells]
    man = RunManifest(run_id=tr.run_id, config=_config(tr, settings, plan), cells=cells_meta)
    aa = [v for v in tr.variants[1:] if man.config.is_aa(v)]
    cells = {
        (v, k): CellRecord(
            variant=v, repeat=k, status="ok", suites={s: "ok" for s in SUITES if ran(s, k)}
        )
        for v in tr.variants
        for k in range(tr.repeats)
    }
    sums = {
        (v, k, s): SuiteSummary(
            suite=s, status="ok", metrics=_summary_metrics(tr, v, k, s, secondaries)
        )
        for v in tr.variants
        for k in range(tr.repeats)
        for s in SUITES
        if ran(s, k)
    }
    return RunData(
        Path("/nonexistent-calibration") / tr.run_id,
        man,
        BASELINE,
        list(tr.variants),
        aa,
        tr.repeats,
        list(SUITES),
        cells,
        sums,
        rounds={"mmmu": sorted(mmmu_ks)},
    )


def mmmu_accuracy(
    correct: dict[tuple[str, int], np.ndarray], baseline: str, variant: str, repeats: list[int]
) -> dict:
    """The pair hook's ``accuracy`` entry for mmmu_overall_acc: per question, its share of
    correct answers over the paired repeats, in each arm (what
    ``patchbench.suites.mmmu.pair_repeats`` computes when no question failed). Ids are
    ``q0..q{n-1}`` sorted as strings, as the hook sorts them; ``cells``: each arm's cell-shift
    variance parts, as the hook gives them."""
    from dataclasses import asdict

    from patchbench import stats

    ya = np.array([correct[(baseline, k)] for k in repeats], dtype=float)
    yb = np.array([correct[(variant, k)] for k in repeats], dtype=float)
    a, b = ya.mean(axis=0), yb.mean(axis=0)
    ids = sorted(f"q{i}" for i in range(a.size))
    idx = [int(i[1:]) for i in ids]
    cells: dict = {"repeats_baseline": len(repeats), "repeats_variant": len(repeats)}
    for arm, y in (("baseline", ya), ("variant", yb)):
        cv = stats.cell_variance([y]) if len(repeats) >= 2 and a.size >= 2 else None
        cells[arm] = asdict(cv) if cv is not None else None
    return {
        "mmmu_overall_acc": {
            "ids": ids,
            "baseline": [float(a[i]) for i in idx],
            "variant": [float(b[i]) for i in idx],
            "cells": cells,
        }
    }


_REAL_SUITES: dict[str, object] = {}


class _MemorySuite:
    """A registered suite's declarations with a pair hook that reads one trial in memory."""

    def __init__(self, name: str, trial: Trial):
        if name not in _REAL_SUITES:
            _REAL_SUITES[name] = suite_mod.get_suite(name)
        self.name = name
        self.metrics = dict(_REAL_SUITES[name].metrics)
        self._trial = trial

    def pair(self, baseline_dirs: list[Path], variant_dirs: list[Path], params) -> dict | None:
        if self.name != "mmmu":
            return None  # serving / sync probe: per-request files only; nothing a verdict reads
        variant = Path(variant_dirs[0]).parents[1].name
        ks = [int(Path(d).parent.name[3:]) for d in baseline_dirs]
        return {"accuracy": mmmu_accuracy(self._trial.correct, BASELINE, variant, ks)}


def memory_suites(tr: Trial) -> dict[str, _MemorySuite]:
    """{suite: the registered suite's declarations with an in-memory pair hook for ``tr``}, for
    ``analysis.build_comparison(..., suites=...)``."""
    return {s: _MemorySuite(s, tr) for s in SUITES}


def write_folder(
    tr: Trial, root: Path, settings: CompareSettings, secondaries: bool = False
) -> Path:
    """Write the trial as a run folder (:func:`tests.synthetic.make_run`), MMMU records
    included."""
    from tests.synthetic import make_run, mmmu_rows

    metrics: dict[str, dict[str, dict[str, list[float]]]] = {}
    for s in SUITES:
        names = _summary_metrics(tr, BASELINE, 0, s, secondaries)
        metrics[s] = {
            mm: {v: [tr.metrics[(v, k)][s][mm] for k in range(tr.repeats)] for v in tr.variants}
            for mm in names
        }
    recs = {
        key: mmmu_rows(["correct" if x else "wrong" for x in c]) for key, c in tr.correct.items()
    }
    return make_run(
        root,
        variants=VARIANTS,
        metrics=metrics,
        mmmu_records=recs,
        run_id=tr.run_id,
        compare=settings.model_dump(mode="json"),
    )


def compare_trial(
    tr: Trial,
    settings: CompareSettings,
    *,
    via_folders: bool = False,
    root: Path | None = None,
    secondaries: bool = False,
    mmmu_first: int = 0,
    plan: SeqPlan | None = None,
) -> Comparison:
    """The comparison code's verdicts on one trial: in memory (``build_comparison`` on a
    :class:`RunData` with :func:`memory_suites`) or, with ``via_folders``, from a run folder
    under ``root`` through ``compare_run``. mmmu_first: MMMU ran in the first N rounds only
    (in memory only). plan: a sequential design (in memory only): the comparison replays its
    rule on the trial's rounds, as the report of such a run does."""
    if via_folders and (mmmu_first or plan is not None):
        raise ValueError("--via-folders does not simulate suites.mmmu.rounds: first")
    if via_folders:
        run = write_folder(tr, root, settings, secondaries)
        try:
            return analysis.compare_run(run, settings)
        finally:
            shutil.rmtree(run, ignore_errors=True)
    return analysis.build_comparison(
        run_data(tr, settings, secondaries, mmmu_first, plan), settings, suites=memory_suites(tr)
    )


@dataclass
class Counts:
    """Counts over the trials of one row: ``null`` / ``effect`` trials run, and per scenario the
    number of trials (reports) with the named outcome."""

    null: int = 0
    effect: int = 0
    new_fp_patch: int = 0  # null: null patch variants (2 a trial) with an improved/regressed
    # primary (after the A/A check)
    new_fp: int = 0  # null: reports with an improved/regressed primary (after the A/A check)
    new_fp_raw: int = 0  # null: the same before the A/A downgrade
    new_any: int = 0  # null: any improved/regressed row (secondaries too, if given)
    new_run_any: int = 0  # null: an improved/regressed run-level row
    aa_failed: int = 0  # null: the A/A check failed (every verdict downgraded)
    new_power: int = 0  # effect: patch-a output throughput improved
    small: int = 0  # "small" trials run (patch-a +5 %; the design table's --small-effect column)
    small_power: int = 0  # small: patch-a output throughput improved
    small_equiv: int = 0  # small: patch-a output throughput equivalent (a true effect at the
    # margin called equivalent)
    equiv: dict[str, int] = field(default_factory=dict)  # metric -> equivalent (null patches)
    equiv_n: dict[str, int] = field(default_factory=dict)  # metric -> rows
    raw_hit: dict[str, int] = field(default_factory=dict)  # metric -> improved/regressed rows of
    # the null patches before the A/A check
    logvar: dict[str, list[float]] = field(default_factory=dict)  # metric -> within-trial var
    reps: dict[str, list[int]] = field(
        default_factory=lambda: {"null": [], "effect": [], "small": []}
    )
    # scenario -> repeats each report used
    decided: dict[str, int] = field(default_factory=lambda: {"null": 0, "effect": 0})
    # scenario -> primaries of the two patches decided (improved / regressed / equivalent, after
    # the A/A check), summed over the reports
    decided_run: dict[str, int] = field(default_factory=lambda: {"null": 0, "effect": 0})
    # the same, run-level (serving) primaries only
    abnormal: int = 0  # null and effect reports whose rounds hold the outlier model's slow cell
    abnormal_named: int = 0  # of those: a primary run row names its repeat an outlier repeat
    # (patchbench.analysis.build.OUTLIER_RULE) in a pair that holds the cell


def _hit(v: str | None) -> bool:
    return v in ("improved", "regressed")


def sequential_stop(
    tr: Trial, plan: SeqPlan, settings: CompareSettings | None = None, mmmu_first: int = 0
) -> int:
    """Rounds the shipped sequential rule runs on this trial: the comparison of the trial under
    ``plan``'s schedule (the rule the report and the runner's looks replay,
    ``patchbench.analysis.family.sequential_decision``; the A/A variant is a control): the look at
    which it stops, or ``max``."""
    cmp = compare_trial(tr, settings or CompareSettings(), plan=plan, mmmu_first=mmmu_first)
    return cmp.design.stopped_after or tr.repeats


def run_row(
    m: Model,
    repeats: int,
    trials: int,
    seed: int,
    settings: CompareSettings,
    *,
    scenarios: tuple[str, ...] = ("null", "effect"),
    counts: Counts | None = None,
    via_folders: bool = False,
    effect: float = 0.10,
    secondaries: bool = False,
    plan: SeqPlan | None = None,
    small_effect: float = 0.05,
    mmmu_first: int = 0,
) -> Counts:
    """Simulate ``trials`` seeded trials of each scenario at ``m.run_cv`` and ``repeats``, run
    the comparison on each and count into ``counts`` (a new :class:`Counts` by default).
    Trial t of a scenario has the same seed whatever else the row runs.

    scenarios: "null", "effect" (patch-a ``effect``, +10 %) and "small" (patch-a
    ``small_effect``, +5 %: only its power is counted).
    plan: a sequential design; each trial is drawn with ``plan.spec.max`` repeats (the same
    trials as a fixed row of that many repeats) and compared under that schedule: the analysis
    replays the rule and shows its decisions at the look where it stops (the report of a run
    that stopped there); ``repeats`` is ignored.
    mmmu_first: MMMU runs in the first N rounds only (``suites.mmmu.rounds``; 0: every round,
    True: the first round); its verdict
    comes from repeat 0, the other suites' from every repeat."""
    c = counts or Counts()
    if plan is not None:
        repeats = plan.spec.max
    root = Path(
        tempfile.mkdtemp(
            prefix="pb-calibrate-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
        )
    )
    try:
        for sc in scenarios:
            for t in range(trials):
                rng = np.random.default_rng(
                    [seed, int(round(m.run_cv * 1e6)), repeats, t, SCENARIO_KEY[sc]]
                )
                size = {"effect": effect, "small": small_effect}.get(sc)
                eff = {EFFECT_VARIANT: size} if size is not None else {}
                syn = {EFFECT_VARIANT: 0} if size is not None else {}
                tr = simulate(rng, m, repeats, speedup=eff, syncs=syn, run_id=f"t{t}-{sc}")
                cmp = compare_trial(
                    tr,
                    settings,
                    via_folders=via_folders,
                    root=root,
                    secondaries=secondaries,
                    mmmu_first=mmmu_first,
                    plan=plan,
                )
                if plan is not None:
                    # the primaries' decisions are the rule's at its stopping look; the rest of
                    # the report (secondaries) is what the rounds that ran show
                    tr = truncate(tr, cmp.design.stopped_after or tr.repeats)
                    if secondaries and tr.repeats < plan.spec.max:
                        cmp = compare_trial(
                            tr, settings, secondaries=True, mmmu_first=mmmu_first, plan=plan
                        )
                _count(c, sc, tr, cmp)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return c


def _count(c: Counts, sc: str, tr: Trial, cmp: Comparison) -> None:
    """Count one compared trial of scenario ``sc`` into ``c``."""
    rows = cmp.rows
    c.reps[sc].append(tr.repeats)
    if tr.abnormal is not None and sc != "small":
        v, k = tr.abnormal
        c.abnormal += 1
        c.abnormal_named += any(
            r.primary and r.kind == "run" and v in (BASELINE, r.variant) and k in r.outlier_repeats
            for r in rows
        )
    if sc == "small":
        c.small += 1
        row = cmp.row("serving", THR, EFFECT_VARIANT)
        c.small_power += row is not None and row.verdict == "improved"
        c.small_equiv += row is not None and row.verdict == "equivalent"
        return
    dec = [
        r
        for r in rows
        if r.primary
        and r.variant in PATCHES
        and r.verdict in ("improved", "regressed", "equivalent")
    ]
    c.decided[sc] += len(dec)
    c.decided_run[sc] += sum(r.kind == "run" for r in dec)
    if sc == "effect":
        c.effect += 1
        row = cmp.row("serving", THR, EFFECT_VARIANT)
        c.new_power += row is not None and row.verdict == "improved"
        return
    c.null += 1
    c.new_fp_patch += sum(
        any(_hit(r.verdict) for r in rows if r.primary and r.variant == v) for v in PATCHES
    )
    c.new_fp += any(_hit(r.verdict) for r in rows if r.primary)
    c.new_fp_raw += any(_hit(r.verdict_before_health or r.verdict) for r in rows if r.primary)
    c.new_any += any(_hit(r.verdict) for r in rows)
    c.new_run_any += any(_hit(r.verdict) for r in rows if r.kind == "run")
    c.aa_failed += not cmp.health.ok
    for r in rows:
        if r.primary and r.variant in PATCHES:
            c.equiv_n[r.metric] = c.equiv_n.get(r.metric, 0) + 1
            c.equiv[r.metric] = c.equiv.get(r.metric, 0) + (r.verdict == "equivalent")
            c.raw_hit[r.metric] = c.raw_hit.get(r.metric, 0) + _hit(
                r.verdict_before_health or r.verdict
            )
    for s in ("serving", "mmmu"):
        for mm in PRIMARIES[s]:
            x = np.log([tr.metrics[(v, k)][s][mm] for v in tr.variants for k in range(tr.repeats)])
            c.logvar.setdefault(mm, []).append(float(x.var(ddof=1)))
