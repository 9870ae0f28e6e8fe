#!/usr/bin/env python
"""Calibrate the comparison: how often do its verdicts mislead, on synthetic runs with known truth.

A benchmark of the verdict rules, not a unit test. Every trial builds one synthetic run (a
baseline and three compared variants: one A/A variant, ``patch-a`` and ``patch-b``, as in
configs/pr9460-h200.yaml with an A/A variant added), hands it to the comparison code
(:func:`patchbench.analysis.build_comparison`: the suites' declarations, the MMMU pairing
contract, paired t on log ratios, ``min_repeats``, TOST, Holm across each variant's primaries,
Newcombe for accuracy, exact deterministic counts, the A/A downgrade) and counts the verdicts of
the primaries (serving: output throughput, median ITL, median TTFT, median E2E; MMMU overall
accuracy; sync probe host syncs per call). Scenarios per trial:

- ``null``: no variant changes anything;
- ``effect``: ``patch-a`` makes every time 10 % shorter (output throughput +10 %, latencies
  -9.1 %) and removes its 2 host syncs per call; ``patch-b`` and the A/A variant change nothing;
- ``small`` (``--small-effect``, design table only): the same at another speed-up (+5 %).

Printed, each rate with its 95 % Wilson interval over the trials:

- per row (run CV, repeats): a patch with no effect shown improved / regressed on any primary
  (target <= 5 %; counted per null patch), the same over the whole report (both null patches and
  the A/A variant), +10 % output throughput of ``patch-a`` called improved (target >= 90 %),
  one-repeat reports with a run-level improved / regressed verdict (target 0); the real-0
  primaries of the null patches called equivalent (margins: the suites' own, 5 % and 2 points;
  deterministic counts exact), the A/A check, and the run-to-run CV the rows really had;
- when the config's repeats miss the power target at ``--target-cv``, the next repeat counts are
  screened with ``--screen-trials`` +10 % trials each; a count whose screen is not clearly below
  the target (upper 95 % Wilson bound >= target) gets a full row, until one meets the target;
- a design table at ``--target-cv`` (printed last, for the README): fixed 5, the config's and
  ``--design-repeats`` repeats, and the ``--sequential`` designs (and the config's, when it ships
  one): error rates, equivalence of the real-0 primaries, repeats used (mean, p90), primaries of
  the two patches decided (improved, regressed or equivalent) per report and per H200 hour
  (:class:`Cost`). ``--mmmu-rounds first`` (the config's ``suites.mmmu.rounds`` by default) runs
  MMMU in the first round only in every row but the reference "fixed 5, every suite in every
  cell": MMMU is then judged on repeat 0, as the runner's analysis judges such a run. A
  sequential row runs the runner's own stopping rule (``patchbench.bench.sequential_design`` /
  ``sequential_primaries`` on the config with its schedule replaced,
  ``patchbench.sequential.replay``) on a trial drawn with ``max`` repeats (the same trials as the
  fixed row of that many), keeps the rounds that ran, and judges them with the comparison.
  ``--design-only`` runs just this table.

The verdict rule this comparison replaced (every metric on its own, no Holm, no minimum of
repeats, an A/A noise floor) is retired; its rates, measured with this script before its code
was deleted, are in docs/calibration.md.

Noise model (two levels; times in ms; one trial = one run):

- run level, per server lifetime (cell): a decode-speed shock ``s ~ N(0, run_cv)`` multiplies
  every inter-token gap by ``exp(s)``; the prefill shock of TTFT is ``0.5 s + sqrt(0.75) u``,
  ``u ~ N(0, run_cv)``, so TTFT is partly correlated with decode; E2E, TPOT, ITL and the
  throughputs follow from the requests, so their run-to-run correlations are those of one server;
- request level, CV ``req_cv`` (default 20 %): 200 requests of 1024 output tokens at concurrency
  16 run in waves of 16 that share their decode steps: a step's noise (share ``step_share`` of
  the log variance) is common to the 16 requests of the wave, the rest is the request's own; each
  request is represented by ``steps`` sampled decode steps; TTFT likewise has a wave part and a
  request part, times a prompt factor fixed per prompt (the same prompts in every cell);
- output throughput = 1024 x 200 / duration, duration = sum over waves of the slowest request's
  E2E; median ITL is taken over the sampled per-token gaps, TPOT per request;
- MMMU: 900 questions, each right or wrong once and for all (45 % right) except a ``fragile``
  share (5 %) that is right with probability 1/2 in every cell (batch-dependent numerics);
- sync probe: 2 host syncs per call, exactly, in every cell (0 for ``patch-a`` in ``effect``).

No drift between rounds is simulated (interleaving cancels a drift shared by a round).

Speed: by default the comparison runs on in-memory run data (``RunData`` handed to
``build_comparison`` with ``suites=`` :func:`memory_suites`: the suites' real declarations; the MMMU
pair hook replaced by the same per-question average over repeats that
``patchbench.suites.mmmu.pair_repeats`` computes; the serving and sync-probe hooks return None
because no per-request files exist in memory, and they feed only descriptive intervals and report
sections). ``--via-folders`` writes each trial as a run folder (:mod:`patchbench.testing`, MMMU
records.jsonl included) and runs ``patchbench.analysis.compare_run`` end to end instead (~100x
slower).

Usage::

    .venv/bin/python scripts/calibrate.py                  # default rows, 400 trials each
    .venv/bin/python scripts/calibrate.py --trials 1000 --cvs 0.03 --repeats 5 6 7
    .venv/bin/python scripts/calibrate.py --trials 20 --via-folders   # the on-disk path
    .venv/bin/python scripts/calibrate.py --design-only --design-repeats 8 --small-effect 0.05 \
        --sequential 4:12:2:pocock:0:aa 4:12:2:pocock 4:8:2:pocock   # the design table only
    .venv/bin/python scripts/calibrate.py --design-only --mmmu-rounds first   # MMMU in round 1

Exit status 0 when the targets hold at ``--target-cv`` with the config's schedule (fixed or
sequential), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's patchbench

from patchbench import analysis  # noqa: E402
from patchbench import suite as suite_mod  # noqa: E402
from patchbench.comparison import CompareSettings, Comparison  # noqa: E402
from patchbench.rundata import RunData  # noqa: E402
from patchbench.runfolder import CellRecord, RunManifest, SuiteSummary  # noqa: E402
from patchbench.stats import wilson_interval  # noqa: E402

BASELINE = "baseline"
AA = "aa"
VARIANTS: dict[str, list[str]] = {
    BASELINE: [],
    AA: [],
    "patch-a": ["patch-a"],
    "patch-b": ["patch-b"],
}
PATCHES = ("patch-a", "patch-b")
EFFECT_VARIANT = "patch-a"
#: scenario -> the last entry of its trials' seeds
SCENARIO_KEY = {"null": 0, "effect": 1, "small": 2}
THR = "output_throughput_tok_s"
SUITES = ("serving", "mmmu", "sync_probe")
PRIMARIES: dict[str, tuple[str, ...]] = {
    "serving": (
        "output_throughput_tok_s",
        "itl_median_ms",
        "ttft_median_ms",
        "e2e_latency_median_ms",
    ),
    "mmmu": ("mmmu_overall_acc",),
    "sync_probe": ("host_syncs_per_call_count",),
}
SHORT = {
    "output_throughput_tok_s": "output thr",
    "itl_median_ms": "median ITL",
    "ttft_median_ms": "median TTFT",
    "e2e_latency_median_ms": "median E2E",
    "mmmu_overall_acc": "MMMU acc",
    "host_syncs_per_call_count": "host syncs",
}
#: the summary statistics the simulation produces per serving quantity (all kind "run")
STATS = (("mean", None), ("median", 50), ("p90", 90), ("p95", 95), ("p99", 99))


# ------------------------------------------------------------------------------ noise model


@dataclass(frozen=True)
class Model:
    """The synthetic run's parameters (see the module docstring). CVs are log-scale standard
    deviations (fractions: 0.03 = 3 %); times in ms."""

    run_cv: float = 0.03
    req_cv: float = 0.20
    step_share: float = 0.5
    prefill_corr: float = 0.5
    requests: int = 200
    concurrency: int = 16
    steps: int = 16
    out_len: int = 1024
    in_len: int = 68
    itl_ms: float = 5.9
    ttft_ms: float = 97.0
    prompt_cv: float = 0.3
    questions: int = 900
    accuracy: float = 0.45
    fragile: float = 0.05
    syncs: int = 2


@dataclass
class Trial:
    """One synthetic run: ``metrics[(variant, k)] = {suite: {metric: value}}`` and per-question
    correctness ``correct[(variant, k)]`` (bool, shape (questions,))."""

    run_id: str
    repeats: int
    variants: list[str]
    metrics: dict[tuple[str, int], dict[str, dict[str, float]]] = field(default_factory=dict)
    correct: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)

    def values(self, variant: str, suite: str, metric: str) -> np.ndarray:
        """Per-repeat values of one metric, shape (repeats,)."""
        return np.array([self.metrics[(variant, k)][suite][metric] for k in range(self.repeats)])


def simulate(
    rng: np.random.Generator,
    m: Model,
    repeats: int,
    *,
    speedup: dict[str, float],
    syncs: dict[str, int],
    run_id: str,
) -> Trial:
    """Draw one trial: every variant of ``VARIANTS`` over ``repeats`` cells.

    speedup[variant]: every time of that variant is divided by (1 + speedup) (0.10: output
    throughput +10 %); syncs[variant]: host syncs per call (default ``m.syncs``)."""
    vs = list(VARIANTS)
    nv, n, T = len(vs), m.requests, m.steps
    C = nv * repeats  # cells, variant-major
    W = math.ceil(n / m.concurrency)
    wave = np.arange(n) // m.concurrency
    starts = np.arange(0, n, m.concurrency)
    prompt = np.exp(rng.normal(0.0, m.prompt_cv, n))  # fixed per prompt, shared by every cell
    base_ok = rng.random(m.questions) < m.accuracy
    fragile = rng.random(m.questions) < m.fragile

    s_d = rng.normal(0.0, m.run_cv, C)
    s_p = m.prefill_corr * s_d + math.sqrt(1 - m.prefill_corr**2) * rng.normal(0.0, m.run_cv, C)
    scale = np.repeat([1.0 / (1.0 + speedup.get(v, 0.0)) for v in vs], repeats)
    sd_w, sd_r = m.req_cv * math.sqrt(m.step_share), m.req_cv * math.sqrt(1 - m.step_share)
    step = rng.normal(0.0, sd_w, (C, W, T))[:, wave, :]  # a decode step, shared by its wave
    own = rng.normal(0.0, sd_r, (C, n, 1))
    gaps = m.itl_ms * scale[:, None, None] * np.exp(s_d[:, None, None] + step + own)
    tpot = gaps.mean(axis=2)
    ttft = (
        m.ttft_ms
        * prompt
        * scale[:, None]
        * np.exp(
            s_p[:, None] + rng.normal(0.0, sd_w, (C, W))[:, wave] + rng.normal(0.0, sd_r, (C, n))
        )
    )
    e2e = ttft + (m.out_len - 1) * tpot
    duration_s = np.maximum.reduceat(e2e, starts, axis=1).sum(axis=1) / 1000.0
    itl = gaps.reshape(C, n * T)
    per = {"ttft": ttft, "itl": itl, "tpot": tpot, "e2e_latency": e2e}
    cols: dict[str, np.ndarray] = {
        "request_throughput_req_s": n / duration_s,
        "input_throughput_tok_s": n * m.in_len / duration_s,
        "output_throughput_tok_s": n * m.out_len / duration_s,
        "total_throughput_tok_s": n * (m.in_len + m.out_len) / duration_s,
    }
    qs = [q for _, q in STATS if q is not None]
    for name, x in per.items():
        pct = np.percentile(x, qs, axis=1)
        cols[f"{name}_mean_ms"] = x.mean(axis=1)
        for (s, _q), row in zip([st for st in STATS if st[1] is not None], pct, strict=True):
            cols[f"{name}_{s}_ms"] = row
    flips = rng.random((C, m.questions)) < 0.5
    correct = np.where(fragile[None, :], flips, base_ok[None, :])
    tr = Trial(run_id, repeats, vs)
    for i, v in enumerate(vs):
        for k in range(repeats):
            c = i * repeats + k
            tr.metrics[(v, k)] = {
                "serving": {name: float(col[c]) for name, col in cols.items()},
                "mmmu": {"mmmu_overall_acc": float(correct[c].mean())},
                "sync_probe": {"host_syncs_per_call_count": float(syncs.get(v, m.syncs))},
            }
            tr.correct[(v, k)] = correct[c]
    return tr


# ------------------------------------------------------------------------------ the real path


def _config(tr: Trial, settings: CompareSettings) -> dict:
    return {
        "name": "calibration",
        "variants": VARIANTS,
        "baseline": BASELINE,
        "schedule": {"repeats": tr.repeats, "order": "interleaved"},
        "suites": {s: {} for s in SUITES},
        "compare": settings.model_dump(mode="json"),
    }


def _summary_metrics(tr: Trial, v: str, k: int, s: str, secondaries: bool) -> dict[str, float]:
    vals = tr.metrics[(v, k)][s]
    return dict(vals) if secondaries else {x: vals[x] for x in PRIMARIES[s] if x in vals}


def run_data(
    tr: Trial, settings: CompareSettings, secondaries: bool = False, mmmu_first: bool = False
) -> RunData:
    """The trial as :class:`patchbench.rundata.RunData` (what ``read_run`` returns for the same
    run folder: typed manifest, cells, summaries; A/A variants as ``read_run`` finds them).
    secondaries: put every simulated metric in the summaries, not only the primaries (secondary
    rows change no primary verdict and no A/A check; they only cost time). mmmu_first: the MMMU
    suite ran only in the first round (``suites.mmmu.rounds: first``): its summaries and pairing
    hold repeat 0 only, as ``read_run`` finds such a run."""
    mmmu_ks = {0} if mmmu_first else set(range(tr.repeats))

    def ran(s: str, k: int) -> bool:
        return s != "mmmu" or k in mmmu_ks

    cells_meta = []
    for k in range(tr.repeats):
        order = tr.variants if k % 2 == 0 else list(reversed(tr.variants))
        cells_meta += [{"variant": v, "repeat": k, "status": "ok"} for v in order]
    man = RunManifest(run_id=tr.run_id, config=_config(tr, settings), cells=cells_meta)
    base = sorted(man.variants[BASELINE])
    aa = [v for v in tr.variants[1:] if sorted(man.variants[v]) == base]
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
    ``q0..q{n-1}`` sorted as strings, as the hook sorts them."""
    a = np.mean([correct[(baseline, k)] for k in repeats], axis=0)
    b = np.mean([correct[(variant, k)] for k in repeats], axis=0)
    ids = sorted(f"q{i}" for i in range(a.size))
    idx = [int(i[1:]) for i in ids]
    return {
        "mmmu_overall_acc": {
            "ids": ids,
            "baseline": [float(a[i]) for i in idx],
            "variant": [float(b[i]) for i in idx],
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
    """Write the trial as a run folder (:func:`patchbench.testing.make_run`), MMMU records
    included."""
    from patchbench.testing import make_run, mmmu_rows

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
    mmmu_first: bool = False,
) -> Comparison:
    """The comparison code's verdicts on one trial: in memory (``build_comparison`` on a
    :class:`RunData` with :func:`memory_suites`) or, with ``via_folders``, from a run folder
    under ``root`` through ``compare_run``. mmmu_first: MMMU ran in the first round only
    (in memory only)."""
    if via_folders and mmmu_first:
        raise ValueError("--via-folders does not simulate suites.mmmu.rounds: first")
    if via_folders:
        run = write_folder(tr, root, settings, secondaries)
        try:
            return analysis.compare_run(run, settings)
        finally:
            shutil.rmtree(run, ignore_errors=True)
    return analysis.build_comparison(
        run_data(tr, settings, secondaries, mmmu_first), settings, suites=memory_suites(tr)
    )


# ------------------------------------------------------------------------------ rows


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


def _hit(v: str | None) -> bool:
    return v in ("improved", "regressed")


@dataclass(frozen=True)
class SeqSpec:
    """A ``schedule.repeats: {min, max, step, boundary}`` to simulate. futility: the
    conditional-power threshold of the futility stop (None: the runner's own,
    ``patchbench.bench.sequential_design``; 0: none); aa_holds: the A/A variant holds the run
    open like a patch (the rule before A/A variants became controls; for comparison only)."""

    min: int
    max: int
    step: int = 2
    boundary: str = "pocock"
    futility: float | None = None
    aa_holds: bool = False

    @property
    def label(self) -> str:
        extra = []
        if self.futility is not None:
            extra.append(f"futility {self.futility:g}" if self.futility else "no futility")
        if self.aa_holds:
            extra.append("A/A holds")
        return f"sequential {self.min}..{self.max} step {self.step} ({self.boundary})" + (
            f" [{', '.join(extra)}]" if extra else ""
        )


@dataclass
class SeqPlan:
    """What the runner uses to stop a sequential run (built by the runner's own functions,
    ``patchbench.bench.sequential_design`` / ``sequential_primaries``, from the config with its
    schedule replaced; ``spec.futility`` replaces the design's futility threshold when given):
    the design, [(key "suite.metric", suite, metric, better, log margin)] and the A/A variants
    that do not hold the run open (the runner's ``cfg.is_aa``; none with ``spec.aa_holds``)."""

    spec: SeqSpec
    design: object
    primaries: list[tuple[str, str, str, str, float]]
    controls: tuple[str, ...] = (AA,)


def sequential_plan(config: Path, spec: SeqSpec) -> SeqPlan:
    """The shipped stopping rule of ``spec`` for ``config`` (its compare settings, suites,
    margins). Raises ConfigError (patchbench.config) when the config does not load."""
    from patchbench import bench
    from patchbench.config import ScheduleSpec, load_config

    cfg = load_config(config)
    sched = ScheduleSpec(
        repeats={"min": spec.min, "max": spec.max, "step": spec.step, "boundary": spec.boundary},
        order="interleaved",
    )
    cfg = cfg.model_copy(update={"schedule": sched})
    prims = [
        (f"{s}.{m}", s, m, info.better, math.log1p(pct / 100.0))
        for s, m, info, pct in bench.sequential_primaries(cfg)
    ]
    design = bench.sequential_design(cfg)
    if spec.futility is not None:
        design = dataclasses.replace(design, futility=spec.futility)
    return SeqPlan(spec, design, prims, () if spec.aa_holds else (AA,))


def sequential_stop(tr: Trial, plan: SeqPlan) -> int:
    """Rounds the shipped sequential rule runs on this trial (``patchbench.sequential.replay``
    on the paired log ratios of every compared variant, A/A included, as the runner's
    ``sequential_look`` builds them; ``plan.controls`` do not hold the run open): the look at
    which it stops, or ``max``."""
    from patchbench.sequential import replay

    ratios = {
        v: {
            key: np.log(tr.values(v, s, mm) / tr.values(BASELINE, s, mm))
            for key, s, mm, _, _ in plan.primaries
        }
        for v in tr.variants[1:]
    }
    margins = {key: mg for key, _, _, _, mg in plan.primaries}
    better = {key: b for key, _, _, b, _ in plan.primaries}
    out = replay(ratios, margins, design=plan.design, better=better, controls=plan.controls)
    return out.n_repeats if out is not None and out.stop else tr.repeats


def truncate(tr: Trial, n: int) -> Trial:
    """The first ``n`` repeats of a trial (what a run that stopped after n rounds has)."""
    out = Trial(tr.run_id, n, tr.variants)
    out.metrics = {key: x for key, x in tr.metrics.items() if key[1] < n}
    out.correct = {key: x for key, x in tr.correct.items() if key[1] < n}
    return out


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
    mmmu_first: bool = False,
) -> Counts:
    """Simulate ``trials`` seeded trials of each scenario at ``m.run_cv`` and ``repeats``, run
    the comparison on each and count into ``counts`` (a new :class:`Counts` by default).
    Trial t of a scenario has the same seed whatever else the row runs.

    scenarios: "null", "effect" (patch-a ``effect``, +10 %) and "small" (patch-a
    ``small_effect``, +5 %: only its power is counted).
    plan: a sequential design; each trial is drawn with ``plan.spec.max`` repeats (the same
    trials as a fixed row of that many repeats), cut where the runner's stopping rule stops,
    and the comparison runs on the repeats that remain (``repeats`` is ignored).
    mmmu_first: MMMU runs in the first round only (``suites.mmmu.rounds: first``); its verdict
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
                if plan is not None:
                    tr = truncate(tr, sequential_stop(tr, plan))
                cmp = compare_trial(
                    tr,
                    settings,
                    via_folders=via_folders,
                    root=root,
                    secondaries=secondaries,
                    mmmu_first=mmmu_first,
                )
                _count(c, sc, tr, cmp)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return c


def _count(c: Counts, sc: str, tr: Trial, cmp: Comparison) -> None:
    """Count one compared trial of scenario ``sc`` into ``c``."""
    rows = cmp.rows
    c.reps[sc].append(tr.repeats)
    if sc == "small":
        c.small += 1
        row = cmp.row("serving", THR, EFFECT_VARIANT)
        c.small_power += row is not None and row.verdict == "improved"
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


# ------------------------------------------------------------------------------ output


def fmt(k: int, n: int) -> str:
    """ "4.2% [2.7, 6.6]": the rate k / n and its 95 % Wilson interval; "n/a" when n is 0."""
    if n == 0:
        return "n/a"
    lo, hi = wilson_interval(k, n, 0.95)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def realised_cv(c: Counts, metric: str) -> str:
    """Pooled within-trial standard deviation of the log metric over every cell of a null
    trial (all cells then have the same distribution): the run-to-run CV the rows really had."""
    v = c.logvar.get(metric)
    return f"{100 * math.sqrt(float(np.mean(v))):.1f}%" if v else "n/a"


def table(rows: list[tuple[float, int, Counts]]) -> list[str]:
    """The two markdown tables (targets; equivalence, A/A check and realised noise)."""
    np_ = len(PATCHES)
    out = [
        "| run CV | repeats | trials (null / +10%) | a patch with no effect shown improved or "
        "regressed on a primary (target <= 5%) | whole no-effect report (2 null patches + A/A), "
        "any primary | +10% output throughput called improved (target >= 90%) | no-effect "
        "reports with a run-level improved/regressed (target 0 at 1 repeat) |",
        "|---|---|---|---|---|---|---|",
    ]
    for cv, n, c in rows:
        out.append(
            f"| {100 * cv:g}% | {n} | {c.null} / {c.effect} | "
            f"{fmt(c.new_fp_patch, np_ * c.null)} | {fmt(c.new_fp, c.null)} | "
            f"{fmt(c.new_power, c.effect)} | {fmt(c.new_run_any, c.null)} |"
        )
    prim = [mm for s in SUITES for mm in PRIMARIES[s]]
    out += [
        "",
        "No-effect reports: primaries of the two null patches called equivalent (margins "
        "5%, MMMU 2 pt; host syncs exact), the A/A check, and the run-to-run CV the rows "
        "really had (run and request noise together):",
        "",
        "| run CV | repeats | "
        + " | ".join(f"{SHORT[x]} equivalent" for x in prim)
        + " | A/A check failed | primary improved/regressed before the A/A check | any row "
        "improved/regressed | realised CV: thr / ITL / TTFT / E2E / MMMU acc |",
        "|---|---|" + "---|" * (len(prim) + 4),
    ]
    for cv, n, c in rows:
        if not c.null:
            continue
        eq = " | ".join(fmt(c.equiv.get(x, 0), c.equiv_n.get(x, 0)) for x in prim)
        rc = " / ".join(realised_cv(c, x) for x in PRIMARIES["serving"] + PRIMARIES["mmmu"])
        out.append(
            f"| {100 * cv:g}% | {n} | {eq} | {fmt(c.aa_failed, c.null)} | "
            f"{fmt(c.new_fp_raw, c.null)} | {fmt(c.new_any, c.null)} | {rc} |"
        )
    out += [
        "",
        "Where the false verdicts come from: primaries of the two null patches called "
        "improved or regressed before the A/A check (share of rows):",
        "",
        "| run CV | repeats | " + " | ".join(SHORT[x] for x in prim) + " |",
        "|---|---|" + "---|" * len(prim),
    ]
    for cv, n, c in rows:
        if c.null:
            out.append(
                f"| {100 * cv:g}% | {n} | "
                + " | ".join(fmt(c.raw_hit.get(x, 0), c.equiv_n.get(x, 0)) for x in prim)
                + " |"
            )
    return out


def config_schedule(path: Path) -> tuple[bool, int]:
    """(MMMU runs in the first round only, number of untimed correctness cells) of a config, read
    as the runner reads it (patchbench.config.load_config: ``suites.mmmu.rounds`` resolved by
    ``Config.rounds_of``; the cells of ``patchbench.bench.plan``: one correctness cell per
    variant when a suite is instrumented or untimed, else none). Raises ConfigError."""
    from patchbench import bench
    from patchbench.config import load_config

    cfg = load_config(path)
    return cfg.rounds_of("mmmu") == [0], sum(c.kind != "timed" for c in bench.plan(cfg))


def config_repeats(path: Path) -> tuple[int | None, SeqSpec | None, CompareSettings]:
    """(fixed schedule.repeats or None, the sequential schedule or None, compare settings) of a
    config file (a plain YAML read; patchbench.config validates it when the plan is built)."""
    import yaml

    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    reps = (raw.get("schedule") or {}).get("repeats") or 1
    settings = CompareSettings.model_validate(raw.get("compare") or {})
    if isinstance(reps, dict):
        spec = SeqSpec(
            int(reps["min"]),
            int(reps["max"]),
            int(reps.get("step", 2)),
            str(reps.get("boundary", "pocock")),
            futility=float(reps["futility"]) if "futility" in reps else None,
        )
        return None, spec, settings
    return int(reps), None, settings


def parse_seq(text: str) -> SeqSpec:
    """``MIN:MAX:STEP[:BOUNDARY[:FUTILITY[:aa]]]`` as a :class:`SeqSpec`: e.g. ``4:12:2:pocock``
    (the runner's futility threshold), ``4:12:2:pocock:0.2`` (futility at conditional power
    0.2), ``4:12:2:pocock:0:aa`` (no futility, the A/A variant holds the run open, as before A/A
    variants became controls)."""
    usage = (
        f"{text!r}: a sequential design is MIN:MAX:STEP[:BOUNDARY[:FUTILITY[:aa]]], e.g. "
        "4:12:2:pocock or 4:12:2:pocock:0.1"
    )
    parts = text.split(":")
    if not 3 <= len(parts) <= 6 or not all(x.isdigit() for x in parts[:3]):
        raise argparse.ArgumentTypeError(usage)
    if len(parts) >= 4 and parts[3] not in ("pocock", "obrien-fleming"):
        raise argparse.ArgumentTypeError(f"{text!r}: boundary is pocock or obrien-fleming")
    fut = None
    if len(parts) >= 5:
        try:
            fut = float(parts[4])
        except ValueError:
            raise argparse.ArgumentTypeError(usage) from None
        if not 0.0 <= fut < 1.0:
            raise argparse.ArgumentTypeError(f"{text!r}: futility must lie in [0, 1)")
    if len(parts) == 6 and parts[5] != "aa":
        raise argparse.ArgumentTypeError(usage)
    return SeqSpec(*map(int, parts[:3]), *parts[3:4], futility=fut, aa_holds=len(parts) == 6)


@dataclass(frozen=True)
class Cost:
    """H200 seconds of one report: ``cells`` timed cells a round, each ``startup_s`` +
    ``serving_s`` (+ ``mmmu_s`` in the rounds MMMU runs in), plus ``correctness_cells`` untimed
    correctness cells (``startup_s`` + ``correctness_s`` each, the same in every design)."""

    cells: int
    startup_s: float
    serving_s: float
    mmmu_s: float
    correctness_s: float
    correctness_cells: int = 0

    def hours(self, rounds: float, mmmu_first: bool) -> float:
        """H200 hours of a report with ``rounds`` timed rounds (a mean is fine: linear)."""
        mmmu_rounds = min(1.0, rounds) if mmmu_first else rounds
        timed = self.cells * (
            rounds * (self.startup_s + self.serving_s) + mmmu_rounds * self.mmmu_s
        )
        corr = self.correctness_cells * (self.startup_s + self.correctness_s)
        return (timed + corr) / 3600.0


def design_table(entries: list[tuple[str, Counts, bool]], cv: float, cost: Cost) -> list[str]:
    """The README table: one line per design (label, counts, MMMU in the first round only) at
    run CV ``cv``: error rates, equivalence of the real-0 primaries, repeats used, primaries
    decided and what they cost in H200 time (:class:`Cost`)."""
    prim = list(PRIMARIES["serving"]) + list(PRIMARIES["mmmu"])
    n_all = len(PATCHES) * sum(len(x) for x in PRIMARIES.values())
    n_run = len(PATCHES) * len(PRIMARIES["serving"])
    small = any(c.small for _, c, _ in entries)
    out = [
        f"| design (run CV {100 * cv:g}%) | trials (no effect / +10%) | repeats: mean / p90 "
        "(no effect) | repeats: mean / p90 (+10%) | a no-effect patch shown improved or "
        "regressed (target <= 5%) | +10% output throughput called improved (target >= 90%) | "
        + ("+5% output throughput called improved | " if small else "")
        + " | ".join(f"real 0 called equivalent: {SHORT[x]}" for x in prim)
        + f" | primaries decided a report, all {n_all} / serving {n_run}: no effect | +10% "
        "| H200 min a report: no effect / +10% | primaries decided per H200 hour, all / "
        "serving: no effect | +10% |",
        "|---|---|---|---|---|---|" + "---|" * (len(prim) + small) + "---|---|---|---|---|",
    ]
    for label, c, mmmu_first in entries:
        mins, dec, per_h = [], [], []
        for sc, n in (("null", c.null), ("effect", c.effect)):
            if not n:
                mins.append("n/a")
                dec.append("n/a")
                per_h.append("n/a")
                continue
            h = cost.hours(float(np.mean(c.reps[sc])), mmmu_first)
            d, r = c.decided[sc] / n, c.decided_run[sc] / n
            mins.append(f"{60 * h:.0f}")
            dec.append(f"{d:.2f} / {r:.2f}")
            per_h.append(f"{d / h:.2f} / {r / h:.2f}")
        reps = [
            f"{np.mean(c.reps[sc]):.1f} / {np.percentile(c.reps[sc], 90):.0f}"
            if c.reps[sc]
            else "n/a"
            for sc in ("null", "effect")
        ]
        out.append(
            f"| {label} | {c.null} / {c.effect} | {reps[0]} | {reps[1]} | "
            f"{fmt(c.new_fp_patch, len(PATCHES) * c.null)} | "
            f"{fmt(c.new_power, c.effect)} | "
            + (f"{fmt(c.small_power, c.small)} | " if small else "")
            + " | ".join(fmt(c.equiv.get(x, 0), c.equiv_n.get(x, 0)) for x in prim)
            + f" | {' | '.join(dec)} | {' / '.join(mins)} | {' | '.join(per_h)} |"
        )
    return out


# ------------------------------------------------------------------------------ command line


def _row_options(ap: argparse.ArgumentParser) -> None:
    """The CV rows, the targets and the repeat search."""
    ap.add_argument("--trials", type=int, default=400, help="seeded trials a row and scenario")
    ap.add_argument(
        "--cvs",
        type=float,
        nargs="+",
        default=[0.015, 0.03, 0.06, 0.12],
        help="run-level CVs (fractions), one row each (0.015 0.03 0.06 0.12)",
    )
    ap.add_argument(
        "--repeats", type=int, nargs="+", help="repeats of those rows (default: the config's)"
    )
    ap.add_argument(
        "--config",
        type=Path,
        default=REPO / "configs" / "pr9460-h200.yaml",
        help="config whose repeats and compare settings are used and checked",
    )
    ap.add_argument(
        "--target-cv",
        type=float,
        default=0.03,
        help="CV at which the targets are checked and more repeats searched (0.03)",
    )
    ap.add_argument(
        "--search-max", type=int, default=12, help="largest repeat count searched (0: no search)"
    )
    ap.add_argument(
        "--screen-trials",
        type=int,
        default=100,
        help="+10%% trials that screen each searched repeat count before its full row (0: none)",
    )
    ap.add_argument("--power-target", type=float, default=0.90)
    ap.add_argument("--fp-target", type=float, default=0.05)
    ap.add_argument("--no-one-repeat", action="store_true", help="skip the one-repeat row")
    ap.add_argument(
        "--secondaries",
        action="store_true",
        help="give the comparison every simulated serving metric, not only the primaries "
        "(about 3x slower; only the 'any row' column changes)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--via-folders", action="store_true", help="run folders through compare_run (slow)"
    )


def _design_options(ap: argparse.ArgumentParser) -> None:
    """The design table and its H200 cost columns."""
    ap.add_argument(
        "--design-only",
        action="store_true",
        help="only the design table at --target-cv: no CV rows, no search, no one-repeat row",
    )
    ap.add_argument(
        "--design-repeats",
        type=int,
        nargs="*",
        default=[8, 12, 16],
        help="fixed repeat counts in the design table (8 12 16; the config's and 5 always)",
    )
    ap.add_argument(
        "--sequential",
        type=parse_seq,
        nargs="*",
        default=[parse_seq(x) for x in ("4:12:2:pocock", "4:12:2:obrien-fleming", "4:8:2:pocock")],
        help="sequential designs MIN:MAX:STEP[:BOUNDARY[:FUTILITY[:aa]]] in the design table "
        "(4:12:2:pocock 4:12:2:obrien-fleming 4:8:2:pocock; the config's own always)",
    )
    ap.add_argument(
        "--small-effect",
        type=float,
        help="also count how often patch-a's output throughput at this speed-up (e.g. 0.05) is "
        "called improved (one more scenario a design row)",
    )
    ap.add_argument(
        "--mmmu-rounds",
        choices=("all", "first"),
        help="MMMU schedule of every design row but the reference (default: the config's)",
    )
    ap.add_argument(
        "--startup-s",
        type=float,
        default=60.0,
        help="server start-up per H200 cell (60 s: an assumption, not measured here)",
    )
    ap.add_argument("--serving-s", type=float, default=79.0, help="serving phase per cell (79 s)")
    ap.add_argument("--mmmu-s", type=float, default=76.0, help="MMMU phase per cell (76 s)")
    ap.add_argument(
        "--correctness-s",
        type=float,
        default=30.0,
        help="one untimed correctness cell beyond its start-up (30 s: an assumption)",
    )


def _model_options(ap: argparse.ArgumentParser) -> None:
    """The noise model's request level and MMMU."""
    ap.add_argument("--req-cv", type=float, default=Model.req_cv, help="request-level CV (0.20)")
    ap.add_argument(
        "--step-share",
        type=float,
        default=Model.step_share,
        help="share of the request-level log variance common to a decode wave (0.5)",
    )
    ap.add_argument(
        "--fragile",
        type=float,
        default=Model.fragile,
        help="share of MMMU questions right with probability 1/2 in each cell (0.05)",
    )
    ap.add_argument("--questions", type=int, default=Model.questions)


