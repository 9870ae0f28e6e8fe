"""Statistical methods, one copy each, each citing its source and tested against scipy /
statsmodels (or a published example) in tests/analysis/test_stats.py: t tests (:class:`TTest`),
a standard deviation's interval, cell variance components, TOST, Holm, Wilson and Newcombe
intervals, and the request-level bootstraps of the serving suite (descriptive only).
Functions raise ValueError for inputs they cannot use; scipy is imported on first use.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


# --------------------------------------------------------------------------------------- t tests


def _stdtr(df: float, t: float) -> float:
    """Student t CDF at ``t`` (``scipy.stats.t.cdf``)."""
    from scipy import special

    return float(special.stdtr(df, t))


def _stdtrit(df: float, q: float) -> float:
    """Student t quantile at ``q`` (``scipy.stats.t.ppf``)."""
    from scipy import special

    return float(special.stdtrit(df, q))


@dataclass(frozen=True)
class TTest:
    """A t test: ``mean`` the estimate (log scale for ratios), ``se`` its standard error, ``df``,
    ``n`` the values used, ``sd`` of the paired differences (NaN when unpaired). With ``se == 0``
    the p-values, intervals and bounds take their limits (the estimate is certain)."""

    mean: float
    se: float
    df: float
    n: int
    sd: float = math.nan

    def p_value(self, alternative: Alternative = "two-sided") -> float:
        """p-value of mean 0: two-sided ``2 P(T_df > |mean / se|)``, or one-sided ``P(T_df > t)``
        ("greater") / ``P(T_df < t)`` ("less"); with se 0 (or not finite, one-sided) 0 when the
        mean lies on the tested side (two-sided: is not 0), else 1."""
        if alternative == "two-sided":
            if self.se == 0:
                return 1.0 if self.mean == 0 else 0.0
            return 2 * _stdtr(self.df, -abs(self.mean / self.se))
        side = 1 if alternative == "greater" else -1
        if self.se == 0.0 or not math.isfinite(self.se):
            return 0.0 if self.mean * side > 0 else 1.0
        return _stdtr(self.df, -side * self.mean / self.se)

    def interval(self, alpha: float) -> tuple[float, float]:
        """Two-sided ``1 - alpha`` interval ``mean -/+ t_{1 - alpha/2, df} se``."""
        q = 0.0 if self.se == 0 else _stdtrit(self.df, 1 - alpha / 2) * self.se
        return self.mean - q, self.mean + q

    def bound(self, alpha: float, side: int) -> float:
        """One-sided ``1 - alpha`` bound ``mean + side t_{1 - alpha, df} se`` (``side`` +1 upper,
        -1 lower)."""
        if self.se == 0.0:
            return self.mean
        return self.mean + side * _stdtrit(self.df, 1.0 - alpha) * self.se


def log_ratios(baseline: Sequence[float], variant: Sequence[float]) -> np.ndarray:
    """``ln(variant_k) - ln(baseline_k)`` for paired values k (shape (n,)); ValueError when the
    lengths differ or a value is not > 0."""
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    if b.shape != v.shape:
        raise ValueError(f"paired values need equal lengths, got {b.size} and {v.size}")
    if np.any(b <= 0) or np.any(v <= 0):
        raise ValueError("log ratios need values > 0")
    return np.log(v) - np.log(b)


def paired_t(d: Sequence[float]) -> TTest:
    """Paired t test on the differences ``d`` of n >= 2 pairs (Student 1908, Biometrika 6):
    ``se = sd / sqrt(n)``, ``df = n - 1``; on :func:`log_ratios`, a geometric-mean ratio. As
    ``scipy.stats.ttest_1samp(d, 0)``."""
    x = np.asarray(d, dtype=float)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"a paired t test needs at least 2 pairs, got {x.size}")
    n = int(x.size)
    sd = float(np.std(x, ddof=1))
    return TTest(float(np.mean(x)), sd / math.sqrt(n), n - 1, n, sd)


def welch_t(x: Sequence[float], y: Sequence[float]) -> TTest:
    """Welch's unpaired t test of ``mean(x) - mean(y)`` (Welch 1947, Biometrika 34):
    ``se = sqrt(s_x^2/n_x + s_y^2/n_y)``, Welch-Satterthwaite df (1 when se == 0). As
    ``scipy.stats.ttest_ind(x, y, equal_var=False)``; at least 2 values per sample."""
    a, b = np.asarray(x, float), np.asarray(y, float)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"Welch needs at least 2 values in each sample, got {a.size} and {b.size}")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va**2 / (a.size - 1)) + (vb**2 / (b.size - 1))) if se > 0 else 1.0
    return TTest(float(a.mean() - b.mean()), se, df, int(a.size + b.size))


def prediction_t(x: Sequence[float], means: Sequence[float]) -> TTest:
    """A new sample's mean against K >= 2 earlier means (prediction t test; Hahn & Meeker,
    "Statistical Intervals" (1991), 4.6): ``mean(x) - mean(means)``, ``se = sd(means)
    sqrt(1 + 1/K)``, K - 1 df."""
    k = len(means)
    if len(x) < 1 or k < 2:
        raise ValueError(f"a prediction t test needs a value and 2 means, got {len(x)} and {k}")
    se = float(np.std(means, ddof=1) * math.sqrt(1.0 + 1.0 / k))
    return TTest(float(np.mean(x) - np.mean(means)), se, k - 1, len(x))


def trend_t(y: Sequence[float], x: Sequence[float] | None = None) -> TTest:
    """The least-squares slope of ``y`` on ``x`` (default ``0..n-1``) as a t test: ``mean`` the
    slope (y per unit of x), ``se = sqrt(s^2 / Sxx)``, n - 2 df (Montgomery, Peck & Vining,
    "Introduction to Linear Regression Analysis", 2.3); as ``scipy.stats.linregress(x, y)``.
    ValueError with fewer than 3 values, lengths that differ or x without spread."""
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
    """Two-sided ``1 - alpha`` chi-square interval of a normal standard deviation from ``sd`` on
    ``df`` >= 1 degrees of freedom (Hahn & Meeker, "Statistical Intervals" (1991), 4.2)."""
    if df < 1 or sd < 0:
        raise ValueError(f"an interval of a standard deviation needs df >= 1 and sd >= 0, got {df}")
    lo = sd * math.sqrt(df / float(sps.chi2.ppf(1 - alpha / 2, df)))
    hi = sd * math.sqrt(df / float(sps.chi2.ppf(alpha / 2, df)))
    return lo, hi


@dataclass(frozen=True)
class CellVariance:
    """The variance of a cell's shift (:func:`cell_variance`): ``sigma2 = (between - within) /
    items`` truncated at 0, from the pooled mean squares of repeats (``between``, on
    ``df_between``) and of the residual (``within``, on ``df_within``); ``items`` per arm."""

    sigma2: float
    between: float
    within: float
    df_between: int
    df_within: int
    items: float


def cell_variance(arms: Sequence[np.ndarray]) -> CellVariance | None:
    """The variance of a cell's shift, pooled over arms (each a matrix ``y[r, q]``, shape (R, Q):
    repeat r, item q, Q >= 2).

    Model ``y[a, r, q] = mu[a, q] + c[a, r] + e[a, r, q]``, ``c`` the cell shift with variance
    ``sigma_c^2``. Per arm the two-way layout without interaction gives the mean squares of
    repeats ``MS_R`` and of the residual ``MS_E``, ``E[MS_R - MS_E] = Q sigma_c^2`` (ANOVA
    estimator; Searle, Casella & McCulloch, "Variance Components" (1992), 4.7); pooled with
    weights ``R - 1`` (:func:`pool_cell_variance`). None when no arm has two repeats."""
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
    """Pool per-arm :class:`CellVariance` estimates (None skipped): mean squares weighted by
    their df, items by ``df_between``; None when no part carries information."""
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

    baseline / variant: each item's mean over its arm's repeats (shape (Q,), Q >= 2, aligned);
    cells: :func:`cell_variance` (None: not estimable). ``Var(D) = s_d^2 / Q + sigma_c^2 (1/R_v
    + 1/R_b)`` (the cell shifts move D but not ``s_d``); Satterthwaite's df (1946, Biometrics
    Bulletin 2) over the item term and the cell mean squares. Without a cell component, the
    paired t test of the items."""
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
    """TOST p-value of ``low < mean < high`` (Schuirmann 1987, J Pharmacokinet Biopharm 15): the
    larger one-sided p-value, as ``statsmodels...ttost_paired``; with se == 0, 0 when the mean
    lies inside, else 1."""
    if t.se == 0:
        return 0.0 if low < t.mean < high else 1.0
    p_low = _stdtr(t.df, -((t.mean - low) / t.se))
    p_high = _stdtr(t.df, (t.mean - high) / t.se)
    return max(p_low, p_high)


