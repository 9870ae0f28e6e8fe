"""The two in-server import hooks (sync_probe's mrope counters, profile's record_function ranges)
installed together: each finds the target through the finders after it, so both wrap the module
once and neither recurses into the other (a real server died with RecursionError before)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_both_hooks_wrap_the_target_once_each_in_either_order(tmp_path, monkeypatch):
    (tmp_path / "pb_hook_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mrope = _load(ROOT / "suites/sync_probe/instr/patchbench_mrope_instr.py", "pb_t_mrope")
    prof = _load(ROOT / "suites/profile/site/patchbench_profile_instr.py", "pb_t_prof")
    for first_mrope in (True, False):
        sys.modules.pop("pb_hook_target", None)
        calls: list[str] = []
        monkeypatch.setattr(prof, "TARGETS", {"pb_hook_target": "_pb_test_wrap"}, raising=True)
        monkeypatch.setattr(
            prof, "_pb_test_wrap", lambda m, c=calls: c.append("profile"), raising=False
        )
        hooks = [
            mrope.ImportHook(lambda m, c=calls: c.append("mrope"), target="pb_hook_target"),
            prof.ImportHook(),
        ]
        if not first_mrope:
            hooks.reverse()
        saved = list(sys.meta_path)
        try:
            sys.meta_path[:0] = hooks
            mod = importlib.import_module("pb_hook_target")
        finally:
            sys.meta_path[:] = saved
            sys.modules.pop("pb_hook_target", None)
        assert mod.VALUE == 1
        assert sorted(calls) == ["mrope", "profile"], (first_mrope, calls)
