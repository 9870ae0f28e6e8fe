"""Change points over a metric's whole nightly history (``ruptures``' PELT, penalty calibrated).

A series is one (variant, suite, metric): each night's level (the mean log value of its runs after
the outlier rule, :func:`patchbench.nightly.noise.night_level`), oldest first. It is divided by the sigma
of one night's level learned from the same series (:func:`patchbench.nightly.noise.sigma_steps`: first
differences, MAD-type, so a step or a steady decline does not inflate it), and
``ruptures.KernelCPD(kernel="linear", min_size=MIN_SIZE)`` (PELT with the l2 cost, in C) segments it with the penalty
``beta * log(nights)``. ``ruptures`` gives no p-values: ``beta`` (:data:`BETA`) is calibrated on
simulated quiet histories (tools/calibrate_nightly.py --part 3; docs/calibration.md has the table:
the false flags per quiet quarter and the delay until a 0.3 %-a-night decline is flagged).

Consecutive breakpoints in the same direction less than :data:`MERGE_NIGHTS` nights apart are
one change (a slow decline shows as a staircase): it spans from the first to the last of them,
and its size is the level after the last minus the level before the first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from patchbench.nightly.history import Key, Night
from patchbench.nightly.noise import night_level, sigma_steps, sigma_within

#: penalty factor: pen = BETA * log(nights) on the series in units of one night's sigma
#: (tools/calibrate_nightly.py --part 3: about 0.15 false flags per simulated quiet quarter,
#: a 0.3 %-a-night decline flagged within 10 nights at 1.5 % run noise and 14 at 3 %, p90)
BETA = 8.0
#: fewest nights of a segment
MIN_SIZE = 3
#: breakpoints in the same direction closer than this are one change
MERGE_NIGHTS = 10
#: fewest nights before the detector runs
MIN_NIGHTS = 10


@dataclass
class Change:
    """One change of level in a series.

    start / end: indices (in the series) of the first night at a new level for the first and the
    last breakpoint of the change (equal for a step); before / after: the mean log level of the
    segment before ``start`` and after ``end``; size_pct: ``100 * (exp(after - before) - 1)``."""

    start: int
    end: int
    before: float
    after: float

    @property
    def size_pct(self) -> float:
        return 100.0 * math.expm1(self.after - self.before)


def breakpoints(levels: Sequence[float], sigma: float, beta: float = BETA) -> list[int]:
    """Indices of the first night of each new segment (PELT, l2 cost, ``pen = beta * log n`` on
    ``levels / sigma``). Empty with fewer than :data:`MIN_NIGHTS` levels or no usable sigma.
    levels: log levels, oldest first (NaN not allowed)."""
    import ruptures as rpt

    x = np.asarray(levels, dtype=float)
    if x.size < MIN_NIGHTS or not (math.isfinite(sigma) and sigma > 0):
        return []
    z = ((x - np.median(x)) / sigma).reshape(-1, 1)
    algo = rpt.KernelCPD(kernel="linear", min_size=MIN_SIZE, jump=1).fit(z)
    return [int(b) for b in algo.predict(pen=beta * math.log(x.size))[:-1]]


def changes(levels: Sequence[float], sigma: float, beta: float = BETA) -> list[Change]:
    """The changes of a series (module docstring): breakpoints merged into changes."""
    x = np.asarray(levels, dtype=float)
    bk = breakpoints(x, sigma, beta)
    if not bk:
        return []
    edges = [0, *bk, x.size]
    means = [float(x[a:b].mean()) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    out: list[Change] = []
    for i, b in enumerate(bk):
        sign = 1 if means[i + 1] > means[i] else -1
        last = out[-1] if out else None
        if (
            last is not None
            and b - last.end < MERGE_NIGHTS
            and (1 if last.after > last.before else -1) == sign
        ):
            last.end, last.after = b, means[i + 1]
        else:
            out.append(Change(b, b, means[i], means[i + 1]))
    return out


def series_sigma(levels: Sequence[float]) -> float:
    """Sigma of one night's level of a series: :func:`patchbench.nightly.noise.sigma_steps`."""
    return sigma_steps([levels]).sigma


@dataclass
class ChangePoint:
    """A change of level in the nightly history of (variant, suite, metric), for the summary and
    the history's ``change_points`` table.

    run_id: the first night at the new level (first breakpoint); start_utc / end_utc: the nights
    the change spans (first night at a new level of its first and last breakpoint); nights: how
    many nights that is; before / after: the levels (metric unit, geometric means of the runs)
    before and after; size_pct: the change in percent; worse: True when it goes in the metric's
    bad direction (None: direction unknown); detected_run_id: the night whose run found it."""

    variant: str
    suite: str
    metric: str
    run_id: str
    start_utc: str
    end_run_id: str
    end_utc: str
    nights: int
    before: float
    after: float
    size_pct: float
    worse: bool | None
    detected_run_id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def detect_history(
    nights: Sequence[Night],
    keys: Sequence[Key],
    better: dict[tuple[str, str], str] | None = None,
    beta: float = BETA,
) -> list[ChangePoint]:
    """Change points of every key's series over ``nights`` (oldest first, tonight last).

    The run sigma for the outlier rule is learned from the same nights
    (:func:`patchbench.nightly.noise.sigma_within`). better: (suite, metric) -> "higher" / "lower".
    Returns the changes, oldest first per key."""
    out: list[ChangePoint] = []
    better = better or {}
    if not nights:
        return out
    detected = nights[-1].run_id
    for key in keys:
        logs = [
            [math.log(v) for v in n.values.get(key, []) if v is not None and v > 0] for n in nights
        ]
        have = [(n, lg) for n, lg in zip(nights, logs, strict=True) if lg]
        if len(have) < MIN_NIGHTS:
            continue
        rs = sigma_within([lg for _, lg in have]).sigma
        levels = [night_level(lg, rs) for _, lg in have]
        b = better.get(key[1:])
        for c in changes(levels, series_sigma(levels), beta):
            first, last = have[c.start][0], have[c.end][0]
            out.append(
                ChangePoint(
                    *key,
                    run_id=first.run_id,
                    start_utc=first.night_utc,
                    end_run_id=last.run_id,
                    end_utc=last.night_utc,
                    nights=c.end - c.start + 1,
                    before=math.exp(c.before),
                    after=math.exp(c.after),
                    size_pct=c.size_pct,
                    worse=None if b is None else ((c.after < c.before) == (b == "higher")),
                    detected_run_id=detected,
                )
            )
    return out


__all__ = [
    "BETA",
    "MIN_SIZE",
    "MERGE_NIGHTS",
    "MIN_NIGHTS",
    "Change",
    "ChangePoint",
    "breakpoints",
    "changes",
    "series_sigma",
    "detect_history",
]
