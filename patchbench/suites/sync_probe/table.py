"""The probe table (one line per batch size) shared by the sync_probe suite's report block and
scripts/gpu_probe.py. Standard library only: gpu_probe.py loads this file by path on a machine
that has nothing but python3 and torch."""

from __future__ import annotations

from collections.abc import Sequence

#: columns of the printed table: (key of a probe row, header, format)
TABLE_COLUMNS = [
    ("batch_size", "batch", "{}"),
    ("images", "images", "{}"),
    ("d2h_reads_per_call", "D2H reads/call", "{}"),
    ("blocking_h2d_copies_per_call", "blocking H2D/call", "{}"),
    ("sync_warnings_per_call", "sync warnings/call", "{:.1f}"),
    ("host_blocked_ms", "host-blocked ms", "{:.2f}"),
    ("positions_equal_stock", "= stock", "{}"),
    ("stopped_by", "stopped by", "{:.60}"),
    ("error", "error", "{:.60}"),
]


def _cells(rows: list[dict], lead: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The header, then each row's cells, of the lead columns and those some row has."""
    cols = [(k, h, "{}") for k, h in lead] + [
        c for c in TABLE_COLUMNS if any(c[0] in r for r in rows)
    ]
    body = [["-" if r.get(k) is None else fmt.format(r[k]) for k, _, fmt in cols] for r in rows]
    return [[h for _, h, _ in cols], *body]


def format_table(rows: list[dict], lead: Sequence[tuple[str, str]] = ()) -> str:
    """A plain-text table of probe rows (``measure_row`` dicts; columns absent from every row are
    left out); ``lead``: extra leading (key, header) columns such as release and variant."""
    cells = _cells(rows, lead)
    widths = [max(len(c) for c in col) for col in zip(*cells, strict=True)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows: list[dict], lead: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The same columns as :func:`format_table` as markdown table lines."""
    head, *body = _cells(rows, lead)
    lines = [
        "| " + " | ".join(row) + " |"
        for row in [head] + [[c.replace("|", "\\|") for c in r] for r in body]
    ]
    return lines[:1] + ["|" + "---|" * len(head)] + lines[1:]
