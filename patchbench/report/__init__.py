"""What a reader sees, rendered from the typed comparison (compare.json) alone: report.md and
report-details.md (:mod:`~patchbench.report.markdown`), their words, numbers and the console
summary (:mod:`~patchbench.report.text`), the plots (:mod:`~patchbench.report.plots`) and the
pull-request comment (:mod:`~patchbench.report.comment`)."""

from patchbench.report.markdown import render_markdown, render_run
from patchbench.report.text import console_summary, sentence

__all__ = ["console_summary", "render_markdown", "render_run", "sentence"]
