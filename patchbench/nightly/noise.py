"""The runner's noise per metric, learned from the whole history (patchbench/nightly/robust.py's methods).

For one (suite, metric) and the nights recorded before tonight (oldest first):

- **run** noise: the spread between runs of the same variant in the same night
  (:func:`patchbench.nightly.robust.sigma_within` over every night and variant);
- **pair** noise: the spread of the paired log ratios ``log(variant / baseline)`` of one round
  within a night, every non-baseline variant (A/A copies included: an A/A night measures exactly
  this), the same way; what the same-run gate's test rests on;
- **night** noise: how much a night's level moves beyond its run noise, from the first
  differences of the nightly levels of every variant (:func:`patchbench.nightly.robust.sigma_steps`):
  ``night^2 = max(0, level^2 - run^2 / repeats)``; what the history gate adds to run noise. Its
  degrees of freedom: one variant's series' (:func:`patchbench.nightly.robust.sigma_steps` with
  ``shared``) times what the other variants add, which depends on how much of a level's
  movement is the night's drift, shared by every variant (:func:`_pooled_df`).

With fewer than ``min_nights`` usable nights (at least 2 runs of the metric) the config's
``run_cv_pct`` is the prior: run noise ``log(1 + cv)``, pair noise ``sqrt(2)`` times that, night
noise unknown; without a prior nothing is known (the gates then use tonight's own spread).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from patchbench.nightly.history import Night
from patchbench.nightly.robust import NO_SCALE, Scale, outliers, sigma_steps, sigma_within

#: usable nights before the learned noise replaces the config's run_cv_pct prior
LEARN_MIN_NIGHTS = 7


def _pct(sigma: float) -> float | None:
    return 100.0 * math.expm1(sigma) if math.isfinite(sigma) else None


@dataclass
class Noise:
    """A metric's noise (log scale; ``*_cv_pct`` give it as a CV in percent).

    run / pair / level: :class:`patchbench.nightly.robust.Scale` of one run, one paired log ratio and one
    night's level; night_sigma: night-to-night sigma beyond the run noise (NaN: unknown);
    repeats: the median repeats per night in the history; nights: nights it was learned from;
    source: "learned" (history) or "prior" (the config's run_cv_pct)."""

    suite: str
    metric: str
    run: Scale
    pair: Scale
    level: Scale
    night_sigma: float
    repeats: float
    nights: int
    source: Literal["learned", "prior"]

    @property
    def df(self) -> float:
        """Degrees of freedom for a test that treats ``run``/``pair`` as known (capped at 200)."""
        d = min(self.run.df, self.pair.df) if self.source == "learned" else 200.0
        return float(min(max(d, 1.0), 200.0))

    def to_json(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "metric": self.metric,
            "source": self.source,
            "nights": self.nights,
            "repeats": self.repeats,
            "run_cv_pct": _pct(self.run.sigma),
            "pair_cv_pct": _pct(self.pair.sigma),
            "night_cv_pct": _pct(self.night_sigma),
            "df": self.df,
        }


def _logs(vals: Sequence[float | None]) -> list[float]:
    return [math.log(v) for v in vals if v is not None and v > 0]


def night_level(logs: Sequence[float], run_sigma: float) -> float:
    """A night's level: the mean of its log values after the outlier rule
    (:func:`patchbench.nightly.robust.outliers` at the run sigma). NaN when there is none."""
    if not logs:
        return math.nan
    a = np.asarray(logs, dtype=float)
    return float(np.mean(a[~outliers(a, run_sigma)]))


def pair_logs(night: Night, key: tuple[str, str, str]) -> list[float]:
    """The paired log ratios ``log(variant / baseline)`` of one night, by repeat index."""
    base = night.values.get((night.baseline,) + key[1:], [])
    return [
        math.log(v / b)
        for b, v in zip(base, night.values.get(key, []), strict=False)
        if b is not None and v is not None and b > 0 and v > 0
    ]


def learn(
    nights: Sequence[Night],
    suite: str,
    metric: str,
    *,
    prior_cv_pct: float | None = None,
    min_nights: int = LEARN_MIN_NIGHTS,
) -> Noise | None:
    """The noise of (suite, metric) from ``nights`` (oldest first; tonight left out).

    Returns the learned :class:`Noise` with at least ``min_nights`` usable nights, else the prior
    from ``prior_cv_pct`` (percent), else None.
    """
    groups: list[list[float]] = []
    pairs: list[list[float]] = []
    per_variant: dict[str, list[list[float]]] = {}
    reps: list[int] = []
    used = 0
    for n in nights:
        usable = False
        for (v, s, m), vals in n.values.items():
            if s != suite or m != metric:
                continue
            logs = _logs(vals)
            if len(logs) >= 2:
                usable = True
                groups.append(logs)
                reps.append(len(logs))
            per_variant.setdefault(v, []).append(logs)
            if v != n.baseline:
                d = pair_logs(n, (v, s, m))
                if len(d) >= 2:
                    pairs.append(d)
        used += usable
    if used < min_nights:
        if prior_cv_pct is None:
            return None
        r = math.log1p(prior_cv_pct / 100.0)
        return Noise(
            suite,
            metric,
            Scale(r, 200.0, 0),
            Scale(math.sqrt(2.0) * r, 200.0, 0),
            NO_SCALE,
            math.nan,
            math.nan,
            used,
            "prior",
        )
    run = sigma_within(groups)
    pair = sigma_within(pairs) if pairs else NO_SCALE
    if not pair.ok:
        pair = Scale(math.sqrt(2.0) * run.sigma, run.df, 0)
    levels = [
        [night_level(logs, run.sigma) for logs in series if logs] for series in per_variant.values()
    ]
    # the variants of a night share its drift: their level series count as one for the df
    level = sigma_steps(levels, shared=True)
    rep = float(statistics.median(reps)) if reps else math.nan
    night = (
        math.sqrt(max(0.0, level.sigma**2 - run.sigma**2 / rep)) if level.ok and rep else math.nan
    )
    if level.ok and math.isfinite(night):
        level = Scale(level.sigma, _pooled_df(level.df, levels, night, level.sigma), level.n)
    return Noise(suite, metric, run, pair, level, night, rep, used, "learned")


def _pooled_df(
    df_one: float, series: Sequence[Sequence[float]], night: float, level: float
) -> float:
    """Degrees of freedom of the level variance pooled over the variants' series (``df_one``:
    one series'). The variants of a night share its drift, so their first differences
    correlate with ``rho = night^2 / level^2`` (drift over drift plus run noise); the mean of m
    variance estimates with that correlation has variance ``(2 s^4 / df_one) (1 + (m - 1)
    rho^2) / m`` (the covariance of two sample variances of a bivariate normal sample is
    ``2 rho^2 s^4 / df``; Anderson, "An Introduction to Multivariate Statistical Analysis"
    (2003), 7.3), so ``df = df_one m / (1 + (m - 1) rho^2)``: one series' df when the drift is
    everything, m times it when the nights do not move beyond their run noise."""
    m = sum(1 for x in series if len(x) >= 2)
    if m < 2 or not level > 0:
        return df_one
    rho = min(1.0, (night / level) ** 2)
    return df_one * m / (1.0 + (m - 1) * rho * rho)


__all__ = ["Noise", "learn", "night_level", "pair_logs", "LEARN_MIN_NIGHTS"]
