"""Our recomputation of bench_serving's summary metrics from its per-request details (docs/serving.md,
"Our recomputation"; docs/cases.md S3)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .parse import DETAIL_KEYS, request_status


def _stats(values: list[float], prefix: str, pcts: tuple[int, ...]) -> dict[str, float]:
    # the tool's convention: np.mean(xs or 0) etc. (0 when there are no values), times 1000
    xs = values or 0
    out = {
        f"{prefix}_mean_ms": float(np.mean(xs)) * 1000,
        f"{prefix}_median_ms": float(np.median(xs)) * 1000,
        f"{prefix}_std_ms": float(np.std(xs)) * 1000,
    }
    for p in pcts:
        out[f"{prefix}_p{p}_ms"] = float(np.percentile(xs, p)) * 1000
    return out


def recompute_from_details(row: dict[str, Any], *, as_tool: bool = True) -> dict[str, float]:
    """Summary metrics (names as :mod:`.parse`) rebuilt from the per-request details of one result
    line, durations from the tool's ``duration``. ``as_tool``: every request the tool counted a
    success (``calculate_metrics``, non-speculative path), else only those that streamed a token."""
    dur = float(row["duration"])
    ttfts: list[float] = []
    itls: list[float] = []
    e2es: list[float] = []
    tpots: list[float] = []
    total_out = 0
    total_in = 0
    completed = 0
    for inp, out, ttft, itl, _text, err in zip(*(row[k] for k in DETAIL_KEYS), strict=False):
        status = request_status(out, ttft, itl, err)
        if status == "failed" or (status == "no_token" and not as_tool):
            continue
        completed += 1
        total_out += out
        total_in += inp
        ttfts.append(ttft)
        itls.extend(itl)
        e2e = ttft + sum(itl)
        e2es.append(e2e)
        if out > 1:
            tpots.append((e2e - ttft) / (out - 1))
    m: dict[str, float] = {
        "completed_count" if not as_tool else "tool_completed_count": float(completed),
        "total_output_tokens_count": float(total_out),
        "details_input_tokens_count": float(total_in),
        "request_throughput_req_s": completed / dur,
        "output_throughput_tok_s": total_out / dur,
        "concurrency": float(np.sum(e2es)) / dur if e2es else 0.0,
        "itl_max_ms": float(np.max(itls or 0)) * 1000,
    }
    m.update(_stats(ttfts, "ttft", (90, 95, 99)))
    m.update(_stats(itls, "itl", (90, 95, 99)))
    m.update(_stats(tpots, "tpot", (90, 95, 99)))
    if e2es:
        m.update(_stats(e2es, "e2e_latency", (90, 95, 99)))
    return m


#: metrics our recomputation reproduces exactly (same inputs, same numpy calls as the tool)
EXACT = (
    "tool_completed_count",
    "total_output_tokens_count",
    "request_throughput_req_s",
    "output_throughput_tok_s",
    "ttft_mean_ms",
    "ttft_median_ms",
    "ttft_p99_ms",
    "itl_mean_ms",
    "itl_median_ms",
    "itl_p95_ms",
    "itl_p99_ms",
)
#: metrics that use the per-request E2E, which the details lack (ttft + sum(itl) instead)
APPROX = ("e2e_latency_mean_ms", "e2e_latency_median_ms", "tpot_mean_ms", "tpot_median_ms")
#: concurrency = sum(E2E) / duration: relative tolerance only
APPROX_REL = ("concurrency",)


def compare_with_summary(
    tool: dict[str, float], ours: dict[str, float], *, rel_tol: float, abs_tol_ms: float
) -> list[str]:
    """Lines naming every metric where our recomputation disagrees with the tool's summary ([]:
    agreement): EXACT within 1e-9 relative, APPROX (ms) within max(rel_tol * value, abs_tol_ms),
    APPROX_REL within rel_tol; metrics missing on either side are skipped."""
    bad = []
    for name in (*EXACT, *APPROX, *APPROX_REL):
        if name not in tool or name not in ours:
            continue
        a, b = tool[name], ours[name]
        if name in EXACT:
            ok = math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        elif name in APPROX:
            ok = abs(a - b) <= max(rel_tol * abs(a), abs_tol_ms)
        else:
            ok = math.isclose(a, b, rel_tol=rel_tol)
        if not ok:
            bad.append(f"{name}: bench_serving {a:.4f}, recomputed from details {b:.4f}")
    return bad
