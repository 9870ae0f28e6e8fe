"""The server's own /metrics (patchbench.run.server_metrics) on texts recorded from real CPU
servers of both pins, and as each timed suite's fingerprint in a fake-server run (fake server
port 31937): cell.json, compare.json and the report name what differs between the arms.

The files under tests/data/server_metrics/ are ``GET /metrics`` of a CPU server of each pin
(configs/demo-cpu.yaml's and configs/demo-cpu-0.5.23.yaml's server arguments plus
``--enable-metrics``), scraped before and after four ``/generate`` requests that share a
245-token prefix (max_new_tokens 8); their ``# HELP`` and histogram ``_bucket`` lines were
removed to keep them small."""

import json
import math
import textwrap
from pathlib import Path

import pytest

import tests.fake_server.fake_suites  # noqa: F401 - registers the fake suites
from patchbench.records import read_json
from patchbench.run import bench, server_metrics
from tests.run.test_bench_runner import SGLANG

DATA = Path(__file__).parent.parent / "data" / "server_metrics"


def snapshots(pin: str) -> tuple[server_metrics.Snapshot, server_metrics.Snapshot]:
    return tuple(
        server_metrics.parse((DATA / f"{pin}-{w}.txt").read_text()) for w in ("before", "after")
    )


def test_counters_deltas_and_hit_share_of_sglang_0_5_1():
    before, after = snapshots("0.5.1.post3")
    d = server_metrics.counter_deltas(before, after)
    # each request's meta_info said prompt_tokens 255 and cached_tokens 0, 245, 245, 245
    assert d["sglang:prompt_tokens_total"] == 1023 - 3 == 4 * 255
    assert d["sglang:cached_tokens_total"] == 735 == 3 * 245
    assert d["sglang:num_requests_total"] == 4
    assert d["sglang:generation_tokens_total"] == 34 - 2 == 4 * 8
    assert d["sglang:e2e_request_latency_seconds_count"] == 4
    assert server_metrics.hit_share(d) == pytest.approx(735 / 1020)
    fp = server_metrics.fingerprint(before, after)
    assert fp.cache_hit_share == pytest.approx(0.7205882353)
    assert fp.gauges["sglang:num_running_reqs"] == [0.0, 0.0]
    assert fp.gauges["sglang:token_usage"] == [0.0, 0.03]
    assert fp.gauges["sglang:num_used_tokens"] == [0.0, 245.0]


def test_counters_deltas_and_hit_share_of_sglang_0_5_23():
    before, after = snapshots("0.5.23")
    d = server_metrics.counter_deltas(before, after)
    # cached tokens carry a cache_source label on 0.5.23 (device here: 3 requests x 244); the
    # server's own warm-up request (44 prompt tokens, 8 generated, nothing cached) finished
    # between the scrapes besides the four requests of 253 prompt tokens
    assert d["sglang:cached_tokens_total"] == 732 == 3 * 244
    assert d["sglang:prompt_tokens_total"] == 1059 - 3 == 4 * 253 + 44
    assert d["sglang:num_requests_total"] == 5
    assert d["sglang:generation_tokens_total"] == 42 - 2 == 5 * 8
    assert server_metrics.hit_share(d) == pytest.approx(732 / 1056)
    assert "sglang:fwd_occupancy" in (DATA / "0.5.23-after.txt").read_text()  # NaN: left out
    assert "sglang:fwd_occupancy" not in after.gauges
    assert after.gauges["sglang:kv_used_tokens"] == 254.0
    assert after.gauges["sglang:max_total_num_tokens"] == 8192.0


def test_the_limits_both_pins_log_at_start():
    # the lines of the servers the files above were recorded from
    lines = {
        "0.5.1.post3": "[2026-12-07 15:24:51] max_total_num_tokens=8192, chunked_prefill_size=4096, "
        "max_prefill_tokens=16384, max_running_requests=4096, context_len=4096, "
        "available_gpu_mem=21.18 GB",
        "0.5.23": "[2026-12-07 15:26:19] max_total_num_tokens=8192, chunked_prefill_size=4096, "
        "max_prefill_tokens=16384, max_running_requests=2048, context_len=4096, "
        "available_cpu_mem=20.27 GB",
    }
    got = {p: server_metrics.LOGGED_LIMITS.search(x).group(1, 4) for p, x in lines.items()}
    assert got == {"0.5.1.post3": ("8192", "4096"), "0.5.23": ("8192", "2048")}


def test_label_sets_buckets_and_foreign_lines():
    text = textwrap.dedent("""\
        # HELP sglang:prompt_tokens_total Number of prefill tokens processed.
        # TYPE sglang:prompt_tokens_total counter
        sglang:prompt_tokens_total{is_streaming="false"} 3.0
        sglang:prompt_tokens_total{is_streaming="true"} 4.0
        # TYPE sglang:token_usage gauge
        sglang:token_usage{tp_rank="0"} 0.25
        sglang:token_usage{tp_rank="1"} 0.5
        # TYPE sglang:ttft_seconds histogram
        sglang:ttft_seconds_bucket{le="0.1"} 2.0
        sglang:ttft_seconds_bucket{le="+Inf"} 3.0
        sglang:ttft_seconds_sum 0.75
        sglang:ttft_seconds_count 3.0
        # TYPE process_cpu_seconds_total counter
        process_cpu_seconds_total 12.0
        """)
    snap = server_metrics.parse(text)
    assert snap.counters == {
        "sglang:prompt_tokens_total": 7.0,
        "sglang:ttft_seconds_sum": 0.75,
        "sglang:ttft_seconds_count": 3.0,
    }
    assert snap.gauges == {"sglang:token_usage": 0.5}
    assert server_metrics.hit_share({"sglang:prompt_tokens_total": 0.0}) is None
    with pytest.raises(ValueError):
        server_metrics.parse('sglang:x_total{a="1" 2\n')


