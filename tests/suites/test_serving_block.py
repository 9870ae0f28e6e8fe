"""The PR-style "Serving Benchmark Result" block (patchbench.suites.serving.block)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbench.records import write_json
from patchbench.suites.serving import report_block
from patchbench.suites.serving.block import TITLE, render_block
from patchbench.suites.serving.parse import read_result_line, summary_metrics

DATA = Path(__file__).parent.parent / "data" / "serving"

# The PR's "Before" block (sglang PR #9460), verbatim, trailing spaces included.
PR_BEFORE = """\
============ Serving Benchmark Result ============
Backend:                                 sglang    
Traffic request rate:                    inf       
Max request concurrency:                 16        
Successful requests:                     200       
Benchmark duration (s):                  79.12     
Total input tokens:                      13654     
Total generated tokens:                  204800    
Total generated tokens (retokenized):    124526    
Request throughput (req/s):              2.53      
Input token throughput (tok/s):          172.58    
Output token throughput (tok/s):         2588.58   
Total token throughput (tok/s):          2761.16   
Concurrency:                             15.40     
----------------End-to-End Latency----------------
Mean E2E Latency (ms):                   6091.23   
Median E2E Latency (ms):                 6082.71   
---------------Time to First Token----------------
Mean TTFT (ms):                          97.26     
Median TTFT (ms):                        65.02     
P99 TTFT (ms):                           511.28    
---------------Inter-Token Latency----------------
Mean ITL (ms):                           5.86      
Median ITL (ms):                         5.89      
P95 ITL (ms):                            6.10      
P99 ITL (ms):                            6.34      
Max ITL (ms):                            38.79     
==================================================
"""

PR_BEFORE_METRICS = {
    "tool_completed_count": 200,
    "duration_s": 79.12,
    "total_input_tokens_count": 13654,
    "total_output_tokens_count": 204800,
    "total_output_tokens_retokenized_count": 124526,
    "request_throughput_req_s": 2.53,
    "input_throughput_tok_s": 172.58,
    "output_throughput_tok_s": 2588.58,
    "total_throughput_tok_s": 2761.16,
    "concurrency": 15.40,
    "e2e_latency_mean_ms": 6091.23,
    "e2e_latency_median_ms": 6082.71,
    "ttft_mean_ms": 97.26,
    "ttft_median_ms": 65.02,
    "ttft_p99_ms": 511.28,
    "itl_mean_ms": 5.86,
    "itl_median_ms": 5.89,
    "itl_p95_ms": 6.10,
    "itl_p99_ms": 6.34,
    "itl_max_ms": 38.79,
}


def tool_block(stdout_text: str) -> str | None:
    """The block exactly as the release's bench_serving printed it (from its stdout), or None."""
    lines = stdout_text.splitlines()
    for i, ln in enumerate(lines):
        if ln.rstrip() == TITLE:
            for j in range(i + 1, len(lines)):
                if lines[j].rstrip() == "=" * 50:
                    return "\n".join(lines[i : j + 1]) + "\n"
    return None


def test_renders_the_prs_block_exactly():
    meta = {"backend": "sglang", "request_rate": "inf", "max_concurrency": 16}
    assert render_block(PR_BEFORE_METRICS, meta) == PR_BEFORE


def test_label_column_is_40_chars():
    block = render_block(
        PR_BEFORE_METRICS, {"backend": "sglang", "request_rate": "inf", "max_concurrency": None}
    )
    for line in block.splitlines():
        if ":" in line:  # "{:<40} {:<10}": label padded to 40, a space, value padded to 10
            assert line[:40].rstrip().endswith(":") and line[40] == " " and len(line) == 51
        else:
            assert len(line) == 50
    assert "Max request concurrency:                 not set   " in block


def test_matches_bench_serving_0513_printout_on_a_real_run():
    # 0.5.1.post3 prints exactly the PR's layout: our rendering of its parsed result line must
    # equal its own printout, character for character
    for name in ("v0513_random_ids", "v0513_random_image"):
        row = read_result_line(DATA / f"{name}.jsonl")
        printed = tool_block((DATA / f"{name}.stdout.txt").read_text())
        meta = {
            "backend": row["backend"],
            "request_rate": "{}".format(row["request_rate"]),
            "max_concurrency": row["max_concurrency"],
        }
        assert render_block(summary_metrics(row), meta) == printed