@dataclass
class Calibration:
    """One invocation: the options, what the config ships, and the rows counted so far
    (``rows``: the CV table's (cv, repeats, counts); ``at``: the fixed rows at ``--target-cv`` by
    repeat count; ``shipped_sequential``: the config's own sequential design there)."""

    a: argparse.Namespace
    settings: CompareSettings
    fixed_cfg: int | None
    seq_cfg: SeqSpec | None
    n_corr: int
    mmmu_first: bool
    base: Model
    rows: list[tuple[float, int, Counts]] = field(default_factory=list)
    at: dict[int, Counts] = field(default_factory=dict)
    screens: list[str] = field(default_factory=list)
    shipped_sequential: Counts | None = None

    @property
    def reps_cfg(self) -> int:
        """The fixed repeats of the target and CV rows: the config's, or 5 (the reference point
        of the targets) when the config ships a sequential design."""
        return self.fixed_cfg or 5

    def model(self, cv: float) -> Model:
        return dataclasses.replace(self.base, run_cv=cv)

    def run(self, cv: float, n: int, label: str, trials: int | None = None, **kw) -> Counts:
        """:func:`run_row` at run CV ``cv`` and ``n`` repeats with the options' trials (or
        ``trials``), seed and settings; its time goes to stderr under ``label``."""
        a = self.a
        small = a.small_effect if a.small_effect is not None else 0.05
        kw = dict(via_folders=a.via_folders, secondaries=a.secondaries, small_effect=small) | kw
        t1 = time.time()
        c = run_row(self.model(cv), n, trials or a.trials, a.seed, self.settings, **kw)
        print(f"  CV {100 * cv:g}% {label}: {time.time() - t1:.0f} s", file=sys.stderr, flush=True)
        return c

    def row(self, cv: float, n: int, scenarios=("null", "effect"), into: Counts | None = None):
        """A CV-table row (added to ``rows`` unless it adds scenarios to ``into``)."""
        c = self.run(
            cv, n, f"x {n} repeats, {'+'.join(scenarios)}", scenarios=scenarios, counts=into
        )
        if into is None:
            self.rows.append((cv, n, c))
        return c


