"""The traffic suite against the fake server with each pin's real bench_serving client: the cache
protocol (flush, warm up, prime, measure), the prime's prefixes, the multi-turn replay's order and
think time, a trace's timestamps, and the refusal of a workload a pin's tool cannot send."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from patchbench.config.load import config_from_mapping
from patchbench.errors import ConfigError
from patchbench.records import read_json
from patchbench.run.plan import check_releases, describe_plan
from patchbench.suite import ServerInfo, SuiteContext
from patchbench.suites.serving.command import ToolMismatch
from patchbench.suites.traffic import Params, run
from patchbench.suites.traffic.workloads import read_jsonl, tool_params
from tests.helpers import suite_context

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_server" / "sglang" / "launch_server.py"
PORT = 31948
PINS = {
    "0.5.1.post3": (ROOT / ".venv", ROOT / ".cache/models/tiny-qwen25vl-tf4"),
    "0.5.23": (ROOT / ".venv-0.5.23", ROOT / ".cache/models/tiny-qwen25vl-tf5"),
}


def site(pin: str) -> Path:
    return next((PINS[pin][0] / "lib").glob("python3*/site-packages")) / "sglang"


@pytest.fixture
def fake(tmp_path):
    """The fake server streaming the tokens each request asks (at most 16), logging each one's
    text and times; its /metrics counts 10 prompt tokens and 4 cached ones a request."""
    log = tmp_path / "requests.jsonl"
    env = dict(os.environ, FAKE_STREAM_CHUNKS="16", FAKE_STREAM_CHUNK_S="0.01")
    env["FAKE_STREAM_UPTO_MAX"] = "1"
    env["FAKE_REQUEST_LOG"] = str(log)
    env |= {"FAKE_PROMPT_TOKENS": "10", "FAKE_CACHED_TOKENS": "4"}
    cmd = [sys.executable, str(FAKE), "--port", str(PORT), "--enable-metrics"]
    proc = subprocess.Popen(cmd, env=env)
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
        pytest.fail(f"{venv} missing: run `make setup` (SGLANG={pin})")
    if not model.exists():  # the pin's own transformers builds its tiny model (seconds)
        cmd = [str(venv / "bin" / "python"), "-m", "patchbench", "make-tiny-model", str(model)]
        subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))

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
    ctx = suite_context(
        srv, tmp_path / "traffic", tmp_path / ".cache", sglang_version=pin, log=lambda s: None
    )
    return dataclasses.replace(
        ctx,
        run_dir=tmp_path,
        python=str(venv / "bin" / "python"),
        stock_env=env,
        variant_sglang_dir=site(pin),
        stock_sglang_dir=site(pin),
    )


@pytest.mark.needs_sglang
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
    # the window's counters hold the measured call's 6 requests alone (not the warm-up or the
    # primes before it): 60 prompt tokens, 24 cached, 40 %
    assert w["after"]["prompt_tokens"] - w["before"]["prompt_tokens"] == 60
    assert res.metrics["prefix_cache_hit_pct@sp"] == pytest.approx(40.0)
    assert res.metrics["prefix_cache_hit_pct@chat"] == pytest.approx(40.0)

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


@pytest.mark.needs_sglang
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
    with pytest.raises(ConfigError, match="suites.traffic: sglang 0.5.1.post3 cannot run it: "):
        check_releases(cfg)  # bench's preflight, before any server starts
    # the dry run refuses it too (exit 2), the workload named
    raw = yaml.safe_load((ROOT / "configs" / "demo-cpu.yaml").read_text())
    raw["suites"]["traffic"]["workloads"]["tr"] = {"kind": "trace"}
    with pytest.raises(ConfigError, match="workloads.tr: a trace workload") as e:
        describe_plan(config_from_mapping(raw, "configs/demo-cpu.yaml"))
    assert e.value.exit_code == 2

    both = {
        "workloads": {
            "tr": {"kind": "trace", "slowdown": 0.5},
            "chat": {"kind": "multi_turn", "conversations": 2, "turns": 2, "output_len": 4},
        }
    }
    res = run(make_ctx(tmp_path, fake, "0.5.23"), Params.model_validate(both))
    assert res.status == "ok", res.errors
    # replay.py drives 0.5.23's bench_serving too: 2 conversations x 2 turns after 1 prime
    assert res.metrics["completed_count@chat"] == 4
    assert res.meta["workloads"]["chat"]["primed"]["completed"] == 1
    lens = read_json(tmp_path / "traffic" / "chat" / "requests.json")["input_len"]
    assert lens[2] > lens[0] and lens[3] > lens[1]
    trace = read_jsonl(ROOT / "patchbench/suites/traffic/data/trace.jsonl")
    assert res.metrics["completed_count@tr"] == len(trace) == 12
    reqs = read_jsonl(fake.log)[1:13]  # the tool's warm-up ended before the trace began
    sent = sorted(r["t0"] for r in reqs)
    # each request went at its timestamp (ms) x 0.5 after the first (which met a new connection),
    # the last 2.3 s x 0.5 after the first
    want = [(r["timestamp"] - trace[0]["timestamp"]) / 1000 * 0.5 for r in trace]
    assert want[-1] == pytest.approx(1.15)
    # never early (but for the first request's slack); late by at most 1 s on a loaded host
    assert all(t - sent[0] > w - 0.15 for t, w in zip(sent, want, strict=True))
    assert all(t - sent[0] < w + 1.0 for t, w in zip(sent, want, strict=True))


def test_workload_parameters_are_checked_at_config_load(tmp_path):
    bad = tmp_path / "chats.jsonl"
    bad.write_text('{"system": "s", "turns": []}\n{"turns": []}\n')
    with pytest.raises(ValueError, match=r"chats.jsonl: object 2 lacks system"):
        Params.model_validate(
            {"workloads": {"c": {"kind": "multi_turn", "output_len": 4, "path": str(bad)}}}
        )
    with pytest.raises(ValueError, match="letters, digits, - and _ only"):
        Params.model_validate({"workloads": {"a b": {"kind": "trace"}}})
    with pytest.raises(ValueError, match="no such file"):
        Params.model_validate({"workloads": {"t": {"kind": "trace", "path": "nope.jsonl"}}})


def test_prime_and_measured_calls_read_one_shared_prefix_dataset():
    """The prime call passes the measured call's --gsp-* flags (bench_serving's cache key and
    draw) and asks one 1-token request per group; the measured call asks every prompt."""
    w = Params.model_validate(
        {
            "workloads": {
                "s": {
                    "kind": "shared_prefix",
                    "groups": 3,
                    "prompts_per_group": 5,
                    "system_prompt_len": 100,
                    "question_len": 10,
                    "output_len": 7,
                }
            }
        }
    ).workloads["s"]
    prime, measured = tool_params(w, 1, 2, prime=True), tool_params(w, 1, 0)
    assert (
        prime.extra_args
        == measured.extra_args
        == [
            *("--gsp-num-groups", "3", "--gsp-prompts-per-group", "5"),
            *(
                "--gsp-system-prompt-len",
                "100",
                "--gsp-question-len",
                "10",
                "--gsp-output-len",
                "7",
            ),
        ]
    )
    assert (prime.num_prompts, prime.output_len, prime.warmup_requests) == (3, 1, 2)
    assert (measured.num_prompts, measured.output_len, measured.warmup_requests) == (15, 7, 0)
    assert measured.dataset_name == "generated-shared-prefix" and measured.random_range_ratio == 1
