"""Calibration of the nightly gates on simulated histories (tools/calibrate_nightly.py, part 1).

Model, per night, variant, gated metric and run (log scale):
``log value = log 100 + drift_night + e``, ``e ~ N(0, cv)`` (``dist="t3"``: Student's t with 3
degrees of freedom scaled to the same SD, heavy tails), ``drift_night ~ N(0, drift)`` shared
by every variant and metric of the night (machine, driver); every gated metric gets independent
run noise (the worst case for Holm). Scenarios:

- **quiet**: nothing changes. Reported: the share of green nights, false red nights per 30, the
  share of underpowered nights;
- **patch step**: the patched variant's throughput 5 % lower from one night on (the same-run
  gate's job); **stock step**: every variant's throughput 5 % lower (the history gate's job).
  Reported: the share of histories with a red night within 3 nights of the step;
- **abnormal runs**: on a fifth of the nights (``abnormal``), one run of one variant (either, at
  random) is ``abnormal_pct`` slower in every metric (throughput lower, latencies higher,
  accuracy lower), in every scenario of the row.

Each trial warms the history up with ``warm`` quiet nights, gates ``quiet`` quiet nights one
after the other (each recorded), then the steps (from the same warmed history).
:func:`gate_rates` drives :func:`patchbench.nightly.gates.evaluate` as the nightly does: the noise
learned from the simulated history, each gated night's same-run verdicts from its report
(:func:`with_report`: ``patchbench.analysis.build.build_comparison`` on the night's values in
memory, the suites' real declarations; without per-question data an accuracy row has no test, so
an MMMU same-run gate is left to the noise rule).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from patchbench.analysis.build import build_comparison
from patchbench.analysis.comparison import CompareSettings
from patchbench.analysis.rundata import RunData
from patchbench.config.nightly import NightlySettings
from patchbench.nightly.gates import evaluate, night_outcome
from patchbench.nightly.history import Night, add_comparison
from patchbench.nightly.noise import Noise, Scale
from patchbench.runfolder import CellRecord, RunManifest, SuiteSummary
from patchbench.suite import get_suite

BETTER = {"output_throughput_tok_s": "higher", "mmmu_overall_acc": "higher"}
#: the report's Holm family of a simulated night: the 4 simulated primaries of the patched variant
FAMILY = 4
#: (suite, metric) -> direction, for every simulated metric of the shipped gates
BETTER_OF = {
    (s, m): BETTER.get(m, "lower")
    for s, m in (("serving", "output_throughput_tok_s"), ("serving", "itl_median_ms"),
                 ("serving", "ttft_median_ms"), ("mmmu", "mmmu_overall_acc"))
}  # fmt: skip
TPUT = ("serving", "output_throughput_tok_s")
BASELINE, VARIANT = "baseline", "patched"


def gate_metrics(settings: NightlySettings) -> list[tuple[str, str]]:
    """(suite, metric) of every gate, each once, in the config's order."""
    out: list[tuple[str, str]] = []
    for g in settings.gates:
        k = (g.suite or "serving", g.metric_name)
        if k not in out:
            out.append(k)
    return out


@dataclass(frozen=True)
class Scenario:
    """One simulated night's changes: ``patch`` / ``stock`` the fraction the patched variant's /
    every variant's throughput is lower; ``abnormal``: the chance that one run of the night is
    ``abnormal_pct`` % slower in every metric."""

    patch: float = 0.0
    stock: float = 0.0
    abnormal: float = 0.0
    abnormal_pct: float = 15.0


