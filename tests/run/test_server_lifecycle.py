"""Server lifecycle (docs/cases.md L1-L3) against the fake server in tests/fake_server.

The fake implements the faults a real sglang cannot be made to show on demand; the real server's
lifecycle is covered by the end-to-end tests (tests/cli/test_e2e_bench.py).
"""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from patchbench.run.ports import free_port, port_answers
from patchbench.run.server import (
    FlushFailed,
    LaunchSpec,
    PortInUse,
    ReadyTimeout,
    ServerDied,
    SglangServer,
    StopFailed,
)

FAKE = Path(__file__).parent.parent / "fake_server"


def _spec(tmp_path, port=None, ready_timeout_s=20.0, stop_grace_s=3.0, **env):
    tmp_path.mkdir(parents=True, exist_ok=True)
    e = dict(os.environ)
    e["PYTHONPATH"] = str(FAKE)
    e.update({k: str(v) for k, v in env.items()})
    return LaunchSpec(
        python=sys.executable,
        model_path="fake",
        host="127.0.0.1",
        port=port or free_port(),
        args=[],
        env=e,
        log_path=tmp_path / "server.log",
        ready_timeout_s=ready_timeout_s,
        stop_grace_s=stop_grace_s,
        port_close_timeout_s=10,
        flush_retries=4,
        flush_pause_s=0.1,
    )


def _group_alive(pgid):
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return out


def test_l1_waits_for_health_200_not_models(tmp_path):
    """/v1/models answers at once while /health says 503 for 2 s: ready only after /health 200."""
    srv = SglangServer(_spec(tmp_path, FAKE_HEALTH_503_S=2))
    srv.start()
    try:
        waited = srv.wait_ready()
        assert waited >= 2.0
        kinds = [e["event"] for e in srv.events]
        assert kinds.index("health_200") < kinds.index("ready")
    finally:
        srv.stop()


def test_l1_process_exit_fails_at_once_with_log_tail(tmp_path):
    """The process exits 1 s in, /health would be 503 for 60 s: fail in ~1 s, not at the timeout."""
    srv = SglangServer(
        _spec(tmp_path, ready_timeout_s=60, FAKE_HEALTH_503_S=60, FAKE_EXIT_AFTER_S=1)
    )
    srv.start()
    t = time.monotonic()
    with pytest.raises(ServerDied) as ei:
        srv.wait_ready()
    assert time.monotonic() - t < 10
    assert "fatal error, exiting" in str(ei.value)  # the log tail is in the message
    assert "code 3" in str(ei.value)
    srv.stop()


def test_ready_timeout(tmp_path):
    srv = SglangServer(_spec(tmp_path, ready_timeout_s=1.5, FAKE_HEALTH_503_S=60))
    srv.start()
    try:
        with pytest.raises(ReadyTimeout, match="/health 503"):
            srv.wait_ready()
    finally:
        srv.stop()
    assert not port_answers("127.0.0.1", srv.spec.port)


