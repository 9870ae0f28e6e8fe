"""Our recomputation of bench_serving's metrics, from chunks (one request) or from the details.

Two uses:

1. :func:`request_from_chunks` is the per-request rule of sglang.bench_serving's ``sglang`` backend
   (``async_request_sglang_generate``, same in 0.5.1.post3 and 0.5.23), written out so it can be
   tested on the failure cases (docs/cases.md S1, S2, S3): TTFT = time of the first chunk with text;
   every later chunk with text that adds n tokens (by ``meta_info.completion_tokens``) contributes n
   ITL values of (gap since the previous such chunk) / n; a chunk that adds no token is skipped
   (it neither adds ITL values nor moves the reference time); the output length is the last
   ``completion_tokens`` seen with text; E2E = time of the last token (the tool itself uses the
   time of the last chunk of any kind, e.g. ``[DONE]``).
2. :func:`recompute_from_details` rebuilds the summary from ``--output-details`` with numpy, the
   way the tool's ``calculate_metrics`` does, so the tool's summary can be checked against it
   (:func:`compare_with_summary`). Exact for counts, throughputs, TTFT and ITL statistics (same
   inputs, same numpy calls); approximate for E2E, TPOT and concurrency because the details hold
   no per-request E2E: we use ttft + sum(itl) (time of the last token), the tool the time of the
   stream's last chunk. The tolerance is Params.recompute_rel_tol / recompute_abs_tol_ms (defaults
   5 % or 5 ms, whichever is larger, per value), exact-match metrics use 1e-9 relative.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .parse import DETAIL_KEYS, request_status


@dataclass
class Chunk:
    """One streamed chunk: arrival time t_s (seconds after the request was sent), its text (the
    sglang backend sends the cumulative text; "" for a usage-only or empty chunk) and the
    cumulative ``completion_tokens`` it reports (None if the chunk has none)."""

    t_s: float
    text: str = ""
    completion_tokens: int | None = None


@dataclass
class RequestTiming:
    """One request as bench_serving records it. Times in seconds; ``output_len`` in tokens."""

    success: bool
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    output_len: int = 0
    tokens_in_first_chunk: int = 0
    no_token: bool = False
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output_len - 1), as the tool computes TPOT; None for output_len <= 1."""
        if self.output_len <= 1:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_len - 1)


def request_from_chunks(
    chunks: Iterable[Chunk], *, requested_len: int, http_status: int = 200, reason: str = ""
) -> RequestTiming:
    """Replay bench_serving's per-request bookkeeping on a list of chunks (see module docstring).

    A non-200 response is a failure (output length 0, the reason kept as the error). A 200 response
    whose stream carried no text is what the tool counts as a success with ``output_len =
    requested_len`` and TTFT 0: we return it with ``no_token=True`` and ``success=False`` (docs/cases.md
    S3: a failure in our records; the difference to the tool is flagged by the validity checks).
    """
    if http_status != 200:
        return RequestTiming(success=False, error=reason or f"HTTP {http_status}")
    ttft = 0.0
    itl: list[float] = []
    last_t = 0.0
    last_len = 0
    output_len = requested_len
    first_tokens = 0
    seen = False
    for c in chunks:
        if not c.text:
            continue  # usage-only / empty chunk: no token (docs/cases.md S2)
        n_total = c.completion_tokens if c.completion_tokens is not None else last_len + 1
        output_len = n_total
        if not seen:
            seen = True
            ttft = c.t_s
            first_tokens = n_total
        else:
            new = n_total - last_len
            if new == 0:
                continue
            itl.extend([(c.t_s - last_t) / new] * new)
        last_t = c.t_s
        last_len = n_total
    if not seen:
        return RequestTiming(
            success=False,
            no_token=True,
            output_len=requested_len,
            error="stream ended without any token",
        )
    return RequestTiming(
        success=True,
        ttft_s=ttft,
        itl_s=itl,
        e2e_s=ttft + sum(itl),
        output_len=output_len,
        tokens_in_first_chunk=first_tokens,
    )


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
    """Summary metrics rebuilt from the per-request details of one result line.

    as_tool=True follows sglang.bench_serving's ``calculate_metrics`` (0.5.1.post3 and 0.5.23,
    non-speculative path): every request the tool counted as a success is in, including responses
    that streamed no token (TTFT 0). as_tool=False is our clean view: only requests with a streamed
    token count ("completed_count"), which is the number the report uses. Durations come from the
    tool's ``duration`` (not derivable from the details). Names as in :mod:`patchbench.suites.serving.parse`.
    """
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
    """Lines describing every metric where our recomputation disagrees with the tool's summary.

    EXACT metrics must agree to 1e-9 relative (1e-9 absolute near 0); APPROX metrics (ms) within
    max(rel_tol * value, abs_tol_ms); APPROX_REL within rel_tol. Metrics missing on either side
    (a release that does not write them) are skipped. Empty list: agreement.
    """
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
