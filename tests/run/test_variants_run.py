"""Variants as mappings in the run (patchbench.run.bench, patchbench.run.cell, patchbench.run.variants) on the
fake server: per-variant server arguments and environment reach the launch and nothing else
changes, the manifest records what each variant changes, the report header shows it, a diff named
directly is copied into the run folder, harness-owned arguments are refused per variant, and the
instrumentation's server arguments and hook files are added to correctness cells only (conflicts
refused)."""

import importlib.metadata
import shutil
from pathlib import Path

import pytest

import tests.fake_server.fake_suites  # noqa: F401 - registers the fake suites
from patchbench import cli
from patchbench.config import load_config
from patchbench.errors import ConfigError, EnvironmentNotReady
from patchbench.inputs import sha256_file
from patchbench.records import read_json
from patchbench.run import bench
from patchbench.run.plan import describe_plan, instrumentation_args
from patchbench.shims import HOOKS_ENV
from patchbench.suite import Instrumentation, Suite, SuiteResult, register
from tests.fake_server.fake_suites import InstrParams
from tests.run.test_bench_runner import write_config

FAKE = Path(__file__).parent.parent / "fake_server"
SGLANG = importlib.metadata.version("sglang")
REPO = Path(__file__).resolve().parents[2]


@register
class FakeArgsSuite(Suite):
    """A timed suite whose instrumentation needs a server argument (like the profiler's
    --disable-overlap-schedule) and has no output folder and nothing to collect."""

    name = "fake_args"
    Params = InstrParams
    metrics = {}

    def run(self, ctx, params):
        return SuiteResult(metrics={})

    def instrumentation(self, ctx, params):
        return Instrumentation(
            env={"FAKE_ARGS_INSTR": "1", "FAKE_HOOK_LOG": str(Path(ctx.run_dir) / "hook.log")},
            hooks=[FAKE / "fake_hook.py"],
            out_dir=None,
            collect=None,
            server_args=["--disable-overlap-schedule", "--chunked-prefill-size=64"],
        )


BASE = """\
    name: variants-test
    sglang: "@SGLANG@"
    model: {path: "@MODEL@"}
    server: {port: 31994, args: [--log-level=info], env: {FAKE_COMMON: "1"}, ready_timeout_s: 30,
             stop_grace_s: 3, flush_retries: 2, flush_pause_s: 0.1}
    variants:
      baseline: []
      no-overlap:
        server_args: [--disable-overlap-schedule]
        env: {SGLANG_FAKE_FLAG: "1"}
    schedule: {repeats: 1}
    suites:
      fake: {n: 1}
"""


def test_server_args_only_variant_differs_exactly_there_and_is_reported(fake_env, tmp_path):
    cfg = write_config(tmp_path, BASE)
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    base = read_json(run_dir / "baseline" / "rep0" / "cell.json")["server"]["command"]
    var = read_json(run_dir / "no-overlap" / "rep0" / "cell.json")["server"]["command"]
    assert var == base + ["--disable-overlap-schedule"]
    assert base[-1] == "--log-level=info"
    b_env, v_env = fake_env.seen["baseline/rep0"].env, fake_env.seen["no-overlap/rep0"].env
    assert v_env["SGLANG_FAKE_FLAG"] == "1" and "SGLANG_FAKE_FLAG" not in b_env
    assert b_env["FAKE_COMMON"] == v_env["FAKE_COMMON"] == "1"
    changed = {k for k in set(b_env) | set(v_env) if b_env.get(k) != v_env.get(k)}
    # besides the variant's own variable only the harness's per-cell markers differ
    assert changed - {"SGLANG_FAKE_FLAG"} <= {"PATCHBENCH_CELL"}
    man = read_json(run_dir / "manifest.json")
    assert man["variants"]["no-overlap"]["aa"] is False
    assert man["variants"]["no-overlap"]["server_args"] == {
        "added": ["--disable-overlap-schedule"],
        "removed": [],
        "changed": {},
    }
    assert man["variants"]["no-overlap"]["env"]["added"] == {"SGLANG_FAKE_FLAG": "1"}
    assert man["variants"]["no-overlap"]["patches"] == []
    assert man["config"]["variants"]["no-overlap"] == {
        "patches": [],
        "server_args": ["--disable-overlap-schedule"],
        "env": {"SGLANG_FAKE_FLAG": "1"},
    }
    assert read_json(run_dir / "compare.json")["aa_variants"] == []
    line = next(
        x
        for x in (run_dir / "report.md").read_text().splitlines()
        if x.startswith("| variant `no-overlap`")
    )
    assert "(A/A)" not in line


