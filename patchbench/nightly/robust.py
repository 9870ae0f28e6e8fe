"""Robust noise estimates and the checks built on them, for the nightly gates (patchbench/nightly/gates/)
and the change-point detector (patchbench/nightly/changepoints.py).

Every function works on log values (so a standard deviation is a coefficient of variation, for
small values) and is pure. The scale estimates are MAD-type (median-based, scipy's
``median_abs_deviation(scale="normal")`` constant), so one abnormal run, a step between nights or a
slow decline does not inflate them:

- :func:`sigma_within`: run-to-run noise from the differences between runs of the SAME night
  (a change between nights never enters);
- :func:`sigma_steps`: night-to-night noise from the first differences of nightly levels, around
  their median (a steady decline only moves that median; a step is one difference among many);
- :func:`outliers`: the explicit outlier rule (a run farther than ``k`` learned sigmas from its
  night's median is set aside; at most one);
- :func:`noise_excess`: is tonight's spread clearly larger than the learned one (chi-square test);
- :func:`detect_power` / :func:`repeats_needed`: the chance that a gate catches a step within a
  number of nights, and the repeats a night needs for a target chance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import special as _sp
from scipy import stats as _st

#: median |x_i - x_j| of two independent N(0, sigma^2) values is this times sigma
_PAIR_MEDIAN = math.sqrt(2.0) * float(_sp.ndtri(0.75))
#: approximate efficiency of a median-type scale estimate relative to the standard deviation (its
#: degrees of freedom are this share of the sample's)
MAD_EFFICIENCY = 0.37


@dataclass(frozen=True)
class Scale:
    """A learned standard deviation (log scale) with its approximate degrees of freedom.

    sigma: the estimate (NaN when nothing could be learned); df: effective degrees of freedom
    (``MAD_EFFICIENCY`` times the sample's); n: values (or differences) it used."""

    sigma: float
    df: float
    n: int

    @property
    def ok(self) -> bool:
        return math.isfinite(self.sigma) and self.df > 0


NO_SCALE = Scale(math.nan, 0.0, 0)


@lru_cache(maxsize=64)
def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    return np.triu_indices(n, 1)


def sigma_within(groups: Sequence[Sequence[float]]) -> Scale:
    """Run-to-run sigma from runs grouped by night: the median of ``|x_i - x_j|`` over every pair
    of runs of the same group, divided by ``sqrt(2) * Phi^-1(0.75)`` (exact for normal noise,
    whatever the group sizes). Groups with fewer than 2 values add nothing.

    groups: per night, its log values. Returns :data:`NO_SCALE` when no group has 2 values.
    """
    diffs: list[np.ndarray] = []
    dof = 0
    for g in groups:
        x = np.asarray([v for v in g if v is not None and math.isfinite(v)], dtype=float)
        if x.size < 2:
            continue
        i, j = _pairs(x.size)
        diffs.append(np.abs(x[i] - x[j]))
        dof += x.size - 1
    if not diffs:
        return NO_SCALE
    d = np.concatenate(diffs)
    return Scale(float(np.median(d)) / _PAIR_MEDIAN, MAD_EFFICIENCY * dof, int(d.size))


def sigma_steps(series: Sequence[Sequence[float]], *, shared: bool = False) -> Scale:
    """Sigma of one night's level from the first differences of consecutive nightly levels:
    ``MAD(diff) / sqrt(2)`` (MAD around the median difference, normal scale), the differences of
    every series pooled (e.g. one series per variant). It estimates
    ``sqrt(night-to-night variance + run variance / repeats)``. Returns :data:`NO_SCALE` with
    fewer than 2 differences in all.

    ``shared``: the series move together from night to night (the variants of one config share
    the machine's drift), so their differences are not independent: the degrees of freedom count
    the differences of the longest series only, ``MAD_EFFICIENCY * (d - 1)``. Pooling them would
    count each night once per variant and overstate the df of the night-to-night variance by up
    to the number of series (a test that rests on it then fires too often; docs/nightly.md,
    "Calibration"). Without ``shared`` every difference counts."""
    diffs = [np.diff(np.asarray(x, dtype=float)) for x in series if len(x) >= 2]
    d = np.concatenate(diffs) if diffs else np.zeros(0)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return NO_SCALE
    s = float(_st.median_abs_deviation(d, scale="normal")) / math.sqrt(2.0)
    n = max(int(np.isfinite(x).sum()) for x in diffs) if shared else int(d.size)
    return Scale(s, MAD_EFFICIENCY * max(n - 1, 0), int(d.size))


def outliers(x: Sequence[float], sigma: float, k: float = 3.0, most: int = 1) -> np.ndarray:
    """The explicit outlier rule: a value farther than ``k * sigma`` from the median of ``x`` is
    abnormal; at most ``most`` values (and at most ``(n - 1) // 2``) are set aside, the farthest
    first, so one abnormal run never decides alone while a night that is noisy throughout keeps
    its spread. Returns a boolean mask (True: set aside). With no usable sigma nothing is set
    aside."""
    a = [float(v) for v in x]
    mask = np.zeros(len(a), dtype=bool)
    if len(a) < 3 or not (math.isfinite(sigma) and sigma > 0):
        return mask
    med = statistics.median(a)
    dev = [abs(v - med) for v in a]
    for i in sorted(range(len(a)), key=lambda i: -dev[i])[: min(most, (len(a) - 1) // 2)]:
        mask[i] = dev[i] > k * sigma
    return mask


def noise_excess(x: Sequence[float], sigma: float) -> tuple[float, float]:
    """Is the spread of ``x`` larger than ``sigma``? The one-sided chi-square test of the sample
    variance: ``(n - 1) s^2 / sigma^2 ~ chi2(n - 1)`` under "the noise is sigma".

    Returns (``s / sigma``, its upper-tail p-value); (NaN, 1.0) with fewer than 2 values or no
    sigma."""
    a = np.asarray(x, dtype=float)
    if a.size < 2 or not (math.isfinite(sigma) and sigma > 0):
        return math.nan, 1.0
    s = float(np.std(a, ddof=1))
    stat = (a.size - 1) * s * s / (sigma * sigma)
    return s / sigma, float(_sp.chdtrc(a.size - 1, stat))


def noise_bound(df: float, q: float) -> float:
    """The factor that takes a sigma estimated with ``df`` degrees of freedom to its one-sided
    ``q`` chi-square bound: ``sqrt(df / chi2.ppf(1 - q, df))`` (below 1: the lower bound, e.g.
    q = 0.1 gives the lower 90 % bound); 1 with df <= 0 or infinite."""
    if not (df > 0) or not math.isfinite(df):
        return 1.0
    return math.sqrt(df / float(_sp.chdtri(df, q)))


def detect_power(se: float, step: float, threshold: float, level: float, nights: int) -> float:
    """Chance that a gate turns red within ``nights`` nights of a step, each night independent.

    A night is red when its estimate (``~ N(step, se^2)``, log scale, bad direction positive) is
    both beyond ``threshold`` and significant at the one-sided ``level`` (a normal approximation
    of the gates' t tests). ``se``: the standard error of one night's estimate."""
    if not (se > 0):
        return 1.0 if step >= threshold else 0.0
    crit = max(threshold, float(_sp.ndtri(1.0 - level)) * se)
    one = float(_sp.ndtr((step - crit) / se))
    return 1.0 - (1.0 - one) ** nights


def repeats_needed(
    se_of_n: Callable[[int], float],
    step: float,
    threshold: float,
    level: float,
    nights: int = 3,
    target: float = 0.9,
    set_aside: int = 1,
    most: int = 64,
) -> int | None:
    """The fewest repeats per night with :func:`detect_power` >= ``target``, keeping that power
    after ``set_aside`` runs are set aside by the outlier rule (so the night is judged on
    ``n - set_aside`` runs); None when even ``most`` repeats do not reach it (e.g. when
    night-to-night noise alone is too large). ``se_of_n(n)``: the standard error of one night's
    estimate from n runs."""
    for n in range(2 + set_aside, most + 1):
        if detect_power(se_of_n(n - set_aside), step, threshold, level, nights) >= target:
            return n
    return None


__all__ = [
    "Scale",
    "NO_SCALE",
    "MAD_EFFICIENCY",
    "sigma_within",
    "sigma_steps",
    "outliers",
    "noise_excess",
    "detect_power",
    "noise_bound",
    "repeats_needed",
]