def equivalent_by_interval(
    interval: Callable[[float], tuple[float, float]], low: float, high: float, alpha: float
) -> bool:
    """TOST by its interval: equivalent at ``alpha`` when ``interval(2 alpha)`` lies inside
    (low, high) (Berger & Hsu 1996, Statist. Sci. 11); for intervals without a t statistic."""
    lo, hi = interval(2 * alpha)
    return low < lo and hi < high


# ---------------------------------------------------------------------------------- multiplicity


def holm(p_values: Sequence[float], alpha: float) -> list[tuple[bool, float]]:
    """Holm's step-down procedure (Holm 1979, Scand J Statist 6): (rejected, level) per p-value
    in input order, the i-th smallest at ``alpha / (m - i)``; as statsmodels' ``multipletests(p,
    alpha, method="holm")``."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out: list[tuple[bool, float]] = [(False, 0.0)] * m
    going = True
    for rank, i in enumerate(order):
        level = alpha / (m - rank)
        going = going and bool(p_values[i] <= level)
        out[i] = (going, level)
    return out


# ----------------------------------------------------------------------------------- proportions


def wilson_interval(successes: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (low, high) of ``successes / n`` (Wilson 1927, JASA 22; as
    statsmodels' ``proportion_confint(method="wilson")``); ``successes`` may be fractional.
    ValueError when n <= 0 or successes is outside 0..n."""
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
    """(estimate, low, high) of ``p2 - p1`` at level 1 - alpha for a paired 2x2 table (Newcombe
    1998, Stat Med 17:2635, method 10: Wilson margins with the phi correlation). a: both right,
    b: only the baseline, c: only the variant, d: neither (counts, may be fractional); p1 =
    (a+b)/n baseline, p2 = (a+c)/n variant. Never zero-width; ValueError when n = 0."""
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
    """The cells (a, b, c, d) of :func:`newcombe_paired` from per-item correctness x (baseline),
    y (variant) in [0, 1]: sums of xy, x(1-y), (1-x)y, (1-x)(1-y)."""
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


