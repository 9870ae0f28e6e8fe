"""bench_serving's per-request bookkeeping (the oracle tests/suites/serving_oracle.py, docs/cases.md S1-S2) and
our summary recomputation (patchbench.suites.serving.validity, S3) and the
agreement with bench_serving's own summary on real recorded runs of both releases."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbench.suites.serving.parse import read_result_line, summary_metrics
from patchbench.suites.serving.validity import (
    APPROX,
    EXACT,
    compare_with_summary,
    recompute_from_details,
)
from tests.suites.serving_oracle import Chunk, request_from_chunks

DATA = Path(__file__).parent.parent / "data" / "serving"
RECORDED = sorted(DATA.glob("v*.jsonl"))
CLEAN = [p for p in RECORDED if "flagged" not in p.name]


# ---------------------------------------------------------------- S1: chunks carrying several tokens
def test_s1_multi_token_chunks():
    # sent at t=0; chunks at 100 ms (1 token), 120 ms (+4), 140 ms (+4), 160 ms (+3)
    chunks = [
        Chunk(0.100, "a", 1),
        Chunk(0.120, "abcde", 5),
        Chunk(0.140, "abcdefghi", 9),
        Chunk(0.160, "abcdefghijkl", 12),
    ]
    r = request_from_chunks(chunks, requested_len=12)
    assert r.success and not r.no_token
    assert r.ttft_s == pytest.approx(0.100)
    assert len(r.itl_s) == 11 == r.output_len - r.tokens_in_first_chunk  # 12 - 1
    assert r.itl_s[:8] == pytest.approx([0.005] * 8)
    assert r.itl_s[8:] == pytest.approx([0.02 / 3] * 3)  # 6.67 ms
    assert r.tpot_s == pytest.approx(0.060 / 11)  # 5.45 ms
    assert r.e2e_s == pytest.approx(0.160)


@pytest.mark.parametrize("first", [1, 3, 7])
def test_s1_itl_count_is_tokens_after_first_chunk(first):
    # neighbours: the first chunk carries several tokens; later ones 2 each
    chunks = [Chunk(0.05, "x", first)] + [
        Chunk(0.05 + 0.01 * k, "x" * (k + 1), first + 2 * k) for k in range(1, 6)
    ]
    r = request_from_chunks(chunks, requested_len=100)
    assert r.output_len == first + 10
    assert len(r.itl_s) == r.output_len - first
    assert sum(r.itl_s) == pytest.approx(0.05)  # last token at 100 ms, first chunk at 50 ms
    assert r.e2e_s == pytest.approx(0.10)


def test_s1_chunk_without_new_tokens_is_skipped():
    # a repeated count adds no ITL value and does not move the reference time (as the tool does)
    chunks = [Chunk(0.1, "a", 1), Chunk(0.2, "a", 1), Chunk(0.3, "ab", 2)]
    r = request_from_chunks(chunks, requested_len=2)
    assert r.itl_s == pytest.approx([0.2])


# ---------------------------------------------------------------- S2: output length from the stream
def test_s2_output_length_from_final_usage_chunk():
    chunks = [
        Chunk(0.10, "Hi", 1),
        Chunk(0.11, "Hi there", 2),
        Chunk(0.12, "Hi there!", 3),
        Chunk(0.13, "", 3),
    ]  # empty text chunk carrying completion_tokens=3
    r = request_from_chunks(chunks, requested_len=256)
    assert r.output_len == 3  # not 256
    assert len(r.itl_s) == 2
    assert r.e2e_s == pytest.approx(0.12)


def test_s2_chunk_without_fields_does_not_crash():
    chunks = [Chunk(0.1, "Hi", None), Chunk(0.2, "", None), Chunk(0.3, "Hi!", None)]
    r = request_from_chunks(chunks, requested_len=256)
    assert r.success and r.output_len == 2 and r.itl_s == pytest.approx([0.2])


# ---------------------------------------------------------------- S3: failures
def test_s3_http_503_is_failed_with_error_kept():
    r = request_from_chunks([], requested_len=16, http_status=503, reason="Service Unavailable")
    assert not r.success and r.output_len == 0 and r.error == "Service Unavailable"


def test_s3_200_without_token_is_failed_in_our_records():
    r = request_from_chunks([Chunk(0.1, "", None)], requested_len=16)
    assert not r.success and r.no_token
    assert r.output_len == 16  # what bench_serving records for it (it counts a success)


def _details_row(reqs, duration=2.0):
    """A result line like bench_serving's, built from (output_len, ttft_s, itl_s, error)."""
    return {
        "duration": duration,
        "completed": sum(1 for o, _, _, e in reqs if o and not e),
        "input_lens": [10] * len(reqs),
        "output_lens": [o for o, _, _, _ in reqs],
        "ttfts": [t for _, t, _, _ in reqs],
        "itls": [i for _, _, i, _ in reqs],
        "generated_texts": ["x"] * len(reqs),
        "errors": [e for _, _, _, e in reqs],
    }


