"""compare.json from synthetic run folders with known values (tests/helpers_runs.py)."""
from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats as sps

from helpers_runs import make_requests, make_run, mmmu_rows
from patchbench.compare import (CompareSettings, compare_run, guess_metric_info, pair_mmmu_records,
                                within_cell_kind)


def _row(cmp, metric, variant):
    rows = [r for r in cmp["metrics"] if r["metric"] == metric and r["variant"] == variant]
    assert len(rows) == 1, (metric, variant, [(r["metric"], r["variant"]) for r in cmp["metrics"]])
    return rows[0]


def _t_ci_pct(b, v, conf=0.95):
    """Independent paired t-interval on log ratios, in percent."""
    d = [math.log(y / x) for x, y in zip(b, v)]
    n = len(d)
    m, s = statistics.mean(d), statistics.stdev(d)
    h = sps.t.ppf(0.5 + conf / 2, n - 1) * s / math.sqrt(n)
    return 100 * math.expm1(m), 100 * math.expm1(m - h), 100 * math.expm1(m + h)


def test_verdicts_with_three_repeats(tmp_path):
    thr_b, thr_v = [100.0, 102.0, 98.0], [110.0, 111.5, 108.0]
    ttft_b, ttft_v = [50.0, 51.0, 49.0], [60.0, 62.0, 58.5]
    e2e_b, e2e_v = [1000.0, 1010.0, 990.0], [1001.0, 1005.0, 995.0]
    run = make_run(tmp_path, metrics={"serving": {
        "output_throughput_tok_s": {"baseline": thr_b, "patched": thr_v},
        "ttft_mean_ms": {"baseline": ttft_b, "patched": ttft_v},
        "e2e_latency_mean_ms": {"baseline": e2e_b, "patched": e2e_v}}})
    cmp = compare_run(run)
    assert json.loads((run / "compare.json").read_text()) == json.loads(json.dumps(cmp))
    assert cmp["schema"] == 1 and cmp["baseline"] == "baseline" and cmp["variants"] == ["patched"]
    assert cmp["aa_variants"] == []
    thr = _row(cmp, "output_throughput_tok_s", "patched")
    est, lo, hi = _t_ci_pct(thr_b, thr_v)
    assert thr["change_pct"] == pytest.approx(est) and thr["ci_low_pct"] == pytest.approx(lo)
    assert thr["ci_high_pct"] == pytest.approx(hi)
    assert thr["baseline_median"] == 100.0 and thr["variant_median"] == 110.0
    assert thr["baseline_repeats"] == thr_b and thr["variant_repeats"] == thr_v
    assert thr["verdict"] == "improved" and thr["ci_method"] == "t on log ratio (n=3)"
    assert thr["unit"] == "tok/s" and thr["better"] == "higher"
    assert _row(cmp, "ttft_mean_ms", "patched")["verdict"] == "regressed"   # lower is better
    e2e = _row(cmp, "e2e_latency_mean_ms", "patched")
    assert e2e["ci_low_pct"] < 0 < e2e["ci_high_pct"]
    assert e2e["verdict"] == "no significant change"


def test_incomplete_cells(tmp_path):
    run = make_run(tmp_path, metrics={"serving": {
        "output_throughput_tok_s": {"baseline": [100, 101, 99], "patched": [120, 121, 119]}}},
        cell_status={("patched", 1): "failed"})
    cmp = compare_run(run)
    r = _row(cmp, "output_throughput_tok_s", "patched")
    assert r["verdict"] == "incomplete"
    assert r["variant_repeats"] == [120.0, None, 119.0]
    assert r["n_pairs"] == 2                       # numbers still from the pairs that are ok
    assert any("patched/rep1: failed" in n for n in r["notes"])
    run2 = make_run(tmp_path / "b", metrics={"serving": {
        "output_throughput_tok_s": {"baseline": [100, 101], "patched": [120, 121]}}},
        cell_status={("baseline", 0): "missing"}, suite_status={("patched", 1, "serving"): "incomplete"})
    r2 = _row(compare_run(run2), "output_throughput_tok_s", "patched")
    assert r2["verdict"] == "incomplete" and r2["n_pairs"] == 0
    assert any("baseline/rep0: missing" in n and "patched/rep1: incomplete" in n for n in r2["notes"])


def test_missing_metric_is_incomplete(tmp_path):
    run = make_run(tmp_path, metrics={"serving": {
        "output_throughput_tok_s": {"baseline": [100, 101], "patched": [110, None]}}})
    r = _row(compare_run(run), "output_throughput_tok_s", "patched")
    assert r["verdict"] == "incomplete" and any("no value" in n for n in r["notes"])


