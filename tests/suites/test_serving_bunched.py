"""A stalled server that flushes every stream at once: the serving suite withholds the run's
TPOT and ITL ("bunched"), so neither the report nor the nightly history ever sees them; real
GPU-like and CPU-like runs, and the recorded CPU runs, are not flagged."""

from __future__ import annotations

import json

from patchbench.suites.serving import Params, run
from patchbench.suites.serving.parse import request_records
from patchbench.suites.serving.validity import BUNCHED_TPOT_MS, bunched_check
from tests.suites.test_serving_run import DATA, fake_pkg, make_ctx  # noqa: F401 - a fixture

# the stalled night: TTFT 2.6 s, then all 1023 other tokens within 11.253 ms (0.011 ms a token)
STALL_E2E_MS = 2600.0 + 1023 * 0.011


def test_the_stalled_night_is_flagged():
    """200 requests of 1024 tokens, TTFT 2600 ms, E2E 2611.253 ms: (2611.253 - 2600) / 1023 =
    0.011 ms a token, under 0.05 ms in every request."""
    (err,) = bunched_check([2600.0] * 200, [STALL_E2E_MS] * 200, [1024] * 200, ["ok"] * 200)
    assert err.startswith("bunched: 200 of 200 requests got all tokens in one read")
    assert "20,000 tokens/s" in err and "median TPOT 0.011 ms" in err
    assert err.endswith("TPOT and ITL metrics withheld")


def test_gpu_and_cpu_like_runs_are_not_flagged():
    """An H200-like run (TTFT 50 ms, a token every 5 ms: E2E 50 + 1023 x 5 = 5165 ms) and CPU-like
    runs (32 tokens every 30 ms or 200 ms) stream 100 times slower than the floor."""
    assert BUNCHED_TPOT_MS == 0.05
    assert bunched_check([50.0] * 64, [5165.0] * 64, [1024] * 64, ["ok"] * 64) == []
    for step in (30.0, 200.0):
        e2e = 80.0 + 31 * step
        assert bunched_check([80.0] * 24, [e2e] * 24, [32] * 24, ["ok"] * 24) == []


def test_half_of_the_requests_bunched_is_the_limit():
    """From half on: 2 of 4 stalled requests flag the run (median TPOT (0.011 + 5) / 2 = 2.51
    ms), 1 of 4 does not; failed requests and one-token answers are not counted."""
    ttft, e2e = [2600.0, 2600.0, 50.0, 50.0], [STALL_E2E_MS, STALL_E2E_MS, 5165.0, 5165.0]
    (err,) = bunched_check(ttft, e2e, [1024] * 4, ["ok"] * 4)
    assert err.startswith("bunched: 2 of 4 requests") and "median TPOT 2.51 ms" in err
    assert bunched_check(ttft[1:] + [50.0], e2e[1:] + [5165.0], [1024] * 4, ["ok"] * 4) == []
    # 3 stalled, but 2 of them failed or answered one token: 1 of 2 counted, flagged
    got = bunched_check(
        ttft[:2] + [2600.0, 50.0],
        e2e[:2] + [2600.0, 5165.0],
        [1024, 1024, 1, 1024],
        ["failed", "ok", "ok", "ok"],
    )
    assert len(got) == 1 and got[0].startswith("bunched: 1 of 2 requests")


def test_a_recorded_cpu_run_with_a_lagging_front_end_is_not_flagged():
    """The recorded 0.5.1.post3 CPU run: requests 9-15 (7 of 20) got their 15 tokens after the
    first within 6-31 us each (its front end lagged behind a 5 ms decode step), the other 13
    streamed: a minority, the run stays valid (its ITL is withheld by the ITL check instead)."""
    recs = request_records(json.loads((DATA / "v0513_random_ids.jsonl").read_text()))
    per = [
        (e - t) / (n - 1)
        for t, e, n in zip(recs["ttft_ms"], recs["e2e_ms"], recs["output_len"], strict=True)
    ]
    assert [i for i, x in enumerate(per) if x < BUNCHED_TPOT_MS] == list(range(9, 16))
    assert bunched_check(recs["ttft_ms"], recs["e2e_ms"], recs["output_len"], recs["status"]) == []


def test_the_suite_withholds_tpot_and_itl_of_a_stalled_run(tmp_path, fake_pkg):  # noqa: F811
    """The recorded run with every request stalled (TTFT 2.6 s, then 15 tokens 0.011 ms apart):
    its TPOT and ITL metrics are withheld with the bunched reason (not judged, never stored as
    measurements); TTFT and E2E, what the user waited, stay. The CPU demo's real server bunches
    every stream at one request at a time too (0.5.1.post3, a CI run), so the cell is not failed."""
    row = json.loads((DATA / "v0513_random_ids.jsonl").read_text())
    row["ttfts"] = [2.6] * 20
    row["itls"] = [[0.011e-3] * 15 for _ in range(20)]
    rec = tmp_path / "stalled.jsonl"
    rec.write_text(json.dumps(row) + "\n")
    res = run(
        make_ctx(tmp_path, fake_pkg, f"copy:{rec}"),
        Params(dataset_name="random-ids", num_prompts=20, max_concurrency=4, output_len=16),
    )
    assert res.status == "ok"
    assert not any(k.startswith(("itl_", "tpot_")) for k in res.metrics)
    assert "ttft_median_ms" in res.metrics and "e2e_latency_median_ms" in res.metrics
    withheld = res.meta["not_judged"]
    assert {"itl_median_ms", "tpot_median_ms"} <= set(withheld)
    (err,) = {withheld["itl_median_ms"]}
    assert err.startswith("bunched: 20 of 20 requests got all tokens in one read")
    assert "median TPOT 0.011 ms" in err
