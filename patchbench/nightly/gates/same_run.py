"""The same-run check: the patch against stock in tonight's interleaved rounds (paired log
ratios; patchbench/nightly/gates/__init__.py describes the gate).
"""

from __future__ import annotations

import math

import numpy as np

from patchbench import stats
from patchbench.nightly.gates.checks import TestStat, _Check, _cv
from patchbench.nightly.gates.settings import NightlySettings
from patchbench.nightly.history import Key, Night
from patchbench.nightly.noise import Noise, pair_logs
from patchbench.nightly.robust import outliers


def _same_run(
    tonight: Night, key: Key, bad: int, noise: Noise | None, settings: NightlySettings
) -> _Check | None:
    """The same-run check: paired log ratios of tonight's rounds, pairs beyond ``outlier_k``
    pair sigmas from their median set aside; ``known``: their mean against the pair noise
    (t with the noise's df), ``own``: the paired t test."""
    d = np.asarray(pair_logs(tonight, key), dtype=float)
    if d.size < 2:
        return None
    sig = noise.pair.sigma if noise is not None else math.nan
    mask = outliers(d, sig, settings.outlier_k)
    du = d[~mask]
    own = TestStat(stats.paired_t(du), bad, f"paired t on log ratios (n={du.size})")
    known = None
    if noise is not None and math.isfinite(sig):
        t = stats.TTest(float(du.mean()), sig / math.sqrt(du.size), noise.df, int(du.size))
        known = TestStat(
            t,
            bad,
            f"paired log ratios vs the {noise.source} pair noise {_cv(sig)} "
            f"(n={du.size}, df={noise.df:.0f})",
        )
    return _Check(known, own, du, int(mask.sum()))
