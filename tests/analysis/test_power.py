"""patchbench.analysis.power against independent computations: scipy's noncentral t and normal
distributions directly, and a seeded simulation of TOST."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from patchbench.analysis import power


def _nct_power(n: int, effect: float, sd: float, alpha: float, two_sided: bool = True) -> float:
    df, nc = n - 1, math.sqrt(n) * abs(effect) / sd
    if not two_sided:
        return float(sps.nct.sf(sps.t.ppf(1 - alpha, df), df, nc))
    crit = sps.t.ppf(1 - alpha / 2, df)
    return float(sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc))


@pytest.mark.parametrize(
    ("n", "effect", "sd", "alpha"), [(5, 0.05, 0.04, 0.05), (12, -0.02, 0.03, 0.01)]
)
def test_t_power_is_the_noncentral_t(n, effect, sd, alpha):
    assert power.power(n, effect, sd, alpha) == pytest.approx(_nct_power(n, effect, sd, alpha))
    assert power.power(n, effect, sd, alpha, alternative="larger") == pytest.approx(
        _nct_power(n, effect, sd, alpha, two_sided=False)
    )


def test_normal_power_by_hand():
    # z test, two-sided: Phi(d sqrt(n) - z) + Phi(-d sqrt(n) - z), z = Phi^-1(0.975)
    d, n, z = 0.5, 20, sps.norm.ppf(0.975)
    want = sps.norm.cdf(d * math.sqrt(n) - z) + sps.norm.cdf(-d * math.sqrt(n) - z)
    assert power.power(n, 0.5, 1.0, 0.05, dist="normal") == pytest.approx(want)
    with pytest.raises(ValueError, match="2 or more pairs"):
        power.power(1, 0.5, 1.0, 0.05)


def test_tost_power_matches_a_simulation():
    """TOST at alpha 0.05 with 8 pairs, true effect 0.01, margin 0.05, sd 0.04: the share of
    200,000 simulated samples where both one-sided t tests reject."""
    n, effect, margin, sd, alpha = 8, 0.01, 0.05, 0.04, 0.05
    rng = np.random.default_rng(7)
    x = rng.normal(effect, sd, size=(200_000, n))
    m, se = x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n)
    crit = sps.t.ppf(1 - alpha, n - 1)
    shown = ((m - crit * se) > -margin) & ((m + crit * se) < margin)
    assert power.tost_power(n, effect, margin, sd, alpha) == pytest.approx(shown.mean(), abs=0.005)


def test_tost_power_with_known_sd_by_hand():
    n, effect, margin, sd, alpha = 10, 0.0, 1.0, 1.0, 0.05
    se, q = sd / math.sqrt(n), sps.norm.ppf(1 - alpha)
    want = sps.norm.cdf((margin - q * se - effect) / se) - sps.norm.cdf((-margin + q * se) / se)
    assert power.tost_power(n, effect, margin, sd, alpha, dist="normal") == pytest.approx(want)


def test_n_needed_is_the_fewest_reaching_the_target():
    n = power.n_needed(0.05, 0.06, 0.05, 0.8, floor=3)
    assert _nct_power(n - 1, 0.05, 0.06, 0.05) < 0.8 <= _nct_power(n, 0.05, 0.06, 0.05)
    m = power.n_needed(0.005, 0.04, 0.05, 0.8, margin=0.05, floor=3)
    assert power.tost_power(m - 1, 0.005, 0.05, 0.04, 0.05) < 0.8
    assert power.tost_power(m, 0.005, 0.05, 0.04, 0.05) >= 0.8
    assert power.n_needed(0.05, 0.06, 0.05, 0.8, floor=n + 5) == n + 5  # the floor holds
    assert power.n_needed(0.001, 0.5, 0.05, 0.8, cap=50) is None  # past the cap
    assert power.n_needed(0.0, 0.5, 0.05, 0.8) is None  # no effect, no margin
    assert power.n_needed(0.06, 0.5, 0.05, 0.8, margin=0.05) is None  # outside the margin
    assert power.n_needed(0.05, 0.0, 0.05, 0.8, floor=3) == 3  # no noise: the floor decides
    assert power.n_needed(0.01, 0.0, 0.05, 0.8, margin=0.05, floor=3) == 3


def test_detectable_effect_has_the_target_power():
    e = power.detectable_effect(10, 0.04, 0.05, 0.8)
    assert _nct_power(10, e, 0.04, 0.05, two_sided=False) == pytest.approx(0.8, abs=1e-4)
