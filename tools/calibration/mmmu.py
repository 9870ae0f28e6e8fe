"""The MMMU accuracy interval by simulation: its width and coverage at 1, 2, 3 and 5 repeats.

Noise model (stated, not measured here): Q questions; a question is right in the baseline with
probability ``accuracy``; a cell (arm a, repeat r) answers it right with probability
``pi_q + c[a, r]`` (clipped to [0, 1]), ``pi_q = 1 - flip`` for a question the model gets right
and ``flip`` for one it gets wrong (``flip``: the share of questions whose correctness changes
between two runs of the same server, e.g. batch-dependent numerics of greedy decoding), and
``c[a, r] ~ N(0, cell_sd)`` a shift of the whole cell's accuracy. A variant adds ``effect`` to
every ``pi_q``. Arms: the baseline, an A/A copy and two patches (the PR config's four), every
arm with the same repeats; the interval is the comparison's own
(:func:`patchbench.analysis.verdicts.accuracy_test` with the cell variance pooled over the four arms,
:func:`patchbench.stats.cell_variance`), for patch-a against the baseline. Coverage: the share of
trials whose interval at 95 % holds the true difference (``effect``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from patchbench import stats
from patchbench.analysis import verdicts


@dataclass(frozen=True)
class MmmuModel:
    """The noise model of the module docstring (proportions: 0.005 = half a point)."""

    questions: int = 900
    accuracy: float = 0.45
    flip: float = 0.03
    cell_sd: float = 0.005


@dataclass
class MmmuRow:
    """Per repeat count: trials, mean full width of the 95 % interval (points), coverage of the
    true difference, and the share of no-effect trials called improved/regressed (at 0.05)."""

    repeats: int
    trials: int
    width_pt: float
    coverage: float
    false_calls: float


def _arm(rng, pi: np.ndarray, repeats: int, m: MmmuModel, effect: float) -> np.ndarray:
    c = rng.normal(0.0, m.cell_sd, (repeats, 1)) if m.cell_sd > 0 else np.zeros((repeats, 1))
    p = np.clip(pi[None, :] + effect + c, 0.0, 1.0)
    return (rng.random((repeats, pi.size)) < p).astype(float)


def simulate_row(
    m: MmmuModel, repeats: int, trials: int, seed: int = 0, effect: float = 0.0
) -> MmmuRow:
    """``trials`` seeded trials at ``repeats`` per arm (see the module docstring)."""
    widths, cover, calls = [], 0, 0
    for t in range(trials):
        rng = np.random.default_rng([seed, repeats, t])
        right = rng.random(m.questions) < m.accuracy
        pi = np.where(right, 1.0 - m.flip, m.flip)
        arms = {
            "baseline": _arm(rng, pi, repeats, m, 0.0),
            "aa": _arm(rng, pi, repeats, m, 0.0),
            "patch-a": _arm(rng, pi, repeats, m, effect),
            "patch-b": _arm(rng, pi, repeats, m, 0.0),
        }
        cells = stats.cell_variance(list(arms.values())) if repeats >= 2 else None
        test = verdicts.accuracy_test(
            arms["baseline"].mean(axis=0),
            arms["patch-a"].mean(axis=0),
            (repeats, repeats),
            cells,
        )
        lo, hi = test.interval(0.05)
        widths.append(hi - lo)
        cover += lo <= effect <= hi
        calls += test.p is not None and test.p < 0.05
    return MmmuRow(repeats, trials, 100 * float(np.mean(widths)), cover / trials, calls / trials)


def mmmu_table(m: MmmuModel, repeats=(1, 2, 3, 5), trials: int = 400, seed: int = 0) -> list[str]:
    """A markdown table of :func:`simulate_row` at each repeat count (no effect)."""
    lines = [
        f"MMMU interval at Q = {m.questions}, accuracy {m.accuracy:g}, flip rate "
        f"{100 * m.flip:g}%, cell sd {100 * m.cell_sd:g} pt; {trials} trials a row; "
        "4 arms (baseline, A/A, 2 patches), no effect:",
        "",
        "| repeats per arm | mean 95% width (pt) | half-width (pt) | coverage | false calls |",
        "|---|---|---|---|---|",
    ]
    for r in repeats:
        row = simulate_row(m, r, trials, seed)
        lines.append(
            f"| {r} | {row.width_pt:.2f} | ±{row.width_pt / 2:.2f} | "
            f"{100 * row.coverage:.1f}% | {100 * row.false_calls:.1f}% |"
        )
    return lines


__all__ = ["MmmuModel", "MmmuRow", "simulate_row", "mmmu_table"]
