"""patchbench: A/B benchmarking and accuracy-regression suite for sglang patches.

One command line, ``patchbench CMD`` (patchbench/cli.py; also ``python -m patchbench`` and
``runner.py``). Exit codes and error kinds: :mod:`patchbench.errors`.
"""