def test_s3_recompute_counts_and_latencies_by_hand():
    # 10 requests, 2 answered with HTTP 503; one 200 response streamed no token
    ok = [(4, 0.1 + 0.01 * k, [0.02, 0.02, 0.03], "") for k in range(7)]
    no_tok = [(4, 0.0, [], "")]
    failed = [(0, 0.0, [], "Service Unavailable")] * 2
    row = _details_row(ok + no_tok + failed)
    tool = recompute_from_details(row, as_tool=True)
    clean = recompute_from_details(row, as_tool=False)
    assert tool["tool_completed_count"] == 8  # bench_serving's count includes the token-less one
    assert clean["completed_count"] == 7
    assert tool["total_output_tokens_count"] == 32 and clean["total_output_tokens_count"] == 28
    ttfts = [0.1 + 0.01 * k for k in range(7)]
    assert clean["ttft_mean_ms"] == pytest.approx(sum(ttfts) / 7 * 1000)
    assert tool["ttft_mean_ms"] == pytest.approx(sum(ttfts) / 8 * 1000)  # the 0 drags it down
    assert clean["itl_max_ms"] == pytest.approx(30.0)
    e2e = [t + 0.07 for t in ttfts]
    assert clean["e2e_latency_mean_ms"] == pytest.approx(sum(e2e) / 7 * 1000)
    assert clean["tpot_mean_ms"] == pytest.approx(0.07 / 3 * 1000)
    assert clean["concurrency"] == pytest.approx(sum(e2e) / 2.0)
    assert clean["request_throughput_req_s"] == pytest.approx(3.5)


# ---------------------------------------------------------------- agreement with the tool
@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.name)
def test_recompute_agrees_with_bench_serving_summary(path):
    row = read_result_line(path)
    assert all(not e for e in row["errors"]), "recordings are clean runs"
    tool = summary_metrics(row)
    ours = recompute_from_details(row, as_tool=True)
    # exact group: same inputs, same numpy calls
    for name in EXACT:
        if name in tool:
            assert ours[name] == pytest.approx(tool[name], rel=1e-9, abs=1e-9), name
    # approximate group: ttft + sum(itl) instead of the time of the stream's last chunk
    for name in APPROX:
        assert abs(ours[name] - tool[name]) <= max(0.05 * tool[name], 5.0), name
    assert compare_with_summary(tool, ours, rel_tol=0.05, abs_tol_ms=5.0) == []


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_itl_values_never_exceed_tokens_after_first(path):
    row = read_result_line(path)
    for out, itl in zip(row["output_lens"], row["itls"], strict=False):
        assert len(itl) <= max(out - 1, 0)  # a request that asked 0 tokens has none


def test_compare_flags_a_real_disagreement():
    tool = {"ttft_mean_ms": 100.0, "e2e_latency_mean_ms": 1000.0}
    ours = {"ttft_mean_ms": 100.0 + 1e-3, "e2e_latency_mean_ms": 1000.0}
    bad = compare_with_summary(tool, ours, rel_tol=0.05, abs_tol_ms=5.0)
    assert len(bad) == 1 and bad[0].startswith("ttft_mean_ms")
    ours = {"ttft_mean_ms": 100.0, "e2e_latency_mean_ms": 1060.0}  # 6 % > 5 %
    assert compare_with_summary(tool, ours, rel_tol=0.05, abs_tol_ms=5.0)[0].startswith("e2e")
