"""The report of a matrix run: one table row per unit, one figure of the primary effects.

Read only from ``matrix.json`` (patchbench.matrix) and each unit's typed ``compare.json``
(:func:`patchbench.comparison.read_comparison`). Writes ``report.md`` and
``plots/matrix-effect.png`` in the matrix run folder:

- the table: unit (linked to its ``report.md``), its GPU type, the value of each axis, status,
  node, then one column per primary metric (``suite.metric``) holding, per variant, the verdict,
  the change and its interval at the level the verdict used;
- the figure: one panel per primary metric, one line per (unit, variant): the change (dot) and its
  interval (bar), coloured by verdict (patchbench.plots.COLOURS).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from patchbench.records import read_json, write_text

FIGURE = "plots/matrix-effect.png"


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.2f}{'%' if unit == '%' else ' ' + unit if unit else ''}"


def _interval(row) -> str:
    if row.low is None or row.high is None:
        return ""
    u = "%" if row.change_unit == "%" else f" {row.change_unit}"
    return f" [{row.low:+.2f}, {row.high:+.2f}]{u}"


def unit_effects(matrix_dir: str | os.PathLike) -> tuple[list[dict], list[tuple[str, str]]]:
    """Per unit of ``matrix.json``: its entry plus ``comparison`` (a Comparison or None) and
    ``error`` (why its compare.json could not be read, or ""); and every primary
    (suite, metric) in the order first met."""
    from patchbench.comparison import read_comparison

    d = Path(matrix_dir)
    man = read_json(d / "matrix.json")
    out, primaries = [], []
    for u in man.get("units", []):
        entry = dict(u)
        entry["comparison"], entry["error"] = None, ""
        cp = d / u["id"] / "compare.json"
        if cp.exists():
            try:
                entry["comparison"] = read_comparison(cp)
            except Exception as e:  # noqa: BLE001 - one unreadable unit must not hide the rest
                entry["error"] = f"{type(e).__name__}: {e}"
        elif u.get("status") not in ("pending",):
            entry["error"] = "no compare.json"
        cmp = entry["comparison"]
        if cmp is not None:
            for r in cmp.rows:
                if r.primary and not r.aa and (r.suite, r.metric) not in primaries:
                    primaries.append((r.suite, r.metric))
        out.append(entry)
    return out, primaries


def render_matrix_report(matrix_dir: str | os.PathLike) -> str:
    """The markdown of a matrix run's report (see the module docstring)."""
    d = Path(matrix_dir)
    man = read_json(d / "matrix.json")
    units, primaries = unit_effects(d)
    axes = [a for a in man.get("axes", []) if a != "gpu_type"]
    lines = [f"# Matrix {man.get('name', d.name)}", ""]
    if man.get("description"):
        lines += [man["description"], ""]
    counts: dict[str, int] = {}
    for u in units:
        counts[u["status"]] = counts.get(u["status"], 0) + 1
    lines += [
        f"{len(units)} units on `{man.get('executor')}` ("
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f"); started {man.get('started_at')}, ended {man.get('ended_at') or '-'}"
        + ("; **interrupted**" if man.get("interrupted") else "")
        + ".",
        "",
    ]
    lines += [
        "Each unit is one whole A/B run on one node (every variant and repeat interleaved "
        "there); the cells give each variant's verdict against that unit's baseline, the "
        "change and its interval at the level the verdict used.",
        "",
    ]
    head = ["unit", "gpu type", *axes, "status", *(f"{s}.{m}" for s, m in primaries)]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for u in units:
        link = (
            f"[{u['id']}]({u['id']}/report.md)" if (d / u["id"] / "report.md").exists() else u["id"]
        )
        vals = [_cell_value(u.get("labels", {}).get(a)) for a in axes]
        status = u["status"] + (
            f" (exit {u['exit_code']})" if u.get("exit_code") not in (0, None) else ""
        )
        cols = []
        cmp = u["comparison"]
        for s, m in primaries:
            parts = []
            if cmp is not None:
                for v in cmp.variants:
                    r = cmp.row(s, m, v)
                    if r is None or r.aa:
                        continue
                    parts.append(
                        f"{v}: **{r.verdict}** {_fmt(r.change, r.change_unit)}{_interval(r)}"
                    )
            cols.append("<br>".join(parts) or "-")
        lines.append(
            "| " + " | ".join([link, u.get("gpu_type") or "any", *vals, status, *cols]) + " |"
        )
    problems = [u for u in units if u["status"] != "ok"]
    if problems:
        lines += ["", "## Units that did not end ok", ""]
        for u in problems:
            lines.append(
                f"- `{u['id']}`: {u['status']}"
                + (f" on {u['node']}" if u.get("node") else "")
                + (f": {u['message']}" if u.get("message") else "")
                + (f" ({u['error']})" if u.get("error") and u["status"] != "ok" else "")
            )
    if (d / FIGURE).exists():
        lines += ["", "## Primary effects across units", "", f"![primary effects]({FIGURE})"]
    lines += [
        "",
        "## Timings",
        "",
        "| unit | node | task s | bench s | driver overhead s | archive KiB |",
        "|---|---|---|---|---|---|",
    ]
    for u in units:
        t = u.get("timings_s") or {}
        over = sum(t.get(k, 0) for k in ("start_delay", "return_delay", "get", "unpack", "pack"))
        lines.append(
            f"| {u['id']} | {u.get('node') or '-'} | {t.get('task', '-')} | "
            f"{t.get('bench', '-')} | {round(over, 2) if t else '-'} | "
            f"{round(u.get('archive_bytes', 0) / 1024, 1)} |"
        )
    return "\n".join(lines) + "\n"


def _cell_value(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v)
    return s.replace("|", "\\|")


def plot_matrix_effects(matrix_dir: str | os.PathLike):
    """The figure: one panel per primary metric, a row per (unit, variant) with the change and
    its interval, coloured by verdict; None when no unit has a primary row with a change."""
    from patchbench.plots import COLOURS, DPI, WIDTH_IN, plt

    units, primaries = unit_effects(matrix_dir)
    panels = []
    for s, m in primaries:
        pts = []
        for u in units:
            cmp = u["comparison"]
            if cmp is None:
                continue
            for v in cmp.variants:
                r = cmp.row(s, m, v)
                if r is not None and not r.aa and r.change is not None:
                    pts.append((f"{u['id']} · {v}", r))
        if pts:
            panels.append((f"{s}.{m}", pts))
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
    """Write ``report.md`` and ``plots/matrix-effect.png`` (when there is something to plot) in
    a matrix run folder; returns the report's path. Raises OSError / ValueError for an
    unreadable matrix.json."""
    from patchbench.plots import save_png

    d = Path(matrix_dir)
    fig = plot_matrix_effects(d)
    if fig is not None:
        save_png(fig, d / FIGURE)
    return write_text(d / "report.md", render_matrix_report(d))
