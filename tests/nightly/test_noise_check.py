"""The nightly's noise check (patchbench/nightly/noise.py noise_excess, gates.py's underpowered
rule): tonight's spread against the runner's own residuals (bootstrap), checked against scipy's
chi-square where the residuals are normal and against a direct simulation of Student t noise
where they are not; a heavy-tailed quiet history stays green, a night at 3x its noise does not."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from patchbench.nightly.gates import evaluate, night_outcome
from patchbench.nightly.noise import learn, noise_excess, outliers, residuals
from tests.nightly.test_gates import KB, KV, TPUT, night, settings

#: exact standard normal quantiles: a residual pool whose bootstrap null is the chi-square
NORMAL = stats.norm.ppf((np.arange(20000) + 0.5) / 20000)
X = [0.021, -0.035, 0.012, 0.040, -0.018, 0.003, -0.044, 0.027]  # s = 0.0298


def test_residuals_have_the_run_variance():
    r = residuals([[1.0, 3.0], [0.0, 0.0, 3.0], [5.0]])
    assert r == pytest.approx([-math.sqrt(2), math.sqrt(2), -math.sqrt(1.5), -math.sqrt(1.5),
                               2 * math.sqrt(1.5)])  # fmt: skip


@pytest.mark.parametrize("paired", [False, True])
def test_bootstrap_on_normal_residuals_is_the_chi_square(paired):
    sigma = 0.017
    s = np.std(X, ddof=1)
    chi = stats.chi2.sf(7 * s * s / sigma**2, 7)
    ratio, p = noise_excess(X, sigma, NORMAL, paired)
    assert ratio == pytest.approx(s / sigma)
    assert p == pytest.approx(chi, abs=4 * math.sqrt(chi * (1 - chi) / 9999) + 1e-4)
    assert noise_excess(X, sigma)[1] == pytest.approx(chi)  # no residuals: the chi-square


def test_bootstrap_draws_follow_the_outlier_rule():
    """trim = (9, 3): tonight kept 8 of 9 values; the null is the SD of what the outlier rule
    (patchbench.nightly.noise.outliers, at 3 sigmas) keeps of 9 normal values, simulated
    here directly."""
    rng = np.random.default_rng(5)
    sims = []
    for z in rng.standard_normal((20000, 9)):
        sims.append(np.std(z[~outliers(z, 1.0, 3.0)], ddof=1))
    sigma = 0.02
    r = np.std(X, ddof=1) / sigma
    want = np.mean(np.asarray(sims) >= r)
    p = noise_excess(X, sigma, NORMAL, trim=(9, 3.0))[1]
    assert p == pytest.approx(want, abs=4 * math.sqrt(want * (1 - want) / 9999) + 0.005)
    assert p < noise_excess(X, sigma, NORMAL)[1]  # trimmed draws are less spread


def t3(rng, shape, sd):
    return rng.standard_t(3, shape) * sd / math.sqrt(3)


def test_heavy_tailed_history_is_its_own_null_and_3x_is_noisy():
    """Student t (3 df) run noise, 1.5 % SD: the learned (median-based) sigma is below the SD,
    so scipy's chi-square calls an ordinary night noisy; the bootstrap on the learned residuals
    matches the t null simulated directly (200000 nights), and a night at 3x is noisy."""
    rng = np.random.default_rng(12)
    hist = [night(i % 28 + 1, {KB: list(100 * np.exp(t3(rng, 8, 0.015))),
                               KV: list(100 * np.exp(t3(rng, 8, 0.015)))})
            for i in range(30)]  # fmt: skip
    noise = learn(hist, "serving", TPUT)
    assert noise.run.sigma < 0.012 and noise.shape.size == 480
    sim = np.std(t3(rng, (200000, 8), 0.015) - t3(rng, (200000, 8), 0.015), axis=1, ddof=1)
    level = 0.01 / 8

    def pairs(a: int, b: int, sd: float) -> np.ndarray:
        return t3(np.random.default_rng(a), 8, sd) - t3(np.random.default_rng(b), 8, sd)

    for d in (pairs(8, 107, 0.015), pairs(9, 108, 0.015)):  # two quiet nights
        s = np.std(d, ddof=1)
        assert stats.chi2.sf(7 * s * s / noise.pair_sigma**2, 7) < level
        _, p = noise_excess(d, noise.pair_sigma, noise.shape, paired=True)
        assert p > level and p == pytest.approx(np.mean(sim >= s), abs=0.02)
    big = pairs(56, 66, 0.045)
    assert noise_excess(big, noise.pair_sigma, noise.shape, paired=True)[1] < level
    assert np.mean(sim >= np.std(big, ddof=1)) < level


def test_heavy_tailed_quiet_nights_are_green_and_a_3x_night_underpowered():
    """The same-run gate on a learned Student t (3 df) history: 20 quiet nights, none
    underpowered (scipy's chi-square against the learned noise flags some of them); tonight at
    3x the noise: underpowered (its reason naming the bootstrap) unless the report passes it."""
    rng = np.random.default_rng(21)
    mk = lambda i, sd=0.015: night(i, {KB: list(100 * np.exp(t3(rng, 8, sd))),  # noqa: E731
                                       KV: list(100 * np.exp(t3(rng, 8, sd)))})  # fmt: skip
    hist = [mk(i % 28 + 1) for i in range(30)]
    s = settings(learn_min_nights=7)
    pair = learn(hist, "serving", TPUT).pair_sigma
    flagged = 0
    for _ in range(20):
        t = mk(28)
        [r] = evaluate(hist, t, s)
        assert night_outcome([r]) == "green", r.reason
        d = np.log(t.values[KV]) - np.log(t.values[KB])
        flagged += stats.chi2.sf(7 * np.var(d, ddof=1) / pair**2, 7) < 0.01
    assert flagged >= 1
    undecided = [
        r for _ in range(10) if (r := evaluate(hist, mk(28, 0.045), s)[0]).status != "pass"
    ]
    assert len(undecided) == 3  # the others' 95 % intervals exclude the 5 % threshold
    for r in undecided:
        assert r.status == "underpowered" and "bootstrap p" in r.reason, r.reason


def test_the_calibrations_abnormal_run_is_one_run_only():
    """tools/calibration/nightly.py: with no run noise, an abnormal night has exactly one run of
    one variant 15 % worse in every metric (throughput x0.85, ITL / 0.85); every other value is
    100."""
    from tools.calibration.nightly import Scenario, sim_night

    itl = ("serving", "itl_median_ms")
    n = sim_night(0, np.random.default_rng(3), [("serving", TPUT), itl], 5, 0.0, 0.0,
                  Scenario(abnormal=1.0))  # fmt: skip
    odd = [(k, i) for k, v in n.values.items() for i, x in enumerate(v) if x != pytest.approx(100)]
    assert len(odd) == 2 and odd[0][0][0] == odd[1][0][0] and odd[0][1] == odd[1][1]
    assert n.values[odd[0][0]][odd[0][1]] == pytest.approx(85.0)
    assert n.values[odd[1][0]][odd[1][1]] == pytest.approx(100.0 / 0.85)
