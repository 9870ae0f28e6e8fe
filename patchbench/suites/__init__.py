"""Built-in suites, one folder each, and helpers their ``plots`` and ``report_section`` hooks
share (matplotlib imported only when called)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: PNG resolution: figures are 9 inches wide, so 900 px at a PR's width
DPI = 100


def new_figure(height_in: float = 4.8, ncols: int = 1, width_in: float = 9.0) -> tuple[Any, list]:
    """(figure, axes list) with the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width_in, height_in), squeeze=False)
    return fig, list(axes[0])


def save_png(fig: Any, path: Path, dpi: int = DPI) -> Path:
    """Write ``fig`` as PNG atomically (patchbench.records.write_bytes), close it, return path."""
    import io

    import matplotlib.pyplot as plt

    from patchbench.records import write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return write_bytes(path, buf.getvalue())


def save_titled(fig: Any, path: Path, comparison: Any, title: str, **layout: Any) -> Path:
    """:func:`save_png` of ``fig`` titled "<title>   [<run id>]" over the run's one-line subtitle
    (model, hardware, sglang version, paired repeats: patchbench.report.figtext.figure_title) and
    laid out tightly (``layout``: ``tight_layout``'s keywords); ``comparison``: typed or its JSON
    form."""
    from patchbench.report.figtext import figure_title

    fig.suptitle(figure_title(title, comparison), fontsize=10)
    fig.tight_layout(**layout)
    return save_png(fig, path)


def folded(summary: str, body: list[str]) -> list[str]:
    """Markdown lines that fold ``body`` (markdown lines; tables render) under a one-line
    ``summary`` (GitHub's ``<details>``): per-cell detail a reviewer opens when needed. [] for
    an empty body."""
    while body and not body[-1]:
        body = body[:-1]
    if not body:
        return []
    return [f"<details><summary>{summary}</summary>", "", *body, "", "</details>", ""]
