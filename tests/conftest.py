"""Shared fixtures. The end-to-end fixtures start ONE real sglang server per session (CPU engine,
tiny random Qwen2.5-VL) and share it across tests, so `make test` stays within its time budget."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from patchbench.server import LaunchSpec, SglangServer, free_port  # noqa: E402
from patchbench.shims import SITE_DIR, stand_in_path  # noqa: E402
from patchbench.suite import ServerInfo  # noqa: E402

#: the server flags the CPU configs use (configs/demo-cpu.yaml documents each)
CPU_SERVER_ARGS = ["--device", "cpu", "--attention-backend", "torch_native",
                   "--max-total-tokens", "8192", "--mem-fraction-static", "0.05",
                   "--disable-fast-image-processor", "--grammar-backend", "none"]
CPU_SERVER_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "TORCHDYNAMO_DISABLE": "1", "HF_HUB_OFFLINE": "1",
                  "TRANSFORMERS_OFFLINE": "1", "PATCHBENCH_CPU_STAND_INS": "1"}


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


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen2.5-VL for this environment's transformers, built once (a few seconds)."""
    from patchbench.tinymodel import build_tiny_qwen25vl, default_model_dir
    return build_tiny_qwen25vl(default_model_dir())


@pytest.fixture(scope="session")
def cpu_server(tiny_model_dir, tmp_path_factory) -> ServerInfo:
    """A real stock sglang server (this environment's release) on the CPU, shared by the session."""
    if sglang_version() is None:
        pytest.skip("sglang is not installed in this environment")
    log = tmp_path_factory.mktemp("cpu_server") / "server.log"
    spec = LaunchSpec(python=sys.executable, model_path=str(tiny_model_dir), host="127.0.0.1",
                      port=free_port(), args=list(CPU_SERVER_ARGS), env=cpu_server_env(),
                      log_path=log, ready_timeout_s=300, stop_grace_s=15)
    srv = SglangServer(spec)
    srv.start()
    try:
        srv.wait_ready()
        yield ServerInfo(base_url=srv.base_url, host=spec.host, port=spec.port,
                         model_path=str(tiny_model_dir), tokenizer_path=str(tiny_model_dir),
                         log_path=log, pid=srv.pid, flush_cache=srv.flush_cache, alive=srv.alive)
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def mrope_methods():
    """{(release, "stock"|"patched"): MropeMethods} for 0.5.1.post3 and 0.5.23: the real mrope
    methods extracted from each forward_batch_info.py (patchbench.mrope), built once."""
    from patchbench.mrope import MropeMethods, release_sources
    out = {}
    for release in ("0.5.1.post3", "0.5.23"):
        for variant, path in release_sources(release).items():
            out[release, variant] = MropeMethods(path, f"{release}/{variant}")
    return out
