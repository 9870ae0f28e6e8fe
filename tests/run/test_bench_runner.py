"""The runner (patchbench.run.bench, patchbench.run.cell) against the fake server and fake suites
(tests/fake_server/fake_suites.py): cell lifecycle, a server dying mid-run, a scheduler dying while
the front end stays up, correctness cells, resume, Ctrl-C, config and environment errors. The
real-server run is in tests/cli/test_e2e_bench.py."""

import importlib.metadata
import os
import textwrap
from pathlib import Path

import psutil
import pytest

import tests.fake_server.fake_suites  # registers the fake suites (and is subclassed below)
from patchbench import cli
from patchbench.config import load_config
from patchbench.errors import (
    ConfigError,
    EnvironmentNotReady,
    Interrupted,
    PatchError,
    RunFailed,
)
from patchbench.records import read_json
from patchbench.run import bench
from patchbench.run.plan import describe_plan
from patchbench.run.ports import port_answers
from patchbench.run.preflight import ensure_model
from patchbench.suite import register as register_suite

SGLANG = importlib.metadata.version("sglang")


def write_config(tmp_path, body: str) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    p = tmp_path / "cfg.yaml"
    p.write_text(textwrap.dedent(body).replace("@MODEL@", str(model)).replace("@SGLANG@", SGLANG))
    return p


BASIC = """\
    name: runner-test
    sglang: "@SGLANG@"
    model: {path: "@MODEL@"}
    server: {port: 31990, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2, flush_pause_s: 0.1}
    variants:
      baseline: []
      control: [null-comment]
    schedule: {repeats: 2}
    suites:
      fake: {n: 2}
"""


def test_run_writes_cells_manifest_and_resume_does_nothing(fake_env, tmp_path):
    cfg = write_config(tmp_path, BASIC)
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    man = read_json(run_dir / "manifest.json")
    assert [(c["variant"], c["repeat"]) for c in man["cells"]] == [
        ("baseline", 0),
        ("control", 0),
        ("control", 1),
        ("baseline", 1),
    ]  # ABBA
    assert all(c["status"] == "ok" for c in man["cells"])
    assert man["sglang_version"] == SGLANG
    assert man["patches"]["control"][0]["name"] == "null-comment"
    assert len(man["patches"]["control"][0]["sha256"]) == 64
    assert man["overlays"]["baseline"]["root"] is None
    assert man["host"]["cpu_usable"] == len(psutil.Process().cpu_affinity())
    for v in ("baseline", "control"):
        for r in (0, 1):
            cell = read_json(run_dir / v / f"rep{r}" / "cell.json")
            assert cell["status"] == "ok"
            # the host's load around the suites: a number of runnable processes, never negative
            assert min(cell["load_avg_1m"]["start"], cell["load_avg_1m"]["end"]) >= 0
            assert read_json(run_dir / v / f"rep{r}" / "fake" / "summary.json")["metrics"] == {
                "requests_count": 2.0
            }
            assert "fake sglang server" in (run_dir / v / f"rep{r}" / "server.log").read_text()
    assert not port_answers("127.0.0.1", 31990)
    # second invocation with --resume: nothing left to do, no server is launched
    before = {p: p.stat().st_mtime_ns for p in run_dir.glob("*/rep*/cell.json")}
    bench.run_bench(cfg, launch_spec=fake_env, resume=run_dir)
    after = {p: p.stat().st_mtime_ns for p in run_dir.glob("*/rep*/cell.json")}
    assert before == after
    assert all(c.get("skipped") for c in read_json(run_dir / "manifest.json")["cells"])
    # a dry run of a resume names what is done and what would run: remove one cell's summary
    (run_dir / "control" / "rep1" / "fake" / "summary.json").unlink()
    plan = describe_plan(load_config(cfg), run_dir)
    assert "baseline#0 (done) control#0 (done) control#1 baseline#1 (done)" in plan
    assert "3 of 4 cells done, 1 to run" in plan
    assert "1 server launches" in plan
    # a changed config is refused, naming what changed
    cfg3 = tmp_path / "three.yaml"
    cfg3.write_text(cfg.read_text().replace("repeats: 2", "repeats: 3"))
    with pytest.raises(ConfigError, match=r"schedule.repeats: 2 there, 3 now"):
        describe_plan(load_config(cfg3), run_dir)


