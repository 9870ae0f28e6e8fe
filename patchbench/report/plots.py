"""Plots of a comparison, from the typed comparison alone: PNGs legible at a PR's width (900
px), matplotlib Agg. The PR figure (:func:`plot_pr_figure`): each primary's change and interval
at the level its verdict used, coloured by verdict (hollow grey without an interval), its
baseline -> variant values beside it, run metrics on a log-ratio axis ticked in %, accuracy in
points, counts on their own scale, the margin band (behind points with an interval only) and the
better direction labelled, the run's subtitle (:mod:`patchbench.report.figtext`); then each
suite's ``plots`` hook. :func:`make_plots` saves them under ``RUN/plots/``.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator

import patchbench.report.figtext as figtext
from patchbench import records
from patchbench.analysis.comparison import Comparison, Row

WIDTH_IN, DPI = 9.0, 100  # 900 px wide
COLOURS = {
    "improved": "tab:green",
    "regressed": "tab:red",
    "equivalent": "tab:blue",
    "inconclusive": "tab:gray",
    "incomplete": "lightgray",
}
MARGIN_COLOUR = "tab:blue"
#: a panel title's characters per line, and lines at most
TITLE_WIDTH, TITLE_LINES = 30, 2


def _change_marker(r) -> str:
    """ "o"; ">" / "<" when the true change can only be larger / smaller (a bound); "x" both."""
    up = r.variant_bound == "lower" or r.baseline_bound == "upper"
    down = r.variant_bound == "upper" or r.baseline_bound == "lower"
    return "x" if up and down else ">" if up else "<" if down else "o"


def panel_title(r: Row) -> str:
    """The row's short label on at most :data:`TITLE_LINES` lines ("..." where cut)."""
    return textwrap.fill(r.short_label(), TITLE_WIDTH, max_lines=TITLE_LINES, placeholder=" ...")


def _better_label(r: Row, what: str) -> str:
    """ "change (%)  ·  better →", "← better  ·  ..." or ``what``."""
    if r.better == "higher":
        return f"{what}  ·  better →"
    if r.better == "lower":
        return f"← better  ·  {what}"
    return what


def _pct(x: float, _pos: object = None) -> str:
    return "0%" if abs(x) < 1e-9 else f"{x:+.3g}%"  # "+10%", "0%", "-4.8%"


def _to_log_ratio(x):  # percent change -> log ratio: the axis positions
    return np.log1p(np.maximum(np.asarray(x, dtype=float), -99.9) / 100)


def _to_pct(y):
    return 100 * np.expm1(np.asarray(y, dtype=float))


#: the percent changes a log-ratio axis may tick at
NICE_PCT = (1, 2, 5, 10, 20, 30, 50, 100, 200, 500, 1000)
NICE_PCT_DOWN = (1, 2, 5, 10, 20, 30, 40, 50, 80, 90, 95, 99)


def pct_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Ticks in percent for a log-ratio axis from ``lo`` to ``hi``: 0 and round changes taken
    outward from 0 while at least (hi - lo) / ``most`` apart (no two labels collide)."""
    sep = (hi - lo) / most
    out = [0.0] if lo <= 0 <= hi else []
    for side in (NICE_PCT, tuple(-x for x in NICE_PCT_DOWN)):
        last = 0.0
        for p in side:
            y = math.log1p(p / 100)
            if not lo <= y <= hi:
                continue
            if abs(y - last) >= sep:
                out.append(float(p))
                last = y
    if len(out) < 2:  # a narrow axis away from 0: its ends
        out = sorted(set(out) | {round(100 * math.expm1(lo), 1), round(100 * math.expm1(hi), 1)})
    return sorted(out)


def _margin_span(r: Row) -> tuple[float, float] | None:
    """The equivalence region in the row's unit: [1/(1+m) - 1, m] % for a run row (symmetric
    in log), +-m points for accuracy; None without a margin."""
    if r.margin is None:
        return None
    if r.change_unit == "%":
        return 100 * (1 / (1 + r.margin / 100) - 1), r.margin
    if r.change_unit == "pt":
        return -r.margin, r.margin
    return None


def _margin_text(r: Row) -> str:
    return f"margin ±{r.margin:g}{'%' if r.change_unit == '%' else ' pt'}"


def _change_axis(ax, which: str, lo: float, hi: float, unit: str, most: int = 6) -> str:
    """Scale the ``which`` ("x" / "y") axis of a change from ``lo`` to ``hi``, padded: percent on
    the log-ratio axis with round ticks, else linear. Returns the axis label."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    set_lim = ax.set_xlim if which == "x" else ax.set_ylim
    if unit == "%":
        (ax.set_xscale if which == "x" else ax.set_yscale)(
            "function", functions=(_to_log_ratio, _to_pct)
        )
        a, b = math.log1p(max(lo, -99.9) / 100), math.log1p(hi / 100)
        pad = 0.08 * (b - a or 0.1)
        set_lim(100 * math.expm1(a - pad), 100 * math.expm1(b + pad))
        axis.set_major_locator(FixedLocator(pct_ticks(a - pad, b + pad, most)))
        axis.set_major_formatter(FuncFormatter(_pct))
        return "change (%), log-ratio axis"
    pad = 0.08 * (hi - lo or 1.0)
    set_lim(lo - pad, hi + pad)
    return f"change ({unit or 'difference'})"


