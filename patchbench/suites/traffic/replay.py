"""Multi-turn conversations and prefix primes through the release's own bench_serving:
``python replay.py <spec.json> <bench_serving argv...>``, or as multi_point.py's ``wrapper``
(docs/traffic.md, "Multi-turn").

Neither pinned release's bench_serving waits between turns (0.5.1.post3 has no multi-turn mode;
0.5.23's feeds each turn the reply it got, so the arms' prompts would differ), so this driver runs
the release's ``__main__`` unchanged and replaces three names in its namespace once it has parsed
its arguments: ``get_dataset`` (every turn's prompt: the file's chat history up to that user
message, through the tokenizer's chat template), ``get_request`` (a turn is sent only after the
previous turn of its conversation was answered and ``think_time_s`` passed) and the backend's
request function (which tells it a turn was answered). Timing, warm-up, metrics and the output
file are the release's own; the per-request details are then put back in (turn, conversation)
order so that both arms' files pair by index.

Spec ``mode``: "conversations" (``path``, ``conversations``, ``turns``, ``think_time_s``),
"prime_conversations" (one request per distinct system prompt of those conversations: the prompt
alone) or "prime_groups" (the tool's own dataset, read as the measured call reads it, sorted into
groups of ``per_group`` that share a prefix: one request per group, its common prefix: 0.5.1.post3
draws different prompts from one seed, so only the measured call's own prompts prime it). Output
lengths: ``--random-output-len``. Standard library only, besides the release."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import runpy
import sys
import time
from pathlib import Path

#: the module run as ``python -m``
TOOL_MODULE = "sglang.bench_serving"
#: the per-request lists of the tool's output file (``--output-details``)
DETAILS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


def conversations(spec: dict) -> list[dict]:
    """The file's conversations, at most ``conversations`` of them and ``turns`` turns each."""
    lines = Path(spec["path"]).read_text(encoding="utf-8").splitlines()
    convs = [json.loads(ln) for ln in lines if ln.strip()][: spec.get("conversations")]
    return [dict(c, turns=c["turns"][: spec.get("turns")]) for c in convs]


def render(tokenizer, messages: list[dict], generation: bool = True) -> str:
    """The prompt text of ``messages``: the chat template, else ``role: content`` lines."""
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation
        )
    except Exception:  # noqa: BLE001 (a tokenizer without a template)
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        return text + ("\nassistant:" if generation else "")


def prompts(convs: list[dict], tokenizer, prime: bool) -> tuple[list[str], list[int]]:
    """(prompts in (turn, conversation) order, the conversation of each); with ``prime`` one
    prompt per distinct system prompt, owned by none (-1)."""
    if prime:
        systems = list(dict.fromkeys(c["system"] for c in convs))
        msgs = [[{"role": "system", "content": s}] for s in systems]
        return [render(tokenizer, m, generation=False) for m in msgs], [-1] * len(msgs)
    out, owner = [], []
    for k in range(max(len(c["turns"]) for c in convs)):
        for i, c in enumerate(convs):
            if k < len(c["turns"]):
                msgs = [{"role": "system", "content": c["system"]}]
                for t in c["turns"][:k]:
                    msgs += [
                        {"role": "user", "content": t["user"]},
                        {"role": "assistant", "content": t["assistant"]},
                    ]
                msgs.append({"role": "user", "content": c["turns"][k]["user"]})
                out.append(render(tokenizer, msgs))
                owner.append(i)
    return out, owner