def load(a: argparse.Namespace, ap: argparse.ArgumentParser) -> Calibration:
    """The calibration of the parsed options: the config's schedule and settings (defaults, 5
    repeats, when the file does not exist)."""
    n_corr, fixed_cfg, seq_cfg, settings = 0, 5, None, CompareSettings()
    if a.config.is_file():
        fixed_cfg, seq_cfg, settings = config_repeats(a.config)
        cfg_mmmu_first, n_corr = config_schedule(a.config)
        a.mmmu_rounds = a.mmmu_rounds or ("first" if cfg_mmmu_first else "all")
    a.mmmu_rounds = a.mmmu_rounds or "all"
    if a.mmmu_rounds == "first" and a.via_folders:
        ap.error("--via-folders simulates MMMU in every round; add --mmmu-rounds all")
    base = Model(req_cv=a.req_cv, step_share=a.step_share, fragile=a.fragile, questions=a.questions)
    return Calibration(a, settings, fixed_cfg, seq_cfg, n_corr, a.mmmu_rounds == "first", base)


def cv_rows(cal: Calibration) -> None:
    """The CV table's rows and the target row, then the search for the repeats reaching the
    power target: each further count is screened with --screen-trials +10 % trials; one whose
    screen is not clearly below the target (upper Wilson bound >= target) gets the full trials
    (+10 %; no-effect too at the first that meets the target)."""
    a = cal.a
    for cv in a.cvs:
        for n in a.repeats or [cal.reps_cfg]:
            cal.row(cv, n)
    cal.at.update({n: c for cv, n, c in cal.rows if cv == a.target_cv})
    if cal.reps_cfg not in cal.at:
        cal.at[cal.reps_cfg] = cal.row(a.target_cv, cal.reps_cfg)
    n, c = cal.reps_cfg, cal.at[cal.reps_cfg]
    while c.new_power < a.power_target * c.effect and n < a.search_max:
        n += 1
        if n in cal.at:
            c = cal.at[n]
            continue
        if 0 < a.screen_trials < a.trials:
            sc = cal.run(
                a.target_cv,
                n,
                f"x {n} repeats, screen",
                scenarios=("effect",),
                trials=a.screen_trials,
            )
            cal.screens.append(f"{n} repeats: {fmt(sc.new_power, sc.effect)}")
            if wilson_interval(sc.new_power, sc.effect, 0.95)[1] < a.power_target:
                continue  # clearly below the target
        c = cal.at[n] = cal.row(a.target_cv, n, ("effect",))
    if c.new_power >= a.power_target * c.effect and not c.null:
        cal.row(a.target_cv, n, ("null",), into=c)


