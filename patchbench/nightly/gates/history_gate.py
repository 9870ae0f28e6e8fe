"""The history check: tonight's runs of a variant (stock included) against earlier nights'
levels, and the choice of the clean reference nights (patchbench/nightly/gates/__init__.py describes
the gate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from patchbench import stats
from patchbench.nightly.gates.checks import TestStat, _Check, _cv, _logs, _vals, beyond
from patchbench.nightly.gates.settings import Gate, NightlySettings
from patchbench.nightly.history import Key, Night
from patchbench.nightly.noise import Noise
from patchbench.nightly.robust import outliers


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
        var, df = _known_variance(noise, tu.size, [x.size for x in nights])
        k = len(levels)
        tt = stats.TTest(
            float(tu.mean()) - float(np.mean(levels)), math.sqrt(var), df, int(tu.size)
        )
        known = TestStat(
            tt,
            bad,
            f"tonight vs {k} nightly levels, learned noise: run {_cv(sr)}, night "
            f"{_cv(noise.night_sigma)} (df={df:.0f})",
        )
    return _Check(known, own, tu, int(mask.sum()))


def _known_variance(noise: Noise, n: int, sizes: Sequence[int]) -> tuple[float, float]:
    """(variance, degrees of freedom) of tonight's mean log value minus the mean of K reference
    levels (``sizes``: each reference night's runs; ``n``: tonight's runs), from the learned
    noise (log scale, variance in log units squared):
    ``night^2 (1 + 1/K) + run^2 / n + sum(run^2 / n_i) / K^2``.

    Its degrees of freedom are Satterthwaite's for a linear combination of independently
    estimated variances (Satterthwaite, "An approximate distribution of estimates of variance
    components", Biometrics Bulletin 2 (1946) 110-114), counted on what was estimated: the
    night-to-night variance is not measured by itself but as ``night^2 = level^2 - run^2 /
    repeats`` (:mod:`patchbench.nightly.noise`), so the variance is ``(1 + 1/K) level^2 + c run^2`` with
    ``c = 1/n + sum(1/n_i)/K^2 - (1 + 1/K)/repeats``, ``level^2`` on ``noise.level.df`` (the
    nights' first differences) and ``run^2`` on ``noise.df``. A night-to-night part that is a
    small share of ``level^2`` is as uncertain as ``level^2`` itself: counting it on the level's
    df as if it stood alone, beside the run part's hundreds, would claim far more degrees of
    freedom than ~10 nights hold, and the test would fire too often on a drifting runner
    (docs/nightly.md, "false red nights under drift"). When the nights move no more than their
    run noise explains (``night`` estimated 0) the test rests on the run noise alone, on its df.
    """
    k = len(sizes)
    f = 1.0 + 1.0 / k
    sr2 = noise.run.sigma**2
    inv = sum(1.0 / m for m in sizes) / (k * k)
    run_part = sr2 * (1.0 / n + inv)
    if not noise.night_sigma > 0:
        return run_part, noise.df
    level2 = f * noise.level.sigma**2
    rest = sr2 * (1.0 / n + inv - f / noise.repeats)
    var = level2 + rest  # = (1 + 1/K) night^2 + run_part
    den = level2 * level2 / max(noise.level.df, 1.0) + rest * rest / noise.df
    return var, (var * var / den if den > 0 else noise.df)


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
