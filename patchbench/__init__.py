"""patchbench: A/B benchmarking and accuracy-regression suite for sglang patches.

One command line, ``patchbench CMD`` (patchbench/cli.py; also ``python -m patchbench`` and
``runner.py``). Exit codes: :data:`patchbench.errors.EXIT_CODES` (the ``EXIT_*`` names below are
re-exported from :mod:`patchbench.errors` for existing imports).
"""

from patchbench.errors import (
    EXIT_ENV,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
)

__all__ = [
    "EXIT_OK",
    "EXIT_REGRESSION",
    "EXIT_USAGE",
    "EXIT_ENV",
    "EXIT_RUN_FAILED",
    "EXIT_INTERRUPTED",
]
