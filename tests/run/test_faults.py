"""Faults refused where they enter (docs/faults.md): impossible metric values, and (below) the run
folder lock, names, resume identity and exit codes. Fake-server and fast tests only."""

from __future__ import annotations

import math

from patchbench.run.cell import refuse_impossible
from patchbench.suite import SuiteResult


def test_impossible_metric_values_are_refused_where_they_enter():
    res = SuiteResult(
        status="ok",
        metrics={"a_ms": 1.0, "b_tok_s": math.nan, "c_s": math.inf, "d_count": 3.0},
    )
    assert refuse_impossible(res) == ["b_tok_s", "c_s"]
    assert res.status == "incomplete"
    assert res.metrics == {"a_ms": 1.0, "d_count": 3.0}
    assert res.errors == [
        "impossible value b_tok_s = nan refused (not a finite number)",
        "impossible value c_s = inf refused (not a finite number)",
    ]
    clean = SuiteResult(status="ok", metrics={"x_ms": 2.0})
    assert refuse_impossible(clean) == [] and clean.status == "ok"


# ---------------------------------------------------------------------- one writer per run folder
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from patchbench.run.bench import new_run_dir  # noqa: E402
from patchbench.run.lock import RunFolderBusy, acquire  # noqa: E402
from tests.helpers import fake_suite_config, start_fake_run  # noqa: E402

HERE = Path(__file__).parent.parent
SGLANG = importlib.metadata.version("sglang")


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    lock = acquire(tmp_path)
    with pytest.raises(RunFolderBusy, match=rf"pid {os.getpid()} on host .* since "):
        acquire(tmp_path)
    lock.release()
    again = acquire(tmp_path)
    assert again.previous is None  # released cleanly: nothing left behind
    again.release()


def test_the_lock_of_a_dead_run_is_taken_over_and_named(tmp_path):
    p = _holder(tmp_path, "run", 60)
    with pytest.raises(RunFolderBusy, match=rf"pid {p.pid} "):
        acquire(tmp_path)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    lock = acquire(tmp_path)  # the kernel dropped the dead run's flock
    assert lock.previous["pid"] == p.pid
    lock.release()


def test_two_runs_in_the_same_second_get_their_own_folders(tmp_path):
    a = new_run_dir(tmp_path, "20260101T000000Z", "x")
    b = new_run_dir(tmp_path, "20260101T000000Z", "x")
    assert (a.name, b.name) == ("20260101T000000Z-x", "20260101T000000Z-x-2")


