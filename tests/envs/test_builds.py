"""Builds per variant (patchbench.envs.builds): releases, ``latest`` from a package index served here,
a git checkout (bare or not) at a commit run as an overlay on the environment with the same
dependencies, and what is refused (no environment, other dependencies, compiled code on the CPU).

The environments are fake venvs (a small ``sglang`` package and its dist-info) listed through
PATCHBENCH_VENVS, so nothing here needs a real sglang; the overlay is verified with this
interpreter the way the server's would be.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from patchbench.config import load_config
from patchbench.envs import builds, envinfo
from patchbench.errors import ConfigError, EnvironmentNotReady
from patchbench.patches.overlay import build_source_overlay, verify_in_env
from tests.helpers import git

REQS = ["aiohttp", "numpy<3,>=1.2", 'torch==2.8.0; extra == "srt"']
PYPROJECT = """[project]
name = "sglang"
dependencies = ["aiohttp", "numpy>=1.2,<3"]
[project.optional-dependencies]
srt = ["torch==2.8.0"]
"""


def fake_venv(root: Path, version: str, requires: list[str]) -> Path:
    """A venv holding sglang ``version``: sglang/{__init__,version,a,b}.py and its dist-info."""
    site = root / "lib" / "python3.11" / "site-packages"
    pkg = site / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "b.py").write_text("B = 1\n")
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    meta = [f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}"]
    (info / "METADATA").write_text(
        "\n".join(meta + [f"Requires-Dist: {r}" for r in requires]) + "\n"
    )
    (info / "RECORD").write_text("sglang/__init__.py,,\n")
    (root / "bin").mkdir()
    (root / "bin" / "python").symlink_to(sys.executable)
    return site


@pytest.fixture
def envs(tmp_path, monkeypatch):
    """Two fake environments: 1.0 (REQS) and 2.0 (other dependencies); the running
    interpreter's own sglang is hidden."""
    a = fake_venv(tmp_path / ".venv-1.0", "1.0", REQS)
    fake_venv(tmp_path / ".venv-2.0", "2.0", ["aiohttp", "numpy>=2"])
    monkeypatch.setenv(envinfo.VENVS_ENV, f"{tmp_path / '.venv-1.0'}:{tmp_path / '.venv-2.0'}")
    monkeypatch.setattr(envinfo, "stock_site_dir", lambda: None)
    return a