def test_aa_noise_floor(tmp_path):
    b = [100.0, 100.0, 100.0, 100.0]
    aa = [104.0, 97.0, 103.0, 96.0]              # A/A noise of a few percent
    v = [103.0, 102.5, 103.5, 103.0]             # +3 %, consistent: t-interval excludes 0 ...
    run = make_run(tmp_path, variants={"baseline": [], "aa": [], "patched": ["p1"]},
                   metrics={"serving": {"output_throughput_tok_s":
                                        {"baseline": b, "aa": aa, "patched": v}}})
    cmp = compare_run(run)
    assert cmp["aa_variants"] == ["aa"]
    _, aa_lo, aa_hi = _t_ci_pct(b, aa)
    floor = max(abs(aa_lo), abs(aa_hi))
    r = _row(cmp, "output_throughput_tok_s", "patched")
    est, lo, hi = _t_ci_pct(b, v)
    assert lo > 0                                   # ... but 3 % is inside the A/A floor
    assert r["noise_floor_pct"] == pytest.approx(floor)
    assert est < floor
    assert r["verdict"] == "no significant change"
    assert any("noise floor" in n for n in r["notes"])
    assert _row(cmp, "output_throughput_tok_s", "aa")["noise_floor_pct"] is None
    # the same variant without the A/A runs would have been called improved
    run2 = make_run(tmp_path / "noaa", metrics={"serving": {"output_throughput_tok_s":
                                                           {"baseline": b, "patched": v}}})
    assert _row(compare_run(run2), "output_throughput_tok_s", "patched")["verdict"] == "improved"


def test_bootstrap_from_ten_repeats(tmp_path):
    rng = np.random.default_rng(4)
    b = list(100 * np.exp(rng.normal(0, 0.02, 12)))
    v = list(np.asarray(b) * 1.08 * np.exp(rng.normal(0, 0.01, 12)))
    run = make_run(tmp_path, metrics={"serving": {"output_throughput_tok_s": {"baseline": b, "patched": v}}},
                   compare={"seed": 7, "bootstrap_resamples": 1000,
                                             "min_repeats_for_bootstrap": 10})
    r = _row(compare_run(run), "output_throughput_tok_s", "patched")
    d = np.log(np.asarray(v) / np.asarray(b))
    ref = sps.bootstrap((d,), np.mean, n_resamples=1000, method="BCa", rng=np.random.default_rng(7))
    assert r["ci_method"].startswith("bootstrap BCa") and "n=12" in r["ci_method"]
    assert r["ci_low_pct"] == pytest.approx(100 * math.expm1(ref.confidence_interval.low))
    assert r["ci_high_pct"] == pytest.approx(100 * math.expm1(ref.confidence_interval.high))
    assert r["verdict"] == "improved"


def test_one_repeat_within_cell_intervals(tmp_path):
    rng = np.random.default_rng(1)
    n = 80
    ttft_b = rng.lognormal(np.log(60), 0.5, n)
    ttft_v = ttft_b * 0.8 * np.exp(rng.normal(0, 0.02, n))
    itl_b = [list(rng.lognormal(np.log(5), 0.1) * np.ones(20)) for _ in range(n)]
    itl_v = [list(np.asarray(x) * 0.9) for x in itl_b]
    rb, rv = make_requests(list(ttft_b), itl_b), make_requests(list(ttft_v), itl_v)
    run = make_run(tmp_path, metrics={"serving": {
        "ttft_mean_ms": {"baseline": [float(ttft_b.mean())], "patched": [float(ttft_v.mean())]},
        "itl_mean_ms": {"baseline": [5.0], "patched": [4.5]},
        "e2e_latency_p99_ms": {"baseline": [float(np.percentile(rb["e2e_ms"], 99))],
                               "patched": [float(np.percentile(rv["e2e_ms"], 99))]},
        "output_throughput_tok_s": {"baseline": [100.0], "patched": [130.0]}}},
        requests={("baseline", 0): rb, ("patched", 0): rv})
    cmp = compare_run(run)
    t = _row(cmp, "ttft_mean_ms", "patched")
    assert t["ci_method"].startswith("paired-request bootstrap") and f"n={n} requests" in t["ci_method"]
    assert t["change_pct"] == pytest.approx(100 * (ttft_v.mean() / ttft_b.mean() - 1))
    assert t["ci_high_pct"] < 0 and t["verdict"] == "improved"
    i = _row(cmp, "itl_mean_ms", "patched")
    assert i["ci_method"].startswith("request-block bootstrap")
    assert i["change_pct"] == pytest.approx(-10.0)
    e = _row(cmp, "e2e_latency_p99_ms", "patched")
    assert "of p99" in e["ci_method"] and e["verdict"] == "improved"
    thr = _row(cmp, "output_throughput_tok_s", "patched")
    assert thr["ci_low_pct"] is None and thr["verdict"] == "no significant change"
    assert thr["ci_method"].startswith("none (1 paired repeat")
    assert thr["change_pct"] == pytest.approx(30.0)


