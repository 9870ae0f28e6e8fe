"""Change points over a metric's whole nightly history: since when, and how big.

A series is one (variant, suite, metric): each night's level (the mean log value of its runs after
the outlier rule, :func:`patchbench.nightly.noise.night_level`), oldest first, and sigma, one
night's level sigma learned from the same series (:func:`patchbench.nightly.noise.sigma_steps`:
first differences, MAD-type, so a step, a steady decline or a lone spike does not inflate it).
Three steps (:func:`analyse`), run again once when the second pass (below) raises sigma:

1. **One-night excursions are outliers, not changes.** A night (not the newest) is set aside when
   it is more than :data:`OUTLIER_K` sigmas from the median of the :data:`OUTLIER_WINDOW` nights
   before it *and* from the median of those after it, on the same side (the Hampel identifier,
   a moving-window median rule: Hampel 1974, JASA 69:383; Pearson 2002, IEEE Trans. Control
   Syst. Technol. 10:55; here its window split into the two one-sided halves, so the first night
   of a step, which sits at the level of the nights after it, is never set aside). A spike of one
   or two nights that returns to the level is thereby left out of the segmentation.
2. **Segments** of the remaining nights: PELT (Killick, Fearnhead & Eckley 2012, JASA 107:1590)
   with the l2 cost, ``ruptures.KernelCPD(kernel="linear", min_size=MIN_SIZE)`` (Truong, Oudre &
   Vayatis 2020, Signal Processing 167:107299), on the series in units of sigma, penalty
   ``BETA * log(nights)``. Segments of :data:`MIN_SIZE` = 2 nights let a step two nights old (its
   night and one later night that agrees) be found where it happened.
3. **The newest night** cannot be confirmed by a later one: when it is more than :data:`NEW_K`
   sigmas from the median of its segment's other nights (``NEW_K * sqrt(2)`` from the one other
   night of a two-night segment), the segmentation is redone without it and it is reported as a
   change *new tonight, unconfirmed* (``confirmed=False``): the next night confirms it (a step)
   or sets it aside (a spike), or tonight's confirmation run confirms it
   (:func:`confirm_by_run`).

**The second pass.** Sigma from a few first differences (MAD-type, a third as efficient as a
standard deviation) can come out far too small on a short history, and PELT then cuts ordinary
noise: most false change points of a quarter run every night were found on its first 20 nights.
After the first pass the nights' scatter about their segments' medians (outliers left out; a
standard deviation on nights minus segments degrees of freedom) gives a second estimate; its
upper :data:`SIGMA_BOUND` chi-square bound (:func:`patchbench.nightly.noise.noise_bound`: 1.11
times the estimate on 88 degrees of freedom, 1.51 on 8), when above sigma, replaces it and the
three steps run again.

Sizes are the medians of the segments (before the first and after the last breakpoint of a
change), so a spike inside a segment moves neither the size nor the marker. Consecutive
confirmed breakpoints in the same direction less than :data:`MERGE_NIGHTS` nights apart are one
change (a slow decline shows as a staircase): it spans from the first to the last of them.

``ruptures`` gives no p-values: :data:`BETA`, :data:`SIGMA_BOUND`, :data:`OUTLIER_K` and
:data:`NEW_K` are calibrated on seeded synthetic histories (``tools/changepoint_calibration.py``;
docs/nightly.md has the table: steps located within one night and sized within a third, false
change points per quarter, in tonight's view and over every night's run).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from patchbench.nightly.history import Key, Night
from patchbench.nightly.noise import night_level, noise_bound, sigma_steps, sigma_within

#: penalty factor: pen = BETA * log(nights) on the series in units of one night's sigma
#: (tools/changepoint_calibration.py: false confirmed change points per quiet quarter, the
#: detector run every night, under 0.1)
BETA = 5.0
#: the second pass's sigma is at least this one-sided chi-square bound (0.9: the upper 90 % bound)
#: of the scatter about the first pass's segments
SIGMA_BOUND = 0.9
#: fewest nights of a segment (a step is confirmed by one later night at its level)
MIN_SIZE = 2
#: confirmed breakpoints in the same direction closer than this many nights are one change
MERGE_NIGHTS = 10
#: fewest nights before the detector runs
MIN_NIGHTS = 10
#: a night this many sigmas from the medians on both sides is an outlier (Hampel identifier)
OUTLIER_K = 4.0
#: nights on each side whose median the outlier rule compares with
OUTLIER_WINDOW = 3
#: the newest night this many sigmas off its segment's median is a new, unconfirmed change
NEW_K = 4.0


@dataclass
class Change:
    """One change of level in a series.

    start / end: indices (in the series) of the first night at a new level for the first and the
    last breakpoint of the change (equal for a step); before / after: the median log level of the
    segment before ``start`` and after ``end`` (outlier nights left out); size_pct:
    ``100 * (exp(after - before) - 1)`` (percent); confirmed: False for a change on the newest
    night that no later night has confirmed yet."""

    start: int
    end: int
    before: float
    after: float
    confirmed: bool = True

    @property
    def size_pct(self) -> float:
        return 100.0 * math.expm1(self.after - self.before)


@dataclass
class Segmentation:
    """What :func:`analyse` found in a series: ``outliers``, indices of the nights set aside (one-
    or two-night excursions); ``edges``, the first night of each segment of the remaining nights
    and the series' length (``[0, ..., n]``; the newest night alone when it is a new change);
    ``changes``, the changes; ``new``: the newest night is a new, unconfirmed change; ``sigma``:
    the sigma (log) it segmented with (the second pass's, module docstring)."""

    outliers: list[int]
    edges: list[int]
    changes: list[Change]
    new: bool = False
    sigma: float = math.nan


def outlier_nights(
    levels: Sequence[float], sigma: float, k: float = OUTLIER_K, window: int = OUTLIER_WINDOW
) -> np.ndarray:
    """The one-night-excursion rule (module docstring, step 1): a boolean mask, True for a night
    more than ``k * sigma`` above (or below) both the median of the ``window`` nights before it
    and the median of the ``window`` nights after it (only the side that exists for the first
    night). The newest night is never an outlier (no night after it). levels: log levels."""
    x = np.asarray(levels, dtype=float)
    n = x.size
    if n < 2 or not (math.isfinite(sigma) and sigma > 0):
        return np.zeros(n, dtype=bool)
    pad = np.full(window, np.nan)
    win = np.lib.stride_tricks.sliding_window_view(np.concatenate([pad, x, pad]), window)
    with warnings.catch_warnings():  # the first night has no night before it
        warnings.simplefilter("ignore", RuntimeWarning)
        before = x - np.nanmedian(win[:n], axis=1)
    after = x[:-1] - np.nanmedian(win[window + 1 : window + n], axis=1)
    before = np.where(np.isnan(before[:-1]), after, before[:-1])
    out = (np.minimum(abs(after), abs(before)) > k * sigma) & (after * before > 0)
    return np.append(out, False)


def _pelt(z: np.ndarray, pen: float) -> list[int]:
    """PELT (l2) breakpoints of ``z`` (first index of each new segment), none when too short."""
    import ruptures as rpt

    if z.size < 2 * MIN_SIZE:
        return []
    algo = rpt.KernelCPD(kernel="linear", min_size=MIN_SIZE, jump=1).fit(z.reshape(-1, 1))
    return [int(b) for b in algo.predict(pen=pen)[:-1]]


def analyse(levels: Sequence[float], sigma: float, beta: float = BETA) -> Segmentation:
    """Outliers, segments and changes of a series (module docstring: three steps, and again with
    a larger sigma when the scatter about the segments says so). levels: log levels, oldest
    first (NaN not allowed); sigma: one night's level sigma (log). Nothing with fewer than
    :data:`MIN_NIGHTS` levels or no usable sigma."""
    x = np.asarray(levels, dtype=float)
    if x.size < MIN_NIGHTS or not (math.isfinite(sigma) and sigma > 0):
        return Segmentation([], [0, x.size], [])
    seg = _segment(x, sigma, beta)
    bound = residual_sigma(x, seg)
    return _segment(x, bound, beta) if bound > sigma else seg


def residual_sigma(levels: Sequence[float], seg: Segmentation, q: float = SIGMA_BOUND) -> float:
    """The upper ``q`` chi-square bound of the nights' scatter about their segments' medians
    (``seg.edges``; ``seg.outliers`` left out): ``sqrt(sum r^2 / df) * noise_bound(df, q)``, df
    the nights kept minus the segments; NaN when df < 1. levels: log levels."""
    x = np.asarray(levels, dtype=float)
    kept = np.ones(x.size, dtype=bool)
    kept[seg.outliers] = False
    r = [
        x[a:b][kept[a:b]] - np.median(x[a:b][kept[a:b]])
        for a, b in zip(seg.edges[:-1], seg.edges[1:], strict=True)
        if kept[a:b].any()
    ]
    df = int(kept.sum()) - len(r)
    if df < 1:
        return math.nan
    return math.sqrt(float(np.sum(np.concatenate(r) ** 2)) / df) * noise_bound(df, q)


def _segment(x: np.ndarray, sigma: float, beta: float) -> Segmentation:
    """One pass of the three steps (module docstring) with ``sigma``."""
    n = x.size
    out = outlier_nights(x, sigma)
    kept = np.flatnonzero(~out)
    y = x[kept]
    z = (y - np.median(y)) / sigma
    pen = beta * math.log(n)
    bk = _pelt(z, pen)
    a = bk[-1] if bk else 0
    if y.size - a >= 3:
        new = abs(y[-1] - np.median(y[a:-1])) > NEW_K * sigma
    else:
        new = abs(y[-1] - y[-2]) > NEW_K * math.sqrt(2.0) * sigma
    if new:
        bk = [*_pelt(z[:-1], pen), y.size - 1]
    edges = [0, *bk, y.size]
    med = [float(np.median(y[s:e])) for s, e in zip(edges[:-1], edges[1:], strict=True)]
    changes: list[Change] = []
    for i, b in enumerate(bk):
        night = int(kept[b])
        up = med[i + 1] > med[i]
        last = changes[-1] if changes else None
        if new and i == len(bk) - 1:
            changes.append(Change(night, night, med[i], med[i + 1], confirmed=False))
        elif (
            last is not None
            and night - last.end < MERGE_NIGHTS
            and (last.after > last.before) == up
        ):
            last.end, last.after = night, med[i + 1]
        else:
            changes.append(Change(night, night, med[i], med[i + 1]))
    night_edges = [0, *(int(kept[b]) for b in bk), n]
    outliers = [int(i) for i in np.flatnonzero(out)]
    return Segmentation(outliers, night_edges, changes, bool(new), sigma)


def breakpoints(levels: Sequence[float], sigma: float, beta: float = BETA) -> list[int]:
    """Indices of the first night of each new segment (:func:`analyse`; the newest night when it
    is a new, unconfirmed change). Empty with fewer than :data:`MIN_NIGHTS` levels or no usable
    sigma. levels: log levels, oldest first (NaN not allowed)."""
    return analyse(levels, sigma, beta).edges[1:-1]


def changes(levels: Sequence[float], sigma: float, beta: float = BETA) -> list[Change]:
    """The changes of a series (:func:`analyse`), oldest first."""
    return analyse(levels, sigma, beta).changes


def series_sigma(levels: Sequence[float]) -> float:
    """Sigma of one night's level of a series (log): :func:`patchbench.nightly.noise.sigma_steps`."""
    return sigma_steps([levels]).sigma


@dataclass
class ChangePoint:
    """A change of level in the nightly history of (variant, suite, metric), for the summary and
    the history's ``change_points`` table.

    run_id: the first night at the new level (first breakpoint); start_utc / end_utc: the nights
    the change spans (first night at a new level of its first and last breakpoint); nights: how
    many nights that is (1 for a step); before / after: the medians (metric unit) of the nights'
    median values in the segment before and after (outlier nights left out: a level some night
    had); size_pct: the change in percent of ``before``; change_abs: ``after - before`` (metric
    unit); worse: True when it goes in the metric's bad direction (None: direction unknown);
    detected_run_id: the night whose run found it; confirmed: False for a change on the newest
    night alone ("new tonight, unconfirmed") until a later night or a confirmation run confirms
    it; outliers: how many nights of the key's series were set aside as one-night excursions."""

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
    confirmed: bool = True
    outliers: int = 0

    @property
    def change_abs(self) -> float:
        return self.after - self.before

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"change_abs": self.change_abs}


