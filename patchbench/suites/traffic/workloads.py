"""The traffic suite's workloads: their parameters and the bench_serving calls that send them
(docs/traffic.md). Each workload is one serving point (:mod:`patchbench.suites.serving.point`): a
prime call (not measured), then the measured call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from patchbench.suites.serving import Params as ServingParams
from patchbench.suites.serving.command import ToolInfo, ToolMismatch

#: the shipped files a workload reads unless it names its own ``path``
DATA = Path(__file__).with_name("data")
#: bench_serving's dataset of each kind it sends itself (multi_turn: replay.py, any release)
TOOL_DATASET = {"shared_prefix": "generated-shared-prefix", "trace": "mooncake"}
#: the flags each kind passes, as both releases spell them
GSP_FLAGS = ("--gsp-num-groups", "--gsp-prompts-per-group", "--gsp-system-prompt-len")
GSP_FLAGS += ("--gsp-question-len", "--gsp-output-len")
TRACE_FLAGS = ("--mooncake-slowdown-factor", "--mooncake-num-rounds")


class _Workload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_concurrency: int | None = Field(8, ge=1)
    timeout_s: float = Field(1800.0, gt=0)


def checked_file(path: Path, keys: tuple[str, ...]) -> Path:
    """``path`` made absolute (the clients run in the cell's folder); ValueError naming the file
    and line when it is missing, not JSONL or a line lacks one of ``keys``."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    rows = read_jsonl(path)
    for i, row in enumerate(rows, 1):
        lost = [k for k in keys if not isinstance(row, dict) or k not in row]
        if lost:
            raise ValueError(f"{path}: object {i} lacks {', '.join(lost)}")
    if not rows:
        raise ValueError(f"{path}: empty")
    return path


class SharedPrefix(_Workload):
    """``groups`` system prompts of ``system_prompt_len`` tokens, each shared by
    ``prompts_per_group`` questions of ``question_len`` tokens; ``output_len`` tokens each
    (bench_serving's generated-shared-prefix, both releases)."""

    kind: Literal["shared_prefix"]
    groups: int = Field(ge=1)
    prompts_per_group: int = Field(ge=1)
    system_prompt_len: int = Field(ge=1)
    question_len: int = Field(ge=1)
    output_len: int = Field(ge=1)


class MultiTurn(_Workload):
    """Conversations replayed turn by turn (replay.py, any release): turn k's prompt is the chat
    history of the file up to its user message k; the next turn leaves ``think_time_s`` seconds
    after the reply ends. ``path``: JSONL of ``{"system", "turns": [{"user", "assistant"}]}``
    (default: the shipped file); at most ``conversations`` and ``turns`` of it."""

    kind: Literal["multi_turn"]
    path: Path = DATA / "conversations.jsonl"
    conversations: int | None = Field(None, ge=1)
    turns: int | None = Field(None, ge=1)
    think_time_s: float = Field(0.0, ge=0)
    output_len: int = Field(ge=1)

    @field_validator("path")
    @classmethod
    def _file(cls, v: Path) -> Path:
        return checked_file(v, ("system", "turns"))


class Trace(_Workload):
    """A Mooncake-format trace (JSONL of ``{"timestamp" (ms), "input_length", "output_length",
    "hash_ids"}``) sent at its timestamps times ``slowdown`` (bench_serving's mooncake dataset:
    0.5.23, not 0.5.1.post3). ``path``: default the shipped file."""

    kind: Literal["trace"]
    path: Path = DATA / "trace.jsonl"
    slowdown: float = Field(1.0, gt=0)
    max_concurrency: int | None = Field(None, ge=1)

    @field_validator("path")
    @classmethod
    def _file(cls, v: Path) -> Path:
        return checked_file(v, ("timestamp", "output_length", "hash_ids"))


Workload = Annotated[SharedPrefix | MultiTurn | Trace, Field(discriminator="kind")]


def read_jsonl(path: Path) -> list[dict]:
    """The objects of a JSONL file, blank lines skipped; ValueError naming the file and line."""
    import json

    out = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON ({e.msg})") from None
    return out


def check_tool(w: SharedPrefix | MultiTurn | Trace, info: ToolInfo, release: str) -> None:
    """ToolMismatch naming ``release`` when its bench_serving cannot send ``w``."""
    dataset = TOOL_DATASET.get(w.kind)
    if dataset is None:
        return
    flags = GSP_FLAGS if w.kind == "shared_prefix" else TRACE_FLAGS
    missing = [f for f in flags if f not in info.options]
    if dataset not in info.dataset_choices or missing:
        why = f"no '{dataset}' dataset" if dataset not in info.dataset_choices else ""
        why = why or f"no {', '.join(missing)}"
        raise ToolMismatch(
            f"a {w.kind} workload needs bench_serving's '{dataset}' dataset, and sglang "
            f"{release}'s bench_serving ({info.source}) has {why}; it offers: "
            f"{', '.join(info.dataset_choices)}"
        )


def tool_params(
    w: SharedPrefix | MultiTurn | Trace, seed: int, warmup: int, prime: bool = False
) -> ServingParams:
    """The serving point of workload ``w``: its measured call, or with ``prime`` its prime call
    (one request per prefix group, 1 output token, through replay.py). ``warmup``:
    bench_serving's warmup requests."""
    n, out, extra, dataset = 1, 1, [], "random"
    if isinstance(w, SharedPrefix):  # the prime: replay.py's prime_groups, same gsp flags
        n, out = (w.groups, 1) if prime else (w.groups * w.prompts_per_group, w.output_len)
        dataset = TOOL_DATASET[w.kind]
        vals = (w.groups, w.prompts_per_group, w.system_prompt_len, w.question_len, w.output_len)
        extra = [x for f, v in zip(GSP_FLAGS, vals, strict=True) for x in (f, str(v))]
    elif isinstance(w, MultiTurn):
        convs = read_jsonl(w.path)[: w.conversations]
        out = 1 if prime else w.output_len
        n = (
            len({c["system"] for c in convs})
            if prime
            else sum(len(c["turns"][: w.turns]) for c in convs)
        )
    else:
        rows = read_jsonl(w.path)
        n, dataset = len(rows), TOOL_DATASET[w.kind]
        out = max(int(r.get("output_length", 1)) for r in rows)
        extra = ["--dataset-path", str(w.path), *TRACE_FLAGS[:1], repr(w.slowdown)]
        extra += [TRACE_FLAGS[1], "1"]
    # built unvalidated: the serving suite's own dataset names leave out these two
    return ServingParams(
        max_concurrency=w.max_concurrency,
        num_prompts=n,
        output_len=out,
        random_input_len=16,
        random_range_ratio=0.0 if isinstance(w, Trace) else 1.0,
        seed=seed,
        warmup_requests=warmup,
        extra_args=extra,
        timeout_s=w.timeout_s,
    ).model_copy(update={"dataset_name": dataset})
