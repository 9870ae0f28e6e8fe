"""``python -m patchbench CMD ...``: the same command line as the ``patchbench`` script."""

import sys

from patchbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
