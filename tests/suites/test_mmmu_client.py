"""The MMMU client and ``run()`` against a small in-process aiohttp stub of sglang's chat endpoint.

The stub stands in for faults a real server cannot be made to produce on demand (503 before an
answer, a 400, a dropped connection); the real-server run is tests/suites/test_mmmu_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web

from patchbench.records import read_json, read_jsonl
from patchbench.suite import ServerInfo, SuiteContext, SuiteError
from patchbench.suites.mmmu import Params, client, report_block, run
from patchbench.suites.mmmu.bench import prepare, prepare_key
from patchbench.suites.mmmu.demo_data import generate
from patchbench.suites.mmmu.pairing import pair_records
from tests.helpers import suite_context


class Stub:
    """A chat-completions stub in a background thread. ``behaviour(text, n_seen) -> (status,
    answer | None)``; None = drop the connection; bytes, or an answer that is not a string (as
    JSON), are sent as the whole response body. Records every request body."""

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.seen: Counter = Counter()
        self.bodies: list[dict] = []
        self.max_inflight = 0
        self._inflight = 0
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        text = "".join(p.get("text", "") for p in body["messages"][0]["content"])
        self.seen[text] += 1
        self._inflight += 1
        self.max_inflight = max(self.max_inflight, self._inflight)
        try:
            await asyncio.sleep(0.002)
            status, answer = self.behaviour(text, self.seen[text])
        finally:
            self._inflight -= 1
        if answer is None:
            request.transport.close()
            return web.Response(status=500)
        if status == 200 and answer == "<partial>":  # headers and half a body, then a drop
            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"choices": [{"mess')
            request.transport.close()
            return resp
        if status != 200:
            return web.Response(status=status, text=answer)
        if isinstance(answer, bytes):  # a whole response body of the test's making
            return web.Response(body=answer, content_type="application/json")
        if not isinstance(answer, str):  # the same, as JSON
            return web.json_response(answer)
        return web.json_response(
            {
                "choices": [{"message": {"content": answer}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 2},
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "tiny-model"}]})

    def start(self) -> str:
        def serve():
            asyncio.set_event_loop(self.loop)
            app = web.Application(client_max_size=64 * 2**20)
            app.router.add_post("/v1/chat/completions", self.chat)
            app.router.add_get("/v1/models", self.models)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            self.started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        self.started.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def stub_factory():
    stubs = []

    def make(behaviour):
        s = Stub(behaviour)
        url = s.start()
        stubs.append(s)
        return s, url

    yield make
    for s in stubs:
        s.stop()


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("demo")
    generate(d, n=21, seed=1)
    return d


def ctx_for(url: str, out: Path, cache: Path) -> SuiteContext:
    host, port = url.rsplit(":", 1)
    server = ServerInfo(
        base_url=url,
        host=host,
        port=int(port),
        model_path="m",
        tokenizer_path="m",
        log_path=out / "server.log",
        pid=0,
        flush_cache=lambda: None,
        alive=lambda: True,
    )
    return suite_context(server, out, cache, sglang_version="x", log=lambda s: None)


def test_retry_only_before_any_answer_byte(stub_factory):
    def behaviour(text, n):
        if text == "flaky":
            return (503, "busy") if n <= 2 else (200, "B")
        if text == "bad":
            return 400, "bad request"
        if text == "drop":
            return 200, None
        if text == "down":
            return 503, "busy"
        if text == "partial":
            return 200, "<partial>"
        return 200, "A"

    stub, url = stub_factory(behaviour)
    bodies = [
        client.request_body(
            [{"role": "user", "content": [{"type": "text", "text": t}]}],
            model="m",
            temperature=0,
            max_tokens=30,
        )
        for t in ["ok", "flaky", "bad", "drop", "down", "partial"]
    ]
    out = asyncio.run(client.send_all(url, bodies, concurrency=4, request_timeout_s=10, retries=2))
    assert [o.response for o in out] == ["A", "B", None, None, None, None]
    assert out[1].attempts == 3 and out[1].error is None
    assert out[2].attempts == 1 and out[2].error.startswith("HTTP 400")  # never retried
    assert out[0].prompt_tokens == 100 and out[0].completion_tokens == 2
    # dropped before any byte: retried, then recorded, not lost
    assert out[3].attempts == 3 and "gave up after 3 attempts" in out[3].error
    assert out[4].attempts == 3 and "HTTP 503" in out[4].error
    # a 200 whose body breaks off: an answer had started, so no retry
    assert out[5].attempts == 1 and out[5].error.startswith("after HTTP 200")
    assert stub.seen["partial"] == 1 and stub.seen["down"] == 3 and stub.seen["bad"] == 1


def _choice(content, finish, completion_tokens):
    usage = {"prompt_tokens": 10, "completion_tokens": completion_tokens}
    return {"choices": [{"message": {"content": content}, "finish_reason": finish}], "usage": usage}


#: HTTP 200 bodies in which the server did not answer, and the error each is recorded with
NOT_ANSWERS = {
    "aborted": (_choice("", "abort", 0), "the server aborted the request (finish_reason abort)"),
    "aborted-partial": (_choice("The ans", "abort", 3), "aborted the request"),
    "empty-no-tokens": (_choice("", "stop", 0), "an empty answer the server generated no token"),
    "empty-no-finish": (_choice("", None, None), "an empty answer the server generated no token"),
    "null-body": (b"null", "HTTP 200 whose body is not an object"),
    "list-body": ([], "HTTP 200 whose body is not an object"),
    "choice-not-object": ({"choices": ["A"]}, "HTTP 200 without choices"),
    "content-number": (_choice(5, "stop", 1), "HTTP 200 whose message content is not text"),
}


def test_a_200_without_an_answer_is_a_failed_request_never_a_wrong_answer(stub_factory):
    """Empty, aborted or mis-shaped completions are failed requests (left out of the pairing,
    the suite incomplete), not answers scored wrong; an empty answer the model ended with a stop
    token is the model's own answer."""

    def behaviour(text, n):
        if text == "eos-first":
            return 200, _choice("", "stop", 1)
        if text in NOT_ANSWERS:
            return 200, NOT_ANSWERS[text][0]
        return 200, "A"

    stub, url = stub_factory(behaviour)
    texts = ["ok", "eos-first", *NOT_ANSWERS]
    bodies = [
        client.request_body(
            [{"role": "user", "content": [{"type": "text", "text": t}]}],
            model="m",
            temperature=0,
            max_tokens=30,
        )
        for t in texts
    ]
    out = asyncio.run(client.send_all(url, bodies, concurrency=4, request_timeout_s=10, retries=2))
    got = dict(zip(texts, out, strict=True))
    assert got["ok"].response == "A" and got["eos-first"].response == ""
    assert got["eos-first"].error is None and got["eos-first"].completion_tokens == 1
    for text, (_, error) in NOT_ANSWERS.items():
        assert got[text].response is None and error in got[text].error, (text, got[text].error)
        assert got[text].attempts == 1 and stub.seen[text] == 1  # an answer came: no retry


