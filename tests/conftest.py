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

from patchbench.run.ports import free_port  # noqa: E402
from patchbench.run.server import LaunchSpec, SglangServer  # noqa: E402
from patchbench.suite import ServerInfo  # noqa: E402
from tests.helpers import CPU_SERVER_ARGS, cpu_server_env, sglang_version  # noqa: E402

# ------------------------------------------------------------------ tests that need sglang
#: test modules that need the sglang environment (sglang, torch, transformers) in every test; they
#: are marked needs_sglang (deselected by the pull-request workflow's `-m "not needs_sglang"`)
NEEDS_SGLANG_MODULES = {
    "test_bench_runner.py",
    "test_e2e_bench.py",
    "test_mmmu_e2e.py",
    "test_mrope_equivalence.py",
    "test_mrope_instr.py",
    "test_mrope_nosync.py",
    "test_overlay.py",
    "test_patchset.py",
    "test_signals.py",
    "test_suite_contract.py",
    "test_sync_probe.py",
}
#: fixtures that need the sglang environment: a test using one is marked needs_sglang
NEEDS_SGLANG_FIXTURES = {"cpu_server", "tiny_model_dir", "mrope_methods"}
#: test modules that need the network unless its cache is filled (a release's wheel from PyPI)
NEEDS_NETWORK_MODULES = {"test_mrope_equivalence.py", "test_patchset.py", "test_sync_probe.py"}
#: set by `make test` (scripts/run_tests.sh): a missing sglang is an error there, never a skip
REQUIRE_SGLANG_ENV = "PATCHBENCH_REQUIRE_SGLANG"


def have_sglang() -> bool:
    """Whether this interpreter can import sglang (without importing it)."""
    import importlib.util

    return importlib.util.find_spec("sglang") is not None


#: what a module that needs the sglang environment fails to import where it is missing
SGLANG_ENVIRONMENT = {"sglang", "torch", "transformers", "sgl_kernel", "vllm", "triton"}


class _ModuleNeedingSglang(pytest.Module):
    """Without sglang: a test module whose import fails for want of the sglang environment is
    skipped as a whole, with the reason (shown by ``-rs``); any other import error stays one."""

    def _getobj(self):
        try:
            return super()._getobj()
        except pytest.Collector.CollectError as e:
            cause = e.__cause__
            missing = getattr(cause, "name", None) or (
                cause.args[0] if cause and cause.args else ""
            )
            if isinstance(cause, ImportError) and str(missing).split(".")[0] in SGLANG_ENVIRONMENT:
                raise pytest.skip.Exception(
                    f"{self.path.name} needs the sglang environment ({missing} is not installed)",
                    allow_module_level=True,
                ) from None
            raise


def pytest_pycollect_makemodule(module_path, parent):
    if have_sglang():
        return None
    return _ModuleNeedingSglang.from_parent(parent, path=module_path)


def pytest_configure(config):
    if os.environ.get(REQUIRE_SGLANG_ENV) == "1" and not have_sglang():
        raise pytest.UsageError(
            f"{REQUIRE_SGLANG_ENV}=1 but sglang is not importable by {sys.executable}: "
            "`make test` runs the tests that need sglang; run `make setup` first"
        )


def pytest_report_header(config):
    if have_sglang():
        return f"sglang {sglang_version()}: the needs_sglang tests run"
    return (
        "sglang is not installed: the needs_sglang tests are skipped, and so are test modules "
        "that cannot be imported without it (-rs lists them)"
    )