#: half the height of a row's equivalence band (rows are 1 apart)
BAND_HALF = 0.4
NO_INTERVAL_COLOUR = "tab:gray"


def _point_style(r: Row) -> dict:
    """A change dot's colour and face: its verdict's colour, filled, with an interval; hollow
    grey without one (nothing was decided around it)."""
    if figtext.has_interval(r):
        c = COLOURS.get(r.verdict, "tab:gray")
        return {"color": c, "markerfacecolor": c}
    return {"color": NO_INTERVAL_COLOUR, "markerfacecolor": "white"}


def _draw_changes(ax, rows: list[tuple[int, Row]], r0: Row) -> None:
    """Interval bars and change dots per variant (hollow grey without an interval), each
    variant's absolute values beside its change, the margin band behind the points with an
    interval only (:func:`patchbench.report.figtext.band_points`)."""
    xs = [0.0]
    for y, r in rows:
        c = COLOURS.get(r.verdict, "tab:gray")
        if figtext.has_interval(r):
            ax.plot([r.low, r.high], [y, y], color=c, lw=3, solid_capstyle="butt")
            xs += [r.low, r.high]
        if r.change is not None:
            ax.plot([r.change], [y], _change_marker(r), ms=7, **_point_style(r))
            xs.append(r.change)
        shown = figtext.values_text(r)
        if shown:
            at = {"transform": ax.get_yaxis_transform(), "ha": "center", "va": "bottom"}
            box = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1}
            ax.text(0.5, y - 0.12, shown, **at, fontsize=7, color="0.25", bbox=box)
    span = _margin_span(r0)
    banded = figtext.band_points(rows)
    if span is not None and banded:
        for y in banded:
            ax.fill_betweenx(
                [y - BAND_HALF, y + BAND_HALF], *span, color=MARGIN_COLOUR, alpha=0.1, lw=0
            )
        at = {"transform": ax.get_xaxis_transform(), "ha": "center", "va": "bottom"}
        ax.text(0, 1.0, _margin_text(r0), **at, fontsize=7, color=MARGIN_COLOUR)
        xs += list(span)
    ax.axvline(0, color="black", lw=0.8)
    what = _change_axis(ax, "x", min(xs), max(xs), r0.change_unit)
    ax.set_xlabel(_better_label(r0, what), fontsize=8)


def _draw_counts(ax, rows: list[tuple[int, Row]], r0: Row) -> None:
    """A count on its own scale: the baseline dashed, each variant's value a dot joined to it."""
    base = r0.baseline_value
    xs = [base] if base is not None else []
    if base is not None:
        ax.axvline(base, color="black", lw=1, ls="--")
        at = {"transform": ax.get_xaxis_transform(), "ha": "center", "va": "bottom"}
        ax.text(base, 1.0, "baseline", **at, fontsize=7)
    for y, r in rows:
        if r.variant_value is None:
            continue
        c = COLOURS.get(r.verdict, "tab:gray")
        if base is not None:
            ax.plot([base, r.variant_value], [y, y], color=c, lw=1.5, alpha=0.6)
        ax.plot([r.variant_value], [y], _change_marker(r), color=c, ms=7)
        xs.append(r.variant_value)
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    pad = 0.08 * (hi - lo) if hi > lo else 1.0
    ax.set_xlim(lo - pad, hi + pad)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.set_xlabel(_better_label(r0, f"{r0.unit or 'value'} (its own scale)"), fontsize=8)


