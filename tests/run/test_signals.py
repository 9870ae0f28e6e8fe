"""SIGTERM / SIGHUP to the runner behave like Ctrl-C, and servers orphaned by a SIGKILLed runner
are found and stopped (patchbench.run.signals, patchbench.run.ports), against the fake server."""

import importlib.metadata
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from patchbench.records import read_json
from patchbench.run.ports import find_stale_servers, kill_stale, port_answers
from tests.helpers import fake_suite_config, start_fake_run

HERE = Path(__file__).parent.parent
SGLANG = importlib.metadata.version("sglang")


def _start(tmp_path, port, **cellenv):
    (tmp_path / "model").mkdir()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        fake_suite_config("signal-test", 2, sglang=SGLANG, model=tmp_path / "model", port=port)
    )
    mark = tmp_path / "mark.txt"
    env = dict(
        os.environ,
        FAKE_SUITE_MARK=str(mark),
        CELLENV_FOR="control/rep0",
        **{f"CELLENV_{k}": str(v) for k, v in cellenv.items()},
    )
    proc = start_fake_run(cfg, tmp_path / "results", env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait for the second cell's suite (one finished cell)
        if mark.exists() and "control/0" in mark.read_text():
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the runner never reached the second cell:\n" + proc.communicate()[0])


def _gone(pid):
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 130)])
def test_sigterm_and_sighup_stop_everything_and_keep_finished_cells(tmp_path, sig, code):
    port = 31960 + (sig == signal.SIGHUP)
    proc = _start(tmp_path, port, FAKE_GENERATE_SLEEP_S=30)
    run_dir = next((tmp_path / "results").iterdir())
    running = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert running["status"] == "running" and running["server"]["pgid"] == running["server"]["pid"]
    t0 = time.monotonic()
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    took = time.monotonic() - t0
    assert proc.returncode == code, out
    assert took < 10, out  # not the suite's 30 s request
    assert "-m patchbench bench" in out and f"--resume {run_dir}" in out
    rec = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert rec["status"] == "interrupted"
    assert rec["error"] == f"interrupted by {signal.Signals(sig).name}"
    man = read_json(run_dir / "manifest.json")
    assert man["interrupted"] is True
    assert [(c["variant"], c["status"]) for c in man["cells"]] == [("baseline", "ok")]
    assert read_json(run_dir / "baseline" / "rep0" / "fake" / "summary.json")["status"] == "ok"
    assert _gone(running["server"]["pid"])
    assert not port_answers("127.0.0.1", port)
    assert find_stale_servers(tmp_path / "results") == []


def test_sigkilled_runner_leaves_a_server_that_is_found_and_killed(tmp_path):
    port = 31965
    proc = _start(tmp_path, port, FAKE_GENERATE_SLEEP_S=60)
    run_dir = next((tmp_path / "results").iterdir())
    srv = read_json(run_dir / "control" / "rep0" / "cell.json")["server"]
    proc.kill()
    proc.communicate(timeout=30)
    try:
        assert port_answers("127.0.0.1", port)  # the orphan keeps the port
        stale = find_stale_servers(tmp_path / "results")
        assert [(s.pid, s.cell, s.port) for s in stale] == [(srv["pid"], "control/rep0", port)]
        assert stale[0].kill_command == f"kill -TERM -- -{srv['pgid']}"
        assert [ok for _, ok in kill_stale(stale)] == [True]
        assert _gone(srv["pid"])
        assert not port_answers("127.0.0.1", port)
        rec = read_json(run_dir / "control" / "rep0" / "cell.json")
        assert rec["status"] == "interrupted" and "--kill-stale" in rec["error"]
        assert find_stale_servers(tmp_path / "results") == []
    finally:
        try:
            os.killpg(srv["pgid"], signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_sigterm_while_the_report_is_written_exits_143_naming_the_report_command(tmp_path):
    """Every cell measured, the report under way: SIGTERM ends the runner with 143 (it died
    silently by the signal's default action), the manifest records the report as interrupted,
    every cell is kept and `patchbench report RUN` writes the report afterwards."""
    (tmp_path / "model").mkdir()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        fake_suite_config("signal-test", 2, sglang=SGLANG, model=tmp_path / "model", port=31966)
    )
    mark = tmp_path / "report.mark"
    env = dict(os.environ, FAKE_REPORT_MARK=str(mark), FAKE_REPORT_DELAY_S="30")
    proc = start_fake_run(cfg, tmp_path / "results", env)
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # a second one while it stops is only reported
        out = proc.communicate(timeout=20)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, out
    (run_dir,) = (tmp_path / "results").iterdir()
    assert "while the report was written" in out and f"-m patchbench report {run_dir}" in out
    man = read_json(run_dir / "manifest.json")
    assert man["report_error"] == "interrupted by SIGTERM while the report was written"
    assert [c["status"] for c in man["cells"]] == ["ok"] * 4
    assert not (run_dir / "report.md").exists()
    from patchbench.cli import main

    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.md").is_file()


def test_ctrl_c_twice_quickly_stops_everything_once_and_exits_130(tmp_path):
    """A double Ctrl-C during a suite: the first stops the cell, the second (20 ms later) is
    reported and ignored while the server is stopped and the run recorded; nothing is left."""
    port = 31967
    proc = _start(tmp_path, port, FAKE_GENERATE_SLEEP_S=30)
    run_dir = next((tmp_path / "results").iterdir())
    running = read_json(run_dir / "control" / "rep0" / "cell.json")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "Traceback" not in out and f"--resume {run_dir}" in out
    assert read_json(run_dir / "control" / "rep0" / "cell.json")["status"] == "interrupted"
    assert read_json(run_dir / "manifest.json")["interrupted"] is True
    assert _gone(running["server"]["pid"])
    assert not port_answers("127.0.0.1", port)
    assert find_stale_servers(tmp_path / "results") == []
