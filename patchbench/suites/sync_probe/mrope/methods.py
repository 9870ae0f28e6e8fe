"""sglang's mrope position methods run outside sglang: the ``ForwardBatch`` methods whose name
contains ``mrope``, extracted with :mod:`ast` from a ``forward_batch_info.py`` (stock or patched,
any release) and run against stand-ins (:mod:`.cases`): importing the real module needs the whole
sglang package, which a lent GPU machine does not have (docs/FACTS.md section 1).
"""

from __future__ import annotations

import ast
import builtins
import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from .cases import MropeCase, StandInMode, stand_in_globals


class MropeSourceError(RuntimeError):
    """A forward_batch_info.py source could not be found, fetched, patched or executed."""


def _free_names(nodes: Sequence[ast.AST]) -> set[str]:
    """Global names the nodes read at run time (annotations excluded: they stay strings)."""
    import copy

    loaded, stored = set(), set()
    for node in nodes:
        node = copy.deepcopy(node)
        for sub in ast.walk(node):
            if isinstance(sub, ast.arg):
                sub.annotation = None
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sub.returns = None
            elif isinstance(sub, ast.AnnAssign):
                sub.annotation = ast.Constant(None)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                (loaded if isinstance(sub.ctx, ast.Load) else stored).add(sub.id)
            elif isinstance(sub, ast.arg):
                stored.add(sub.arg)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stored.add(sub.name)
    return loaded - stored - set(dir(builtins))


def extract_mrope_nodes(
    source: str, filename: str = "<forward_batch_info.py>", class_name: str = "ForwardBatch"
) -> list[ast.FunctionDef]:
    """The ``FunctionDef`` nodes (decorators included) of ``class_name``'s methods whose name
    contains ``mrope``. Raises :class:`MropeSourceError` when the class or the methods are absent."""
    tree = ast.parse(source, filename=filename)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            found = [n for n in node.body if isinstance(n, ast.FunctionDef) and "mrope" in n.name]
            if not any(n.name == "_compute_mrope_positions" for n in found):
                raise MropeSourceError(f"{filename}: {class_name} has no _compute_mrope_positions")
            return found
    raise MropeSourceError(f"{filename}: no class {class_name}")


def compile_methods(
    nodes: Sequence[ast.FunctionDef], filename: str, namespace: dict[str, Any]
) -> dict[str, Callable]:
    """Execute the method nodes (under ``from __future__ import annotations``) with ``namespace`` as
    their globals; ``{name: function}``, tracebacks at the original file's lines."""
    future = ast.ImportFrom(module="__future__", names=[ast.alias(name="annotations")], level=0)
    module = ast.Module(body=[future, *nodes], type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, filename, "exec"), namespace)
    return {n.name: namespace[n.name] for n in nodes}


class MropeMethods:
    """The mrope methods of one ``forward_batch_info.py`` (a path or its source), runnable with
    stand-ins: :meth:`compute` runs ``_compute_mrope_positions`` on a stand-in ForwardBatch and
    returns ``mrope_positions``. MropeSourceError when a method references a name no stand-in covers."""

    def __init__(self, source: str | Path, label: str = ""):
        if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source):
            filename = str(source)
            text = Path(source).read_text()
        else:
            filename, text = f"<{label or 'source'}>", source
        self.label = label or filename
        self.filename = filename
        self.sha256 = hashlib.sha256(text.encode()).hexdigest()
        nodes = extract_mrope_nodes(text, filename)
        self.state = SimpleNamespace(rl_on_policy_target=None)
        namespace = stand_in_globals(self.state)
        missing = _free_names(nodes) - set(namespace)
        if missing:
            raise MropeSourceError(
                f"{filename}: the mrope methods reference {sorted(missing)}, "
                "for which the sync_probe stand-ins have none"
            )
        self.methods = compile_methods(nodes, filename, namespace)
        self.forward_batch_cls = type("ForwardBatchStandIn", (), dict(self.methods))
        self.split_decode = "_compute_mrope_positions_decode" in self.methods

    def make_forward_batch(self, case: MropeCase) -> Any:
        """A stand-in ForwardBatch holding the case's ``forward_mode``, ``seq_lens`` and
        ``seq_lens_cpu`` (mrope_positions None)."""
        fb = self.forward_batch_cls()
        fb.forward_mode = StandInMode(case.mode)
        fb.seq_lens = case.seq_lens
        fb.seq_lens_cpu = case.seq_lens_cpu
        fb.mrope_positions = None
        return fb

    def compute(self, case: MropeCase) -> torch.Tensor:
        """Run ``_compute_mrope_positions(model_runner, batch)`` for ``case``; returns the
        resulting ``mrope_positions`` (whatever the method left there). Errors propagate."""
        fb = self.make_forward_batch(case)
        self.state.rl_on_policy_target = case.rl_on_policy_target
        fb._compute_mrope_positions(case.model_runner(), case.batch())
        return fb.mrope_positions


def run_outcome(methods: MropeMethods, case: MropeCase) -> tuple[str, Any]:
    """``("ok", positions)`` or ``("error", "<ExceptionType>: <message>")`` of one call."""
    try:
        return "ok", methods.compute(case.fresh())
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return "error", f"{type(exc).__name__}: {exc}"
