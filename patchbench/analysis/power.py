"""Power and sample size, one copy each: how many paired repeats (or questions) a test needs, and
what a given number of them can show.

- The paired t test (and the one-sample z test, ``dist="normal"``): statsmodels'
  ``TTestPower`` / ``normal_power``, the exact noncentral t (Cohen 1988, *Statistical Power
  Analysis for the Behavioral Sciences*, ch. 2).
- Equivalence by TOST: the exact power of the two one-sided t tests, integrating over the
  sampling distribution of the standard deviation (Owen 1965, *Biometrika* 52: 437-446; the
  method of Schuirmann 1987's procedure as PowerTOST computes it).

Effects, margins and standard deviations share one scale (log ratios for run metrics, points for
accuracy); ``alpha`` is the test's level (two-sided for ``alternative="two-sided"``).
"""

from __future__ import annotations

import functools
import math
from typing import Literal

Alternative = Literal["two-sided", "larger"]
Dist = Literal["t", "normal"]


def power(
    n: int,
    effect: float,
    sd: float,
    alpha: float,
    *,
    alternative: Alternative = "two-sided",
    dist: Dist = "t",
) -> float:
    """Power in [0, 1] of the paired t test (``dist="normal"``: the z test) of ``n`` pairs at
    level ``alpha`` when the true mean difference is ``effect`` and the pair sd ``sd`` (> 0);
    ``alternative="larger"`` is one-sided in the direction of ``|effect|``. Raises ValueError for
    ``n`` < 2 with the t test."""
    from statsmodels.stats.power import TTestPower, normal_power

    d = abs(effect) / sd
    if dist == "normal":
        alt = "two-sided" if alternative == "two-sided" else "larger"
        return float(normal_power(d, n, alpha, alternative=alt))
    if n < 2:
        raise ValueError(f"a paired t test needs 2 or more pairs, not {n}")
    return float(TTestPower().power(effect_size=d, nobs=n, alpha=alpha, alternative=alternative))


def tost_power(
    n: int, effect: float, margin: float, sd: float, alpha: float, *, dist: Dist = "t"
) -> float:
    """Power in [0, 1] of TOST at level ``alpha`` (each one-sided test) with ``n`` pairs to show
    the mean difference inside (-``margin``, ``margin``) when it is truly ``effect``. ``dist="t"``:
    exact, by quadrature over the sd estimate (Owen 1965); ``"normal"``: the sd known."""
    from scipy import integrate
    from scipy import stats as sps

    se = sd / math.sqrt(n)
    if dist == "normal":
        q = sps.norm.ppf(1 - alpha) * se
        hi, lo = margin - q, -margin + q
        return float(max(0.0, sps.norm.cdf((hi - effect) / se) - sps.norm.cdf((lo - effect) / se)))
    df = n - 1
    crit = sps.t.ppf(1 - alpha, df)

    def given(u: float) -> float:  # u = s / sd, with df u^2 ~ chi-square(df)
        w = crit * u * se
        if margin - w <= -margin + w:
            return 0.0
        p = sps.norm.cdf((margin - w - effect) / se) - sps.norm.cdf((-margin + w - effect) / se)
        return p * sps.chi2.pdf(df * u * u, df) * 2 * df * u

    upper = margin / (crit * se)  # beyond it the acceptance region is empty
    return float(min(1.0, integrate.quad(given, 0.0, upper, limit=200)[0]))


@functools.lru_cache(maxsize=4096)  # pure; a report asks the same rows once per rendering
def n_needed(
    effect: float,
    sd: float,
    alpha: float,
    target: float,
    *,
    margin: float | None = None,
    alternative: Alternative = "two-sided",
    dist: Dist = "t",
    floor: int = 2,
    cap: int = 100_000,
) -> int | None:
    """The fewest pairs n (``floor`` <= n <= ``cap``) whose power reaches ``target``: to show
    ``effect`` (:func:`power`) or, with ``margin``, equivalence within it (:func:`tost_power`);
    power grows with n, so a doubling search then bisection. None when ``cap`` pairs do not
    reach it, or when it cannot happen (``effect`` 0 without a margin, or ``|effect|`` at or
    past the margin); ``floor`` when ``sd`` is 0."""
    floor = max(floor, 2 if dist == "t" else 1)
    impossible = effect == 0 if margin is None else abs(effect) >= margin
    if impossible:
        return None
    if sd == 0:
        return floor  # no noise: the smallest sample decides
    if margin is None:
        if not math.isfinite(effect / sd):
            return None

        def ok(n: int) -> bool:
            return power(n, effect, sd, alpha, alternative=alternative, dist=dist) >= target
    else:

        def ok(n: int) -> bool:
            return tost_power(n, effect, margin, sd, alpha, dist=dist) >= target

    if ok(floor):
        return floor
    lo, hi = floor, floor
    while not ok(hi):
        if hi >= cap:
            return None
        lo, hi = hi, min(2 * hi, cap)
    while hi - lo > 1:  # not ok(lo), ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def detectable_effect(
    n: int, sd: float, alpha: float, target: float, *, alternative: Alternative = "larger"
) -> float:
    """The smallest effect (> 0, the scale of ``sd``) that the paired t test of ``n`` pairs (>= 2)
    shows at ``alpha`` with power ``target`` (statsmodels' ``solve_power``)."""
    from statsmodels.stats.power import TTestPower

    d = TTestPower().solve_power(nobs=n, alpha=alpha, power=target, alternative=alternative)
    return float(d) * sd


def detectable_shift(
    se: float, df: float, alpha: float, target: float, *, alternative: Alternative = "larger"
) -> float:
    """The smallest shift (> 0, the scale of ``se``) that a t test whose estimate has standard
    error ``se`` on ``df`` degrees of freedom (any df > 0, e.g. Satterthwaite's) shows at
    ``alpha`` with power ``target``: the exact noncentral t (Cohen 1988, ch. 2), as
    :func:`detectable_effect` of ``df + 1`` pairs whose sd is ``se sqrt(df + 1)`` (the same
    noncentrality ``shift / se`` and the same df)."""
    m = df + 1.0
    return detectable_effect(m, se * math.sqrt(m), alpha, target, alternative=alternative)  # type: ignore[arg-type]
