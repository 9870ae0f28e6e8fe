"""Is the client the bottleneck? (patchbench/suites/serving/clients.py, clientwatch.py.) The send
lags, the client-bound rule and the merge of several processes' rows on hand-made records; a
client-bound sweep point and capacity probe withheld; and the release's real bench_serving, run
under clientwatch.py against the fake server (tests/fake_server): unthrottled it is not
client-bound, throttled (CPU burnt in its event loop) it is, and two processes sharing the
prompts and the concurrency give the one process's numbers at low load."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from patchbench.records import read_json
from patchbench.suite import ServerInfo, SuiteResult
from patchbench.suites.serving import Params, point, run
from patchbench.suites.serving import clients as cl
from patchbench.suites.serving.capacity import CAPACITY
from patchbench.suites.serving.parse import METRICS
from patchbench.suites.serving.points import merge_points
from patchbench.suites.serving.sweep import Sweep
from tests.helpers import suite_context
from tests.suites.test_serving_multi_point import pkg, recording_ctx  # noqa: F401 (fixture)

# --- send lags and the rule, by hand ------------------------------------------------------------


def test_split_shares_a_concurrency():
    assert cl.split(8, 3) == [3, 3, 2]
    assert cl.split(2, 2) == [1, 1]
    assert cl.split(None, 2) == [None, None]


def test_send_lag_against_the_freed_slot():
    # concurrency 2 at rate inf: requests 0 and 1 are due at 0, request 2 when the first request
    # to end (at 1.0 s) frees its slot, request 3 at the second end (1.5 s)
    reqs = [[0.0, 0.001, 1.0], [0.0, 0.002, 1.5], [0.0, 1.004, 2.0], [0.0, 1.503, 2.6]]
    assert cl.send_lags(reqs, [], 2, float("inf")) == pytest.approx([0.001, 0.002, 0.004, 0.003])


def test_send_lag_against_the_arrival_schedule():
    # rate 4 req/s, gaps drawn 0.5, 0.25, 1.0 s: due at 0, 0.5, 0.75
    reqs = [[0.0, 0.01, 2.0], [0.5, 0.52, 2.0], [0.8, 0.90, 2.0]]
    assert cl.send_lags(reqs, [0.5, 0.25, 1.0], None, 4.0) == pytest.approx([0.01, 0.02, 0.15])
    # with a concurrency of 1 as well, request 1 waits for request 0's end (1.0 s)
    reqs = [[0.0, 0.01, 1.0], [0.5, 1.02, 2.0], [1.1, 2.05, 3.0]]
    assert cl.send_lags(reqs, [0.5, 0.25, 1.0], 1, 4.0) == pytest.approx([0.01, 0.02, 0.05])


def _rec(requests, cpu_s=0.1, wall_s=2.6, gaps=(), start=100.0, loop=(0.001, 0.002, 0.003)):
    return {
        "requests": [list(r) for r in requests],
        "gaps_s": list(gaps),
        "loop_lag_s": list(loop),
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "start": start,
        "indices": None,
    }


REQS = [[0.0, 0.001, 1.0], [0.0, 0.002, 1.5], [0.0, 1.004, 2.0], [0.0, 1.503, 2.6]]


def test_the_rule_by_hand():
    st = cl.process_state(_rec(REQS), 2, float("inf"))
    # lags 1, 2, 4, 3 ms: median 2.5 ms; sends 1 ms .. 1503 ms apart over 3 gaps: 500.67 ms
    assert st["send_lag_median_ms"] == pytest.approx(2.5)
    assert st["send_gap_mean_ms"] == pytest.approx(1502 / 3)
    assert st["loop_lag_median_ms"] == pytest.approx(2.0) and st["loop_lag_max_ms"] == 3.0
    assert st["cpu_share"] == pytest.approx(0.1 / 2.6) and st["bound"] is None
    # a client at 95 % of a core
    hot = cl.process_state(_rec(REQS, cpu_s=2.47), 2, float("inf"))
    assert hot["bound"] == "the client process used 95% of a core (> 90%)"
    # the two freed slots taken 60 ms late: lags 1, 2, 60, 60 ms
    late = [[0.0, 0.001, 1.0], [0.0, 0.002, 1.5], [0.0, 1.06, 2.0], [0.0, 1.56, 2.6]]
    st = cl.process_state(_rec(late), 2, float("inf"))
    assert st["send_lag_median_ms"] == pytest.approx(31.0)  # (2 + 60) / 2
    assert st["bound"] is None  # 31 <= 10 % of the mean gap (1560 - 1) / 3 = 519.7 ms
    # request 1 sent 60 ms late too: lags 1, 60, 60, 60 ms, median 60 > 51.97 ms
    later = [[0.0, 0.001, 1.0], [0.0, 0.06, 1.5], [0.0, 1.06, 2.0], [0.0, 1.56, 2.6]]
    st = cl.process_state(_rec(later), 2, float("inf"))
    assert st["send_lag_median_ms"] == pytest.approx(60.0)
    assert st["bound"].startswith("median send lag 60 ms above 10% of the mean gap")
    # a burst (rate inf, no concurrency) has no schedule to lag: the same sends are not bound
    assert cl.process_state(_rec(later), None, float("inf"))["bound"] is None


def test_several_processes_report_the_worst_and_name_the_bound_one():
    a, b = _rec(REQS, start=100.0), _rec(REQS, cpu_s=2.47, start=100.004)
    st = cl.client_state([a, b], 4, float("inf"))
    assert st["processes"] == 2 and st["requests"] == 8
    assert st["cpu_share"] == pytest.approx(0.95)
    assert st["bound"] == "client 1: the client process used 95% of a core (> 90%)"
    assert st["start_skew_ms"] == pytest.approx(4.0)


def test_merge_rows_puts_the_prompts_back_in_order_over_the_union_span():
    def row(ttfts, conc):
        return {
            "backend": "sglang",
            "dataset_name": "random-ids",
            "request_rate": "inf",
            "max_concurrency": conc,
            "input_lens": [8] * len(ttfts),
            "output_lens": [3] * len(ttfts),
            "ttfts": ttfts,
            "itls": [[0.05, 0.05]] * len(ttfts),
            "generated_texts": [f"t{x}" for x in ttfts],
            "errors": [""] * len(ttfts),
            "total_output_tokens_retokenized": 2 * len(ttfts),
        }

    rows = [row([0.01, 0.03], 1), row([0.02, 0.04], 1)]
    recs = [
        {"indices": [0, 2], "start": 10.0, "wall_s": 2.0},
        {"indices": [1, 3], "start": 10.5, "wall_s": 2.5},
    ]
    m = cl.merge_rows(rows, recs)
    assert m["ttfts"] == [0.01, 0.02, 0.03, 0.04]
    assert m["generated_texts"] == ["t0.01", "t0.02", "t0.03", "t0.04"]
    assert m["duration"] == 3.0  # 10.0 to 13.0
    assert m["max_concurrency"] == 2 and m["completed"] == 4
    assert m["output_throughput"] == pytest.approx(12 / 3.0)
    assert m["request_throughput"] == pytest.approx(4 / 3.0)
    assert m["median_ttft_ms"] == pytest.approx(25.0)
    assert m["p99_itl_ms"] == pytest.approx(50.0)
    assert m["mean_e2e_latency_ms"] == pytest.approx(125.0)  # 25 + 2 x 50
    assert m["total_output_tokens_retokenized"] == 8


def test_clients_config_is_checked():
    with pytest.raises(ValueError, match="not with a request rate"):
        Params(clients=2, request_rate=4.0)
    with pytest.raises(ValueError, match="concurrency of at least 3"):
        Params(clients=3, max_concurrency=2)
    with pytest.raises(ValueError, match="at least 2 prompts"):
        Params(clients=2, sweep=Sweep(points=[1, 4]))
    assert Params(clients=2, max_concurrency=8).clients == 2


def test_plan_shares_the_concurrency_and_keeps_one_prompt_list(tmp_path):
    argv = ["py", "-m", "sglang.bench_serving", "--num-prompts", "8", "--seed", "1"]
    argv += ["--max-concurrency", "5", "--output-file", str(tmp_path / "result.jsonl")]
    cmd, outputs = cl.plan(argv, tmp_path, 2)
    assert cmd == ["py", str(cl.SCRIPT), str(tmp_path / "clients.json")]
    got = read_json(tmp_path / "clients.json")
    assert got["module"] == "sglang.bench_serving"
    a0, a1 = (c["argv"] for c in got["clients"])
    assert (
        a0[a0.index("--max-concurrency") + 1] == "3"
        and a1[a1.index("--max-concurrency") + 1] == "2"
    )
    assert a1[a1.index("--output-file") + 1] == str(tmp_path / "client1" / "result.jsonl")
    assert a0[:4] == a1[:4] == ["--num-prompts", "8", "--seed", "1"]
    assert outputs == [
        tmp_path / f"client{k}" / f for k in (0, 1) for f in ("stdout.txt", "stderr.txt")
    ]
    assert cl.plan(argv, tmp_path, 1)[1] == []  # one process: run_tool's own stdout and stderr
    with pytest.raises(ValueError, match="unexpected bench_serving command"):
        cl.plan(["py", "x.py"], tmp_path, 1)


# --- a client-bound point is never judged -------------------------------------------------------


def test_a_client_bound_sweep_point_is_withheld_like_an_undelivered_one():
    sw = Sweep(points=[1, 4])
    params = Params(dataset_name="random-ids", sweep=sw)
    keep = {"output_throughput_tok_s": 10.0, "concurrency": 1.0, "completed_count": 4.0}
    fine = SuiteResult(metrics=dict(keep), meta={"client": {"bound": None}})
    why = "the client process used 95% of a core (> 90%)"
    # without an achieved concurrency the point counts as delivered: only its client withholds it
    bound = SuiteResult(metrics={"completed_count": 4.0}, meta={"client": {"bound": why}})
    out = merge_points(params, {1.0: fine, 4.0: bound}, {}, METRICS)
    assert out.meta["sweep"]["points"]["c4"]["client_bound"] is True
    assert out.meta["sweep"]["points"]["c1"]["client_bound"] is False
    assert out.meta["not_judged"]["output_throughput_tok_s@c4"] == f"client-bound: {why}"
    assert "output_throughput_tok_s@c1" in out.metrics
    assert "output_throughput_tok_s@c4" not in out.metrics


def test_a_client_bound_probe_stops_the_search(tmp_path, pkg, monkeypatch):  # noqa: F811
    ctx = recording_ctx(tmp_path, pkg, "cap", [])
    fine = _rec(REQS)
    hot = _rec(REQS, cpu_s=2.6)  # a whole core
    monkeypatch.setattr(point, "records", lambda out, n: [hot if Path(out).name == "c4" else fine])
    slo = {"ttft_ms": 1e9, "tpot_ms": 1e9, "rule": "share", "target": 0.95}
    cap = {"slo": slo, "start": 2, "max": 16, "prompts_per_load": 1, "min_prompts": 20}
    res = run(ctx, Params(dataset_name="random-ids", num_prompts=20, capacity=cap))
    meta = res.meta["capacity"]
    assert [p["load"] for p in meta["probes"]] == [2, 4]
    assert meta["probes"][1]["meets"] is None and meta["probes"][1]["client_bound"]
    assert meta["answer"] == "client-bound" and meta["lo"] == 2 and meta["hi"] is None
    assert CAPACITY not in res.metrics
    assert res.meta["not_judged"][CAPACITY].startswith("not searched past concurrency 4")
    probe = read_json(ctx.out_dir / "probes" / "c4" / "summary.json")
    assert "output_throughput_tok_s" in probe["meta"]["not_judged"]


# --- the release's bench_serving against the fake server ---------------------------------------

PORT = 31947
FAKE = Path(__file__).resolve().parent.parent / "fake_server" / "sglang" / "launch_server.py"


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("fake") / "server.log"
    env = dict(os.environ, FAKE_STREAM_CHUNKS="5", FAKE_STREAM_CHUNK_S="0.05")
    with open(log, "wb") as f:
        p = subprocess.Popen([sys.executable, str(FAKE), "--port", str(PORT)], stdout=f, env=env)
    try:
        until = time.monotonic() + 30
        while time.monotonic() < until:
            try:
                socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield ServerInfo(
            base_url=f"http://127.0.0.1:{PORT}",
            host="127.0.0.1",
            port=PORT,
            model_path="/m",
            tokenizer_path="/m",
            log_path=log,
            pid=p.pid,
            flush_cache=lambda: None,
            alive=lambda: p.poll() is None,
        )
    finally:
        p.terminate()
        p.wait()


def _real(tmp_path, server, tiny_model_dir, name, **env):
    sglang = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    out = tmp_path / name / "serving"
    out.mkdir(parents=True)
    srv = dataclasses.replace(
        server, model_path=str(tiny_model_dir), tokenizer_path=str(tiny_model_dir)
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **env)
    ctx = suite_context(
        srv, out, tmp_path / "cache", sglang_version="0.5.1.post3", log=lambda s: None
    )
    return dataclasses.replace(
        ctx,
        run_dir=tmp_path,
        python=sys.executable,
        stock_env=env,
        variant_sglang_dir=sglang,
        stock_sglang_dir=sglang,
    )


def _params(**kw):
    kw.setdefault("max_concurrency", 2)
    return Params(
        dataset_name="random-ids",
        num_prompts=8,
        output_len=5,
        random_input_len=8,
        random_range_ratio=1.0,
        seed=1,
        timeout_s=180,
        **kw,
    )


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, fake_server, tiny_model_dir):
    ctx = _real(tmp_path_factory.mktemp("one"), fake_server, tiny_model_dir, "one")
    return ctx, run(ctx, _params())


def test_an_unthrottled_client_is_not_client_bound(one_process):
    ctx, res = one_process
    c = res.meta["client"]
    assert res.status == "ok" and c["processes"] == 1 and c["requests"] == 8
    assert c["bound"] is None, c
    # 8 requests of 5 chunks 50 ms apart, two at a time: about 4 x 250 ms; a send within ms
    assert c["send_lag_median_ms"] < 0.1 * c["send_gap_mean_ms"]
    assert "output_throughput_tok_s" in res.metrics
    raw = read_json(ctx.out_dir / "client.json")
    assert raw["indices"] == list(range(8)) and len(raw["requests"]) == 8
    assert all(r[0] <= r[1] <= r[2] for r in raw["requests"])  # made, sent, ended
    # our measured run and the tool's own duration agree within a few ms
    row = json.loads((ctx.out_dir / "result.jsonl").read_text().splitlines()[-1])
    assert raw["wall_s"] == pytest.approx(row["duration"], abs=0.05)


def test_a_throttled_client_is_client_bound(tmp_path, fake_server, tiny_model_dir):
    # 200 ms of CPU burnt in the client's event loop at every turn of a burner task
    ctx = _real(tmp_path, fake_server, tiny_model_dir, "hot", PATCHBENCH_CLIENT_BURN_MS="200")
    res = run(ctx, _params(max_concurrency=4))
    c = res.meta["client"]
    # every turn of the loop waits for a burn: a request is sent one or two burns after it is
    # due, and a request's stream takes about seven turns, four of them in flight: the mean gap
    # between sends is about two burns (the CPU share depends on what else this machine runs: a
    # busy loop descheduled gets less than a core)
    assert c["bound"] and c["bound"].startswith("median send lag"), c
    assert c["send_lag_median_ms"] > 0.3 * c["send_gap_mean_ms"], c
    assert c["send_lag_median_ms"] > 100 and c["loop_lag_max_ms"] > 100, c
    assert "output_throughput_tok_s" not in res.metrics
    assert res.meta["not_judged"]["output_throughput_tok_s"].startswith("client-bound: ")
    assert any(w.startswith("client-bound: ") for w in res.warnings)


def test_two_processes_merge_to_the_one_process_numbers(
    tmp_path, fake_server, tiny_model_dir, one_process
):
    _ctx1, one = one_process
    ctx = _real(tmp_path, fake_server, tiny_model_dir, "two")
    res = run(ctx, _params(clients=2))
    assert res.status == "ok" and res.meta["client"]["processes"] == 2
    assert res.meta["client"]["bound"] is None, res.meta["client"]
    out = ctx.out_dir
    rows = [
        json.loads((out / f"client{k}" / "result.jsonl").read_text().splitlines()[-1])
        for k in (0, 1)
    ]
    recs = [read_json(out / f"client{k}" / "client.json") for k in (0, 1)]
    assert [r["indices"] for r in recs] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [r["max_concurrency"] for r in rows] == [1, 1]
    # the merged numbers, computed here from the two rows and the two records
    span = max(r["start"] + r["wall_s"] for r in recs) - min(r["start"] for r in recs)
    ttfts = [t for r in rows for t in r["ttfts"]]
    itls = [x for r in rows for itl in r["itls"] for x in itl]
    m = res.metrics
    assert m["duration_s"] == pytest.approx(span)
    assert m["completed_count"] == 8 == one.metrics["completed_count"]
    assert m["total_output_tokens_count"] == 40 == one.metrics["total_output_tokens_count"]
    assert m["output_throughput_tok_s"] == pytest.approx(40 / span)
    assert m["ttft_median_ms"] == pytest.approx(np.median(ttfts) * 1000)
    assert m["itl_median_ms"] == pytest.approx(np.median(itls) * 1000)
    # the prompts are the one list's, in its order: the same records as one process
    r1, r2 = read_json(_ctx1.out_dir / "requests.json"), read_json(out / "requests.json")
    assert r2["input_len"] == r1["input_len"] and r2["output_len"] == r1["output_len"] == [5] * 8
    # at low load the fake server answers both alike: 50 ms a chunk
    assert m["itl_median_ms"] == pytest.approx(one.metrics["itl_median_ms"], rel=0.2)
    # the two processes overlap (sum of E2E / the span above 1 request in flight; a span summed
    # over the processes would give under 1), within their 2 slots; each keeps its 4 prompts, so
    # a slow request leaves the other's slot idle at the end (1.6 seen here), where one process's
    # 2 slots take whichever prompt is next: throughputs are not compared on a shared host
    assert 1.0 < m["concurrency"] <= 2.0
