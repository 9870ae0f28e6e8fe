"""Helpers several test files share: git in a throw-away repository, a suite's context around a
server, the fake-suite config the run-folder lock and signal tests start, a nightly config."""

from __future__ import annotations

import os
import subprocess
import textwrap
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from patchbench.shims import SITE_DIR, stand_in_path
from patchbench.suite import SuiteContext


def git_run(repo: Path, *args: str) -> str:
    """``git -C repo ARGS`` with a fixed author and committer (no GIT_DIR from the caller's
    environment); its stdout as written. Raises CalledProcessError when git fails."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    env.pop("GIT_DIR", None)
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


def git(repo: Path, *args: str) -> str:
    """:func:`git_run`, its stdout stripped (a commit id, a branch name)."""
    return git_run(repo, *args).strip()


def suite_context(
    server: Any,
    out: Path,
    cache: Path,
    *,
    sglang_version: str = "",
    log: Callable[[str], Any] = print,
) -> SuiteContext:
    """A suite's context for the baseline's first repeat against ``server`` (a
    :class:`patchbench.suite.ServerInfo`), writing into ``out`` (made here) with ``cache``."""
    out.mkdir(parents=True, exist_ok=True)
    return SuiteContext(
        server=server,
        out_dir=out,
        run_dir=out.parent,
        cache_dir=cache,
        variant="baseline",
        repeat=0,
        baseline="baseline",
        sglang_version=sglang_version,
        python="python",
        stock_env={},
        variant_sglang_dir=out,
        stock_sglang_dir=out,
        device="cpu",
        log=log,
    )


def fake_suite_config(name: str, repeats: int, *, sglang: str, model: Path, port: int) -> str:
    """A config text of two variants (baseline, control) running the ``fake`` suite
    (tests/fake_server/fake_suites.py) against the fake server."""
    return textwrap.dedent(f"""\
        name: {name}
        sglang: "{sglang}"
        model: {{path: "{model}"}}
        server: {{port: {port}, ready_timeout_s: 30, stop_grace_s: 3}}
        variants:
          baseline: []
          control: []
        schedule: {{repeats: {repeats}}}
        suites:
          fake: {{n: 1}}
        """)


def write_nightly_config(folder: Path, name: str, nightly: dict, **extra: Any) -> Path:
    """``folder/<name>.yaml``: a config of two variants (baseline, patched) on the tiny model,
    no suites, the ``nightly`` section given and ``extra`` top-level keys; returns its path."""
    path = folder / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "sglang": "0.5.1.post3",
                "model": {"path": "/nonexistent", "tiny": True},
                "variants": {"baseline": [], "patched": []},
                "suites": {},
                "nightly": nightly,
                **extra,
            }
        )
    )
    return path


#: the runner that runs ``bench`` against the fake server (tests/fake_server/run_bench_fake.py)
FAKE_RUNNER = Path(__file__).parent / "fake_server" / "run_bench_fake.py"


def start_fake_run(cfg: Path, results: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    """``bench CFG`` into ``results`` against the fake server in a child process (``extra``
    arguments after them, e.g. ``--resume RUN``), stdout and stderr merged into one text pipe."""
    import sys

    return subprocess.Popen(
        [sys.executable, str(FAKE_RUNNER), str(cfg), str(results), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def json_digits(data: bytes, digits: int = 10) -> Any:
    """A JSON document with every float rounded to ``digits`` significant digits: compare.json's
    floats differ in their last bits between CPUs and scipy builds (the golden folders were
    recorded on another machine), which no reader sees; everything else compares exactly."""
    import json

    def walk(x: Any) -> Any:
        if isinstance(x, float):
            return float(f"{x:.{digits}g}")
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x

    return walk(json.loads(data))


#: the server flags the CPU configs use (configs/demo-cpu.yaml documents each)
CPU_SERVER_ARGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--max-total-tokens",
    "8192",
    "--mem-fraction-static",
    "0.05",
    "--disable-fast-image-processor",
    "--grammar-backend",
    "none",
]
CPU_SERVER_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "TORCHDYNAMO_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PATCHBENCH_CPU_STAND_INS": "1",
}


def sglang_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_server_env(extra_pythonpath: list[str] | None = None) -> dict[str, str]:
    """Environment of a CPU sglang server: stand-ins on PYTHONPATH (vllm only for 0.5.1.x)."""
    env = dict(os.environ)
    env.update(CPU_SERVER_ENV)
    names = ["sgl_kernel"] + (["vllm"] if (sglang_version() or "").startswith("0.5.1") else [])
    parts = (extra_pythonpath or []) + [str(SITE_DIR)] + [str(stand_in_path(n)) for n in names]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def toy_wheel(folder: Path, version: str) -> Path:
    """A pure-Python wheel of ``pbtoy`` ``version`` (pbtoy.VERSION is the version)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"pbtoy-{version}-py3-none-any.whl"
    info = f"pbtoy-{version}.dist-info"
    files = {
        "pbtoy/__init__.py": f'VERSION = "{version}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: pbtoy\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path
