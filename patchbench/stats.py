"""Statistical methods, one copy each: t tests, TOST, Holm, Wilson, Newcombe, variance components,
request bootstraps.

The rules that turn these into verdicts live elsewhere and only call this module:
:mod:`patchbench.analysis.verdicts` (a comparison's verdicts), :mod:`patchbench.nightly.gates` (nightly gates) and
:mod:`patchbench.analysis.sequential` (when a run with sequential repeats stops). What is here:

- t tests (:class:`TTest`: estimate, standard error, degrees of freedom; two- and one-sided
  p-values, two-sided intervals, one-sided bounds): :func:`paired_t` on paired differences
  (Student 1908; on :func:`log_ratios` for ratios), :func:`welch_t` (Welch 1947),
  :func:`prediction_t` (a new mean against K earlier means), :func:`trend_t` (the slope of a
  least-squares line: a drift across rounds);
- :func:`sd_interval`: the chi-square interval of a standard deviation;
- items paired across two arms with repeated cells (MMMU questions): :func:`cell_variance`
  (the variance of a cell's shift, ANOVA estimator of a two-way layout, pooled over arms) and
  :func:`paired_items_t` (the mean per-item difference with that component added,
  Satterthwaite's degrees of freedom);
- :func:`tost_p` / :func:`equivalent_by_interval`: equivalence by two one-sided tests
  (Schuirmann 1987), as a p-value or by its interval;
- :func:`holm`: Holm's (1979) step-down levels for a family of p-values;
- proportions: :func:`wilson_interval` (Wilson 1927), :func:`newcombe_paired` (Newcombe 1998,
  paired difference) with :func:`paired_table`, and :func:`p_from_interval` (a p-value by
  inverting a family of intervals);
- request-level intervals inside one cell, descriptive only (never a verdict or a gate), for the
  serving suite's pair hook: TTFT and E2E with :func:`paired_request_interval` (request i of the
  baseline pairs with request i of the variant, the prompts being the same under a fixed seed);
  ITL with :func:`block_bootstrap_interval` (the per-token gaps of one request are correlated, so
  whole requests are resampled; Kuensch 1989, "The jackknife and the bootstrap for general
  stationary observations", Ann. Statist. 17(3)); both return an :class:`Interval` of a relative
  change ``variant / baseline - 1`` (fractions: 0.10 = +10 %), estimated on the log scale.

Every method is checked in tests/analysis/test_stats.py against scipy / statsmodels called directly (or,
for Newcombe's interval, a published example).
Functions raise ``ValueError`` for inputs they cannot use (lengths that differ, non-positive
values where a log is taken, too few values). scipy is imported on first use: ``patchbench
bench`` imports this module long before it compares anything (patchbench/run/cell.py preloads
scipy.stats meanwhile).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np


class _ScipyStats:
    """``scipy.stats``, imported on first use (0.5 s)."""

    def __getattr__(self, name: str):
        from scipy import stats

        return getattr(stats, name)


sps = _ScipyStats()

_NORMAL = statistics.NormalDist()

Alternative = Literal["two-sided", "greater", "less"]

__all__ = [
    "TTest",
    "log_ratios",
    "paired_t",
    "welch_t",
    "prediction_t",
    "trend_t",
    "sd_interval",
    "CellVariance",
    "cell_variance",
    "pool_cell_variance",
    "paired_items_t",
    "tost_p",
    "equivalent_by_interval",
    "holm",
    "wilson_interval",
    "newcombe_paired",
    "paired_table",
    "p_from_interval",
    "excludes_zero",
    "Interval",
    "statistic_fn",
    "paired_request_interval",
    "block_bootstrap_interval",
]


# ---------------------------------------------------------------------------------------------
# t tests


def _stdtr(df: float, t: float) -> float:
    """Student t CDF at ``t`` (``scipy.special.stdtr``: what ``scipy.stats.t.cdf`` computes)."""
    from scipy import special

    return float(special.stdtr(df, t))


def _stdtrit(df: float, q: float) -> float:
    """Student t quantile at ``q`` (``scipy.special.stdtrit``: ``scipy.stats.t.ppf``)."""
    from scipy import special

    return float(special.stdtrit(df, q))


@dataclass(frozen=True)
class TTest:
    """The parts of a t test: ``mean`` the estimate (a mean difference; log scale for ratios),
    ``se`` its standard error, ``df`` the degrees of freedom, ``n`` the values it used, ``sd``
    the sample standard deviation of the paired differences (NaN for the unpaired tests).

    With ``se == 0`` the t statistic is infinite (or 0/0): the p-values, intervals and bounds
    below take their limits (the estimate is certain)."""

    mean: float
    se: float
    df: float
    n: int
    sd: float = math.nan

    def p_value(self, alternative: Alternative = "two-sided") -> float:
        """p-value of "no difference" (mean 0).

        "two-sided": ``2 P(T_df > |mean / se|)``; 1 when se == 0 and mean == 0, else 0 when
        se == 0. "greater" / "less": the one-sided ``P(T_df > t)`` / ``P(T_df < t)``; with se 0
        or not finite (infinite values), 0 when the mean lies on the tested side, else 1."""
        if alternative == "two-sided":
            if self.se == 0:
                return 1.0 if self.mean == 0 else 0.0
            return 2 * _stdtr(self.df, -abs(self.mean / self.se))
        side = 1 if alternative == "greater" else -1
        if self.se == 0.0 or not math.isfinite(self.se):
            return 0.0 if self.mean * side > 0 else 1.0
        return _stdtr(self.df, -side * self.mean / self.se)

    def interval(self, alpha: float) -> tuple[float, float]:
        """Two-sided ``1 - alpha`` interval ``mean -/+ t_{1 - alpha/2, df} se`` (the point when
        se == 0)."""
        q = 0.0 if self.se == 0 else _stdtrit(self.df, 1 - alpha / 2) * self.se
        return self.mean - q, self.mean + q

    def bound(self, alpha: float, side: int) -> float:
        """One-sided ``1 - alpha`` bound: the upper (``side`` +1) or lower (-1) end of
        ``mean + side t_{1 - alpha, df} se`` (the mean when se == 0)."""
        if self.se == 0.0:
            return self.mean
        return self.mean + side * _stdtrit(self.df, 1.0 - alpha) * self.se


def log_ratios(baseline: Sequence[float], variant: Sequence[float]) -> np.ndarray:
    """``d_k = ln(variant_k) - ln(baseline_k)`` for paired values k (shape (n,)).

    Raises ValueError when the lengths differ or a value is not > 0."""
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    if b.shape != v.shape:
        raise ValueError(f"paired values need equal lengths, got {b.size} and {v.size}")
    if np.any(b <= 0) or np.any(v <= 0):
        raise ValueError("log ratios need values > 0")
    return np.log(v) - np.log(b)


def paired_t(d: Sequence[float]) -> TTest:
    """Paired t test on the differences ``d`` of n pairs (Student 1908, "The probable error of a
    mean", Biometrika 6; e.g. Montgomery, "Design and Analysis of Experiments", 2.5.1): mean
    ``dbar``, ``sd`` (ddof 1), ``se = sd / sqrt(n)``, ``df = n - 1``. On :func:`log_ratios` it is
    the test of a geometric-mean ratio. The same as ``scipy.stats.ttest_1samp(d, 0)`` /
    ``ttest_rel``. Raises ValueError with fewer than 2 pairs."""
    x = np.asarray(d, dtype=float)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"a paired t test needs at least 2 pairs, got {x.size}")
    n = int(x.size)
    sd = float(np.std(x, ddof=1))
    return TTest(float(np.mean(x)), sd / math.sqrt(n), n - 1, n, sd)


def welch_t(x: Sequence[float], y: Sequence[float]) -> TTest:
    """Welch's unpaired t test of ``mean(x) - mean(y)`` with unequal variances (Welch 1947,
    "The generalization of Student's problem when several different population variances are
    involved", Biometrika 34): ``se = sqrt(s_x^2/n_x + s_y^2/n_y)`` and the Welch-Satterthwaite
    degrees of freedom (1 when se == 0, where they are 0/0 and unused). The same as
    ``scipy.stats.ttest_ind(x, y, equal_var=False)``. Raises ValueError with fewer than 2
    values in a sample."""
    a, b = np.asarray(x, float), np.asarray(y, float)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"Welch needs at least 2 values in each sample, got {a.size} and {b.size}")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va**2 / (a.size - 1)) + (vb**2 / (b.size - 1))) if se > 0 else 1.0
    return TTest(float(a.mean() - b.mean()), se, df, int(a.size + b.size))


def prediction_t(x: Sequence[float], means: Sequence[float]) -> TTest:
    """A new sample's mean against K earlier means (a prediction t test: is ``mean(x)`` a draw
    from the distribution the K means come from? e.g. Hahn & Meeker, "Statistical Intervals"
    (1991), 4.6): ``mean(x) - mean(means)`` with ``se = sd(means) sqrt(1 + 1/K)`` and K - 1
    degrees of freedom (the spread between the means, drift included, is the noise). Raises
    ValueError with no value in ``x`` or fewer than 2 means."""
    k = len(means)
    if len(x) < 1 or k < 2:
        raise ValueError(f"a prediction t test needs a value and 2 means, got {len(x)} and {k}")
    se = float(np.std(means, ddof=1) * math.sqrt(1.0 + 1.0 / k))
    return TTest(float(np.mean(x) - np.mean(means)), se, k - 1, len(x))


def trend_t(y: Sequence[float], x: Sequence[float] | None = None) -> TTest:
    """The least-squares slope of ``y`` on ``x`` (default ``0, 1, ..., n-1``: a value per round)
    with its t test: ``mean`` the slope (units of y per unit of x), ``se`` its standard error
    ``sqrt(s^2 / Sxx)`` with s^2 the residual variance on n - 2 degrees of freedom (e.g.
    Montgomery, Peck & Vining, "Introduction to Linear Regression Analysis", 2.3). The same slope,
    standard error and two-sided p-value as ``scipy.stats.linregress(x, y)``. Raises ValueError
    with fewer than 3 values, lengths that differ or x without spread."""
    yy = np.asarray(y, dtype=float)
    xx = np.arange(yy.size, dtype=float) if x is None else np.asarray(x, dtype=float)
    if yy.ndim != 1 or yy.size < 3 or xx.shape != yy.shape:
        raise ValueError(f"a trend needs at least 3 (x, y) pairs of equal length, got {yy.size}")
    sxx = float(((xx - xx.mean()) ** 2).sum())
    if sxx == 0:
        raise ValueError("a trend needs x values that differ")
    slope = float(((xx - xx.mean()) * (yy - yy.mean())).sum() / sxx)
    resid = yy - yy.mean() - slope * (xx - xx.mean())
    n = int(yy.size)
    s2 = float((resid**2).sum()) / (n - 2)
    return TTest(slope, math.sqrt(s2 / sxx), n - 2, n)


def sd_interval(sd: float, df: float, alpha: float = 0.05) -> tuple[float, float]:
    """Two-sided ``1 - alpha`` interval of a normal standard deviation from a sample standard
    deviation ``sd`` on ``df`` degrees of freedom: ``sd sqrt(df / chi2_{1-alpha/2, df})`` to
    ``sd sqrt(df / chi2_{alpha/2, df})`` (e.g. Hahn & Meeker, "Statistical Intervals" (1991),
    4.2). Raises ValueError for df < 1 or sd < 0."""
    if df < 1 or sd < 0:
        raise ValueError(f"an interval of a standard deviation needs df >= 1 and sd >= 0, got {df}")
    lo = sd * math.sqrt(df / float(sps.chi2.ppf(1 - alpha / 2, df)))
    hi = sd * math.sqrt(df / float(sps.chi2.ppf(alpha / 2, df)))
    return lo, hi


@dataclass(frozen=True)
class CellVariance:
    """The variance of a cell's shift (:func:`cell_variance`): ``sigma2`` the estimate, truncated
    at 0 (proportions squared: 2.5e-5 is a shift of 0.5 points of accuracy as a standard
    deviation); its parts for Satterthwaite's degrees of freedom: ``between`` and ``within`` the
    pooled mean squares of repeats and of the residual (``sigma2 = (between - within) / items``
    before truncation), on ``df_between`` and ``df_within`` degrees of freedom; ``items`` the
    number of items (per arm, averaged over the arms that carry information)."""

    sigma2: float
    between: float
    within: float
    df_between: int
    df_within: int
    items: float


def cell_variance(arms: Sequence[np.ndarray]) -> CellVariance | None:
    """The variance of a cell's shift, pooled over arms.

    arms: per arm a matrix ``y[r, q]`` (shape (R_a, Q_a): repeat r, item q; correctness 0/1 or any
    value). Model: ``y[a, r, q] = mu[a, q] + c[a, r] + e[a, r, q]`` with ``c`` a cell's shift
    (variance ``sigma_c^2``, the same in every arm) and ``e`` independent item noise. Per arm the
    two-way layout without interaction (repeats x items) gives the mean square of repeats
    ``MS_R = Q sum_r (ybar_r. - ybar..)^2 / (R - 1)`` and of the residual ``MS_E`` on
    (R - 1)(Q - 1) degrees of freedom; ``E[MS_R - MS_E] = Q sigma_c^2`` (the ANOVA estimator of a
    balanced two-way crossed classification: Searle, Casella & McCulloch, "Variance Components"
    (1992), 4.7). The arms' estimates ``(MS_R - MS_E) / Q`` are pooled with weights ``R_a - 1``
    (``df_between = sum (R_a - 1)``), and the result truncated at 0. ``MS_R - MS_E`` equals
    ``Q^2 / (Q - 1)`` times the between-repeat variance of the cell means minus its within-item
    part (the mean over items of the across-repeat variance of y, over Q). Arms with one repeat
    carry no information; None when no arm has two repeats. Raises ValueError for a matrix that is
    not 2-D or has fewer than 2 items."""
    parts = []
    for y in arms:
        y = np.asarray(y, dtype=float)
        if y.ndim != 2 or y.shape[1] < 2:
            raise ValueError(f"a cell-variance arm needs a (repeats, items) matrix, got {y.shape}")
        r, q = y.shape
        if r < 2:
            continue
        rows, cols, grand = y.mean(axis=1), y.mean(axis=0), y.mean()
        ms_r = q * float(((rows - grand) ** 2).sum()) / (r - 1)
        resid = y - rows[:, None] - cols[None, :] + grand
        ms_e = float((resid**2).sum()) / ((r - 1) * (q - 1))
        parts.append(
            CellVariance(max(0.0, (ms_r - ms_e) / q), ms_r, ms_e, r - 1, (r - 1) * (q - 1), q)
        )
    return pool_cell_variance(parts)


def pool_cell_variance(parts: Sequence[CellVariance | None]) -> CellVariance | None:
    """Pool per-arm :class:`CellVariance` estimates (each from :func:`cell_variance` of one arm;
    None entries are skipped): mean squares weighted by their degrees of freedom, items weighted
    by ``df_between``, ``sigma2 = (between - within) / items`` truncated at 0 (the pooling of
    :func:`cell_variance`). None when no part carries information."""
    parts = [x for x in parts if x is not None and x.df_between > 0]
    if not parts:
        return None
    df_b = sum(x.df_between for x in parts)
    df_w = sum(x.df_within for x in parts)
    between = sum(x.between * x.df_between for x in parts) / df_b
    within = sum(x.within * x.df_within for x in parts) / df_w if df_w else 0.0
    items = sum(x.items * x.df_between for x in parts) / df_b
    return CellVariance(max(0.0, (between - within) / items), between, within, df_b, df_w, items)


def paired_items_t(
    baseline: Sequence[float],
    variant: Sequence[float],
    repeats_baseline: int,
    repeats_variant: int,
    cells: CellVariance | None,
) -> TTest:
    """Mean per-item difference of two arms with repeated cells, the item as the unit.

    baseline / variant: each item's mean over its arm's repeats (shape (Q,), aligned);
    repeats_*: the repeats behind those means; cells: the cell-shift variance
    (:func:`cell_variance`; None: not estimable, e.g. one repeat per arm, and then not covered).
    ``D = mean_q d_q`` with ``d_q = variant_q - baseline_q``;
    ``Var(D) = s_d^2 / Q + sigma_c^2 (1/R_v + 1/R_b)`` (``s_d`` the sample sd of ``d_q``: the
    item-level noise; the second term: the cell shifts, common to every item of a cell, do not
    appear in ``s_d`` but move D). Degrees of freedom by Satterthwaite (1946, "An approximate
    distribution of estimates of variance components", Biometrics Bulletin 2; Welch 1947) over
    ``s_d^2 / Q`` (Q - 1 df) and the mean squares of :class:`CellVariance`; Q - 1 when sigma_c^2
    is 0 or absent. With one repeat per arm and no cell component this is the paired t test of the
    items (:func:`paired_t`). Raises ValueError for fewer than 2 items, lengths that differ or a
    repeat count below 1."""
    b, v = np.asarray(baseline, dtype=float), np.asarray(variant, dtype=float)
    if b.shape != v.shape:
        raise ValueError(f"paired items need equal lengths, got {b.size} and {v.size}")
    if repeats_baseline < 1 or repeats_variant < 1:
        raise ValueError("each arm needs at least one repeat")
    t = paired_t(v - b)
    q = t.n
    item_var = t.se**2
    if cells is None or cells.sigma2 <= 0:
        return t
    k = 1.0 / repeats_variant + 1.0 / repeats_baseline
    cell_var = k * cells.sigma2
    var = item_var + cell_var
    parts = [(item_var, q - 1)]
    parts += [(k * cells.between / cells.items, cells.df_between)]
    parts += [(k * cells.within / cells.items, cells.df_within)]
    denom = sum(x * x / d for x, d in parts if d > 0)
    df = var * var / denom if denom > 0 else float(q - 1)
    return TTest(t.mean, math.sqrt(var), df, q, t.sd)


def tost_p(t: TTest, low: float, high: float) -> float:
    """Two one-sided tests of equivalence, ``low < true mean < high`` (Schuirmann 1987, "A
    comparison of the two one-sided tests procedure and the power approach for assessing the
    equivalence of average bioavailability", J Pharmacokinet Biopharm 15): the larger of the
    one-sided p-values of ``mean <= low`` and ``mean >= high``, as
    ``statsmodels.stats.weightstats.ttost_paired`` reports it; equivalence at level alpha when
    it is below alpha (the ``1 - 2 alpha`` interval lies inside (low, high)). With se == 0: 0
    when the mean lies inside, else 1."""
    if t.se == 0:
        return 0.0 if low < t.mean < high else 1.0
    p_low = _stdtr(t.df, -((t.mean - low) / t.se))
    p_high = _stdtr(t.df, (t.mean - high) / t.se)
    return max(p_low, p_high)


def equivalent_by_interval(
    interval: Callable[[float], tuple[float, float]], low: float, high: float, alpha: float
) -> bool:
    """TOST in its interval form: equivalence within (low, high) at level ``alpha`` when the
    ``1 - 2 alpha`` interval ``interval(2 alpha)`` lies inside (Schuirmann 1987; Berger & Hsu
    1996, "Bioequivalence trials, intersection-union tests and equivalence confidence sets",
    Statist. Sci. 11). For a t test it agrees with :func:`tost_p` below ``alpha``; it also
    serves intervals that have no t statistic (Newcombe's)."""
    lo, hi = interval(2 * alpha)
    return low < lo and hi < high


# ---------------------------------------------------------------------------------------------
# multiplicity


def holm(p_values: Sequence[float], alpha: float) -> list[tuple[bool, float]]:
    """Holm's step-down procedure (Holm 1979, "A simple sequentially rejective multiple test
    procedure", Scand J Statist 6): (rejected, level) per p-value, in input order.

    The i-th smallest p-value (0-based) is compared with its level ``alpha / (m - i)``; rejection
    stops at the first p-value above its level (every later one is kept). ``rejected`` equals
    ``statsmodels.stats.multitest.multipletests(p, alpha, method="holm")[0]``."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out: list[tuple[bool, float]] = [(False, 0.0)] * m
    going = True
    for rank, i in enumerate(order):
        level = alpha / (m - rank)
        going = going and bool(p_values[i] <= level)
        out[i] = (going, level)
    return out


# ---------------------------------------------------------------------------------------------
# proportions


def wilson_interval(successes: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (Wilson 1927, "Probable
    inference, the law of succession, and statistical inference", JASA 22).

    ``(p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``z`` the normal quantile
    (``statistics.NormalDist``: the same value as ``scipy.stats.norm.ppf``; equal to statsmodels'
    ``proportion_confint(method="wilson")``). ``successes`` may be fractional (correctness
    averaged over repeats). Returns (low, high) as fractions; ValueError when n <= 0 or
    successes is outside 0..n.
    """
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got {successes}/{n}")
    z = _NORMAL.inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    den = 1 + z * z / n
    c = (p + z * z / (2 * n)) / den
    h = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / den
    return max(0.0, c - h), min(1.0, c + h)


def newcombe_paired(
    a: float, b: float, c: float, d: float, alpha: float
) -> tuple[float, float, float]:
    """Interval of ``p2 - p1`` for a paired 2x2 table: Newcombe (1998), "Improved confidence
    intervals for the difference between binomial proportions based on paired data", Stat Med
    17:2635-2650, method 10 (hybrid score: Wilson intervals of each margin, combined with the
    phi correlation of the table).

    a: both right, b: baseline right / variant wrong, c: baseline wrong / variant right,
    d: both wrong (counts, may be fractional). p1 = (a+b)/n (baseline), p2 = (a+c)/n (variant).
    Returns (estimate, low, high) of p2 - p1 at level 1 - alpha, in proportions. Never
    zero-width (the Wilson intervals never are). Raises ValueError when n = 0.
    """
    n = a + b + c + d
    if n <= 0:
        raise ValueError("no paired items")
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, 1 - alpha)
    l2, u2 = wilson_interval(a + c, n, 1 - alpha)
    r1, r2, c1, c2 = a + b, c + d, a + c, b + d
    if min(r1, r2, c1, c2) <= 0:
        phi = 0.0
    else:
        num = a * d - b * c
        num = num - n / 2 if num > n / 2 else (num if num < 0 else 0.0)
        phi = num / math.sqrt(r1 * r2 * c1 * c2)
    # difference as p1 - p2 (Newcombe's orientation), then flip to variant - baseline
    est = p1 - p2
    lo = est - math.sqrt(
        max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0)
    )
    hi = est + math.sqrt(
        max((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2, 0.0)
    )
    return -est, -hi, -lo


def paired_table(
    baseline: Sequence[float], variant: Sequence[float]
) -> tuple[float, float, float, float]:
    """2x2 cells (a, b, c, d) of :func:`newcombe_paired` from per-item correctness in [0, 1]
    (e.g. averaged over repeats): a = sum(x*y), b = sum(x*(1-y)), c = sum((1-x)*y),
    d = sum((1-x)*(1-y)), x baseline, y variant. ValueError for unequal lengths or a value
    outside [0, 1]."""
    x, y = np.asarray(baseline, float), np.asarray(variant, float)
    if x.shape != y.shape:
        raise ValueError(f"paired correctness needs equal lengths, got {x.size} and {y.size}")
    if x.size and (x.min() < 0 or x.max() > 1 or y.min() < 0 or y.max() > 1):
        raise ValueError("correctness must lie in [0, 1]")
    return (
        float((x * y).sum()),
        float((x * (1 - y)).sum()),
        float(((1 - x) * y).sum()),
        float(((1 - x) * (1 - y)).sum()),
    )


def excludes_zero(interval: tuple[float, float]) -> bool:
    """True when the interval (low, high) lies entirely above or below 0."""
    return interval[0] > 0 or interval[1] < 0


def p_from_interval(
    interval: Callable[[float], tuple[float, float]], *, tol: float = 1e-6
) -> float:
    """The p-value of "no difference" from a family of intervals: the smallest alpha whose
    ``interval(alpha)`` (level 1 - alpha) excludes 0, by bisection to ``tol`` (test inversion,
    e.g. Casella & Berger, "Statistical Inference", 9.2.1); 1.0 when none does, 0.0 when even
    alpha = 1e-12 does."""
    lo_a, hi_a = 1e-12, 0.999999
    if not excludes_zero(interval(hi_a)):
        return 1.0
    if excludes_zero(interval(lo_a)):
        return 0.0
    while hi_a - lo_a > tol:
        mid = (lo_a + hi_a) / 2
        if excludes_zero(interval(mid)):
            hi_a = mid
        else:
            lo_a = mid
    return hi_a


# ---------------------------------------------------------------------------------------------
# request-level intervals inside one cell (descriptive)


@dataclass(frozen=True)
class Interval:
    """A point estimate and two-sided interval of a relative change (fractions, not percent).

    estimate: ``stat(variant) / stat(baseline) - 1``. low / high: interval bounds (NaN when it
    could not be computed). method: a human-readable name of the method and its sample size,
    shown in the report (e.g. ``"paired-request bootstrap BCa of median (n=200 requests)"``).
    n: number of pairs (requests) used.
    """

    estimate: float
    low: float
    high: float
    method: str
    n: int

    @classmethod
    def from_log(cls, est: float, low: float, high: float, method: str, n: int) -> Interval:
        """The interval of a change estimated on the log scale, mapped back with ``exp(x) - 1``."""
        return cls(math.expm1(est), math.expm1(low), math.expm1(high), method, n)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def _as_positive(x: Sequence[float], name: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D sequence, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(
            f"{name}: values must be finite and > 0 to take a log ratio, got {a.tolist()}"
        )
    return a


def _rng_kw(seed: int | np.random.Generator | None) -> dict:
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    import inspect

    params = inspect.signature(sps.bootstrap).parameters
    return {"rng": rng} if "rng" in params else {"random_state": rng}


def _bootstrap(
    data: tuple,
    statistic: Callable,
    *,
    confidence: float,
    n_resamples: int,
    seed,
    method: str,
    paired: bool = False,
    vectorized: bool = True,
) -> tuple[float, float, str]:
    """scipy.stats.bootstrap; BCa falls back to percentile when it is degenerate (NaN bounds)."""
    import warnings

    methods = [method] + (["percentile"] if method.lower() != "percentile" else [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning: handled below
        for method in methods:
            res = sps.bootstrap(
                data,
                statistic,
                n_resamples=n_resamples,
                confidence_level=confidence,
                method=method,
                paired=paired,
                vectorized=vectorized,
                **_rng_kw(seed),
            )
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
            if math.isfinite(lo) and math.isfinite(hi):
                break
    return lo, hi, method


def statistic_fn(name: str) -> Callable[..., np.ndarray]:
    """A reducer ``f(x, axis=-1)`` for a summary statistic name.

    ``"mean"``, ``"median"``, ``"std"``, ``"max"``, ``"min"``, ``"pNN"`` (the NN-th percentile,
    numpy's default linear interpolation, as bench_serving computes them). ValueError otherwise.
    """
    name = name.lower()
    simple = {"mean": np.mean, "median": np.median, "std": np.std, "max": np.max, "min": np.min}
    if name in simple:
        f = simple[name]
        return lambda x, axis=-1: f(x, axis=axis)
    if name.startswith("p") and name[1:].replace(".", "", 1).isdigit():
        q = float(name[1:])
        if not 0 <= q <= 100:
            raise ValueError(f"percentile out of range: {name}")
        return lambda x, axis=-1: np.percentile(x, q, axis=axis)
    raise ValueError(f"unknown statistic '{name}'; use mean, median, std, max, min or pNN")


def paired_request_interval(
    baseline: Sequence[float],
    variant: Sequence[float],
    stat: str = "mean",
    confidence: float = 0.95,
    *,
    n_resamples: int = 2000,
    seed: int | None = 0,
    method: str = "BCa",
) -> Interval:
    """Within-cell interval of ``stat(variant) / stat(baseline) - 1`` with requests paired by index.

    baseline, variant: per-request values (e.g. TTFT in ms), shape (n,), request i of both being
    the same prompt. The bootstrap draws request indices with replacement and applies the *same*
    draw to both arms (``scipy.stats.bootstrap(..., paired=True)``), so the prompt-to-prompt spread
    that both arms share cancels out. Statistic: ``ln(stat(v*) / stat(b*))``, mapped back with
    ``exp(x) - 1``; interval ``method`` BCa by default (Efron 1987, "Better bootstrap confidence
    intervals", JASA 82), the percentile interval when BCa is degenerate. Values must be > 0.
    """
    b = _as_positive(baseline, "baseline")
    v = _as_positive(variant, "variant")
    if b.shape != v.shape:
        raise ValueError(f"paired requests need equal counts: baseline {b.size}, variant {v.size}")
    n = b.size
    if n < 2:
        raise ValueError(f"need at least 2 paired requests, got {n}")
    f = statistic_fn(stat)

    def lr(x, y, axis=-1):
        return np.log(f(y, axis=axis)) - np.log(f(x, axis=axis))

    est = float(lr(b, v))
    lo, hi, used = _bootstrap(
        (b, v),
        lr,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        method=method,
        paired=True,
    )
    return Interval.from_log(
        est, lo, hi, f"paired-request bootstrap {used} of {stat} (n={n} requests)", n
    )


#: cap on the resamples of a request-block bootstrap of a quantile (each one concatenates the
#: drawn requests' values: ~200k values for 200 requests x 1024 tokens)
MAX_BLOCK_RESAMPLES = 1000


def block_bootstrap_interval(
    baseline_blocks: Sequence[Sequence[float]],
    variant_blocks: Sequence[Sequence[float]],
    stat: str = "mean",
    confidence: float = 0.95,
    *,
    n_resamples: int = 2000,
    seed: int | None = 0,
) -> Interval:
    """Within-cell interval for values that come in correlated blocks (ITL: one block a request).

    baseline_blocks[i], variant_blocks[i]: the values of request i (ragged lists, ms). A resample
    draws request indices with replacement (the same indices for both arms, requests pairing by
    index), concatenates the drawn blocks of each arm and computes ``ln(stat(v*) / stat(b*))``; the
    percentile interval of that, mapped back with ``exp(x) - 1`` (moving/blocks bootstrap with
    natural blocks, Kuensch 1989; Davison & Hinkley 1997, section 8.2). Requests whose block is
    empty in either arm are kept (they add nothing to that arm). Runs ``scipy.stats.bootstrap`` on
    the index vector, percentile method; ``mean`` is vectorised (sums and counts per block),
    other statistics concatenate per resample and use at most :data:`MAX_BLOCK_RESAMPLES`.
    """
    if len(baseline_blocks) != len(variant_blocks):
        raise ValueError(
            f"paired requests need equal counts: baseline {len(baseline_blocks)}, "
            f"variant {len(variant_blocks)}"
        )
    bb = [np.asarray(x, dtype=float) for x in baseline_blocks]
    vb = [np.asarray(x, dtype=float) for x in variant_blocks]
    n = len(bb)
    if n < 2:
        raise ValueError(f"need at least 2 requests, got {n}")
    for name, blocks in (("baseline", bb), ("variant", vb)):
        allv = np.concatenate(blocks) if blocks else np.array([])
        if allv.size == 0:
            raise ValueError(f"{name}: no values in any block")
        if not np.all(np.isfinite(allv)) or np.any(allv < 0):
            raise ValueError(f"{name}: block values must be finite and >= 0")
    f = statistic_fn(stat)
    empty = np.array([])
    all_idx = np.arange(n)
    if stat.lower() == "mean":
        # pooled mean of the drawn blocks = sum of their sums / sum of their counts (vectorised)
        sb = np.array([x.sum() for x in bb])
        cb = np.array([x.size for x in bb], dtype=float)
        sv = np.array([x.sum() for x in vb])
        cv = np.array([x.size for x in vb], dtype=float)

        def lr_vec(idx, axis=-1):
            idx = np.asarray(idx, dtype=int)
            return np.log(sv[idx].sum(axis) / cv[idx].sum(axis)) - np.log(
                sb[idx].sum(axis) / cb[idx].sum(axis)
            )

        statistic, vectorized = lr_vec, True
    else:
        # quantiles of the pooled values: one concatenation per resample (slow for big cells),
        # so at most MAX_BLOCK_RESAMPLES resamples
        n_resamples = min(n_resamples, MAX_BLOCK_RESAMPLES)

        def value(blocks, idx):
            parts = [blocks[i] for i in idx]
            x = np.concatenate(parts) if parts else empty
            return f(x, axis=-1) if x.size else np.nan

        def lr(idx):
            idx = np.asarray(idx, dtype=int)
            return np.log(value(vb, idx)) - np.log(value(bb, idx))

        statistic, vectorized = lr, False
    est = float(statistic(all_idx))
    lo, hi, _ = _bootstrap(
        (all_idx,),
        statistic,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        method="percentile",
        vectorized=vectorized,
    )
    what = f"request-block bootstrap percentile of {stat} (n={n} requests, {n_resamples} resamples)"
    return Interval.from_log(est, lo, hi, what, n)