def test_l2_refuses_when_port_answers(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = SglangServer(_spec(tmp_path, port=port))
        with pytest.raises(PortInUse, match=f"127.0.0.1:{port}"):
            srv.start()
        assert srv.proc is None  # nothing was launched


def test_l2_stop_kills_grandchildren_and_closes_port(tmp_path):
    srv = SglangServer(_spec(tmp_path, FAKE_GRANDCHILD=1))
    srv.start()
    srv.wait_ready()
    time.sleep(1.0)  # let the child start its grandchild
    root = psutil.Process(srv.pid)
    tree = [root.pid] + [c.pid for c in root.children(recursive=True)]
    assert len(tree) == 3  # server, child, grandchild
    srv.stop()
    assert _group_alive(srv.pid) == []
    for pid in tree:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not port_answers("127.0.0.1", srv.spec.port)


def test_l2_sigterm_ignored_escalates_to_sigkill(tmp_path):
    srv = SglangServer(_spec(tmp_path, stop_grace_s=1.0, FAKE_IGNORE_SIGTERM=1))
    srv.start()
    srv.wait_ready()
    srv.stop()
    kinds = [e["event"] for e in srv.events]
    assert "sigkill" in kinds
    assert not srv.alive()
    assert not port_answers("127.0.0.1", srv.spec.port)


def test_l3_flush_retries_then_succeeds(tmp_path):
    srv = SglangServer(_spec(tmp_path, FAKE_FLUSH_400=2))
    with srv:
        srv.flush_cache()
        answers = [e["answer"] for e in srv.events if e["event"] == "flush_cache"]
    assert len(answers) == 3
    assert answers[0].startswith("400") and "pending requests" in answers[0]
    assert answers[1].startswith("400")
    assert answers[2].startswith("200")


def test_l3_flush_refused_for_whole_budget_fails(tmp_path):
    srv = SglangServer(_spec(tmp_path, FAKE_FLUSH_400=-1))
    with srv:
        with pytest.raises(FlushFailed, match="refused 4 times"):
            srv.flush_cache()
        assert len([e for e in srv.events if e["event"] == "flush_cache"]) == 4


def test_fast_stop_does_not_wait_for_a_slow_sigterm_and_graceful_does(tmp_path):
    """The fake front end exits 5 s after SIGTERM (sglang's watchdog polls every 5 s). The fast
    stop (SIGTERM, 0.05 s, SIGKILL) ends in under 1 s with the port closed and nothing left; the
    graceful one waits the 5 s."""
    took = {}
    for mode in ("fast", "graceful"):
        spec = _spec(tmp_path / mode, stop_grace_s=10, FAKE_SIGTERM_DELAY_S=5, FAKE_SCHEDULER=1)
        spec.stop_mode = mode
        srv = SglangServer(spec)
        srv.start()
        srv.wait_ready()
        time.sleep(0.5)
        took[mode] = srv.stop()
        assert _group_alive(srv.pid) == []
        assert not port_answers("127.0.0.1", spec.port)
        assert set(srv.stop_breakdown_s) == {"exit", "port", "gpu"}
    print(
        f"\nstop with a 5 s SIGTERM delay: fast {took['fast']:.2f} s, graceful {took['graceful']:.2f} s"
    )
    assert took["fast"] < 1.0
    assert 5.0 <= took["graceful"] < 9.0


class FakeNvml:
    """patchbench.run.gpu.Nvml's interface: GPU 0 lists ``held`` pids until ``release_after`` calls."""

    def __init__(self, held, release_after):
        self.held, self.calls, self.release_after = list(held), 0, release_after

    def wait_released(self, pids, timeout_s=30.0, poll_s=0.0):
        from patchbench.run.gpu import Nvml

        return Nvml.wait_released(self, pids, timeout_s, poll_s)

    def holders(self, pids):
        self.calls += 1
        return [p for p in self.held if p in pids] if self.calls <= self.release_after else []


def test_stop_waits_for_gpu_memory_and_fails_when_it_stays_held(tmp_path):
    srv = SglangServer(_spec(tmp_path / "a"))
    srv.start()
    srv.wait_ready()
    nv = FakeNvml([srv.pid], release_after=3)
    srv.stop(nvml=nv)
    assert nv.calls == 4 and srv.stop_breakdown_s["gpu"] is not None
    spec = _spec(tmp_path / "b")
    spec.gpu_release_timeout_s = 0.3
    srv = SglangServer(spec)
    srv.start()
    srv.wait_ready()
    with pytest.raises(
        StopFailed, match=rf"GPU memory still held by server process\(es\) \[{srv.pid}\]"
    ):
        srv.stop(nvml=FakeNvml([srv.pid], release_after=10**9))


def test_busy_port_names_the_orphaned_patchbench_server_holding_it(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a runner pid that no longer lives
    first = SglangServer(
        _spec(
            tmp_path / "a",
            PATCHBENCH_RUN_DIR="/x/results/run1",
            PATCHBENCH_CELL="control/rep1",
            PATCHBENCH_RUNNER_PID=dead.pid,
        )
    )
    first.start()
    first.wait_ready()
    try:
        second = SglangServer(_spec(tmp_path / "b", port=first.spec.port))
        with pytest.raises(PortInUse) as ei:
            second.start()
        msg = str(ei.value)
        assert f"pid {first.pid} (" in msg and "sglang.launch_server" in msg
        assert "a patchbench server of run /x/results/run1 (cell control/rep1)" in msg
        assert f"its runner (pid {dead.pid}) is gone, so it is an orphan" in msg
        assert f"`kill -TERM -- -{first.pid}`" in msg
    finally:
        first.stop()


def test_log_tail_shows_a_repeated_line_once(tmp_path):
    from patchbench.run.server import tail

    log = tmp_path / "server.log"
    log.write_text("loading\nTraceback: boom\n" + "[Gloo] Rank 0 is connected\n" * 3 + "end\n")
    assert tail(log, 3) == ("Traceback: boom\n[Gloo] Rank 0 is connected  (repeated 3 times)\nend")
    assert tail(tmp_path / "missing.log") == ""


def test_log_tail_leaves_out_the_heartbeat_access_lines(tmp_path):
    """uvicorn logs every heartbeat (GET /server_info, 12 a minute at the default stall limit)
    into server.log; the tail quoted in an error shows the server's own lines and counts the
    heartbeat lines it left out (only those among the lines shown); a heartbeat that failed is
    kept, and server.log itself is not changed."""
    from patchbench.run.server import tail

    beat = '[t] INFO:     127.0.0.1:{} - "GET /{}server_info HTTP/1.1" {}'
    text = "\n".join(
        [
            "old line",
            beat.format(1, "", "404 Not Found"),  # 0.5.1.post3's one probe
            beat.format(2, "get_", "200 OK"),
            "Decode batch. #running-req: 1",
            beat.format(3, "get_", "200 OK"),
            beat.format(4, "", "200 OK"),
            '[t] INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK',
            beat.format(6, "", "500 Internal Server Error"),
            beat.format(7, "", "200 OK"),
            "Scheduler hit an exception: boom",
        ]
    )
    log = tmp_path / "server.log"
    log.write_text(text + "\n")
    got = tail(log, 4).splitlines()
    assert got == [
        "Decode batch. #running-req: 1",
        '[t] INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK',
        beat.format(6, "", "500 Internal Server Error"),
        "Scheduler hit an exception: boom",
        "(3 access-log lines of patchbench's scheduler heartbeat (GET /server_info) left out of "
        "this tail; server.log has them)",
    ]
    assert log.read_text() == text + "\n"
    # two threads or processes printing at once run into one line: the server's own words stay
    # (a CI run lost "dying mid-run" this way); a bare record with another client's format goes
    mixed = [
        'fake: "GET /server_info HTTP/1.1" 200 -fake: dying mid-run',
        'fake: dying mid-runfake: "GET /server_info HTTP/1.1" 200 -',
        'fake: "GET /server_info HTTP/1.1" 200 -',
    ]
    log.write_text("\n".join(mixed) + "\n")
    assert tail(log, 5).splitlines() == [
        *mixed[:2],
        "(1 access-log line of patchbench's scheduler heartbeat (GET /server_info) left out of "
        "this tail; server.log has them)",
    ]


@pytest.mark.parametrize(
    "env, last",
    [
        ({"FAKE_NOT_HTTP": "/health"}, "/health: not an HTTP answer (BadStatusLine"),
        ({"FAKE_NOT_HTTP": "/generate"}, "/generate: not an HTTP answer (BadStatusLine"),
        ({"FAKE_HANG_PATHS": "/generate"}, "/generate: TimeoutError"),
    ],
)
def test_readiness_answered_by_no_http_or_not_at_all_times_out_on_time_naming_it(
    tmp_path, env, last
):
    """A port that answers bytes that are not HTTP (another protocol, a status line cut short) is
    no answer, not a crash of the run (http.client's BadStatusLine was no OSError); a readiness
    /generate that never answers does not outlast ``ready_timeout_s`` (one try took 60 s)."""
    srv = SglangServer(_spec(tmp_path, ready_timeout_s=2.0, **env))
    srv.start()
    t = time.monotonic()
    try:
        with pytest.raises(ReadyTimeout) as ei:
            srv.wait_ready()
    finally:
        srv.stop()
    assert time.monotonic() - t < 4.0
    assert f"last answer: {last}" in str(ei.value)
    assert "--- server.log (tail) ---" in str(ei.value)


def test_a_flush_answered_by_no_http_is_refused_not_a_crash(tmp_path):
    srv = SglangServer(_spec(tmp_path, FAKE_NOT_HTTP="/flush_cache"))
    with srv:
        with pytest.raises(FlushFailed, match=r"refused 4 times.*/flush_cache: not an HTTP answer"):
            srv.flush_cache()