def sim_night(
    i: int,
    rng: np.random.Generator,
    metrics: Sequence[tuple[str, str]],
    repeats: int,
    cv: float,
    drift: float,
    sc: Scenario,
    *,
    dist: str = "normal",
    machine: str | None = None,
    slow: float = 0.0,
) -> Night:
    """Night ``i`` of a simulated history (see the module docstring); run ids ``n0000``...
    ``machine``: the night's :attr:`Night.machine`, ``slow`` how much slower it is (a fraction:
    every serving metric worse by it, accuracy alike on every machine)."""
    d = rng.normal(0.0, drift) if drift > 0 else 0.0
    odd = None
    if sc.abnormal and rng.random() < sc.abnormal:
        odd = (BASELINE if rng.random() < 0.5 else VARIANT, int(rng.integers(repeats)))
    vals, better = {}, {}
    for v in (BASELINE, VARIANT):
        for s, m in metrics:
            b = BETTER.get(m, "lower")
            if dist == "t3":
                e = rng.standard_t(3, repeats) * cv / math.sqrt(3.0) + d
            else:
                e = rng.normal(0.0, cv, repeats) + d
            if s == "serving" and slow:
                e = e + (1 if b == "higher" else -1) * math.log1p(-slow)
            if (s, m) == TPUT:
                e = e + math.log1p(-sc.stock) + (math.log1p(-sc.patch) if v == VARIANT else 0.0)
            if odd is not None and odd[0] == v:
                worse = math.log1p(-sc.abnormal_pct / 100.0)
                e[odd[1]] += worse if b == "higher" else -worse
            vals[(v, s, m)] = [float(x) for x in 100.0 * np.exp(e)]
            better[(s, m)] = b
    day = f"{2026 + i // 336}-{1 + (i // 28) % 12:02d}-{1 + i % 28:02d}T03:00:00Z"
    return Night(
        run_id=f"n{i:04d}",
        night_utc=day,
        config_name="sim",
        baseline=BASELINE,
        machine=machine,
        values=vals,
        better=better,
    )


class _Declared:
    """A registered suite's metric declarations with a pair hook that finds nothing (no request
    or question files in memory): the report's rows from the per-run values alone."""

    def __init__(self, name: str):
        self.name, self.metrics = name, dict(get_suite(name).metrics)

    def pair(self, *_args: Any) -> None:
        return None


_SUITES: dict[str, _Declared] = {}


def with_report(night: Night, compare: CompareSettings | None = None) -> Night:
    """``night`` with its report's verdicts in ``comparisons`` (what compare.json of its run
    folder would say: ``build_comparison`` on the values in memory, interleaved rounds, every
    cell ok); variants other than the baseline carry a patch. Returns ``night``."""
    variants = night.variants
    reps = max(len(v) for v in night.values.values())
    suites = sorted({s for (_v, s, _m) in night.values})
    for s in suites:
        _SUITES.setdefault(s, _Declared(s))
    cfg = {
        "name": night.config_name,
        "sglang": "0.5.1.post3",
        "model": {"path": "calibration", "tiny": True},
        "variants": {v: [] if v == night.baseline else ["p"] for v in variants},
        "baseline": night.baseline,
        "schedule": {"repeats": reps, "order": "interleaved"},
        "suites": {s: {} for s in suites},
        "compare": (compare or CompareSettings()).model_dump(mode="json"),
    }
    man = RunManifest(run_id=night.run_id, config=cfg)
    sums: dict[tuple[str, int, str], SuiteSummary] = {}
    for (v, s, m), vals in night.values.items():
        for k, x in enumerate(vals):
            got = sums.setdefault((v, k, s), SuiteSummary(suite=s, status="ok", metrics={}))
            if x is not None:
                got.metrics[m] = x
    cells = {
        (v, k): CellRecord(variant=v, repeat=k, status="ok") for v in variants for k in range(reps)
    }
    data = RunData(
        Path("/nonexistent-nightly") / night.run_id, man, night.baseline, variants,
        [], reps, suites, cells, sums,
    )  # fmt: skip
    add_comparison(night, build_comparison(data, compare, suites={s: _SUITES[s] for s in suites}))
    return night