def _legend_handles(rows: list[Row], min_repeats: int = 3) -> list:
    """The verdicts shown, one hollow grey entry per reason a point has no interval ("no
    interval: n < 3") and the margin band where one is drawn."""
    drawn = [r for r in rows if r.kind != "deterministic" and r.change is not None]
    handles = [
        plt.Line2D([], [], color=c, lw=3, label=v)
        for v, c in COLOURS.items()
        if any(
            r.verdict == v and (r.kind == "deterministic" or figtext.has_interval(r)) for r in rows
        )
    ]
    hollow = {"marker": "o", "ls": "", "markerfacecolor": "white", "color": NO_INTERVAL_COLOUR}
    labels = [
        figtext.no_interval_label(r, min_repeats) for r in drawn if not figtext.has_interval(r)
    ]
    handles += [plt.Line2D([], [], **hollow, label=t) for t in dict.fromkeys(labels)]
    if any(_margin_span(r) is not None for r in drawn if figtext.band_points([(0, r)])):
        handles.append(
            plt.Rectangle((0, 0), 1, 1, color=MARGIN_COLOUR, alpha=0.1, label="equivalence margin")
        )
    return handles


#: the separator of a per-point metric's name (``output_throughput_tok_s@c16``, docs/CONTRACTS.md)
POINT_SEP = "@"


def _curve_panel(ax, cmp: Comparison, suite: str, base: str, points: list[str]) -> None:
    """A load sweep's primary ``base``: each variant's change and interval at each point."""
    nv = max(1, len(cmp.variants))
    r0: Row | None = None
    ys = [0.0]
    placed: list[tuple[float, Row]] = []
    for j, v in enumerate(cmp.variants):
        for i, k in enumerate(points):
            r = cmp.row(suite, f"{base}{POINT_SEP}{k}", v)
            if r is None:
                continue
            r0 = r0 or r
            x = i + (j - (nv - 1) / 2) * 0.6 / nv
            placed.append((x, r))
            c = COLOURS.get(r.verdict, "tab:gray")
            if figtext.has_interval(r):
                ax.plot([x, x], [r.low, r.high], color=c, lw=3, solid_capstyle="butt")
                ys += [r.low, r.high]
            if r.change is not None:
                ax.plot([x], [r.change], "osD^v"[j % 5], ms=4, **_point_style(r))
                ys.append(r.change)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(points)), points)
    ax.tick_params(labelsize=8)
    if r0 is None:
        ax.set_title(textwrap.fill(f"{base} per load", TITLE_WIDTH), fontsize=9)
        return
    span = _margin_span(r0)
    banded = figtext.band_points(placed)
    if span is not None and banded:
        half = 0.3 / nv
        for x in banded:
            ax.fill_between([x - half, x + half], *span, color=MARGIN_COLOUR, alpha=0.08, lw=0)
        at = {"transform": ax.get_yaxis_transform(), "ha": "left", "va": "center"}
        ax.text(1.0, span[1], f" {_margin_text(r0)}", **at, fontsize=7, color=MARGIN_COLOUR)
        ys += list(span)
    what = _change_axis(ax, "y", min(ys), max(ys), r0.change_unit, most=5)
    better = {"higher": " · better ↑", "lower": " · better ↓"}.get(r0.better or "", "")
    ax.set_ylabel(what + better, fontsize=8)
    # a per-point label names its point ("... at concurrency 16 (tok/s):"); the panel has them all
    label = re.sub(r" at [a-z ]+ [0-9.]+(?= \(|:|$)", "", r0.label or base)
    title = f"{label.rstrip(': ')} per load"
    title = textwrap.fill(title, TITLE_WIDTH + 10, max_lines=TITLE_LINES, placeholder=" ...")
    ax.set_title(title, fontsize=9)


def _panels(cmp: Comparison) -> list[tuple[str, str, list[str] | None]]:
    """(suite, metric, None) per primary with a value to draw, and (suite, base metric, [point
    keys]) once for a load sweep's per-point primaries ``<base>@<point>``, in row order."""
    out: list[tuple[str, str, list[str] | None]] = []
    curves: dict[tuple[str, str], list[str]] = {}
    for r in cmp.rows_for(primary=True):
        if POINT_SEP in r.metric:
            base, k = r.metric.split(POINT_SEP, 1)
            if (r.suite, base) not in curves:
                curves[(r.suite, base)] = []
                out.append((r.suite, base, curves[(r.suite, base)]))
            if k not in curves[(r.suite, base)]:
                curves[(r.suite, base)].append(k)
        elif (r.change is not None or r.variant_value is not None) and (
            (r.suite, r.metric, None) not in out
        ):
            out.append((r.suite, r.metric, None))
    return out


