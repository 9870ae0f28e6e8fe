"""The one command line (patchbench/cli.py): generated help, the console script, and one test per
command and outcome: usage error (2), config error (2), patch does not apply (2), environment not
ready (3), run failed (4, the fake server dying mid-run), interrupted (130), a bug (70)."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from patchbench import cli, errors
from tests.helpers import json_digits

REPO = Path(__file__).resolve().parents[2]
FAKE_SERVER = Path(__file__).parent.parent / "fake_server"
ALL_COMMANDS = [
    "bench",
    "report",
    "compare",
    "nightly",
    "check-patch",
    "new-patch",
    "score-mmmu",
    "matrix",
    "comment",
    "make-tiny-model",
    "doctor",
]
#: the least each command needs to get past argument parsing
MINIMAL_ARGS = {
    "bench": ["cfg.yaml"],
    "report": ["run"],
    "compare": ["run_a", "run_b"],
    "nightly": ["cfg.yaml"],
    "check-patch": [],
    "new-patch": ["x", "--from-diff", "x.diff", "--sglang", "0.5.1.post3"],
    "score-mmmu": ["responses", "--answer-key", "key.json"],
    "matrix": ["matrix.yaml"],
    "comment": ["run"],
    "make-tiny-model": [],
    "doctor": [],
}


def installed_sglang() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def write_config(tmp_path: Path, *, sglang: str, variants: str, suites: str) -> Path:
    """A config with a local (empty) model folder; ``variants`` and ``suites`` are YAML lines."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    path = tmp_path / "cfg.yaml"
    path.write_text(
        f'name: cli-test\nsglang: "{sglang}"\nmodel: {{path: "{model}"}}\n'
        "server: {port: 31980, ready_timeout_s: 30, stop_grace_s: 3, flush_retries: 2, "
        "flush_pause_s: 0.1}\n"
        f"variants:\n{textwrap.indent(variants, '  ')}\n"
        "schedule: {repeats: 1}\n"
        f"suites:\n{textwrap.indent(suites, '  ')}\n"
    )
    return path


