"""patchbench: A/B benchmarking and accuracy-regression suite for sglang patches.

Exit codes of every ``runner.py`` command (README, "Exit codes"):
0 done, 1 regression found (nightly), 2 bad usage or config, 3 environment not ready,
4 a run failed.
"""
EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_ENV = 3
EXIT_RUN_FAILED = 4

__all__ = ["EXIT_OK", "EXIT_REGRESSION", "EXIT_USAGE", "EXIT_ENV", "EXIT_RUN_FAILED"]
