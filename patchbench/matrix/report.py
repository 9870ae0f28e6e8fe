"""The report of a matrix run (``report.md``, ``plots/matrix-effect.png``) from ``matrix.json`` and
each unit's ``compare.json``: one table row per unit, a load sweep's per-point primaries
(``<metric>@<point>``) in "Load curves", one figure panel per primary metric.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbench.analysis.comparison import Comparison, Row, read_comparison
from patchbench.matrix.record import MatrixRecord, UnitRecord, read_matrix_record
from patchbench.records import write_text

FIGURE = "plots/matrix-effect.png"
#: the separator of a per-point metric's name (patchbench.report.plots.POINT_SEP)
POINT_SEP = "@"


def split_points(
    primaries: list[tuple[str, str]],
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
    """(the primaries not per point, the per-point ones' (suite, metric) without the point, the
    points by axis and load: ``c4`` before ``c16``), in the order first met."""
    whole, bases, points = [], [], []
    for s, m in primaries:
        base, sep, point = m.partition(POINT_SEP)
        if not sep:
            whole.append((s, m))
            continue
        if (s, base) not in bases:
            bases.append((s, base))
        if point not in points:
            points.append(point)
    return whole, bases, sorted(points, key=_point_order)


def _point_order(key: str) -> tuple[str, float]:
    """A point key's sort key: its axis letter, then its load (a key that is no number: last)."""
    try:
        return key[:1], float(key[1:])
    except ValueError:
        return key[:1], float("inf")


@dataclass
class UnitEffects:
    """One unit with its comparison (None when absent or unreadable; ``error`` says why)."""

    unit: UnitRecord
    comparison: Comparison | None = None
    error: str = ""

    def rows(self, suite: str, metric: str) -> list[tuple[str, Row]]:
        """(variant, row) of ``suite.metric`` for every variant except A/A copies."""
        cmp = self.comparison
        if cmp is None:
            return []
        found = [(v, cmp.row(suite, metric, v)) for v in cmp.variants]
        return [(v, r) for v, r in found if r is not None and not r.aa]


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.2f}{'%' if unit == '%' else ' ' + unit if unit else ''}"


def _interval(row: Row) -> str:
    if row.low is None or row.high is None:
        return ""
    u = "%" if row.change_unit == "%" else f" {row.change_unit}"
    return f" [{row.low:+.2f}, {row.high:+.2f}]{u}"


def unit_effects(matrix_dir: str | os.PathLike) -> tuple[list[UnitEffects], list[tuple[str, str]]]:
    """Every unit with its comparison, and every primary (suite, metric) in the order first met;
    OSError / ValueError for an unreadable matrix.json."""
    d = Path(matrix_dir)
    out, primaries = [], []
    for u in read_matrix_record(d).units:
        entry = UnitEffects(u)
        cp = d / u.id / "compare.json"
        if cp.exists():
            try:
                entry.comparison = read_comparison(cp)
            except Exception as e:  # noqa: BLE001 - one unreadable unit must not hide the rest
                entry.error = f"{type(e).__name__}: {e}"
        elif u.status != "pending":
            entry.error = "no compare.json"
        if entry.comparison is not None:
            for r in entry.comparison.rows:
                if r.primary and not r.aa and (r.suite, r.metric) not in primaries:
                    primaries.append((r.suite, r.metric))
        out.append(entry)
    return out, primaries


def render_matrix_report(matrix_dir: str | os.PathLike) -> str:
    """The markdown of a matrix run's report (see the module docstring)."""
    d = Path(matrix_dir)
    rec = read_matrix_record(d)
    units, primaries = unit_effects(d)
    whole, bases, points = split_points(primaries)
    lines = _header(rec, d, units)
    lines += _table(rec, d, units, whole)
    lines += _curves(units, bases, points)
    problems = [e for e in units if e.unit.status != "ok"]
    if problems:
        lines += ["", "## Units that did not end ok", ""]
        for e in problems:
            u = e.unit
            lines.append(
                f"- `{u.id}`: {u.status}"
                + (f" on {u.node}" if u.node else "")
                + (f": {u.message}" if u.message else "")
                + (f" ({e.error})" if e.error else "")
            )
    if (d / FIGURE).exists():
        lines += ["", "## Primary effects across units", "", f"![primary effects]({FIGURE})"]
    lines += _environments(rec) + _timings(units)
    return "\n".join(lines) + "\n"


