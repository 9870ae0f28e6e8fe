"""patchbench.stats against hand-computed values and against scipy / statsmodels called directly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from patchbench import stats


def test_log_ratios_and_errors():
    d = stats.log_ratios([100, 200], [110, 180])
    assert d == pytest.approx([math.log(1.1), math.log(0.9)])
    with pytest.raises(ValueError, match="equal lengths"):
        stats.log_ratios([1, 2], [1])
    with pytest.raises(ValueError, match="> 0"):
        stats.log_ratios([0, 1], [1, 1])


def test_t_interval_hand_computed():
    # d = ln(v/b) = 0.1, 0.2, 0.3: mean 0.2, s = 0.1, n = 3, t_{0.975, 2} = 4.3027 (t table)
    b = [100.0, 50.0, 20.0]
    v = [x * math.exp(d) for x, d in zip(b, (0.1, 0.2, 0.3), strict=True)]
    iv = stats.t_interval_log_ratio(b, v, 0.95)
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert iv.estimate == pytest.approx(math.exp(0.2) - 1, rel=1e-9)
    assert iv.low == pytest.approx(math.exp(0.2 - half) - 1, abs=1e-6)
    assert iv.high == pytest.approx(math.exp(0.2 + half) - 1, abs=1e-6)
    assert iv.n == 3 and iv.method == "t on log ratio (n=3)"


def test_t_interval_90_percent_and_constant_ratios():
    # n = 2, d = 0.0 and 0.1: mean 0.05, s = 0.0707107, t_{0.95, 1} = 6.3138 (t table)
    iv = stats.t_interval_log_ratio([1.0, 1.0], [1.0, math.exp(0.1)], 0.90)
    half = 6.313752 * (0.1 / math.sqrt(2)) / math.sqrt(2)
    assert iv.low == pytest.approx(math.expm1(0.05 - half), abs=1e-6)
    assert iv.high == pytest.approx(math.expm1(0.05 + half), abs=1e-6)
    same = stats.t_interval_log_ratio([10, 20, 30], [11, 22, 33])
    assert same.low == pytest.approx(0.1) and same.high == pytest.approx(0.1)
    with pytest.raises(ValueError, match="at least 2"):
        stats.t_interval_log_ratio([1.0], [1.1])


def test_bootstrap_log_ratio_matches_scipy_directly():
    rng = np.random.default_rng(5)
    b = rng.uniform(90, 110, size=12)
    v = b * np.exp(rng.normal(0.05, 0.02, size=12))
    iv = stats.bootstrap_log_ratio(b, v, 0.95, n_resamples=3000, seed=11)
    d = np.log(v / b)
    ref = sps.bootstrap(
        (d,),
        np.mean,
        n_resamples=3000,
        confidence_level=0.95,
        method="BCa",
        rng=np.random.default_rng(11),
    )
    assert iv.low == pytest.approx(math.expm1(ref.confidence_interval.low), rel=1e-9)
    assert iv.high == pytest.approx(math.expm1(ref.confidence_interval.high), rel=1e-9)
    assert iv.estimate == pytest.approx(math.expm1(d.mean()))
    assert iv.method.startswith("bootstrap BCa") and "n=12" in iv.method


def test_paired_request_interval_exact_ratio_and_pairing():
    rng = np.random.default_rng(0)
    base = rng.lognormal(np.log(50), 0.8, size=200)  # prompts differ a lot from each other
    iv = stats.paired_request_interval(base, 0.9 * base, "mean")
    # every resample has ratio of means exactly 0.9
    assert iv.estimate == pytest.approx(-0.1)
    assert iv.low == pytest.approx(-0.1) and iv.high == pytest.approx(-0.1)
    var = 0.95 * base * np.exp(rng.normal(0, 0.02, size=200))
    paired = stats.paired_request_interval(base, var, "median", seed=1)
    assert paired.ok and paired.high < 0  # the 5 % TTFT gain is found ...
    unpaired = sps.bootstrap(
        (base, var),
        lambda x, y, axis=-1: np.log(np.median(y, axis=axis) / np.median(x, axis=axis)),
        paired=False,
        n_resamples=2000,
        rng=np.random.default_rng(1),
    )
    # ... because pairing removes the prompt-to-prompt spread an unpaired interval carries
    assert unpaired.confidence_interval.low < 0 < unpaired.confidence_interval.high
    ref = sps.bootstrap(
        (base, var),
        lambda x, y, axis=-1: np.log(np.median(y, axis=axis) / np.median(x, axis=axis)),
        paired=True,
        n_resamples=2000,
        method="BCa",
        rng=np.random.default_rng(1),
    )
    assert paired.low == pytest.approx(math.expm1(ref.confidence_interval.low), rel=1e-9)
    assert paired.high == pytest.approx(math.expm1(ref.confidence_interval.high), rel=1e-9)


def test_block_bootstrap_estimate_and_width():
    rng = np.random.default_rng(3)
    n = 60
    # each request has its own level shared by all its tokens: values are correlated in a request
    b_blocks = [
        list(rng.lognormal(np.log(5), 0.3) * np.ones(30) + rng.normal(0, 0.01, 30))
        for _ in range(n)
    ]
    v_blocks = [list(np.asarray(x) * rng.lognormal(np.log(0.95), 0.2)) for x in b_blocks]
    iv = stats.block_bootstrap_interval(b_blocks, v_blocks, "mean", seed=2)
    pooled_b, pooled_v = np.concatenate(b_blocks), np.concatenate(v_blocks)
    assert iv.estimate == pytest.approx(pooled_v.mean() / pooled_b.mean() - 1, rel=1e-9)
    assert iv.low < iv.estimate < iv.high
    # a token-level bootstrap (as if the 1800 values were independent) is far too narrow
    tok = sps.bootstrap(
        (np.arange(pooled_b.size),),
        lambda i: np.log(pooled_v[i].mean() / pooled_b[i].mean()),
        vectorized=False,
        n_resamples=1000,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    tok_w = math.expm1(tok.confidence_interval.high) - math.expm1(tok.confidence_interval.low)
    assert (iv.high - iv.low) > 2.5 * tok_w
    with pytest.raises(ValueError, match="equal counts"):
        stats.block_bootstrap_interval([[1.0]], [[1.0], [2.0]])


def test_block_bootstrap_constant_ratio():
    b = [[1.0, 2.0, 3.0], [4.0], [5.0, 6.0]]
    v = [[x * 1.2 for x in blk] for blk in b]
    iv = stats.block_bootstrap_interval(b, v, "p50")
    assert iv.estimate == pytest.approx(0.2)
    assert iv.low == pytest.approx(0.2) and iv.high == pytest.approx(0.2)


def test_wilson_hand_computed():
    # 8/10 at 95 %: p = .8, z = 1.959964; (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)
    z = 1.959964
    c = (0.8 + z * z / 20) / (1 + z * z / 10)
    h = z * math.sqrt(0.016 + z * z / 400) / (1 + z * z / 10)
    lo, hi = stats.wilson_interval(8, 10)
    assert lo == pytest.approx(c - h, abs=1e-6) and hi == pytest.approx(c + h, abs=1e-6)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert stats.wilson_interval(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        stats.wilson_interval(11, 10)


def test_statistic_fn():
    x = np.arange(1, 101, dtype=float)
    assert stats.statistic_fn("p99")(x) == pytest.approx(np.percentile(x, 99))
    assert stats.statistic_fn("median")(x) == pytest.approx(50.5)
    assert stats.statistic_fn("max")(x) == 100
    with pytest.raises(ValueError, match="unknown statistic"):
        stats.statistic_fn("mode")


def test_verdicts_wilson_quantile_equals_scipy_and_statsmodels():
    from statsmodels.stats.proportion import proportion_confint

    from patchbench import verdicts

    for alpha in (0.5, 0.1, 0.05, 0.05 / 3, 0.0125, 0.01, 1e-4, 1e-8):
        assert stats._NORMAL.inv_cdf(1 - alpha / 2) == pytest.approx(
            float(sps.norm.ppf(1 - alpha / 2)), rel=0, abs=1e-12
        )
        if alpha < 1e-6:
            continue  # statsmodels takes norm.isf(alpha / 2); 1 - alpha / 2 loses digits here
        for x, n in ((0, 10), (3, 10), (10, 10), (407, 900), (12.5, 40)):
            lo, hi = verdicts.wilson(x, n, alpha)
            elo, ehi = proportion_confint(x, n, alpha=alpha, method="wilson")
            assert lo == pytest.approx(elo, abs=1e-12) and hi == pytest.approx(ehi, abs=1e-12)
    with pytest.raises(ValueError):
        verdicts.wilson(1, 0, 0.05)


def test_t_interval_diff_hand_computed():
    # b = 2, 2, 4 (mean 8/3); d = v - b = -2, -1, -3: mean -2, s = 1, t_{0.975, 2} = 4.3027
    iv = stats.t_interval_diff([2, 2, 4], [0, 1, 1])
    half = 4.302653 * 1.0 / math.sqrt(3)
    assert iv.estimate == pytest.approx(-2 / (8 / 3))
    assert iv.low == pytest.approx((-2 - half) / (8 / 3), abs=1e-6)
    assert iv.high == pytest.approx((-2 + half) / (8 / 3), abs=1e-6)
    det = stats.t_interval_diff([2, 2], [0, 0])  # deterministic counts: 2 syncs -> 0
    assert (det.estimate, det.low, det.high) == (-1.0, -1.0, -1.0)
    with pytest.raises(ValueError, match="baseline mean"):
        stats.t_interval_diff([0, 0], [1, 1])


def test_block_bootstrap_mean_matches_concatenating_reference():
    rng = np.random.default_rng(8)
    b = [list(rng.lognormal(np.log(5), 0.2, rng.integers(1, 15))) for _ in range(40)]
    v = [list(np.asarray(x) * rng.lognormal(0, 0.1)) for x in b]

    def ref_stat(idx):  # pooled mean of the drawn requests' values, by concatenation
        idx = np.asarray(idx, dtype=int)
        pv = np.concatenate([v[i] for i in idx])
        pb = np.concatenate([b[i] for i in idx])
        return np.log(pv.mean() / pb.mean())

    ref = sps.bootstrap(
        (np.arange(40),),
        ref_stat,
        vectorized=False,
        n_resamples=500,
        method="percentile",
        rng=np.random.default_rng(3),
    )
    iv = stats.block_bootstrap_interval(b, v, "mean", n_resamples=500, seed=3)
    assert iv.low == pytest.approx(math.expm1(ref.confidence_interval.low), rel=1e-9)
    assert iv.high == pytest.approx(math.expm1(ref.confidence_interval.high), rel=1e-9)