def test_resume_of_a_folder_without_manifest_is_a_usage_error(fake_env, tmp_path, capsys):
    cfg = write_config(tmp_path, BASIC)
    (tmp_path / "empty").mkdir()
    for extra in ([], ["--dry-run"]):
        assert cli.main(["bench", str(cfg), "--resume", str(tmp_path / "empty"), *extra]) == 2
        assert "no manifest.json there" in capsys.readouterr().err
        assert cli.main(["bench", str(cfg), "--resume", str(tmp_path / "nope"), *extra]) == 2
        assert "nope: no such folder" in capsys.readouterr().err
    assert not port_answers("127.0.0.1", 31990)


def test_server_dying_mid_run_fails_that_cell_only_and_resume_reruns_it(fake_env, tmp_path):
    fake_env["control/rep0"] = {"FAKE_DIE_AFTER_GENERATE": "1"}
    cfg = write_config(tmp_path, BASIC)
    with pytest.raises(RunFailed) as ei:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    run_dir = ei.value.run_dir
    cells = {(c["variant"], c["repeat"]): c for c in read_json(run_dir / "manifest.json")["cells"]}
    assert cells[("control", 0)]["status"] == "failed"
    assert [cells[k]["status"] for k in (("baseline", 0), ("control", 1), ("baseline", 1))] == [
        "ok"
    ] * 3
    failed = read_json(run_dir / "control" / "rep0" / "fake" / "summary.json")
    assert failed["status"] == "failed"
    assert "dying mid-run" in "\n".join(failed["errors"])  # the server log's tail
    # the cells after the failure were measured and kept
    assert read_json(run_dir / "baseline" / "rep1" / "fake" / "summary.json")["status"] == "ok"
    fake_env.clear()
    bench.run_bench(cfg, launch_spec=fake_env, resume=run_dir)
    man = read_json(run_dir / "manifest.json")
    rerun = [c for c in man["cells"] if not c.get("skipped")]
    assert [(c["variant"], c["repeat"], c["status"]) for c in rerun] == [("control", 0, "ok")]


def test_a_start_that_fails_counts_as_server_start_up_not_harness_overhead(fake_env, tmp_path):
    """A server that exits before it is ready: the seconds waited are the cell's
    ``server_start`` (the run's harness overhead share leaves them out)."""
    fake_env["control/rep0"] = {"FAKE_HEALTH_503_S": "30", "FAKE_EXIT_AFTER_S": "1.5"}
    cfg = write_config(tmp_path, BASIC)
    with pytest.raises(RunFailed) as ei:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    man = read_json(ei.value.run_dir / "manifest.json")
    failed = next(c for c in man["cells"] if (c["variant"], c["repeat"]) == ("control", 0))
    assert failed["status"] == "failed"
    assert failed["timings_s"]["server_start"] >= 1.0
    assert "to run the failed cells again: " in str(ei.value)
    assert str(ei.value).endswith(f"bench {cfg} --resume {ei.value.run_dir}")


def test_relative_results_and_resume_folders_become_absolute(fake_env, tmp_path, monkeypatch):
    """``--results DIR`` and ``--resume RUN`` given relative to the working directory: the run
    folder is absolute (a suite's client runs in its cell's folder and reads paths in the run:
    the serving sweep's plan.json was not found after a relative ``--resume``)."""
    cfg = write_config(tmp_path, BASIC)
    monkeypatch.chdir(tmp_path)
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root="results")
    assert run_dir.is_absolute() and run_dir.parent == tmp_path / "results"
    (run_dir / "control" / "rep1" / "fake" / "summary.json").unlink()
    again = bench.run_bench(cfg, launch_spec=fake_env, resume=str(run_dir.relative_to(tmp_path)))
    assert again == run_dir


@register_suite
class _SecondFake(tests.fake_server.fake_suites.FakeSuite):
    """A second server suite, so a cell has a boundary between two suites."""

    name = "fake_second"