def test_within_cell_kind():
    assert within_cell_kind("ttft_p99_ms") == ("ttft", "p99")
    assert within_cell_kind("mean_ttft_ms") == ("ttft", "mean")
    assert within_cell_kind("e2e_latency_median_ms") == ("e2e", "median")
    assert within_cell_kind("itl_max_ms") == ("itl", "max")
    assert within_cell_kind("tpot_mean_ms") is None
    assert within_cell_kind("output_throughput_tok_s") is None


def test_output_identity(tmp_path):
    texts = [f"answer number {i}" for i in range(10)]
    changed = list(texts)
    changed[3] = "answer numbeX 3"      # first difference at character 12
    changed[7] = "answer number 7 and more"   # prefix: first difference at len("answer number 7")
    itl = [[5.0] * 3] * 10
    reqs = {("baseline", 0): make_requests([50.0] * 10, itl, texts),
            ("patched", 0): make_requests([50.0] * 10, itl, changed)}
    run = make_run(tmp_path, metrics={"serving": {"output_throughput_tok_s":
                                                  {"baseline": [100.0], "patched": [100.0]}}},
                   requests=reqs)
    ident = compare_run(run)["output_identity"]["patched"]
    sv = ident["serving"]
    assert (sv["n"], sv["identical"], sv["share"]) == (10, 8, 0.8)
    assert [(d["request"], d["char"]) for d in sv["first_diff"]] == [(3, 12), (7, 15)]
    assert ident["reference_share"] == 1.0 and ident["flag"] is True
    # with an A/A variant that is equally non-identical, the same share is not flagged
    reqs[("aa", 0)] = make_requests([50.0] * 10, itl, changed)
    run2 = make_run(tmp_path / "aa", variants={"baseline": [], "aa": [], "patched": ["p"]},
                    metrics={"serving": {"output_throughput_tok_s":
                                         {"baseline": [100.0], "aa": [100.0], "patched": [100.0]}}},
                    requests=reqs)
    ident2 = compare_run(run2)["output_identity"]
    assert ident2["patched"]["reference"] == "A/A share"
    assert ident2["patched"]["reference_share"] == pytest.approx(0.8)
    assert ident2["patched"]["flag"] is False


def test_mmmu_pairing_hand_computed(tmp_path):
    # baseline right on q0..q4, variant right on q1..q8: right->wrong 1 (q0), wrong->right 4
    va = ["correct"] * 5 + ["wrong"] * 5
    vb = ["wrong"] + ["correct"] * 8 + ["wrong"]
    subjects = ["Art"] * 5 + ["Math"] * 5
    ra, rb = mmmu_rows(va, subjects), mmmu_rows(vb, subjects)
    p = pair_mmmu_records(ra, rb)
    assert (p["right_to_wrong"], p["wrong_to_right"], p["flips"]) == (1, 4, 5)
    assert p["mcnemar_p"] == pytest.approx(2 * (1 + 5) / 32)   # exact binomial, 1 of 5 discordant
    assert p["acc_a"] == 0.5 and p["acc_b"] == 0.8
    assert p["subjects"]["Math"] == {"n": 5, "correct_a": 0, "correct_b": 4, "right_to_wrong": 0,
                                     "wrong_to_right": 4, "acc_a": 0.0, "acc_b": 0.8}
    run = make_run(tmp_path, metrics={"mmmu": {"mmmu_overall_acc": {"baseline": [0.5], "patched": [0.8]}}},
                   mmmu_records={("baseline", 0): ra, ("patched", 0): rb})
    mm = compare_run(run)["mmmu_pairs"]["patched"]
    assert (mm["right_to_wrong"], mm["wrong_to_right"]) == (1, 4)
    assert mm["mcnemar_p"] == pytest.approx(0.375)
    assert mm["identical_share"] == 1.0


