"""Parsing bench_serving's result line (patchbench.suites.serving.parse) on real recordings of both releases.

The recordings in tests/data/serving/ are real bench_serving runs against a real CPU sglang server
(tiny random Qwen2.5-VL; see tests/data/serving/README.md). Each test checks our parse against an
independent source: the table the tool PRINTED (its stdout), or numpy on the raw details.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from patchbench.suites.serving.parse import (
    ResultError,
    read_result_line,
    request_records,
    request_status,
    summary_metrics,
)

DATA = Path(__file__).parent.parent / "data" / "serving"
RECORDED = sorted(DATA.glob("v*.jsonl"))
CLEAN = [p for p in RECORDED if "flagged" not in p.name]

#: printed label -> our metric name (labels of both releases' printout)
PRINTED = {
    "Successful requests:": "tool_completed_count",
    "Benchmark duration (s):": "duration_s",
    "Total input tokens:": "total_input_tokens_count",
    "Total generated tokens:": "total_output_tokens_count",
    "Total generated tokens (retokenized):": "total_output_tokens_retokenized_count",
    "Request throughput (req/s):": "request_throughput_req_s",
    "Input token throughput (tok/s):": "input_throughput_tok_s",
    "Output token throughput (tok/s):": "output_throughput_tok_s",
    "Total token throughput (tok/s):": "total_throughput_tok_s",
    "Concurrency:": "concurrency",
    "Mean E2E Latency (ms):": "e2e_latency_mean_ms",
    "Median E2E Latency (ms):": "e2e_latency_median_ms",
    "Mean TTFT (ms):": "ttft_mean_ms",
    "Median TTFT (ms):": "ttft_median_ms",
    "P99 TTFT (ms):": "ttft_p99_ms",
    "Mean ITL (ms):": "itl_mean_ms",
    "Median ITL (ms):": "itl_median_ms",
    "P95 ITL (ms):": "itl_p95_ms",
    "P99 ITL (ms):": "itl_p99_ms",
    "Max ITL (ms):": "itl_max_ms",
}


def printed_table(stdout: str) -> dict[str, float]:
    """label -> value from the tool's printed table (40-char label column)."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"^(.{1,40}?:)\s+(-?[0-9.]+)\s*$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_parsed_summary_matches_printed_table(path):
    row = read_result_line(path)
    printed = printed_table(path.with_suffix(".stdout.txt").read_text())
    ours = summary_metrics(row)
    checked = 0
    for label, name in PRINTED.items():
        if label in printed:
            assert round(ours[name], 2) == pytest.approx(printed[label], abs=0.0051), label
            checked += 1
    assert checked == len(PRINTED)  # every label of the PR's block is printed by both releases


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_request_records_follow_the_contract(path):
    row = read_result_line(path)
    recs = request_records(row)
    n = len(row["ttfts"])
    assert set(recs) >= {
        "ttft_ms",
        "itl_ms",
        "e2e_ms",
        "input_len",
        "output_len",
        "generated_text",
        "error",
    }
    assert all(len(v) == n for v in recs.values())
    for i in range(n):
        ttft_ms = row["ttfts"][i] * 1000
        itl = np.array(row["itls"][i]) * 1000
        valid = not row["errors"][i] and row["output_lens"][i] > 0 and row["ttfts"][i] > 0
        assert recs["status"][i] == (
            "ok"
            if valid
            else "failed"
            if row["errors"][i] or not row["output_lens"][i]
            else "no_token"
        )
        if valid:
            assert recs["ttft_ms"][i] == pytest.approx(ttft_ms)
            assert recs["e2e_ms"][i] == pytest.approx(ttft_ms + itl.sum())
        else:
            assert recs["ttft_ms"][i] is None and recs["e2e_ms"][i] is None
        assert recs["itl_ms"][i] == pytest.approx(list(itl))


def test_flagged_recordings_hold_real_token_less_responses():
    # real runs on 0.5.1.post3: prompts longer than the context (the server streams an error
    # with HTTP 200) and an image prompt without the chat template. bench_serving counted every
    # request as successful; the token-less ones have TTFT 0 and no text.
    mixed = read_result_line(DATA / "v0513_flagged_notoken_mixed.jsonl")
    assert mixed["completed"] == 10
    recs = request_records(mixed)
    assert recs["status"].count("no_token") == sum(1 for t in mixed["ttfts"] if t == 0.0) == 5
    assert recs["status"].count("ok") == 5
    notemplate = read_result_line(DATA / "v0513_flagged_image_notemplate.jsonl")
    assert request_records(notemplate)["status"].count("no_token") == 1


def test_release_key_sets_differ_as_documented():
    old = read_result_line(DATA / "v0513_random_ids.jsonl")
    new = read_result_line(DATA / "v0523_random_ids.jsonl")
    assert "total_throughput" not in old and "total_throughput" in new
    assert "p90_ttft_ms" not in old and "p90_ttft_ms" in new
    assert "max_itl_ms" not in old and "max_itl_ms" not in new
    m_old = summary_metrics(old)
    # derived the way the tool prints it: (input + output tokens) / duration
    assert m_old["total_throughput_tok_s"] == pytest.approx(
        (old["total_input_tokens"] + old["total_output_tokens"]) / old["duration"]
    )
    assert "ttft_p90_ms" not in m_old  # absent, not invented
    assert summary_metrics(new)["ttft_p90_ms"] == pytest.approx(new["p90_ttft_ms"])


def test_max_itl_by_hand():
    row = read_result_line(DATA / "v0523_image.jsonl")
    all_itl = [x for itl in row["itls"] for x in itl]
    assert summary_metrics(row)["itl_max_ms"] == pytest.approx(max(all_itl) * 1000)


def test_request_status():
    assert request_status(16, 0.1, [0.01], "") == "ok"
    assert request_status(0, 0.0, [], "Service Unavailable") == "failed"
    assert request_status(0, 0.0, [], "") == "failed"  # 0.5.1.post3: empty reason on a non-200
    assert request_status(16, 0.0, [], "") == "no_token"  # tokens > 0 with TTFT 0
    assert request_status(1, 0.05, [], "") == "ok"  # one-token answer: no ITL value


def test_read_result_line_errors(tmp_path):
    with pytest.raises(ResultError, match="no output file"):
        read_result_line(tmp_path / "missing.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(ResultError, match="empty"):
        read_result_line(tmp_path / "e.jsonl")
    row = json.loads((DATA / "v0523_image.jsonl").read_text())
    for k in ("ttfts", "itls"):
        row.pop(k)
    (tmp_path / "nodetails.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ResultError, match="--output-details"):
        read_result_line(tmp_path / "nodetails.jsonl")


def test_appended_lines_take_the_last(tmp_path):
    a = json.loads((DATA / "v0523_image.jsonl").read_text())
    b = dict(a, duration=123.0)
    (tmp_path / "r.jsonl").write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n")
    assert read_result_line(tmp_path / "r.jsonl")["duration"] == 123.0


def test_infinity_rate_is_read():
    text = (DATA / "v0523_image.jsonl").read_text()
    assert '"request_rate": Infinity' in text
    assert read_result_line(DATA / "v0523_image.jsonl")["request_rate"] == float("inf")