def test_report_header_shows_a_variants_server_args_and_env(fake_env, tmp_path):
    cfg = write_config(tmp_path, BASE)
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    line = next(
        x
        for x in (run_dir / "report.md").read_text().splitlines()
        if x.startswith("| variant `no-overlap`")
    )
    assert "`--disable-overlap-schedule`" in line and "`SGLANG_FAKE_FLAG=1`" in line


def test_dry_run_shows_each_variants_patches_args_and_env(fake_cli_env, tmp_path, capsys):
    cfg = write_config(tmp_path, BASE)
    assert cli.main(["bench", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "  no-overlap               patches: (stock)\n" in out
    assert "                           server args: --disable-overlap-schedule\n" in out
    assert "                           env: SGLANG_FAKE_FLAG=1\n" in out
    assert (
        "server     no-overlap: python -m sglang.launch_server --model-path "
        f"{tmp_path / 'model'} --host 127.0.0.1 --port 31994 --enable-metrics --log-level=info "
        "--disable-overlap-schedule\n"
    ) in out
    assert fake_cli_env.seen == {}


@pytest.mark.parametrize("arg", ["--port", "--port=31000", "--po"])
def test_per_variant_port_is_refused_naming_the_variant(fake_cli_env, tmp_path, capsys, arg):
    body = BASE.replace(
        "server_args: [--disable-overlap-schedule]",
        f"server_args: [--disable-overlap-schedule, {arg}, '31000']"
        if "=" not in arg
        else f"server_args: [{arg}]",
    )
    cfg = write_config(tmp_path, body)
    msg = r"key 'variants\.no-overlap\.server_args': server_args\[\d\]: '--po.*set by the harness"
    with pytest.raises(ConfigError, match=msg):
        load_config(cfg)
    assert cli.main(["bench", str(cfg)]) == 2
    assert "variants.no-overlap.server_args" in capsys.readouterr().err
    assert fake_cli_env.seen == {}


def test_diff_named_directly_is_copied_into_the_run_folder(fake_env, tmp_path):
    diff = tmp_path / "my-change.diff"
    shutil.copy(REPO / "patches" / "null-comment" / f"{SGLANG}.diff", diff)
    body = BASE.replace(
        "      no-overlap:\n        server_args: [--disable-overlap-schedule]\n"
        '        env: {SGLANG_FAKE_FLAG: "1"}\n',
        f"      mine:\n        patches: [{{diff: {diff}}}]\n",
    )
    cfg = write_config(tmp_path, body)
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    man = read_json(run_dir / "manifest.json")
    rel = f"diffs/{sha256_file(diff)[:12]}-my-change.diff"
    assert man["copied_files"] == [{"source": str(diff), "path": rel}]
    assert (run_dir / rel).read_bytes() == diff.read_bytes()
    assert man["variants"]["mine"]["patches"] == [
        {"name": f"diff:{diff}", "kind": "diff", "path": str(diff), "sha256": sha256_file(diff)}
    ]
    assert [p["name"] for p in man["patches"]["mine"]] == [f"diff:{diff}"]
    assert len(man["patches"]["mine"][0]["sha256"]) == 64
    # the overlay's forward_batch_info is the null-comment one: same file as the named patch's
    assert (
        man["overlays"]["mine"]["fbi_sha256"]
        == "17835e509810649ab81f56b48deaed02846fe3f3a5c50aece6b66b12b7e0ada6"
    )


def test_missing_local_model_is_exit_3_before_any_launch(fake_cli_env, tmp_path, capsys):
    cfg = write_config(tmp_path, BASE.replace('path: "@MODEL@"', f'path: "{tmp_path}/nope"'))
    with pytest.raises(EnvironmentNotReady, match=r"model.path .*nope does not exist"):
        bench.run_bench(cfg, launch_spec=fake_cli_env, results_root=tmp_path / "results")
    assert cli.main(["bench", str(cfg)]) == 3
    assert fake_cli_env.seen == {} and not (tmp_path / "results").exists()


def test_instrumentation_server_args_go_to_correctness_cells_only(fake_env, tmp_path):
    body = BASE.replace("fake: {n: 1}", "fake: {n: 1}\n      fake_args: {}")
    cfg = write_config(tmp_path, body)
    plan = describe_plan(load_config(cfg))
    assert ("correctness cell adds: --chunked-prefill-size=64 (instrumentation)") in plan
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    cmd = {
        k: read_json(run_dir / k / "cell.json")["server"]["command"]
        for k in (
            "baseline/correctness",
            "baseline/rep0",
            "no-overlap/correctness",
            "no-overlap/rep0",
        )
    }
    # baseline: both added once; no-overlap has the switch already: only the other one added
    assert cmd["baseline/correctness"] == cmd["baseline/rep0"] + [
        "--disable-overlap-schedule",
        "--chunked-prefill-size=64",
    ]
    assert cmd["no-overlap/correctness"] == cmd["no-overlap/rep0"] + ["--chunked-prefill-size=64"]
    assert cmd["no-overlap/correctness"].count("--disable-overlap-schedule") == 1
    corr = read_json(run_dir / "baseline" / "correctness" / "cell.json")
    assert corr["instrumented"] is True and corr["instrumentation"] == {}  # nothing to collect
    assert corr["instrumentation_args"] == [
        "--disable-overlap-schedule",
        "--chunked-prefill-size=64",
    ]
    assert fake_env.seen["baseline/correctness"].env["FAKE_ARGS_INSTR"] == "1"
    assert "FAKE_ARGS_INSTR" not in fake_env.seen["baseline/rep0"].env
    # the hook file is imported by the correctness cells' servers (the site hook), never by a
    # timed cell's server nor by any other process of the run
    assert fake_env.seen["baseline/correctness"].env[HOOKS_ENV] == str(FAKE / "fake_hook.py")
    assert all(HOOKS_ENV not in fake_env.seen[k].env for k in ("baseline/rep0", "no-overlap/rep0"))
    pids = {
        read_json(run_dir / k / "cell.json")["server"]["pid"]
        for k in ("baseline/correctness", "no-overlap/correctness")
    }
    assert set(map(int, (run_dir / "hook.log").read_text().split())) == pids
    timed = read_json(run_dir / "baseline" / "rep0" / "cell.json")
    assert timed["instrumented"] is False and "instrumentation_args" not in timed


def test_instrumentation_argument_conflict_is_refused_before_any_launch(
    fake_cli_env, tmp_path, capsys
):
    body = BASE.replace("fake: {n: 1}", "fake: {n: 1}\n      fake_args: {}").replace(
        "server_args: [--disable-overlap-schedule]", "server_args: [--chunked-prefill-size, '128']"
    )
    cfg = write_config(tmp_path, body)
    msg = (
        r"the fake_args suite's instrumentation needs --chunked-prefill-size 64 in the "
        r"correctness cell of variant 'no-overlap', but variants.no-overlap.server_args sets "
        r"--chunked-prefill-size 128"
    )
    with pytest.raises(ConfigError, match=msg):
        describe_plan(load_config(cfg))
    assert cli.main(["bench", str(cfg)]) == 2
    assert (
        "variants.no-overlap.server_args sets --chunked-prefill-size 128" in capsys.readouterr().err
    )
    assert fake_cli_env.seen == {} and not (tmp_path / "results").exists()


def test_instrumentation_args_merge_by_hand(tmp_path):
    cfg = load_config(write_config(tmp_path, BASE))
    f = instrumentation_args
    assert f(cfg, "baseline", []) == []
    assert f(cfg, "baseline", [("a", ["--x", "1", "--y"]), ("b", ["--y", "--x=1"])]) == [
        "--x",
        "1",
        "--y",
    ]
    assert f(cfg, "no-overlap", [("a", ["--disable-overlap-schedule"])]) == []
    with pytest.raises(
        ConfigError,
        match=r"the b suite's instrumentation needs --x 2 .* but the a "
        r"suite's instrumentation sets --x 1",
    ):
        f(cfg, "baseline", [("a", ["--x", "1"]), ("b", ["--x=2"])])
    with pytest.raises(ConfigError, match=r"server.args sets --log-level info"):
        f(cfg, "baseline", [("a", ["--log-level", "debug"])])
    with pytest.raises(ConfigError, match=r"--port.*set by the harness"):
        f(cfg, "baseline", [("a", ["--port", "1"])])
