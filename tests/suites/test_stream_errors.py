"""An error a server streams inside a 200 answer (``data: {"error": ...}``) fails that request
with the server's text in the client, both pins' own bench_serving request function against a
local HTTP server (patchbench/shims/site/sitecustomize.py, PATCHBENCH_STREAM_ERRORS)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from patchbench.run.variants import SITE_DIR

ROOT = Path(__file__).resolve().parents[2]

# a server that streams one token, then the server's error, in a 200 answer; the client calls the
# release's own request function once and prints what it recorded
CLIENT = r"""
import argparse, asyncio, json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        one = {"text": "a", "meta_info": {"completion_tokens": 1, "prompt_tokens": 1}}
        for chunk in (one, {"error": {"message": "KV cache pool is full: boom"}}):
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
    def log_message(self, *a):
        pass

srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
mod = __import__(sys.argv[1], fromlist=["x"])
# the module-level options the request function reads (bench_serving sets them in its main)
mod.args = argparse.Namespace(disable_ignore_eos=False, disable_stream=False,
    return_logprob=False, logprob_start_len=-1, return_routed_experts=False, temperature=0.0,
    top_p=1.0, token_ids_logprob=None, top_logprobs_num=0)
inp = mod.RequestFuncInput(prompt="hi", api_url=f"http://127.0.0.1:{srv.server_port}/generate",
    prompt_len=1, output_len=4, model="m", lora_name="", image_data=None, extra_request_body={})
out = asyncio.run(mod.async_request_sglang_generate(inp))
print(json.dumps({"success": out.success, "error": out.error,
                  "loads": json.loads('{"error": "kept"}')}))
"""

PINS = [
    (".venv", "sglang.bench_serving"),
    (".venv-0.5.23", "sglang.benchmark.serving"),
]


@pytest.mark.parametrize("venv, module", PINS, ids=["0.5.1.post3", "0.5.23"])
@pytest.mark.parametrize("hook", [True, False], ids=["hook", "no-hook"])
def test_an_error_streamed_in_a_200_answer_fails_the_request_with_its_text(venv, module, hook):
    python = ROOT / venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{venv} is not set up here")
    env = {**os.environ, "PYTHONPATH": str(SITE_DIR), "NO_PROXY": "127.0.0.1"}
    env.pop("PATCHBENCH_STREAM_ERRORS", None)
    if hook:
        env["PATCHBENCH_STREAM_ERRORS"] = "1"
    done = subprocess.run(
        [str(python), "-c", CLIENT, module], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # other callers of json.loads get the error dict as it is
    assert got["loads"] == {"error": "kept"}
    if hook:
        assert got["success"] is False
        assert (
            "the server streamed an error: {'message': 'KV cache pool is full: boom'}"
            in (got["error"])
        )
    else:  # the release alone: the error chunk is skipped, the request counted a success
        assert got["success"] is True and "boom" not in (got["error"] or "")


def test_the_client_environment_switches_the_hook_on():
    from patchbench.config.load import config_from_mapping
    from patchbench.run.variants import stock_client_env

    cfg = config_from_mapping(
        {
            "name": "x",
            "sglang": "0.5.1.post3",
            "model": {"path": "m"},
            "variants": {"baseline": []},
            "baseline": "baseline",
        },
        check_files=False,
    )
    assert stock_client_env(cfg)["PATCHBENCH_STREAM_ERRORS"] == "1"