def test_between_suites_a_flush_the_scheduler_refuses_fails_the_cell_and_no_health_is_sent(
    fake_env, tmp_path
):
    """The flush between two suites is the health check (its 200 is the scheduler's reply):
    a flush refused for the whole budget fails that cell and the suite after it, the
    other cells go on, and a healthy cell sends no /health after its flush (sglang's /health
    sleeps 1 s)."""
    fake_env["control/rep0"] = {"FAKE_FLUSH_400": "-1"}
    body = BASIC.replace("fake: {n: 2}", "fake: {n: 1}\n      fake_second: {n: 1}").replace(
        "repeats: 2", "repeats: 1"
    )
    cfg = write_config(tmp_path, body)
    with pytest.raises(RunFailed) as ei:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    run_dir = ei.value.run_dir
    bad = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert bad["status"] == "failed"
    assert bad["suites"] == {"fake": "ok", "fake_second": "failed"}  # its flush failed
    assert "/flush_cache refused 2 times" in bad["error"]
    good = read_json(run_dir / "baseline" / "rep0" / "cell.json")
    assert good["status"] == "ok" and good["suites"] == {"fake": "ok", "fake_second": "ok"}
    events = [e["event"] for e in good["server"]["events"]]
    assert events.count("flush_cache") == 1
    assert "health" not in events
    assert "flush:fake_second" in good["timings_s"]
    # resumed: only fake_second runs again in that cell; the record keeps the earlier launch's
    # fake (its summary untouched) and says which launch measured what
    first_summary = (run_dir / "control" / "rep0" / "fake" / "summary.json").read_bytes()
    fake_env.clear()
    bench.run_bench(cfg, launch_spec=fake_env, resume=run_dir)
    again = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert again["status"] == "ok"
    assert again["suites"] == {"fake": "ok", "fake_second": "ok"}
    assert (run_dir / "control" / "rep0" / "fake" / "summary.json").read_bytes() == first_summary
    note = next(n for n in again["notes"] if n.startswith("resumed:"))
    assert f"fake kept from an earlier launch (started {bad['started_at']}" in note
    assert note.endswith("this launch ran fake_second")
    assert f"earlier launch's server: pid {bad['server']['pid']}" in again["notes"]


def test_a_port_busy_before_the_run_stops_it_before_any_cell(fake_env, tmp_path):
    """Something already listens on server.port: exit 3 naming the port and the holder, and
    no run folder (every cell would otherwise fail on it one by one)."""
    import socket

    from patchbench.errors import EnvironmentNotReady

    cfg = write_config(tmp_path, BASIC)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 31990))
        s.listen()
        with pytest.raises(EnvironmentNotReady, match=r"port 31990 on 127.0.0.1 already answers"):
            bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_an_ab_run_resumes_from_its_own_folder_after_another_ab(
    fake_cli_env, tmp_path, monkeypatch, capsys
):
    """``ab`` builds its config in memory and writes no shared file a later ``ab`` could
    overwrite: an interrupted ab run prints ``bench --resume RUN`` (no CONFIG: its manifest holds
    the config); after another ab with other server arguments (a dry run, then a run), that
    command, as printed, finishes the first run with its own arguments."""
    import shlex

    cfg = write_config(tmp_path, BASIC)
    results = tmp_path / "results"
    ab = ["ab", "--config", str(cfg), "--results", str(results), "--args-b"]
    monkeypatch.setenv("FAKE_SUITE_INTERRUPT", "B/1")
    assert cli.main([*ab, "--disable-overlap-schedule"]) == 130
    err = capsys.readouterr().err
    [run_dir] = results.iterdir()
    assert f"resume with `{bench.PROG} bench --resume {run_dir}`" in err
    monkeypatch.delenv("FAKE_SUITE_INTERRUPT")
    assert cli.main([*ab, "--enable-mixed-chunk", "--dry-run"]) == 0
    assert cli.main([*ab, "--enable-mixed-chunk"]) == 0
    assert len(list(results.iterdir())) == 2  # a folder of its own

    fake_cli_env.seen.clear()
    printed = err.split("resume with `")[1].split("`")[0]
    assert cli.main(shlex.split(printed.removeprefix(f"{bench.PROG} "))) == 0
    args = {k: s.args for k, s in fake_cli_env.seen.items()}
    assert sorted(args) == ["A/rep1", "B/rep1"]
    assert "--disable-overlap-schedule" in args["B/rep1"]
    assert "--enable-mixed-chunk" not in args["B/rep1"] + args["A/rep1"]
    assert "--disable-overlap-schedule" not in args["A/rep1"]
    man = read_json(run_dir / "manifest.json")
    assert [c["status"] for c in man["cells"]] == ["ok"] * 4 and man["config_path"] is None


