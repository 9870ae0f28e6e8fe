"""The verdict rules: what a comparison may claim about one metric of one variant.

Four-way verdicts, plus ``incomplete``:

- ``improved`` / ``regressed``: the interval (at the level the row's test used) excludes no
  change, in the metric's good / bad direction; ``within_margin`` says when the change is
  nevertheless smaller than the practical margin ("improved, within +-5 %");
- ``equivalent``: two one-sided tests (TOST; Schuirmann 1987) at the same alpha show the change
  lies inside +-margin, i.e. the (1 - 2 alpha) interval lies inside the margin;
- ``inconclusive``: neither (too few repeats, too much noise, no margin declared);
- ``incomplete``: a cell the row needs is not ok or lacks the value.

Kinds (``patchbench.suite.MetricInfo.kind``):

- ``run``: one value per server run; repeat k of the baseline is paired with repeat k of the
  variant (interleaved schedule) and the paired t-interval on log ratios is used (Student 1908;
  log ratios so that the change is multiplicative). A verdict needs at least
  ``compare.min_repeats`` pairs: one run cannot separate a patch from run-to-run noise.
- ``accuracy``: items (questions) paired across the arms; each question's correctness is averaged
  over its repeats first (greedy repeats are near copies; the question is the unit), then the
  difference of paired proportions gets Newcombe's hybrid score interval (Newcombe 1998, Stat Med
  17:2635, method 10; with averaged correctness the 2x2 cells are sums of products, the same
  formula). It is never zero-width: the Wilson intervals it is built from never are.
- ``deterministic``: the same value in every run (e.g. host syncs per call): compared exactly, no
  interval; a value that varies between repeats is not deterministic and gets ``inconclusive``.
- ``descriptive``: shown, never judged.

Multiplicity: each variant's primary metrics form one family; Holm's step-down procedure (Holm
1979, ``statsmodels.stats.multitest.multipletests(method="holm")``) sets each primary's alpha;
the interval shown and TOST use that adjusted alpha. Secondary metrics keep the raw alpha and are
exploratory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from patchbench.stats import sps  # scipy.stats, imported on first use

Verdict = Literal["improved", "regressed", "equivalent", "inconclusive", "incomplete"]
VERDICTS: tuple[str, ...] = ("improved", "regressed", "equivalent", "inconclusive", "incomplete")

#: the sources every method names (shown in the report's methods section)
METHOD_SOURCES = {
    "paired t on log ratios": "Student (1908); paired repeats of an interleaved schedule",
    "TOST": "Schuirmann (1987), two one-sided tests; statsmodels.stats.weightstats.ttost_paired",
    "Holm": "Holm (1979), step-down; statsmodels.stats.multitest.multipletests(method='holm')",
    "Newcombe paired": "Newcombe (1998) Stat Med 17:2635-2650, method 10 (hybrid score, paired)",
    "Wilson": "Wilson (1927) score interval",
    "Welch": "Welch (1947) unpaired t on per-run log values",
    "exact": "deterministic values compared exactly (no sampling error); a value that is only "
    "a bound gives the interval of differences the bounds allow (interval arithmetic, Moore 1966)",
}


@dataclass
class Test:
    """The result of one metric's test before multiplicity: ``p`` two-sided p-value of "no
    change" (None: not testable), ``interval(alpha)`` -> (low, high) of the change at level
    1 - alpha (fractions: 0.05 = +5 %, or accuracy points as fractions), ``estimate`` the change,
    ``method`` with its source, ``scale``: "ratio" (change = variant/baseline - 1) or "diff"."""

    estimate: float | None
    p: float | None
    interval: object = None  # Callable[[float], tuple[float, float]]
    method: str = ""
    scale: Literal["ratio", "diff"] = "ratio"
    reason: str | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- run-level (paired repeats)


def _log_ratios(baseline: Sequence[float], variant: Sequence[float]) -> np.ndarray:
    b, v = np.asarray(baseline, float), np.asarray(variant, float)
    if b.shape != v.shape:
        raise ValueError(f"paired values need equal lengths, got {b.size} and {v.size}")
    if np.any(b <= 0) or np.any(v <= 0):
        raise ValueError("log ratios need positive values")
    return np.log(v) - np.log(b)


def run_test(baseline: Sequence[float], variant: Sequence[float], min_repeats: int) -> Test:
    """Paired t-test on log ratios of repeat-level values (baseline[k] with variant[k]).

    Fewer than ``min_repeats`` pairs: ``p`` None and the reason. Zero spread of the log ratios
    with a non-zero mean gives p = 0 only when n >= min_repeats; the interval is then the point
    (a deterministic run-level metric belongs in kind "deterministic" instead).
    """
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
                est = float(np.expm1(np.mean(_log_ratios(baseline, variant))))
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
    d = _log_ratios(baseline, variant)
    m, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    if se == 0:
        p = 1.0 if m == 0 else 0.0
    else:
        p = float(2 * sps.t.sf(abs(m / se), n - 1))

    def interval(alpha: float, _m=m, _se=se, _n=n) -> tuple[float, float]:
        q = float(sps.t.ppf(1 - alpha / 2, _n - 1)) * _se
        return float(np.expm1(_m - q)), float(np.expm1(_m + q))

    return Test(float(np.expm1(m)), p, interval, f"paired t on log ratios (n={n})")


def tost_log_ratio(
    baseline: Sequence[float], variant: Sequence[float], margin_pct: float, alpha: float
) -> tuple[float, bool]:
    """TOST of "variant/baseline within [1/(1+m), 1+m]" on paired log ratios (symmetric in log
    space: bounds +-log(1 + margin)). Returns (p, equivalent at ``alpha``); p is the larger of the
    two one-sided p-values, as ``statsmodels.stats.weightstats.ttost_paired`` reports it."""
    d = _log_ratios(baseline, variant)
    n = d.size
    bound = math.log1p(margin_pct / 100.0)
    m, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    if se == 0:
        p = 0.0 if -bound < m < bound else 1.0
    else:
        p_low = float(sps.t.sf((m + bound) / se, n - 1))
        p_upp = float(sps.t.cdf((m - bound) / se, n - 1))
        p = max(p_low, p_upp)
    return p, p < alpha


# ---------------------------------------------------------------- accuracy (paired items)


def wilson(x: float, n: float, alpha: float) -> tuple[float, float]:
    """Wilson score interval of x successes in n (x may be fractional), level 1 - alpha
    (:func:`patchbench.stats.wilson_interval`); ValueError when n <= 0."""
    from patchbench.stats import wilson_interval

    return wilson_interval(x, n, 1 - alpha)


def newcombe_paired(
    a: float, b: float, c: float, d: float, alpha: float
) -> tuple[float, float, float]:
    """Newcombe (1998) method 10 interval for p2 - p1 of a paired 2x2 table.

    a: both right, b: baseline right / variant wrong, c: baseline wrong / variant right,
    d: both wrong (counts, may be fractional). p1 = (a+b)/n (baseline), p2 = (a+c)/n (variant).
    Returns (estimate, low, high) of p2 - p1 at level 1 - alpha, in proportions.
    Raises ValueError when n = 0.
    """
    n = a + b + c + d
    if n <= 0:
        raise ValueError("no paired items")
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, alpha)
    l2, u2 = wilson(a + c, n, alpha)
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
    """2x2 cells (a, b, c, d) from per-question correctness in [0, 1] (averaged over repeats):
    a = sum(x*y), b = sum(x*(1-y)), c = sum((1-x)*y), d = sum((1-x)*(1-y)), x baseline, y variant."""
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


def _p_from_interval(interval, *, tol: float = 1e-6) -> float:
    """The smallest alpha whose (1 - alpha) interval excludes 0 (bisection; 1.0 when none does)."""
    lo_a, hi_a = 1e-12, 0.999999
    if _excludes_zero(interval(hi_a)) is False:
        return 1.0
    if _excludes_zero(interval(lo_a)):
        return 0.0
    while hi_a - lo_a > tol:
        mid = (lo_a + hi_a) / 2
        if _excludes_zero(interval(mid)):
            hi_a = mid
        else:
            lo_a = mid
    return hi_a


def _excludes_zero(iv: tuple[float, float]) -> bool:
    return iv[0] > 0 or iv[1] < 0


def accuracy_test(baseline: Sequence[float], variant: Sequence[float]) -> Test:
    """Paired-proportion test of per-question correctness (each in [0, 1], averaged over repeats).
    Interval: :func:`newcombe_paired`; p: the smallest alpha whose interval excludes 0."""
    if len(baseline) == 0:
        return Test(None, None, None, "Newcombe paired", "diff", reason="no paired questions")
    a, b, c, d = paired_table(baseline, variant)

    def interval(alpha: float, _t=(a, b, c, d)) -> tuple[float, float]:
        _, lo, hi = newcombe_paired(*_t, alpha)
        return lo, hi

    est = newcombe_paired(a, b, c, d, 0.05)[0]
    return Test(
        est,
        _p_from_interval(interval),
        interval,
        f"Newcombe paired-proportion interval (n={len(baseline)} questions, "
        f"discordant {b:g} / {c:g})",
        "diff",
    )


# ---------------------------------------------------------------- deterministic


Bound = Literal["lower", "upper"] | None


def bounded_difference(
    baseline: float, variant: float, baseline_bound: Bound = None, variant_bound: Bound = None
) -> tuple[float, float]:
    """(low, high) of what the true ``variant - baseline`` can be when a value is only a bound
    of the true one ("lower": the truth is at least the value; "upper": at most; None: exact).
    Interval arithmetic: low = (least the variant can be) - (most the baseline can be), high
    the other way round; unbounded sides are -inf / +inf. Both exact: (diff, diff)."""
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
    """Exact comparison: every repeat of each arm must give the same value.

    With a bound on either side (see :func:`bounded_difference`) the interval is what the
    bounds allow: p 0 when it excludes 0 (the direction is certain), else 1 with a reason; the
    estimate stays the observed difference."""
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
    """Holm's step-down procedure. Returns (reject, alpha used per test).

    The alpha of the test at sorted rank i is alpha / (m - i) while every earlier test was
    rejected; from the first test that is not rejected on, every later test keeps that test's
    alpha (so an interval at that level includes 0 and agrees with "not rejected").
    ``reject`` equals ``multipletests(pvalues, alpha, method="holm")[0]``.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    reject = [False] * m
    used = [alpha] * m
    stopped = None
    for rank, i in enumerate(order):
        a_i = alpha / (m - rank) if stopped is None else stopped
        used[i] = a_i
        if stopped is None and pvalues[i] <= a_i:
            reject[i] = True
        elif stopped is None:
            stopped = a_i
    return reject, used


