"""One writer, always (patchbench.run.bench, patchbench.run.lock, patchbench.run.preflight):
a run whose folder is deleted under it stops (exit 4) instead of making it again, and a resumed
run stops the servers its killed predecessor left, only those its markers name. Fake server
(tests/fake_server), port 31931."""

from __future__ import annotations

import os
import shutil

import pytest

import tests.fake_server.fake_suites  # registers the fake suites (and is subclassed below)
from patchbench.errors import exit_code_of
from patchbench.run import bench
from patchbench.run.lock import RunFolderGone
from patchbench.run.ports import (
    MARKER_CELL,
    MARKER_RUN_DIR,
    MARKER_RUNNER_PID,
    MARKER_RUNNER_START,
    alive,
    port_answers,
)
from patchbench.suite import register
from tests.run.test_bench_runner import write_config
from tests.run.test_liveness import _server as start_fake_server

PORT = 31931
CONFIG = f"""\
    name: one-writer
    sglang: "@SGLANG@"
    model: {{path: "@MODEL@"}}
    server: {{port: {PORT}, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2, flush_pause_s: 0.1}}
    variants:
      baseline: []
      control: [null-comment]
    schedule: {{repeats: 2}}
    suites:
      @SUITE@: {{n: 1}}
"""


@register
class _DeletesItsRunFolder(tests.fake_server.fake_suites.FakeSuite):
    """``fake``, but in cell control/0 it deletes the whole run folder first (someone's
    ``rm -rf`` while the run writes it)."""

    name = "fake_rm_run"

    def run(self, ctx, params):
        if (ctx.variant, ctx.repeat) == ("control", 0):
            shutil.rmtree(ctx.run_dir)
        return super().run(ctx, params)


def test_a_run_folder_deleted_under_the_run_stops_it_and_is_not_made_again(fake_env, tmp_path):
    cfg = write_config(tmp_path, CONFIG.replace("@SUITE@", "fake_rm_run"))
    results = tmp_path / "results"
    lines: list[str] = []
    with pytest.raises(RunFolderGone) as e:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=results, log=lines.append)
    assert exit_code_of(e.value) == 4 and e.value.kind == "run folder gone"
    run = e.value.run_dir
    assert str(e.value).startswith(f"{run} was deleted while this run wrote it")
    assert str(e.value).endswith("the run stopped here (its server was stopped); start a new run")
    assert not port_answers("127.0.0.1", PORT)  # its server stopped
    # nothing after the deletion: no manifest, no cell.json, no later cell; at most the file the
    # suite itself was writing when the folder went (its own write made the folder again)
    left = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
    assert left in ([], ["control/rep0/fake_rm_run/records.json"])
    assert not any("control/rep1" in ln or "baseline/rep1" in ln for ln in lines), lines


def test_a_resume_stops_the_servers_its_killed_predecessor_left(fake_env, tmp_path):
    cfg = write_config(tmp_path, CONFIG.replace("@SUITE@", "fake"))
    run = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    # two orphans: one of this run folder, one of another run (both runners gone: the pid is
    # this test's, the start time another's)
    dead_runner = {MARKER_RUNNER_PID: str(os.getpid()), MARKER_RUNNER_START: "12345.0"}
    ours = start_fake_server(
        tmp_path / "a", **{MARKER_RUN_DIR: str(run), MARKER_CELL: "baseline/rep1"}, **dead_runner
    )
    other_run = tmp_path / "results" / "20260101T000000Z-other"
    theirs = start_fake_server(
        tmp_path / "b", **{MARKER_RUN_DIR: str(other_run), MARKER_CELL: "x/rep0"}, **dead_runner
    )
    try:
        lines: list[str] = []
        assert bench.run_bench(cfg, launch_spec=fake_env, resume=run, log=lines.append) == run
        assert any(
            ln.startswith(f"stopped server pid {ours.pid} (cell baseline/rep1, port ")
            and ln.endswith("that the killed run before this one left running")
            for ln in lines
        ), lines
        assert ours.proc.wait(timeout=10) is not None and not alive(ours.pid)
        assert theirs.proc.poll() is None  # another run's server: named only, never stopped
        assert any(f"orphaned sglang server pid {theirs.pid}" in ln for ln in lines)
    finally:
        ours.stop()
        theirs.stop()
