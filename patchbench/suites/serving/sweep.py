"""A load sweep of the serving suite: its points, names, prompts, order and cost (docs/serving.md).

A per-point metric is ``<metric>@<key>`` (docs/CONTRACTS.md, "Load sweeps"):
``output_throughput_tok_s@c16``, ``ttft_p99_ms@r2.5``; the unit suffix stays before the ``@``."""

from __future__ import annotations

import hashlib
import math
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the character between a metric's name and its point's key
POINT_SEP = "@"
#: the key prefix of each axis
_PREFIX = {"max_concurrency": "c", "request_rate": "r"}


class Slo(BaseModel):
    """The service-level objective of the curve metrics (docs/serving.md, "Curve metrics")."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float = Field(2000.0, gt=0)
    tpot_ms: float = Field(200.0, gt=0)
    percentile: float = Field(99.0, gt=0, le=100)


class Sweep(BaseModel):
    """``serving.sweep`` (docs/serving.md, "Load curves"): ``points`` integers for
    ``max_concurrency``, req/s for ``request_rate``; ``num_prompts`` when prompts_per_load is None."""

    model_config = ConfigDict(extra="forbid")

    axis: Literal["max_concurrency", "request_rate"] = "max_concurrency"
    points: list[float] = Field(min_length=1)
    prompts_per_load: float | None = Field(None, gt=0)
    min_prompts: int = Field(32, ge=1)
    delivered_share: float = Field(0.5, gt=0, le=1)
    slo: Slo = Field(default_factory=Slo)

    @model_validator(mode="after")
    def _check_points(self) -> Sweep:
        if any(p <= 0 or not math.isfinite(p) for p in self.points):
            raise ValueError("sweep points must be finite and > 0")
        if len(set(self.points)) != len(self.points):
            raise ValueError("sweep points must be distinct")
        if self.axis == "max_concurrency" and any(p != int(p) for p in self.points):
            raise ValueError("max_concurrency points must be whole numbers")
        return self

    def sorted_points(self) -> list[float]:
        """The points from the lowest load to the highest."""
        return sorted(self.points)

    def key(self, point: float) -> str:
        """The point's key: ``c16`` (concurrency 16), ``r2.5`` (2.5 req/s)."""
        return point_key(self.axis, point)

    def keys(self) -> list[str]:
        """Every point's key, lowest load first."""
        return [self.key(p) for p in self.sorted_points()]

    def num_prompts(self, point: float, default: int) -> int:
        """Prompts sent at ``point`` (``default``: the suite's num_prompts)."""
        if self.prompts_per_load is None:
            return default
        return max(self.min_prompts, math.ceil(self.prompts_per_load * point))


def point_key(axis: str, point: float) -> str:
    """``c<int>`` for a concurrency, ``r<number>`` for a request rate (``r2.5``, ``r4``)."""
    v = int(point) if float(point) == int(point) else point
    return f"{_PREFIX[axis]}{v}"


def metric_at(metric: str, key: str) -> str:
    """The per-point name: ``output_throughput_tok_s`` at ``c16`` -> ``output_throughput_tok_s@c16``."""
    return f"{metric}{POINT_SEP}{key}"


def point_of(name: str) -> str | None:
    """The point key of a per-point metric name, None for any other name."""
    return name.split(POINT_SEP, 1)[1] if POINT_SEP in name else None


def order_seed(variant: str, repeat: int) -> int:
    """The seed of a cell's point order: a hash of (variant, repeat), so each cell has its own
    order and a re-run of the cell the same one."""
    return int.from_bytes(hashlib.sha256(f"{variant}/{repeat}".encode()).digest()[:4], "big")


def point_order(sweep: Sweep, seed: int) -> list[float]:
    """The points in the order a cell runs them: shuffled with ``random.Random(seed)``."""
    pts = sweep.sorted_points()
    random.Random(seed).shuffle(pts)
    return pts


#: the H200 cost model of a sweep, an estimate for the dry run (docs/serving.md, "Cost"): a decode
#: step of 79 / (200 / 16 x 1024) s at batch 16, step(c) = step(16) x (1 + c / 64) / (1 + 16 / 64)
ANCHOR_SERVING_S, ANCHOR_PROMPTS, ANCHOR_CONCURRENCY, ANCHOR_OUTPUT_LEN = 79.0, 200, 16, 1024
POINT_OVERHEAD_S = 10.0
STARTUP_S = 60.0


def point_seconds(concurrency: float, prompts: int, output_len: int) -> float:
    """Estimated H200 seconds of one point at ``concurrency``: waves of requests x output_len decode
    steps x the step time at that batch, plus the point's overhead."""
    step16 = ANCHOR_SERVING_S / (ANCHOR_PROMPTS / ANCHOR_CONCURRENCY * ANCHOR_OUTPUT_LEN)
    c = max(1.0, concurrency)
    step = step16 * (1 + c / 64) / (1 + ANCHOR_CONCURRENCY / 64)
    waves = max(1.0, prompts / c)
    return waves * output_len * step + POINT_OVERHEAD_S


def cost_lines(
    sweep: Sweep, num_prompts: int, output_len: int, cells_per_round: int, cpu: bool = False
) -> list[str]:
    """The dry run's lines of a sweep: each point's prompts and estimated seconds, and the estimated
    H200 minutes of a cell and of a round of ``cells_per_round`` cells (a rate costed at the
    concurrency it reaches at the anchor's latency); with ``cpu`` the points and prompts only."""
    per, total = [], STARTUP_S
    for p in sweep.sorted_points():
        n = sweep.num_prompts(p, num_prompts)
        c = p if sweep.axis == "max_concurrency" else p * ANCHOR_SERVING_S / ANCHOR_PROMPTS * 16
        s = point_seconds(c, n, output_len)
        total += s
        per.append(f"{sweep.key(p)}: {n} prompts" + ("" if cpu else f" ~{s:.0f} s"))
    head = f"sweep ({sweep.axis}, order shuffled per cell): " + ", ".join(per)
    if cpu:
        return [
            head,
            "no time estimate on the CPU engine (the cost model in patchbench/suites/serving/sweep.py is "
            "an H200's)",
        ]
    rnd = total * cells_per_round / 60
    return [
        head,
        f"estimated H200 GPU minutes: ~{total / 60:.1f} a cell, ~{rnd:.1f} a repeat of the "
        f"{cells_per_round} variants (~{120 / rnd:.1f} repeats in 2 H200-hours); server start-up "
        f"{STARTUP_S:.0f} s a cell included; cost model in patchbench/suites/serving/sweep.py (the "
        "calibration's 79 s for the PR's 200 prompts at concurrency 16, step time linear in the "
        "batch: an estimate, not a measurement)",
    ]
