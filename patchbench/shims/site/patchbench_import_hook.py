"""Run a function on a module right after it is imported (the loader of the in-server hooks).

The hook modules that suites declare (``Instrumentation.hooks``, imported by ``sitecustomize.py``
beside this file) call :func:`wrap_on_import` to patch an sglang module in every server process,
whether it is imported before or after them. Standard library only: it sits on the server's
PYTHONPATH (this folder), so the server's processes need not be able to import ``patchbench``.
"""

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
    """A ``sys.meta_path`` finder for one module name: it finds the module with the finders after
    itself and runs ``on_exec(module)`` after the module executes.

    Looking only at the finders after itself lets two of these (two suites' hooks, or two copies
    of this module) wrap the same module: the first finds the spec through the second, each
    wraps the loader once, and neither asks the other back (no recursion).
    """

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
    """Run ``on_exec(module)`` on module ``target`` (a dotted name): now when it is already in
    ``sys.modules``, else right after it executes (a :class:`WrapOnImport` put first on
    ``sys.meta_path``; the same ``(target, on_exec)`` is installed once). ``on_exec`` should be
    safe to run twice on one module (a module imported again after being dropped from
    ``sys.modules`` executes again). Exceptions of ``on_exec`` propagate to the importer."""
    if target in sys.modules:
        on_exec(sys.modules[target])
        return
    for f in sys.meta_path:
        if isinstance(f, WrapOnImport) and (f.target, f.on_exec) == (target, on_exec):
            return
    sys.meta_path.insert(0, WrapOnImport(target, on_exec))
