"""compare.json from synthetic run folders with known values (tests.synthetic).

The metrics are declared by a test suite "bench" registered here, so that these tests check the
comparison rules, not whatever a built-in suite currently declares."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats as sps

from patchbench.analysis.build import compare_run, guess_metric_info
from patchbench.analysis.comparison import CompareSettings, Comparison
from patchbench.suite import MetricInfo
from tests.synthetic import declare_suite, make_run

DECL = {
    "output_throughput_tok_s": MetricInfo("higher", "tok/s", primary=True, margin=5.0),
    "ttft_mean_ms": MetricInfo("lower", "ms"),
    "e2e_latency_mean_ms": MetricInfo("lower", "ms"),
    "sync_d2h_reads_count": MetricInfo("lower", "count", primary=True, kind="deterministic"),
    "positions_mismatch_count": MetricInfo("lower", "count", kind="deterministic"),
}


@pytest.fixture(autouse=True)
def declared(monkeypatch):
    declare_suite(monkeypatch, "bench", DECL)


def _row(cmp: Comparison, metric, variant):
    rows = [r for r in cmp.rows if r.metric == metric and r.variant == variant]
    assert len(rows) == 1, (metric, variant)
    return rows[0]


def _t_ci_pct(b, v, conf=0.95):
    """Independent paired t-interval on log ratios, in percent."""
    d = [math.log(y / x) for x, y in zip(b, v, strict=False)]
    n = len(d)
    m, s = statistics.mean(d), statistics.stdev(d)
    h = sps.t.ppf(0.5 + conf / 2, n - 1) * s / math.sqrt(n)
    return 100 * math.expm1(m), 100 * math.expm1(m - h), 100 * math.expm1(m + h)


def test_verdicts_with_three_repeats(tmp_path):
    thr_b, thr_v = [100.0, 102.0, 98.0], [110.0, 111.5, 108.0]
    ttft_b, ttft_v = [50.0, 51.0, 49.0], [60.0, 62.0, 58.5]
    e2e_b, e2e_v = [1000.0, 1010.0, 990.0], [1001.0, 1005.0, 995.0]
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "output_throughput_tok_s": {"baseline": thr_b, "patched": thr_v},
                "ttft_mean_ms": {"baseline": ttft_b, "patched": ttft_v},
                "e2e_latency_mean_ms": {"baseline": e2e_b, "patched": e2e_v},
            }
        },
    )
    cmp = compare_run(run)
    assert json.loads((run / "compare.json").read_text()) == json.loads(cmp.model_dump_json())
    assert cmp.schema_version == 2 and cmp.baseline == "baseline" and cmp.variants == ["patched"]
    assert cmp.aa_variants == []
    thr = _row(cmp, "output_throughput_tok_s", "patched")
    est, lo, hi = _t_ci_pct(thr_b, thr_v)  # the only primary: Holm leaves alpha at 0.05
    assert thr.change == pytest.approx(est) and thr.low == pytest.approx(lo)
    assert thr.high == pytest.approx(hi) and thr.confidence == pytest.approx(0.95)
    # the shown values are each arm's geometric mean: their ratio is the change shown
    assert thr.baseline_value == pytest.approx(statistics.geometric_mean(thr_b))
    assert thr.variant_value == pytest.approx(statistics.geometric_mean(thr_v))
    assert 100 * (thr.variant_value / thr.baseline_value - 1) == pytest.approx(thr.change)
    assert thr.paired_repeats == [0, 1, 2] and thr.outlier_repeats == []
    assert thr.log_ratio_sd == pytest.approx(
        statistics.stdev(math.log(y / x) for x, y in zip(thr_b, thr_v, strict=True))
    )
    assert thr.baseline_repeats == thr_b and thr.variant_repeats == thr_v
    assert thr.verdict == "improved" and thr.method == "paired t on log ratios (n=3)"
    assert thr.unit == "tok/s" and thr.better == "higher" and thr.primary
    assert _row(cmp, "ttft_mean_ms", "patched").verdict == "regressed"  # lower is better
    e2e = _row(cmp, "e2e_latency_mean_ms", "patched")
    assert e2e.low < 0 < e2e.high
    assert e2e.verdict == "inconclusive"  # no margin declared: never "equivalent"


def test_incomplete_cells(tmp_path):
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "output_throughput_tok_s": {"baseline": [100, 101, 99], "patched": [120, 121, 119]}
            }
        },
        cell_status={("patched", 1): "failed"},
    )
    r = _row(compare_run(run), "output_throughput_tok_s", "patched")
    assert r.verdict == "incomplete"
    assert r.variant_repeats == [120.0, None, 119.0]
    assert r.n_pairs == 2  # numbers still from the pairs that are ok
    assert any("patched/rep1: failed" in n for n in r.notes)
    run2 = make_run(
        tmp_path / "b",
        metrics={
            "bench": {"output_throughput_tok_s": {"baseline": [100, 101], "patched": [120, 121]}}
        },
        cell_status={("baseline", 0): "missing"},
        suite_status={("patched", 1, "bench"): "incomplete"},
    )
    r2 = _row(compare_run(run2), "output_throughput_tok_s", "patched")
    assert r2.verdict == "incomplete" and r2.n_pairs == 0
    assert any("baseline/rep0: missing" in n and "patched/rep1: incomplete" in n for n in r2.notes)


def test_missing_metric_is_incomplete(tmp_path):
    run = make_run(
        tmp_path,
        metrics={
            "bench": {"output_throughput_tok_s": {"baseline": [100, 101], "patched": [110, None]}}
        },
    )
    r = _row(compare_run(run), "output_throughput_tok_s", "patched")
    assert r.verdict == "incomplete" and any("no value" in n for n in r.notes)


def test_aa_variant_is_compared_like_any_variant_no_floor(tmp_path):
    b = [100.0, 100.0, 100.0, 100.0]
    aa = [104.0, 97.0, 103.0, 96.0]  # A/A noise of a few percent
    v = [103.0, 102.5, 103.5, 103.0]  # +3 %, consistent: t-interval excludes 0
    run = make_run(
        tmp_path,
        variants={"baseline": [], "aa": [], "patched": ["p1"]},
        metrics={"bench": {"output_throughput_tok_s": {"baseline": b, "aa": aa, "patched": v}}},
    )
    cmp = compare_run(run)
    assert cmp.aa_variants == ["aa"] and cmp.health.ok
    est, lo, hi = _t_ci_pct(b, v)
    r = _row(cmp, "output_throughput_tok_s", "patched")
    assert lo > 0 and r.low == pytest.approx(lo)  # no A/A floor widens or blocks it
    assert r.verdict == "improved" and r.within_margin  # +3 % is inside the 5 % margin
    from statsmodels.stats.weightstats import ttost_paired

    p_tost = ttost_paired(np.log(aa), np.log(b), -math.log(1.05), math.log(1.05))[0]
    want = "equivalent" if p_tost < 0.05 else "inconclusive"
    assert _row(cmp, "output_throughput_tok_s", "aa").verdict == want


def test_unreadable_cell_marks_only_that_cell(tmp_path):
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "output_throughput_tok_s": {"baseline": [100, 101, 99], "patched": [120, 121, 119]}
            }
        },
    )
    (run / "patched" / "rep2" / "cell.json").write_text("{broken")
    cmp = compare_run(run)
    r = _row(cmp, "output_throughput_tok_s", "patched")
    assert r.verdict == "incomplete" and any("patched/rep2: unreadable" in n for n in r.notes)
    assert any(str(run / "patched" / "rep2" / "cell.json") in n for n in cmp.notes)


def test_settings_validation_and_config_section(tmp_path):
    assert CompareSettings().confidence == 0.95
    assert CompareSettings().min_repeats == 3
    assert CompareSettings(margins={"x_ms": 2}).margin_for("s", "x_ms", 5.0) == 2.0
    assert CompareSettings().margin_for("s", "x_ms", 5.0) == 5.0
    with pytest.raises(ValidationError):
        CompareSettings(bogus=1)
    with pytest.raises(ValidationError):
        CompareSettings(confidence=1.5)
    from patchbench.config import load_config
    from patchbench.errors import ConfigError

    y = tmp_path / "c.yaml"
    y.write_text(
        "name: t\nsglang: 0.5.1.post3\nmodel: {path: m}\nvariants: {baseline: []}\n"
        "compare:\n  confidence: 0.9\n  bogus_key: 1\n"
    )
    with pytest.raises(ConfigError, match="bogus_key"):
        load_config(y, check_files=False)


def test_guess_metric_info():
    assert guess_metric_info("foo_tok_s").better == "higher"
    assert guess_metric_info("foo_ms").better == "lower"
    assert guess_metric_info("x_acc").unit == "acc"
    assert guess_metric_info("n_count").better == "none"


def test_deterministic_counts_compared_exactly(tmp_path):
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "sync_d2h_reads_count": {"baseline": [2, 2], "patched": [0, 0]},
                "positions_mismatch_count": {"baseline": [0, 0], "patched": [0, 0]},
            }
        },
    )
    cmp = compare_run(run)
    r = _row(cmp, "sync_d2h_reads_count", "patched")
    assert r.change == -2 and r.method == "exact (deterministic)" and r.low is None
    assert r.verdict == "improved"  # declared lower = better
    z = _row(cmp, "positions_mismatch_count", "patched")
    assert z.verdict == "equivalent" and z.change == 0


def test_aa_detection_reads_mapping_variants():
    """A variant is A/A only when patches, arguments and environment all equal the baseline's;
    the list form is its patches alone (the analysis reads Config.is_aa for an old manifest)."""
    from patchbench.config import config_from_mapping

    variants = {
        "stock": [],
        "same": {"patches": [], "server_args": [], "env": {}},
        "args": {"patches": [], "server_args": ["--disable-overlap-schedule"]},
        "env": {"env": {"SGLANG_X": "1"}},
        "p": ["p"],
        "p_long": {"patches": ["p"]},
        "diff": {"patches": [{"diff": "a.diff"}]},
        "name": ["a.diff"],
    }
    raw = {"name": "x", "sglang": "0.5.23", "model": {"path": "m"}, "variants": variants}
    cfg = config_from_mapping(raw, check_files=False)
    assert cfg.aa_variants() == ["same"]
    assert config_from_mapping({**raw, "baseline": "p"}, check_files=False).aa_variants() == [
        "p_long"
    ]
    diff_base = config_from_mapping({**raw, "baseline": "diff"}, check_files=False)
    assert "name" not in diff_base.aa_variants()