@pytest.mark.parametrize("when", ["after the checks", "after the first cell"])
def test_a_port_taken_during_the_run_stops_it_after_that_cell_with_one_message(
    fake_env, tmp_path, monkeypatch, when
):
    """Another process starts listening on server.port after the checks before any server
    started, or once the first cell has finished: the next cell fails on it and the run stops
    there (exit 4, one error naming the port, its holder and --port); the finished cell is
    kept, no other cell is started and the partial run's report is written."""
    import socket

    from patchbench.run import preflight

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def take_port():
        if listener.getsockname()[1] != 31990:  # once
            listener.bind(("127.0.0.1", 31990))
            listener.listen()

    if when == "after the checks":
        checked = preflight.port_free_or_raise
        monkeypatch.setattr(
            preflight, "port_free_or_raise", lambda h, p: (checked(h, p), take_port())
        )
    else:
        real = bench.run_cell

        def run_then_take(*a, **kw):
            rec = real(*a, **kw)
            take_port()
            return rec

        monkeypatch.setattr(bench, "run_cell", run_then_take)
    cfg = write_config(tmp_path, BASIC)
    with listener, pytest.raises(RunFailed) as ei:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    msg, run_dir = str(ei.value), ei.value.run_dir
    assert ei.value.exit_code == 4
    stopped = "baseline/rep0" if when == "after the checks" else "control/rep0"
    assert msg.startswith(
        f"port 31990 on 127.0.0.1 is taken by another process: pid {os.getpid()} "
    )
    assert f"the run stopped after cell {stopped} (finished cells are kept in {run_dir})" in msg
    assert f"resume with `{bench.PROG} bench {cfg} --resume {run_dir}`" in msg
    assert "resume on another port (--port N, or server.port in the config)" in msg
    assert list(fake_env.seen) == (
        ["baseline/rep0"] if stopped == "baseline/rep0" else ["baseline/rep0", "control/rep0"]
    )
    cells = read_json(run_dir / "manifest.json")["cells"]
    want = (
        [("baseline/rep0", "failed")]
        if stopped == "baseline/rep0"
        else [("baseline/rep0", "ok"), ("control/rep0", "failed")]
    )
    assert [(f"{c['variant']}/rep{c['repeat']}", c["status"]) for c in cells] == want
    assert (
        "something already answers on 127.0.0.1:31990"
        in read_json(run_dir / stopped / "cell.json")["error"]
    )
    assert (run_dir / "report.md").is_file()


