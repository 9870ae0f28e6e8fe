"""The PR's "Serving Benchmark Result" block, rendered from a cell's summary.json with the labels,
order and formats bench_serving 0.5.1.post3 prints (the PR's release) for every release, so
Before/After blocks line up; the release's own printout stays in ``stdout.txt``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench.records import read_json

TITLE = "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")
#: the block after its head: (label, metric) with the value as the tool prints it (a count as an
#: integer, the rest with two decimals), or (rule title, None); accept length only when set
LINES = [
    ("Successful requests:", "tool_completed_count"),
    ("Benchmark duration (s):", "duration_s"),
    ("Total input tokens:", "total_input_tokens_count"),
    ("Total generated tokens:", "total_output_tokens_count"),
    ("Total generated tokens (retokenized):", "total_output_tokens_retokenized_count"),
    ("Request throughput (req/s):", "request_throughput_req_s"),
    ("Input token throughput (tok/s):", "input_throughput_tok_s"),
    ("Output token throughput (tok/s):", "output_throughput_tok_s"),
    ("Total token throughput (tok/s):", "total_throughput_tok_s"),
    ("Concurrency:", "concurrency"),
    ("Accept length:", "accept_length"),
    ("End-to-End Latency", None),
    ("Mean E2E Latency (ms):", "e2e_latency_mean_ms"),
    ("Median E2E Latency (ms):", "e2e_latency_median_ms"),
    ("Time to First Token", None),
    ("Mean TTFT (ms):", "ttft_mean_ms"),
    ("Median TTFT (ms):", "ttft_median_ms"),
    ("P99 TTFT (ms):", "ttft_p99_ms"),
    ("Inter-Token Latency", None),
    ("Mean ITL (ms):", "itl_mean_ms"),
    ("Median ITL (ms):", "itl_median_ms"),
    ("P95 ITL (ms):", "itl_p95_ms"),
    ("P99 ITL (ms):", "itl_p99_ms"),
    ("Max ITL (ms):", "itl_max_ms"),
]


def render_block(metrics: dict[str, float], meta: dict[str, Any]) -> str:
    """The block for one cell from summary.json's ``metrics`` and ``meta`` ("backend",
    "request_rate", "max_concurrency"); counts are the tool's own (token-less responses included)."""
    head = [
        ("Backend:", meta.get("backend", "sglang")),
        ("Traffic request rate:", meta.get("request_rate", "inf")),
        ("Max request concurrency:", meta.get("max_concurrency") or "not set"),
    ]
    lines = [TITLE] + [f"{label:<40} {v:<10}" for label, v in head]
    for label, key in LINES:
        v = metrics.get(key)
        if key is None:
            lines.append("{s:{c}^{n}}".format(s=label, n=50, c="-"))
        elif key.endswith("_count"):
            lines.append(f"{label:<40} {'n/a' if v is None else int(round(v)):<10}")
        elif key != "accept_length" or v:
            lines.append(f"{label:<40} {float('nan') if v is None else v:<10.2f}")
    return "\n".join([*lines, "=" * 50]) + "\n"


def client_line(meta: dict[str, Any]) -> str | None:
    """One line on the client of a point from its summary's ``meta.client`` (docs/serving.md, "Is
    the client the bottleneck?"): median send lag against the mean gap between sends, median
    event-loop lag, CPU share of a core and the rule's answer; None without a client state."""
    c = meta.get("client")
    if not isinstance(c, dict):
        return None

    def ms(key: str) -> str:
        v = c.get(key)
        return "n/a" if not isinstance(v, int | float) else f"{v:.3g} ms"

    cpu = c.get("cpu_share")
    cpu_text = "n/a" if not isinstance(cpu, int | float) else f"{100 * cpu:.0f} %"
    procs = c.get("processes") or 1
    answer = f"client-bound: {c['bound']}" if c.get("bound") else "not client-bound"
    return (
        f"client ({procs} process{'es' if procs > 1 else ''}): send lag median "
        f"{ms('send_lag_median_ms')} against a mean gap of {ms('send_gap_mean_ms')} between sends, "
        f"event-loop lag median {ms('loop_lag_median_ms')}, CPU {cpu_text} of a core: {answer}"
    )


def _with_client(block: str, meta: dict[str, Any]) -> str:
    line = client_line(meta)
    return block if line is None else block + line + "\n"


def report_block(summary_dir: Path) -> str:
    """The PR-style block of the cell whose serving summary.json lies in ``summary_dir``, each
    followed by its client's line (:func:`client_line`): one block per point of a load sweep
    (lowest load first) and per probe of a capacity search (in the order run, headed by its
    attainment); FileNotFoundError naming a missing file, ValueError naming the file and key of
    a bad one."""
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
    cap = meta.get("capacity")
    if isinstance(cap, dict) and cap.get("probes"):
        heads = []
        for j, p in enumerate(cap["probes"], 1):
            k = f"c{int(p['load'])}"
            got = (
                f"client-bound, not judged ({p['client_bound']})"
                if p.get("client_bound")
                else f"{100 * p['score']:.0f} % of requests meet the SLO"
                + (" (meets)" if p.get("meets") else " (fails)")
            )
            heads.append(
                f"[probe {k}, {j} of {len(cap['probes'])}: {got}]\n"
                + report_block(Path(summary_dir) / "probes" / k)
            )
        return "\n\n".join(heads)
    return _with_client(render_block(metrics, meta), meta)
