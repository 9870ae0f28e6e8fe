"""``patchbench ab``: a branch of an sglang checkout against its merge base, a diff, or server
arguments, from one command line with a preset.

The checkout is made here from the installed release (.venv: python/sglang is its site-packages
``sglang`` and python/pyproject.toml declares its dependencies, so it runs as an overlay on
.venv): main holds the release, branch my-branch two commits (a test file outside
python/sglang, then a small real change), deps-branch one more (a new dependency the change
imports). The end-to-end test (marked e2e) runs deps-branch with the cpu-demo preset on port
30160 (no other test or config uses it).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from patchbench import ab, cli
from patchbench.errors import UsageError
from patchbench.patches import wheels
from patchbench.records import read_json
from tests.helpers import git, toy_wheel

VERSION, SITE = wheels.installed_sglang()
pytestmark = pytest.mark.skipif(SITE is None, reason="sglang is not installed in this environment")
REPO = Path(__file__).resolve().parents[2]
SAMPLING = "sglang/srt/sampling/sampling_params.py"


def pyproject_of_installed() -> str:
    """A pyproject.toml declaring the installed sglang's Requires-Dist (extras as
    optional-dependencies, other markers kept)."""
    deps: list[str] = []
    extras: dict[str, list[str]] = {}
    for raw in importlib.metadata.distribution("sglang").requires or []:
        req, _, marker = raw.partition(";")
        m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        rest = re.sub(r"""\s*(and\s+)?extra\s*==\s*["'][^"']+["']""", "", marker).strip()
        rest = re.sub(r"^and\s+", "", rest)
        text = req.strip() + (f"; {rest}" if rest else "")
        (extras.setdefault(m.group(1), []) if m else deps).append(text)
    lines = ['[project]\nname = "sglang"', f"dependencies = {deps!r}".replace("'", '"')]
    lines.append("[project.optional-dependencies]")
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in extras.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("ab") / "sglang"
    shutil.copytree(
        SITE / "sglang",
        repo / "python" / "sglang",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    (repo / "python" / "pyproject.toml").write_text(pyproject_of_installed())
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", f"sglang {VERSION}")
    git(repo, "checkout", "-qb", "my-branch")
    (repo / "test").mkdir()
    (repo / "test" / "test_sampling.py").write_text("def test_x():\n    pass\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a test")
    f = repo / "python" / SAMPLING
    text = f.read_text()
    assert "_SAMPLING_EPS = 1e-6\n" in text
    f.write_text(text.replace("_SAMPLING_EPS = 1e-6\n", "_SAMPLING_EPS = 1e-5\n"))
    git(repo, "commit", "-qam", "sampling: a larger epsilon")
    # deps-branch: my-branch plus a dependency no environment here has (pbtoy 2.0, a local
    # wheel), imported by the changed module, so B needs an environment of its own
    git(repo, "checkout", "-qb", "deps-branch")
    pyproject = repo / "python" / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace("dependencies = [", 'dependencies = ["pbtoy==2.0", ', 1)
    )
    f.write_text(f.read_text() + "\nimport pbtoy  # noqa: E402\n\nPBTOY = pbtoy.VERSION\n")
    git(repo, "commit", "-qam", "sampling: needs pbtoy 2.0")
    git(repo, "checkout", "-q", "main")
    return repo


def test_range_is_the_merge_base_against_the_branch_head(checkout):
    r = ab.git_range(checkout, "main...my-branch", None, None)
    assert r.base == git(checkout, "rev-parse", "main")
    assert r.head == git(checkout, "rev-parse", "my-branch")
    assert r.ignored == ["test/test_sampling.py"]
    same = ab.git_range(checkout, None, "main", "my-branch")
    assert (same.base, same.head) == (r.base, r.head)
    with pytest.raises(UsageError, match="changes nothing under python/sglang/"):
        ab.git_range(checkout, None, "my-branch~1", "my-branch~1")
    with pytest.raises(UsageError, match="write A...B"):
        ab.git_range(checkout, "my-branch", None, None)
    with pytest.raises(UsageError, match="no merge base of 'main' and 'nope'"):
        ab.git_range(checkout, "main...nope", None, None)
    with pytest.raises(UsageError, match="'nope' names no commit"):
        ab.git_range(checkout, "main..nope", None, None)


def test_ab_config_for_a_branch_a_diff_and_server_arguments(checkout, tmp_path):
    r = ab.git_range(checkout, "main...my-branch", None, None)
    tpl = yaml.safe_load(ab.preset_path("cpu-demo").read_text())
    cfg = ab.ab_config(tpl, git=r, repeats=1, name="x")
    assert cfg["sglang"] == {"git": str(checkout), "ref": r.base}
    assert cfg["variants"]["B"]["sglang"] == {"git": str(checkout), "ref": r.head}
    assert cfg["baseline"] == "A" and cfg["schedule"]["repeats"] == 1
    cfg = ab.ab_config(tpl, patch=tmp_path / "c.diff", args_b=["--disable-overlap-schedule"])
    assert cfg["variants"] == {
        "A": {"patches": [], "server_args": []},
        "B": {
            "patches": [{"diff": str(tmp_path / "c.diff")}],
            "server_args": ["--disable-overlap-schedule"],
        },
    }
    with pytest.raises(
        UsageError,
        match="unknown preset 'nope'; presets: capacity-h200, cpu-demo, pr-h200, sweep-h200",
    ):
        ab.preset_path("nope")


def test_ab_dry_run_resolves_both_sides_as_builds_on_this_environment(checkout, capsys):
    argv = ["ab", "--git", str(checkout), "--range", "main...my-branch", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "ab: ignored (outside python/sglang/): test/test_sampling.py" in out
    assert f"on .venv (sglang {VERSION})" in out and "(the baseline's build)" in out
    assert "patches    (none)" in out
    # each side named by its commit and subject (the fixture's), the range's files listed
    main, head = (
        git(checkout, "rev-parse", "main")[:12],
        git(checkout, "rev-parse", "my-branch")[:12],
    )
    assert f'ab: B: {checkout} at {head} "sampling: a larger epsilon"' in out
    assert f'  {"A":<24} {main} "sglang {VERSION}", patches: none (baseline)' in out
    assert f'  {"B":<24} {head} "sampling: a larger epsilon", patches: none' in out
    assert f'(commit {head} "sampling: a larger epsilon", sglang {VERSION}) on .venv' in out
    assert (
        "changes from A: 2 files: python/sglang/srt/sampling/sampling_params.py, "
        "test/test_sampling.py (1 outside python/sglang/, not run)"
    ) in out
    assert "(stock)" not in out
    assert cli.main(["ab", "--patch", "x.diff", "--git", str(checkout)]) == 2
    assert "give --git or --patch, not both" in capsys.readouterr().err
    assert cli.main(["ab"]) == 2


@pytest.mark.e2e
def test_ab_on_a_branch_with_a_new_dependency_makes_its_environment_once(checkout, tmp_path):
    """Real servers: B's range adds a dependency no environment has (pbtoy 2.0, served as a
    local wheel: pip runs offline). Without --make-env the dry run says how to get one (exit 3);
    with it, B runs on a layer over .venv that holds only pbtoy, made once (a second dry run
    finds it), A on .venv; the branch's one changed file under python/sglang is the only file
    of B's overlay, and the run folder names each side's commit."""
    wheels = tmp_path / "wheels"
    toy_wheel(wheels, "2.0")
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    argv = [sys.executable, str(REPO / "runner.py"), "ab", "--git", str(checkout)]
    argv += ["--range", "main...deps-branch", "--repeats", "1", "--port", "30160"]
    argv += ["--results", str(tmp_path / "results")]

    def ab_run(*extra: str) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [*argv, *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=1500
        )
        print(p.stdout[-4000:], p.stderr[-4000:])
        return p

    p = ab_run("--dry-run")
    assert p.returncode == 3 and re.search(
        r"the build declares [^;]*pbtoy==2\.0", p.stdout + p.stderr
    )
    assert "add --make-env" in p.stdout + p.stderr
    p = ab_run("--dry-run", "--make-env")
    assert p.returncode == 0
    assert re.search(r"1 package\(s\) that differ, about 1 kB to download \(pbtoy 2\.0\)", p.stdout)
    p = ab_run("--make-env")
    assert p.returncode == 0, p.stderr[-3000:]
    (run,) = [d for d in (tmp_path / "results").iterdir() if (d / "manifest.json").is_file()]
    man = read_json(run / "manifest.json")
    venv = Path(man["builds"]["B"]["venv"])
    assert (
        venv.parent == REPO / ".cache" / "envs" and Path(man["builds"]["A"]["venv"]).name == ".venv"
    )
    site = next(venv.glob("lib/python*/site-packages"))
    assert sorted(d.name for d in site.glob("*.dist-info")) == ["pbtoy-2.0.dist-info"]
    assert list(man["overlays"]["B"]["files"]) == [SAMPLING]
    assert man["overlays"]["A"]["files"] == {}
    head = git(checkout, "rev-parse", "deps-branch")
    assert man["builds"]["B"]["resolved"] == head and man["builds"]["B"]["kind"] == "git"
    assert man["builds"]["A"]["resolved"] == git(checkout, "rev-parse", "main")
    assert "ab: report " in p.stdout and (run / "report.md").is_file()
    p = ab_run("--dry-run", "--make-env")
    assert p.returncode == 0 and "makes first" not in p.stdout and str(venv.name) in p.stdout


def test_server_arguments_that_start_with_dashes_parse_as_the_readme_spells_them():
    """``ab --args-b "--disable-overlap-schedule"`` (README, Commands): argparse alone reads the
    value as an unknown option and exits 2; the value reaches ``args_b`` whole."""
    from patchbench.cli import build_parser, glue_dash_values

    argv = ["ab", "--args-b", "--disable-overlap-schedule", "--dry-run"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    a = build_parser().parse_args(glue_dash_values(argv))
    assert a.args_b == "--disable-overlap-schedule" and a.dry_run
    assert glue_dash_values(["ab", "--args-a", "--x", "--args-b"]) == [
        "ab",
        "--args-a=--x",
        "--args-b",
    ]


def _action_steps() -> dict[str, dict]:
    action = yaml.safe_load((REPO / ".github/actions/patchbench-ab/action.yml").read_text())
    return {s["name"]: s for s in action["runs"]["steps"]}


def _run_step(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """One composite-action step as the runner runs it: ``bash -e`` with the inputs in env."""
    return subprocess.run(
        ["bash", "-e", "-c", script], env={**os.environ, **env}, capture_output=True, text=True
    )


def _outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_action_ab_step_keeps_the_exit_code_and_finds_the_run_folder_it_made(tmp_path):
    """The action's `patchbench ab` step, run as the workflow runs it (bash, inputs in env,
    $GITHUB_OUTPUT): the real command with a checkout that is no git repository exits 2 and the
    step records rc=2 and no run folder; a stand-in for the command that makes a run folder and
    exits 1 (a regression) has that folder recorded, not an older one; the step itself exits 0,
    and the last step re-raises the code (4 when there is none)."""
    steps = _action_steps()
    ab_script, keep = steps["patchbench ab"]["run"], steps["Keep the exit code of patchbench ab"]
    pb_dir = tmp_path / "pb"
    (pb_dir / "results").mkdir(parents=True)
    old = pb_dir / "results" / "20000101T000000Z-older"
    old.mkdir()
    os.utime(old, (0, 0))
    not_git = tmp_path / "not-git"
    not_git.mkdir()
    out = tmp_path / "github_output"
    env = {
        "PB_DIR": str(pb_dir),
        "PB_PYTHON": sys.executable,
        "AB_CHECKOUT": str(not_git),
        "AB_RANGE": "origin/main...HEAD",
        "AB_PRESET": "cpu-demo",
        "GITHUB_OUTPUT": str(out),
        "PYTHONPATH": str(REPO),
    }
    r = _run_step(ab_script, env)
    assert r.returncode == 0, r.stderr
    assert "not a git checkout" in r.stderr
    assert _outputs(out) == {"rc": "2", "run_dir": ""}
    assert "patchbench ab: exit 2; run folder: none" in r.stdout
    assert _run_step(keep["run"], {"RC": "2"}).returncode == 2
    assert _run_step(keep["run"], {"RC": ""}).returncode == 4

    stub = tmp_path / "stub-python"
    stub.write_text(
        "#!/bin/bash\n"
        'd="$PWD/results/20991231T000000Z-ab-stub"; mkdir -p "$d"\n'
        'printf "%s\\n" "$@" > "$d/argv.txt"; exit 1\n'
    )
    stub.chmod(0o755)
    out.write_text("")
    r = _run_step(ab_script, dict(env, PB_PYTHON=str(stub), AB_CHECKOUT=str(tmp_path)))
    assert r.returncode == 0, r.stderr
    made = pb_dir / "results" / "20991231T000000Z-ab-stub"
    assert _outputs(out) == {"rc": "1", "run_dir": str(made)}
    argv = (made / "argv.txt").read_text().split("\n")[:-1]
    assert argv == ["-m", "patchbench", "ab", "--git", str(tmp_path)] + [
        "--range",
        "origin/main...HEAD",
        "--preset",
        "cpu-demo",
    ]
    assert _run_step(keep["run"], {"RC": "1"}).returncode == 1


def test_ab_says_a_changed_pyproject_picks_the_environment(checkout, capsys):
    argv = ["ab", "--git", str(checkout), "--range", "main...deps-branch", "--dry-run"]
    # 3 where no environment has pbtoy yet (the e2e test makes one), 0 where it does
    assert cli.main(argv) in (0, 3)
    out = capsys.readouterr().out
    assert "ab: ignored (outside python/sglang/): test/test_sampling.py\n" in out
    assert "ab: python/pyproject.toml changes: its dependencies pick B's environment" in out


@pytest.fixture
def kernel_checkout(checkout, tmp_path) -> Path:
    """A clone of the checkout whose branch kernel-branch is my-branch plus a CUDA file under
    sgl-kernel/csrc/ (compiled code no build here compiles); main is checked out."""
    repo = tmp_path / "sglang"
    subprocess.run(["git", "clone", "-q", str(checkout), str(repo)], check=True)
    git(repo, "checkout", "-qb", "kernel-branch", "origin/my-branch")
    (repo / "sgl-kernel" / "csrc").mkdir(parents=True)
    (repo / "sgl-kernel" / "csrc" / "k.cu").write_text("// a faster kernel\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "kernel: faster")
    git(repo, "checkout", "-q", "main")
    return repo


@pytest.mark.parametrize("preset", ["cpu-demo", "pr-h200"])
def test_a_range_with_compiled_code_is_refused_on_every_preset(kernel_checkout, preset, capsys):
    """Issue 34: on a GPU preset the kernel file was only "ignored" on the console and the run
    measured the Python part as if it were the change; now every preset refuses it (exit 2),
    naming the file and the flag, before any environment is looked for."""
    argv = ["ab", "--git", str(kernel_checkout), "--range", "main...kernel-branch"]
    assert cli.main([*argv, "--preset", preset, "--dry-run"]) == 2
    cap = capsys.readouterr()
    assert "ignored (outside python/sglang/): test/test_sampling.py\n" in cap.out
    assert "k.cu" not in cap.out
    assert "config error (exit 2): variant 'B' (git:" in cap.err
    assert "changes compiled code that no build here compiles: sgl-kernel/csrc/k.cu." in cap.err
    assert "--allow-uncompiled" in cap.err and "Traceback" not in cap.err


def test_allow_uncompiled_runs_the_python_part_and_records_what_was_left_out(
    kernel_checkout, capsys
):
    """With --allow-uncompiled the GPU preset's dry run goes on; B's sglang carries the
    allowance (so a resumed run keeps it), the console says what is left out, and B's build
    record (the manifest's ``builds`` entry) holds it."""
    from patchbench.cli import build_parser
    from patchbench.envs import builds

    argv = ["ab", "--git", str(kernel_checkout), "--range", "main...kernel-branch"]
    argv += ["--preset", "pr-h200", "--allow-uncompiled", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    head = git(kernel_checkout, "rev-parse", "kernel-branch")
    assert (
        f"sglang: variant 'B' (git:{kernel_checkout}@{head}): "
        "left out: 1 compiled file (sgl-kernel/csrc/k.cu): not built here, this measures the "
        "Python part only\n"
    ) in out
    cfg = ab.prepare_ab(build_parser().parse_args(argv))
    assert cfg.sglang_of("B").allow_uncompiled and not cfg.sglang_of("A").allow_uncompiled
    entry = builds.resolve_builds(cfg, log=lambda _: None)["B"].to_json()
    assert entry["changes"]["uncompiled"] == {"count": 1, "files": ["sgl-kernel/csrc/k.cu"]}
    assert entry["changes"]["count"] == 3 and entry["changes"]["outside"] == 2


def test_uncommitted_edits_are_named_at_the_start_and_not_measured(kernel_checkout, capsys):
    """An edited tracked file and a new file under python/ are named before the plan; the
    builds are the commits (B's overlay is the branch's one changed file)."""
    (kernel_checkout / "python" / SAMPLING).write_text("# not committed\n")
    (kernel_checkout / "python" / "sglang" / "scratch.py").write_text("")
    argv = ["ab", "--git", str(kernel_checkout), "--range", "main...origin/my-branch", "--dry-run"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    line = (
        f"sglang: {kernel_checkout}: the checkout has uncommitted edits (2 files: "
        f"python/{SAMPLING}, python/sglang/scratch.py); they are not measured: the builds are "
        "the commits\n"
    )
    assert out.count(line) == 1 and out.index(line) < out.index("patches    (none)")
