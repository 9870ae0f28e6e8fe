"""The history check: tonight's runs of a variant (stock included) against earlier nights'
levels, and the choice of the clean reference nights (patchbench/gates/__init__.py describes
the gate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from patchbench import stats
from patchbench.gates.checks import TestStat, _Check, _cv, _logs, _vals, beyond
from patchbench.gates.settings import Gate, NightlySettings
from patchbench.history import Key, Night
from patchbench.noise import Noise
from patchbench.robust import outliers


def _history(
    values: Sequence[float | None],
    window: Sequence[Night],
    key: Key,
    bad: int,
    settings: NightlySettings,
    noise: Noise | None = None,
    cache: dict | None = None,
) -> _Check | None:
    """The history check: tonight's log values (runs beyond ``outlier_k`` run sigmas from their
    median set aside) against the window's nightly levels (each night's runs the same way).
    ``known`` (learned noise with a night-to-night part): tonight's mean minus the mean of the K
    levels, variance ``night^2 + run^2 / n`` for tonight plus the mean of the K nights' own over
    K, Satterthwaite's df; ``own``: ``history_test`` (prediction t on the K levels, or Welch)."""
    t = np.asarray(_logs(values), dtype=float)
    if t.size == 0:
        return None
    sr = noise.run.sigma if noise is not None else math.nan
    mask = outliers(t, sr, settings.outlier_k)
    tu = t[~mask]
    nights = [x for x in (_kept_logs(n, key, sr, settings, cache) for n in window) if x.size]
    levels = [float(x.mean()) for x in nights]
    own = None
    if settings.history_test == "nights" and len(levels) >= 2:
        k = len(levels)
        own = TestStat(
            stats.prediction_t(tu, levels),
            bad,
            f"tonight vs {k} nightly means (prediction t, df={k - 1})",
        )
    elif settings.history_test == "welch" and tu.size >= 2 and sum(x.size for x in nights) >= 2:
        ref = np.concatenate(nights)
        own = TestStat(
            stats.welch_t(tu, ref),
            bad,
            f"Welch t on log values ({tu.size} runs vs {ref.size} runs of {len(nights)} nights)",
        )
    known = None
    if (
        noise is not None
        and noise.source == "learned"
        and math.isfinite(noise.night_sigma)
        and len(levels) >= 2
    ):
        k, sn2, sr2 = len(levels), noise.night_sigma**2, sr * sr
        a = sn2 * (1.0 + 1.0 / k)  # night-to-night part (df of the level estimate)
        b = sr2 / tu.size + sum(sr2 / x.size for x in nights) / (k * k)  # run part
        df_a = max(noise.level.df, 1.0)
        df = (a + b) ** 2 / ((a * a) / df_a + (b * b) / noise.df) if a + b > 0 else noise.df
        tt = stats.TTest(
            float(tu.mean()) - float(np.mean(levels)), math.sqrt(a + b), df, int(tu.size)
        )
        known = TestStat(
            tt,
            bad,
            f"tonight vs {k} nightly levels, learned noise: run {_cv(sr)}, night "
            f"{_cv(noise.night_sigma)} (df={df:.0f})",
        )
    return _Check(known, own, tu, int(mask.sum()))


def _kept_logs(
    night: Night, key: Key, sigma: float, settings: NightlySettings, cache: dict | None
) -> np.ndarray:
    """A night's log values of ``key`` that the outlier rule keeps (memoised in ``cache``)."""
    ck = (night.run_id, key)
    if cache is not None and ck in cache:
        return cache[ck]
    x = np.asarray(_logs(_vals(night, key)), dtype=float)
    x = x[~outliers(x, sigma, settings.outlier_k)]
    if cache is not None:
        cache[ck] = x
    return x


def _clean_nights(
    nights: Sequence[Night],
    key: Key,
    bad: int,
    gate: Gate,
    settings: NightlySettings,
    noise: Noise | None = None,
    cache: dict | None = None,
) -> list[Night]:
    """The nights (oldest first) that may serve as reference: a night that was itself off the
    clean nights before it, in EITHER direction (one-sided p <= the family alpha and beyond the
    threshold, worse or better), is left out, so one bad night does not widen the reference and
    hide the next one, and a clean night after it is judged against clean nights. A step that
    persists stays red until ``history_since`` is moved past it (accepting the new level).

    The rule is symmetric so that it leaves the reference unbiased when nights drift: leaving out
    only the nights that looked like regressions keeps the good tail of the drift and drops the
    bad one, which moves the reference mean the good way and makes an ordinary night look like a
    regression (a trimmed mean must trim both tails to stay unbiased for a symmetric
    distribution; e.g. Huber & Ronchetti, "Robust Statistics" (2009), 3.3)."""
    kept: list[Night] = []
    for n_ in nights:
        if len(kept) >= settings.min_history_nights:
            c = _history(_vals(n_, key), kept[-settings.window_nights :], key, bad, settings, noise)
            t = c.pick(False) if c is not None else None
            if t is not None and _off(t, gate.threshold_pct, settings.family_alpha):
                continue
        kept.append(n_)
    return kept


def _off(t: TestStat, threshold_pct: float, alpha: float) -> bool:
    """A night significantly beyond the threshold in either direction (one-sided at ``alpha``
    each way)."""
    if t.p <= alpha and beyond(t, threshold_pct):
        return True
    good = TestStat(t.t, -t.bad, t.name)
    return good.p <= alpha and beyond(good, threshold_pct)
