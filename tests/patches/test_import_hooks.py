"""The one way into the server: the site hook (patchbench/shims/site/sitecustomize.py) that imports
the suites' hook files named in PATCHBENCH_SERVER_HOOKS and chains to the next sitecustomize once,
and the loader beside it (patchbench_import_hook) that both hooks (sync_probe's mrope counters,
profile's record_function ranges) use. Each loader finder finds its target through the finders
after it, so both hooks wrap the module once and neither recurses into the other (a real server
died with RecursionError before)."""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

from patchbench.shims import HOOKS_ENV, SITE_DIR
from patchbench.suites import profile as profile_suite
from patchbench.suites import sync_probe as sync_probe_suite

ROOT = Path(__file__).resolve().parents[2]
MROPE_HOOK = sync_probe_suite.HOOK
PROFILE_HOOK = profile_suite.HOOK
FBI = "sglang.srt.model_executor.forward_batch_info"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def target(tmp_path, monkeypatch):
    """A fresh importable module ``pb_hook_target`` (a ForwardBatch with an mrope method) and the
    state to restore: sys.meta_path and the module's sys.modules entry."""
    (tmp_path / "pb_hook_target.py").write_text(
        "class ForwardBatch:\n"
        "    def _compute_mrope_positions(self, model_runner, batch):\n"
        "        self.mrope_positions = 'live'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(SITE_DIR))  # the hooks import the loader, as in the server
    saved = list(sys.meta_path)
    sys.modules.pop("pb_hook_target", None)
    yield "pb_hook_target"
    sys.meta_path[:] = saved
    sys.modules.pop("pb_hook_target", None)


@pytest.mark.parametrize("first", ["a", "b"])
def test_two_copies_of_the_loader_wrap_one_module_once_each(target, first):
    """Two finders of two separately loaded copies of the loader, in either order."""
    a = _load(SITE_DIR / "patchbench_import_hook.py", "pb_t_loader_a")
    b = _load(SITE_DIR / "patchbench_import_hook.py", "pb_t_loader_b")
    calls: list[str] = []
    order = [a, b] if first == "a" else [b, a]
    for loader in reversed(order):  # each goes first on sys.meta_path: `order[0]` ends first
        loader.wrap_on_import(target, lambda m, n=loader.__name__[-1]: calls.append(n))
    assert [type(f).__module__ for f in sys.meta_path[:2]] == [m.__name__ for m in order]
    mod = importlib.import_module(target)
    assert mod.ForwardBatch and sorted(calls) == ["a", "b"], calls
    # inner wraps run first: the finder after the first one wraps the real loader
    assert calls == [order[1].__name__[-1], order[0].__name__[-1]]


def test_wrap_on_import_runs_now_on_an_imported_module_and_installs_once(target):
    from patchbench_import_hook import WrapOnImport, wrap_on_import

    calls: list[str] = []

    def on_exec(module):
        calls.append(module.__name__)

    before = len(sys.meta_path)
    wrap_on_import(target, on_exec)
    wrap_on_import(target, on_exec)  # the same (target, fn): one finder
    assert len(sys.meta_path) == before + 1 and isinstance(sys.meta_path[0], WrapOnImport)
    importlib.import_module(target)
    assert calls == [target]
    wrap_on_import(target, on_exec)  # imported already: runs now, installs nothing
    assert calls == [target, target] and len(sys.meta_path) == before + 1


@pytest.mark.parametrize("first", ["mrope", "profile"])
def test_both_instrumentation_hooks_wrap_one_module_once_each(target, tmp_path, monkeypatch, first):
    """The sync probe's counter and the profiler's range on the same method, either one first:
    the method is wrapped by each exactly once, and a call goes through both."""
    pytest.importorskip("torch")
    monkeypatch.delenv("PATCHBENCH_MROPE_PROBE_DIR", raising=False)
    monkeypatch.delenv("PATCHBENCH_PROFILE_RANGES", raising=False)
    mrope = _load(MROPE_HOOK, "pb_t_mrope")
    prof = _load(PROFILE_HOOK, "pb_t_prof")
    monkeypatch.setattr(prof, "TARGETS", {target: prof.wrap_forward_batch})
    probe = tmp_path / "probe"
    activate = {
        "mrope": lambda: mrope.activate(str(probe), None, target=target),
        "profile": prof.activate,
    }
    for name in (first, *({"mrope", "profile"} - {first})):
        activate[name]()
        activate[name]()  # activating twice changes nothing
    mod = importlib.import_module(target)
    fn = mod.ForwardBatch._compute_mrope_positions
    chain = []
    while fn is not None:
        chain.append(fn.__qualname__)
        fn = getattr(fn, "__wrapped__", None)
    assert len(chain) == 3 and chain[-1] == "ForwardBatch._compute_mrope_positions", chain
    fb = mod.ForwardBatch()
    fb.forward_mode = types.SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False)
    fb.seq_lens = types.SimpleNamespace(shape=(2,))
    fb._compute_mrope_positions(None, types.SimpleNamespace(multimodal_inputs=[None, None]))
    assert fb.mrope_positions == "live"
    counts = json.loads(next(probe.glob("counts.*.json")).read_text())["counts"]
    assert counts["decode_calls"] == 1 and counts["calls"] == 1


def fake_sglang(root: Path) -> Path:
    """A fake ``sglang`` package whose forward_batch_info defines a tiny ForwardBatch (no torch)."""
    pkg = root / "sglang" / "srt" / "model_executor"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "forward_batch_info.py").write_text(
        "class ForwardBatch:\n"
        "    def _compute_mrope_positions(self, model_runner, batch):\n"
        "        self.mrope_positions = 'live'\n"
    )
    return root


