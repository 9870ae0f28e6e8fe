"""Statistical primitives: intervals of a relative change, and the Wilson interval.

Every interval here is an interval of a *relative change* ``variant / baseline - 1``, expressed as
a fraction (0.10 = +10 %). Effects are estimated on the log scale, where a ratio becomes a
difference and run-to-run noise of throughputs and latencies is close to symmetric, then mapped
back with ``exp(x) - 1``.

Verdicts are not made here: :mod:`patchbench.verdicts` holds the rules (paired t on log ratios
over repeats with a minimum of repeats, TOST, Holm, Newcombe for accuracy, exact counts) and
:mod:`patchbench.analysis` applies them. What this module is used for:

- request-level intervals inside one cell, shown as descriptive only (never a verdict or a gate),
  by the serving suite's pair hook: TTFT and E2E with :func:`paired_request_interval` (request i
  of the baseline pairs with request i of the variant, the prompts being the same under a fixed
  seed); ITL with :func:`block_bootstrap_interval` (the per-token gaps of one request are
  correlated, so whole requests are resampled; Kuensch 1989, "The jackknife and the bootstrap for
  general stationary observations", Ann. Statist. 17(3));
- proportions (identical-output share): :func:`wilson_interval`.

Also here, used by no verdict: :func:`t_interval_log_ratio` / :func:`t_interval_diff` (paired
t-intervals over repeats), :func:`bootstrap_log_ratio` (a BCa bootstrap over repeats; with few
repeats it undercovers: Efron & Tibshirani 1993, ch. 14; Hesterberg 2015, "What teachers should
know about the bootstrap", section 6). The A/A noise floor that used to live here is retired:
the A/A health check in :mod:`patchbench.analysis` replaced it.

All functions take plain sequences of floats and return an :class:`Interval`; they raise
``ValueError`` for inputs they cannot use (lengths that differ, non-positive values where a log is
taken, too few values).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np


class _ScipyStats:
    """``scipy.stats``, imported on first use: it costs 0.5 s, and ``patchbench bench`` imports
    this module long before it compares anything (patchbench/preload.py loads it meanwhile)."""

    def __getattr__(self, name: str):
        from scipy import stats

        return getattr(stats, name)


sps = _ScipyStats()

_NORMAL = statistics.NormalDist()

__all__ = [
    "Interval",
    "log_ratios",
    "t_interval_log_ratio",
    "t_interval_diff",
    "bootstrap_log_ratio",
    "paired_request_interval",
    "block_bootstrap_interval",
    "wilson_interval",
    "statistic_fn",
]


@dataclass(frozen=True)
class Interval:
    """A point estimate and two-sided interval of a relative change (fractions, not percent).

    estimate: the change the interval is centred on (``exp(mean log ratio) - 1`` for the repeat
    methods, ``stat(variant) / stat(baseline) - 1`` for the within-cell ones).
    low / high: interval bounds (NaN when it could not be computed).
    method: a human-readable name of the method and its sample size, shown in the report
    (e.g. ``"t on log ratio (n=3)"``). n: number of pairs (repeats or requests) used.
    """

    estimate: float
    low: float
    high: float
    method: str
    n: int

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


def log_ratios(baseline: Sequence[float], variant: Sequence[float]) -> np.ndarray:
    """``d_k = ln(variant_k / baseline_k)`` for paired repeats k (shape (n,)).

    Raises ValueError when the lengths differ or a value is not > 0.
    """
    b = _as_positive(baseline, "baseline")
    v = _as_positive(variant, "variant")
    if b.shape != v.shape:
        raise ValueError(f"paired values need equal lengths: baseline {b.size}, variant {v.size}")
    return np.log(v) - np.log(b)


def _paired_log_ratios(
    baseline: Sequence[float], variant: Sequence[float], what: str
) -> tuple[np.ndarray, int, float]:
    """``(d, n, mean(d))`` with ``d_k = ln(v_k / b_k)`` (:func:`log_ratios`); ValueError naming
    ``what`` when fewer than 2 repeats pair up."""
    d = log_ratios(baseline, variant)
    n = d.size
    if n < 2:
        raise ValueError(f"{what} needs at least 2 paired repeats, got {n}")
    return d, n, float(np.mean(d))


def t_interval_log_ratio(
    baseline: Sequence[float], variant: Sequence[float], confidence: float = 0.95
) -> Interval:
    """Student-t interval of the geometric-mean ratio of paired repeats.

    With ``d_k = ln(v_k / b_k)``, ``k = 1..n``, ``dbar`` their mean and ``s`` their sample standard
    deviation (ddof=1)::

        estimate = exp(dbar) - 1
        interval = exp(dbar -/+ t_{1-(1-c)/2, n-1} * s / sqrt(n)) - 1

    (the paired t-interval, e.g. Montgomery, "Design and Analysis of Experiments", 2.5.1, applied
    to log ratios). Computed with ``scipy.stats.ttest_1samp(d).confidence_interval``.
    Needs n >= 2 (ValueError otherwise). When all d_k are equal (s = 0) the interval is the point.
    """
    d, n, dbar = _paired_log_ratios(baseline, variant, "a t-interval")
    if np.ptp(d) == 0:
        lo = hi = dbar
    else:
        ci = sps.ttest_1samp(d, 0.0).confidence_interval(confidence_level=confidence)
        lo, hi = float(ci.low), float(ci.high)
    return Interval(math.expm1(dbar), math.expm1(lo), math.expm1(hi), f"t on log ratio (n={n})", n)


def t_interval_diff(
    baseline: Sequence[float], variant: Sequence[float], confidence: float = 0.95
) -> Interval:
    """Student-t interval of the mean paired difference, relative to the baseline mean.

    For metrics that can be 0 (counts such as host syncs per call), where a log ratio does not
    exist. With ``d_k = v_k - b_k`` and ``B = mean(b) > 0``::

        estimate = dbar / B
        interval = (dbar -/+ t_{1-(1-c)/2, n-1} * s_d / sqrt(n)) / B

    (paired t-interval; ``scipy.stats.ttest_1samp(d).confidence_interval``), treating B as known.
    Equal differences (deterministic counts) give a zero-width interval at the estimate.
    Raises ValueError for n < 2, unequal lengths, non-finite values or ``B <= 0``.
    """
    b = np.asarray(baseline, dtype=float)
    v = np.asarray(variant, dtype=float)
    if b.shape != v.shape or b.ndim != 1:
        raise ValueError(f"paired values need equal lengths: baseline {b.size}, variant {v.size}")
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(v))):
        raise ValueError("values must be finite")
    n = b.size
    if n < 2:
        raise ValueError(f"a t-interval needs at least 2 paired repeats, got {n}")
    scale = float(np.mean(b))
    if scale <= 0:
        raise ValueError(f"baseline mean is {scale:g}: no relative change")
    d = v - b
    dbar = float(np.mean(d))
    if np.ptp(d) == 0:
        lo = hi = dbar
    else:
        ci = sps.ttest_1samp(d, 0.0).confidence_interval(confidence_level=confidence)
        lo, hi = float(ci.low), float(ci.high)
    return Interval(dbar / scale, lo / scale, hi / scale, f"t on paired difference (n={n})", n)


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

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DegenerateDataWarning: handled below
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
        if (not (math.isfinite(lo) and math.isfinite(hi))) and method.lower() != "percentile":
            res = sps.bootstrap(
                data,
                statistic,
                n_resamples=n_resamples,
                confidence_level=confidence,
                method="percentile",
                paired=paired,
                vectorized=vectorized,
                **_rng_kw(seed),
            )
            lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
            method = "percentile"
    return lo, hi, method


def bootstrap_log_ratio(
    baseline: Sequence[float],
    variant: Sequence[float],
    confidence: float = 0.95,
    *,
    n_resamples: int = 2000,
    seed: int | None = 0,
    method: str = "BCa",
) -> Interval:
    """Bootstrap interval of the geometric-mean ratio of paired repeats (no verdict uses it).

    Resamples the log ratios ``d_k = ln(v_k / b_k)`` with replacement and takes the ``method``
    interval (BCa by default; Efron 1987, "Better bootstrap confidence intervals", JASA 82) of
    ``mean(d)``, mapped back with ``exp(x) - 1``. ``scipy.stats.bootstrap`` does the work; a
    degenerate BCa (all d equal) falls back to the percentile interval.
    """
    d, n, dbar = _paired_log_ratios(baseline, variant, "a bootstrap")
    if np.ptp(d) == 0:
        lo = hi = dbar
        used = method
    else:
        lo, hi, used = _bootstrap(
            (d,), np.mean, confidence=confidence, n_resamples=n_resamples, seed=seed, method=method
        )
    return Interval(
        math.expm1(dbar),
        math.expm1(lo),
        math.expm1(hi),
        f"bootstrap {used} on log ratio (n={n}, {n_resamples} resamples)",
        n,
    )


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
    ``exp(x) - 1``. Values must be > 0.
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
    return Interval(
        math.expm1(est),
        math.expm1(lo),
        math.expm1(hi),
        f"paired-request bootstrap {used} of {stat} (n={n} requests)",
        n,
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

        est = float(lr_vec(all_idx))
        lo, hi, _ = _bootstrap(
            (all_idx,),
            lr_vec,
            confidence=confidence,
            n_resamples=n_resamples,
            seed=seed,
            method="percentile",
            vectorized=True,
        )
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

        est = float(lr(all_idx))
        lo, hi, _ = _bootstrap(
            (all_idx,),
            lr,
            confidence=confidence,
            n_resamples=n_resamples,
            seed=seed,
            method="percentile",
            vectorized=False,
        )
    return Interval(
        math.expm1(est),
        math.expm1(lo),
        math.expm1(hi),
        f"request-block bootstrap percentile of {stat} (n={n} requests, {n_resamples} resamples)",
        n,
    )


def wilson_interval(successes: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n`` (Wilson 1927, JASA 22).

    ``(p + z^2/2n -/+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``z`` the normal quantile
    (``statistics.NormalDist``: the same value as ``scipy.stats.norm.ppf``; checked against
    statsmodels' ``proportion_confint(method="wilson")`` in the tests). ``successes`` may be
    fractional (correctness averaged over repeats). Returns (low, high) as fractions; ValueError
    when n <= 0 or successes is outside 0..n.
    """
    if n <= 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n > 0, got {successes}/{n}")
    z = _NORMAL.inv_cdf(1 - (1 - confidence) / 2)
    p = successes / n
    den = 1 + z * z / n
    c = (p + z * z / (2 * n)) / den
    h = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / den
    return max(0.0, c - h), min(1.0, c + h)
