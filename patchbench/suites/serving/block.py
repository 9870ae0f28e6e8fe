"""The PR's "Serving Benchmark Result" block, rendered from a cell's summary.json with the labels,
order and formats bench_serving 0.5.1.post3 prints (the PR's release) for every release, so
Before/After blocks line up; the release's own printout stays in ``stdout.txt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench.records import read_json

TITLE = "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")


def _rule(title: str) -> str:
    return "{s:{c}^{n}}".format(s=title, n=50, c="-")


def _txt(label: str, value: Any) -> str:
    return f"{label:<40} {value:<10}"


def _f2(label: str, value: float) -> str:
    return f"{label:<40} {value:<10.2f}"


def _int(v: float | None) -> Any:
    return int(round(v)) if v is not None else "n/a"


def render_block(metrics: dict[str, float], meta: dict[str, Any]) -> str:
    """The block for one cell from summary.json's ``metrics`` and ``meta`` ("backend",
    "request_rate", "max_concurrency"); counts are the tool's own (token-less responses included)."""
    g = metrics.get
    mc = meta.get("max_concurrency")
    lines = [
        TITLE,
        _txt("Backend:", meta.get("backend", "sglang")),
        _txt("Traffic request rate:", meta.get("request_rate", "inf")),
        _txt("Max request concurrency:", mc if mc else "not set"),
        _txt("Successful requests:", _int(g("tool_completed_count"))),
        _f2("Benchmark duration (s):", g("duration_s", float("nan"))),
        _txt("Total input tokens:", _int(g("total_input_tokens_count"))),
        _txt("Total generated tokens:", _int(g("total_output_tokens_count"))),
        _txt(
            "Total generated tokens (retokenized):",
            _int(g("total_output_tokens_retokenized_count")),
        ),
        _f2("Request throughput (req/s):", g("request_throughput_req_s", float("nan"))),
        _f2("Input token throughput (tok/s):", g("input_throughput_tok_s", float("nan"))),
        _f2("Output token throughput (tok/s):", g("output_throughput_tok_s", float("nan"))),
        _f2("Total token throughput (tok/s):", g("total_throughput_tok_s", float("nan"))),
        _f2("Concurrency:", g("concurrency", float("nan"))),
    ]
    if g("accept_length"):
        lines.append(_f2("Accept length:", g("accept_length")))
    nan = float("nan")
    lines += [
        _rule("End-to-End Latency"),
        _f2("Mean E2E Latency (ms):", g("e2e_latency_mean_ms", nan)),
        _f2("Median E2E Latency (ms):", g("e2e_latency_median_ms", nan)),
        _rule("Time to First Token"),
        _f2("Mean TTFT (ms):", g("ttft_mean_ms", nan)),
        _f2("Median TTFT (ms):", g("ttft_median_ms", nan)),
        _f2("P99 TTFT (ms):", g("ttft_p99_ms", nan)),
        _rule("Inter-Token Latency"),
        _f2("Mean ITL (ms):", g("itl_mean_ms", nan)),
        _f2("Median ITL (ms):", g("itl_median_ms", nan)),
        _f2("P95 ITL (ms):", g("itl_p95_ms", nan)),
        _f2("P99 ITL (ms):", g("itl_p99_ms", nan)),
        _f2("Max ITL (ms):", g("itl_max_ms", nan)),
        "=" * 50,
    ]
    return "\n".join(lines) + "\n"


def report_block(summary_dir: Path) -> str:
    """The PR-style block of the cell whose serving summary.json lies in ``summary_dir``;
    FileNotFoundError naming a missing file, ValueError naming the file and key of a bad one."""
    path = Path(summary_dir) / "summary.json"
    summary = read_json(path)
    if not isinstance(summary, dict):
        raise ValueError(f"{path}: not a JSON object")
    metrics, meta = summary.get("metrics", {}), summary.get("meta", {})
    if not isinstance(metrics, dict) or not isinstance(meta, dict):
        raise ValueError(f"{path}: 'metrics' and 'meta' must be JSON objects")
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"{path}: metrics.{k} = {v!r} is not a number")
    sweep = meta.get("sweep")
    if isinstance(sweep, dict) and sweep.get("points"):
        # a load sweep: one block per point, lowest load first, from each point's own summary
        keys = sorted(sweep["points"], key=lambda k: float(sweep["points"][k].get("load", 0)))
        return "\n\n".join(
            f"[point {k}]\n" + report_block(Path(summary_dir) / "points" / k) for k in keys
        )
    return render_block(metrics, meta)
