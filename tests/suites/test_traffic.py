"""The traffic suite against the fake server with each pin's real bench_serving client: the cache
protocol (flush, warm up, prime, measure), the prime's prefixes, the multi-turn replay's order and
think time, a trace's timestamps, and the refusal of a workload a pin's tool cannot send."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from patchbench.records import read_json
from patchbench.run.plan import check_releases
from patchbench.suite import ServerInfo, SuiteContext
from patchbench.suites.serving.command import ToolMismatch
from patchbench.suites.traffic import Params, run
from patchbench.suites.traffic.workloads import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_server" / "sglang" / "launch_server.py"
PORT = 31948
PINS = {
    "0.5.1.post3": (ROOT / ".venv", ROOT / ".cache/models/tiny-qwen25vl-tf4"),
    "0.5.23": (ROOT / ".venv-0.5.23", ROOT / ".cache/models/tiny-qwen25vl-tf5"),
}
pytestmark = pytest.mark.needs_sglang


def site(pin: str) -> Path:
    return next((PINS[pin][0] / "lib").glob("python3*/site-packages")) / "sglang"


@pytest.fixture
def fake(tmp_path):
    """The fake server streaming 4 tokens per request, logging each one's text and times."""
    log = tmp_path / "requests.jsonl"
    env = dict(os.environ, FAKE_STREAM_CHUNKS="4", FAKE_STREAM_CHUNK_S="0.01")
    env["FAKE_REQUEST_LOG"] = str(log)
    proc = subprocess.Popen([sys.executable, str(FAKE), "--port", str(PORT)], env=env)
    url = f"http://127.0.0.1:{PORT}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield SimpleNamespace(proc=proc, url=url, log=log, flushes=[])
    proc.kill()
    proc.wait()