@pytest.fixture
def checkout(tmp_path, envs) -> Path:
    """An sglang-like repository: main = release 1.0's package + pyproject (REQS); branch
    my-branch changes a.py, adds c.py, removes b.py and edits a test outside python/."""
    repo = tmp_path / "sglang"
    pkg = repo / "python" / "sglang"
    pkg.mkdir(parents=True)
    for f in envs.joinpath("sglang").iterdir():
        (pkg / f.name).write_bytes(f.read_bytes())
    (repo / "python" / "pyproject.toml").write_text(PYPROJECT)
    (repo / "test").mkdir()
    (repo / "test" / "test_a.py").write_text("")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "release 1.0")
    git(repo, "checkout", "-qb", "my-branch")
    (pkg / "a.py").write_text("A = 2\n")
    (pkg / "c.py").write_text("C = 1\n")
    (pkg / "b.py").unlink()
    (repo / "test" / "test_a.py").write_text("# more\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "change")
    return repo


def write_cfg(tmp_path: Path, sglang: str, variants: str) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    p = tmp_path / "cfg.yaml"
    p.write_text(
        f"name: t\nsglang: {sglang}\nmodel: {{path: {model}}}\n"
        "server: {args: [--device=cpu]}\n"
        f"variants:\n{variants}\nsuites: {{}}\n"
    )
    return p


def test_requirement_keys_compare_a_pyproject_with_requires_dist():
    keys = envinfo.requirement_keys
    assert keys(builds.pyproject_requirements(PYPROJECT)) == keys(REQS)
    assert keys(["numpy>=2"]) != keys(["numpy>=1.2,<3"])
    assert keys(['sglang[runtime_common]; extra == "srt_cpu"']) == (
        keys(['sglang[runtime-common] ; extra == "srt-cpu"'])
    )


def test_a_checkout_runs_as_an_overlay_on_the_environment_with_its_dependencies(checkout, tmp_path):
    """base (main) and branch of one checkout, the branch through its bare clone: both pick
    the 1.0 environment by their dependencies; the branch's overlay holds only the files that
    differ, drops the removed one, and resolves in the server's environment; the CPU check
    passes (only Python and a test changed)."""
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(checkout), str(bare)], check=True)
    cfg = load_config(
        write_cfg(
            tmp_path,
            f"{{git: {checkout}, ref: main}}",
            f"  base: []\n  mine: {{sglang: {{git: {checkout}, ref: my-branch}}}}\n"
            f"  bare: {{sglang: {{git: {bare}, ref: my-branch}}}}",
        )
    )
    got = builds.resolve_builds(cfg, cpu=True, cache_dir=tmp_path / "cache")
    assert {v: b.release for v, b in got.items()} == {"base": "1.0", "mine": "1.0", "bare": "1.0"}
    assert got["mine"].resolved == git(checkout, "rev-parse", "my-branch") == got["bare"].resolved
    assert cfg.release_of("mine") == "1.0" and cfg.builds == got
    commit = got["mine"].resolved
    assert got["mine"].describe() == (
        f'git:{checkout}@my-branch (commit {commit[:12]} "change", sglang 1.0) on '
        f"{tmp_path / '.venv-1.0'} (sglang 1.0)"
    )
    b = got["mine"]
    ov = build_source_overlay(
        b.release,
        b.tree,
        label=b.spec,
        source_id=b.resolved,
        stock_site_dir=b.env.site_dir,
        cache_root=tmp_path / "overlays",
    )
    assert sorted(ov.files) == ["sglang/a.py", "sglang/c.py"]
    assert not (ov.sglang_dir / "b.py").exists() and (ov.sglang_dir / "version.py").is_file()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = verify_in_env(ov, sys.executable, ov.env(env))
    assert Path(found["files"]["sglang/a.py"]["path"]) == ov.sglang_dir / "a.py"
    same = builds.resolve_builds(cfg, cache_dir=tmp_path / "cache")["base"]
    ov0 = build_source_overlay(
        same.release,
        same.tree,
        label=same.spec,
        source_id=same.resolved,
        stock_site_dir=same.env.site_dir,
        cache_root=tmp_path / "overlays",
    )
    assert ov0.files == {}  # main is the release: nothing differs


def test_a_git_build_records_its_commit_subject_version_and_the_files_its_range_changes(
    checkout, tmp_path
):
    """The manifest's record of a git build names its commit, its subject (the message's first
    line), its own sglang version and, against the baseline's commit, the files the range
    changes (the fixture's: a.py, b.py, c.py and a test outside python/sglang/); the
    baseline's has no range. Nine more files show "and N more" past the first eight."""
    variants = f"  base: []\n  mine: {{sglang: {{git: {checkout}, ref: my-branch}}}}"
    cfg = load_config(write_cfg(tmp_path, f"{{git: {checkout}, ref: main}}", variants))
    got = builds.resolve_builds(cfg, cache_dir=tmp_path / "cache")
    main, head = git(checkout, "rev-parse", "main"), git(checkout, "rev-parse", "my-branch")
    rec = got["mine"].to_json()
    assert rec["resolved"] == head and rec["subject"] == "change" and rec["version"] == "1.0"
    assert got["mine"].name() == f'{head[:12]} "change"'
    assert rec["changes"] == {
        "base": main,
        "count": 4,
        "files": [
            "python/sglang/a.py",
            "python/sglang/b.py",
            "python/sglang/c.py",
            "test/test_a.py",
        ],
        "outside": 1,
    }
    assert got["mine"].changes.describe() == (
        "4 files: python/sglang/a.py, python/sglang/b.py, python/sglang/c.py, test/test_a.py "
        "(1 outside python/sglang/, not run)"
    )
    base = got["base"].to_json()
    assert base["subject"] == "release 1.0" and base["changes"] is None
    assert base["resolved"] == main and got["base"].name() == f'{main[:12]} "release 1.0"'

    git(checkout, "checkout", "-q", "my-branch")
    for i in range(9):
        (checkout / "python" / "sglang" / f"m{i}.py").write_text("")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "nine more\n\nthe body is not the subject")
    b = builds.resolve_builds(cfg, cache_dir=tmp_path / "cache")["mine"]
    assert b.subject == "nine more" and b.to_json()["changes"]["count"] == 13
    assert len(b.to_json()["changes"]["files"]) == 8
    assert b.changes.describe().endswith(
        "python/sglang/m4.py and 5 more (1 outside python/sglang/, not run)"
    )