def test_a_resume_while_the_run_still_writes_is_refused(tmp_path):
    """Two writers of one folder: the run is busy in its second cell; `--resume` of its folder
    exits 4 naming the running pid, and the run itself is not disturbed."""
    (tmp_path / "model").mkdir()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        fake_suite_config("lock-test", 1, sglang=SGLANG, model=tmp_path / "model", port=31945)
    )
    mark = tmp_path / "mark.txt"
    results = tmp_path / "results"
    runner = HERE / "fake_server" / "run_bench_fake.py"
    hold = tmp_path / "hold"  # the first run's cell waits until the second run has been refused
    hold.write_text("")
    env = dict(
        os.environ,
        FAKE_SUITE_MARK=str(mark),
        CELLENV_FOR="control/rep0",
        CELLENV_FAKE_GENERATE_HOLD_FILE=str(hold),
    )
    first = start_fake_run(cfg, results, env)
    try:
        deadline = time.monotonic() + 120
        while not (mark.exists() and "control/0" in mark.read_text()):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        (run_dir,) = list(results.iterdir())
        second = subprocess.run(
            [sys.executable, str(runner), str(cfg), str(results), "--resume", str(run_dir)],
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 4, second.stdout + second.stderr
        assert "run folder busy (exit 4)" in second.stderr
        assert f"pid {first.pid} on host" in second.stderr
        hold.unlink()
        out, _ = first.communicate(timeout=120)
        assert first.returncode == 0, out
    finally:
        hold.unlink(missing_ok=True)
        if first.poll() is None:
            first.kill()
            first.wait()
    lock = acquire(run_dir)  # released at the end of the first run
    assert lock.previous is None
    lock.release()


# ---------------------------------------------------------------------- names checked at load
from patchbench.config import load_config  # noqa: E402
from patchbench.errors import ConfigError, exit_code_of  # noqa: E402

NAMES_CFG = """\
name: NAME
sglang: 0.5.1.post3
model: {path: .cache/models/tiny-qwen25vl-tf4, tiny: true}
server:
  args: [--device=cpu]
variants:
  baseline: []
  VARIANT: []
"""


@pytest.mark.parametrize(
    "name, variant, message",
    [
        (
            "t",
            "compare.json",
            r"c.yaml:6: key 'variants': variant name 'compare.json': the run fol",
        ),
        ("t", "Report.md", r"variant name 'Report.md': the run folder uses 'Report.md' itself"),
        ("t", "plots", r"variant name 'plots': the run folder uses"),
        ("t", "v" * 65, r"65 characters; at most 64"),
        ("t", "a/b", r"variant name 'a/b': use letters, digits"),
        ("t", "Baseline", r"'baseline' and 'Baseline' differ only in case"),
        ("x" * 101, "v", r"c.yaml:1: key 'name': 101 characters; at most 100"),
    ],
)
def test_names_that_cannot_be_files_are_refused_at_load(tmp_path, name, variant, message):
    p = tmp_path / "c.yaml"
    p.write_text(NAMES_CFG.replace("NAME", name).replace("VARIANT", repr(variant)))
    with pytest.raises(ConfigError, match=message) as ei:
        load_config(p)
    assert exit_code_of(ei.value) == 2


# ---------------------------------------------------------------------- our server, and only ours
def test_a_port_taken_between_the_check_and_the_launch_is_named(tmp_path):
    """Another process binds the port after the launch's check and answers readiness as well
    as ours would: the cell must not measure it (PortTaken names the holder)."""
    from patchbench.run.ports import free_port
    from patchbench.run.server import LaunchSpec, PortTaken, SglangServer

    fake = HERE / "fake_server"
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(fake), FAKE_BIND_DELAY_S="3")
    spec = LaunchSpec(
        python=sys.executable,
        model_path="fake",
        host="127.0.0.1",
        port=port,
        args=[],
        env=env,
        log_path=tmp_path / "server.log",
        ready_timeout_s=20,
        stop_grace_s=3,
        port_close_timeout_s=10,
    )
    srv = SglangServer(spec)
    srv.start()  # the port is free now
    foreign = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--port", str(port)],
        env=dict(os.environ, PYTHONPATH=str(fake)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with pytest.raises(PortTaken) as ei:
            srv.wait_ready()
        msg = str(ei.value)
        assert f"another process took port {port} between the check and the launch" in msg
        assert f"pid {foreign.pid}" in msg
        assert "not a patchbench server" in msg or "readiness was answered" in msg
    finally:
        srv.stop()
        foreign.kill()
        foreign.wait()


# ---------------------------------------------------------------------- orphans wherever they ran
def test_an_orphan_of_a_run_outside_the_results_folder_is_found_and_stopped(tmp_path):
    """A server left by a runner that is gone (its pid now names a process that started at
    another time: a reused pid), whose run wrote outside results/: `doctor` and `--kill-stale`
    find it by its markers, advise a group kill only for its own group, and stop it."""
    from patchbench.doctor import _stale_server_checks
    from patchbench.run.ports import (
        MARKER_CELL,
        MARKER_RUN_DIR,
        MARKER_RUNNER_PID,
        MARKER_RUNNER_START,
        find_stale_servers,
        kill_stale,
    )
    from tests.run.test_liveness import _server as start_fake_server

    elsewhere = tmp_path / "elsewhere" / "run1"
    srv = start_fake_server(
        tmp_path,
        **{
            MARKER_RUN_DIR: str(elsewhere),
            MARKER_CELL: "baseline/rep0",
            MARKER_RUNNER_PID: str(os.getpid()),  # alive, but not the runner:
            MARKER_RUNNER_START: "12345.0",  # it started at another time
        },
    )
    try:
        results = tmp_path / "results"
        results.mkdir()
        assert all(s.pid != srv.pid for s in find_stale_servers(results))
        found = [s for s in find_stale_servers(results, anywhere=True) if s.pid == srv.pid]
        assert len(found) == 1
        s = found[0]
        assert s.run_dir == str(elsewhere) and s.cell == "baseline/rep0"
        assert s.kill_command == f"kill -TERM -- -{srv.pgid}"  # its own group
        checks = _stale_server_checks(results)
        assert any(str(srv.pid) in (c[0] + c[2]) for c in checks), checks
        (res,) = kill_stale(found, grace_s=0.5, timeout_s=5)
        assert res[1] is True
        assert srv.proc.wait(timeout=5) is not None
    finally:
        srv.stop()


def test_group_kill_advice_only_for_a_group_of_its_own():
    from patchbench.run.ports import StaleServer, own_group

    me = os.getpgid(0)
    assert not own_group(os.getpid(), me)  # the caller's own group
    assert not own_group(1, 1)
    s = StaleServer(4242, me, "/r", None, None, None, "environment")
    assert s.kill_command == "kill -TERM 4242"


# ---------------------------------------------------------------------- `patchbench report` and the lock
GOLDEN_RUN = HERE / "data" / "golden" / "demo-cpu" / "run"


def _holder(run: Path, purpose: str, hold_s: float) -> subprocess.Popen:
    """A process that holds ``run``'s lock as ``purpose`` for ``hold_s`` seconds (it says when)."""
    code = (
        "import time;from patchbench.run.lock import acquire;"
        f"lock=acquire({str(run)!r}, purpose={purpose!r});print('held',flush=True);"
        f"time.sleep({hold_s});lock.release()"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(HERE.parent)),
    )
    assert p.stdout.readline().strip() == "held"
    return p


