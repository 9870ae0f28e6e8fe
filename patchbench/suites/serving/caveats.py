"""What the pinned release's bench_serving does that changes what is measured, read with :mod:`ast`
from the source :func:`.command.tool_source` finds (no import): a warmup burst above the
concurrency cap, and backends that mis-measure (docs/serving.md, "What the release's
bench_serving mis-measures", has the releases' lines)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from .command import ToolMismatch, source_tree
from .params import Params


@dataclass(frozen=True)
class WarmupBehaviour:
    """How the release's warmup loop sends its requests.

    capped: True (through ``limited_request_func``), False (``request_func`` directly: all at
    once), None (no warmup loop found); line: the loop's line in ``source``."""

    source: Path
    capped: bool | None
    line: int | None


def _called_names(node: ast.AST) -> set[str]:
    return {
        n.func.id
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }


def warmup_behaviour(source: Path) -> WarmupBehaviour:
    """The release's warmup loop (``for _ in range(warmup_requests)``) and whether its requests go
    through ``limited_request_func``; OSError / SyntaxError for an unreadable source."""
    for node in ast.walk(source_tree(source)):
        if not (
            isinstance(node, ast.For)
            and isinstance(node.iter, ast.Call)
            and isinstance(node.iter.func, ast.Name)
            and node.iter.func.id == "range"
            and any(isinstance(a, ast.Name) and a.id == "warmup_requests" for a in node.iter.args)
        ):
            continue
        called = set().union(*(_called_names(b) for b in node.body))
        if "limited_request_func" in called:
            return WarmupBehaviour(Path(source), True, node.lineno)
        if "request_func" in called:
            return WarmupBehaviour(Path(source), False, node.lineno)
    return WarmupBehaviour(Path(source), None, None)


def warmup_warning(params: Params, behaviour: WarmupBehaviour) -> str | None:
    """The warning for a warmup burst above ``max_concurrency`` (stated as unknown when the loop was
    not found), else None."""
    cap, n = params.max_concurrency, params.warmup_requests
    if cap is None or n <= cap or behaviour.capped:
        return None
    if behaviour.capped is None:
        return (
            f"warmup_requests={n} > max_concurrency={cap}, and whether this release's "
            f"bench_serving caps its warmup could not be read from {behaviour.source}: the "
            f"server may get a burst of {n} requests before the measured run"
        )
    return (
        f"this release's bench_serving sends all {n} warmup requests at once, ignoring "
        f"--max-concurrency {cap} ({behaviour.source}, warmup loop at line {behaviour.line}): the "
        f"server got a burst of {n} requests right before the measured run (retractions or "
        f"out-of-memory events it causes are counted for this suite); set warmup_requests <= "
        f"max_concurrency to avoid it"
    )


def request_functions(source: Path) -> dict[str, str]:
    """``{backend: request function name}`` from the release's ``ASYNC_REQUEST_FUNCS`` literal
    (empty when it is not found)."""
    for node in ast.walk(source_tree(source)):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "ASYNC_REQUEST_FUNCS" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            return {
                k.value: v.id
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Name)
            }
    return {}


def _function_text(source: Path, name: str) -> str:
    """The source of module-level function ``name`` plus that of the module-level functions it
    calls directly (one level: helpers such as 0.5.23's ``_combine_openai_chat_content``)."""
    tree = source_tree(source)
    text = Path(source).read_text(encoding="utf-8")
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    fn = funcs.get(name)
    if fn is None:
        return ""
    parts = [ast.get_source_segment(text, fn) or ""]
    parts += [
        ast.get_source_segment(text, funcs[c]) or ""
        for c in sorted(_called_names(fn))
        if c in funcs and c != name
    ]
    return "\n".join(parts)


def backend_warnings(params: Params, source: Path) -> list[str]:
    """Warnings for ``params.backend`` where this release's bench_serving mis-measures it ([] for
    the ``sglang`` backend's request function); ToolMismatch naming the release's backends when it
    has no such one."""
    funcs = request_functions(source)
    if not funcs:
        return [f"the backends of this release's bench_serving could not be read from {source}"]
    fn = funcs.get(params.backend)
    if fn is None:
        raise ToolMismatch(
            f"backend '{params.backend}' is not offered by this release's bench_serving "
            f"({source}); it offers: {', '.join(funcs)}"
        )
    if fn == funcs.get("sglang"):
        return []
    body = _function_text(source, fn)
    where = f"{source}, {fn}"
    out: list[str] = []
    is_chat = "chat/completions" in body
    if is_chat and "reasoning_content" not in body:
        out.append(
            f"backend '{params.backend}': this release's chat client ({where}) reads only "
            "delta.content, never reasoning_content: with a reasoning parser on the server, "
            "TTFT waits for the first answer token and ITL, token counts and the generated "
            "text miss the reasoning tokens"
        )
    sends_ignore_eos = "ignore_eos" in body
    if not params.disable_ignore_eos and not sends_ignore_eos:
        out.append(
            f"backend '{params.backend}': this release's client ({where}) does not send "
            "ignore_eos: outputs stop at EOS, so output lengths differ from output_len and "
            "between variants whose outputs differ"
        )
    if (
        (params.disable_ignore_eos or not sends_ignore_eos)
        and "completion_tokens" in body
        and "stream_options" not in body
    ):
        out.append(
            f"backend '{params.backend}': this release's client ({where}) never asks for "
            "stream_options.include_usage; without a streamed usage block it counts the "
            "REQUESTED output length as generated, so token totals and throughputs may count "
            "tokens that were never generated"
        )
    return out
