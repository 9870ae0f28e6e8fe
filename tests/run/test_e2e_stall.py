"""End to end: a scheduler that stops answering while its process lives (`runner.py bench` on a
REAL sglang 0.5.1.post3 CPU server).

A test-only patch (a ``{diff: FILE}`` variant made here from the installed ``scheduler.py``) blocks
``Scheduler.handle_generate_request`` forever, inside the scheduler's loop, from the 6th
generation request on: the process sleeps in state S, as a deadlocked scheduler does, so no
process check sees it. One run of configs/demo-cpu.yaml cut down to one
variant, two repeats, the mmmu (first round only) and serving suites and
``server.stall_timeout_s: 5``, so two servers block:

- rep0's, during MMMU (the readiness check and 4 questions answered; serving then does not run);
- rep1's, during bench_serving (the readiness check, the warm-up and 3 prompts).

Expected for each: the cell fails within the stall limit plus a heartbeat (not the suite's
``timeout_s`` nor MMMU's request timeout), the message reads "the server stopped answering
(scheduler pid N in state S (sleeping))", ``cell.json`` records the stall, MMMU's unanswered
questions are not scored as wrong (the suite failed, no accuracy), and the run exits 4 with no
process left.
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
from patchbench.run.ports import free_port

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "configs" / "demo-cpu.yaml"
STALL_S = 5
#: the body of the test-only patch, first lines of Scheduler.handle_generate_request
STALL_CODE = """\
        import os as _pb_os, sys as _pb_sys, time as _pb_time  # test-only stall
        self._pb_seen = getattr(self, "_pb_seen", 0) + 1
        if self._pb_seen >= 6:
            print(f"test stall patch: blocking the scheduler loop (pid {_pb_os.getpid()})")
            _pb_sys.stdout.flush()
            while True:
                _pb_time.sleep(3600)
"""


def _stall_diff(folder: Path) -> Path:
    """A unified diff (paths ``a/sglang/...``) adding STALL_CODE to the installed scheduler."""
    import difflib

    import sglang

    rel = "sglang/srt/managers/scheduler.py"
    src = (Path(sglang.__file__).parent.parent / rel).read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(src) if "def handle_generate_request(" in ln)
    end = next(i for i in range(at, len(src)) if src[i].rstrip().endswith("):"))
    new = src[: end + 1] + STALL_CODE.splitlines(keepends=True) + src[end + 1 :]
    diff = folder / "stall.diff"
    diff.write_text("".join(difflib.unified_diff(src, new, f"a/{rel}", f"b/{rel}")))
    return diff


def _config(folder: Path) -> Path:
    raw = yaml.safe_load(DEMO.read_text())
    raw["name"] = "fault-stall"
    folder.mkdir(parents=True, exist_ok=True)
    raw["variants"] = {"baseline": [{"diff": str(_stall_diff(folder))}]}
    raw["baseline"] = "baseline"
    raw["schedule"] = {"repeats": 2, "order": "interleaved"}
    raw["server"]["stall_timeout_s"] = STALL_S
    serving = dict(raw["suites"]["serving"])
    serving.pop("sweep", None)  # one point: the stall lands in the one bench_serving process
    serving.update({"num_prompts": 64, "output_len": 256, "max_concurrency": 4})
    mmmu = dict(raw["suites"]["mmmu"], concurrency=1, limit=40, rounds="first")
    raw["suites"] = {"mmmu": mmmu, "serving": serving}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fault-stall.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _stall_of(cell_json: Path, since: float, deadline_s: float) -> tuple[dict, float]:
    """Wait until ``cell_json`` says failed; (the record, seconds since the hook's block line)."""
    log = cell_json.parent / "server.log"
    blocked_at = None
    rec: dict = {}
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if (
            blocked_at is None
            and log.exists()
            and "test stall patch: blocking" in log.read_text(errors="replace")
        ):
            blocked_at = time.monotonic()
        if cell_json.exists():
            rec = read_json(cell_json)
            if rec.get("status") == "failed":
                break
        time.sleep(0.1)
    assert blocked_at is not None, f"the patch never blocked the scheduler:\n{log.read_text()}"
    return rec, time.monotonic() - blocked_at


@pytest.mark.timeout(900)
def test_blocked_scheduler_fails_mmmu_and_serving_within_the_stall_limit(tmp_path):
    if not DEMO.is_file():
        pytest.skip(f"{DEMO} not there")
    cfg = _config(tmp_path)
    results = tmp_path / "results"
    out_path = tmp_path / "bench.out"
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    t0 = time.monotonic()
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "runner.py", "bench", str(cfg), "--results", str(results)]
            + ["--port", str(free_port("127.0.0.1"))],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 360
        run_dir = None
        while run_dir is None and time.monotonic() < deadline:
            dirs = [d for d in results.glob("*") if (d / "manifest.json").exists()]
            run_dir = dirs[0] if dirs else None
            assert proc.poll() is None, out_path.read_text()
            time.sleep(0.2)
        assert run_dir is not None, out_path.read_text()
        detect = {}
        for cell, suite in (("rep0", "mmmu"), ("rep1", "serving")):
            rec, took = _stall_of(run_dir / "baseline" / cell / "cell.json", t0, 420)
            detect[suite] = took
            print(f"\n{suite}: blocked scheduler -> cell.json failed in {took:.2f} s")
            assert rec.get("status") == "failed", (rec, out_path.read_text())
            stall = rec["liveness"]["stall"]
            assert stall["role"] == "the sglang scheduler"
            assert stall["state"].startswith("S"), stall
            msg = f"the server stopped answering (scheduler pid {stall['pid']} in state S"
            assert msg in (rec["error"] or ""), rec["error"]
            assert took < STALL_S + 6, took
            summary = read_json(run_dir / "baseline" / cell / suite / "summary.json")
            assert summary["status"] == "failed"
            assert any(msg in e for e in summary["errors"]), summary["errors"]
            if suite == "mmmu":  # unanswered questions are never scored as wrong answers
                assert not (run_dir / "baseline" / cell / suite / "scores.json").exists()
                assert "mmmu_overall_acc" not in (summary.get("metrics") or {})
        rc = proc.wait(timeout=120)
        out = out_path.read_text()
        assert rc == 4, out
        for p in psutil.process_iter(["pid", "environ"]):
            env_p = p.info.get("environ") or {}
            assert env_p.get("PATCHBENCH_RUN_DIR") != str(run_dir.resolve()), p
        print(f"detection {detect}; wall {time.monotonic() - t0:.1f} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