def test_compiled_code_is_what_no_source_build_compiles():
    """sgl-kernel, csrc, C/C++/CUDA, CMake and the Rust router are compiled code; a source build
    runs python/sglang/ only, so such files outside it are left out everywhere, and on the CPU
    (no kernel runs) those inside it too."""
    paths = [
        "python/sglang/srt/a.py",
        "python/sglang/jit_kernel/k.cuh",
        "sgl-kernel/csrc/attention/x.cu",
        "sgl-kernel/python/sgl_kernel/ops.py",
        "sgl-kernel/CMakeLists.txt",
        "sgl-router/src/lib.rs",
        "sgl-model-gateway/Cargo.toml",
        "csrc/y.cpp",
        "cmake/flags.cmake",
        "test/test_a.py",
        "docs/kernels.md",
        "python/pyproject.toml",
    ]
    gpu = [
        "sgl-kernel/csrc/attention/x.cu",
        "sgl-kernel/python/sgl_kernel/ops.py",
        "sgl-kernel/CMakeLists.txt",
        "sgl-router/src/lib.rs",
        "sgl-model-gateway/Cargo.toml",
        "csrc/y.cpp",
        "cmake/flags.cmake",
    ]
    assert builds.uncompiled_files(paths, cpu=False) == gpu
    assert builds.uncompiled_files(paths, cpu=True) == ["python/sglang/jit_kernel/k.cuh", *gpu]


def test_a_range_with_compiled_code_is_refused_on_every_engine_unless_allowed(checkout, tmp_path):
    """Issue 34: a GPU run took a kernel change's Python part for the whole change (the CPU
    alone refused it). Now every engine refuses, naming the files and the flag, before any
    environment is looked for; allowed, the build records what was left out and says it."""
    (checkout / "sgl-kernel" / "csrc").mkdir(parents=True)
    (checkout / "sgl-kernel" / "csrc" / "k.cu").write_text("// kernel\n")
    (checkout / "python" / "sglang" / "k.cuh").write_text("// jit\n")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "kernel")
    main, head = git(checkout, "rev-parse", "main"), git(checkout, "rev-parse", "my-branch")
    variants = f"  base: []\n  mine: {{sglang: {{git: {checkout}, ref: my-branch}}}}"
    cfg = load_config(write_cfg(tmp_path, f"{{git: {checkout}, ref: main}}", variants))
    for cpu, left, why in [
        (False, "sgl-kernel/csrc/k.cu", ""),
        (
            True,
            "python/sglang/k.cuh, sgl-kernel/csrc/k.cu",
            " (the CPU engine runs no kernel, not even one under python/sglang/)",
        ),
    ]:
        with pytest.raises(ConfigError) as e:
            builds.resolve_builds(cfg, cpu=cpu, cache_dir=tmp_path / "cache")
        assert str(e.value).startswith(
            f"variant 'mine' (git:{checkout}@my-branch): its range from the baseline "
            f"({main[:12]}..{head[:12]}) changes compiled code that no build here compiles"
            f"{why}: {left}. A source build runs python/sglang/ only"
        )
        assert "`patchbench ab ... --allow-uncompiled`" in str(e.value)
        assert "`allow_uncompiled: true` in the variant's sglang:" in str(e.value)
        assert not (tmp_path / "cache" / "builds").exists()  # refused before any build

    allowed = variants.replace("ref: my-branch}", "ref: my-branch, allow_uncompiled: true}")
    cfg = load_config(write_cfg(tmp_path, f"{{git: {checkout}, ref: main}}", allowed))
    said: list[str] = []
    b = builds.resolve_builds(cfg, cache_dir=tmp_path / "cache", log=said.append)["mine"]
    assert b.changes.uncompiled == ["sgl-kernel/csrc/k.cu"]
    assert b.to_json()["changes"]["uncompiled"] == {"count": 1, "files": ["sgl-kernel/csrc/k.cu"]}
    assert said == [
        f"sglang: variant 'mine' (git:{checkout}@my-branch): left out: 1 compiled file "
        "(sgl-kernel/csrc/k.cu): not built here, this measures the Python part only"
    ]
    b = builds.resolve_builds(cfg, cpu=True, cache_dir=tmp_path / "cache", log=said.append)
    assert b["mine"].changes.uncompiled == ["python/sglang/k.cuh", "sgl-kernel/csrc/k.cu"]
    assert b["base"].changes is None and "uncompiled" not in str(b["base"].to_json())
    # the allowance is written in the config only where it is given
    assert cfg.sglang_of("mine").model_dump()["allow_uncompiled"] is True
    assert cfg.sglang_of("base").model_dump() == {"git": str(checkout), "ref": "main"}


