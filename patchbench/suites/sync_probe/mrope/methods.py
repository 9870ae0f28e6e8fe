"""sglang's mrope position methods run outside sglang: the ``ForwardBatch`` methods whose name
contains ``mrope``, extracted with :mod:`ast` from a ``forward_batch_info.py`` (stock or patched,
any release; importing the real module needs the whole sglang package, which a lent GPU machine
does not have: docs/FACTS.md section 1), run on one call's inputs (:class:`MropeCase`, random
decode batches) against stand-ins for what they reference outside their own bodies (sglang's
``ForwardMode``, ``MultimodalInputs``, ``MRotaryEmbedding``, helpers: :func:`stand_in_globals`).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch


class StandInMode:
    """Stand-in for sglang's ``ForwardMode``: ``"decode"`` or ``"extend"``."""

    def __init__(self, name: str):
        if name not in ("decode", "extend"):
            raise ValueError(f"mode must be decode or extend, not {name!r}")
        self.name = name

    def is_decode(self) -> bool:
        return self.name == "decode"

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        return self.name == "extend"

    def __repr__(self) -> str:
        return f"ForwardMode.{self.name.upper()}"


@dataclass
class StandInMultimodalInputs:
    """The fields of sglang's ``MultimodalInputs`` the mrope methods read: mrope_position_delta (CPU
    int64, usually ``[1, 1]``), mrope_positions (``[3, prompt_len]`` or None), and the cache
    0.5.23 fills."""

    mrope_position_delta: torch.Tensor
    mrope_positions: torch.Tensor | None = None
    mrope_position_delta_repeated_cache: torch.Tensor | None = None


class _StandInMRotaryEmbedding:
    @staticmethod
    def get_next_input_positions(
        mrope_position_delta: int, context_len: int, seq_len: int
    ) -> torch.Tensor:
        """As sglang 0.5.1.post3's ``MRotaryEmbedding.get_next_input_positions`` defines it:
        int64 ``[3, seq_len - context_len]``, every row ``context_len + delta .. seq_len + delta - 1``."""
        row = torch.arange(
            context_len + mrope_position_delta, seq_len + mrope_position_delta, dtype=torch.int64
        )
        return row.unsqueeze(0).repeat(3, 1)


def _flatten_nested_list(value: Any) -> list:
    """Depth-first flattening of nested lists (sglang.srt.utils.flatten_nested_list's contract)."""
    if isinstance(value, list):
        return [leaf for item in value for leaf in _flatten_nested_list(item)]
    return [value]


def stand_in_globals(state: SimpleNamespace) -> dict[str, Any]:
    """The names the extracted methods may reference: ``typing``'s and the stand-ins;
    ``state.rl_on_policy_target`` is what ``get_exec().deterministic.rl_on_policy_target`` returns
    (0.5.23 reads it)."""
    import typing

    names: dict[str, Any] = {name: getattr(typing, name) for name in typing.__all__}
    names.update(
        torch=torch,
        MRotaryEmbedding=_StandInMRotaryEmbedding,
        flatten_nested_list=_flatten_nested_list,
        get_exec=lambda: SimpleNamespace(
            deterministic=SimpleNamespace(rl_on_policy_target=state.rl_on_policy_target)
        ),
        is_pin_memory_available=lambda: torch.cuda.is_available(),
        ForwardMode=StandInMode,
        MultimodalInputs=StandInMultimodalInputs,
    )
    return names


@dataclass
class MropeCase:
    """One call's inputs, shared by both releases' stand-ins.

    mode: "decode" | "extend". seq_lens: int tensor [B] on the target device (one step ahead of
    seq_lens_cpu in overlap mode); seq_lens_cpu: int64 CPU [B]; mm_inputs: B entries, None for a
    text-only request; extend_seq_lens / extend_prefix_lens: B ints (extend only); sessions: per
    request (0.5.23 extend); device: the model runner's ("cpu", "cuda", "meta")."""

    mode: str
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    mm_inputs: list
    device: str = "cpu"
    extend_seq_lens: list[int] | None = None
    extend_prefix_lens: list[int] | None = None
    sessions: list | None = None
    rl_on_policy_target: Any = None

    def model_runner(self) -> SimpleNamespace:
        return SimpleNamespace(device=self.device)

    def batch(self) -> SimpleNamespace:
        """The ScheduleBatch / ModelWorkerBatch stand-in (0.5.1.post3 and 0.5.23 field names)."""
        n = len(self.mm_inputs)
        return SimpleNamespace(
            multimodal_inputs=self.mm_inputs,
            extend_seq_lens=self.extend_seq_lens,
            extend_prefix_lens=self.extend_prefix_lens,
            extend_lens=self.extend_seq_lens,
            prefix_lens=self.extend_prefix_lens,
            reqs=[SimpleNamespace(session=s) for s in (self.sessions or [None] * n)],
            spec_info=None,
        )

    def fresh(self) -> MropeCase:
        """A copy whose multimodal inputs are new objects (0.5.23 caches into them)."""
        return dataclasses.replace(
            self,
            mm_inputs=[
                None
                if m is None
                else dataclasses.replace(m, mrope_position_delta_repeated_cache=None)
                for m in self.mm_inputs
            ],
        )

    def on(self, seq_device: str, device: str | None = None) -> MropeCase:
        """The same case with ``seq_lens`` moved to ``seq_device`` (``meta``: shape only) and the
        runner's device set to ``device`` (default ``seq_device``)."""
        seq = (
            torch.empty_like(self.seq_lens, device="meta")
            if seq_device == "meta"
            else self.seq_lens.to(seq_device)
        )
        return dataclasses.replace(self.fresh(), seq_lens=seq, device=device or seq_device)