def _median_value(nights: Sequence[Night], key: Key) -> float:
    """The median over ``nights`` of each night's median value of ``key`` (metric unit)."""
    vals = [v for v in (n.median(key) for n in nights) if v is not None]
    return float(np.median(vals)) if vals else math.nan


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
        seg = analyse(levels, series_sigma(levels), beta)
        kept = [h for i, (h, _) in enumerate(have) if i not in set(seg.outliers)]
        pos = {id(h): j for j, h in enumerate(kept)}
        # segments over the kept nights, for the medians in the metric's unit
        bounds = [0, *(pos[id(have[e][0])] for e in seg.edges[1:-1]), len(kept)]
        b = better.get(key[1:])
        for c in seg.changes:
            first, last = have[c.start][0], have[c.end][0]
            i0, i1 = bounds.index(pos[id(first)]), bounds.index(pos[id(last)])
            before = _median_value(kept[bounds[i0 - 1] : bounds[i0]], key)
            after = _median_value(kept[bounds[i1] : bounds[i1 + 1]], key)
            out.append(
                ChangePoint(
                    *key,
                    run_id=first.run_id,
                    start_utc=first.night_utc,
                    end_run_id=last.run_id,
                    end_utc=last.night_utc,
                    nights=c.end - c.start + 1,
                    before=before,
                    after=after,
                    size_pct=100.0 * (after / before - 1.0),
                    worse=None if b is None else ((after < before) == (b == "higher")),
                    detected_run_id=detected,
                    confirmed=c.confirmed,
                    outliers=len(seg.outliers),
                )
            )
    return out