def pytest_collection_modifyitems(config, items):
    """Mark needs_sglang (by module, fixture or e2e) and network (by module); without sglang,
    skip the needs_sglang tests with a reason. Deselect the calibration tests unless ``-m``
    names calibration (``make test-calibration``)."""
    if "calibration" not in (config.option.markexpr or ""):
        slow = [i for i in items if i.get_closest_marker("calibration")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [i for i in items if not i.get_closest_marker("calibration")]
    skip = pytest.mark.skip(reason="needs sglang, which is not installed here")
    present = have_sglang()
    for item in items:
        name = item.path.name
        if name in NEEDS_NETWORK_MODULES:
            item.add_marker(pytest.mark.network)
        if (
            name in NEEDS_SGLANG_MODULES
            or NEEDS_SGLANG_FIXTURES & set(getattr(item, "fixturenames", ()))
            or item.get_closest_marker("e2e")
        ):
            item.add_marker(pytest.mark.needs_sglang)
            if not present:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny Qwen2.5-VL for this environment's transformers, built once (a few seconds)."""
    from patchbench.envs.tinymodel import build_tiny_qwen25vl, default_model_dir

    return build_tiny_qwen25vl(default_model_dir())


@pytest.fixture(scope="session")
def cpu_server(tiny_model_dir, tmp_path_factory) -> ServerInfo:
    """A real stock sglang server (this environment's release) on the CPU, shared by the session."""
    if sglang_version() is None:
        pytest.skip("sglang is not installed in this environment")
    log = tmp_path_factory.mktemp("cpu_server") / "server.log"
    spec = LaunchSpec(
        python=sys.executable,
        model_path=str(tiny_model_dir),
        host="127.0.0.1",
        port=free_port(),
        args=list(CPU_SERVER_ARGS),
        env=cpu_server_env(),
        log_path=log,
        ready_timeout_s=300,
        stop_grace_s=15,
    )
    srv = SglangServer(spec)
    srv.start()
    try:
        srv.wait_ready()
        yield ServerInfo(
            base_url=srv.base_url,
            host=spec.host,
            port=spec.port,
            model_path=str(tiny_model_dir),
            tokenizer_path=str(tiny_model_dir),
            log_path=log,
            pid=srv.pid,
            flush_cache=srv.flush_cache,
            alive=srv.alive,
        )
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def mrope_methods():
    """{(release, "stock"|"patched"): MropeMethods} for 0.5.1.post3 and 0.5.23: the real mrope
    methods extracted from each forward_batch_info.py (patchbench.suites.sync_probe.mrope), built once."""
    from patchbench.suites.sync_probe.mrope import MropeMethods
    from tools.mrope_sources import release_sources

    out = {}
    for release in ("0.5.1.post3", "0.5.23"):
        for variant, path in release_sources(release).items():
            out[release, variant] = MropeMethods(path, f"{release}/{variant}")
    return out


# ------------------------------------------------------------------ the real demo runs
#: the 0.5.23 environment (make setup SGLANG=0.5.23; make test sets it up)
VENV_0523 = REPO / ".venv-0.5.23" / "bin" / "python"


def run_bench_cli(python: str, config: str, results: Path, *extra: str):
    """``runner.py bench CONFIG --results RESULTS EXTRA`` with ``python``; the CompletedProcess."""
    import subprocess

    return subprocess.run(
        [python, str(REPO / "runner.py"), "bench", config, "--results", str(results), *extra],
        cwd=REPO,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        capture_output=True,
        text=True,
        timeout=3000,
    )


def _demo_run(python: str, config: str, results: Path, *extra: str) -> Path:
    p = run_bench_cli(python, config, results, *extra)
    print(p.stdout[-4000:], p.stderr[-4000:])
    assert p.returncode == 0, p.stderr[-3000:]
    (run_dir,) = [d for d in results.iterdir() if (d / "manifest.json").exists()]
    return run_dir


@pytest.fixture(scope="session")
def demo_0513(tmp_path_factory) -> Path:
    """The run folder of configs/demo-cpu.yaml on real 0.5.1.post3 servers (this environment),
    run once a session (about 9 server launches)."""
    return _demo_run(sys.executable, "configs/demo-cpu.yaml", tmp_path_factory.mktemp("demo-0513"))


@pytest.fixture(scope="session")
def demo_0523(tmp_path_factory) -> Path:
    """The run folder of configs/demo-cpu-0.5.23.yaml on real 0.5.23 servers (.venv-0.5.23's
    python), run once a session (4 server launches)."""
    if not VENV_0523.exists():
        pytest.fail(f"{VENV_0523} missing: run `make setup SGLANG=0.5.23` (make test does)")
    results = tmp_path_factory.mktemp("demo-0523")
    return _demo_run(str(VENV_0523), "configs/demo-cpu-0.5.23.yaml", results)


@pytest.fixture(scope="session")
def capacity_cpu(tmp_path_factory) -> Path:
    """The run folder of configs/capacity-cpu.yaml on real 0.5.1.post3 servers (this
    environment): a capacity search, 2 rounds of 2 arms, run once a session (4 server launches).
    PATCHBENCH_E2E_PORT, when set, replaces the config's port (a machine whose other runs hold
    it)."""
    port = os.environ.get("PATCHBENCH_E2E_PORT")
    results = tmp_path_factory.mktemp("capacity-cpu")
    extra = ["--port", port] if port else []
    return _demo_run(sys.executable, "configs/capacity-cpu.yaml", results, *extra)


# ------------------------------------------------------------------ a lost server never stops the session
@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A :class:`patchbench.run.liveness.ServerLost` that escapes a test (a watchdog that fired where
    the test expected none, e.g. a heartbeat slower than a short stall limit on a loaded machine)
    fails that test. ServerLost is a KeyboardInterrupt (it must cancel a suite from a signal
    handler), which pytest would otherwise take as Ctrl-C and end the whole session with."""
    from patchbench.run.liveness import ServerLost

    try:
        return (yield)
    except ServerLost as e:
        try:
            why = str(e)
        except Exception:  # noqa: BLE001 - a malformed reason still fails the test, never the session
            why = repr(e.args)
        raise AssertionError(f"the server watch fired unexpectedly: {why}") from None
