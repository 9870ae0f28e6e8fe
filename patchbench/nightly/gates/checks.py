"""The one-sided tests on log values (pure; the methods are patchbench.stats): paired,
nights and Welch tests, the threshold rules, and :class:`_Check` (one night's test of one key
in both forms, on the known noise and on tonight's own spread).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from patchbench import stats
from patchbench.nightly.history import Key, Night


@dataclass
class TestStat:
    """One one-sided test. ``bad`` is the sign of a regression on the log scale (+1 for a
    lower-is-better metric, -1 for higher-is-better); ``t``: the t test
    (:class:`patchbench.stats.TTest`: mean the estimated log change, se, df); ``p``: its
    one-sided p-value in the bad direction."""

    t: stats.TTest
    bad: int
    name: str
    p: float = field(init=False)

    def __post_init__(self) -> None:
        self.p = self.t.p_value("greater" if self.bad > 0 else "less")

    @property
    def mean(self) -> float:
        return self.t.mean

    @property
    def df(self) -> float:
        return self.t.df

    def bound(self, alpha: float) -> float:
        """The one-sided ``1 - alpha`` bound of the log change in the bad direction."""
        return self.t.bound(alpha, self.bad)


def _logs(values: Sequence[float | None]) -> list[float]:
    """Natural logs of the values that are present and > 0."""
    return [math.log(v) for v in values if v is not None and v > 0]


def paired_test(
    baseline: Sequence[float | None], variant: Sequence[float | None], bad: int
) -> TestStat | None:
    """Paired one-sided t-test on ``log(variant / baseline)`` by repeat index (None: missing;
    :func:`patchbench.stats.paired_t`).

    Returns None with fewer than 2 complete pairs or a non-positive value.
    """
    d = [
        math.log(v / b)
        for b, v in zip(baseline, variant, strict=False)
        if b is not None and v is not None and b > 0 and v > 0
    ]
    if len(d) < 2:
        return None
    return TestStat(stats.paired_t(d), bad, f"paired t on log ratios (n={len(d)})")


def nights_test(
    tonight: Sequence[float], nights: Sequence[Sequence[float]], bad: int
) -> TestStat | None:
    """Tonight's mean log value against K earlier nights' mean log values (unpaired;
    :func:`patchbench.stats.prediction_t`: K - 1 degrees of freedom, night-to-night drift counts
    as noise). Returns None with fewer than 2 nights or no run tonight.
    """
    t = _logs(tonight)
    m = [float(np.mean(logs)) for logs in map(_logs, nights) if logs]
    if not t or len(m) < 2:
        return None
    k = len(m)
    return TestStat(
        stats.prediction_t(t, m), bad, f"tonight vs {k} nightly means (prediction t, df={k - 1})"
    )


def welch_test(
    tonight: Sequence[float], nights: Sequence[Sequence[float]], bad: int
) -> TestStat | None:
    """Welch's t-test of tonight's per-run log values against every run of the K nights
    (:func:`patchbench.stats.welch_t`)."""
    a = _logs(tonight)
    b = _logs([v for n in nights for v in n])
    if len(a) < 2 or len(b) < 2:
        return None
    return TestStat(
        stats.welch_t(a, b),
        bad,
        f"Welch t on log values ({len(a)} runs vs {len(b)} runs of {len(nights)} nights)",
    )


def _log_threshold(threshold_pct: float, bad: int) -> float:
    """The threshold on the log scale in the bad direction (negative for higher-is-better)."""
    frac = threshold_pct / 100.0
    return math.log1p(frac) if bad > 0 else (math.log1p(-frac) if frac < 1 else -math.inf)


def beyond(test: TestStat, threshold_pct: float) -> bool:
    """True when the estimated change is at least ``threshold_pct`` in the bad direction."""
    lt = _log_threshold(threshold_pct, test.bad)
    return test.mean >= lt if test.bad > 0 else test.mean <= lt


def shown_not_worse(test: TestStat, threshold_pct: float, pass_alpha: float) -> bool:
    """True when the one-sided bound excludes a change as bad as the threshold."""
    lt = _log_threshold(threshold_pct, test.bad)
    b = test.bound(pass_alpha)
    return b < lt if test.bad > 0 else b > lt


def _vals(night: Night, key: Key) -> list[float | None]:
    return list(night.values.get(key, []))


@dataclass
class _Check:
    """One night's test of one key in both forms: ``known`` rests on the learned (or prior)
    noise, ``own`` on tonight's spread; ``kept``: the values whose spread is checked against the
    noise (paired log ratios, or log values), after the outlier rule set ``set_aside`` aside."""

    known: TestStat | None
    own: TestStat | None
    kept: np.ndarray
    set_aside: int = 0

    def pick(self, noisy: bool) -> TestStat | None:
        """``own`` when tonight is noisier than the noise (or nothing is known), else ``known``."""
        if self.known is None or (noisy and self.own is not None):
            return self.own
        return self.known


def _cv(sigma: float) -> str:
    return f"{100 * math.expm1(sigma):.2g} %"