# ------------------------------------------------------------------------- help and entry points
def test_module_help_lists_every_command_and_the_exit_codes():
    r = subprocess.run(
        [sys.executable, "-m", "patchbench", "--help"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    for name in ALL_COMMANDS:
        assert f"\n    {name}" in r.stdout, name
    for code, meaning in {
        0: "done",
        1: "regression",
        2: "bad usage, config or patch",
        3: "environment not ready",
        4: "a run failed",
        130: "interrupted",
    }.items():
        line = next((ln for ln in r.stdout.splitlines() if ln.strip().startswith(f"{code} ")), "")
        assert meaning in line, (code, line)


def test_console_script_and_runner_shim_run_the_same_main():
    eps = importlib.metadata.entry_points(group="console_scripts", name="patchbench")
    assert [ep.value for ep in eps] == ["patchbench.cli:main"]
    script = shutil.which("patchbench", path=str(Path(sys.executable).parent))
    assert script, f"no patchbench script next to {sys.executable} (pip install -e .)"
    for argv in ([script, "doctor", "--help"], [sys.executable, "runner.py", "doctor", "--help"]):
        r = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert r.returncode == 0 and r.stdout.startswith("usage: patchbench doctor"), r


def test_no_command_and_unknown_command_are_usage_errors(capsys):
    assert cli.main([]) == 2
    assert "usage: patchbench" in capsys.readouterr().err
    assert cli.main(["benchmark"]) == 2
    assert "invalid choice: 'benchmark'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_unknown_option_is_a_usage_error_in_every_command(command, capsys):
    assert cli.main([command, *MINIMAL_ARGS[command], "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


@pytest.mark.parametrize("command", ALL_COMMANDS)
def test_ctrl_c_exits_130_in_every_command(command, monkeypatch, capsys):
    def interrupted(_args):
        raise KeyboardInterrupt

    table = [
        dataclasses.replace(c, run=interrupted) if c.name == command else c for c in cli.COMMANDS
    ]
    monkeypatch.setattr(cli, "COMMANDS", table)
    assert cli.main([command, *MINIMAL_ARGS[command]]) == 130
    assert capsys.readouterr().err.strip() == f"patchbench {command}: interrupted (exit 130)"


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (errors.EnvironmentNotReady("no GPU"), 3, "environment not ready (exit 3): no GPU"),
        (errors.RunFailed("1 of 4 cells failed"), 4, "run failed (exit 4): 1 of 4 cells failed"),
        (errors.Interrupted("stopped", signum=15), 143, "terminated (exit 143): stopped"),
    ],
)
def test_patchbench_errors_end_with_their_code_and_one_line(exc, code, line, monkeypatch, capsys):
    def fails(_args):
        raise exc

    monkeypatch.setattr(cli, "COMMANDS", [dataclasses.replace(c, run=fails) for c in cli.COMMANDS])
    assert cli.main(["doctor"]) == code
    assert capsys.readouterr().err == f"patchbench doctor: {line}\n"


def test_a_bug_exits_70_with_the_traceback(monkeypatch, capsys):
    def bug(_args):
        return {}["missing"]

    monkeypatch.setattr(cli, "COMMANDS", [dataclasses.replace(c, run=bug) for c in cli.COMMANDS])
    assert cli.main(["report", "run"]) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "KeyError: 'missing'" in err
    assert "patchbench report: internal error (exit 70)" in err


def test_module_errors_map_to_the_documented_codes():
    """Every module error derives from patchbench.errors and exits with its documented code."""
    from patchbench.nightly import history
    from patchbench.patches import wheels
    from patchbench.run import server

    assert errors.exit_code_of(errors.ConfigError("x")) == 2
    assert errors.exit_code_of(errors.PatchError("x")) == 2
    assert errors.exit_code_of(wheels.FetchError("x")) == 3  # a PatchError that is environmental
    assert errors.exit_code_of(history.HistoryError(Path("h.sqlite"), "locked")) == 3
    assert errors.exit_code_of(server.ServerError("x")) == 4
    assert errors.exit_code_of(KeyboardInterrupt()) == 130
    assert errors.exit_code_of(SystemExit(2)) == 2
    assert errors.exit_code_of(RuntimeError("x")) == 70


#: the message kind each exit code's errors start with (exit 2 has several, one per class)
KIND_OF_CODE = {
    1: {"regression found"},
    2: {
        "usage error",
        "config error",
        "patch error",
        "run folder error",
        "site folder refused",
        "run id refused",
    },
    3: {"environment not ready"},
    4: {"run failed", "run folder busy", "run folder gone", "run not finished"},
    5: {"underpowered"},
    130: {"interrupted"},
    143: {"terminated"},
}


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def test_every_error_class_carries_a_kind_that_matches_its_exit_code():
    """Each PatchbenchError subclass in patchbench and its suites says its own kind; a class that
    changes its exit code (wheels.FetchError: a patch error that exits 3) changes its kind too."""
    import importlib
    import pkgutil

    import patchbench
    import patchbench.suites

    for pkg in (patchbench, patchbench.suites):
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if ".shims." in m.name or m.name.endswith((".instr", ".site")):
                continue
            try:
                importlib.import_module(m.name)
            except (
                ModuleNotFoundError
            ) as e:  # torch, in an environment without it (make test-light)
                if (e.name or "").startswith("patchbench"):
                    raise
    classes = _subclasses(errors.PatchbenchError)
    names = {c.__name__ for c in classes}
    assert {"ConfigError", "FetchError", "RunFolderError", "HistoryError", "OverlayError"} <= names
    for c in classes:
        assert c.kind in KIND_OF_CODE[c.exit_code], (c, c.exit_code, c.kind)
    from patchbench import runfolder
    from patchbench.patches import wheels

    assert errors.kind_of(wheels.FetchError("x")) == "environment not ready"
    assert errors.kind_of(runfolder.RunFolderError("x")) == "run folder error"
    assert errors.kind_of(errors.Interrupted("x", signum=15)) == "terminated"
    assert errors.kind_of(KeyboardInterrupt()) == "interrupted"
    assert not hasattr(cli, "_kind")  # the kind comes from the class, never from its name


# ------------------------------------------------------------------------------ config errors
def test_config_error_exits_2_naming_the_file_and_key(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsglang: 0.5.1.post3\nmodel: {path: m}\nvariantz: {}\n")
    for command in ("bench", "nightly", "doctor"):
        assert cli.main([command, str(bad)]) == 2, command
        err = capsys.readouterr().err
        assert "bad.yaml" in err and "variantz" in err, (command, err)
    assert cli.main(["bench", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml" in capsys.readouterr().err


def test_report_and_compare_of_a_folder_that_is_no_run_exit_2(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path), str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "typo")]) == 2
    err = capsys.readouterr().err
    assert "run folder error (exit 2)" in err and "typo: no such folder" in err


def test_score_mmmu_with_missing_files_exits_2(tmp_path, capsys):
    key = tmp_path / "key.json"
    assert cli.main(["score-mmmu", str(tmp_path / "none.jsonl"), "--answer-key", str(key)]) == 2
    assert "none.jsonl" in capsys.readouterr().err


# --------------------------------------------------------------------- environment not ready
@pytest.mark.needs_sglang  # loads a release environment / torch
def test_bench_on_a_release_without_an_environment_exits_3_before_any_server(tmp_path, capsys):
    """A pin no environment of this machine holds (the running one, .venv, .venv-*) stops the
    run with the `make setup` that makes one; a variant's own pin is checked the same way."""
    for variants in (
        "baseline: []\ncontrol: {env: {X: '1'}}",
        "baseline: []\nother: {sglang: '0.4.0'}",
    ):
        cfg = write_config(
            tmp_path,
            sglang="0.4.0" if "other" not in variants else installed_sglang(),
            variants=variants,
            suites="sync_probe: {}",
        )
        assert cli.main(["bench", str(cfg), "--results", str(tmp_path / "results")]) == 3
        err = capsys.readouterr().err
        assert err.startswith("patchbench bench: environment not ready (exit 3): ")
        assert "sglang 0.4.0: no environment of this machine has it" in err
        assert "run `make setup SGLANG=0.4.0` (it makes .venv-0.4.0)" in err
        assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_doctor_without_a_gpu_for_a_gpu_config_exits_3(monkeypatch, capsys):
    from patchbench.envs import envinfo

    info = {
        "python": "3",
        "executable": sys.executable,
        "gpu": None,
        "sglang": "0.5.1.post3",
        "hub_reachable": False,
        "disk_free_gib": 1.0,
    }
    monkeypatch.setattr(envinfo, "collect", lambda **_: info)
    assert cli.main(["doctor", str(REPO / "configs" / "pr9460-h200.yaml")]) == 3
    assert "MISSING NVIDIA GPU" in capsys.readouterr().out


# ------------------------------------------------------------------------ patch does not apply
def break_diff(text: str) -> str:
    """A diff whose first context line is in no release of sglang (git apply refuses it)."""
    lines = text.splitlines(keepends=True)
    ctx = next(i for i, ln in enumerate(lines) if ln.startswith(" ") and ln.strip())
    lines[ctx] = " this line is in no release of sglang\n"
    return "".join(lines)


@pytest.fixture
def broken_patch(tmp_path):
    """patches/ with null-comment plus "broken": null-comment whose diff context matches no
    release."""
    from patchbench import inputs

    patches = tmp_path / "patches"
    shutil.copytree(inputs.PATCHES_DIR / "null-comment", patches / "null-comment")
    shutil.copytree(inputs.PATCHES_DIR / "null-comment", patches / "broken")
    manifest = patches / "broken" / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace("name: null-comment", "name: broken"))
    for diff in (patches / "broken").glob("*.diff"):
        diff.write_text(break_diff(diff.read_text()))
    return patches


@pytest.mark.needs_sglang
def test_check_patch_that_does_not_apply_exits_2(broken_patch, capsys):
    ver = installed_sglang()
    argv = ["check-patch", "--patches-dir", str(broken_patch), "--sglang", ver, "--patch"]
    assert cli.main([*argv, "null-comment"]) == 0
    assert "OK" in capsys.readouterr().out
    assert cli.main([*argv, "broken"]) == 2
    out, err = capsys.readouterr()
    assert f"broken               {ver:<12} FAIL" in out
    assert "patchbench check-patch: 1 check(s) failed (exit 2)" in err
    assert "  next: port it to" in out  # the state's next step under the FAIL line


def test_one_sglang_spelling_for_several_releases():
    """``--sglang A B`` (as README and docs/patches.md write it) and ``--sglang A --sglang B``
    mean the same in new-patch and check-patch."""
    p = cli.build_parser()
    for cmd in (["new-patch", "x", "--from-diff", "d"], ["check-patch"]):
        one = p.parse_args([*cmd, "--sglang", "0.5.1.post3", "0.5.23"])
        rep = p.parse_args([*cmd, "--sglang", "0.5.1.post3", "--sglang", "0.5.23"])
        assert one.sglang == rep.sglang == ["0.5.1.post3", "0.5.23"]


def test_check_patch_of_an_unknown_patch_exits_2(capsys):
    assert cli.main(["check-patch", "--patch", "no-such-patch"]) == 2
    assert "no-such-patch" in capsys.readouterr().out


def test_new_patch_from_a_missing_diff_exits_2_and_writes_nothing(tmp_path, capsys):
    argv = ["new-patch", "mine", "--from-diff", str(tmp_path / "none.diff"), "--sglang", "0.5.23"]
    argv += ["--patches-dir", str(tmp_path / "patches")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("patchbench new-patch: patch error (exit 2): ") and "none.diff" in err
    assert not (tmp_path / "patches" / "mine").exists()
    assert cli.main(["new-patch", "mine", "--sglang", "0.5.23"]) == 2  # no source given
    assert "one of the arguments --from-diff --from-git is required" in capsys.readouterr().err


@pytest.mark.needs_sglang
def test_bench_with_a_patch_that_does_not_apply_exits_2_before_any_server(tmp_path, capsys):
    from patchbench import inputs

    broken = tmp_path / "broken.diff"
    broken.write_text(
        break_diff((inputs.PATCHES_DIR / "null-comment" / f"{installed_sglang()}.diff").read_text())
    )
    cfg = write_config(
        tmp_path,
        sglang=installed_sglang(),
        variants=f'baseline: []\nbroken: [{{diff: "{broken}"}}]',
        suites="sync_probe: {}",
    )
    assert cli.main(["bench", str(cfg), "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("patchbench bench: patch error (exit 2): ") and "broken" in err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
    # the dry run applies every patch to a pristine copy and says the same, with the state
    assert cli.main(["bench", str(cfg), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "patches    FAIL\nvariant 'broken': patch 'broken-" in out
    assert f"applies to none of sglang {installed_sglang()}" in out
    assert "(conflicts at sglang/srt/model_executor/forward_batch_info.py hunk 1) next: " in out
    assert "a patch does not apply" in err
    ok = write_config(
        tmp_path, sglang=installed_sglang(), variants="a: []\nb: [null-comment]", suites="{}"
    )
    assert cli.main(["bench", str(ok), "--dry-run"]) == 0
    assert "patches    every patch applies" in capsys.readouterr().out


# ------------------------------------------------------------ a run with the fake server: 4, 130
@pytest.fixture
def fake_server(monkeypatch):
    """The fake suites (tests/fake_server/fake_suites.py, registered as "fake" ...) and every
    launch starting the fake server; returns {"<variant>/rep<k>": extra server environment} for
    injecting faults."""
    from patchbench.run import bench
    from tests.fake_server import fake_suites  # noqa: F401 - registers the fake suites

    # the function that builds a cell's LaunchSpec: patchbench.run.cell.launch_spec (bench's
    # _launch_spec before run_cell moved to patchbench.run.cell)
    try:
        from patchbench.run import cell as owner

        attr = "launch_spec"
    except ImportError:
        owner, attr = bench, "_launch_spec"
    real = getattr(owner, attr)
    faults: dict[str, dict[str, str]] = {}

    def launch_spec(cfg, venv, cdir, port):
        spec = real(cfg, venv, cdir, port)
        spec.env["PYTHONPATH"] = str(FAKE_SERVER) + os.pathsep + spec.env["PYTHONPATH"]
        spec.env.update(faults.get(f"{venv.name}/{cdir.name}", {}))
        return spec

    monkeypatch.setattr(owner, attr, launch_spec)
    return faults


@pytest.mark.needs_sglang
def test_bench_run_with_a_failed_cell_exits_4_and_keeps_the_others(fake_server, tmp_path, capsys):
    fake_server["control/rep0"] = {"FAKE_DIE_AFTER_GENERATE": "1"}
    cfg = write_config(
        tmp_path,
        sglang=installed_sglang(),
        variants="baseline: []\ncontrol: [null-comment]",
        suites="fake: {n: 2}",
    )
    assert cli.main(["bench", str(cfg), "--results", str(tmp_path / "results")]) == 4
    err = capsys.readouterr().err
    assert "patchbench bench: run failed (exit 4): 1 of 2 cells failed" in err
    (run_dir,) = (tmp_path / "results").iterdir()
    assert (run_dir / "baseline" / "rep0" / "fake" / "summary.json").is_file()


@pytest.mark.needs_sglang
def test_ctrl_c_during_a_suite_exits_130_and_keeps_the_manifest(
    fake_server, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_SUITE_INTERRUPT", "control/0")
    cfg = write_config(
        tmp_path,
        sglang=installed_sglang(),
        variants="baseline: []\ncontrol: [null-comment]",
        suites="fake: {n: 1}",
    )
    assert cli.main(["bench", str(cfg), "--results", str(tmp_path / "results")]) == 130
    assert "patchbench bench: interrupted (exit 130)" in capsys.readouterr().err
    (run_dir,) = (tmp_path / "results").iterdir()
    assert (run_dir / "manifest.json").is_file()


def test_matrix_bad_file_exits_2_naming_it(tmp_path, capsys):
    """A matrix whose axis names no config key is a config error (exit 2) naming the file."""
    bad = tmp_path / "m.yaml"
    bad.write_text(
        f"name: m\nbase: {REPO / 'configs' / 'demo-cpu.yaml'}\naxes:\n  no_such.key: [1, 2]\n"
    )
    assert cli.main(["matrix", str(bad), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "m.yaml" in err and "no_such" in err, err
    assert cli.main(["matrix", str(tmp_path / "none.yaml")]) == 2


def test_bench_from_a_process_of_its_own_counts_its_start_up(monkeypatch):
    """``patchbench bench`` run as a process (main() reading sys.argv) hands run_bench the
    seconds since the process was created (interpreter start-up and imports), so the overhead
    share includes them; a call from Python (main(argv)) does not."""
    import psutil

    from patchbench.run import bench

    got = []
    monkeypatch.setattr(bench, "run_bench", lambda *a, **kw: got.append(kw))
    monkeypatch.setattr(cli, "_PROCESS_T0", None)
    assert cli.main(["bench", "configs/demo-cpu.yaml"]) == 0
    assert "python_start_s" not in got[-1]
    monkeypatch.setattr(sys, "argv", ["patchbench", "bench", "configs/demo-cpu.yaml"])
    age = time.time() - psutil.Process().create_time()
    assert cli.main() == 0
    assert age <= got[-1]["python_start_s"] <= age + 5.0


# ----------------------------------------------------------------------- a reader that went away
def _run_with_closed_output(argv: list[str], *, stderr_closed: bool = False, **kw):
    """``patchbench ARGV | head -0`` made certain: the pipe's read end is closed before the command
    starts, so its first flush of stdout (and stderr, when ``stderr_closed``) finds no reader."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(
            argv,
            stdout=w,
            stderr=w if stderr_closed else subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=180,
            **kw,
        )
    finally:
        os.close(w)


def test_a_closed_stdout_ends_every_command_quietly_with_its_own_code(tmp_path):
    """`patchbench report RUN | head -1`, `bench --dry-run CONFIG | head -1`: no traceback, no
    exit 70; the command finishes and exits as it would have, its files written in full. A
    closed stderr too: an error still ends with its own code (2)."""
    golden = REPO / "tests" / "data" / "golden" / "sequential"
    run = shutil.copytree(golden / "run", tmp_path / "run")
    py = [sys.executable, "-m", "patchbench"]
    r = _run_with_closed_output([*py, "report", str(run)])
    assert (r.returncode, r.stderr) == (0, "")
    assert (run / "report.md").read_bytes() == (golden / "expected" / "report.md").read_bytes()
    got, want = (
        (run / "compare.json").read_bytes(),
        (golden / "expected" / "compare.json").read_bytes(),
    )
    assert json_digits(got) == json_digits(want)
    r = _run_with_closed_output(
        [*py, "bench", "--dry-run", str(REPO / "configs" / "demo-cpu.yaml")]
    )
    assert (r.returncode, r.stderr) == (0, "")
    r = _run_with_closed_output([*py, "report", str(tmp_path / "none")], stderr_closed=True)
    assert r.returncode == 2


@pytest.mark.needs_sglang
def test_a_bench_whose_output_reader_went_away_runs_to_its_end(tmp_path):
    """`patchbench bench CONFIG | head -1` with the fake server: every cell runs, the report is
    written and the exit code is the run's (0), though nobody reads stdout or stderr."""
    cfg = write_config(
        tmp_path,
        sglang=installed_sglang(),
        variants="baseline: []\ncontrol: [null-comment]",
        suites="fake: {n: 1}",
    )
    runner = FAKE_SERVER / "run_bench_fake.py"
    r = _run_with_closed_output(
        [sys.executable, str(runner), str(cfg), str(tmp_path / "results")], stderr_closed=True
    )
    assert r.returncode == 0
    (run_dir,) = (tmp_path / "results").iterdir()
    assert (run_dir / "report.md").is_file()
    for v in ("baseline", "control"):
        assert (run_dir / v / "rep0" / "fake" / "summary.json").is_file()


@pytest.mark.parametrize("port", ["-1", "0", "80", "99999", "x"])
@pytest.mark.parametrize("command", [["bench", "cfg.yaml"], ["ab", "--args-b", "--x"]])
def test_a_port_the_config_would_refuse_is_refused_on_the_command_line(command, port, capsys):
    """`--port` overrides server.port: the same range (1024-65535), exit 2 before anything."""
    assert cli.main([*command, "--port", port]) == 2
    assert "--port" in capsys.readouterr().err


def test_the_dry_run_shows_the_port_the_run_would_use(capsys):
    """`bench --dry-run --port N` prints server commands on N, as the run would launch them (the
    config's server.port otherwise)."""
    from patchbench.cli import main

    assert main(["bench", "configs/demo-cpu.yaml", "--dry-run", "--port", "30401"]) == 0
    out = capsys.readouterr().out
    servers = [line for line in out.splitlines() if "sglang.launch_server" in line]
    assert servers and all("--port 30401" in line for line in servers), servers
    assert main(["bench", "configs/demo-cpu.yaml", "--dry-run"]) == 0
    assert "--port 30401" not in capsys.readouterr().out
