"""The verdict rules of one metric of one variant (equivalent: TOST, Schuirmann 1987). By kind:
``run`` rows pair repeat k of each arm (paired t on log ratios, Student 1908); ``accuracy`` rows
pair the questions with a t interval that adds the pooled cell-to-cell shift
(:func:`patchbench.stats.paired_items_t`; Newcombe 1998 method 10 when fewer than
:data:`MIN_DISCORDANT` questions differ); ``deterministic`` rows are compared exactly;
``descriptive`` rows are never judged. Multiplicity: :mod:`patchbench.analysis.family`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from patchbench import stats

Verdict = Literal["improved", "regressed", "equivalent", "inconclusive", "incomplete"]
VERDICTS: tuple[str, ...] = ("improved", "regressed", "equivalent", "inconclusive", "incomplete")

#: the sources every method names (shown in the report's methods section)
METHOD_SOURCES = {
    "paired t on log ratios": "Student (1908); paired repeats of an interleaved schedule",
    "TOST": "Schuirmann (1987), two one-sided tests; statsmodels.stats.weightstats.ttost_paired",
    "Holm": "Holm (1979), step-down; statsmodels.stats.multitest.multipletests(method='holm')",
    "Newcombe paired": "Newcombe (1998) Stat Med 17:2635-2650, method 10 (hybrid score, paired)",
    "paired t on per-question differences": "the question as the unit, plus the variance of a "
    "cell's accuracy shift pooled over every arm's repeats (ANOVA estimator, Searle, Casella & "
    "McCulloch 1992, 4.7); Satterthwaite (1946) degrees of freedom",
    "Wilson": "Wilson (1927) score interval",
    "Welch": "Welch (1947) unpaired t on per-run log values",
    "exact": "deterministic values compared exactly (no sampling error); a value that is only "
    "a bound gives the interval of differences the bounds allow (interval arithmetic, Moore 1966)",
}


@dataclass
class Test:
    """One metric's test before multiplicity: two-sided ``p`` of "no change" (None: not
    testable), ``interval(alpha)`` -> (low, high) at level 1 - alpha in fractions (0.05 = +5 %,
    or accuracy points / 100), ``scale``: "ratio" (variant/baseline - 1) or "diff"."""

    estimate: float | None
    p: float | None
    interval: object = None  # Callable[[float], tuple[float, float]]
    method: str = ""
    scale: Literal["ratio", "diff"] = "ratio"
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    #: why the test may never decide (improved / regressed / equivalent), None: it may; such a
    #: row is inconclusive and outside the family (:func:`accuracy_rule`)
    undecided: str | None = None


# ---------------------------------------------------------------- run-level (paired repeats)


def run_test(baseline: Sequence[float], variant: Sequence[float], min_repeats: int) -> Test:
    """Paired t test on the log ratios of repeat k of each arm (:func:`patchbench.stats.paired_t`);
    fewer than ``min_repeats`` pairs: p None and the reason."""
    n = len(baseline)
    if n < min_repeats:
        what = (
            "1 repeat: one run cannot"
            if n == 1
            else f"{n} paired repeats: fewer than compare.min_repeats = {min_repeats} cannot"
        )
        est = None
        if n:
            try:
                est = float(np.expm1(np.mean(stats.log_ratios(baseline, variant))))
            except ValueError:
                est = None
        return Test(
            est,
            None,
            None,
            "paired t on log ratios",
            reason=(
                f"{what} separate the patch from run-to-run noise" if n else "no paired repeats"
            ),
        )
    t = stats.paired_t(stats.log_ratios(baseline, variant))

    def interval(alpha: float, _t=t) -> tuple[float, float]:
        lo, hi = _t.interval(alpha)
        return float(np.expm1(lo)), float(np.expm1(hi))

    return Test(float(np.expm1(t.mean)), t.p_value(), interval, f"paired t on log ratios (n={n})")


def tost_log_ratio(
    baseline: Sequence[float], variant: Sequence[float], margin_pct: float, alpha: float
) -> tuple[float, bool]:
    """TOST of "variant/baseline within [1/(1+m), 1+m]" on paired log ratios; (p, equivalent at
    ``alpha``)."""
    bound = math.log1p(margin_pct / 100.0)
    p = stats.tost_p(stats.paired_t(stats.log_ratios(baseline, variant)), -bound, bound)
    return p, p < alpha


# ---------------------------------------------------------------- accuracy (paired items)


#: fewer questions whose correctness differs between the arms than this: the t approximation of
#: a mean of mostly-zero differences is poor, Newcombe's interval is used
MIN_DISCORDANT = 10

#: runs per arm an accuracy row needs to decide: with one, the shift of a whole run's accuracy
#: (server to server) is not estimated and the interval does not cover it (docs/mmmu.md: 85 %
#: coverage at 900 questions and a 0.5-point shift; no-effect rows called changed in 15 %)
MIN_ACCURACY_RUNS = 2
#: the assumed sd of a run's accuracy shift, in accuracy points (docs/mmmu.md: the 0.5-point
#: cell sd the PR config was calibrated at; not measured on a GPU)
ASSUMED_RUN_SD_PT = 0.5
#: the power :func:`accuracy_rule`'s rounds aim at
ACCURACY_ROUNDS_POWER = 0.8


def accuracy_rule(
    runs: tuple[int, int], item_se: float, margin_pt: float | None, alpha: float
) -> str | None:
    """The one rule of whether an accuracy row may decide: None with at least
    :data:`MIN_ACCURACY_RUNS` runs in each arm (``runs``: baseline, variant), else what it
    cannot separate and the rounds that would.

    Two runs' shifts differ by ``N(0, 2 run_sd^2)``: about ``+-z sqrt(2) run_sd`` points at
    level ``alpha`` (z the two-sided normal quantile). One round pair's accuracy difference has
    variance ``item_se^2 + 2 run_sd^2`` (``item_se``: the questions' standard error of the
    difference in one run per arm, a fraction; the model of docs/mmmu.md), so R rounds are a
    paired test of R round differences: R from :func:`patchbench.analysis.power.n_needed` (the
    paired t's power, Cohen 1988 ch. 2) for a change of ``margin_pt`` (else 2 points) at
    ``alpha`` with power :data:`ACCURACY_ROUNDS_POWER`, at least :data:`MIN_ACCURACY_RUNS`."""
    if min(runs) >= MIN_ACCURACY_RUNS:
        return None
    from scipy.stats import norm

    from patchbench.analysis import power

    run_sd_pt = ASSUMED_RUN_SD_PT
    sd_run = run_sd_pt / 100.0
    spread = 100.0 * float(norm.ppf(1 - alpha / 2)) * math.sqrt(2.0) * sd_run
    sd_round = math.sqrt(item_se**2 + 2.0 * sd_run**2)
    effect = (margin_pt if margin_pt else 2.0) / 100.0
    n = power.n_needed(effect, sd_round, alpha, ACCURACY_ROUNDS_POWER, floor=MIN_ACCURACY_RUNS)
    rounds = f"{max(n, MIN_ACCURACY_RUNS)} rounds would" if n else "many rounds would be needed"
    return (
        f"one run per arm cannot separate a change from server-to-server variation of about "
        f"±{spread:.1f} points; {rounds} (run sd {run_sd_pt:g} pt assumed, docs/mmmu.md; "
        f"{100 * ACCURACY_ROUNDS_POWER:g}% power for ±{effect * 100:g} pt)"
    )


def accuracy_test(
    baseline: Sequence[float],
    variant: Sequence[float],
    repeats: tuple[int, int] | None = None,
    cells: stats.CellVariance | None = None,
    *,
    margin_pt: float | None = None,
    alpha: float = 0.05,
) -> Test:
    """Paired test of per-question correctness in [0, 1], each averaged over its arm's
    ``repeats`` (None: one each), with the pooled cell-shift variance ``cells``; ``undecided``
    set by :func:`accuracy_rule` (``margin_pt``: the row's margin, points; ``alpha``: the
    report's level)."""
    test = _accuracy_test(baseline, variant, repeats, cells)
    if len(baseline) > 1:
        d = np.asarray(variant, float) - np.asarray(baseline, float)
        item_se = float(np.std(d, ddof=1) / math.sqrt(d.size))
        test.undecided = accuracy_rule(repeats or (1, 1), item_se, margin_pt, alpha)
    if test.undecided:
        test.notes.append(test.undecided)
    return test


def _accuracy_test(
    baseline: Sequence[float],
    variant: Sequence[float],
    repeats: tuple[int, int] | None,
    cells: stats.CellVariance | None,
) -> Test:
    if len(baseline) == 0:
        return Test(None, None, None, "Newcombe paired", "diff", reason="no paired questions")
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    r_b, r_v = repeats or (1, 1)
    if int(np.count_nonzero(v - b)) < MIN_DISCORDANT:
        return _newcombe(baseline, variant)
    t = stats.paired_items_t(b, v, r_b, r_v, cells)

    def interval(alpha: float, _t=t) -> tuple[float, float]:
        return _t.interval(alpha)

    if cells is not None and cells.sigma2 > 0:
        cell = f"cell sd {100 * math.sqrt(cells.sigma2):.2g} pt pooled over {cells.df_between} df"
    elif cells is not None:
        cell = f"cell variance estimated 0 over {cells.df_between} df"
    else:
        cell = "cell-level variance not covered (one repeat per arm)"
    test = Test(
        float(t.mean),
        t.p_value(),
        interval,
        f"paired t on per-question differences (n={b.size} questions, repeats "
        f"{r_b}/{r_v}; {cell}; df {t.df:.4g})",
        "diff",
    )
    if cells is None:
        test.notes.append(
            "one repeat per arm: the cell-to-cell variance of accuracy is not covered by the "
            "interval (run MMMU in two or more rounds to cover it)"
        )
    return test


def _newcombe(baseline: Sequence[float], variant: Sequence[float]) -> Test:
    """Newcombe's paired-proportion interval (the fallback of :func:`accuracy_test`)."""
    a, b, c, d = stats.paired_table(baseline, variant)

    def interval(alpha: float, _t=(a, b, c, d)) -> tuple[float, float]:
        _, lo, hi = stats.newcombe_paired(*_t, alpha)
        return lo, hi

    est = stats.newcombe_paired(a, b, c, d, 0.05)[0]
    return Test(
        est,
        stats.p_from_interval(interval),
        interval,
        f"Newcombe paired-proportion interval (n={len(baseline)} questions, "
        f"discordant {b:g} / {c:g}; fewer than {MIN_DISCORDANT} questions differ)",
        "diff",
    )


# ---------------------------------------------------------------- deterministic


Bound = Literal["lower", "upper"] | None


def bounded_difference(
    baseline: float, variant: float, baseline_bound: Bound = None, variant_bound: Bound = None
) -> tuple[float, float]:
    """(low, high) of the true ``variant - baseline`` when a value is only a "lower" / "upper"
    bound (None: exact), by interval arithmetic; unbounded sides are -inf / +inf."""
    v_min = variant if variant_bound in (None, "lower") else -math.inf
    v_max = variant if variant_bound in (None, "upper") else math.inf
    b_min = baseline if baseline_bound in (None, "lower") else -math.inf
    b_max = baseline if baseline_bound in (None, "upper") else math.inf
    return v_min - b_max, v_max - b_min


def deterministic_test(
    baseline: Sequence[float],
    variant: Sequence[float],
    baseline_bound: Bound = None,
    variant_bound: Bound = None,
) -> Test:
    """Exact comparison (every repeat of an arm must agree). With a bound, the interval is what
    :func:`bounded_difference` allows: p 0 when it excludes 0, else 1 with a reason."""
    if not baseline or not variant:
        return Test(None, None, None, "exact", "diff", reason="no values")
    if len(set(baseline)) > 1 or len(set(variant)) > 1:
        return Test(
            None,
            None,
            None,
            "exact",
            "diff",
            reason=f"values differ between repeats (baseline {sorted(set(baseline))}, "
            f"variant {sorted(set(variant))}): not deterministic",
        )
    b, v = float(baseline[0]), float(variant[0])
    diff = v - b
    if baseline_bound is None and variant_bound is None:
        return Test(diff, 0.0 if diff else 1.0, lambda alpha, _d=diff: (_d, _d), "exact", "diff")
    lo, hi = bounded_difference(b, v, baseline_bound, variant_bound)
    which = " and ".join(
        f"the {arm}'s value is {'at least' if bd == 'lower' else 'at most'} {x:g}"
        for arm, x, bd in (("baseline", b, baseline_bound), ("variant", v, variant_bound))
        if bd
    )
    certain = lo > 0 or hi < 0
    return Test(
        diff,
        0.0 if certain else 1.0,
        lambda alpha, _iv=(lo, hi): _iv,
        "exact",
        "diff",
        reason=None if certain else f"{which} (a bound): the direction of the change is unknown",
        notes=[f"bounded: {which}; the change lies in [{lo:g}, {hi:g}]"],
    )


# ---------------------------------------------------------------- multiplicity and verdicts


def holm_alphas(pvalues: Sequence[float], alpha: float) -> tuple[list[bool], list[float]]:
    """(reject, alpha used) per test by Holm's step-down: rank i uses alpha / (m - i) while every
    earlier test was rejected; from the first one not rejected on, the later ones keep its
    alpha."""
    steps = stats.holm(pvalues, alpha)
    stopped = min((level for rejected, level in steps if not rejected), default=alpha)
    return [r for r, _ in steps], [level if r else stopped for r, level in steps]


def margin_bounds(test: Test, margin: float) -> tuple[float, float]:
    """The equivalence region of a margin as fractions: [1/(1+m) - 1, m] for ratios (symmetric
    on the log scale), [-m, m] for differences."""
    m = margin / 100.0
    return (1 / (1 + m) - 1, m) if test.scale == "ratio" else (-m, m)


def verdict(
    test: Test, *, better: str, alpha: float, margin: float | None, equivalent: bool | None
) -> tuple[Verdict, tuple[float, float] | None, bool]:
    """(verdict, interval at 1 - alpha, within_margin) of one tested row; ``equivalent``: TOST's
    answer (None: none); ``margin`` in percent for ratios, points for accuracy."""
    if test.p is None or test.interval is None:
        return "inconclusive", None, False
    iv = test.interval(alpha)
    if test.undecided:  # e.g. one run per arm (accuracy_rule): shown, never decided
        return "inconclusive", iv, False
    within = False
    if margin is not None:
        lo_b, hi_b = margin_bounds(test, margin)
        within = lo_b < iv[0] and iv[1] < hi_b
    if stats.excludes_zero(iv) and test.p <= alpha and better in ("higher", "lower"):
        up = iv[0] > 0
        return ("improved" if up == (better == "higher") else "regressed"), iv, within
    if equivalent:
        return "equivalent", iv, True
    return "inconclusive", iv, within


def tost_from_interval(test: Test, margin: float, alpha: float) -> bool:
    """Equivalence at ``alpha``: the (1 - 2 alpha) interval lies inside :func:`margin_bounds`."""
    if test.interval is None:
        return False
    return stats.equivalent_by_interval(test.interval, *margin_bounds(test, margin), alpha)


def welch_log(
    a: Sequence[float], b: Sequence[float], alpha: float
) -> tuple[float, float, float, float]:
    """Welch's t on the log values for the ratio of the geometric means of ``b`` over ``a``:
    (change, low, high, p), fractions. ValueError with fewer than 2 values in an arm."""
    la, lb = np.log(np.asarray(a, float)), np.log(np.asarray(b, float))
    if la.size < 2 or lb.size < 2:
        raise ValueError("Welch needs at least 2 runs in each arm")
    t = stats.welch_t(lb, la)
    lo, hi = t.interval(alpha)
    return float(np.expm1(t.mean)), float(np.expm1(lo)), float(np.expm1(hi)), t.p_value()