def test_a_range_with_other_dependencies_needs_their_environment(checkout, tmp_path):
    variants = f"  base: []\n  mine: {{sglang: {{git: {checkout}, ref: my-branch}}}}"
    cfg = load_config(write_cfg(tmp_path, f"{{git: {checkout}, ref: main}}", variants))
    (checkout / "python" / "pyproject.toml").write_text(PYPROJECT.replace(">=1.2", ">=2"))
    git(checkout, "commit", "-qam", "deps")
    with pytest.raises(EnvironmentNotReady) as e:
        builds.resolve_builds(cfg, cache_dir=tmp_path / "cache")
    assert "its dependencies match no environment" in str(e.value)
    msg = str(e.value)
    assert "the build declares numpy<3,>=2 and the environment does not" in msg
    assert "the environment has numpy<3,>=1.2, which the build does not declare" in msg


def test_uncommitted_edits_of_the_checkout_are_named_once_and_recorded(checkout, tmp_path):
    """The builds are the commits: a tracked file changed (staged or not) and a new file under
    python/ are named, on the console once per checkout and in each git build's record; an
    untracked file elsewhere is not; a clean checkout records nothing."""
    variants = f"  base: []\n  mine: {{sglang: {{git: {checkout}, ref: my-branch}}}}"
    cfg = load_config(write_cfg(tmp_path, f"{{git: {checkout}, ref: main}}", variants))
    said: list[str] = []
    got = builds.resolve_builds(cfg, cache_dir=tmp_path / "cache", log=said.append)
    assert said == [] and "uncommitted" not in got["mine"].to_json()

    (checkout / "python" / "sglang" / "a.py").write_text("A = 3\n")
    (checkout / "test" / "test_a.py").write_text("# staged\n")
    git(checkout, "add", "test/test_a.py")
    (checkout / "python" / "sglang" / "new.py").write_text("")
    (checkout / "notes.txt").write_text("")
    assert builds.uncommitted_edits(checkout) == [
        "python/sglang/a.py",
        "test/test_a.py",
        "python/sglang/new.py",
    ]
    got = builds.resolve_builds(cfg, cache_dir=tmp_path / "cache", log=said.append)
    assert said == [
        f"sglang: {checkout}: the checkout has uncommitted edits (3 files: python/sglang/a.py, "
        "test/test_a.py, python/sglang/new.py); they are not measured: the builds are the commits"
    ]
    for v in ("base", "mine"):
        assert got[v].to_json()["uncommitted"] == {
            "count": 3,
            "files": ["python/sglang/a.py", "test/test_a.py", "python/sglang/new.py"],
        }
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(checkout), str(bare)], check=True)
    assert builds.uncommitted_edits(bare) == []


def test_unknown_ref_and_patches_on_a_checkout_are_config_errors(checkout, tmp_path):
    cfg = load_config(write_cfg(tmp_path, f"{{git: {checkout}, ref: nope}}", "  a: []"))
    with pytest.raises(ConfigError, match="'nope' names no commit"):
        builds.resolve_builds(cfg, cache_dir=tmp_path / "cache")
    cfg = load_config(
        write_cfg(tmp_path, f"{{git: {checkout}}}", "  a: []\n  b: [null-comment]"),
        check_files=False,
    )
    with pytest.raises(ConfigError, match="variant 'b' runs git:.* and names patches"):
        builds.resolve_builds(cfg, cache_dir=tmp_path / "cache")