CONFIG = """\
    name: metrics-test
    sglang: "{sglang}"
    model: {{path: "{model}"}}
    server: {{port: 31937, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2,
             flush_pause_s: 0.1, metrics: {metrics}}}
    variants:
      baseline: []
      control: []
    schedule: {{repeats: 1}}
    suites:
      fake: {{n: 2}}
"""


def run(tmp_path: Path, fake_env, metrics: str = "true") -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    cfg = tmp_path / "cfg.yaml"
    body = CONFIG.format(sglang=SGLANG, model=tmp_path / "model", metrics=metrics)
    cfg.write_text(textwrap.dedent(body))
    return bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")


def test_an_aa_run_records_the_fingerprint_and_finds_no_difference(fake_env, tmp_path):
    run_dir = run(tmp_path, fake_env)
    cell = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert "--enable-metrics" in cell["server"]["command"]
    fp = cell["server_metrics"]["fake"]
    # two /generate of the suite between the scrapes, 10 prompt tokens each, none cached
    assert fp["counters"] == {
        "sglang:cached_tokens_total": 0.0,
        "sglang:num_requests_total": 2.0,
        "sglang:prompt_tokens_total": 20.0,
    }
    assert fp["cache_hit_share"] == 0.0
    assert fp["gauges"] == {"sglang:num_running_reqs": [0.0, 0.0]}
    assert 0 < fp["scrape_s"] < cell["timings_s"]["suite:fake"] + 5
    assert cell["server_config"] == {
        "max_running_requests": 64,
        "logged_max_total_num_tokens": 8192,
        "logged_max_running_requests": 64,
    }
    srv = read_json(run_dir / "compare.json")["server"]
    assert srv["hit_share"] == {"fake": {"baseline": 0.0, "control": 0.0}}
    assert srv["warnings"] == [] and srv["differences"] == []
    assert "Warning (server)" not in (run_dir / "report.md").read_text()
    details = (run_dir / "report-details.md").read_text()
    assert "| fake | 0.0% | 0.0% |" in details
    assert "No difference between the arms' fingerprints beyond the tolerances" in details
    # a suite's parts (the traffic suite's workloads) each compared: 40.0 % and 46.5 % are 6.5
    # points apart (named), 40.0 % and 44.0 % are 4 (not)
    from patchbench.analysis.build import build_comparison
    from patchbench.analysis.comparison import Row
    from patchbench.analysis.fingerprints import server_fingerprints
    from patchbench.analysis.rundata import read_run

    data = read_run(run_dir)
    cmp = build_comparison(data)
    for part, x in (("sp", 46.5), ("chat", 44.0)):
        m = f"prefix_cache_hit_pct@{part}"
        cmp.rows.append(Row(suite="traffic", metric=m, variant="control", kind="descriptive"))
        cmp.rows[-1].baseline_value, cmp.rows[-1].variant_value = 40.0, x
    assert server_fingerprints(data, cmp).warnings == [
        "traffic sp: the prefix-cache hit rate was 40.0% on baseline and 46.5% on control (the "
        "server's counters over its measured calls), more than 5 points apart (nothing is "
        "corrected)"
    ]


def test_an_arm_whose_counters_and_configuration_differ_is_named(fake_env, tmp_path):
    fake_env["control/rep0"] = {
        "FAKE_PROMPT_TOKENS": "12",
        "FAKE_CACHED_TOKENS": "6",
        "FAKE_MAX_RUNNING_REQUESTS": "32",
    }
    run_dir = run(tmp_path, fake_env)
    fp = read_json(run_dir / "control" / "rep0" / "cell.json")["server_metrics"]["fake"]
    assert fp["cache_hit_share"] == 12 / 24
    srv = read_json(run_dir / "compare.json")["server"]
    hit = (
        "fake: the prefix-cache hit rate was 0.0% on baseline and 50.0% on control (the "
        "server's cached / prompt token counters), more than 5 points apart: the speed rows "
        "compare different cache states (the change may alter caching; nothing is corrected)"
    )
    config = [
        f"control's server ran with {k} = 32, baseline's with 64 (/server_info or the log)"
        for k in ("logged_max_running_requests", "max_running_requests")
    ]
    assert srv["warnings"] == [*config, hit]
    assert srv["differences"] == [
        "fake: sglang:prompt_tokens_total rose by 20 per suite on baseline, 24 on control"
    ]
    report = (run_dir / "report.md").read_text()
    assert f"**Warning (server): {hit}.**" in report
    assert f"**Warning (server): {config[0]}.**" in report
    details = (run_dir / "report-details.md").read_text()
    assert "| fake | 0.0% | 50.0% |" in details
    assert f"- {srv['differences'][0]}" in details


def test_metrics_off_launches_without_them_and_records_nothing(fake_env, tmp_path):
    run_dir = run(tmp_path, fake_env, metrics="false")
    cell = read_json(run_dir / "baseline" / "rep0" / "cell.json")
    assert "--enable-metrics" not in cell["server"]["command"]
    assert "server_metrics" not in cell and "server_config" not in cell
    assert "server" not in read_json(run_dir / "compare.json")
    assert "## Server metrics" not in (run_dir / "report-details.md").read_text()
    assert math.isfinite(json.loads((run_dir / "compare.json").read_text())["repeats"])