def design_rows(cal: Calibration) -> list[tuple[str, Counts, bool]]:
    """The design table's entries at --target-cv: (label, counts, MMMU in the first round only)
    for the fixed counts (both scenarios; with MMMU in the first round only, every fixed row but
    the reference 'fixed 5, every suite in every cell' again with that schedule, on the same
    trials) and the sequential designs."""
    a, first = cal.a, ", MMMU in the first round only" if cal.mmmu_first else ""
    fixed = sorted({5, cal.reps_cfg, *a.design_repeats})
    scen = ("null", "effect") + (("small",) if a.small_effect is not None else ())
    for n in fixed:
        have = cal.at.get(n)
        todo = tuple(s for s in scen if have is None or not getattr(have, s))
        if have is None:
            cal.at[n] = cal.row(a.target_cv, n, scen)
        elif todo:
            cal.row(a.target_cv, n, todo, into=have)
    entries = [
        (f"fixed {n}" + (" (today: every suite in every cell)" if n == 5 else ""), cal.at[n], False)
        for n in fixed
        if n == 5 or not cal.mmmu_first
    ]
    for n in fixed if cal.mmmu_first else []:
        c = cal.run(
            a.target_cv, n, f"x {n} repeats, MMMU first round", scenarios=scen, mmmu_first=True
        )
        entries.append((f"fixed {n}{first}", c, True))
    seqs = list(dict.fromkeys([*([cal.seq_cfg] if cal.seq_cfg else []), *a.sequential]))
    if seqs and not a.config.is_file():
        print(f"  no config file {a.config}: no sequential rows", file=sys.stderr)
        seqs = []
    for spec in seqs:
        c = cal.run(
            a.target_cv,
            spec.max,
            spec.label,
            scenarios=scen,
            plan=sequential_plan(a.config, spec),
            mmmu_first=cal.mmmu_first,
        )
        entries.append((spec.label + first, c, cal.mmmu_first))
        if spec == cal.seq_cfg:
            cal.shipped_sequential = c
    return entries


