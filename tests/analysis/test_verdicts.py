"""The verdict rules (patchbench/analysis/verdicts.py) against independent sources, and the four verdicts
on synthetic runs built for each (tests.synthetic). The methods they call are tested in
tests/analysis/test_stats.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

from patchbench.analysis.build import build_comparison, verdicts
from patchbench.analysis.comparison import CompareSettings
from patchbench.suite import MetricInfo
from tests.synthetic import declare_suite, make_run


def test_tost_matches_statsmodels_ttost_paired_on_log_ratios():
    rng = np.random.default_rng(3)
    for _ in range(20):
        b = 100 * np.exp(rng.normal(0, 0.03, 5))
        v = b * np.exp(rng.normal(0.01, 0.02, 5))
        p, eq = verdicts.tost_log_ratio(b, v, 5.0, 0.05)
        bound = math.log(1.05)
        p_ref = ttost_paired(np.log(v), np.log(b), -bound, bound)[0]
        assert p == pytest.approx(p_ref, rel=1e-9, abs=1e-12)
        assert eq == (p_ref < 0.05)


def test_holm_matches_multipletests_and_alphas_agree_with_rejections():
    rng = np.random.default_rng(0)
    for _ in range(40):
        p = list(rng.uniform(0, 0.06, rng.integers(1, 6)))
        reject, used = verdicts.holm_alphas(p, 0.05)
        assert reject == list(multipletests(p, 0.05, method="holm")[0])
        for pi, r, a in zip(p, reject, used, strict=False):
            assert r == (pi <= a)  # the level shown agrees with the verdict


def test_zero_variance_accuracy_is_never_zero_width_and_not_significant():
    # 900 questions, the same single flip in every repeat (407 vs 406 correct): averaged
    # correctness is still one discordant question; the interval must straddle 0.
    base = [1.0] * 407 + [0.0] * 493
    var = [1.0] * 406 + [0.0] * 494
    t = verdicts.accuracy_test(base, var)
    lo, hi = t.interval(0.05)
    assert hi - lo > 0.005 and lo < 0 < hi
    assert t.p > 0.05  # one discordant question of 900 is no evidence of a change
    same = verdicts.accuracy_test(base, base)
    lo, hi = same.interval(0.05)
    assert hi - lo > 0.001 and lo < 0 < hi


def test_one_repeat_is_never_a_verdict():
    t = verdicts.run_test([100.0], [150.0], 3)
    assert t.p is None and "1 repeat: one run cannot separate" in t.reason
    v, _, _ = verdicts.verdict(t, better="higher", alpha=0.05, margin=5.0, equivalent=None)
    assert v == "inconclusive"


def test_deterministic_exact():
    assert verdicts.deterministic_test([2, 2, 2], [0, 0, 0]).estimate == -2
    t = verdicts.deterministic_test([2, 3], [0, 0])
    assert t.p is None and "not deterministic" in t.reason


def test_bounded_difference_by_interval_arithmetic():
    inf = math.inf
    # exact both: a point
    assert verdicts.bounded_difference(507, 6) == (-501, -501)
    # variant at least 6: the true change is at least 6 - 507 and unbounded above
    assert verdicts.bounded_difference(507, 6, variant_bound="lower") == (-501, inf)
    # baseline at least 507: the change is at most 6 - 507
    assert verdicts.bounded_difference(507, 6, baseline_bound="lower") == (-inf, -501)
    # variant at most 6 and baseline at least 507: still at most -501
    assert verdicts.bounded_difference(507, 6, "lower", "upper") == (-inf, -501)
    # both at least: nothing is known
    assert verdicts.bounded_difference(507, 6, "lower", "lower") == (-inf, inf)


@pytest.mark.parametrize(
    "b, v, bb, vb, p, verdict",
    [
        (507, 6, None, "lower", 1.0, "inconclusive"),  # at least 6 may still be 507 or more
        (507, 6, "lower", None, 0.0, "improved"),  # at least 507 against exactly 6
        (0, 3, None, "lower", 0.0, "regressed"),  # at least 3 against exactly 0
        (3, 0, None, "upper", 0.0, "improved"),  # at most 0 against exactly 3
        (2, 2, None, "lower", 1.0, "inconclusive"),  # at least 2 against 2: not "unchanged"
    ],
)
def test_deterministic_with_bounds(b, v, bb, vb, p, verdict):
    t = verdicts.deterministic_test([b, b], [v, v], bb, vb)
    assert t.p == p and t.estimate == v - b
    got, _, _ = verdicts.verdict(t, better="lower", alpha=0.05, margin=None, equivalent=False)
    assert got == verdict
    assert (t.reason is None) == (p == 0.0)
    assert t.notes and "bounded" in t.notes[0]


def test_welch_matches_scipy():
    from scipy import stats

    a, b = [100, 102, 98, 101], [110, 108, 113]
    ch, lo, hi, p = verdicts.welch_log(a, b, 0.05)
    ref = stats.ttest_ind(np.log(b), np.log(a), equal_var=False)
    assert p == pytest.approx(ref.pvalue)
    ci = ref.confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((math.expm1(ci.low), math.expm1(ci.high)))


# ---------------------------------------------------------------- synthetic runs, one per verdict

PRIMARY = {
    "thr_tok_s": MetricInfo(better="higher", unit="tok/s", primary=True, margin=5.0),
    "lat_ms": MetricInfo(better="lower", unit="ms", primary=True, margin=5.0),
}


@pytest.fixture
def declared(monkeypatch):
    declare_suite(monkeypatch, "bench", PRIMARY)


def _run(tmp_path, thr, lat, variants=None):
    return make_run(
        tmp_path,
        variants=variants or {"baseline": [], "patched": ["p1"]},
        metrics={"bench": {"thr_tok_s": thr, "lat_ms": lat}},
    )


BASE = [100.0, 101.0, 99.0, 100.5, 99.5]
LAT = [10.0, 10.1, 9.9, 10.05, 9.95]


def _verdicts(cmp, variant="patched"):
    return {r.metric: r.verdict for r in cmp.rows if r.variant == variant}


def test_improved_and_regressed(tmp_path, declared):
    cmp = build_comparison(
        _run(
            tmp_path,
            {"baseline": BASE, "patched": [x * 1.10 for x in BASE]},
            {"baseline": LAT, "patched": [x * 1.2 + (i % 2) * 0.01 for i, x in enumerate(LAT)]},
        )
    )
    assert _verdicts(cmp) == {"thr_tok_s": "improved", "lat_ms": "regressed"}
    row = cmp.row("bench", "thr_tok_s", "patched")
    assert row.change == pytest.approx(10.0, abs=1e-6)
    assert row.confidence == pytest.approx(0.975)  # Holm: first of two primaries at 0.05/2


def test_equivalent(tmp_path, declared):
    rng = np.random.default_rng(1)
    noise = lambda: list(np.exp(rng.normal(0, 0.003, 5)))  # noqa: E731
    thr = [x * e for x, e in zip(BASE, noise(), strict=True)]
    cmp = build_comparison(
        _run(
            tmp_path,
            {"baseline": BASE, "patched": thr},
            {"baseline": LAT, "patched": [x * e for x, e in zip(LAT, noise(), strict=False)]},
        )
    )
    assert _verdicts(cmp) == {"thr_tok_s": "equivalent", "lat_ms": "equivalent"}


def test_inconclusive_noisy(tmp_path, declared):
    cmp = build_comparison(
        _run(
            tmp_path,
            {"baseline": BASE, "patched": [90, 115, 95, 112, 99]},
            {"baseline": LAT, "patched": [8, 12, 9, 11.5, 10]},
        )
    )
    assert _verdicts(cmp) == {"thr_tok_s": "inconclusive", "lat_ms": "inconclusive"}


def test_one_repeat_run_yields_no_improved_or_regressed(tmp_path, declared):
    cmp = build_comparison(
        _run(
            tmp_path,
            {"baseline": [100.0], "patched": [200.0]},
            {"baseline": [10.0], "patched": [30.0]},
        )
    )
    assert set(_verdicts(cmp).values()) == {"inconclusive"}
    assert any("1 repeat" in n for n in cmp.row("bench", "thr_tok_s", "patched").notes)


def test_incomplete(tmp_path, declared):
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "thr_tok_s": {"baseline": BASE, "patched": BASE},
                "lat_ms": {"baseline": LAT, "patched": LAT},
            }
        },
        cell_status={("patched", 2): "failed"},
    )
    assert _verdicts(build_comparison(run)) == {"thr_tok_s": "incomplete", "lat_ms": "incomplete"}


def test_aa_improved_is_noted_and_changes_no_verdict(tmp_path, declared):
    run = _run(
        tmp_path,
        {"baseline": BASE, "aa": [x * 1.08 for x in BASE], "patched": [x * 1.10 for x in BASE]},
        {"baseline": LAT, "aa": LAT, "patched": LAT},
        variants={"baseline": [], "aa": [], "patched": ["p1"]},
    )
    cmp = build_comparison(run)
    # the A/A is a measurement: noted, never a veto
    assert not cmp.health.ok and "no verdict is changed" in cmp.health.notes[0]
    assert "too noisy" not in cmp.health.notes[0]
    assert _verdicts(cmp)["thr_tok_s"] == "improved"
    assert cmp.row("bench", "thr_tok_s", "patched").verdict_before_health is None


def test_margin_override_from_settings(tmp_path, declared):
    run = _run(
        tmp_path,
        {"baseline": BASE, "patched": [x * 1.02 for x in BASE]},
        {"baseline": LAT, "patched": LAT},
    )
    cmp = build_comparison(run, CompareSettings(margins={"bench.thr_tok_s": 1.0}))
    row = cmp.row("bench", "thr_tok_s", "patched")
    assert row.margin == 1.0 and row.verdict == "improved" and not row.within_margin
    cmp = build_comparison(run)
    row = cmp.row("bench", "thr_tok_s", "patched")
    assert row.verdict == "improved" and row.within_margin  # +2 % shown "within +-5 %"