def make_ctx(tmp_path, fake, pin: str) -> SuiteContext:
    venv, model = PINS[pin]
    if not venv.exists():
        pytest.fail(f"{venv} missing: run `make setup` for sglang {pin}")

    def flush():
        fake.flushes.append(time.monotonic())
        urllib.request.urlopen(urllib.request.Request(fake.url + "/flush_cache", method="POST"))

    srv = ServerInfo(
        base_url=fake.url,
        host="127.0.0.1",
        port=PORT,
        model_path=str(model),
        tokenizer_path=str(model),
        log_path=None,
        pid=fake.proc.pid,
        flush_cache=flush,
        alive=lambda: fake.proc.poll() is None,
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return SuiteContext(
        server=srv,
        out_dir=tmp_path / "traffic",
        run_dir=tmp_path,
        cache_dir=tmp_path / ".cache",
        variant="baseline",
        repeat=0,
        baseline="baseline",
        sglang_version=pin,
        python=str(venv / "bin" / "python"),
        stock_env=env,
        variant_sglang_dir=site(pin),
        stock_sglang_dir=site(pin),
        device="cpu",
        log=lambda s: None,
    )


def test_shared_prefix_and_multi_turn_on_0_5_1(tmp_path, fake):
    params = Params.model_validate(
        {
            "workloads": {
                "sp": {
                    "kind": "shared_prefix",
                    "groups": 2,
                    "prompts_per_group": 3,
                    "system_prompt_len": 48,
                    "question_len": 4,
                    "output_len": 4,
                },
                "chat": {
                    "kind": "multi_turn",
                    "conversations": 3,  # the shipped file's first three share one system prompt
                    "turns": 2,
                    "think_time_s": 0.5,
                    "output_len": 4,
                    "max_concurrency": 8,
                },
            }
        }
    )
    res = run(make_ctx(tmp_path, fake, "0.5.1.post3"), params)
    assert res.status == "ok", res.errors
    assert res.metrics["completed_count@sp"] == 6 and res.metrics["completed_count@chat"] == 6
    assert "output_throughput_tok_s@chat" in res.metrics
    wl = res.meta["workloads"]
    assert wl["sp"]["primed"]["requests"] == 2 == wl["sp"]["primed"]["completed"]
    assert wl["chat"]["primed"]["requests"] == 1 == wl["chat"]["primed"]["completed"]
    w = wl["sp"]["window"]
    assert w["before"]["unix_s"] < w["after"]["unix_s"]

    reqs = read_jsonl(fake.log)
    # in arrival order: sp: 1 warm-up, 2 primes, 6 measured; chat: 1 warm-up, 1 prime, 6 measured
    assert len(reqs) == 9 + 8
    assert fake.flushes[0] < reqs[0]["t0"] and reqs[8]["t1"] < fake.flushes[1] < reqs[9]["t0"]
    primes, measured = [r["text"] for r in reqs[1:3]], [r["text"] for r in reqs[3:9]]
    # each prime is its group's common prefix (the system prompt): every measured prompt starts
    # with exactly one of them, three prompts a group
    starts = [[m.startswith(p) for p in primes] for m in measured]
    assert sorted(s.index(True) for s in starts) == [0, 0, 0, 1, 1, 1]
    assert all(sum(s) == 1 for s in starts) and min(len(p) for p in primes) > 48

    chat = reqs[11:]
    system = json.loads(
        (ROOT / "patchbench/suites/traffic/data/conversations.jsonl").open().readline()
    )
    assert system["system"] in reqs[10]["text"] and all(
        r["text"].startswith(reqs[10]["text"]) for r in chat
    )
    first = [
        r for r in chat if not any(o is not r and r["text"].startswith(o["text"]) for o in chat)
    ]
    assert len(first) == 3
    for r in chat:
        if r in first:
            continue
        (prev,) = [o for o in first if r["text"].startswith(o["text"])]
        assert r["t0"] - prev["t1"] >= 0.5  # the think time after the reply ended
    # the details in (turn, conversation) order: turn 2 prompts are the longer ones
    lens = read_json(tmp_path / "traffic" / "chat" / "requests.json")["input_len"]
    assert all(lens[i + 3] > lens[i] for i in range(3))


def test_trace_honours_timestamps_on_0_5_23_and_is_refused_on_0_5_1(tmp_path, fake):
    params = Params.model_validate({"workloads": {"tr": {"kind": "trace", "slowdown": 0.5}}})
    with pytest.raises(ToolMismatch, match="sglang 0.5.1.post3's bench_serving .* no 'mooncake'"):
        run(make_ctx(tmp_path, fake, "0.5.1.post3"), params)
    assert fake.flushes == []  # refused before any traffic
    cfg = SimpleNamespace(
        builds={"baseline": SimpleNamespace(env=SimpleNamespace(site_dir=PINS["0.5.1.post3"][0]))},
        baseline="baseline",
        suites=["traffic"],
        suite_params={"traffic": params},
    )
    cfg.builds["baseline"].env.site_dir = site("0.5.1.post3").parent
    cfg.builds["baseline"].release = "0.5.1.post3"
    with pytest.raises(ToolMismatch, match="suites.traffic.workloads.tr: a trace workload"):
        check_releases(cfg)  # bench's preflight, before any server starts

    res = run(make_ctx(tmp_path, fake, "0.5.23"), params)
    assert res.status == "ok", res.errors
    trace = read_jsonl(ROOT / "patchbench/suites/traffic/data/trace.jsonl")
    assert res.metrics["completed_count@tr"] == len(trace) == 12
    reqs = read_jsonl(fake.log)[1:]  # the tool's warm-up ended before the trace began
    sent = sorted(r["t0"] for r in reqs)
    # each request went at its timestamp (ms) x 0.5 after the first (which met a new connection:
    # up to 0.15 s of slack), the last 2.3 s x 0.5 after the first
    want = [(r["timestamp"] - trace[0]["timestamp"]) / 1000 * 0.5 for r in trace]
    assert want[-1] == pytest.approx(1.15)
    assert all(abs((t - sent[0]) - w) < 0.15 for t, w in zip(sent, want, strict=True))