def confirm_by_run(
    points: Iterable[dict[str, Any]], rows: Iterable[Mapping[str, Any]], run_id: str
) -> int:
    """Mark as confirmed (in place) each unconfirmed change point (``ChangePoint.to_json`` dicts)
    that starts on night ``run_id`` and whose (variant, suite, metric) tonight's confirmation run
    confirmed (``rows``: its history rows, :meth:`patchbench.nightly.confirm.Confirmation.rows`,
    verdict "confirmed"); returns how many it marked."""
    ok = {(r["variant"], r["suite"], r["metric"]) for r in rows if r.get("verdict") == "confirmed"}
    marked = 0
    for p in points:
        if not p.get("confirmed", True) and p.get("run_id") == run_id:
            if (p["variant"], p["suite"], p["metric"]) in ok:
                p["confirmed"] = True
                marked += 1
    return marked


__all__ = [
    "BETA",
    "SIGMA_BOUND",
    "MIN_SIZE",
    "MERGE_NIGHTS",
    "MIN_NIGHTS",
    "OUTLIER_K",
    "OUTLIER_WINDOW",
    "NEW_K",
    "Change",
    "ChangePoint",
    "Segmentation",
    "analyse",
    "breakpoints",
    "changes",
    "confirm_by_run",
    "outlier_nights",
    "residual_sigma",
    "series_sigma",
    "detect_history",
]
