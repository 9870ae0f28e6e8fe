"""Plots of a comparison: PNGs legible at a PR's width (900 px), matplotlib Agg.

Rendered only from the typed :class:`~patchbench.analysis.comparison.Comparison`:

- :func:`plot_pr_figure`: the "PR figure": every primary metric (one panel each) with each
  variant's change and its interval at the level the verdict used, coloured by verdict. Run
  metrics on a log-ratio axis (ticks in %; the equivalence margin is symmetric there), accuracy
  in points, deterministic counts on their own scale (the baseline's and each variant's value);
  the margin band and the better direction labelled;
- each suite's own figures through its ``plots(comparison, out_dir)`` hook (a suite returns no
  path for a plot with nothing to show).

:func:`make_plots` saves them under ``RUN/plots/``.
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

__all__ = ["plot_pr_figure", "make_plots", "save_png"]


def _change_marker(r) -> str:
    """ "o" for a change that is exact or estimated; ">" when the true change can only be larger
    (the variant's value a lower bound or the baseline's an upper one), "<" when only smaller,
    "x" when unbounded both ways."""
    up = r.variant_bound == "lower" or r.baseline_bound == "upper"
    down = r.variant_bound == "upper" or r.baseline_bound == "lower"
    return "x" if up and down else ">" if up else "<" if down else "o"


def panel_title(r: Row) -> str:
    """A panel's title: the row's short label (:meth:`Row.short_label`), at most
    :data:`TITLE_LINES` lines of :data:`TITLE_WIDTH` characters ("..." where cut)."""
    return textwrap.fill(r.short_label(), TITLE_WIDTH, max_lines=TITLE_LINES, placeholder=" ...")


def _better_label(r: Row, what: str) -> str:
    """The x label with the better direction: "change (%)  ·  better →", "← better  ·  ..."."""
    if r.better == "higher":
        return f"{what}  ·  better →"
    if r.better == "lower":
        return f"← better  ·  {what}"
    return what


def _pct(x: float, _pos: object = None) -> str:
    """A tick of a change in percent: "+10%", "0%", "-4.8%"."""
    return "0%" if abs(x) < 1e-9 else f"{x:+.3g}%"


def _to_log_ratio(x):
    """Percent change -> log ratio (the PR figure's axis positions); arrays in, arrays out."""
    return np.log1p(np.maximum(np.asarray(x, dtype=float), -99.9) / 100)


def _to_pct(y):
    """Log ratio -> percent change (the inverse of :func:`_to_log_ratio`)."""
    return 100 * np.expm1(np.asarray(y, dtype=float))


#: the percent changes a log-ratio axis may tick at
NICE_PCT = (1, 2, 5, 10, 20, 30, 50, 100, 200, 500, 1000)
NICE_PCT_DOWN = (1, 2, 5, 10, 20, 30, 40, 50, 80, 90, 95, 99)


def pct_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Ticks in percent for a log-ratio axis from ``lo`` to ``hi`` (log ratios): 0 and round
    changes (+-1, 2, 5, 10, 20, 50 ... %), taken outward from 0 on each side while they stay at
    least (hi - lo) / ``most`` apart on the axis, so that no two labels collide."""
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
    """The equivalence region of a row in its display unit: [1/(1+m) - 1, m] in percent for a
    run row (symmetric on the log scale), +-m points for accuracy; None without a margin."""
    if r.margin is None:
        return None
    if r.change_unit == "%":
        return 100 * (1 / (1 + r.margin / 100) - 1), r.margin
    if r.change_unit == "pt":
        return -r.margin, r.margin
    return None


def _margin_text(r: Row) -> str:
    """The margin band's label: "margin ±5%", "margin ±2 pt"."""
    return f"margin ±{r.margin:g}{'%' if r.change_unit == '%' else ' pt'}"


def _change_axis(ax, which: str, lo: float, hi: float, unit: str, most: int = 6) -> str:
    """Scale the ``which`` ("x" or "y") axis of a change from ``lo`` to ``hi`` (padded): a
    percent change on the log-ratio axis (positions log(1 + x/100), round ticks in percent),
    anything else linear. Returns the axis label's text (without the better direction)."""
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


def _draw_changes(ax, rows: list[tuple[int, Row]], r0: Row) -> None:
    """Interval bars and change dots of a run or accuracy panel (y: the variant's index; a
    change without an interval is a hollow dot), the margin band labelled, zero marked."""
    xs = [0.0]
    for y, r in rows:
        c = COLOURS.get(r.verdict, "tab:gray")
        if r.low is not None and r.high is not None:
            ax.plot([r.low, r.high], [y, y], color=c, lw=3, solid_capstyle="butt")
            xs += [r.low, r.high]
        if r.change is not None:
            hollow = r.low is None or r.high is None
            ax.plot(
                [r.change],
                [y],
                _change_marker(r),
                color=c,
                ms=7,
                markerfacecolor="white" if hollow else c,
            )
            xs.append(r.change)
    span = _margin_span(r0)
    if span is not None:
        ax.axvspan(*span, color=MARGIN_COLOUR, alpha=0.1, lw=0)
        ax.text(
            0,
            1.0,
            _margin_text(r0),
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7,
            color=MARGIN_COLOUR,
        )
        xs += list(span)
    ax.axvline(0, color="black", lw=0.8)
    what = _change_axis(ax, "x", min(xs), max(xs), r0.change_unit)
    ax.set_xlabel(_better_label(r0, what), fontsize=8)


def _draw_counts(ax, rows: list[tuple[int, Row]], r0: Row) -> None:
    """A deterministic panel on the count's own scale: the baseline's value as a dashed line,
    each variant's value as a dot (a bound as an arrowhead) joined to it."""
    base = r0.baseline_value
    xs = [base] if base is not None else []
    if base is not None:
        ax.axvline(base, color="black", lw=1, ls="--")
        ax.text(
            base,
            1.0,
            "baseline",
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="bottom",
            fontsize=7,
        )
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


def _legend_handles(rows: list[Row]) -> list:
    """The PR figure's legend: the verdicts its panels show, a hollow dot when a change has no
    interval, the margin band when a panel draws one."""
    handles = [
        plt.Line2D([], [], color=c, lw=3, label=v)
        for v, c in COLOURS.items()
        if any(r.verdict == v for r in rows)
    ]
    drawn = [r for r in rows if r.kind != "deterministic" and r.change is not None]
    if any(r.low is None or r.high is None for r in drawn):
        handles.append(
            plt.Line2D(
                [],
                [],
                color="tab:gray",
                marker="o",
                ls="",
                markerfacecolor="white",
                label="no interval",
            )
        )
    if any(_margin_span(r) is not None for r in drawn):
        handles.append(
            plt.Rectangle((0, 0), 1, 1, color=MARGIN_COLOUR, alpha=0.1, label="equivalence margin")
        )
    return handles


#: the separator of a per-point metric's name (``output_throughput_tok_s@c16``, docs/CONTRACTS.md)
POINT_SEP = "@"


def _curve_panel(ax, cmp: Comparison, suite: str, base: str, points: list[str]) -> None:
    """A load sweep's primary ``base`` in one panel: each variant's change (marker) with its
    interval (bar) at each point (x, lowest load first), coloured by verdict; a run metric on
    the log-ratio axis of :func:`_draw_changes` (ticks in %), the margin band and the better
    direction labelled."""
    nv = max(1, len(cmp.variants))
    r0: Row | None = None
    ys = [0.0]
    for j, v in enumerate(cmp.variants):
        for i, k in enumerate(points):
            r = cmp.row(suite, f"{base}{POINT_SEP}{k}", v)
            if r is None:
                continue
            r0 = r0 or r
            x = i + (j - (nv - 1) / 2) * 0.6 / nv
            c = COLOURS.get(r.verdict, "tab:gray")
            if r.low is not None and r.high is not None:
                ax.plot([x, x], [r.low, r.high], color=c, lw=3, solid_capstyle="butt")
                ys += [r.low, r.high]
            if r.change is not None:
                ax.plot([x], [r.change], "osD^v"[j % 5], color=c, ms=4)
                ys.append(r.change)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(points)), points)
    ax.tick_params(labelsize=8)
    if r0 is None:
        ax.set_title(textwrap.fill(f"{base} per load", TITLE_WIDTH), fontsize=9)
        return
    span = _margin_span(r0)
    if span is not None:
        ax.axhspan(*span, color=MARGIN_COLOUR, alpha=0.08, lw=0)
        ax.text(
            1.0,
            span[1],
            f" {_margin_text(r0)}",
            transform=ax.get_yaxis_transform(),
            ha="left",
            va="center",
            fontsize=7,
            color=MARGIN_COLOUR,
        )
        ys += list(span)
    what = _change_axis(ax, "y", min(ys), max(ys), r0.change_unit, most=5)
    better = {"higher": " · better ↑", "lower": " · better ↓"}.get(r0.better or "", "")
    ax.set_ylabel(what + better, fontsize=8)
    # a per-point label names its point ("... at concurrency 16 (tok/s):"); the panel has them all
    label = re.sub(r" at [a-z ]+ [0-9.]+(?= \(|:|$)", "", r0.label or base)
    ax.set_title(
        textwrap.fill(
            f"{label.rstrip(': ')} per load",
            TITLE_WIDTH + 10,
            max_lines=TITLE_LINES,
            placeholder=" ...",
        ),
        fontsize=9,
    )