def install(g: dict, args: argparse.Namespace, spec: dict, state: dict) -> None:
    """Replace ``get_dataset``, ``get_request`` and the backend's request function in the tool's
    namespace ``g`` (see the module docstring); ``state["order"]``: the canonical index of each
    request in the order sent."""
    think = float(spec.get("think_time_s") or 0.0)
    tool_dataset = g["get_dataset"]
    funcs = g["ASYNC_REQUEST_FUNCS"]
    real = funcs[args.backend]
    waiting: dict[str, list[int]] = {}  # prompt -> conversations with that prompt in flight
    ready: dict[int, float | None] = {}  # conversation -> when its next turn may go (None: busy)
    changed: list[asyncio.Event] = []

    def get_dataset(args, tokenizer, *rest):
        if spec["mode"] == "prime_groups":
            texts = sorted(r.prompt for r in tool_dataset(args, tokenizer, *rest))
            per = int(spec["per_group"])
            texts = [os.path.commonprefix(texts[i : i + per]) for i in range(0, len(texts), per)]
            owner = [-1] * len(texts)
        else:
            prime = spec["mode"] == "prime_conversations"
            texts, owner = prompts(conversations(spec), tokenizer, prime)
        state["owner"] = owner
        row = g["DatasetRow"]
        n = args.random_output_len
        return [row(prompt=p, prompt_len=len(tokenizer.encode(p)), output_len=n) for p in texts]

    async def get_request(input_requests, request_rate, *_a, **_k):
        rows, owner = list(input_requests), state["owner"]
        left: dict[int, list[int]] = {}
        for i, c in enumerate(owner):
            left.setdefault(c, []).append(i)
        ready.update({c: 0.0 for c in left})
        changed.append(asyncio.Event())
        order: list[int] = []
        while any(left.values()):
            now = time.perf_counter()
            due = [c for c, ix in left.items() if ix and ready[c] is not None and ready[c] <= now]
            if due:
                c = min(due, key=lambda c: (ready[c], c))
                i = left[c].pop(0)
                ready[c] = None if c >= 0 else 0.0  # primes do not wait for each other
                order.append(i)
                waiting.setdefault(rows[i].prompt, []).append(c)
                yield rows[i]
                continue
            waits = [ready[c] - now for c, ix in left.items() if ix and ready[c] is not None]
            changed[0].clear()
            try:
                await asyncio.wait_for(changed[0].wait(), min(waits) if waits else None)
            except asyncio.TimeoutError:
                pass
        input_requests[:] = [rows[i] for i in order]  # the tool pairs these with its outputs
        state["order"] = order

    async def request(request_func_input, pbar=None):
        out = await real(request_func_input=request_func_input, pbar=pbar)
        owners = waiting.get(request_func_input.prompt)
        if owners:  # not the tool's warm-up
            c = owners.pop(0)
            if c >= 0:
                ready[c] = time.perf_counter() + think
            changed[0].set()
        return out

    saved = g["get_dataset"], g["get_request"], real

    def restore() -> None:
        g["get_dataset"], g["get_request"], funcs[args.backend] = saved

    state["restore"] = restore
    g["get_dataset"], g["get_request"] = get_dataset, get_request
    funcs[args.backend] = request


def reorder(output_file: Path, order: list[int]) -> None:
    """Put the per-request details of the file's last line back in canonical order (``order``: the
    canonical index of each request as sent)."""
    lines = output_file.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[-1])
    for k in DETAILS:
        if isinstance(row.get(k), list) and len(row[k]) == len(order):
            canon = [None] * len(order)
            for sent, i in enumerate(order):
                canon[i] = row[k][sent]
            row[k] = canon
    output_file.write_text("\n".join([*lines[:-1], json.dumps(row)]) + "\n", encoding="utf-8")


def main(spec_path: str, argv: list[str]) -> int:
    """Run the tool with ``argv`` under the spec at ``spec_path``; the exit code."""
    spec = json.loads(Path(spec_path).read_text())
    state: dict = {}
    parse = argparse.ArgumentParser.parse_args

    def parse_args(self, *a, **k):
        args = parse(self, *a, **k)
        g = sys._getframe(1).f_globals  # the namespace whose run_benchmark reads these names
        if "run_benchmark" in g and "get_dataset" in g and "output_file" not in state:
            install(g, args, spec, state)
            state["output_file"] = args.output_file
        return args

    argparse.ArgumentParser.parse_args = parse_args
    sys.argv = [TOOL_MODULE, *argv]
    try:  # one client process may run several calls (multi_point.py): leave the tool as it was
        runpy.run_module(TOOL_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
    finally:
        argparse.ArgumentParser.parse_args = parse
        state.get("restore", lambda: None)()
    if "order" in state and spec["mode"] == "conversations":
        reorder(Path(state["output_file"]), state["order"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
