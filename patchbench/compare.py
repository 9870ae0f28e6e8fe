"""``patchbench compare``'s in-run entry point: compare every variant of a run with its baseline.

The work is split along its seams: :mod:`patchbench.comparison` (the typed Comparison written as
``compare.json`` and the ``compare:`` settings), :mod:`patchbench.verdicts` (the rules),
:mod:`patchbench.analysis` (builds the Comparison from a run folder through the suites' hooks) and
:mod:`patchbench.crossrun` (two runs, unpaired). This module keeps the names callers import.
"""

from __future__ import annotations

from patchbench.analysis import (
    build_comparison,
    compare_run,
    guess_metric_info,
    read_run,
    settings_of,
)
from patchbench.comparison import (
    COMPARISON_SCHEMA,
    CompareSettings,
    Comparison,
    Row,
    read_comparison,
    write_comparison,
)
from patchbench.verdicts import VERDICTS

SCHEMA = COMPARISON_SCHEMA

__all__ = [
    "CompareSettings",
    "Comparison",
    "Row",
    "SCHEMA",
    "VERDICTS",
    "build_comparison",
    "compare_run",
    "guess_metric_info",
    "read_comparison",
    "read_run",
    "settings_of",
    "write_comparison",
]