def _panels(cmp: Comparison) -> list[tuple[str, str, list[str] | None]]:
    """(suite, metric, None) per primary, and (suite, base metric, [point keys]) once for the
    per-point primaries of a load sweep (``<base>@<point>``, in the rows' order)."""
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
        elif (r.suite, r.metric, None) not in out:
            out.append((r.suite, r.metric, None))
    return out


def _pr_figure_with_curves(cmp: Comparison, panels) -> Figure:
    """The PR figure of a run with a load sweep: the curve panels, then the other primaries."""
    ncols = min(len(panels), 2)
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(WIDTH_IN, 2.9 * nrows + 0.8), dpi=DPI, squeeze=False
    )
    flat = [a for row in axes for a in row]
    order = sorted(panels, key=lambda p: p[2] is None)
    for ax, (suite, metric, pts) in zip(flat, order, strict=False):
        if pts is not None:
            _curve_panel(ax, cmp, suite, metric, pts)
            continue
        names = list(cmp.variants)
        rows = [(y, cmp.row(suite, metric, v)) for y, v in enumerate(names)]
        rows = [(y, r) for y, r in rows if r is not None]
        if not rows:
            ax.axis("off")
            continue
        r0 = rows[0][1]
        (_draw_counts if r0.kind == "deterministic" else _draw_changes)(ax, rows, r0)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.set_yticks(range(len(names)), names)
        ax.set_title(panel_title(r0), fontsize=9, pad=12)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    for ax in flat[len(order) :]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=c, lw=3, label=v) for v, c in COLOURS.items()]
    handles += [
        plt.Line2D([], [], ls="", marker="osD^v"[j % 5], color="black", label=v)
        for j, v in enumerate(cmp.variants)
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False
    )
    fig.suptitle(
        f"Primary metrics vs {cmp.baseline}: change and interval at the level its verdict used; "
        "a load sweep's per point",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return fig


def plot_pr_figure(cmp: Comparison) -> Figure | None:
    """One panel per primary metric (:func:`_draw_changes` or, deterministic, :func:`_draw_counts`),
    the variants on the y axis in the comparison's order; None when the run has no primary
    metric or no primary has a value to draw. A load sweep's per-point primaries of one metric
    share a panel, change against load (:func:`_pr_figure_with_curves`)."""
    panels = _panels(cmp)
    if any(pts is not None for _s, _m, pts in panels):
        return _pr_figure_with_curves(cmp, panels)
    metrics: list[tuple[str, str]] = []
    for r in cmp.rows_for(primary=True):
        drawable = r.change is not None or r.variant_value is not None
        if drawable and (r.suite, r.metric) not in metrics:
            metrics.append((r.suite, r.metric))
    if not metrics:
        return None
    names = list(cmp.variants)
    ncols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / ncols)
    per_row = 0.4 * len(names) + 1.5
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(WIDTH_IN, per_row * nrows + 1.1), dpi=DPI, squeeze=False
    )
    flat = [a for row in axes for a in row]
    for i, (ax, (suite, metric)) in enumerate(zip(flat, metrics, strict=False)):
        rows = [(y, cmp.row(suite, metric, v)) for y, v in enumerate(names)]
        rows = [(y, r) for y, r in rows if r is not None]
        r0 = rows[0][1]
        if r0.kind == "deterministic":
            _draw_counts(ax, rows, r0)
        else:
            _draw_changes(ax, rows, r0)
        ax.set_ylim(len(names) - 0.5, -0.5)
        ax.set_yticks(range(len(names)), names if i % ncols == 0 else [""] * len(names))
        ax.set_title(panel_title(r0), fontsize=9, pad=12)
        ax.tick_params(labelsize=8)
        ax.grid(axis="x", alpha=0.3)
    for ax in flat[len(metrics) :]:
        ax.axis("off")
    fig.legend(
        handles=_legend_handles(cmp.rows_for(primary=True)),
        loc="lower center",
        ncol=6,
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(
        f"Primary metrics vs {cmp.baseline}: change (dot) and interval at the level its "
        "verdict used (bar)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Save a figure as PNG (900 px wide at the figure's size) atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return records.write_bytes(path, buf.getvalue())


def make_plots(cmp: Comparison, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Save the PR figure and every suite's plots into ``out_dir`` (usually RUN/plots).

    Returns (saved paths, notes about plots that failed or that had nothing to draw). A failing
    plot does not stop the others.
    """
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
