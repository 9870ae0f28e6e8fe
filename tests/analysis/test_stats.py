"""patchbench.stats against hand-computed values, published examples and scipy / statsmodels called
directly."""

from __future__ import annotations

import math
import statistics

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


def _expm1(iv):
    return tuple(math.expm1(x) for x in iv)


def test_paired_t_interval_hand_computed():
    # d = ln(v/b) = 0.1, 0.2, 0.3: mean 0.2, s = 0.1, n = 3, t_{0.975, 2} = 4.3027 (t table)
    b = [100.0, 50.0, 20.0]
    v = [x * math.exp(d) for x, d in zip(b, (0.1, 0.2, 0.3), strict=True)]
    t = stats.paired_t(stats.log_ratios(b, v))
    low, high = _expm1(t.interval(0.05))
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert math.expm1(t.mean) == pytest.approx(math.exp(0.2) - 1, rel=1e-9)
    assert low == pytest.approx(math.exp(0.2 - half) - 1, abs=1e-6)
    assert high == pytest.approx(math.exp(0.2 + half) - 1, abs=1e-6)
    assert (t.n, t.df) == (3, 2) and t.sd == pytest.approx(0.1)


def test_paired_t_90_percent_and_constant_ratios():
    # n = 2, d = 0.0 and 0.1: mean 0.05, s = 0.0707107, t_{0.95, 1} = 6.3138 (t table)
    t = stats.paired_t(stats.log_ratios([1.0, 1.0], [1.0, math.exp(0.1)]))
    low, high = _expm1(t.interval(0.10))
    half = 6.313752 * (0.1 / math.sqrt(2)) / math.sqrt(2)
    assert low == pytest.approx(math.expm1(0.05 - half), abs=1e-6)
    assert high == pytest.approx(math.expm1(0.05 + half), abs=1e-6)
    same = stats.paired_t(stats.log_ratios([10, 20, 30], [11, 22, 33]))
    low, high = _expm1(same.interval(0.05))
    assert low == pytest.approx(0.1) and high == pytest.approx(0.1)
    assert same.p_value() < 1e-20  # the log ratios differ only by round-off
    exact = stats.paired_t([0.25, 0.25, 0.25])
    assert exact.p_value() == 0.0 and exact.bound(0.05, -1) == exact.interval(0.05)[0] == 0.25
    with pytest.raises(ValueError, match="at least 2"):
        stats.paired_t([0.1])


def test_paired_t_on_differences_hand_computed():
    # b = 2, 2, 4; d = v - b = -2, -1, -3: mean -2, s = 1, t_{0.975, 2} = 4.3027
    t = stats.paired_t(np.subtract([0, 1, 1], [2, 2, 4]))
    half = 4.302653 * 1.0 / math.sqrt(3)
    assert t.interval(0.05) == pytest.approx((-2 - half, -2 + half), abs=1e-6)
    det = stats.paired_t([-2.0, -2.0])  # deterministic counts: 2 syncs -> 0 in both repeats
    assert det.interval(0.05) == (-2.0, -2.0) and det.p_value() == 0.0
    assert stats.paired_t([0.0, 0.0]).p_value() == 1.0


def test_paired_t_matches_scipy_ttest_1samp():
    rng = np.random.default_rng(4)
    for n in (2, 3, 5, 12):
        d = rng.normal(0.02, 0.03, n)
        t = stats.paired_t(d)
        ref = sps.ttest_1samp(d, 0.0)
        assert t.p_value() == pytest.approx(ref.pvalue, rel=1e-9)
        for alpha in (0.05, 0.01, 0.2):
            ci = ref.confidence_interval(1 - alpha)
            assert t.interval(alpha) == pytest.approx((ci.low, ci.high), rel=1e-9)
        for alt in ("greater", "less"):
            assert t.p_value(alt) == pytest.approx(
                sps.ttest_1samp(d, 0.0, alternative=alt).pvalue, rel=1e-9
            )
        # one-sided bounds: the ends of scipy's one-sided intervals
        up = sps.ttest_1samp(d, 0.0, alternative="less").confidence_interval(0.95).high
        lo = sps.ttest_1samp(d, 0.0, alternative="greater").confidence_interval(0.95).low
        assert t.bound(0.05, +1) == pytest.approx(up, rel=1e-9)
        assert t.bound(0.05, -1) == pytest.approx(lo, rel=1e-9)


