"""The dashboard's pure decisions (patchbench/nightly/dashboard.py draws them): a night's
change against the reference in percent, the reference itself (the nights the gate used), the
axis (linear in percent, or log of the ratio where the range is wide), the nights as a night
axis, weekly medians beyond the last nights, the order of a page's metrics, the paging of its
nights table, a metric's name in words and what a page may say of a runner's paths."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: nights drawn one by one; older ones as weekly medians
FULL_NIGHTS = 90
#: a ratio range (max / min) beyond which the change axis is logarithmic
WIDE_RATIO = 2.0
#: without a history gate: the reference is the median of the baseline's last K clean nights
REFERENCE_NIGHTS = 14
#: the nights table of a config page: the latest nights on the page, older ones on pages of
SHOWN_NIGHTS = 30
NIGHTS_PER_PAGE = 500
#: the longest patch state a table cell shows (the full text on hover)
PATCH_CHARS = 40


def pct_change(value: float, reference: float | None) -> float | None:
    """``value`` against ``reference`` in percent (110 against 100: +10.0); None without a
    positive reference."""
    if reference is None or reference <= 0:
        return None
    return 100.0 * (value / reference - 1.0)


def log_axis(pcts: list[float]) -> bool:
    """Whether the changes ``pcts`` (percent) span a range wide enough for a log axis of the
    ratio: max ratio / min ratio above :data:`WIDE_RATIO` (a spike of +150 % beside a -10 %
    night); never with a ratio of 0 or below."""
    ratios = [1 + p / 100 for p in pcts]
    if not ratios or min(ratios) <= 0:
        return False
    return max(ratios) / min(ratios) > WIDE_RATIO


def reference_of(
    medians: dict[str, float],
    order: list[str],
    used: list[str] | None,
    left_out: set[str],
    k: int = REFERENCE_NIGHTS,
) -> tuple[float | None, list[str]]:
    """The reference a chart's changes are against, and the nights it is made of: the median
    of the baseline's nightly ``medians`` (run id -> median) over the nights the latest
    history gate used (``used``, its ``window_run_ids``), else over the last ``k`` nights of
    ``order`` (run ids, oldest first) not in ``left_out`` (red or invalid nights, as the gate
    leaves them out). (None, []) without such a night."""
    if used:
        runs = [r for r in used if r in medians]
    else:
        runs = [r for r in order if r in medians and r not in left_out][-k:]
    if not runs:
        return None, []
    return statistics.median(medians[r] for r in runs), runs


@dataclass
class ChartPoint:
    """One point of a chart: ``x`` its place on the night axis (a night's index; a week's
    points at the mean index of its nights), the median and range (metric unit), the nights
    it stands for (``run_ids``; one for a night), ``label`` what the hover says of it."""

    x: float
    median: float
    low: float
    high: float
    run_ids: list[str]
    label: str


def night_index(night_utcs: list[tuple[str, str]]) -> dict[str, int]:
    """The night axis: (run id, night_utc) oldest first -> run id -> its place 0, 1, 2, ...
    (a manual rerun 40 minutes after a night is its own place, never on top of it)."""
    return {run_id: i for i, (run_id, _utc) in enumerate(night_utcs)}


def week_of(night_utc: str) -> str:
    """The ISO week of a night, ``2026-W02``."""
    y, w, _d = datetime.strptime(night_utc[:10], "%Y-%m-%d").isocalendar()
    return f"{y}-W{w:02d}"


def downsample(
    points: list[Any], index: dict[str, int], full: int = FULL_NIGHTS
) -> list[ChartPoint]:
    """A series' chart points: its last ``full`` nights of the axis one by one, older nights
    as one point per ISO week (the median of the week's nightly medians, their range, at the
    mean place of the week's nights). ``points``: objects with run_id, night_utc, median,
    low, high (:class:`patchbench.nightly.history.Point`), oldest first; ``index``: the night
    axis (:func:`night_index`)."""
    cut = max(index.values(), default=-1) + 1 - full
    out: list[ChartPoint] = []
    week: list[Any] = []

    def flush() -> None:
        if week:
            meds = [p.median for p in week]
            out.append(
                ChartPoint(
                    sum(index[p.run_id] for p in week) / len(week),
                    statistics.median(meds),
                    min(meds),
                    max(meds),
                    [p.run_id for p in week],
                    f"week {week_of(week[0].night_utc)}: median of {len(week)} night(s)",
                )
            )
            week.clear()

    for p in points:
        if p.run_id not in index:
            continue
        if index[p.run_id] >= cut:
            flush()
            out.append(ChartPoint(index[p.run_id], p.median, p.low, p.high, [p.run_id], p.run_id))
        else:
            if week and week_of(week[0].night_utc) != week_of(p.night_utc):
                flush()
            week.append(p)
    flush()
    return out


def metric_order(
    metrics: list[tuple[str, str]], gated: set[tuple[str, str]], primary: set[tuple[str, str]]
) -> list[tuple[str, tuple[str, str]]]:
    """A page's metrics in the order it shows them, each with its group: "gated" (a gate tests
    it), then "primary" (the suite's primaries), then "other", alphabetically within a group."""

    def group(m: tuple[str, str]) -> int:
        return 0 if m in gated else (1 if m in primary else 2)

    names = ("gated", "primary", "other")
    return [(names[group(m)], m) for m in sorted(metrics, key=lambda m: (group(m), m))]


def night_pages(
    total: int, shown: int = SHOWN_NIGHTS, per_page: int = NIGHTS_PER_PAGE
) -> tuple[range, list[range]]:
    """The paging of ``total`` nights (indices oldest first): the indices the config page
    shows (its latest ``shown``), and the older ones in pages of ``per_page`` counted from the
    oldest (page 1 holds nights 0 to per_page - 1), so an older page never changes when a night
    is added, but the newest one."""
    first = max(0, total - shown)
    pages = [range(s, min(s + per_page, first)) for s in range(0, first, per_page)]
    return range(first, total), pages


def short_patch(builds: list[dict[str, Any]], limit: int = PATCH_CHARS) -> str:
    """A night's patch state for a table cell: ``variant: state`` per variant with a state (the
    details left out), cut at ``limit`` characters with "…"."""
    text = ", ".join(f"{b['variant']}: {b['state']}" for b in builds if b.get("state"))
    return text if len(text) <= limit else text[: limit - 1].rstrip(", ") + "…"


def metric_words(suite: str, metric: str) -> str:
    """A metric's name in words, as its suite labels it ("Median TTFT"), the unit left out;
    the name with ``_`` as spaces and its unit suffix dropped when the suite has no label."""
    label = ""
    try:
        from patchbench.suite import get_suite

        known = get_suite(suite).metrics
        info = known.get(metric) or known.get(metric.split("@", 1)[0])
        label = (getattr(info, "label", "") or "") if info is not None else ""
    except Exception:  # noqa: BLE001 (a suite that does not import keeps the name)
        label = ""
    label = re.sub(r"\s*\([^)]*\)\s*:?\s*$", "", label).rstrip(":").strip()
    if label:
        at = metric.split("@", 1)[1] if "@" in metric else ""
        return f"{label} @ {at}" if at else label
    base = re.sub(r"_(ms|s|tok_s|req_s|count|pct)$", "", metric)
    return base.replace("_", " ")


def site_text(text: str, roots: dict[str, str]) -> str:
    """``text`` as a page of the site may show it: each absolute path under a key of ``roots``
    (a runner's run folder, its history file) replaced by its value (a name relative to the
    site, or the file's name), longest first; then any other absolute path of the runner
    (``/a/b/...`` after a space, a quote, a bracket or a backquote) as ``…/`` and its last
    name."""
    for root in sorted(roots, key=len, reverse=True):
        if root.startswith("/") and root.rstrip("/"):
            text = re.sub(rf"{re.escape(root.rstrip('/'))}(?=/|\b|$)", roots[root], text)
    return re.sub(r"(?<=[\s`'\"(\[=])/(?:[\w.@+-]+/)+([\w.@+-]+)", r"…/\1", text)


__all__ = [
    "FULL_NIGHTS",
    "NIGHTS_PER_PAGE",
    "SHOWN_NIGHTS",
    "ChartPoint",
    "downsample",
    "log_axis",
    "metric_order",
    "metric_words",
    "night_index",
    "night_pages",
    "pct_change",
    "reference_of",
    "short_patch",
    "site_text",
    "week_of",
]