def test_run_end_to_end_on_stub(stub_factory, demo_dir, tmp_path):
    def behaviour(text, n):
        if "Which word is printed" in text:
            return 503, "overloaded"  # every open "read" question fails
        return 200, "Answer: A"

    stub, url = stub_factory(behaviour)
    params = Params(dataset_path=str(demo_dir), concurrency=3, retries=1)
    res = run(ctx_for(url, tmp_path / "a" / "mmmu", tmp_path / "cache"), params)
    recs = read_jsonl(tmp_path / "a" / "mmmu" / "records.jsonl")
    assert len(recs) == 21 and res.metrics["mmmu_asked_count"] == 21
    assert stub.max_inflight <= 3
    failed = [r for r in recs if r["verdict"] == "failed"]
    assert len(failed) == 3 and all(r["subject"] == "Computer_Science" for r in failed)
    assert res.status == "incomplete" and res.metrics["mmmu_failed_count"] == 3
    mc_a = [r for r in recs if r["question_type"] == "multiple-choice" and r["gold"] == "A"]
    assert res.metrics["mmmu_correct_count"] == len(mc_a) + sum(
        1 for r in recs if r["question_type"] == "open" and r["verdict"] == "correct"
    )
    assert res.metrics["mmmu_overall_acc"] == pytest.approx(res.metrics["mmmu_correct_count"] / 21)
    for f in ("answer_sglang.json", "val_sglang.json", "scores.json"):
        assert (tmp_path / "a" / "mmmu" / f).exists()
    assert read_json(tmp_path / "a" / "mmmu" / "val_sglang.json")["Overall"]["num"] == 21
    assert stub.bodies[0]["model"] == "tiny-model" and stub.bodies[0]["max_tokens"] == 30
    assert stub.bodies[0]["temperature"] == 0
    # images are sent in text order as PNG data URLs, placeholders gone
    music = next(b for b in stub.bodies if "colour named" in json.dumps(b))
    parts = music["messages"][0]["content"]
    assert sum(p["type"] == "image_url" for p in parts) == 5
    assert all(
        p["image_url"]["url"].startswith("data:image/png;base64,")
        for p in parts
        if p["type"] == "image_url"
    )
    assert res.meta["params"]["protocol"] == "patchbench" and res.meta["parser"] == "strict"

    # the prepared questions are cached for the run and reused by the next cell
    cache_file = tmp_path / "cache" / "mmmu" / f"prepared-{prepare_key(params)}.jsonl"
    assert cache_file.exists()
    mtime = cache_file.stat().st_mtime_ns
    run(ctx_for(url, tmp_path / "b" / "mmmu", tmp_path / "cache"), params)
    assert cache_file.stat().st_mtime_ns == mtime
    recs_b = read_jsonl(tmp_path / "b" / "mmmu" / "records.jsonl")
    p = pair_records([recs], [recs_b])
    assert p["identical_share"] == 1.0 and p["n_failed_either"] == 3
    assert p["flips"] == 0 and p["mcnemar_p"] == 1.0
    # the PR-style block from the folder (summary.json is the orchestrator's; write it here)
    (tmp_path / "a" / "mmmu" / "summary.json").write_text(json.dumps(res.to_json("mmmu")))
    block = report_block(tmp_path / "a" / "mmmu")
    assert "Overall accuracy: " in block and "'Overall-Business'" in block


def test_sglang_2025_protocol_run(stub_factory, demo_dir, tmp_path):
    stub, url = stub_factory(lambda text, n: (200, "B"))
    params = Params(dataset_path=str(demo_dir), protocol="sglang-2025", limit=7)
    res = run(ctx_for(url, tmp_path / "mmmu", tmp_path / "cache"), params)
    assert res.meta["parser"] == "official" and res.meta["parser_seed"] == 42
    assert all(
        sum(p["type"] == "image_url" for p in b["messages"][0]["content"]) == 1 for b in stub.bodies
    )
    assert any("only image_1" in w for w in res.warnings)


def test_run_without_data_names_dataset(tmp_path, stub_factory, monkeypatch):
    # no hub here: the error comes at once (no 20 s of download retries) and says what to do
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a port nothing listens on
    stub, url = stub_factory(lambda t, n: (200, "A"))
    with pytest.raises(SuiteError, match=r"MMMU/MMMU.*dataset_path"):
        run(
            ctx_for(url, tmp_path / "mmmu", tmp_path / "cache"),
            Params(subjects=["Art"], dataset_path=None),
        )
    with pytest.raises(SuiteError, match=r"does not exist"):
        prepare(Params(dataset_path=str(tmp_path / "nope")), None)
