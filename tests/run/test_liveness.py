"""Liveness of the whole server (patchbench.run.liveness) against the fake server: a scheduler child
killed with SIGKILL while the HTTP front end stays up is seen within a second, the suite is
stopped at once, its client process is killed, and the message names the process."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from patchbench.run.liveness import ServerLost, ServerWatch, role_of
from patchbench.run.ports import free_port, port_answers
from patchbench.run.server import LaunchSpec, SglangServer

FAKE = Path(__file__).parent.parent / "fake_server"


def _server(tmp_path, **env) -> SglangServer:
    """A ready fake server (tests/fake_server) with ``env`` added to its environment; stopped
    again when it does not get ready."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(FAKE)
    e.update({k: str(v) for k, v in env.items()})
    spec = LaunchSpec(
        python=sys.executable,
        model_path="fake",
        host="127.0.0.1",
        port=free_port(),
        args=[],
        env=e,
        log_path=tmp_path / "server.log",
        ready_timeout_s=20,
        stop_grace_s=3,
        port_close_timeout_s=10,
    )
    srv = SglangServer(spec)
    srv.start()
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    return srv


def _scheduler_pid(srv) -> int:
    for _ in range(50):
        for c in psutil.Process(srv.pid).children():
            if "sglang::scheduler" in " ".join(c.cmdline()):
                return c.pid
        time.sleep(0.1)
    raise AssertionError("the fake scheduler did not start")


@pytest.mark.parametrize(
    "name, cmdline, leader, expected",
    [
        ("sglang::schedul", ["sglang::scheduler_TP0"], False, "the sglang scheduler"),
        ("sglang::detoken", ["sglang::detokenizer"], False, "the sglang detokenizer"),
        (
            "python3",
            ["python3", "-m", "sglang.launch_server"],
            True,
            "the sglang server (HTTP front end)",
        ),
        ("python3", ["python3", "-c", "x"], False, "server process python3"),
    ],
)
def test_role_names(name, cmdline, leader, expected):
    assert role_of(name, cmdline, leader) == expected