def test_ctrl_c_stops_server_and_keeps_finished_cells(fake_env, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SUITE_INTERRUPT", "control/1")
    cfg = write_config(tmp_path, BASIC)
    with pytest.raises(Interrupted) as ei:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    assert ei.value.signum == 2 and ei.value.exit_code == 130
    assert "--resume" in str(ei.value)
    run_dir = next((tmp_path / "results").iterdir())
    assert not port_answers("127.0.0.1", 31990)
    man = read_json(run_dir / "manifest.json")
    assert man["interrupted"] is True
    assert [c["status"] for c in man["cells"]] == ["ok", "ok"]
    rec = read_json(run_dir / "control" / "rep1" / "cell.json")
    assert rec["status"] == "interrupted" and rec["error"] == "interrupted by SIGINT"
    assert read_json(run_dir / "baseline" / "rep0" / "fake" / "summary.json")["status"] == "ok"


def test_the_printed_resume_command_keeps_the_port_and_resumes_as_printed(
    fake_cli_env, tmp_path, monkeypatch, capsys
):
    """``bench CONFIG --port N --results DIR``, interrupted: the command it prints names
    ``--port N`` (``--results`` is the run folder's parent); the CLI's own parser reads it back,
    and run as printed it finishes the run on port N. The partial run's report prints the same
    command (``patchbench`` for the interpreter)."""
    import shlex

    from patchbench.run.ports import free_port

    port = free_port()
    monkeypatch.setenv("FAKE_SUITE_INTERRUPT", "control/1")
    cfg = write_config(tmp_path, BASIC)
    results = tmp_path / "results"
    assert cli.main(["bench", str(cfg), "--port", str(port), "--results", str(results)]) == 130
    err = capsys.readouterr().err
    [run_dir] = results.iterdir()
    want = f"bench {cfg} --resume {run_dir} --port {port}"
    assert f"resume with `{bench.PROG} {want}`" in err
    assert read_json(run_dir / "manifest.json")["port"] == port
    assert cli.main(["report", str(run_dir), "--no-plots"]) == 0
    assert f"\n`patchbench {want}`\n" in (run_dir / "report.md").read_text()

    monkeypatch.delenv("FAKE_SUITE_INTERRUPT")
    fake_cli_env.seen.clear()
    printed = err.split("resume with `")[1].split("`")[0]
    argv = shlex.split(printed.removeprefix(f"{bench.PROG} "))
    args = cli.build_parser().parse_args(argv)
    assert (args.config, args.resume, args.port) == (str(cfg), str(run_dir), port)
    assert cli.main(argv) == 0
    assert {k: s.port for k, s in fake_cli_env.seen.items()} == {
        "control/rep1": port,
        "baseline/rep1": port,
    }
    man = read_json(run_dir / "manifest.json")
    assert [c["status"] for c in man["cells"]] == ["ok"] * 4 and man["port"] == port
    assert not port_answers("127.0.0.1", port)


def test_patch_that_does_not_apply_stops_before_any_server(fake_env, tmp_path, monkeypatch):
    from patchbench.patches import overlay

    def boom(*a, **k):
        raise PatchError(
            "patch 'null-comment': sglang/srt/model_executor/forward_batch_info.py: "
            "hunk @@ -1,3 +1,4 @@ failed"
        )

    monkeypatch.setattr(overlay, "build_overlay", boom)
    cfg = write_config(tmp_path, BASIC)
    with pytest.raises(
        PatchError, match="variant 'baseline'.*null-comment.*forward_batch_info.py.*hunk"
    ):
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    assert not (tmp_path / "results").exists()


def test_wrong_sglang_pin_is_environment_error(fake_env, tmp_path):
    # no patch: a patch without a diff for 0.4.0 is a config error (exit 2) before this check
    cfg = write_config(tmp_path, BASIC.replace("@SGLANG@", "0.4.0").replace("[null-comment]", "[]"))
    with pytest.raises(
        EnvironmentNotReady,
        match=f"sglang 0.4.0: no environment .*have: .*sglang {SGLANG}.*make setup SGLANG=0.4.0",
    ):
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    assert cli.main(["bench", str(cfg)]) == 3


def test_dry_run_prints_plan_and_launches_nothing(fake_env, tmp_path, capsys):
    cfg = write_config(tmp_path, BASIC)
    assert cli.main(["bench", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "baseline#0 control#0 control#1 baseline#1" in out
    assert "control                  patches: null-comment" in out
    assert "sglang.launch_server" in out
    assert not port_answers("127.0.0.1", 31990)


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            BASIC.replace(
                "    schedule: {repeats: 2}\n", "    schedule: {repeats: 2, order: zigzag}\n"
            ),
            r"cfg.yaml:\d+: key 'schedule.order': Input should be 'interleaved', 'sequential' or 'randomized'",
        ),
        (
            BASIC.replace("    schedule: {repeats: 2}\n", "    schedule: {repeats: two}\n"),
            r"cfg.yaml:\d+: key 'schedule.repeats': Input should be a valid integer",
        ),
        (
            BASIC.replace("    schedule: {repeats: 2}\n", "    schedul: {repeats: 2}\n"),
            r"cfg.yaml:\d+: unknown key 'schedul'; allowed keys: name, sglang, model, server, variants",
        ),
        (
            BASIC.replace("control: [null-comment]", "control: [no-such-patch]"),
            r"cfg.yaml:\d+: variants.control.patches\[0\]: patch 'no-such-patch' not found .*available: .*null-comment",
        ),
        (
            BASIC.replace("fake: {n: 2}", "fake: {n: 2, m: 1}"),
            r"unknown key 'suites.fake.m'; allowed keys: n, rounds$",
        ),
        (
            BASIC.replace("fake: {n: 2}", "nosuch: {}"),
            r"cfg.yaml:\d+: unknown suite 'nosuch' under suites; allowed: .*mmmu",
        ),
        (BASIC.replace('    model: {path: "@MODEL@"}\n', ""), r"missing required key 'model'"),
    ],
)
def test_config_errors_name_file_key_line_and_allowed(fake_env, tmp_path, body, expected):
    cfg = write_config(tmp_path, body)
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    import re

    assert re.search(expected, str(ei.value)), str(ei.value)
    assert cli.main(["bench", str(cfg)]) == 2