def test_report_block_reads_summary_json(tmp_path):
    write_json(
        tmp_path / "summary.json",
        {
            "suite": "serving",
            "status": "ok",
            "metrics": PR_BEFORE_METRICS,
            "meta": {"backend": "sglang", "request_rate": "inf", "max_concurrency": 16},
        },
    )
    assert report_block(tmp_path) == PR_BEFORE


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[1, 2]", "not a JSON object"),
        ('{"metrics": [1], "meta": {}}', "'metrics' and 'meta' must be JSON objects"),
        ('{"metrics": {"duration_s": "fast"}, "meta": {}}', "metrics.duration_s = 'fast'"),
        ('{"metrics": {', "summary.json"),
    ],
)
def test_report_block_of_a_mis_shaped_summary_names_the_file(tmp_path, content, message):
    (tmp_path / "summary.json").write_text(content)
    with pytest.raises(ValueError, match=message) as e:
        report_block(tmp_path)
    assert str(tmp_path / "summary.json") in str(e.value)


def test_tool_block_of_0523_keeps_its_own_lines():
    block = tool_block((DATA / "v0523_image.stdout.txt").read_text())
    assert block.startswith("============ Serving Benchmark Result ============")
    assert "P90 TTFT (ms):" in block and block.rstrip().endswith("=" * 50)


CLIENT = {
    "processes": 1,
    "send_lag_median_ms": 0.85,
    "send_gap_mean_ms": 41.7,
    "loop_lag_median_ms": 0.63,
    "cpu_share": 0.058,
    "bound": None,
}


def _summary(d: Path, meta: dict, metrics: dict | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    write_json(d / "summary.json", {"metrics": metrics or {}, "meta": meta})


def test_each_point_block_ends_with_its_clients_state(tmp_path):
    meta = {"backend": "sglang", "request_rate": "inf", "max_concurrency": 16, "client": CLIENT}
    _summary(tmp_path, meta, PR_BEFORE_METRICS)
    assert report_block(tmp_path) == PR_BEFORE + (
        "client (1 process): send lag median 0.85 ms against a mean gap of 41.7 ms between sends, "
        "event-loop lag median 0.63 ms, CPU 6 % of a core: not client-bound\n"
    )


def test_a_capacity_search_shows_each_probe_in_order_with_its_answer(tmp_path):
    """The capacity summary has no bench_serving numbers of its own (it printed a block of n/a
    before): one block per probe, in the order run, headed by its attainment, a client-bound one
    named."""
    bound = dict(CLIENT, bound="median send lag 2.54 ms above 10% of the mean gap")
    probes = [
        {"load": 10, "score": 1.0, "meets": True},
        {"load": 20, "score": 0.525, "meets": False},
        {"load": 15, "score": None, "meets": None, "client_bound": bound["bound"]},
    ]
    _summary(tmp_path, {"capacity": {"probes": probes}}, {"capacity_probes_count": 3.0})
    for p, client in zip(probes, (CLIENT, CLIENT, bound), strict=True):
        meta = {"backend": "sglang", "max_concurrency": p["load"], "client": client}
        _summary(tmp_path / "probes" / f"c{p['load']}", meta, PR_BEFORE_METRICS)
    text = report_block(tmp_path)
    heads = [ln for ln in text.splitlines() if ln.startswith("[probe")]
    assert heads == [
        "[probe c10, 1 of 3: 100 % of requests meet the SLO (meets)]",
        "[probe c20, 2 of 3: 52 % of requests meet the SLO (fails)]",
        "[probe c15, 3 of 3: client-bound, not judged (median send lag 2.54 ms above 10% of the "
        "mean gap)]",
    ]
    assert text.count(TITLE) == 3 and "nan" not in text and "n/a" not in text
    assert text.rstrip().endswith("client-bound: median send lag 2.54 ms above 10% of the mean gap")
