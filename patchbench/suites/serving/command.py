"""The bench_serving command line for the pinned release, spelt as its tool accepts it: options,
``--dataset-name`` choices and defaults read with :mod:`ast` from ``sglang/bench_serving.py``
(0.5.1.post3) or ``sglang/benchmark/serving.py`` (0.5.15 on), without importing it."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from patchbench.suite import SuiteError

from .params import IMAGE_DATASETS, Params

#: the synthetic image dataset under its two names (0.5.1.post3: random-image, 0.5.23: image)
_IMAGE_ALIASES = ("image", "random-image")
#: (0.5.1.post3 flag, 0.5.23 flag) for the image dataset's options
_IMAGE_COUNT_FLAGS = ("--random-image-num-images", "--image-count")
_IMAGE_RES_FLAGS = ("--random-image-resolution", "--image-resolution")
#: releases from which image prompts always get the chat template (docs/FACTS.md section 2)
_ALWAYS_TEMPLATED_FROM = Version("0.5.6")


class ToolMismatch(SuiteError, ValueError):
    """The pinned release's bench_serving lacks a dataset, flag or backend the config asks for."""


@dataclass(frozen=True)
class ToolInfo:
    """What one release's bench_serving accepts: source (the file parsed), options (every option
    string), dataset_choices, defaults ({option: default} where it is a plain literal)."""

    source: Path
    options: frozenset[str]
    dataset_choices: tuple[str, ...]
    defaults: dict[str, object] = field(default_factory=dict)


def tool_source(sglang_dir: Path) -> Path:
    """The file that defines bench_serving's arguments in the installed ``sglang`` package folder."""
    new = Path(sglang_dir) / "benchmark" / "serving.py"
    old = Path(sglang_dir) / "bench_serving.py"
    if new.is_file():
        return new
    if old.is_file():
        return old
    raise FileNotFoundError(
        f"no bench_serving source under {sglang_dir} "
        "(looked for benchmark/serving.py and bench_serving.py)"
    )


@functools.lru_cache(maxsize=8)
def _tree(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def source_tree(source: Path) -> ast.Module:
    """The parsed source, cached per (path, modification time, size); OSError / SyntaxError."""
    st = Path(source).stat()
    return _tree(str(source), st.st_mtime_ns, st.st_size)


def tool_info(sglang_dir: Path) -> ToolInfo:
    """The release's bench_serving arguments (see :class:`ToolInfo`), read from its source."""
    src = tool_source(sglang_dir)
    options: set[str] = set()
    choices: tuple[str, ...] = ()
    defaults: dict[str, object] = {}
    for node in ast.walk(source_tree(src)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            continue
        names = [
            a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
        ]
        options.update(n for n in names if n.startswith("-"))
        for kw in node.keywords:
            if kw.arg == "default" and names:
                try:
                    defaults[names[0]] = ast.literal_eval(kw.value)
                except ValueError:
                    pass
            if kw.arg == "choices" and "--dataset-name" in names:
                try:
                    choices = tuple(ast.literal_eval(kw.value))
                except ValueError:
                    pass
    return ToolInfo(src, frozenset(options), choices, defaults)


def release_dataset_name(name: str, info: ToolInfo) -> str:
    """The release's spelling of dataset ``name``; ToolMismatch if the release has none."""
    if name in _IMAGE_ALIASES:
        for alias in (name, *_IMAGE_ALIASES):
            if alias in info.dataset_choices:
                return alias
    elif name in info.dataset_choices:
        return name
    raise ToolMismatch(
        f"dataset '{name}' is not available in this release's bench_serving ({info.source}); "
        f"it offers: {', '.join(info.dataset_choices) or '(none found)'}"
    )


def _flag(info: ToolInfo, candidates: tuple[str, ...], what: str) -> str:
    for c in candidates:
        if c in info.options:
            return c
    raise ToolMismatch(
        f"this release's bench_serving ({info.source}) has no flag for {what} "
        f"(looked for {', '.join(candidates)})"
    )


def wants_chat_template(params: Params, sglang_version: str) -> bool:
    """Whether to pass ``--apply-chat-template`` (see Params.apply_chat_template)."""
    if params.apply_chat_template is not None:
        return params.apply_chat_template
    return (
        params.dataset_name in IMAGE_DATASETS and Version(sglang_version) < _ALWAYS_TEMPLATED_FROM
    )


def build_command(
    params: Params,
    *,
    python: str,
    info: ToolInfo,
    sglang_version: str,
    host: str,
    port: int,
    model: str,
    tokenizer: str,
    output_file: Path,
) -> list[str]:
    """argv of one bench_serving call (``python -m sglang.bench_serving ...``) with ``--output-file``
    and ``--output-details``; ToolMismatch when the release lacks the dataset or a flag."""
    dataset = release_dataset_name(params.dataset_name, info)
    rate = params.request_rate
    options = {
        "--backend": params.backend,
        "--host": host,
        "--port": str(port),
        "--model": model,
        "--tokenizer": tokenizer,
        "--dataset-name": dataset,
        "--num-prompts": str(params.num_prompts),
        "--request-rate": "inf" if rate == float("inf") else repr(float(rate)),
        "--random-input-len": str(params.random_input_len),
        "--random-output-len": str(params.output_len),
        "--random-range-ratio": repr(float(params.random_range_ratio)),
        "--warmup-requests": str(params.warmup_requests),
        "--output-file": str(output_file),
    }
    cmd = [python, "-m", "sglang.bench_serving"]
    for flag, value in options.items():
        cmd += [flag, value]
    cmd.append("--output-details")
    if params.max_concurrency is not None:
        cmd += ["--max-concurrency", str(params.max_concurrency)]
    if params.dataset_path:
        cmd += ["--dataset-path", params.dataset_path]
    if dataset in _IMAGE_ALIASES:
        cmd += [
            _flag(info, _IMAGE_COUNT_FLAGS, "the image count"),
            str(params.image_count),
            _flag(info, _IMAGE_RES_FLAGS, "the image resolution"),
            params.image_resolution,
        ]
    if params.seed is not None:
        cmd += ["--seed", str(params.seed)]
    if wants_chat_template(params, sglang_version):
        cmd.append(_flag(info, ("--apply-chat-template",), "the chat template"))
    if params.disable_ignore_eos:
        cmd.append("--disable-ignore-eos")
    if params.disable_tqdm:
        cmd.append("--disable-tqdm")
    cmd += list(params.extra_args)
    return cmd


def effective_seed(params: Params, info: ToolInfo) -> int | None:
    """The seed the tool will use: ours, else the release's default read from its source."""
    if params.seed is not None:
        return params.seed
    d = info.defaults.get("--seed")
    return d if isinstance(d, int) else None