def print_report(cal: Calibration, argv: list[str], wall: float, entries) -> int:
    """Print the tables and the targets' verdict; return the exit status."""
    a, base = cal.a, cal.base
    print(f"command: .venv/bin/python scripts/calibrate.py {' '.join(argv)}".rstrip())
    how = "run folders + compare_run" if a.via_folders else "in-memory RunData + build_comparison"
    print(f"wall time: {wall:.0f} s, one process ({how})")
    print(
        f"settings: {a.config.name if a.config.is_file() else 'defaults'}: confidence "
        f"{cal.settings.confidence}, min_repeats {cal.settings.min_repeats}; request CV "
        f"{100 * base.req_cv:g}% (decode-step share {base.step_share:g}), {base.requests} "
        f"requests x {base.out_len} tokens at concurrency {base.concurrency}; MMMU "
        f"{base.questions} questions, {100 * base.fragile:g}% fragile; variants: baseline, "
        f"A/A, 2 patches; seed {a.seed}\n"
    )
    if cal.rows and not a.design_only:
        print("\n".join(table(sorted(cal.rows, key=lambda r: (r[0], -(r[1] == 1), r[1])))))
    if cal.screens:
        print(
            f"\nsearch at run CV {100 * a.target_cv:g}%, +10% called improved in the "
            f"{a.screen_trials}-trial screens (a count whose 95% Wilson upper bound is below "
            "the target gets no full row): " + "; ".join(cal.screens)
        )
    cost = Cost(len(VARIANTS), a.startup_s, a.serving_s, a.mmmu_s, a.correctness_s, cal.n_corr)
    ships = cal.seq_cfg.label if cal.seq_cfg else f"fixed {cal.reps_cfg}"
    print(
        f"\nDesigns at run CV {100 * a.target_cv:g}% ({a.config.name} ships {ships}); primaries "
        f"decided: improved, regressed or equivalent after the A/A check, of the 12 primaries of "
        f"the two patches (6 each; serving: their 4 run-level ones); H200 minutes of a report: "
        f"{len(VARIANTS)} timed cells a round, one cell = {a.startup_s:g} s server start-up "
        f"(assumed, not measured here) + {a.serving_s:g} s serving (+ {a.mmmu_s:g} s MMMU in the "
        f"rounds it runs in), plus the config's {cal.n_corr} untimed correctness cells of "
        f"{a.startup_s:g} + {a.correctness_s:g} s (assumed). Sequential rows: the runner's "
        f"stopping rule (patchbench.bench.sequential_design / sequential_primaries, "
        f"patchbench.sequential.replay; the A/A variant does not hold the run open unless the row "
        f"says 'A/A holds'; futility: the conditional-power threshold, the runner's own unless the "
        f"row names one) on the same trials as the fixed row of their maximum, then the "
        f"comparison on the rounds that ran:\n"
    )
    print("\n".join(design_table(entries, a.target_cv, cost)))
    print(
        "\n(brackets: 95% Wilson interval over the trials; a method whose true rate is exactly "
        "5% shows more than 5.0% in about half of such samples. n/a: scenario not run there.)"
    )
    return targets(cal)