def _golden_copy(tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(GOLDEN_RUN, run)
    return run


def test_report_while_a_run_writes_the_folder_exits_4_naming_the_run(tmp_path, capsys):
    from patchbench.cli import main

    run = _golden_copy(tmp_path)
    p = _holder(run, "run", 60)
    try:
        t0 = time.monotonic()
        assert main(["report", str(run), "--no-plots"]) == 4
        assert time.monotonic() - t0 < 2.0  # a run is named at once, not waited for
        err = capsys.readouterr().err
        assert "run folder busy (exit 4)" in err and f"another run: pid {p.pid} on host" in err
        assert "before reporting this folder" in err
        assert not (run / "report.md").exists() and not (run / "compare.json").exists()
    finally:
        p.kill()
        p.wait()


def test_a_second_report_waits_for_the_first_and_gives_up_naming_it(tmp_path, capsys, monkeypatch):
    """A report holding the lock for 1.5 s: the second waits and renders; one that holds it past
    REPORT_WAIT_S (0.5 s here) is named with the time waited (exit 4)."""
    from patchbench.cli import main
    from patchbench.run import lock as lockmod

    run = _golden_copy(tmp_path)
    p = _holder(run, "report", 1.5)
    t0 = time.monotonic()
    assert main(["report", str(run), "--no-plots"]) == 0
    waited = time.monotonic() - t0
    print(f"\nsecond report waited {waited:.2f} s for the first")
    assert p.wait(timeout=10) == 0 and waited > 1.0
    assert (run / "report.md").is_file()
    assert json.loads((run / ".lock").read_text() or "null") is None  # released and emptied

    monkeypatch.setattr(lockmod, "REPORT_WAIT_S", 0.5)
    p = _holder(run, "report", 60)
    try:
        capsys.readouterr()
        assert main(["report", str(run), "--no-plots"]) == 4
        err = capsys.readouterr().err
        assert f"another report: pid {p.pid} on host" in err and "(waited 0.5 s)" in err
    finally:
        p.kill()
        p.wait()


def test_every_file_a_report_writes_is_written_atomically(tmp_path, monkeypatch):
    """Every file `patchbench report` creates or changes in the run folder (compare.json, the
    reports, the plots) is put in place by an ``os.replace`` of a finished temporary file
    (records.write_bytes), so a reader never sees half a file."""
    from patchbench.cli import main

    run = _golden_copy(tmp_path)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    replaced: list[Path] = []
    real = os.replace

    def spy(src, dst, *a, **kw):
        replaced.append(Path(dst).resolve())
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", spy)
    assert main(["report", str(run)]) == 0
    changed = {
        p.resolve()
        for p in run.rglob("*")
        if p.is_file() and before.get(p) != p.stat().st_mtime_ns and p.name != ".lock"
    }
    assert changed and changed <= set(replaced), sorted(map(str, changed - set(replaced)))
    assert {"compare.json", "report.md", "report-details.md"} <= {p.name for p in changed}
    assert any(p.name.startswith("profile_timeline_") for p in changed)