def _model_cfg(tmp_path, model_yaml: str):
    p = tmp_path / "m.yaml"
    p.write_text(BASIC.replace('model: {path: "@MODEL@"}', model_yaml).replace("@SGLANG@", SGLANG))
    return load_config(p)


def test_tiny_model_missing_is_built_where_the_config_says(fake_env, tmp_path, monkeypatch):
    """A clean clone has no .cache/models: `tiny: true` must build it (CI failed on this once)."""
    import patchbench.envs.tinymodel as tm

    built = []
    monkeypatch.setattr(tm, "build_tiny_qwen25vl", lambda d: built.append(Path(d)) or Path(d))
    cfg = _model_cfg(tmp_path, f"model: {{path: {tmp_path / 'models' / 'tiny'}, tiny: true}}")
    assert ensure_model(cfg, log=print) == tmp_path / "models" / "tiny"
    assert built == [tmp_path / "models" / "tiny"]


def test_hub_id_is_passed_through_and_missing_local_path_is_an_error(fake_env, tmp_path):
    cfg = _model_cfg(tmp_path, "model: {path: Qwen/Qwen2.5-VL-3B-Instruct}")
    ensure_model(cfg, log=print)  # no error: sglang finds a hub id in the HF cache
    assert cfg.model_ref == "Qwen/Qwen2.5-VL-3B-Instruct"
    cfg = _model_cfg(tmp_path, "model: {path: ./no-such-model}")
    with pytest.raises(EnvironmentNotReady, match=r"model.path .*no-such-model does not exist"):
        ensure_model(cfg, log=print)


def test_overhead_share_and_breakdown_by_hand():
    """Two cells ran, one was skipped on resume: 100 s total, 80 s inside start-up and suites."""
    from patchbench.run.bench import overhead_breakdown, overhead_share
    from patchbench.runfolder.models import ManifestCell, RunTimings

    records = [
        ManifestCell(
            variant="a",
            timings_s={
                "server_start": 20.0,
                "suite:mmmu": 10.0,
                "flush:serving": 0.5,
                "suite:serving": 10.0,
                "server_stop": 4.0,
            },
        ),
        ManifestCell(
            variant="b",
            timings_s={
                "server_start": 20.0,
                "suite:mmmu": 10.0,
                "suite:serving": 10.0,
                "server_stop": 1.5,
            },
        ),
        ManifestCell(
            variant="a", timings_s={"server_start": 99.0, "server_stop": 99.0}, skipped=True
        ),
    ]
    timings = RunTimings(setup=2.0, report=1.0, total=100.0)
    assert overhead_share(records, timings) == 0.2
    assert overhead_breakdown(records, timings).model_dump() == {
        "python_start": 0.0,
        "setup": 2.0,
        "server_stop": 5.5,
        "flush": 0.5,
        "report": 1.0,
        "other": 11.0,
    }
    # run from the command line: 1.5 s of interpreter start-up and imports, inside the total
    timings.python_start = 1.5
    got = overhead_breakdown(records, timings)
    assert got.python_start == 1.5 and got.other == 9.5  # 100 - 80 - 5.5 - 0.5 - 2 - 1 - 1.5