def _header(rec: MatrixRecord, d: Path, units: list[UnitEffects]) -> list[str]:
    """Title, description, the units' statuses and times, what a cell of the table holds."""
    lines = [f"# Matrix {rec.name or d.name}", ""]
    if rec.description:
        lines += [rec.description, ""]
    counts: dict[str, int] = {}
    for e in units:
        counts[e.unit.status] = counts.get(e.unit.status, 0) + 1
    lines += [
        f"{len(units)} units on `{rec.executor}` ("
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f"); started {rec.started_at}, ended {rec.ended_at or '-'}"
        + ("; **interrupted**" if rec.interrupted else "")
        + ".",
        "",
        "Each unit is one whole A/B run on one node (every variant and repeat interleaved "
        "there); the cells give each variant's verdict against that unit's baseline, the "
        "change and its interval at the level the verdict used.",
        "",
    ]
    return lines


def _table(
    rec: MatrixRecord, d: Path, units: list[UnitEffects], primaries: list[tuple[str, str]]
) -> list[str]:
    """One row per unit: link, GPU type, axis values, status, each primary's verdicts."""
    axes = [a for a in rec.axes if a != "gpu_type"]
    head = ["unit", "gpu type", *axes, "status", *(f"{s}.{m}" for s, m in primaries)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in units:
        u = e.unit
        link = f"[{u.id}]({u.id}/report.md)" if (d / u.id / "report.md").exists() else u.id
        vals = [_cell_value(u.labels.get(a)) for a in axes]
        status = u.status + (f" (exit {u.exit_code})" if u.exit_code not in (0, None) else "")
        cols = [
            "<br>".join(f"{v}: {_effect(r)}" for v, r in e.rows(s, m)) or "-" for s, m in primaries
        ]
        lines.append("| " + " | ".join([link, u.gpu_type or "any", *vals, status, *cols]) + " |")
    return lines


def _effect(r: Row) -> str:
    return f"**{r.verdict}** {_fmt(r.change, r.change_unit)}{_interval(r)}"


def _curves(units: list[UnitEffects], bases: list[tuple[str, str]], points: list[str]) -> list[str]:
    """ "Load curves": one row per (unit, variant, point), one column per per-point primary ("-":
    not swept or never judged)."""
    if not bases:
        return []
    head = ["unit", "variant", "point", *(f"{s}.{m}" for s, m in bases)]
    lines = [
        "",
        "## Load curves",
        "",
        "Per point of each unit's load sweep (`<metric>@<point>`: `c16` is concurrency 16, "
        "`r2.5` a request rate of 2.5 req/s); the curve metrics are in the table above.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for e in units:
        if e.comparison is None:
            continue
        for v in e.comparison.variants:
            for k in points:
                found = [dict(e.rows(s, f"{m}{POINT_SEP}{k}")).get(v) for s, m in bases]
                if all(r is None for r in found):
                    continue
                cells = [_effect(r) if r is not None else "-" for r in found]
                lines.append("| " + " | ".join([e.unit.id, v, k, *cells]) + " |")
    return lines


#: the timings that make up the driver's own overhead per unit (Ray): scheduling and sending the
#: unit (``dispatch``), packing, returning, fetching and unpacking its run folder
OVERHEAD_KEYS = ("dispatch", "return_delay", "get", "unpack", "pack")


def driver_overhead_s(t: dict[str, float]) -> float:
    """The driver's own overhead of a unit (:data:`OVERHEAD_KEYS`; without ``dispatch``,
    ``start_delay`` whole)."""
    keys = OVERHEAD_KEYS if "dispatch" in t else ("start_delay", *OVERHEAD_KEYS[1:])
    return sum(t.get(k, 0) for k in keys)


def _timings(units: list[UnitEffects]) -> list[str]:
    """The timings table, one row per unit."""
    lines = [
        "",
        "## Timings",
        "",
        "queued: waiting for a node that could take the unit (another unit held it); driver "
        "overhead: scheduling and sending the unit, packing, returning and unpacking its run "
        "folder; env: finding or setting up the pin's python on the node.",
        "",
        "| unit | node | queued s | env s | bench s | task s | driver overhead s | archive KiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in units:
        u, t = e.unit, e.unit.timings_s
        lines.append(
            f"| {u.id} | {u.node or '-'} | {t.get('queued', '-')} | {t.get('env', '-')} | "
            f"{t.get('bench', '-')} | {t.get('task', '-')} | "
            f"{round(driver_overhead_s(t), 2) if t else '-'} | "
            f"{round(u.archive_bytes / 1024, 1)} |"
        )
    return lines


def _environments(rec: MatrixRecord) -> list[str]:
    """Where each pin's python came from on each node (announced before the units ran)."""
    if not rec.environments:
        return []
    return ["", "## Environments", ""] + [f"- {p.describe()}" for p in rec.environments]


def _cell_value(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v)
    return s.replace("|", "\\|")


def plot_matrix_effects(matrix_dir: str | os.PathLike):
    """One panel per primary metric, a row per (unit, variant[, point]) with the change and its
    interval coloured by verdict; None when there is nothing to plot."""
    from patchbench.report.plots import COLOURS, DPI, WIDTH_IN, plt

    units, primaries = unit_effects(matrix_dir)
    whole, bases, points = split_points(primaries)
    panels = []
    for s, m in whole:
        pts = [
            (f"{e.unit.id} · {v}", r)
            for e in units
            for v, r in e.rows(s, m)
            if r.change is not None
        ]
        if pts:
            panels.append((f"{s}.{m}", pts))
    for s, m in bases:
        pts = [
            (f"{e.unit.id} · {v} · {k}", r)
            for e in units
            for k in points
            for v, r in e.rows(s, f"{m}{POINT_SEP}{k}")
            if r.change is not None
        ]
        if pts:
            panels.append((f"{s}.{m} per point", pts))
    if not panels:
        return None
    n_rows = max(len(p) for _, p in panels)
    fig, axes = plt.subplots(
        len(panels),
        1,
        squeeze=False,
        figsize=(WIDTH_IN, max(2.0, 0.9 + 0.35 * n_rows) * len(panels)),
        dpi=DPI,
    )
    for ax, (title, pts) in zip(axes[:, 0], panels, strict=True):
        for i, (_label, r) in enumerate(pts):
            c = COLOURS.get(r.verdict, "gray")
            lo = r.low if r.low is not None else r.change
            hi = r.high if r.high is not None else r.change
            ax.errorbar(
                [r.change],
                [i],
                xerr=[[r.change - lo], [hi - r.change]],
                fmt="o",
                color=c,
                capsize=3,
            )
        ax.set_yticks(range(len(pts)))
        ax.set_yticklabels([p[0] for p in pts], fontsize=7)
        ax.invert_yaxis()
        ax.axvline(0, color="black", lw=0.8)
        ax.set_title(
            f"{title}: change vs each unit's baseline ({pts[0][1].change_unit})", fontsize=9
        )
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def write_matrix_report(matrix_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` and the figure in a matrix run folder; returns the report's path."""
    from patchbench.report.plots import save_png

    d = Path(matrix_dir)
    fig = plot_matrix_effects(d)
    if fig is not None:
        save_png(fig, d / FIGURE)
    return write_text(d / "report.md", render_matrix_report(d))