def needed_repeats(settings: NightlySettings, cv: float, drift: float = 0.0) -> int | None:
    """The repeats the nightly computes for itself (:func:`patchbench.nightly.repeats.plan_repeats`,
    uncapped) at run noise ``cv`` and night-to-night ``drift`` (log sigmas), learned from many
    nights; None: no affordable number."""
    from patchbench.nightly.repeats import plan_repeats

    rep = 5.0
    noises = {
        m: Noise(
            *m,
            Scale(cv, 200.0, 0),
            Scale(math.hypot(drift, cv / math.sqrt(rep)), 200.0, 0),
            drift,
            rep,
            30,
            "learned",
        )  # fmt: skip
        for m in gate_metrics(settings)
    }
    uncapped = settings.model_copy(update={"max_repeats": 100})
    plan = plan_repeats(
        uncapped, [], [BASELINE, VARIANT], BASELINE, BETTER_OF, noises=noises, family=FAMILY
    )
    return plan.needed


def _sim_history(
    metrics: list, cv: float, seed: int, repeats: int, drift: float, nights: int, sc: Scenario
) -> list:
    """``nights`` simulated nights (:func:`sim_night`) of ``repeats`` runs, from ``seed``."""
    rng = np.random.default_rng(seed)
    return [sim_night(i, rng, metrics, repeats, cv, drift, sc) for i in range(nights)]


def computed_repeats(
    settings: NightlySettings,
    cv: float,
    seed: int,
    repeats: int,
    *,
    abnormal: float = 0.0,
    drift: float = 0.0,
    nights: int = 30,
    margin: float = 1.0,
) -> int | None:
    """The repeats the nightly computes for itself in a scenario: a ``nights``-night history at
    ``repeats`` runs a night is simulated, each gated metric's noise learned from it
    (:func:`patchbench.nightly.noise.learn`; abnormal runs inflate it a little), and
    :func:`needed_repeats` taken at the largest run noise (and night noise) times ``margin``.
    None when no count up to 64 reaches the targets."""
    from patchbench.nightly.noise import learn

    metrics = gate_metrics(settings)
    hist = _sim_history(metrics, cv, seed, repeats, drift, nights, Scenario(abnormal=abnormal))
    got = [x for x in (learn(hist, s, m, min_nights=2) for s, m in metrics) if x is not None]
    run = max(x.run.sigma for x in got)
    night = max((x.night_sigma for x in got if math.isfinite(x.night_sigma)), default=0.0)
    return needed_repeats(settings, run * margin, night * margin)


def auto_repeats(
    settings: NightlySettings,
    cv: float,
    seed: int,
    repeats: int,
    *,
    drift: float = 0.0,
    nights: int = 30,
):
    """What ``schedule.repeats: auto`` runs after ``nights`` simulated nights of a scenario at
    ``repeats`` runs a night: :func:`patchbench.nightly.repeats.plan_repeats` on that history
    (the job's own choice, capped at ``max_repeats``; a history gate that drift alone makes
    blind does not raise it). Returns the :class:`patchbench.nightly.repeats.RepeatsPlan`."""
    from patchbench.nightly.repeats import plan_repeats

    metrics = gate_metrics(settings)
    hist = _sim_history(metrics, cv, seed, repeats, drift, nights, Scenario())
    better = {(s, m): BETTER.get(m, "lower") for s, m in metrics}
    return plan_repeats(settings, hist, [BASELINE, VARIANT], BASELINE, better, family=FAMILY)


@dataclass
class GateRates:
    """One calibration row: ``green`` / ``underpowered``: shares of quiet nights;
    ``false_red_per_30``: red quiet nights per 30; ``patch_within`` / ``stock_within``: share of
    histories with a red night within ``horizon`` nights of a 5 % patch / stock step;
    ``nights``: quiet nights gated."""

    green: float
    underpowered: float
    false_red_per_30: float
    patch_within: float
    stock_within: float
    nights: int


def _first_red(
    hist: list[Night], settings: NightlySettings, make, horizon: int, start: int
) -> bool:
    h = list(hist)
    for k in range(horizon):
        t = make(start + k)
        if night_outcome(evaluate(h, with_report(t), settings)) == "red":
            return True
        h.append(t)
    return False


