#!/usr/bin/env python3
"""``runner.py CMD ...``: the same command line as ``patchbench CMD ...`` (patchbench/cli.py).

Kept at the top level so a clone runs without installing: ``python runner.py --help``.
"""

import sys

from patchbench.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