def test_welch_t_matches_scipy_ttest_ind():
    rng = np.random.default_rng(6)
    for na, nb in ((2, 2), (3, 7), (6, 4)):
        x, y = rng.normal(0.1, 0.02, na), rng.normal(0.0, 0.05, nb)
        t = stats.welch_t(x, y)
        ref = sps.ttest_ind(x, y, equal_var=False)
        assert t.p_value() == pytest.approx(ref.pvalue, rel=1e-9)
        assert t.df == pytest.approx(ref.df, rel=1e-12)
        ci = ref.confidence_interval(0.9)
        assert t.interval(0.1) == pytest.approx((ci.low, ci.high), rel=1e-9)
        less = sps.ttest_ind(x, y, equal_var=False, alternative="less").pvalue
        assert t.p_value("less") == pytest.approx(less, rel=1e-9)
    with pytest.raises(ValueError, match="at least 2"):
        stats.welch_t([1.0], [1.0, 2.0])


def test_prediction_t_by_hand():
    means = [0.0, 0.02, -0.01, 0.01]
    x = [-0.05, -0.04]
    t = stats.prediction_t(x, means)
    se = np.std(means, ddof=1) * math.sqrt(1 + 1 / 4)
    assert (t.df, t.mean) == (3, pytest.approx(np.mean(x) - np.mean(means)))
    assert t.p_value("less") == pytest.approx(sps.t.cdf(t.mean / se, 3), rel=1e-9)
    with pytest.raises(ValueError):
        stats.prediction_t([], means)


def test_tost_matches_statsmodels_ttost_paired_and_its_interval_form():
    from statsmodels.stats.weightstats import ttost_paired

    rng = np.random.default_rng(3)
    bound = math.log(1.05)
    for _ in range(20):
        b = 100 * np.exp(rng.normal(0, 0.03, 5))
        v = b * np.exp(rng.normal(0.01, 0.02, 5))
        t = stats.paired_t(stats.log_ratios(b, v))
        p_ref = ttost_paired(np.log(v), np.log(b), -bound, bound)[0]
        assert stats.tost_p(t, -bound, bound) == pytest.approx(p_ref, rel=1e-9, abs=1e-12)
        for alpha in (0.05, 0.2):  # the duality: p < alpha iff the 1 - 2 alpha interval is inside
            inside = stats.equivalent_by_interval(t.interval, -bound, bound, alpha)
            assert inside == (p_ref < alpha)
    same = stats.paired_t([0.01, 0.01])
    assert stats.tost_p(same, -bound, bound) == 0.0
    assert stats.tost_p(stats.paired_t([0.06, 0.06]), -bound, bound) == 1.0


def test_holm_matches_statsmodels_multipletests():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.005, 0.2]
    got = stats.holm(p, 0.05)
    assert [r for r, _ in got] == list(multipletests(p, alpha=0.05, method="holm")[0])
    assert [lvl for _, lvl in got] == pytest.approx(
        [0.05 / 4, 0.05 / 2, 0.05 / 3, 0.05 / 5, 0.05 / 1]
    )
    # random families against multipletests: tests/analysis/test_verdicts.py (holm_alphas)


def test_newcombe_paired_matches_published_example():
    # Fagerland, Lydersen & Laake (2017), Statistical Analysis of Contingency Tables, ch. 8:
    # Cavo et al. (2012) table [[59, 6], [16, 80]], Newcombe square-and-add (method 10):
    # p1+ - p+1 = -0.0621, 95% CI -0.1186 to -0.0046. Our orientation is variant - baseline
    # = p+1 - p1+, so the signs flip.
    est, lo, hi = stats.newcombe_paired(59, 6, 16, 80, 0.05)
    assert est == pytest.approx(0.0621, abs=5e-5)
    assert lo == pytest.approx(0.0046, abs=5e-5)
    assert hi == pytest.approx(0.1186, abs=5e-5)
    with pytest.raises(ValueError):
        stats.newcombe_paired(0, 0, 0, 0, 0.05)


def test_paired_table_and_p_from_interval():
    assert stats.paired_table([1, 1, 0, 0.5], [1, 0, 1, 0.5]) == (1.25, 1.25, 1.25, 0.25)
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        stats.paired_table([2.0], [1.0])
    # a normal interval of a mean 2 with se 1: the p-value inverted from it is 2 (1 - Phi(2))
    z = statistics.NormalDist()

    def iv(alpha):
        q = z.inv_cdf(1 - alpha / 2)
        return 2 - q, 2 + q

    assert stats.p_from_interval(iv) == pytest.approx(float(sps.norm.sf(2) * 2), abs=1e-5)
    assert stats.p_from_interval(lambda a: (-1.0, 1.0)) == 1.0
    assert stats.p_from_interval(lambda a: (1.0, 2.0)) == 0.0


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