def gate_rates(
    settings: NightlySettings,
    repeats: int,
    cv: float,
    trials: int,
    seed: int,
    *,
    drift: float = 0.0,
    abnormal: float = 0.0,
    warm: int = 14,
    quiet: int = 3,
    horizon: int = 3,
    step: float = 0.05,
    steps: bool = True,
    dist: str = "normal",
) -> GateRates:
    """Simulate ``trials`` histories (module docstring) and gate them; seeded, deterministic.
    ``steps=False``: the quiet nights only (``patch_within`` / ``stock_within`` are NaN); the
    quiet nights are the same as with the steps (their own generator); ``dist``: the run
    noise's distribution (:func:`sim_night`)."""
    metrics = gate_metrics(settings)
    base = Scenario(abnormal=abnormal)
    green = under = red = nights = 0
    patch = stock = 0
    for trial in range(trials):
        # one generator per trial and part: a rule that turns a night red earlier (and so draws
        # fewer nights) leaves every other trial's nights unchanged, so rules compare paired
        rngs = [np.random.default_rng([seed, trial, part]) for part in range(3)]

        def mk(i: int, sc: Scenario = base, part: int = 0, rngs: list = rngs) -> Night:
            return sim_night(i, rngs[part], metrics, repeats, cv, drift, sc, dist=dist)

        hist = [mk(i) for i in range(warm)]
        for i in range(warm, warm + quiet):
            t = with_report(mk(i))
            out = night_outcome(evaluate(hist, t, settings))
            green += out == "green"
            under += out == "underpowered"
            red += out == "red"
            nights += 1
            hist.append(t)
        if not steps:
            continue
        s0 = warm + quiet
        ps = Scenario(patch=step, abnormal=abnormal)
        ss = Scenario(stock=step, abnormal=abnormal)
        patch += _first_red(hist, settings, lambda i, sc=ps: mk(i, sc, 1), horizon, s0)
        stock += _first_red(hist, settings, lambda i, sc=ss: mk(i, sc, 2), horizon, s0)
    return GateRates(
        green / nights,
        under / nights,
        30.0 * red / nights,
        patch / trials if steps else math.nan,
        stock / trials if steps else math.nan,
        nights,
    )


def pool_rates(
    settings: NightlySettings,
    repeats: int,
    cv: float,
    trials: int,
    seed: int,
    *,
    pick: str = "alternate",
    identity: bool = True,
    slow: float = 0.08,
    quiet: int = 10,
    horizon: int = 3,
    step: float = 0.05,
) -> GateRates:
    """A runner pool of two machines, B ``slow`` slower than A, ``pick``: "alternate" (A, B,
    A, ...) or "random" (either, evenly, each night). Each trial warms up until each machine
    has ``learn_min_nights`` + 1 nights, gates ``quiet`` quiet nights, then (from the warmed
    history) a ``step`` stock step on every machine: red within ``horizon`` nights of the
    machine that ran the first night after it (a red on the other machine in between counts).
    ``identity=False``: every night's machine unknown (None), as before nights were told
    apart. ``patch_within`` is NaN."""
    metrics = gate_metrics(settings)
    green = under = red = nights = stock = 0
    for trial in range(trials):
        rng = np.random.default_rng([seed, trial])
        walk = np.random.default_rng([seed, trial, 1])

        def mk(i: int, m: str, sc: Scenario = Scenario(), rng=rng) -> Night:
            return sim_night(i, rng, metrics, repeats, cv, 0.0, sc, slow=slow if m == "B" else 0.0,
                             machine=m if identity else None)  # fmt: skip

        def machine(i: int, walk=walk) -> str:
            return ("A", "B")[i % 2 if pick == "alternate" else int(walk.integers(2))]

        hist: list[Night] = []
        seen = {"A": 0, "B": 0}
        while min(seen.values()) <= settings.learn_min_nights:
            m = machine(len(hist))
            hist.append(mk(len(hist), m))
            seen[m] += 1
        for _ in range(quiet):
            t = with_report(mk(len(hist), machine(len(hist))))
            out = night_outcome(evaluate(hist, t, settings))
            green += out == "green"
            under += out == "underpowered"
            red += out == "red"
            nights += 1
            hist.append(t)
        first, on_first = None, 0
        for i in range(len(hist), len(hist) + 8 * horizon):
            m = machine(i)
            first = first or m
            t = with_report(mk(i, m, Scenario(stock=step)))
            if night_outcome(evaluate(hist, t, settings)) == "red":
                stock += 1
                break
            on_first += m == first
            if on_first >= horizon:
                break
            hist.append(t)
    return GateRates(
        green / nights, under / nights, 30.0 * red / nights, math.nan, stock / trials, nights
    )


