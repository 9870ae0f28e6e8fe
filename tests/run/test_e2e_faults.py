"""End to end: faults during a real run (`runner.py bench` on a REAL sglang 0.5.1.post3 CPU server).

Two faults, each on a one-cell run of configs/demo-cpu.yaml cut down to the serving suite (one
variant, one repeat, 64 prompts of 256 output tokens at concurrency 4, so serving lasts far longer
than the fault takes to handle):

- the ``sglang::scheduler`` process is SIGKILLed while bench_serving runs: the HTTP front end stays
  up, so without the liveness watch (patchbench/run/liveness.py) bench_serving would wait for the
  suite's ``timeout_s``. Expected: the cell fails within seconds naming the scheduler's pid,
  ``cell.json`` records it, the run exits 4, and no process of the server's group nor
  bench_serving is left;
- the runner gets SIGTERM while bench_serving runs (patchbench/run/signals.py). Expected: exit 143 within
  seconds, the cell is marked interrupted, the manifest is kept and resumable, the output prints the
  resume command, and no process is left.

The fake-server versions (tests/run/test_liveness.py, tests/run/test_signals.py) cover the same paths
without sglang; these prove them against the real server's process layout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from patchbench.records import read_json
from patchbench.run.ports import find_stale_servers, free_port, port_answers

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo-cpu.yaml"
HOST = "127.0.0.1"
#: seconds to wait for the server to be ready and bench_serving to be serving (CPU start-up on a
#: shared machine: about 30-60 s; the config's ready_timeout_s is 300)
SERVING_DEADLINE_S = 360


def _config(folder: Path, name: str) -> Path:
    """The demo config cut down to one cell running only the serving suite, long enough to act."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["name"] = name
    raw["variants"] = {"baseline": []}
    raw["baseline"] = "baseline"
    raw["schedule"] = {"repeats": 1, "order": "interleaved"}
    serving = dict(raw["suites"]["serving"])
    serving.pop("sweep", None)  # one bench_serving process, one point
    serving.update({"num_prompts": 64, "output_len": 256, "max_concurrency": 4})
    raw["suites"] = {"serving": serving}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Run:
    """One ``runner.py bench`` subprocess (own session) and what it started, seen with psutil."""

    def __init__(self, tmp_path: Path, name: str):
        if not DEMO.is_file():
            pytest.skip(f"{DEMO} not there")
        self.cfg = _config(tmp_path, name)
        self.results = tmp_path / "results"
        self.port = free_port(HOST)
        self.out_path = tmp_path / "bench.out"
        env = dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
        )
        self.t0 = time.monotonic()
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "runner.py",
                    "bench",
                    str(self.cfg),
                    "--results",
                    str(self.results),
                    "--port",
                    str(self.port),
                ],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        #: every descendant of the runner seen so far, by pid (kept to check none is left)
        self.seen: dict[int, psutil.Process] = {}
        self.run_dir: Path | None = None
        self.server_pgid: int | None = None

    # ------------------------------------------------------------------ looking
    def output(self) -> str:
        return self.out_path.read_text(errors="replace")

    def descendants(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for k in kids:
            self.seen.setdefault(k.pid, k)
        return kids

    def find(self, text: str) -> psutil.Process | None:
        """A live descendant whose name or command line contains ``text``."""
        for p in self.descendants():
            try:
                if text in p.name() or text in " ".join(p.cmdline()):
                    return p
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return None

    @property
    def cell_dir(self) -> Path:
        return self.run_dir / "baseline" / "rep0"

    def cell(self) -> dict:
        return read_json(self.cell_dir / "cell.json")

    def wait_serving(self) -> tuple[psutil.Process, psutil.Process]:
        """Wait until bench_serving runs and the server has logged a decode batch since it
        started. Returns (the scheduler, bench_serving)."""
        deadline = time.monotonic() + SERVING_DEADLINE_S
        log_offset = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"bench exited with {self.proc.returncode} before serving:\n{self.output()}"
                )
            if self.run_dir is None and self.results.is_dir():
                dirs = [d for d in self.results.iterdir() if (d / "manifest.json").exists()]
                self.run_dir = dirs[0] if dirs else None
            client = self.find("clientwatch.py")  # bench_serving runs inside it
            sched = self.find("sglang::scheduler")
            if client is not None and sched is not None and self.run_dir is not None:
                log = self.cell_dir / "server.log"
                if log_offset is None:
                    log_offset = log.stat().st_size
                with open(log, "rb") as f:
                    f.seek(log_offset)
                    if b"Decode batch" in f.read():
                        self.server_pgid = self.cell()["server"]["pgid"]
                        self.descendants()  # a last snapshot of everything started
                        return sched, client
            time.sleep(0.2)
        raise AssertionError(f"not serving after {SERVING_DEADLINE_S} s:\n{self.output()}")

    # ------------------------------------------------------------------ after
    def left_over(self, grace_s: float = 3.0) -> list[str]:
        """What is still alive (not zombie) of everything the run started: the runner's
        descendants seen and any process of the server's group. Waits up to ``grace_s``."""
        deadline = time.monotonic() + grace_s
        while True:
            left = []
            for p in self.seen.values():
                try:
                    if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                        left.append(f"pid {p.pid} {' '.join(p.cmdline())[:120]}")
                except psutil.NoSuchProcess:
                    pass
            if self.server_pgid is not None:
                for p in psutil.process_iter(["pid", "status"]):
                    try:
                        same = os.getpgid(p.pid) == self.server_pgid
                    except (ProcessLookupError, PermissionError):
                        continue
                    if same and p.info["status"] != psutil.STATUS_ZOMBIE and p.pid not in self.seen:
                        left.append(f"pid {p.pid} in the server's group {self.server_pgid}")
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    def cleanup(self) -> None:
        """Kill whatever this run started that is still alive (only after a failed assertion)."""
        groups = {self.proc.pid} | ({self.server_pgid} if self.server_pgid else set())
        for p in self.seen.values():
            try:
                groups.add(os.getpgid(p.pid))
            except (ProcessLookupError, PermissionError):
                pass
        groups.discard(os.getpgid(0))
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def bench_run(tmp_path, request):
    runs: list[Run] = []

    def make(name: str) -> Run:
        r = Run(tmp_path, name)
        runs.append(r)
        return r

    yield make
    for r in runs:
        r.cleanup()