def test_scheduler_death_fails_the_cell_within_seconds_and_the_run_goes_on(fake_env, tmp_path):
    """control/rep0's scheduler is SIGKILLed while the suite waits on /generate (the fake front
    end then hangs every request, as sglang's does). The cell fails within seconds naming the
    scheduler and its pid; the other cells run; nothing of that server is left."""
    import signal
    import threading
    import time

    import psutil

    fake_env["control/rep0"] = {"FAKE_SCHEDULER": "1", "FAKE_GENERATE_SLEEP_S": "1"}
    cfg = write_config(tmp_path, BASIC.replace("fake: {n: 2}", "fake: {n: 3}"))
    killed = {}

    def killer():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # this test's own servers only (other pytest-xdist workers run fake servers too)
            for p in psutil.Process().children(recursive=True):
                try:
                    cmdline = " ".join(p.cmdline())
                except psutil.Error:
                    continue
                if "sglang::scheduler_TP0" in cmdline:
                    time.sleep(1.5)  # inside the suite's first (1 s) requests
                    killed["pid"], killed["t"] = p.pid, time.monotonic()
                    os.kill(p.pid, signal.SIGKILL)
                    return
            time.sleep(0.05)

    threading.Thread(target=killer, daemon=True).start()
    with pytest.raises(RunFailed) as ei:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    run_dir = ei.value.run_dir
    rec = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert rec["status"] == "failed"
    assert f"the sglang scheduler (pid {killed['pid']}) died" in rec["error"]
    assert "fake: scheduler pid" in rec["error"]  # the log's tail
    summary = read_json(run_dir / "control" / "rep0" / "fake" / "summary.json")
    assert summary["status"] == "failed"
    assert f"the sglang scheduler (pid {killed['pid']}) died" in summary["errors"][0]
    assert rec["liveness"]["death"]["pid"] == killed["pid"]
    assert rec["liveness"]["death"]["detected_after_s"] > 0
    # the suite ended at once: well under one request's wait, not the 600 s request timeout
    assert rec["timings_s"]["suite:fake"] < 1.5 + 3.0
    assert (
        not psutil.pid_exists(rec["server"]["pid"])
        or psutil.Process(rec["server"]["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    cells = {
        (c["variant"], c["repeat"]): c["status"]
        for c in read_json(run_dir / "manifest.json")["cells"]
    }
    assert cells == {
        ("baseline", 0): "ok",
        ("control", 0): "failed",
        ("control", 1): "ok",
        ("baseline", 1): "ok",
    }


def test_instrumented_or_untimed_suites_get_one_correctness_cell_per_variant(fake_env, tmp_path):
    cfg = write_config(
        tmp_path,
        BASIC.replace("schedule: {repeats: 2}", "schedule: {repeats: 1}").replace(
            "fake: {n: 2}", "fake: {n: 1}\n      fake_instr: {}\n      fake_untimed: {}"
        ),
    )
    plan = describe_plan(load_config(cfg))
    assert "correctness baseline#correctness control#correctness" in plan
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    man = read_json(run_dir / "manifest.json")
    assert [(c["variant"], c["cell_kind"], c["instrumented"]) for c in man["cells"]] == [
        ("baseline", "correctness", True),
        ("control", "correctness", True),
        ("baseline", "timed", False),
        ("control", "timed", False),
    ]
    corr = read_json(run_dir / "control" / "correctness" / "cell.json")
    assert corr["cell_kind"] == "correctness" and corr["instrumented"] is True
    # only the instrumented and untimed suites (they talk to the server themselves)
    assert set(corr["suites"]) == {"fake_instr", "fake_untimed"}
    assert corr["instrumentation"] == {"fake_instr": {"files_count": 0}}
    # a suite that does not run in the correctness cell leaves no (empty) folder there
    assert not (run_dir / "control" / "correctness" / "fake").exists()
    timed = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert timed["cell_kind"] == "timed" and timed["instrumented"] is False
    assert set(timed["suites"]) == {"fake", "fake_instr"}  # the untimed suite never runs here
    assert timed["instrumentation"] == {}


def test_a_correctness_cell_whose_suites_send_no_traffic_also_runs_the_server_suites(
    fake_env, tmp_path
):
    """An instrumented suite that needs no server (like sync_probe's cross-check) would leave the
    instrumented server idle: the correctness cell then runs the timed server suites too."""
    cfg = write_config(
        tmp_path,
        BASIC.replace("schedule: {repeats: 2}", "schedule: {repeats: 1}").replace(
            "fake: {n: 2}", "fake: {n: 1}\n      fake_instr_offline: {}"
        ),
    )
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    corr = read_json(run_dir / "control" / "correctness" / "cell.json")
    assert set(corr["suites"]) == {"fake", "fake_instr_offline"}


def test_an_incomplete_timed_cell_and_a_failed_report_exit_4(fake_env, tmp_path, monkeypatch):
    """Exit codes that tell the truth: a timed cell whose suite ends incomplete (its measurement
    invalid) and a report that cannot be written each make the run fail (exit 4), with what
    finished kept."""
    cfg = write_config(tmp_path, BASIC.replace("repeats: 2", "repeats: 1"))
    monkeypatch.setenv("FAKE_SUITE_INCOMPLETE", "control/0")
    with pytest.raises(RunFailed) as ei:
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    assert ei.value.exit_code == 4
    assert "1 timed cell(s) incomplete (control/rep0)" in str(ei.value)
    assert "cells failed" not in str(ei.value)
    report = (ei.value.run_dir / "report.md").read_text()
    assert "## Failed and incomplete cells" in report
    assert "| control/rep0 | incomplete | fake: fake: the measurement is invalid |" in report
    monkeypatch.delenv("FAKE_SUITE_INCOMPLETE")

    import patchbench.report

    def broken(run_dir):
        raise RuntimeError("plots broke")

    monkeypatch.setattr(patchbench.report, "render_run", broken)
    with pytest.raises(RunFailed, match=r"the report could not be written \(RuntimeError: plots"):
        bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results2")


def test_resume_after_an_edited_diff_is_refused_unless_the_variant_starts_over(fake_env, tmp_path):
    """A `{diff: FILE}` edited between the run and its resume: the variant's repeats would run
    two versions, so the resume is refused naming the variant and what changed; with
    --restart-variant the variant's cells run again with the new diff."""
    import shutil

    from patchbench.inputs import PATCHES_DIR

    diff = tmp_path / "change.diff"
    shutil.copy(PATCHES_DIR / "null-comment" / f"{SGLANG}.diff", diff)
    body = BASIC.replace("repeats: 2", "repeats: 1").replace(
        "control: [null-comment]", f"control: [{{diff: {diff}}}]"
    )
    cfg = write_config(tmp_path, body)
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    ident = read_json(run_dir / "control" / "rep0" / "cell.json")["variant_identity"]
    assert set(ident) == {"patches", "server_args", "env", "sglang"}
    (run_dir / "control" / "rep0" / "fake" / "summary.json").unlink()  # one cell to run again
    diff.write_text(diff.read_text().replace("is the only change.", "is the only change (v2)."))
    with pytest.raises(ConfigError, match=r"variant control: patches differ from what rep0 ran"):
        bench.run_bench(cfg, launch_spec=fake_env, resume=run_dir)
    assert not port_answers("127.0.0.1", 31990)  # refused before any server
    with pytest.raises(ConfigError, match="not a variant"):
        bench.run_bench(cfg, launch_spec=fake_env, resume=run_dir, restart_variants=["nope"])
    bench.run_bench(cfg, launch_spec=fake_env, resume=run_dir, restart_variants=["control"])
    again = read_json(run_dir / "control" / "rep0" / "cell.json")
    assert again["status"] == "ok" and again["variant_identity"]["patches"] != ident["patches"]
    assert len(list((run_dir / ".restarted").iterdir())) == 1
    base = read_json(run_dir / "baseline" / "rep0" / "cell.json")
    assert base["variant_identity"]["patches"] != again["variant_identity"]["patches"]