def test_wilson_quantile_equals_scipy_and_statsmodels():
    from statsmodels.stats.proportion import proportion_confint

    for alpha in (0.5, 0.1, 0.05, 0.05 / 3, 0.0125, 0.01, 1e-4, 1e-8):
        assert stats._NORMAL.inv_cdf(1 - alpha / 2) == pytest.approx(
            float(sps.norm.ppf(1 - alpha / 2)), rel=0, abs=1e-12
        )
        if alpha < 1e-6:
            continue  # statsmodels takes norm.isf(alpha / 2); 1 - alpha / 2 loses digits here
        for x, n in ((0, 10), (3, 10), (10, 10), (407, 900), (12.5, 40)):
            lo, hi = stats.wilson_interval(x, n, 1 - alpha)
            elo, ehi = proportion_confint(x, n, alpha=alpha, method="wilson")
            assert lo == pytest.approx(elo, abs=1e-12) and hi == pytest.approx(ehi, abs=1e-12)
    for x, n in ((0, 10), (3, 10), (407, 900), (900, 900)):
        assert stats.wilson_interval(x, n, 0.95) == pytest.approx(
            proportion_confint(x, n, 0.05, "wilson")
        )
    with pytest.raises(ValueError):
        stats.wilson_interval(1, 0, 0.95)


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


def test_trend_t_matches_scipy_linregress():
    y = [100.0, 101.5, 101.0, 103.2, 104.0, 103.9, 106.1]
    t = stats.trend_t(y)
    ref = sps.linregress(np.arange(len(y)), y)
    assert t.mean == pytest.approx(ref.slope)
    assert t.se == pytest.approx(ref.stderr)
    assert t.p_value() == pytest.approx(ref.pvalue)
    assert t.df == len(y) - 2
    with pytest.raises(ValueError, match="at least 3"):
        stats.trend_t([1.0, 2.0])
    with pytest.raises(ValueError, match="differ"):
        stats.trend_t([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])


def test_sd_interval_by_chi_square():
    lo, hi = stats.sd_interval(2.0, 9, 0.05)
    assert lo == pytest.approx(2.0 * math.sqrt(9 / sps.chi2.ppf(0.975, 9)))
    assert hi == pytest.approx(2.0 * math.sqrt(9 / sps.chi2.ppf(0.025, 9)))
    assert lo < 2.0 < hi
    with pytest.raises(ValueError):
        stats.sd_interval(1.0, 0)


def test_cell_variance_mean_squares_match_statsmodels_anova():
    """MS_R and MS_E of one arm equal statsmodels' two-way ANOVA (y ~ C(rep) + C(item))."""
    pd = pytest.importorskip("pandas")
    smf = pytest.importorskip("statsmodels.formula.api")
    from statsmodels.stats.anova import anova_lm

    rng = np.random.default_rng(3)
    y = (rng.random((3, 40)) < 0.5).astype(float)
    cv = stats.cell_variance([y])
    df = pd.DataFrame(
        [(r, q, y[r, q]) for r in range(3) for q in range(40)], columns=["rep", "item", "y"]
    )
    tab = anova_lm(smf.ols("y ~ C(rep) + C(item)", df).fit())
    assert cv.between == pytest.approx(tab.loc["C(rep)", "mean_sq"])
    assert cv.within == pytest.approx(tab.loc["Residual", "mean_sq"])
    assert (cv.df_between, cv.df_within) == (2, 2 * 39)
    assert cv.sigma2 == pytest.approx(max(0.0, (cv.between - cv.within) / 40))
    # one repeat per arm: no information
    assert stats.cell_variance([y[:1], y[1:2]]) is None


def test_cell_variance_recovers_a_cell_shift_by_simulation():
    """Cells shifted by N(0, 0.02^2) in accuracy: the pooled estimate averages to 4e-4."""
    rng = np.random.default_rng(11)
    q, sig = 400, 0.02
    est = []
    for _ in range(200):
        p = rng.uniform(0.2, 0.8, q)
        arms = [
            (rng.random((3, q)) < np.clip(p + rng.normal(0, sig, (3, 1)), 0, 1)).astype(float)
            for _ in range(3)
        ]
        est.append(stats.cell_variance(arms).sigma2)
    assert np.mean(est) == pytest.approx(sig**2, rel=0.25)


def test_paired_items_t_reduces_to_paired_t_and_adds_the_cell_term():
    rng = np.random.default_rng(5)
    b, v = rng.random(50), rng.random(50)
    t0 = stats.paired_items_t(b, v, 1, 1, None)
    ref = stats.paired_t(v - b)
    assert (t0.mean, t0.se, t0.df) == (ref.mean, ref.se, ref.df)
    cells = stats.CellVariance(1e-3, 0.5, 0.1, 4, 400, 50.0)
    t = stats.paired_items_t(b, v, 3, 3, cells)
    k = 2 / 3
    assert t.se**2 == pytest.approx(ref.se**2 + k * 1e-3)
    parts = [(ref.se**2, 49), (k * 0.5 / 50, 4), (k * 0.1 / 50, 400)]
    df = (ref.se**2 + k * 1e-3) ** 2 / sum(x * x / d for x, d in parts)
    assert t.df == pytest.approx(df)
    with pytest.raises(ValueError, match="equal lengths"):
        stats.paired_items_t(b, v[:3], 1, 1, None)