def decode_case(
    rng: torch.Generator | int,
    batch_size: int,
    *,
    image_share: float = 0.5,
    multi_value_share: float = 0.0,
    ahead: bool = False,
    precomputed_share: float = 0.0,
    seq_dtype: torch.dtype = torch.int64,
    device: str = "cpu",
) -> MropeCase:
    """A seeded random decode batch: image requests get a ``[1, 1]`` delta in [-4000, 4000] or,
    with probability ``multi_value_share``, a ``[1, k]`` one (k 2..3); ``precomputed_share`` of them
    carry positions covering the whole sequence (0.5.23's precomputed branch). seq_lens_cpu in
    1..4096; ``ahead``: seq_lens = seq_lens_cpu + 1 (overlap mode)."""
    g = rng if isinstance(rng, torch.Generator) else torch.Generator().manual_seed(int(rng))

    def rand(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    seq_cpu = torch.randint(1, 4097, (batch_size,), generator=g, dtype=torch.int64)
    mm = []
    for i in range(batch_size):
        if float(torch.rand(1, generator=g)) >= image_share:
            mm.append(None)
            continue
        s = int(seq_cpu[i])
        k = rand(2, 3) if float(torch.rand(1, generator=g)) < multi_value_share else 1
        delta = torch.randint(-4000, 4001, (1, k), generator=g)
        if rand(0, 9) == 0:
            delta.zero_()
        if float(torch.rand(1, generator=g)) < precomputed_share:
            positions = torch.randint(0, 5000, (3, s + rand(0, 3)), generator=g)
        elif s > 1 and rand(0, 4):
            positions = torch.randint(0, 5000, (3, rand(1, s - 1)), generator=g)
        else:
            positions = None
        mm.append(StandInMultimodalInputs(delta, positions))
    seq = (seq_cpu + 1 if ahead else seq_cpu).to(seq_dtype).to(device)
    return MropeCase("decode", seq, seq_cpu, mm, device=device)


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


def extract_mrope_nodes(source: str, filename: str) -> list[ast.FunctionDef]:
    """The ``FunctionDef`` nodes (decorators included) of ``ForwardBatch``'s methods whose name
    contains ``mrope``. Raises :class:`MropeSourceError` when the class or the methods are absent."""
    for node in ast.parse(source, filename=filename).body:
        if isinstance(node, ast.ClassDef) and node.name == "ForwardBatch":
            found = [n for n in node.body if isinstance(n, ast.FunctionDef) and "mrope" in n.name]
            if not any(n.name == "_compute_mrope_positions" for n in found):
                raise MropeSourceError(f"{filename}: ForwardBatch has no _compute_mrope_positions")
            return found
    raise MropeSourceError(f"{filename}: no class ForwardBatch")


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

    def compute(self, case: MropeCase) -> torch.Tensor:
        """Run ``_compute_mrope_positions(model_runner, batch)`` for ``case`` on a stand-in
        ForwardBatch holding its mode and sequence lengths; returns the resulting
        ``mrope_positions`` (whatever the method left there). Errors propagate."""
        fb = self.forward_batch_cls()
        fb.forward_mode = StandInMode(case.mode)
        fb.seq_lens, fb.seq_lens_cpu, fb.mrope_positions = case.seq_lens, case.seq_lens_cpu, None
        self.state.rl_on_policy_target = case.rl_on_policy_target
        fb._compute_mrope_positions(case.model_runner(), case.batch())
        return fb.mrope_positions


def run_outcome(methods: MropeMethods, case: MropeCase) -> tuple[str, Any]:
    """``("ok", positions)`` or ``("error", "<ExceptionType>: <message>")`` of one call."""
    try:
        return "ok", methods.compute(case.fresh())
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return "error", f"{type(exc).__name__}: {exc}"
