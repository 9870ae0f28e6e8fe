"""patchbench.suites.serving.caveats: what the pinned release's bench_serving mis-measures, read
from the installed sources of both pins (skipped where a pin is not installed) and from small
hand-written sources."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from patchbench.suites.serving.caveats import (
    WarmupBehaviour,
    backend_warnings,
    request_functions,
    warmup_behaviour,
    warmup_warning,
)
from patchbench.suites.serving.command import tool_info, tool_source
from patchbench.suites.serving.params import Params

REPO = Path(__file__).resolve().parents[2]
PINS = {
    "0.5.1.post3": REPO / ".venv" / "lib" / "python3.11" / "site-packages" / "sglang",
    "0.5.23": REPO / ".venv-0.5.23" / "lib" / "python3.11" / "site-packages" / "sglang",
}


def _pin(version: str) -> Path:
    pkg = PINS[version]
    if not (pkg / "bench_serving.py").is_file():
        pytest.skip(f"sglang {version} not installed at {pkg}")
    return pkg


# ------------------------------------------------------------------ warmup, per pin
@pytest.mark.parametrize(
    ("version", "capped", "line", "file"),
    [
        # read by hand: 0.5.1.post3 bench_serving.py:1513 `for _ in range(warmup_requests):` then
        # `request_func(request_func_input=test_input)`; 0.5.23 benchmark/serving.py:1491 then
        # `limited_request_func(...)`
        ("0.5.1.post3", False, 1513, "bench_serving.py"),
        ("0.5.23", True, 1491, "benchmark/serving.py"),
    ],
)
def test_warmup_loop_of_each_pin(version, capped, line, file):
    pkg = _pin(version)
    src = tool_source(pkg)
    assert src == pkg / file
    b = warmup_behaviour(src)
    assert (b.capped, b.line) == (capped, line)
    # --warmup-requests exists in both (0 would be accepted: the harness does not need it)
    assert "--warmup-requests" in tool_info(pkg).options
    burst = warmup_warning(Params(warmup_requests=32, max_concurrency=16), b)
    if capped:
        assert burst is None
    else:
        assert "sends all 32 warmup requests at once, ignoring --max-concurrency 16" in burst
        assert f"line {line}" in burst


@pytest.mark.parametrize(
    ("warmup", "cap", "capped", "warned"),
    [
        (32, 16, False, True),
        (17, 16, False, True),
        (16, 16, False, False),  # at the cap: the burst is within it
        (1, 16, False, False),
        (0, 16, False, False),
        (32, None, False, False),  # no cap: nothing is ignored
        (32, 16, True, False),
        (32, 16, None, True),  # unknown behaviour above the cap: said as unknown
    ],
)
def test_warmup_decision(warmup, cap, capped, warned):
    b = WarmupBehaviour(Path("x.py"), capped, None if capped is None else 10)
    w = warmup_warning(Params(warmup_requests=warmup, max_concurrency=cap), b)
    assert (w is not None) is warned
    if warned and capped is None:
        assert "could not be read" in w


def test_warmup_loop_in_a_hand_written_source(tmp_path):
    def src(call: str) -> Path:
        p = tmp_path / f"{call}.py"
        p.write_text(
            textwrap.dedent(f"""
            async def benchmark(warmup_requests, request_func, limited_request_func):
                tasks = []
                for _ in range(warmup_requests):
                    tasks.append(asyncio.create_task({call}(request_func_input=1)))
            """)
        )
        return p

    assert warmup_behaviour(src("request_func")).capped is False
    assert warmup_behaviour(src("limited_request_func")).capped is True
    assert warmup_behaviour(src("other")).capped is None


# ------------------------------------------------------------------ backends, per pin
def test_backends_of_0_5_1_post3():
    src = tool_source(_pin("0.5.1.post3"))
    funcs = request_functions(src)
    assert funcs["sglang-oai-chat"] == "async_request_openai_chat_completions"
    assert backend_warnings(Params(backend="sglang"), src) == []
    assert backend_warnings(Params(backend="sglang-native"), src) == []  # same function
    # the completions client sends ignore_eos: its counts are the generated ones
    assert backend_warnings(Params(backend="sglang-oai"), src) == []
    chat = backend_warnings(Params(backend="sglang-oai-chat"), src)
    assert len(chat) == 3
    assert "never reasoning_content" in chat[0]
    assert "does not send ignore_eos" in chat[1]
    assert "REQUESTED output length" in chat[2]
    assert backend_warnings(Params(backend="vllm-chat"), src) == [
        w.replace("'sglang-oai-chat'", "'vllm-chat'") for w in chat
    ]
    # without ignore_eos the completions client's token count is the requested one, too
    (w,) = backend_warnings(Params(backend="sglang-oai", disable_ignore_eos=True), src)
    assert "stream_options.include_usage" in w
    with pytest.raises(ValueError, match=r"backend 'nope' is not offered(.|\n)*sglang-oai-chat"):
        backend_warnings(Params(backend="nope"), src)


def test_backends_of_0_5_23():
    src = tool_source(_pin("0.5.23"))
    # reads reasoning_content through _combine_openai_chat_content and sends ignore_eos
    assert backend_warnings(Params(backend="sglang-oai-chat"), src) == []
    assert backend_warnings(Params(backend="sglang-oai"), src) == []
    assert backend_warnings(Params(backend="vllm-chat"), src) == []


def test_backend_helper_one_level_deep(tmp_path):
    p = tmp_path / "tool.py"
    p.write_text(
        textwrap.dedent("""
        def _combine(d):
            return (d.get("reasoning_content") or "") + (d.get("content") or "")

        async def chat(inp):
            url = "chat/completions"
            payload = {"ignore_eos": True}
            return _combine({})

        async def gen(inp):
            return None

        ASYNC_REQUEST_FUNCS = {"sglang": gen, "my-chat": chat}
        """)
    )
    assert backend_warnings(Params(backend="my-chat"), p) == []
    p.write_text(p.read_text().replace('"reasoning_content"', '"other"'))
    (w,) = backend_warnings(Params(backend="my-chat"), p)
    assert "never reasoning_content" in w
    p.write_text("x = 1\n")
    assert "could not be read" in backend_warnings(Params(backend="my-chat"), p)[0]
