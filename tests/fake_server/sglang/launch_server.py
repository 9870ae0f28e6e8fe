"""Fake sglang server. Understands --host/--port (other args ignored). Faults (env):

FAKE_HEALTH_503_S    /health answers 503 for this many seconds after start (/v1/models: 200 at once)
FAKE_EXIT_AFTER_S    the process exits with code 3 after this many seconds (prints to the log first)
FAKE_FLUSH_400       /flush_cache answers 400 this many times before 200 ("-1": always 400)
FAKE_DIE_AFTER_GENERATE  exit after this many /generate calls (0 = never)
FAKE_GRANDCHILD=1    spawn a child that spawns a grandchild, both sleeping (must not survive stop)
FAKE_IGNORE_SIGTERM=1  ignore SIGTERM (stop must escalate to SIGKILL)
FAKE_SIGTERM_DELAY_S   on SIGTERM, exit only after this many seconds (sglang's front end polls
                       for SIGTERM every 5 s: tokenizer_manager.sigterm_watchdog)
FAKE_SCHEDULER=1     spawn a child titled ``sglang::scheduler`` (setproctitle), as sglang does;
                     once it is gone, /generate hangs and /health answers 503 while the HTTP
                     front end stays up (what a real server does when its scheduler dies)
FAKE_GENERATE_SLEEP_S  each /generate after the first (the readiness check) takes this long
FAKE_GENERATE_HOLD_FILE  each /generate after the first waits while this file exists (at most
                     120 s): a test holds a cell open for exactly as long as it needs
FAKE_HANG_AFTER_S    after this many seconds every request is accepted and never answered (a
                     scheduler whose loop is blocked: /server_info, /generate, /flush_cache all
                     wait), while every process stays alive
FAKE_HANG_GENERATE_AFTER  /generate and /v1/chat/completions calls after this many are accepted
                     and never answered, while /server_info still answers (replies stop, the
                     scheduler heartbeat does not)
FAKE_BIND_DELAY_S    wait this long before binding the port (another process can take it first)
FAKE_STREAM_HANG_AFTER  a streamed /generate (``"stream": true``: FAKE_STREAM_CHUNKS chunks,
                     FAKE_STREAM_CHUNK_S apart, then ``data: [DONE]``) after this many sends two
                     chunks and then nothing, its connection left open, while /server_info still
                     answers (logs "fake: stream stops answering at monotonic=T")
FAKE_PROFILE_EXPORT_S  POST /start_profile answers at once; after FAKE_PROFILE_STEPS_S the
                     scheduler "exports its trace" for this many seconds: /server_info,
                     /generate and /flush_cache wait meanwhile; then ``fake-TP-0.trace.json.gz``
                     is written into the request's output_dir (what sglang's profiler does
                     inside the scheduler's loop after num_steps forward passes)
FAKE_NOT_HTTP        comma-separated paths answered with bytes that are not HTTP (a status line
                     no client can read), then the connection closed
FAKE_HANG_PATHS      comma-separated paths accepted and never answered from the start (other
                     paths answer as usual)
FAKE_STREAM_UPTO_MAX  set: a stream sends at most the request's max_new_tokens chunks
FAKE_REQUEST_LOG     a file: each streamed /generate appends {"t0", "t1" (monotonic s), "text"}
FAKE_FLOOD_STDOUT_MB  print this many MiB of numbered lines (100 bytes each) at start, before
                     binding the port (a server flooding its log); its first line holds
                     "fake: flood head" and its last "fake: flood tail"
FAKE_PROMPT_TOKENS, FAKE_CACHED_TOKENS  with --enable-metrics, GET /metrics counts this many prompt
                     tokens (default 10) and cached tokens (default 0) per /generate
                     (sglang:prompt_tokens_total, sglang:cached_tokens_total); without it, 404
FAKE_MAX_RUNNING_REQUESTS  /server_info's max_running_requests (default 64), also in the limits line
                     the log prints at start as sglang's scheduler does
GET /server_info answers 200 (the scheduler heartbeat of patchbench.run.liveness)
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ap = argparse.ArgumentParser()
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--port", type=int, default=30000)
args, _ = ap.parse_known_args()
T0 = time.monotonic()
HEALTH_503 = float(os.environ.get("FAKE_HEALTH_503_S", "0"))
FLUSH_400 = int(os.environ.get("FAKE_FLUSH_400", "0"))
DIE_AFTER = int(os.environ.get("FAKE_DIE_AFTER_GENERATE", "0"))
HANG_AFTER = float(os.environ.get("FAKE_HANG_AFTER_S", "0"))
HANG_GENERATE_AFTER = int(os.environ.get("FAKE_HANG_GENERATE_AFTER", "0"))
STREAM_HANG_AFTER = int(os.environ.get("FAKE_STREAM_HANG_AFTER", "0"))
STREAM_CHUNKS = int(os.environ.get("FAKE_STREAM_CHUNKS", "5"))
STREAM_CHUNK_S = float(os.environ.get("FAKE_STREAM_CHUNK_S", "0.1"))
EXPORT_S = float(os.environ.get("FAKE_PROFILE_EXPORT_S", "0"))
NOT_HTTP = set(filter(None, os.environ.get("FAKE_NOT_HTTP", "").split(",")))
HANG_PATHS = set(filter(None, os.environ.get("FAKE_HANG_PATHS", "").split(",")))
METRICS = "--enable-metrics" in sys.argv
REQUEST_LOG = os.environ.get("FAKE_REQUEST_LOG")
LOCK = threading.Lock()
state = {"flush": 0, "generate": 0, "streams": 0}
EXPORTING = threading.Event()  # set while the "scheduler" writes its trace


def hang_if_blocked(path=None):
    """Accept and never answer once FAKE_HANG_AFTER_S has passed, or a path of FAKE_HANG_PATHS;
    wait while a trace is written."""
    if path in HANG_PATHS:
        while True:
            time.sleep(3600)
    if HANG_AFTER and time.monotonic() - T0 >= HANG_AFTER:
        while True:
            time.sleep(3600)
    while EXPORTING.is_set():
        time.sleep(0.05)


def _export(output_dir):
    import gzip

    time.sleep(float(os.environ.get("FAKE_PROFILE_STEPS_S", "0.3")))
    EXPORTING.set()
    print(f"fake: trace export starts at monotonic={time.monotonic():.3f}", flush=True)
    time.sleep(EXPORT_S)
    os.makedirs(output_dir, exist_ok=True)
    with gzip.open(os.path.join(output_dir, "fake-TP-0.trace.json.gz"), "wt") as f:
        json.dump({"traceEvents": []}, f)
    EXPORTING.clear()
    print(f"fake: trace export ends at monotonic={time.monotonic():.3f}", flush=True)


print(f"fake sglang server on {args.host}:{args.port}", flush=True)
MAX_RUNNING = int(os.environ.get("FAKE_MAX_RUNNING_REQUESTS", "64"))
print(
    "max_total_num_tokens=8192, chunked_prefill_size=4096, max_prefill_tokens=16384, "
    f"max_running_requests={MAX_RUNNING}, context_len=4096",
    flush=True,
)

FLOOD_MB = float(os.environ.get("FAKE_FLOOD_STDOUT_MB", "0"))
if FLOOD_MB:
    n = int(FLOOD_MB * 2**20) // 100
    out = sys.stdout.buffer
    for i in range(n):
        what = "flood head" if i == 0 else "flood tail" if i == n - 1 else "flood"
        out.write(f"fake: {what} {i:012d} ".ljust(99, ".").encode() + b"\n")
    out.flush()

if os.environ.get("FAKE_IGNORE_SIGTERM") == "1":
    signal.signal(signal.SIGTERM, lambda *a: print("fake: ignoring SIGTERM", flush=True))
if os.environ.get("FAKE_GRANDCHILD") == "1":
    code = (
        "import subprocess,sys,time;"
        "subprocess.Popen([sys.executable,'-c','import time; time.sleep(600)']);time.sleep(600)"
    )
    subprocess.Popen([sys.executable, "-c", code])
SCHEDULER = None
if os.environ.get("FAKE_SCHEDULER") == "1":
    # the child says when it has its title: a real sglang scheduler is titled before the server
    # answers, so the fake server does not come up before its scheduler is named either
    code = (
        "import setproctitle,sys,time;setproctitle.setproctitle('sglang::scheduler_TP0');"
        "print('titled', flush=True);sys.stdout.close();time.sleep(3600)"
    )
    SCHEDULER = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    SCHEDULER.stdout.readline()
    print(f"fake: scheduler pid {SCHEDULER.pid}", flush=True)


def scheduler_dead():
    return SCHEDULER is not None and SCHEDULER.poll() is not None


if os.environ.get("FAKE_SIGTERM_DELAY_S"):

    def _slow_exit(*a):
        def _later():
            time.sleep(float(os.environ["FAKE_SIGTERM_DELAY_S"]))
            os._exit(0)

        threading.Thread(target=_later, daemon=True).start()

    signal.signal(signal.SIGTERM, _slow_exit)
if os.environ.get("FAKE_EXIT_AFTER_S"):

    def _die():
        time.sleep(float(os.environ["FAKE_EXIT_AFTER_S"]))
        print("fake: fatal error, exiting", flush=True)
        os._exit(3)

    threading.Thread(target=_die, daemon=True).start()


class H(BaseHTTPRequestHandler):
    def log_message(self, fmt, *a):
        print("fake: " + fmt % a, flush=True)

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_http(self):
        """True (and the reply sent) when this path is answered with bytes that are not HTTP."""
        if self.path not in NOT_HTTP:
            return False
        self.wfile.write(b"SSH-2.0-not-an-http-server\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True
        return True

    def do_GET(self):
        hang_if_blocked(self.path)
        if self._not_http():
            return
        if self.path == "/server_info":
            self._send(200, {"max_running_requests": MAX_RUNNING, "internal_states": [{}]})
        elif self.path == "/metrics" and METRICS:
            self._metrics()
        elif self.path == "/health":
            ok = time.monotonic() - T0 >= HEALTH_503 and not scheduler_dead()
            self._send(200 if ok else 503, {})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": "fake"}]})
        else:
            self._send(404, {})

    def _metrics(self):
        n = state["generate"] + state["streams"]  # every /generate, streamed or not
        rows = [
            ("prompt_tokens_total", "counter", n * int(os.environ.get("FAKE_PROMPT_TOKENS", "10"))),
            ("cached_tokens_total", "counter", n * int(os.environ.get("FAKE_CACHED_TOKENS", "0"))),
            ("num_requests_total", "counter", n),
            ("num_running_reqs", "gauge", 0),
        ]
        text = "".join(
            f'# TYPE sglang:{name} {kind}\nsglang:{name}{{model_name="fake"}} {value}\n'
            for name, kind, value in rows
        )
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, body):
        state["streams"] += 1
        chunks = STREAM_CHUNKS
        if os.environ.get("FAKE_STREAM_UPTO_MAX"):  # no more tokens than the request asked
            chunks = min(chunks, (body.get("sampling_params") or {}).get("max_new_tokens", chunks))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        hang = STREAM_HANG_AFTER and state["streams"] > STREAM_HANG_AFTER
        for i in range(chunks):
            if hang and i == 2:
                print(
                    f"fake: stream stops answering at monotonic={time.monotonic():.3f}", flush=True
                )
                while True:
                    time.sleep(3600)
            chunk = {"text": "x" * (i + 1), "meta_info": {"completion_tokens": i + 1}}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(STREAM_CHUNK_S)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        hang_if_blocked(self.path)
        if self._not_http():
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        if self.path == "/generate" and isinstance(body, dict) and body.get("stream"):
            t0 = time.monotonic()
            self._stream(body)
            if REQUEST_LOG:  # one line a streamed request: when it came, when it ended, its text
                line = {"t0": t0, "t1": time.monotonic(), "text": body.get("text")}
                with LOCK, open(REQUEST_LOG, "a") as f:
                    f.write(json.dumps(line) + "\n")
        elif self.path == "/start_profile":
            threading.Thread(
                target=_export, args=(body.get("output_dir", "."),), daemon=True
            ).start()
            self._send(200, {"message": "Start profiling."})
        elif self.path == "/flush_cache":
            state["flush"] += 1
            if FLUSH_400 < 0 or state["flush"] <= FLUSH_400:
                self._send(400, {"message": "pending requests"})
            else:
                self._send(200, {"message": "Cache flushed."})
        elif self.path == "/generate":
            state["generate"] += 1
            if HANG_GENERATE_AFTER and state["generate"] > HANG_GENERATE_AFTER:
                while True:
                    time.sleep(3600)
            if state["generate"] > 1:
                time.sleep(float(os.environ.get("FAKE_GENERATE_SLEEP_S", "0")))
                hold = os.environ.get("FAKE_GENERATE_HOLD_FILE")
                until = time.monotonic() + 120
                while hold and os.path.exists(hold) and time.monotonic() < until:
                    time.sleep(0.05)
            while scheduler_dead():  # a real front end waits for its scheduler forever
                time.sleep(0.5)
            if DIE_AFTER and state["generate"] > DIE_AFTER:
                print("fake: dying mid-run", flush=True)
                os._exit(5)
            self._send(
                200, {"text": "x", "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}}
            )
        else:
            self._send(404, {})


time.sleep(float(os.environ.get("FAKE_BIND_DELAY_S", "0")))
ThreadingHTTPServer((args.host, args.port), H).serve_forever()