__all__ = [
    "pool_rates",
    "Scenario",
    "GateRates",
    "gate_rates",
    "sim_night",
    "gate_metrics",
    "needed_repeats",
    "with_report",
    "computed_repeats",
    "auto_repeats",
    "change_rates",
]


# ---------------------------------------------------------------------------------------------
# change points (patchbench/nightly/changepoints.py)


@dataclass
class ChangeRates:
    """One change-point row: ``flags_per_quarter``: distinct flags raised on quiet histories per
    90 nights, the detector run every night over the whole history so far (a flag within 3
    nights of an earlier one is the same flag); ``any_flag``: the share of quiet quarters with
    at least one; ``detected``: the share of declining histories flagged within ``horizon``
    nights; ``delay_median`` / ``delay_p90``: nights from the decline's start to its first flag
    (a history never flagged counts as ``horizon + 1``)."""

    flags_per_quarter: float
    any_flag: float
    detected: float
    delay_median: float
    delay_p90: float


def _levels(rng: np.random.Generator, n: int, cv: float, repeats: int, drift: float) -> np.ndarray:
    """Nightly levels (mean log value of ``repeats`` runs) of a quiet history of n nights."""
    return rng.normal(0.0, math.sqrt(drift**2 + cv**2 / repeats), n)


def change_rates(
    cv: float,
    repeats: int,
    trials: int,
    seed: int,
    *,
    beta: float | None = None,
    drift: float = 0.0,
    decline: float = 0.003,
    start: int = 30,
    horizon: int = 45,
    quarter: int = 90,
) -> ChangeRates:
    """Quiet quarters and histories that decline by ``decline`` (log) a night from night
    ``start`` on, the detector (:func:`patchbench.nightly.changepoints.changes`) run as the nightly runs
    it: every night, over every night so far, sigma learned from the series."""
    from patchbench.nightly import changepoints as cp

    b = cp.BETA if beta is None else beta
    rng = np.random.default_rng(seed)
    flags: list[int] = []
    delays: list[int] = []
    for _ in range(trials):
        x = _levels(rng, quarter, cv, repeats, drift)
        seen: list[int] = []
        for t in range(cp.MIN_NIGHTS, quarter + 1):
            for k in cp.breakpoints(x[:t], cp.series_sigma(x[:t]), b):
                if not any(abs(k - s) <= 3 for s in seen):
                    seen.append(k)
        flags.append(len(seen))
        y = _levels(rng, start + horizon, cv, repeats, drift)
        y[start:] -= decline * np.arange(1, horizon + 1)
        delay = horizon + 1
        for t in range(start + 1, start + horizon + 1):
            ch = cp.changes(y[:t], cp.series_sigma(y[:t]), b)
            if any(c.after < c.before and c.end >= start - 2 for c in ch):
                delay = t - start
                break
        delays.append(delay)
    f, d = np.asarray(flags), np.asarray(delays)
    return ChangeRates(
        float(f.mean()),
        float((f > 0).mean()),
        float((d <= horizon).mean()),
        float(np.median(d)),
        float(np.percentile(d, 90)),
    )
