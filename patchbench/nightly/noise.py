"""The runner's noise per metric, learned from the whole history, and what it implies.

Every estimate works on log values (a standard deviation is then a coefficient of variation,
for small values) and is MAD-type (median-based), so one abnormal run, a step between nights or a
slow decline does not inflate it:

- **run** noise (:func:`sigma_within`): the spread between runs of the same variant in the same
  night (a change between nights never enters);
- **level** noise (:func:`sigma_steps`): the first differences of the nightly levels, around their
  median; ``night^2 = max(0, level^2 - run^2 / repeats)`` is what a night adds to its runs' noise
  (the history gate's share);
- a paired ratio of one round has ``sqrt(2)`` times the run noise;
- the **shape** of the run noise: the within-night residuals in run sigmas, the null against
  which :func:`noise_excess` tests tonight's spread (so heavy tails are the runner's, not news).

With fewer than ``min_nights`` usable nights the config's ``run_cv_pct`` is the prior (night
noise unknown); without it nothing is known. :func:`repeats_needed` turns a noise into the repeats
a gate's target needs (the per-night chance from :func:`patchbench.analysis.power.power`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import special as sp
from scipy import stats as st

from patchbench.analysis.power import power
from patchbench.nightly.history import Night

#: median |x_i - x_j| of two independent N(0, sigma^2) values is this times sigma
PAIR_MEDIAN = math.sqrt(2.0) * float(sp.ndtri(0.75))
#: efficiency of a median-type scale relative to the standard deviation: its degrees of freedom
#: are this share of the sample's
MAD_EFFICIENCY = 0.37
#: usable nights before the learned noise replaces the config's run_cv_pct prior
LEARN_MIN_NIGHTS = 7


@dataclass(frozen=True)
class Scale:
    """A learned standard deviation (log scale): ``sigma`` (NaN: unknown), ``df`` its effective
    degrees of freedom, ``n`` the values (or differences) it used."""

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
    """Run-to-run sigma from log values grouped by night: the median of ``|x_i - x_j|`` over every
    pair within a group over ``sqrt(2) Phi^-1(0.75)`` (exact for normal noise). :data:`NO_SCALE`
    when no group has 2 values."""
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
    return Scale(float(np.median(d)) / PAIR_MEDIAN, MAD_EFFICIENCY * dof, int(d.size))


def sigma_steps(series: Sequence[Sequence[float]], *, shared: bool = False) -> Scale:
    """Sigma of one night's level, ``MAD(diff) / sqrt(2)`` of the first differences of every
    series pooled (it estimates ``sqrt(night^2 + run^2 / repeats)``); :data:`NO_SCALE` with fewer
    than 2 differences. ``shared``: the series move together (the variants of one config share
    the machine's drift), so the df count the longest series' differences only."""
    diffs = [np.diff(np.asarray(x, dtype=float)) for x in series if len(x) >= 2]
    d = np.concatenate(diffs) if diffs else np.zeros(0)
    d = d[np.isfinite(d)]
    if d.size < 2:
        return NO_SCALE
    s = float(st.median_abs_deviation(d, scale="normal")) / math.sqrt(2.0)
    n = max(int(np.isfinite(x).sum()) for x in diffs) if shared else int(d.size)
    return Scale(s, MAD_EFFICIENCY * max(n - 1, 0), int(d.size))


def outliers(x: Sequence[float], sigma: float, k: float = 3.0, most: int = 1) -> np.ndarray:
    """The outlier rule: values farther than ``k * sigma`` from the median of ``x``, the farthest
    first, at most ``most`` (and ``(n - 1) // 2``); a boolean mask (True: set aside). Nothing
    without a usable sigma or with fewer than 3 values."""
    a = [float(v) for v in x]
    mask = np.zeros(len(a), dtype=bool)
    if len(a) < 3 or not (math.isfinite(sigma) and sigma > 0):
        return mask
    med = statistics.median(a)
    dev = [abs(v - med) for v in a]
    for i in sorted(range(len(a)), key=lambda i: -dev[i])[: min(most, (len(a) - 1) // 2)]:
        mask[i] = dev[i] > k * sigma
    return mask


def residuals(groups: Sequence[Sequence[float]]) -> np.ndarray:
    """Every group's values minus the group's mean, times ``sqrt(m / (m - 1))`` (m: its values;
    each then has the run variance); groups with fewer than 2 finite values give none."""
    out = [np.zeros(0)]
    for g in groups:
        x = np.asarray([v for v in g if v is not None and math.isfinite(v)], dtype=float)
        if x.size >= 2:
            out.append((x - x.mean()) * math.sqrt(x.size / (x.size - 1)))
    return np.concatenate(out)


#: bootstrap draws of :func:`noise_excess` (p resolves to 1e-4, below a Bonferroni noise_alpha)
DRAWS = 9999
#: fewest residuals a learned noise keeps as its shape (fewer: None, the chi-square)
MIN_SHAPE = 30


def noise_excess(
    x: Sequence[float],
    sigma: float,
    shape: np.ndarray | None = None,
    paired: bool = False,
    trim: tuple[int, float] | None = None,
) -> tuple[float, float]:
    """Is the spread of ``x`` larger than ``sigma``? ``(s / sigma, upper-tail p)``, s the SD.

    With ``shape`` (the runner's residuals in run sigmas) the null is the residual bootstrap
    (Boos & Brownie, "Bootstrap methods for testing homogeneity of variances", Technometrics 31
    (1989) 69-82), which assumes no normal tails: s of ``len(x)`` draws from ``sigma * shape``
    (``paired``: differences of two draws over ``sqrt 2``, x being paired ratios and sigma their
    noise; ``trim = (n, k)``: x is what :func:`outliers` at k sigmas kept of n values, and so are
    the draws), :data:`DRAWS` draws from a fixed seed, ``p = (1 + #{s* >= s}) / (1 + DRAWS)``
    (Davison & Hinkley, "Bootstrap Methods and their Application" (1997), 4.11). Without it,
    ``(n - 1) s^2 / sigma^2 ~ chi2(n - 1)``. (NaN, 1.0) with fewer than 2 values or no sigma."""
    a = np.asarray(x, dtype=float)
    if a.size < 2 or not (math.isfinite(sigma) and sigma > 0):
        return math.nan, 1.0
    r = float(np.std(a, ddof=1)) / sigma
    if shape is None:
        return r, float(sp.chdtrc(a.size - 1, (a.size - 1) * r * r))
    rng = np.random.default_rng(0)
    n, k = trim or (a.size, math.inf)
    draw = rng.choice(shape, (DRAWS, n))
    if paired:
        draw = (draw - rng.choice(shape, (DRAWS, n))) / math.sqrt(2.0)
    if n >= 3 and math.isfinite(k):  # the outlier rule: the farthest beyond k from the median
        dev = np.abs(draw - np.median(draw, axis=1, keepdims=True))
        rows, far = np.arange(DRAWS), np.argmax(dev, axis=1)
        drop = dev[rows, far] > k
        draw[rows[drop], far[drop]] = np.nan
    return r, (1.0 + float(np.sum(np.nanstd(draw, axis=1, ddof=1) >= r))) / (1.0 + DRAWS)


def noise_bound(df: float, q: float) -> float:
    """The factor taking a sigma estimated on ``df`` degrees of freedom to its one-sided ``q``
    chi-square bound, ``sqrt(df / chi2.ppf(1 - q, df))`` (q = 0.1: the lower 90 % bound); 1 for
    df <= 0 or infinite."""
    if not (df > 0) or not math.isfinite(df):
        return 1.0
    return math.sqrt(df / float(sp.chdtri(df, q)))


def detect_power(
    se: float, step: float, threshold: float, level: float, nights: int, n: int | None = None
) -> float:
    """Chance that a gate turns red within ``nights`` independent nights of a ``step`` (log
    scale, > 0): a night's estimate ``~ N(step, se^2)`` must lie beyond ``threshold`` and be
    significant at the one-sided ``level``: the smaller of the two chances
    (:func:`patchbench.analysis.power.power`: a z test, or with ``n`` the paired t test of ``n``
    pairs, exact noncentral t); for the z test that is exact."""
    if not (se > 0):
        return 1.0 if step >= threshold else 0.0
    sig = power(n or 1, step, se * math.sqrt(n or 1), level, alternative="larger",
                dist="t" if n else "normal")  # fmt: skip
    return 1.0 - (1.0 - min(sig, float(sp.ndtr((step - threshold) / se)))) ** nights


def repeats_needed(
    se_of_n: Callable[[int], float],
    step: float,
    threshold: float,
    level: float,
    nights: int = 3,
    target: float = 0.9,
    set_aside: int = 1,
    most: int = 64,
    paired_t: bool = False,
) -> int | None:
    """The fewest repeats n with :func:`detect_power` >= ``target`` when the night is judged on
    ``n - set_aside`` runs (``se_of_n(m)``: a night's standard error from m runs; ``paired_t``:
    judged by the paired t test of them); None when ``most`` do not reach it."""
    for n in range(2 + set_aside, most + 1):
        m = n - set_aside
        if (
            detect_power(se_of_n(m), step, threshold, level, nights, m if paired_t else None)
            >= target
        ):
            return n
    return None


def _pct(sigma: float) -> float | None:
    return 100.0 * math.expm1(sigma) if math.isfinite(sigma) else None


@dataclass
class Noise:
    """A metric's noise (log scale): ``run`` one run's and ``level`` one night's level
    (:class:`Scale`), ``night_sigma`` what a night adds beyond its runs (NaN: unknown),
    ``repeats`` the median runs a night, ``nights`` learned from, ``source`` "learned" or
    "prior" (the config's run_cv_pct), ``shape`` the within-night residuals in run sigmas
    (:func:`residuals`; None: prior, or fewer than :data:`MIN_SHAPE`)."""

    suite: str
    metric: str
    run: Scale
    level: Scale
    night_sigma: float
    repeats: float
    nights: int
    source: Literal["learned", "prior"]
    shape: np.ndarray | None = None

    @property
    def pair_sigma(self) -> float:
        """A paired ratio's sigma: ``sqrt(2)`` run sigmas."""
        return math.sqrt(2.0) * self.run.sigma

    @property
    def df(self) -> float:
        """Degrees of freedom of a test on the run noise, in [1, 200]."""
        return float(min(max(self.run.df, 1.0), 200.0)) if self.source == "learned" else 200.0

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "metric": self.metric,
            "source": self.source,
            "nights": self.nights,
            "repeats": self.repeats,
            "run_cv_pct": _pct(self.run.sigma),
            "pair_cv_pct": _pct(self.pair_sigma),
            "night_cv_pct": _pct(self.night_sigma),
            "df": self.df,
        }


def logs(vals: Sequence[float | None]) -> list[float]:
    """Natural logs of the values that are present and > 0."""
    return [math.log(v) for v in vals if v is not None and v > 0]


def night_level(x: Sequence[float], run_sigma: float) -> float:
    """A night's level: the mean of its log values after the outlier rule (NaN for none)."""
    if not x:
        return math.nan
    a = np.asarray(x, dtype=float)
    return float(np.mean(a[~outliers(a, run_sigma)]))


def usable_nights(nights: Sequence[Night], suite: str, metric: str) -> int:
    """The nights :func:`learn` learns (suite, metric)'s noise from: those with 2+ positive
    values of it in some variant."""
    return sum(
        any(
            len(logs(vals)) >= 2
            for (_v, s, m), vals in n.values.items()
            if (s, m) == (suite, metric)
        )
        for n in nights
    )


def learn(
    nights: Sequence[Night],
    suite: str,
    metric: str,
    *,
    prior_cv_pct: float | None = None,
    min_nights: int = LEARN_MIN_NIGHTS,
) -> Noise | None:
    """The noise of (suite, metric) from ``nights`` (oldest first, tonight left out): learned
    with at least ``min_nights`` usable nights (2+ runs), else the prior ``prior_cv_pct`` (%),
    else None."""
    groups: list[list[float]] = []
    per_variant: dict[str, list[list[float]]] = {}
    for n in nights:
        for (v, s, m), vals in n.values.items():
            if (s, m) != (suite, metric):
                continue
            x = logs(vals)
            if len(x) >= 2:
                groups.append(x)
            per_variant.setdefault(v, []).append(x)
    used = usable_nights(nights, suite, metric)
    if used < min_nights:
        if prior_cv_pct is None:
            return None
        run = Scale(math.log1p(prior_cv_pct / 100.0), 200.0, 0)
        return Noise(suite, metric, run, NO_SCALE, math.nan, math.nan, used, "prior")
    run = sigma_within(groups)
    levels = [[night_level(x, run.sigma) for x in s if x] for s in per_variant.values()]
    level = sigma_steps(levels, shared=True)  # a night's variants share its drift
    rep = float(statistics.median(len(g) for g in groups))
    night = math.sqrt(max(0.0, level.sigma**2 - run.sigma**2 / rep)) if level.ok else math.nan
    if level.ok:
        level = Scale(level.sigma, _pooled_df(level.df, levels, night, level.sigma), level.n)
    res = residuals(groups)
    shape = res / run.sigma if run.sigma > 0 and res.size >= MIN_SHAPE else None
    return Noise(suite, metric, run, level, night, rep, used, "learned", shape)


def _pooled_df(
    df_one: float, series: Sequence[Sequence[float]], night: float, level: float
) -> float:
    """Degrees of freedom of the level variance pooled over m variants' series (``df_one``: one
    series'). Their first differences correlate with ``rho = night^2 / level^2`` (shared drift);
    the mean of m such variance estimates is worth ``m / (1 + (m - 1) rho^2)`` series (the
    covariance of two sample variances of a bivariate normal is ``2 rho^2 s^4 / df``; Anderson,
    "An Introduction to Multivariate Statistical Analysis" (2003), 7.3)."""
    m = sum(1 for x in series if len(x) >= 2)
    if m < 2 or not level > 0:
        return df_one
    rho = min(1.0, (night / level) ** 2)
    return df_one * m / (1.0 + (m - 1) * rho * rho)