def verdict(
    test: Test, *, better: str, alpha: float, margin: float | None, equivalent: bool | None
) -> tuple[Verdict, tuple[float, float] | None, bool]:
    """(verdict, interval at 1 - alpha, within_margin) of one tested row.

    ``equivalent``: TOST's answer at ``alpha`` (None: no margin or not testable). ``margin`` is
    in the row's display unit (percent for ratios, points for accuracy)."""
    if test.p is None or test.interval is None:
        return "inconclusive", None, False
    iv = test.interval(alpha)
    within = False
    if margin is not None:
        m = margin / 100.0
        if test.scale == "ratio":
            lo_b, hi_b = 1 / (1 + m) - 1, m
        else:
            lo_b, hi_b = -m, m
        within = lo_b < iv[0] and iv[1] < hi_b
    if _excludes_zero(iv) and test.p <= alpha and better in ("higher", "lower"):
        up = iv[0] > 0
        return ("improved" if up == (better == "higher") else "regressed"), iv, within
    if equivalent:
        return "equivalent", iv, True
    return "inconclusive", iv, within


def tost_from_interval(test: Test, margin: float, alpha: float) -> bool:
    """Equivalence within +-margin at ``alpha`` from the row's interval: the (1 - 2 alpha)
    interval lies inside the margin (the TOST duality; for ratios the bounds are
    [1/(1+m) - 1, m])."""
    if test.interval is None:
        return False
    lo, hi = test.interval(2 * alpha)
    m = margin / 100.0
    lo_b, hi_b = (1 / (1 + m) - 1, m) if test.scale == "ratio" else (-m, m)
    return lo_b < lo and hi < hi_b


