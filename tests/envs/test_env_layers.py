"""Environments made for an sglang no environment here has (patchbench.envs.layers): the server
requirements by rule, and a real layer over a base venv, offline: pip resolves against local
wheels of a toy package (pbtoy), so the test needs neither the network nor sglang."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from patchbench.envs import envinfo, layers
from patchbench.errors import EnvironmentNotReady
from tests.helpers import toy_wheel


def test_server_requirements_keep_the_servers_and_leave_cuda_out_by_rule():
    declared = [
        "aiohttp",
        "numpy<3,>=1.2",
        'torch==2.8.0; extra == "srt"',
        'pytest; extra == "test"',
        'xformers; extra == "blackwell"',
        "flashinfer_python==0.5.3",
        "sgl-kernel==0.3.19",
        "nvidia-cutlass-dsl==4.2.1",
        "cuda-python",
        "torchaudio==2.9.1",
        'pywin32; sys_platform == "win32"',
        "not a requirement ((",
    ]
    assert layers.server_requirements(declared, cpu=True) == [
        "aiohttp",
        "numpy<3,>=1.2",
        "torch==2.8.0",
    ]
    assert layers.server_requirements(declared, cpu=False) == [
        "aiohttp",
        "cuda-python",
        "flashinfer-python==0.5.3",
        "numpy<3,>=1.2",
        "nvidia-cutlass-dsl==4.2.1",
        "sgl-kernel==0.3.19",
        "torch==2.8.0",
        "torchaudio==2.9.1",
    ]


def test_the_key_follows_the_set_not_its_order():
    a = layers.layer_key(["b", "a"], "0.5.6")
    assert a == layers.layer_key(["a", "b"], "0.5.6")
    assert a != layers.layer_key(["a", "b", "c"], "0.5.6") != layers.layer_key(["a", "b"], None)


def run_py(python: str, code: str) -> str:
    return subprocess.run(
        [python, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def base_env(tmp_path, monkeypatch) -> envinfo.Environment:
    """A venv holding pbtoy 1.0 and an sglang 9.0 dist-info, seeing this interpreter's packages
    (pip among them) through a .pth file; pip offline, finding only tmp_path/wheels."""
    wheels = tmp_path / "wheels"
    toy_wheel(wheels, "1.0")
    toy_wheel(wheels, "2.0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_CONSTRAINT", "")
    venv = tmp_path / "base"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = Path(run_py(python, "import sysconfig; print(sysconfig.get_path('purelib'))"))
    here = run_py(sys.executable, "import sysconfig; print(sysconfig.get_path('purelib'))")
    (site / "zz_here.pth").write_text(here + "\n")
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--prefix", str(venv), "pbtoy==1.0"],
        check=True,
    )
    (site / "sglang").mkdir()
    (site / "sglang" / "__init__.py").write_text("")
    info = site / "sglang-9.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.0\n")
    return envinfo.Environment(venv, python, "9.0", site, requires=("pbtoy==1.0",))


def test_a_layer_installs_only_what_differs_shadows_the_base_and_is_made_once(base_env, tmp_path):
    declared = ["pbtoy==2.0", "packaging", 'flashinfer_python==0.5.3; extra == "srt"']
    plan = layers.plan_layer(
        "sglang: git:x@main", declared, None, cpu=True, envs=[base_env], root=tmp_path / "envs"
    )
    assert plan.base == base_env
    assert plan.server == ["packaging", "pbtoy==2.0"]  # flashinfer left out on the CPU
    assert plan.install == [("pbtoy", "2.0")]  # packaging: the base has it
    assert (
        plan.download_bytes == (tmp_path / "wheels" / "pbtoy-2.0-py3-none-any.whl").stat().st_size
    )
    assert "1 package(s) that differ" in plan.describe() and "pbtoy 2.0" in plan.describe()

    lines: list[str] = []
    env = layers.make_layer(plan, log=lines.append)
    assert env.venv == plan.dest and env.sglang == "9.0"  # a source build: the base's release
    assert lines[0].startswith("making sglang: git:x@main: an environment made over")
    assert re.fullmatch(rf"made {re.escape(str(plan.dest))} in \d+ s, \d+ (kB|MB)", lines[-1])
    # the layer's pbtoy shadows the base's; what only the base has stays importable
    assert run_py(env.python, "import pbtoy; print(pbtoy.VERSION)") == "2.0"
    assert run_py(base_env.python, "import pbtoy; print(pbtoy.VERSION)") == "1.0"
    code = "import importlib.metadata as m; print(m.version('pbtoy'), m.version('sglang'))"
    assert run_py(env.python, code) == "2.0 9.0"
    own = sum(f.stat().st_size for f in plan.dest.rglob("*") if f.is_file())
    assert own < 2_000_000  # the layer holds pbtoy, not the base's packages

    # found by the one finder afterwards, by its declared dependencies
    found = envinfo.environment_for(None, requires=declared, venvs=[plan.dest], current=False)
    assert found is not None and found.venv == plan.dest
    again: list[str] = []
    assert layers.make_layer(plan, log=again.append).venv == plan.dest and again == []


def test_a_set_pip_cannot_resolve_is_refused_with_pips_words(base_env, tmp_path):
    with pytest.raises(EnvironmentNotReady) as e:
        layers.plan_layer(
            "sglang 9.1", ["pbtoy==3.0"], None, cpu=True, envs=[base_env], root=tmp_path
        )
    assert "sglang 9.1: pip cannot resolve its declared dependencies" in str(e.value)
    assert "pbtoy==3.0" in str(e.value)