def test_settings_validation_and_config_section(tmp_path):
    assert CompareSettings().confidence == 0.95
    assert CompareSettings().min_repeats_for_bootstrap == 50
    with pytest.raises(ValidationError):
        CompareSettings(bogus=1)
    with pytest.raises(ValidationError):
        CompareSettings(confidence=1.5)
    from patchbench.config import ConfigError, load_config
    y = tmp_path / "c.yaml"
    y.write_text("name: t\nsglang: 0.5.1.post3\nmodel: {path: m}\nvariants: {baseline: []}\n"
                 "compare:\n  confidence: 0.9\n  bogus_key: 1\n")
    with pytest.raises(ConfigError, match="bogus_key"):
        load_config(y, check_files=False)


def test_guess_metric_info():
    assert guess_metric_info("foo_tok_s").better == "higher"
    assert guess_metric_info("foo_ms").better == "lower"
    assert guess_metric_info("x_acc").unit == "acc"
    assert guess_metric_info("n_count").better == "none"


def test_counts_with_zeros_use_differences(tmp_path):
    run = make_run(tmp_path, metrics={"sync_probe": {
        "sync_d2h_reads_count": {"baseline": [2, 2], "patched": [0, 0]},
        "positions_mismatch_count": {"baseline": [0, 0], "patched": [0, 0]}}})
    cmp = compare_run(run)
    r = _row(cmp, "sync_d2h_reads_count", "patched")
    assert r["change_pct"] == pytest.approx(-100.0) and r["ci_method"] == "t on paired difference (n=2)"
    assert r["verdict"] == "improved"                    # sync_probe declares lower = better
    z = _row(cmp, "positions_mismatch_count", "patched")
    assert z["verdict"] == "no significant change" and z["change_pct"] is None
    assert cmp["sync_probe"]["patched"]["metrics"]["sync_d2h_reads_count"] == 0


def test_failed_requests_left_out_of_pairing(tmp_path):
    itl = [[5.0, 5.0]] * 4
    rb = make_requests([50.0, 50.0, 50.0, 50.0], itl, ["a", "b", "c", "d"])
    rv = make_requests([40.0, 40.0, 40.0, 40.0], itl, ["a", "b", "", "X"])
    rv["status"] = ["ok", "ok", "failed", "ok"]
    rv["ttft_ms"][2] = None
    run = make_run(tmp_path, metrics={"serving": {"ttft_mean_ms": {"baseline": [50.0], "patched": [40.0]}}},
                   requests={("baseline", 0): rb, ("patched", 0): rv})
    cmp = compare_run(run)
    sv = cmp["output_identity"]["patched"]["serving"]
    assert (sv["n"], sv["identical"]) == (3, 2) and sv["repeats"][0]["failed_either"] == 1
    r = _row(cmp, "ttft_mean_ms", "patched")
    assert "n=3 requests" in r["ci_method"] and r["change_pct"] == pytest.approx(-20.0)


def test_real_bench_serving_records(tmp_path):
    """The serving suite's own parser on a recorded bench_serving output (tests/data/serving):
    metric names, requests.json shape and the within-cell path fit together."""
    from pathlib import Path
    parse = pytest.importorskip("patchbench.suites.serving.parse")
    src = Path(__file__).parent / "data" / "serving" / "v0513_random_image.jsonl"
    if not src.is_file():
        pytest.skip("no recorded bench_serving output")
    row = parse.read_result_line(src)
    m = parse.summary_metrics(row)
    req = parse.request_records(row)
    changed = json.loads(json.dumps(req))
    changed["generated_text"][0] = (changed["generated_text"][0] or "") + " extra"
    run = make_run(tmp_path, metrics={"serving": {k: {"baseline": [v], "patched": [v]}
                                                  for k, v in m.items()}},
                   requests={("baseline", 0): req, ("patched", 0): changed})
    cmp = compare_run(run)
    ttft = _row(cmp, "ttft_mean_ms", "patched")
    assert ttft["ci_method"].startswith("paired-request bootstrap")
    assert ttft["change_pct"] == pytest.approx(0.0, abs=1e-9)
    assert ttft["ci_low_pct"] == pytest.approx(0.0, abs=1e-9) and ttft["verdict"] == "no significant change"
    assert _row(cmp, "itl_p99_ms", "patched")["ci_method"].startswith("request-block bootstrap")
    assert _row(cmp, "e2e_latency_median_ms", "patched")["ci_method"].startswith("paired-request")
    ok = sum(s == "ok" for s in req["status"])
    sv = cmp["output_identity"]["patched"]["serving"]
    assert sv["n"] == ok and sv["identical"] == ok - (req["status"][0] == "ok")