def p_from_interval(interval: Callable[[float], tuple[float, float]]) -> float:
    """The smallest alpha whose ``interval(alpha)`` excludes 0, by bisection to 1e-6 (test
    inversion; Casella & Berger, "Statistical Inference", 9.2.1)."""
    lo_a, hi_a = 1e-12, 0.999999
    if not excludes_zero(interval(hi_a)):
        return 1.0
    if excludes_zero(interval(lo_a)):
        return 0.0
    while hi_a - lo_a > 1e-6:
        mid = (lo_a + hi_a) / 2
        if excludes_zero(interval(mid)):
            hi_a = mid
        else:
            lo_a = mid
    return hi_a


# ----------------------------------------- request-level intervals inside one cell (descriptive)


@dataclass(frozen=True)
class Interval:
    """A relative change ``stat(variant) / stat(baseline) - 1`` (fractions) with its two-sided
    interval (NaN bounds when it could not be computed), the ``method`` as the report shows it
    and ``n`` the pairs (requests) used."""

    estimate: float
    low: float
    high: float
    method: str
    n: int

    @classmethod
    def from_log(cls, est: float, low: float, high: float, method: str, n: int) -> Interval:
        """The interval of a change estimated on the log scale, mapped back with ``exp(x) - 1``."""
        return cls(math.expm1(est), math.expm1(low), math.expm1(high), method, n)

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
    """A reducer ``f(x, axis=-1)`` for ``mean``, ``median``, ``std``, ``max``, ``min`` or
    ``pNN`` (numpy's percentile, as bench_serving computes it); ValueError otherwise."""
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
    """Within-cell interval of ``stat(variant) / stat(baseline) - 1``, request i of both arms
    being the same prompt (per-request values > 0, shape (n,)): the same bootstrap draw of
    indices for both arms (``scipy.stats.bootstrap(paired=True)``) of ``ln(stat(v*) /
    stat(b*))``; BCa (Efron 1987, JASA 82), percentile when BCa is degenerate."""
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
    """Within-cell interval for values in correlated blocks (ITL: ``*_blocks[i]`` the values of
    request i, ragged, >= 0): resample request indices (the same for both arms), concatenate the
    drawn blocks, ``ln(stat(v*) / stat(b*))``; percentile interval (block bootstrap with natural
    blocks: Kuensch 1989, Ann. Statist. 17; Davison & Hinkley 1997, 8.2). ``mean`` is
    vectorised; other statistics use at most :data:`MAX_BLOCK_RESAMPLES` resamples."""
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