def welch_log(
    a: Sequence[float], b: Sequence[float], alpha: float
) -> tuple[float, float, float, float]:
    """Unpaired Welch t-interval for the ratio of geometric means of ``b`` over ``a`` (per-run
    values of two runs that were not interleaved). Returns (change, low, high, p) as fractions.
    Raises ValueError with fewer than 2 values in an arm or a value <= 0."""
    la, lb = np.log(np.asarray(a, float)), np.log(np.asarray(b, float))
    if la.size < 2 or lb.size < 2:
        raise ValueError("Welch needs at least 2 runs in each arm")
    va, vb = la.var(ddof=1) / la.size, lb.var(ddof=1) / lb.size
    diff = float(lb.mean() - la.mean())
    se = math.sqrt(va + vb)
    if se == 0:
        return (
            float(np.expm1(diff)),
            float(np.expm1(diff)),
            float(np.expm1(diff)),
            (0.0 if diff else 1.0),
        )
    df = (va + vb) ** 2 / (va**2 / (la.size - 1) + vb**2 / (lb.size - 1))
    q = float(sps.t.ppf(1 - alpha / 2, df)) * se
    p = float(2 * sps.t.sf(abs(diff / se), df))
    return float(np.expm1(diff)), float(np.expm1(diff - q)), float(np.expm1(diff + q)), p
