"""Curve metrics of a load sweep, from each point's ``requests.json`` (the same way on every pin;
definitions in docs/serving.md, "Curve metrics")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from .sweep import Slo

Answer = Literal["within the sweep", "beyond the sweep", "not reached"]


def request_tpot_ms(recs: dict) -> list[float | None]:
    """Each request's TPOT, (E2E - TTFT) / (output tokens - 1) in ms, from a requests.json dict
    (None for a failed request or one with < 2 output tokens)."""
    out: list[float | None] = []
    for st, ttft, e2e, n in zip(
        recs["status"], recs["ttft_ms"], recs["e2e_ms"], recs["output_len"], strict=True
    ):
        ok = st == "ok" and ttft is not None and e2e is not None and n and n > 1
        out.append((e2e - ttft) / (n - 1) if ok else None)
    return out


def goodput_req_s(recs: dict, duration_s: float, slo: Slo) -> float:
    """Requests per second that succeeded with TTFT <= slo.ttft_ms and TPOT <= slo.tpot_ms (one
    output token: TTFT alone) over ``duration_s``; ValueError for duration_s <= 0."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    good = 0
    for st, ttft, tpot in zip(recs["status"], recs["ttft_ms"], request_tpot_ms(recs), strict=True):
        if st != "ok" or ttft is None or ttft > slo.ttft_ms:
            continue
        if tpot is not None and tpot > slo.tpot_ms:
            continue
        good += 1
    return good / duration_s


def slo_ratio(recs: dict, slo: Slo) -> float | None:
    """max(TTFT p / slo.ttft_ms, TPOT p / slo.tpot_ms) at percentile p = slo.percentile over the
    successful requests (numpy's linear interpolation); None without one. <= 1 meets the SLO."""
    ttft = [t for s, t in zip(recs["status"], recs["ttft_ms"], strict=True) if s == "ok" and t]
    tpot = [t for t in request_tpot_ms(recs) if t is not None]
    if not ttft:
        return None
    r = float(np.percentile(ttft, slo.percentile)) / slo.ttft_ms
    if tpot:
        r = max(r, float(np.percentile(tpot, slo.percentile)) / slo.tpot_ms)
    return r


def per_user_tok_s(recs: dict) -> float | None:
    """Tokens per second one user sees: 1000 / the median TPOT (ms) of the successful requests;
    None without a TPOT."""
    tpot = [t for t in request_tpot_ms(recs) if t is not None and t > 0]
    return 1000.0 / float(np.median(tpot)) if tpot else None


@dataclass(frozen=True)
class MaxLoad:
    """The highest load meeting the SLO. value: the load (interpolated), the highest point for
    "beyond the sweep" (a lower bound), None for "not reached"; answer: which of the three."""

    value: float | None
    answer: Answer


def max_load_at_slo(loads: list[float], ratios: list[float | None]) -> MaxLoad:
    """The highest load meeting the SLO (docs/serving.md, "Curve metrics"). loads / ratios: the
    points' loads and SLO ratios (None: no measurement, failing); same lengths, >= 1 point, else
    ValueError."""
    if not loads or len(loads) != len(ratios):
        raise ValueError("loads and ratios must be non-empty and of the same length")
    pts = sorted(zip(loads, ratios, strict=True))
    prev: tuple[float, float] | None = None
    for load, r in pts:
        if r is None or r > 1.0:
            if prev is None:
                return MaxLoad(None, "not reached")
            if r is None:
                return MaxLoad(prev[0], "within the sweep")
            l0, r0 = prev
            return MaxLoad(l0 + (1.0 - r0) / (r - r0) * (load - l0), "within the sweep")
        prev = (load, r)
    return MaxLoad(pts[-1][0], "beyond the sweep")


def frontier(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the Pareto frontier of (throughput per GPU, tokens/s per user) points, both
    higher-better, sorted by tokens/s per user."""
    keep = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (a >= x and b >= y) and (a > x or b > y) for j, (a, b) in enumerate(points) if j != i
        )
        if not dominated:
            keep.append(i)
    return sorted(keep, key=lambda i: points[i][1])