@pytest.mark.timeout(900)
def test_scheduler_sigkill_fails_the_cell_within_seconds(bench_run):
    r = bench_run("fault-scheduler-kill")
    sched, client = r.wait_serving()
    sched_pid = sched.pid
    t_kill = time.monotonic()
    os.kill(sched_pid, signal.SIGKILL)

    # the cell's verdict: failed, naming the dead scheduler (cell.json is written atomically)
    rec = None
    while time.monotonic() - t_kill < 60:
        rec = r.cell()
        if rec["status"] == "failed":
            break
        time.sleep(0.1)
    detect_s = time.monotonic() - t_kill
    print(f"\nscheduler SIGKILL -> cell.json failed: {detect_s:.2f} s")
    death_msg = f"the sglang scheduler (pid {sched_pid}) died"
    assert rec["status"] == "failed", rec
    assert detect_s < 30, detect_s  # not the suite's timeout_s (600 s)
    assert death_msg in (rec["error"] or ""), rec["error"]
    death = rec["liveness"]["death"]
    assert (death["pid"], death["role"]) == (sched_pid, "the sglang scheduler")
    print(f"watcher saw it {death['detected_after_s']:.2f} s after the watch began")

    rc = r.proc.wait(timeout=120)
    out = r.output()
    assert rc == 4, out
    assert "1 of 1 cells failed" in out, out
    serving = read_json(r.cell_dir / "serving" / "summary.json")
    assert serving["status"] == "failed"
    assert any(death_msg in e for e in serving["errors"]), serving["errors"]
    man = read_json(r.run_dir / "manifest.json")
    assert [(c["variant"], c["status"]) for c in man["cells"]] == [("baseline", "failed")]
    assert death_msg in man["cells"][0]["error"]
    assert not client.is_running() or client.status() == psutil.STATUS_ZOMBIE
    assert r.left_over() == []
    assert not port_answers(HOST, r.port)
    print(f"wall {time.monotonic() - r.t0:.1f} s")


@pytest.mark.timeout(900)
def test_sigterm_stops_everything_and_prints_the_resume_command(bench_run):
    r = bench_run("fault-sigterm")
    r.wait_serving()
    assert r.cell()["status"] == "running"
    t_term = time.monotonic()
    r.proc.send_signal(signal.SIGTERM)
    rc = r.proc.wait(timeout=60)
    took = time.monotonic() - t_term
    out = r.output()
    print(f"\nSIGTERM -> runner exit {rc}: {took:.2f} s")
    assert rc == 143, out
    assert took < 30, out
    assert (
        f"resume with: {sys.executable} -m patchbench bench {r.cfg} --resume {r.run_dir}" in out
    ), out

    rec = r.cell()
    assert rec["status"] == "interrupted", rec
    assert rec["error"] == "interrupted by SIGTERM"
    man = read_json(r.run_dir / "manifest.json")
    assert man["interrupted"] is True
    assert man["cells"] == []  # the only cell did not finish; nothing finished is dropped
    assert r.left_over() == []
    assert not port_answers(HOST, r.port)
    assert find_stale_servers(r.results) == []

    # the kept folder resumes: the plan says the one cell is still to run (no server started)
    plan = subprocess.run(
        [sys.executable, "runner.py", "bench", str(r.cfg), "--resume", str(r.run_dir), "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert "0 of 1 cells done" in plan.stdout, plan.stdout
    print(f"wall {time.monotonic() - r.t0:.1f} s")
