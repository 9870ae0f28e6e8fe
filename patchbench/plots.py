"""Plots of a comparison: PNGs legible at a PR's width (900 px), matplotlib Agg.

Rendered only from the typed :class:`~patchbench.comparison.Comparison`:

- :func:`plot_pr_figure`: the "PR figure": every primary metric (one panel each) with each
  variant's change and its interval at the level the verdict used, coloured by verdict;
- each suite's own figures through its ``plots(comparison, out_dir)`` hook.

:func:`make_plots` saves them under ``RUN/plots/``.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from patchbench import records
from patchbench.comparison import Comparison

WIDTH_IN, DPI = 9.0, 100  # 900 px wide
COLOURS = {
    "improved": "tab:green",
    "regressed": "tab:red",
    "equivalent": "tab:blue",
    "inconclusive": "tab:gray",
    "incomplete": "lightgray",
}

__all__ = ["plot_pr_figure", "make_plots", "save_png"]


def _change_marker(r) -> str:
    """ "o" for a change that is exact or estimated; ">" when the true change can only be larger
    (the variant's value a lower bound or the baseline's an upper one), "<" when only smaller,
    "x" when unbounded both ways."""
    up = r.variant_bound == "lower" or r.baseline_bound == "upper"
    down = r.variant_bound == "upper" or r.baseline_bound == "lower"
    return "x" if up and down else ">" if up else "<" if down else "o"


#: the separator of a per-point metric's name (``output_throughput_tok_s@c16``, docs/CONTRACTS.md)
POINT_SEP = "@"


def _curve_panel(ax, cmp: Comparison, suite: str, base: str, points: list[str]) -> None:
    """A load sweep's primary ``base`` in one panel: each variant's change (dot) with its
    interval (bar) at each point (x, lowest load first), coloured by verdict."""
    nv = max(1, len(cmp.variants))
    unit, margin, label = "%", None, base
    for j, v in enumerate(cmp.variants):
        for i, k in enumerate(points):
            r = cmp.row(suite, f"{base}{POINT_SEP}{k}", v)
            if r is None:
                continue
            unit, margin, label = r.change_unit, r.margin, (r.label or base)
            x = i + (j - (nv - 1) / 2) * 0.6 / nv
            c = COLOURS.get(r.verdict, "tab:gray")
            if r.low is not None and r.high is not None:
                ax.plot([x, x], [r.low, r.high], color=c, lw=3, solid_capstyle="butt")
            if r.change is not None:
                ax.plot([x], [r.change], "osD^v"[j % 5], color=c, ms=4)
    if margin is not None and unit in ("%", "pt"):
        ax.axhspan(-margin, margin, color="tab:blue", alpha=0.08)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(points)), points)
    # a per-point label names its point ("... at concurrency 16 (tok/s):"); the panel has them all
    label = re.sub(r" at [a-z ]+ [0-9.]+(?= \(|:|$)", "", label)
    ax.set_title(textwrap.fill(f"{label.rstrip(': ')} per load", 30), fontsize=9)
    ax.set_ylabel(f"change ({unit})", fontsize=8)
    ax.tick_params(labelsize=8)


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


def plot_pr_figure(cmp: Comparison) -> Figure | None:
    """One panel per primary metric: change per variant (dot) with its interval (bar), the
    margin as a shaded band, zero as a line; a load sweep's per-point primaries of one metric
    share a panel, change against load (:func:`_curve_panel`). None when the run has no primary
    metric."""
    panels = _panels(cmp)
    metrics = [(s, m) for s, m, pts in panels if pts is None]
    if not panels:
        return None
    if len(metrics) < len(panels):
        return _pr_figure_with_curves(cmp, panels)
    ncols = min(len(metrics), 3)
    nrows = math.ceil(len(metrics) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(WIDTH_IN, 2.6 * nrows + 0.6), dpi=DPI, squeeze=False
    )
    flat = [a for row in axes for a in row]
    for ax, (suite, metric) in zip(flat, metrics, strict=False):
        rows = [cmp.row(suite, metric, v) for v in cmp.variants]
        rows = [r for r in rows if r is not None]
        unit = rows[0].change_unit if rows else "%"
        for i, r in enumerate(rows):
            c = COLOURS.get(r.verdict, "tab:gray")
            if r.low is not None and r.high is not None:
                ax.plot([r.low, r.high], [i, i], color=c, lw=3, solid_capstyle="butt")
            if r.change is not None:
                ax.plot([r.change], [i], _change_marker(r), color=c)
        if rows and rows[0].margin is not None and unit in ("%", "pt"):
            ax.axvspan(-rows[0].margin, rows[0].margin, color="tab:blue", alpha=0.08)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [r.variant for r in rows])
        title = (rows[0].label if rows and rows[0].label else metric).rstrip(": ")
        # a long label wraps inside its panel instead of running into the next one
        ax.set_title(textwrap.fill(title, 26), fontsize=9)
        ax.set_xlabel(f"change ({unit})", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in flat[len(metrics) :]:
        ax.axis("off")
    handles = [plt.Line2D([], [], color=c, lw=3, label=v) for v, c in COLOURS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(
        f"{cmp.run_id}: primaries vs {cmp.baseline} (Holm-adjusted intervals)", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


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
        rows = [r for r in (cmp.row(suite, metric, v) for v in cmp.variants) if r is not None]
        for i, r in enumerate(rows):
            c = COLOURS.get(r.verdict, "tab:gray")
            if r.low is not None and r.high is not None:
                ax.plot([r.low, r.high], [i, i], color=c, lw=3, solid_capstyle="butt")
            if r.change is not None:
                ax.plot([r.change], [i], _change_marker(r), color=c)
        if rows and rows[0].margin is not None and rows[0].change_unit in ("%", "pt"):
            ax.axvspan(-rows[0].margin, rows[0].margin, color="tab:blue", alpha=0.08)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(range(len(rows)), [r.variant for r in rows])
        title = (rows[0].label if rows and rows[0].label else metric).rstrip(": ")
        ax.set_title(textwrap.fill(title, 30), fontsize=9)
        ax.set_xlabel(f"change ({rows[0].change_unit if rows else '%'})", fontsize=8)
        ax.tick_params(labelsize=8)
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
        f"{cmp.run_id}: primaries vs {cmp.baseline} (Holm-adjusted intervals)", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Save a figure as PNG (900 px wide at the figure's size) atomically and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return records.write_bytes(path, buf.getvalue())


def make_plots(cmp: Comparison, out_dir: str | Path) -> tuple[list[Path], list[str]]:
    """Save the PR figure and every suite's plots into ``out_dir`` (usually RUN/plots).

    Returns (saved paths, notes about plots that failed). A failing plot does not stop the others.
    """
    from patchbench.suite import get_suite

    out_dir = Path(out_dir)
    saved, notes = [], []
    try:
        fig = plot_pr_figure(cmp)
        if fig is not None:
            saved.append(save_png(fig, out_dir / "pr_figure.png"))
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