def targets(cal: Calibration) -> int:
    """Print whether the shipped schedule meets the targets at --target-cv and the smallest
    fixed repeat count reaching the power target; 0 when both targets hold, else 1."""
    a = cal.a
    c = cal.shipped_sequential if cal.seq_cfg else cal.at[cal.reps_cfg]
    shipped = (
        f"sequential {cal.seq_cfg.min}..{cal.seq_cfg.max}"
        if cal.seq_cfg
        else f"fixed {cal.reps_cfg}"
    )
    fp_ok = c.new_fp_patch <= a.fp_target * len(PATCHES) * c.null
    pw_ok = c.new_power >= a.power_target * c.effect
    print(
        f"\n{a.config.name}: {shipped} repeats at run CV {100 * a.target_cv:g}%: a no-effect "
        f"patch shown improved/regressed {'<=' if fp_ok else '>'} {100 * a.fp_target:g}% "
        f"({'met' if fp_ok else 'NOT met'}); +10% called improved "
        f"{'>=' if pw_ok else '<'} {100 * a.power_target:g}% ({'met' if pw_ok else 'NOT met'})."
    )
    ok = sorted(
        k for k, x in cal.at.items() if x.effect and x.new_power >= a.power_target * x.effect
    )
    print(
        "smallest fixed repeat count reaching the power target at this CV: "
        + (str(ok[0]) if ok else f"none up to {max(cal.at)}")
    )
    return 0 if fp_ok and pw_ok else 1


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for add in (_row_options, _design_options, _model_options):
        add(ap)
    cal = load(ap.parse_args(argv), ap)
    t0 = time.time()
    if not cal.a.design_only:
        cv_rows(cal)
    entries = design_rows(cal)
    if not cal.a.no_one_repeat and not cal.a.design_only:
        cal.row(cal.a.target_cv, 1, ("null",))
    return print_report(cal, argv, time.time() - t0, entries)


if __name__ == "__main__":
    sys.exit(main())