def child(code: str, env: dict, pythonpath: list) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", **env, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.needs_sglang  # loads a release environment / torch
@pytest.mark.parametrize("order", ["mrope-first", "profile-first"])
def test_site_hook_imports_both_hooks_with_the_stand_ins(tmp_path, order):
    """In a server-like process (the site folder on PYTHONPATH, the hook files in
    PATCHBENCH_SERVER_HOOKS): the CPU stand-ins are on, and both hooks wrap sglang's mrope method,
    whichever is named first."""
    pkg = fake_sglang(tmp_path / "pkg")
    hooks = [MROPE_HOOK, PROFILE_HOOK] if order == "mrope-first" else [PROFILE_HOOK, MROPE_HOOK]
    code = (
        "import sys, torch, types\n"
        "from sglang.srt.model_executor import forward_batch_info as m\n"
        "fn, n = m.ForwardBatch._compute_mrope_positions, 0\n"
        "while hasattr(fn, '__wrapped__'):\n"
        "    fn, n = fn.__wrapped__, n + 1\n"
        "fb = m.ForwardBatch()\n"
        "fb.forward_mode = types.SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False)\n"
        "fb.seq_lens = types.SimpleNamespace(shape=(2,))\n"
        "fb._compute_mrope_positions(None, types.SimpleNamespace(multimodal_inputs=[None, None]))\n"
        "print(n, 'sgl_kernel' in torch.ops.__dict__, fb.mrope_positions,\n"
        "      sorted(k for k in sys.modules if k.startswith('patchbench')))\n"
    )
    env = {
        HOOKS_ENV: os.pathsep.join(map(str, hooks)),
        "PATCHBENCH_MROPE_PROBE_DIR": str(tmp_path / "probe"),
        "PATCHBENCH_PROFILE_RANGES": "1",
        "PATCHBENCH_CPU_STAND_INS": "1",
    }
    proc = child(code, env, [SITE_DIR, pkg])
    assert proc.returncode == 0, proc.stderr
    # two wrappers; the server never imports the patchbench package, only the hook modules
    assert proc.stdout.strip().split(maxsplit=3) == [
        "2",
        "True",
        "live",
        "['patchbench_import_hook', 'patchbench_mrope_instr', 'patchbench_profile_instr']",
    ]
    counts = json.loads(next((tmp_path / "probe").glob("counts.*.json")).read_text())["counts"]
    assert counts["decode_calls"] == 1


def test_site_hook_without_the_variable_imports_no_hook(tmp_path):
    code = "import sys; print(sorted(k for k in sys.modules if k.startswith('patchbench')))"
    proc = child(code, {"PATCHBENCH_MROPE_PROBE_DIR": str(tmp_path)}, [SITE_DIR])
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_a_broken_hook_is_reported_and_the_others_still_load(tmp_path):
    broken = tmp_path / "pb_broken_hook.py"
    broken.write_text("raise RuntimeError('boom')\n")
    fine = tmp_path / "pb_fine_hook.py"
    fine.write_text("LOADED = True\n")
    code = "import sys; print('pb_broken_hook' in sys.modules, sys.modules['pb_fine_hook'].LOADED)"
    proc = child(code, {HOOKS_ENV: f"{broken}{os.pathsep}{fine}"}, [SITE_DIR])
    assert proc.returncode == 0 and proc.stdout.split() == ["False", "True"], proc.stderr
    assert f"patchbench site hook: importing {broken} failed" in proc.stderr
    assert "RuntimeError: boom" in proc.stderr


def test_site_hook_chains_to_the_next_sitecustomize_exactly_once(tmp_path):
    """The site hook and a harness-style sitecustomize that chains to ANY other one (even one
    before it on the path), in either order: both run, each once, and nothing loops."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os, sys\n"
        "open(os.environ['LOG'], 'a').write('other\\n')\n"
        "here = os.path.dirname(os.path.abspath(__file__))\n"
        "import importlib.util\n"
        "for e in sys.path:\n"
        "    if e and os.path.abspath(e) != here and os.path.isfile(os.path.join(e, 'sitecustomize.py')):\n"
        "        s = importlib.util.spec_from_file_location('_n', os.path.join(e, 'sitecustomize.py'))\n"
        "        m = importlib.util.module_from_spec(s); s.loader.exec_module(m); break\n"
    )
    ours = tmp_path / "pb_logging_hook.py"
    ours.write_text("import os\nopen(os.environ['LOG'], 'a').write('hook\\n')\n")
    log = tmp_path / "log"
    for order in ([SITE_DIR, other], [other, SITE_DIR]):
        log.write_text("")
        proc = child("print('ran')", {"LOG": str(log), HOOKS_ENV: str(ours)}, order)
        assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr
        assert sorted(log.read_text().split()) == ["hook", "other"], (order, log.read_text())


@pytest.mark.needs_sglang  # loads a release environment / torch
def test_hook_files_and_the_site_folder_are_package_data():
    """Every file the server imports (the site folder, the suites' hook files) is installed."""
    from setuptools.config.pyprojecttoml import read_configuration

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tool = read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]
    data = tool["package-data"]
    where = {"patchbench.shims": ROOT / "patchbench/shims"}
    where |= {
        f"patchbench.suites.{n}": ROOT / "patchbench" / "suites" / n
        for n in ("sync_probe", "profile")
    }
    files = [*SITE_DIR.glob("*.py"), MROPE_HOOK, PROFILE_HOOK]
    assert len(files) == 4
    for f in files:
        pkg = next(p for p, d in where.items() if d in f.parents)
        rel = f.relative_to(where[pkg]).as_posix()
        pats = data.get(pkg, [])
        # setuptools globs: "**/" also matches no folder
        assert any(
            fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.replace("**/", "")) for p in pats
        ), f"{rel} of {pkg} is not package data: {pats}"