def _suite_panels(cmp: Comparison) -> list:
    """Every suite's own PR-figure panels (``Suite.pr_panels``: callables drawing one axes)."""
    from patchbench.suite import get_suite

    out = []
    for suite in cmp.suites:
        try:
            out += get_suite(suite).pr_panels(cmp)
        except Exception:  # noqa: BLE001 - an unknown suite, or one that fails to import: none
            continue
    return out


def plot_pr_figure(cmp: Comparison) -> Figure | None:
    """One panel per primary metric with a value (:func:`_draw_changes`, or :func:`_draw_counts`
    for a count), the variants on the y axis; the suites' own panels (``Suite.pr_panels``, e.g.
    the capacity's attainment against load) and a load sweep's per-point primaries of one metric
    on one panel, change against load (:func:`_curve_panel`), first. None when no primary has a
    value to draw."""
    own = _suite_panels(cmp)
    panels = own + sorted(_panels(cmp), key=lambda p: p[2] is None)
    if not panels:
        return None
    curves = any(not callable(p) and p[2] is not None for p in panels)
    tall = curves or bool(own)
    names = list(cmp.variants)
    ncols = min(len(panels), 2 if tall else 3)
    nrows = math.ceil(len(panels) / ncols)
    height = 2.9 * nrows + 0.8 if tall else (0.4 * len(names) + 1.5) * nrows + 1.1
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH_IN, height), dpi=DPI, squeeze=False)
    flat = [a for row in axes for a in row]
    for i, (ax, panel) in enumerate(zip(flat, panels, strict=False)):
        if callable(panel):
            panel(ax)
            continue
        suite, metric, pts = panel
        if pts is not None:
            _curve_panel(ax, cmp, suite, metric, pts)
            continue
        rows = [(y, cmp.row(suite, metric, v)) for y, v in enumerate(names)]
        rows = [(y, r) for y, r in rows if r is not None]
        if not rows:
            ax.axis("off")
            continue
        r0 = rows[0][1]
        (_draw_counts if r0.kind == "deterministic" else _draw_changes)(ax, rows, r0)
        ax.set_ylim(len(names) - 0.5, -0.5)
        shown = tall or i % ncols == 0
        ax.set_yticks(range(len(names)), names if shown else [""] * len(names))
        ax.set_title(panel_title(r0), fontsize=9, pad=12)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    primaries = cmp.rows_for(primary=True)
    handles = _legend_handles(primaries, cmp.settings.min_repeats)
    if curves:
        handles += [
            plt.Line2D([], [], ls="", marker="osD^v"[j % 5], color="black", label=v)
            for j, v in enumerate(cmp.variants)
        ]
    judged = [r for r in primaries if r.kind != "deterministic" and r.change is not None]
    words = figtext.change_title(sum(map(figtext.has_interval, judged)), len(judged))
    ncol = min(len(handles), 6)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.suptitle(
        figtext.figure_title(f"Primary metrics vs {cmp.baseline}: {words}", cmp), fontsize=10
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.93) if tall else (0, 0.05, 1, 0.94))
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Save a figure as PNG atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return records.write_bytes(path, buf.getvalue())


def make_plots(cmp: Comparison, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Save the PR figure and every suite's plots into ``out_dir``. Returns (paths, notes on
    plots that failed or had nothing to draw); a failing plot does not stop the others."""
    from patchbench.suite import get_suite

    out_dir = Path(out_dir)
    saved, notes = [], []
    try:
        fig = plot_pr_figure(cmp)
        if fig is not None:
            saved.append(save_png(fig, out_dir / "pr_figure.png"))
        elif cmp.rows_for(primary=True):
            notes.append("no PR figure: no primary metric has a value to draw")
    except Exception as e:  # noqa: BLE001 - a plot must never cost the report
        notes.append(f"plot pr_figure.png failed: {type(e).__name__}: {e}")
    for suite in cmp.suites:
        try:
            obj = get_suite(suite)
        except Exception:  # noqa: BLE001 - an unknown suite, or one that fails to import: no plots
            continue
        try:
            saved += [Path(p) for p in (obj.plots(cmp, out_dir) or [])]
        except Exception as e:  # noqa: BLE001
            notes.append(f"{suite} plots failed: {type(e).__name__}: {e}")
    return saved, notes
