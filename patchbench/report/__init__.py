"""report.md (GitHub-flavoured, pasteable into a PR), report-details.md, the console summary
and ``patchbench report``.

Renders only from the typed :class:`~patchbench.analysis.comparison.Comparison` (and the manifest for the
header). report.md is what a reviewer reads, in this order:

1. header: config, model, sglang release, each variant's patches with their sha256, GPU, commit,
   run id, repeats, which cells were instrumented;
2. the answer: one sentence per variant (its primaries with change, interval and verdict; an
   inconclusive one with about how many repeats would decide);
3. the primaries table, at the Holm-adjusted level each verdict used (stated); baseline and
   variant from the estimator of the change (geometric means of the paired repeats), outlier
   repeats named; the failed and incomplete cells with their reasons and the primaries they
   affect (only when there are any);
4. the A/A health check and cell warnings; the GPU block (cells whose GPU was throttled or shared,
   from each cell's NVML summary) and the server-log block (retractions and out-of-memory events
   each suite's server logged, per cell);
5. suite sections (each suite's ``report_section`` hook; per-cell tables folded with
   :func:`patchbench.suites.folded`), pairing refusals with their reasons;
6. the PR figure, a link to the details file, methods with their sources, notes.

report-details.md holds what a reviewer looks up: each primary's values per repeat, the PR-style
blocks (each suite's ``report_block`` hook, Before (baseline) and After (variants)), the
secondary table (raw intervals, exploratory, no coloured verdicts) and the other plots.

The verdict words are those of :data:`VERDICT_MARK` in every place (report, console, answer).

Modules (this package re-exports what the rest of patchbench and the tests use):

- :mod:`~patchbench.report.fmt`: verdict marks, values, changes and intervals as text;
- :mod:`~patchbench.report.decide`: the repeats-to-decide estimate of an inconclusive primary;
- :mod:`~patchbench.report.answer`: the answer sentences, the primaries table, a partial run;
- :mod:`~patchbench.report.sections`: header, failed cells, A/A noise and drift, GPU and
  server-log blocks, suite sections, Methods;
- :mod:`~patchbench.report.details`: report-details.md;
- :mod:`~patchbench.report.render`: report.md and :func:`render_run`;
- :mod:`~patchbench.report.console`: the console summary.
"""

from patchbench.analysis.build import build_comparison
from patchbench.report.answer import _primaries, sentence, sentence_parts
from patchbench.report.console import console_summary
from patchbench.report.decide import DECIDE_CAP, decide_note, decide_text, repeats_to_decide
from patchbench.report.details import DETAILS_NAME, render_details
from patchbench.report.fmt import (
    VERDICT_MARK,
    exactness,
    fmt_bounded,
    fmt_change,
    fmt_ci,
    shown_value,
    verdict_text,
)
from patchbench.report.render import render_markdown, render_run

__all__ = [
    "DECIDE_CAP",
    "DETAILS_NAME",
    "VERDICT_MARK",
    "_primaries",
    "build_comparison",
    "console_summary",
    "decide_note",
    "decide_text",
    "exactness",
    "fmt_bounded",
    "fmt_change",
    "fmt_ci",
    "render_details",
    "render_markdown",
    "render_run",
    "repeats_to_decide",
    "sentence",
    "sentence_parts",
    "shown_value",
    "verdict_text",
]
