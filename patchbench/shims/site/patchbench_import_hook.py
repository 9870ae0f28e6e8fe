"""Run a function on a module right after it is imported: the suites' in-server hooks
(``Instrumentation.hooks``) call :func:`wrap_on_import` to patch an sglang module in every server
process. Standard library only (the server need not import ``patchbench``)."""

from __future__ import annotations

import importlib.abc
import sys


class _WrappingLoader(importlib.abc.Loader):
    """The real loader, then ``on_exec(module)`` once the module has executed."""

    def __init__(self, inner, on_exec):
        self._inner, self._on_exec = inner, on_exec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._on_exec(module)

    def __getattr__(self, name):  # get_source, get_filename, ... of the real loader
        return getattr(self._inner, name)


class WrapOnImport(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder for one module: it finds the module with the finders after
    itself (so two of these wrap the same module once each, without recursion) and runs
    ``on_exec(module)`` after the module executes."""

    def __init__(self, target: str, on_exec):
        self.target, self.on_exec = target, on_exec

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        try:
            rest = sys.meta_path[sys.meta_path.index(self) + 1 :]
        except ValueError:
            rest = [f for f in sys.meta_path if f is not self]
        for finder in rest:
            if not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _WrappingLoader(spec.loader, self.on_exec)
                return spec
        return None


def wrap_on_import(target: str, on_exec) -> None:
    """Run ``on_exec(module)`` on module ``target`` now when it is imported already, else right
    after it executes (installed once per ``(target, on_exec)``); ``on_exec`` should be safe to
    run twice on one module; its exceptions propagate to the importer."""
    if target in sys.modules:
        on_exec(sys.modules[target])
        return
    for f in sys.meta_path:
        if isinstance(f, WrapOnImport) and (f.target, f.on_exec) == (target, on_exec):
            return
    sys.meta_path.insert(0, WrapOnImport(target, on_exec))
