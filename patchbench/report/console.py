"""The console summary after a run or ``patchbench report``: the primaries table (rich when
available) and the answer, one clause a line."""

from __future__ import annotations

from pathlib import Path

from patchbench.analysis.comparison import Comparison
from patchbench.report.text import (
    exactness,
    fmt_change,
    fmt_ci,
    partial_lines,
    sentence,
    sentence_parts,
    values_txt,
    verdict_text,
)

#: the console's width when stdout is not a terminal (rich would use 80)
CONSOLE_LOG_WIDTH = 120


def console_summary(cmp: Comparison, report: Path | None = None) -> list[str]:
    """Print the primaries table (rich when available), then the same sentences as report.md,
    one clause a line; returns the sentences."""
    sents = [sentence(cmp, v) for v in cmp.variants]
    answer = []
    for v in cmp.variants:
        head, parts = sentence_parts(cmp, v)
        answer.append(head.rstrip() + ("" if parts else " no primary metric"))
        answer += [f"  - {p}" for p in parts]
    try:
        from rich.console import Console
        from rich.table import Table

        c = Console()
        if not c.is_terminal:  # a log file or CI: no terminal width to fit, 80 wraps the table
            c = Console(width=max(c.width, CONSOLE_LOG_WIDTH))
        t = Table(title=f"{cmp.run_id}: primaries vs {cmp.baseline}")
        for h in ("variant", "metric", "change", "interval", "verdict"):
            t.add_column(h)
        for r in cmp.rows_for(primary=True):
            det = r.kind == "deterministic"
            t.add_row(
                r.variant,
                r.short_label(),
                values_txt(r) if det else fmt_change(r.change, r.change_unit),
                exactness(r) if det else fmt_ci(r.low, r.high, r.change_unit),
                verdict_text(r),
            )
        if t.row_count:
            c.print(t)
        if report is not None:
            c.print(f"report: {report}")
        for line in partial_lines(cmp):
            c.print(line, markup=False, highlight=False, soft_wrap=True)
        for line in answer:
            c.print(line, markup=False, highlight=False)
    except ImportError:
        if report is not None:
            print(f"report: {report}")
        for line in partial_lines(cmp):
            print(line)
        for line in answer:
            print(line)
    return sents
