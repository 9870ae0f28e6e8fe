"""One writer per run folder for the nightly's folder forms (patchbench.nightly.job.
hold_finished_run): ``nightly --record-only`` / ``--from-run`` take the run folder's lock
(patchbench/run/lock.py) and refuse a run that has not ended (its manifest's ``ended_at``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from patchbench import records
from patchbench.cli import main
from patchbench.nightly.history import History
from patchbench.run.lock import acquire
from tests.synthetic import make_throughput_night


def _night(tmp_path):
    return make_throughput_night(
        tmp_path / "runs",
        "20260105T030000Z-nightly-test",
        "2026-01-05T03:00:00Z",
        [100.0, 101.0, 99.0],
        [100.5, 100.0, 99.5],
        name="nightly-test",
    )


def test_record_only_and_from_run_refuse_a_folder_a_run_writes(tmp_path, capsys):
    run = _night(tmp_path)
    h = tmp_path / "h.sqlite"
    # another process (a run) holds the folder's lock
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from patchbench.run.lock import acquire
                acquire({str(run)!r})
                print("held", flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        for form in ("--record-only", "--from-run"):
            assert main(["nightly", form, str(run), "--history", str(h)]) == 4
            err = capsys.readouterr().err
            assert f"run folder busy (exit 4): {run} is being written by another run: pid " in err
            assert "before recording or gating this folder" in err
        assert not h.exists() and not (run / "nightly.md").exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: recorded, and the lock is free again afterwards
    assert main(["nightly", "--record-only", str(run), "--history", str(h)]) == 0
    acquire(run).release()
    with History(h) as hh:
        assert hh.count_nights() == 1


def test_a_run_that_has_not_ended_is_refused(tmp_path, capsys):
    run = _night(tmp_path)
    m = records.read_json(run / "manifest.json")
    m["ended_at"] = None  # a run killed before its end (or still going without its lock)
    records.write_json(run / "manifest.json", m)
    h = tmp_path / "h.sqlite"
    for form in ("--record-only", "--from-run"):
        assert main(["nightly", form, str(run), "--history", str(h)]) == 4
        err = capsys.readouterr().err
        assert f"run not finished (exit 4): {run}: the run has not ended" in err
        assert f"--resume {run}" in err
    assert not h.exists() and not (run / "nightly.md").exists()
    acquire(run).release()  # the refusal released the lock
    (run / "manifest.json").unlink()
    assert main(["nightly", "--record-only", str(run), "--history", str(h)]) == 4
    assert "no manifest.json: not a run folder bench wrote" in capsys.readouterr().err
