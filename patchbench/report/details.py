"""report-details.md: each primary's values per repeat, each suite's PR-style blocks (Before and
After), the secondary metrics and every plot but the PR figure."""

from __future__ import annotations

from pathlib import Path

from patchbench.analysis.comparison import Comparison, Row
from patchbench.report.fmt import (
    _code,
    _esc,
    fmt_change,
    fmt_ci,
    fmt_pct,
    fmt_value,
    short_name,
    shown_value,
)

#: the second file of a report: what a reviewer looks up, not what they read first
DETAILS_NAME = "report-details.md"
#: the plot report.md shows; the others are in the details file
PR_FIGURE_STEM = "pr_figure"


def _plot_lines(paths: list[Path], run_dir: Path) -> list[str]:
    lines = []
    for p in paths:
        rel = p.relative_to(run_dir) if p.is_relative_to(run_dir) else p
        lines += [f"![{p.stem}]({rel.as_posix()})", ""]
    return lines


def _first_ok(cmp: Comparison, variant: str, suite: str) -> int | None:
    for c in cmp.cells:
        if c["variant"] == variant and (c.get("suites") or {}).get(suite) == "ok":
            return c["repeat"]
    return None


def _pr_blocks(cmp: Comparison, run_dir: Path, notes: list[str]) -> list[str]:
    from patchbench.suite import get_suite

    lines = []
    after = [v for v in cmp.variants if v not in cmp.aa_variants] or cmp.variants
    for suite in cmp.suites:
        try:
            obj = get_suite(suite)
        except Exception:  # noqa: BLE001 - an unknown suite, or one that fails to import: no block
            continue
        sec = []
        for label, v in [("Before", cmp.baseline)] + [("After", x) for x in after]:
            k = _first_ok(cmp, v, suite)
            if k is None:
                continue
            try:
                blk = obj.report_block(run_dir / v / f"rep{k}" / suite)
            except Exception as e:  # noqa: BLE001
                notes.append(f"{suite} report_block of {v}/rep{k} failed: {type(e).__name__}: {e}")
                continue
            if blk:
                sec += [f"### {label} ({v}, rep{k})", "", _code(blk, f"{suite}: {label} ({v})"), ""]
        if sec:
            lines += [f"## {suite}: PR blocks", ""] + sec
    return lines


def _secondary(cmp: Comparison) -> list[str]:
    """ "## Secondary metrics" of the details file: every non-primary row with its values (the
    estimator of :func:`shown_value`), change, raw interval and method; no coloured verdicts."""
    rows = [r for r in cmp.rows if not r.primary]
    if not rows:
        return []
    lines = [
        "## Secondary metrics",
        "",
        f"Exploratory: raw {100 * cmp.settings.confidence:g}% intervals, no multiplicity "
        "correction, not verdicts.",
        "",
        "| variant | suite | metric | baseline | variant | change | interval | method | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        desc = ""
        if r.descriptive:
            d = r.descriptive
            desc = (
                f"request-level (descriptive only): {fmt_ci(d.get('low_pct'), d.get('high_pct'))}; "
            )
        lines.append(
            f"| {r.variant} | {r.suite} | `{r.metric}` | {shown_value(r, 'baseline')} | "
            f"{shown_value(r, 'variant')} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {_esc(r.method or '')} | "
            f"{_esc(desc + '; '.join(r.notes))} |"
        )
    return lines + [""]


def _repeat_cell(r: Row, i: int, k: int) -> str:
    """One repeat of a primary in the per-repeat table: "466.9 -> 420.7 (-9.9%)" (accuracy in
    percent: "41.3% -> 42.9%"), outliers in bold; "-" where an arm has no value."""
    b = r.baseline_repeats[i] if i < len(r.baseline_repeats) else None
    v = r.variant_repeats[i] if i < len(r.variant_repeats) else None

    def one(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{100 * x:.1f}%" if r.kind == "accuracy" else fmt_value(x)

    txt = f"{one(b)} -> {one(v)}"
    if b is not None and v is not None and r.kind == "run" and r.change_unit == "%" and b > 0:
        txt += f" ({fmt_pct(100 * (v / b - 1))})"
    return f"**{txt} outlier**" if k in r.outlier_repeats else txt


def _per_repeat(cmp: Comparison) -> list[str]:
    """ "## Primary metrics per repeat": each primary's baseline -> variant value in every timed
    round its suite ran (a run row's change per pair; outlier repeats in bold)."""
    rows = [r for r in cmp.rows if r.primary and (r.baseline_repeats or r.variant_repeats)]
    if not rows:
        return []
    lines = [
        "## Primary metrics per repeat",
        "",
        "baseline -> variant in each repeat (run metrics: that pair's change); an outlier "
        "repeat (rule in the report's Methods) is in bold.",
        "",
    ]
    by_suite: dict[str, list[Row]] = {}
    for r in rows:
        by_suite.setdefault(r.suite, []).append(r)
    for suite, rs in by_suite.items():
        n = max(max(len(r.baseline_repeats), len(r.variant_repeats)) for r in rs)
        rounds = cmp.suite_rounds.get(suite)
        ks = list(rounds) if isinstance(rounds, list) and len(rounds) == n else list(range(n))
        if rounds == "correctness":
            heads = ["correctness cell"] * n
        else:
            heads = [f"rep{k}" for k in ks]
        lines += [
            f"| variant | {suite} metric | " + " | ".join(heads) + " |",
            "|---|---|" + "---|" * n,
        ]
        lines += [
            f"| {r.variant} | {_esc(short_name(r))} | "
            + " | ".join(_repeat_cell(r, i, k) for i, k in enumerate(ks))
            + " |"
            for r in rs
        ]
        lines.append("")
    return lines


def render_details(
    cmp: Comparison,
    run_dir: Path,
    plot_paths: list[Path] | None = None,
    notes: list[str] | None = None,
) -> str:
    """The report-details.md text: each primary's values per repeat, each suite's PR-style
    blocks (``report_block`` of the first ok repeat, Before and After), the secondary metrics,
    and every plot but the PR figure. A ``report_block`` that fails adds a line to ``notes``."""
    notes = notes if notes is not None else []
    lines = [
        f"# patchbench details: {cmp.run_id}",
        "",
        "The report is [report.md](report.md); this file holds what it leaves out.",
        "",
    ]
    lines += _per_repeat(cmp) + _pr_blocks(cmp, run_dir, notes) + _secondary(cmp)
    more = [p for p in plot_paths or [] if p.stem != PR_FIGURE_STEM]
    if more:
        lines += ["## Plots", ""] + _plot_lines(more, run_dir)
    return "\n".join(lines).rstrip() + "\n"
