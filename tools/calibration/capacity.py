"""The calibration's capacity model: false calls and power of the paired capacity verdict.

A trial is one baseline and one variant over interleaved rounds; every cell runs the real search
(:func:`patchbench.suites.serving.capsearch.search`, the config's ``serving.capacity``, each arm
starting from its previous round's bracket) on a synthetic attainment curve, and the run is
judged by the comparison code itself (:func:`patchbench.analysis.build.build_comparison` on
in-memory run data with the serving suite's real declarations and the config's schedule).

Noise model of one cell (the arm's true capacity C, C x (1 + effect) for the variant):

- run noise: the cell's capacity is C x exp(N(0, ``cv``));
- a per-cell shock shared by every probe of the cell: N(0, ``shock``) added to the logit of the
  attainment at every load;
- the curve: smooth, logit(score(c)) = logit(target) - ln(c / C_cell) / ``width`` + shock, or,
  when the scenario has a ``cliff`` (a property of the server, so of every cell of the trial),
  a cliff: score 0.999 up to C_cell (shock ignored) and 0.3 above;
- each probe's score is the share of ``num_prompts(c)`` requests meeting the SLO: binomial
  sampling noise of the probe's own requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from patchbench.analysis import build as analysis
from patchbench.analysis.comparison import CompareSettings
from patchbench.analysis.rundata import RunData
from patchbench.suites.serving.capacity import CAPACITY
from patchbench.suites.serving.capsearch import Capacity
from tools.calibration.sweep import serving_run_data

BASE, VAR = "baseline", "patched"


@dataclass(frozen=True)
class Noise:
    """The noise model (module docstring): run CV of the capacity, per-cell logit shock, curve
    width (log-load per logit unit), whether every curve is a cliff."""

    cv: float = 0.03
    shock: float = 0.3
    width: float = 0.1
    cliff: bool = False


class _Serving:
    """The serving suite's declarations, no pair hook (no probe files in memory)."""

    def __init__(self):
        from patchbench.suite import get_suite

        real = get_suite("serving")
        self.name, self.Params, self.metrics = "serving", real.Params, dict(real.metrics)
        self.declarations = real.declarations

    def pair(self, baseline_dirs, variant_dirs, params):
        return None


def cell_capacity(
    rng: np.random.Generator,
    cap: Capacity,
    true_c: float,
    noise: Noise,
    prior: tuple[float | None, float | None] | None,
    dither: float = 0.0,
):
    """One cell's search on a synthetic curve drawn from ``noise`` (the module docstring);
    :class:`patchbench.suites.serving.capsearch.Search`."""
    c_cell = true_c * math.exp(rng.normal(0.0, noise.cv))
    shock = rng.normal(0.0, noise.shock)
    t = cap.slo.target
    base = math.log(t / (1 - t)) if t < 1 else 10.0

    def attain(c: float) -> float:
        if noise.cliff:
            p = 0.999 if c <= c_cell else 0.3
        else:
            p = 1.0 / (1.0 + math.exp(-(base - math.log(c / c_cell) / noise.width + shock)))
        n = cap.num_prompts(c)
        return float(rng.binomial(n, p)) / n

    return cap.search(attain, prior=prior, dither=dither)


def run_data(
    values: dict[tuple[str, int], float | str], repeats: int, cap: dict, schedule
) -> RunData:
    """In-memory run data of a capacity run: ``values[(arm, k)]`` is the cell's capacity, or a
    string: the reason it was withheld (``meta.not_judged``, e.g. ">= 256"). ``cap``: the
    ``serving.capacity`` mapping; ``schedule``: ``schedule.repeats`` (a count or a sequential
    mapping)."""

    def cell(v: str, k: int) -> tuple[dict, dict]:
        x = values[(v, k)]
        if isinstance(x, str):
            return {}, {"not_judged": {CAPACITY: x}}
        return {CAPACITY: float(x)}, {}

    return serving_run_data("capacity", {"capacity": cap}, repeats, schedule, cell)


@dataclass
class CapRow:
    """One design's counts over ``trials``: false calls (no effect), improved (the effect),
    rounds run and probes per cell (summed), cells withheld (beyond or never)."""

    design: str
    trials: int
    false_calls: int = 0
    improved: int = 0
    rounds: int = 0
    probes: int = 0
    cells: int = 0


def capacity_row(
    cap: Capacity, schedule, true_c: float, effect: float, noise: Noise, trials: int, seed: int
) -> CapRow:
    """``trials`` seeded trials of each scenario (no effect, ``effect``) under ``schedule`` (a
    fixed count or a sequential ``schedule.repeats`` mapping: its ``max`` rounds drawn, the
    runner's stopping rule replayed by the comparison)."""
    repeats = int(schedule["max"]) if isinstance(schedule, dict) else int(schedule)
    design = (
        f"sequential {schedule['min']}..{schedule['max']} ({schedule['boundary']})"
        if isinstance(schedule, dict)
        else f"fixed {schedule}"
    )
    rng = np.random.default_rng(seed)
    out = CapRow(design, trials)
    settings, suites = CompareSettings(), {"serving": _Serving()}
    capd = cap.model_dump()
    for _ in range(trials):
        for eff in (0.0, effect):
            values: dict[tuple[str, int], float | str] = {}
            prior: dict[str, tuple | None] = {BASE: None, VAR: None}
            for k in range(repeats):
                dither = float(rng.uniform(-1.0, 1.0))  # the round's, both arms (as round_dither)
                for v, c in ((BASE, true_c), (VAR, true_c * (1 + eff))):
                    s = cell_capacity(rng, cap, c, noise, prior[v], dither)
                    if s.lo is not None or s.hi is not None:
                        prior[v] = (s.lo, s.hi)
                    out.probes += len(s.probes) * (eff == 0.0)
                    out.cells += eff == 0.0
                    values[(v, k)] = s.value if s.value is not None else s.answer
            cmp = analysis.build_comparison(
                run_data(values, repeats, capd, schedule), settings, suites=suites
            )
            row = cmp.row("serving", CAPACITY, VAR)
            verdict = row.verdict if row is not None else None
            if eff == 0.0:
                out.false_calls += verdict in ("improved", "regressed")
                out.rounds += cmp.design.stopped_after or repeats
            else:
                out.improved += verdict == "improved"
    return out