class _Index(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"info": {"version": "2.0"}}).encode()
        code = 200 if self.path == "/pypi/sglang/json" else 404
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_a):
        pass


def test_latest_is_resolved_once_from_the_package_index(envs, tmp_path, monkeypatch):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(builds.INDEX_URL_ENV, f"http://127.0.0.1:{srv.server_port}/pypi")
        assert builds.resolve_latest() == "2.0"
        cfg = load_config(write_cfg(tmp_path, "latest", "  a: []\n  b: {sglang: '1.0'}"))
        got = builds.resolve_builds(cfg)
        assert (got["a"].release, got["a"].spec, got["b"].release) == ("2.0", "latest", "1.0")
        assert got["a"].to_json()["resolved"] == "2.0"
        with pytest.raises(EnvironmentNotReady, match="cannot read the newest release"):
            builds.resolve_latest(f"http://127.0.0.1:{srv.server_port}/nothing")
    finally:
        srv.shutdown()


@pytest.mark.parametrize(
    "value, says",
    [
        ("foo", "key 'sglang': 'foo' is not an sglang release; write a release"),
        ("0.5", "key 'sglang': quote the release, e.g. sglang: \"0.5.1.post3\""),
        ("{wheel: a.tar}", "key 'sglang.wheel': name a wheel file"),
        ("{git: x, refs: y}", "unknown key 'sglang.refs'"),
    ],
)
def test_a_bad_sglang_value_is_a_config_error_naming_the_key(tmp_path, value, says):
    p = tmp_path / "c.yaml"
    p.write_text(f"name: t\nsglang: {value}\nmodel: {{path: m}}\nvariants: {{a: []}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, check_files=False)
    assert says in str(e.value)


def test_a_wheel_runs_as_an_overlay_on_the_environment_with_its_requirements(envs, tmp_path):
    import zipfile

    whl = tmp_path / "sglang-1.0.post1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for f in envs.joinpath("sglang").iterdir():
            z.writestr(f"sglang/{f.name}", "A = 3\n" if f.name == "a.py" else f.read_bytes())
        meta = "Metadata-Version: 2.1\nName: sglang\nVersion: 1.0.post1\n"
        z.writestr("sglang-1.0.post1.dist-info/METADATA", meta + "".join(
            f"Requires-Dist: {r}\n" for r in REQS
        ))  # fmt: skip
    cfg = load_config(write_cfg(tmp_path, f"{{wheel: {whl}}}", "  a: []"))
    (b,) = builds.resolve_builds(cfg, cache_dir=tmp_path / "cache").values()
    assert (b.kind, b.release, b.version) == ("wheel", "1.0", "1.0.post1")
    ov = build_source_overlay(
        b.release,
        b.tree,
        label=b.spec,
        source_id=b.resolved,
        stock_site_dir=b.env.site_dir,
        cache_root=tmp_path / "overlays",
    )
    assert list(ov.files) == ["sglang/a.py"]
    assert (ov.sglang_dir / "a.py").read_text() == "A = 3\n"


def test_a_resumed_run_must_resolve_to_the_same_builds(checkout, tmp_path):
    """A ref that moved (or ``latest`` that changed) since the run started refuses --resume."""
    from patchbench.run.preflight import check_environment
    from patchbench.runfolder import RunManifest

    cfg = load_config(write_cfg(tmp_path, f"{{git: {checkout}, ref: my-branch}}", "  a: []"))
    head = git(checkout, "rev-parse", "my-branch")
    same = RunManifest(builds={"a": {"resolved": head}})
    check_environment(cfg, resumed=same)
    moved = RunManifest(builds={"a": {"resolved": "0" * 40}})
    with pytest.raises(ConfigError, match=f"is {head} now and was 0000000000000000000000000000"):
        check_environment(cfg, resumed=moved)