def test_scheduler_sigkill_is_detected_within_a_second_and_named(tmp_path):
    srv = _server(tmp_path, FAKE_SCHEDULER=1)
    try:
        sched = _scheduler_pid(srv)
        w = ServerWatch(srv.proc, srv.pgid).start()
        roles = {d["pid"]: d["role"] for d in w.describe()}
        assert roles == {
            srv.pid: "the sglang server (HTTP front end)",
            sched: "the sglang scheduler",
        }
        assert port_answers("127.0.0.1", srv.spec.port)  # the front end is up
        t0 = time.monotonic()
        os.kill(sched, signal.SIGKILL)
        assert w.dead.wait(5)
        detect_s = time.monotonic() - t0
        print(f"\nscheduler SIGKILL detected after {detect_s:.3f} s")
        assert detect_s < 1.0  # polled every 0.2 s
        assert w.death.message() == f"the sglang scheduler (pid {sched}) died"
        # the watcher killed the whole group: the front end no longer answers
        deadline = time.monotonic() + 5
        while port_answers("127.0.0.1", srv.spec.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not port_answers("127.0.0.1", srv.spec.port)
        w.close()
    finally:
        srv.stop()
    assert (
        not psutil.pid_exists(srv.pid) or psutil.Process(srv.pid).status() == psutil.STATUS_ZOMBIE
    )


def test_front_end_exit_is_named_with_its_exit_code(tmp_path):
    srv = _server(tmp_path, FAKE_EXIT_AFTER_S=1.5)
    try:
        w = ServerWatch(srv.proc, srv.pgid).start()
        assert w.dead.wait(10)
        assert (
            w.death.message()
            == f"the sglang server (HTTP front end) (pid {srv.pid}) died, exit code 3"
        )
        w.close()
    finally:
        srv.stop()


def test_death_stops_the_suite_at_once_and_kills_its_client(tmp_path):
    """Inside the cancel scope a blocking call (here a 60 s sleep standing in for a request that
    never returns) ends with ServerLost within a second of the kill; a client started in its own
    session during the suite (as bench_serving is) is killed."""
    srv = _server(tmp_path, FAKE_SCHEDULER=1)
    client = None
    try:
        sched = _scheduler_pid(srv)
        w = ServerWatch(srv.proc, srv.pgid).start()
        with pytest.raises(ServerLost) as ei:
            with w.cancel_scope():
                client = subprocess.Popen(
                    [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
                )
                threading.Timer(0.5, os.kill, (sched, signal.SIGKILL)).start()
                t0 = time.monotonic()
                time.sleep(60)
        took = time.monotonic() - t0
        assert 0.4 < took < 2.0
        assert ei.value.death.pid == sched
        assert client.wait(timeout=5) == -signal.SIGKILL
        assert client.pid in w.killed_clients
        w.close()
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        srv.stop()


def test_no_death_no_interrupt_and_stop_is_not_a_death(tmp_path):
    srv = _server(tmp_path, FAKE_SCHEDULER=1)
    w = ServerWatch(srv.proc, srv.pgid).start()
    with w.cancel_scope():
        time.sleep(0.6)
    w.close()
    srv.stop()
    time.sleep(0.4)
    assert not w.dead.is_set() and w.death is None


# ---------------------------------------------------------------------- stalls (alive, silent)
def _watch(srv, stall_s=2.0) -> ServerWatch:
    return ServerWatch(
        srv.proc, srv.pgid, stall_timeout_s=stall_s, heartbeat=srv.heartbeat, stopped_grace_s=1.0
    ).start()


def _lost_in_scope(w: ServerWatch, limit_s: float, before=None) -> tuple[ServerLost, float]:
    """Block inside the cancel scope (a request that never returns) until ServerLost."""
    t0 = time.monotonic()
    with pytest.raises(ServerLost) as ei:
        with w.cancel_scope():
            if before is not None:
                before()
            time.sleep(limit_s)
    return ei.value, time.monotonic() - t0


def test_blocked_scheduler_fails_by_heartbeat_within_the_stall_limit(tmp_path):
    """Every request accepted and never answered while all processes live (a blocked scheduler
    loop: state S like a healthy one): the heartbeat names it within stall_timeout_s + a beat."""
    srv = _server(tmp_path, FAKE_SCHEDULER=1, FAKE_HANG_AFTER_S=2)
    try:
        sched = _scheduler_pid(srv)
        w = _watch(srv, 2.0)
        lost, took = _lost_in_scope(w, 30)
        print(f"\nblocked server (heartbeat) detected {took:.2f} s into the suite")
        assert took < 2 + 2.0 + 1.5
        assert lost.death.kind == "heartbeat"
        msg = lost.death.message()
        assert msg.startswith(f"the server stopped answering (scheduler pid {sched} in state S")
        assert "server.stall_timeout_s = 2" in msg
        assert w.heartbeats >= 1
        w.close()
    finally:
        srv.stop()


def test_stopped_scheduler_is_named_with_state_t(tmp_path):
    srv = _server(tmp_path, FAKE_SCHEDULER=1)
    try:
        sched = _scheduler_pid(srv)
        w = _watch(srv, 30.0)
        lost, took = _lost_in_scope(w, 30, lambda: os.kill(sched, signal.SIGSTOP))
        print(f"\nSIGSTOP of the scheduler detected after {took:.2f} s")
        assert took < 1.0 + 1.5  # stopped_grace_s + polling
        assert lost.death.kind == "stopped" and lost.death.pid == sched
        assert f"scheduler pid {sched} in state T" in lost.death.message()
        w.close()
    finally:
        srv.stop()


def test_replies_that_stop_coming_are_a_stall(tmp_path):
    """The heartbeat answers but generations hang: the suite's progress meter names it."""
    srv = _server(tmp_path, FAKE_SCHEDULER=1, FAKE_HANG_GENERATE_AFTER=1)
    try:
        w = _watch(srv, 2.0)

        def hanging_request():
            with contextlib.suppress(OSError):
                srv._http("POST", "/generate", timeout_s=30)

        def send():
            w.progress.expect(1, "test replies")
            threading.Thread(target=hanging_request, daemon=True).start()

        lost, took = _lost_in_scope(w, 30, send)
        assert took < 2.0 + 1.0
        assert lost.death.kind == "replies"
        assert "no test replies for" in lost.death.message()
        assert w.heartbeats >= 1
        w.close()
    finally:
        srv.stop()


def test_stopped_client_is_a_stall_and_killed(tmp_path):
    srv = _server(tmp_path, FAKE_SCHEDULER=1)
    client = None
    try:
        w = _watch(srv, 30.0)

        def start_client():
            nonlocal client
            client = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
            )
            os.kill(client.pid, signal.SIGSTOP)

        lost, took = _lost_in_scope(w, 30, start_client)
        print(f"\nSIGSTOP of the client detected after {took:.2f} s")
        assert took < 1.0 + 2.5  # grace + a client scan a second
        assert lost.death.kind == "client_stopped" and lost.death.pid == client.pid
        assert lost.death.message().startswith(f"the suite's client stopped (pid {client.pid}")
        assert client.wait(timeout=5) == -signal.SIGKILL
        w.close()
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        srv.stop()


def test_healthy_server_passes_the_heartbeat(tmp_path):
    srv = _server(tmp_path, FAKE_SCHEDULER=1)
    w = _watch(srv, 1.0)
    with w.cancel_scope():
        w.progress.expect(1)
        for _ in range(6):
            time.sleep(0.4)
            w.progress.done()
    w.close()
    srv.stop()
    assert w.lost is None and w.heartbeats >= 2


def test_flush_of_a_silent_server_fails_once_within_the_stall_limit(tmp_path):
    from patchbench.run.server import FlushFailed

    srv = _server(tmp_path, FAKE_HANG_AFTER_S=0.5)
    srv.spec.stall_timeout_s = 1.5
    try:
        time.sleep(0.6)
        t0 = time.monotonic()
        with pytest.raises(FlushFailed) as ei:
            srv.flush_cache()
        assert time.monotonic() - t0 < 1.5 + 0.5
        assert ei.value.stalled
        assert "the server stopped answering" in str(ei.value)
        assert [e for e in srv.events if e.get("event") == "flush_cache"].__len__() == 1
    finally:
        srv.stop()


# ---------------------------------------------------------------------- a client that hangs alive
def _fake_stop_time(srv, what: str) -> float:
    """The monotonic time the fake server logged for ``what`` ("stream stops answering")."""
    for line in srv.spec.log_path.read_text().splitlines():
        if line.startswith(f"fake: {what} at monotonic="):
            return float(line.rsplit("=", 1)[1])
    raise AssertionError(f"the fake server never logged {what!r}")


def test_a_client_hung_on_a_stream_the_server_stopped_answering_is_a_stall(tmp_path):
    """bench_serving's own process state stays S while it waits on a stream the server accepted
    and stopped answering (the heartbeat still answers). The serving suite's run_tool watches the
    client's activity: streaming for longer than the limit is progress; once the stream stops the
    suite ends as a ``client_silent`` stall within the limit + about a second, naming the client
    and its last progress; its stdout is kept and the client is killed."""
    from patchbench.suites.serving import run_tool

    srv = _server(tmp_path, FAKE_SCHEDULER=1, FAKE_STREAM_HANG_AFTER=6)
    out = tmp_path / "serving"
    out.mkdir()
    try:
        w = _watch(srv, 2.0)
        cmd = [sys.executable, str(FAKE / "stream_client.py"), srv.base_url, "20"]
        t0 = time.monotonic()
        with pytest.raises(ServerLost) as ei:
            with w.cancel_scope():
                run_tool(
                    cmd,
                    env=dict(os.environ),
                    out_dir=out,
                    timeout_s=60,
                    server_alive=lambda: True,
                    server_log=srv.spec.log_path,
                    progress=w.progress,
                )
        t_end = time.monotonic()
        t_hang = _fake_stop_time(srv, "stream stops answering")
        print(
            f"\n{ei.value.death.message()}\nclient hung on a silent stream: detected "
            f"{t_end - t_hang:.2f} s after the "
            f"stream stopped ({t_hang - t0:.1f} s of streaming before it, limit 2 s)"
        )
        assert t_hang - t0 > 2.0  # streamed longer than the limit without a stall
        assert t_end - t_hang < 2.0 + 1.6
        stall = ei.value.death
        assert stall.kind == "client_silent" and stall.role == "bench_serving"
        msg = stall.message()
        assert msg.startswith("the suite's client made no progress (bench_serving, pid ")
        assert "while the scheduler heartbeat answers" in msg
        assert "'Starting main benchmark run...'" in msg
        assert "server.stall_timeout_s = 2" in msg
        assert (out / "stdout.txt").read_text().startswith("Starting main benchmark run")
        assert w.progress.client is None
        assert not psutil.pid_exists(stall.pid) or (
            psutil.Process(stall.pid).status() == psutil.STATUS_ZOMBIE
        )
        w.close()
    finally:
        srv.stop()


def test_a_client_that_keeps_streaming_or_computing_is_not_a_stall(tmp_path):
    """Chunks every 0.25 s for 2 s, then 4.5 s of pure computing, at a 3 s limit (room for a
    slow heartbeat on a loaded machine): no stall."""
    from patchbench.run.activity import ProgressMeter

    srv = _server(tmp_path, FAKE_SCHEDULER=1, FAKE_STREAM_CHUNKS=8, FAKE_STREAM_CHUNK_S=0.25)
    try:
        w = _watch(srv, 3.0)
        code = (
            "import subprocess,sys,time;"
            f"subprocess.run([sys.executable,{str(FAKE / 'stream_client.py')!r},"
            f"{srv.base_url!r},'1'],check=True);"
            "t=time.monotonic()\nwhile time.monotonic()-t<4.5: pass"
        )
        with w.cancel_scope():
            client = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
            w.progress.watch_client(client.pid, "test client")
            assert client.wait(timeout=30) == 0
        assert w.lost is None, w.lost and w.lost.message()
        assert isinstance(w.progress, ProgressMeter) and w.progress.client is None
        w.close()
    finally:
        srv.stop()


def test_client_activity_counts_wakeups_output_and_cpu_not_sleep(tmp_path):
    """ClientActivity on three processes, sampled 0.6 s apart: a sleeping one made no progress,
    one printing twice a second and one computing did; a low request rate allows a long wait."""
    from patchbench.run.activity import ClientActivity
    from patchbench.suites.serving import client_idle_s

    out = tmp_path / "out.txt"
    codes = {
        "sleep": "import time; time.sleep(30)",
        "print": "import sys, time\nfor i in range(60): print(i, flush=True); time.sleep(0.2)",
        "busy": "while True: pass",
    }
    procs = {}
    try:
        for k, code in codes.items():
            with open(out if k == "print" else os.devnull, "w") as f:
                procs[k] = subprocess.Popen([sys.executable, "-c", code], stdout=f)
        acts = {
            k: ClientActivity(p.pid, k, [out] if k == "print" else []) for k, p in procs.items()
        }
        for a in acts.values():
            a.sample()
        # past the interpreters' start-up (imports read files and use CPU): on a loaded machine
        # that can take seconds, so wait until the sleeper is settled (bounded)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            time.sleep(0.6)
            if not acts["sleep"].sample():
                break
        for a in acts.values():
            a.sample()
        time.sleep(0.6)
        moved = {k: a.sample() for k, a in acts.items()}
        assert moved == {"sleep": False, "print": True, "busy": True}
        assert acts["print"].last_line.isdigit()
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
    assert client_idle_s(float("inf")) == 0.0 and client_idle_s(0.5) == 40.0


# ---------------------------------------------------------------------- the profiler's export
def test_a_trace_export_longer_than_the_stall_limit_is_not_a_stall_but_has_its_own_limit(tmp_path):
    """sglang writes the profiler's trace inside the scheduler's loop: the heartbeat goes
    unanswered for the export's length (2.5 s here, against a 1 s stall limit). The profile
    suite's wait for the trace announces it (profile.trace_timeout_s): no stall, the trace is
    found. An export longer than that limit (1.5 s) is a stall naming the export."""
    import asyncio
    import json
    import urllib.request
    from types import SimpleNamespace

    from patchbench.suites.profile import Params, await_trace

    srv = _server(tmp_path, FAKE_SCHEDULER=1, FAKE_PROFILE_EXPORT_S=2.5)
    try:
        w = _watch(srv, 1.0)
        ctx = SimpleNamespace(server=SimpleNamespace(progress=w.progress, alive=lambda: True))

        def export(raw: Path, limit_s: float) -> Path:
            body = json.dumps({"output_dir": str(raw), "num_steps": 2}).encode()
            req = urllib.request.Request(srv.base_url + "/start_profile", data=body, method="POST")
            assert urllib.request.urlopen(req, timeout=5).status == 200
            params = Params(trace_timeout_s=limit_s)
            return asyncio.run(await_trace(ctx, params, raw, 1, time.monotonic() + 30))

        with w.cancel_scope():
            t0 = time.monotonic()
            trace = export(tmp_path / "raw1", 10.0)
            print(
                f"\n2.5 s trace export at a 1 s stall limit: trace after {time.monotonic() - t0:.1f} s"
            )
        assert trace.name == "fake-TP-0.trace.json.gz" and w.lost is None
        assert w.progress.quiet_window is None
        lost, took = _lost_in_scope(w, 30, lambda: export(tmp_path / "raw2", 1.5))
        assert lost.death.kind == "heartbeat"
        assert "during the profiler's trace export" in lost.death.message()
        assert "profile.trace_timeout_s = 1.5" in lost.death.message()
        w.close()
    finally:
        srv.stop()


def test_a_closed_window_gives_the_scheduler_the_ordinary_limit_from_its_close():
    """A heartbeat silence that began inside an announced window (the trace export) is not a
    stall the moment the window closes: the ordinary limit counts from the close (the scheduler
    needs a moment to answer again). Past it, the stall is named after the window. Checked on the
    watch's rule directly (no thread, a heartbeat that never answers)."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        w = ServerWatch(proc, proc.pid, stall_timeout_s=1.0, heartbeat=lambda t: False)
        w._t0 = now = time.monotonic()
        w._last_beat = now - 5.0  # silent for 5 s, through the export
        w.progress.last_quiet = (
            10.0,
            "the profiler's trace export",
            "profile.trace_timeout_s",
            now - 0.4,
        )
        assert w._check_progress() is None  # 0.4 s since the window closed < 1 s
        w.progress.last_quiet = (
            10.0,
            "the profiler's trace export",
            "profile.trace_timeout_s",
            now - 1.5,
        )
        stall = w._check_progress()
        assert stall is not None and stall.kind == "heartbeat"
        assert "during the profiler's trace export (profile.trace_timeout_s = 10)" in stall.what
        w.progress.last_quiet = None  # no window: 5 s of silence is a plain stall
        assert "(server.stall_timeout_s = 1)" in w._check_progress().what
    finally:
        proc.kill()
        proc.wait()


def test_a_drip_is_not_a_stall_and_its_timeout_says_it_was_still_progressing(tmp_path):
    """A server that streams one chunk every 0.3 s for ever (progress, far too slow): never a
    stall at a 1.5 s limit; the suite's ``timeout_s`` (4 s) ends it, and the message says the
    tool was still making progress (the server answers, too slowly), not that it hung."""
    from patchbench.suite import SuiteError
    from patchbench.suites.serving import run_tool

    srv = _server(tmp_path, FAKE_SCHEDULER=1, FAKE_STREAM_CHUNKS=100000, FAKE_STREAM_CHUNK_S=0.3)
    try:
        w = _watch(srv, 1.5)
        out = tmp_path / "tool"
        out.mkdir()
        cmd = [sys.executable, str(FAKE / "stream_client.py"), srv.base_url, "1"]
        t0 = time.monotonic()
        with w.cancel_scope(), pytest.raises(SuiteError) as ei:
            run_tool(
                cmd,
                env=dict(os.environ),
                out_dir=out,
                timeout_s=4.0,
                server_alive=srv.alive,
                server_log=srv.spec.log_path,
                progress=w.progress,
            )
        took = time.monotonic() - t0
        assert w.lost is None, w.lost and w.lost.message()
        w.close()
    finally:
        srv.stop()
    assert 4.0 <= took < 7.0
    msg = str(ei.value)
    assert msg.startswith("bench_serving ran past timeout_s=4 while still making progress"), msg
    assert "the server answers, too slowly to finish within timeout_s" in msg


def test_the_whole_group_sigkilled_from_outside_is_named_as_such(tmp_path):
    """The OOM killer (or kill -9) takes the whole server group mid-suite: detected within a
    poll, named as a SIGKILL from outside with where to look."""
    srv = _server(tmp_path, FAKE_SCHEDULER=1)
    try:
        _scheduler_pid(srv)
        w = ServerWatch(srv.proc, srv.pgid).start()
        t0 = time.monotonic()
        os.killpg(srv.pgid, signal.SIGKILL)
        assert w.dead.wait(5)
        assert time.monotonic() - t0 < 1.0
        msg = w.death.message()
        assert msg.endswith(
            "died, killed by signal 9 (SIGKILL, sent from outside: the kernel's "
            "out-of-memory killer names its victims in `dmesg`, or someone ran "
            "kill -9)"
        ), msg
        w.close()
    finally:
        srv.stop()
