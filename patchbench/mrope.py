"""Deprecated location: the mrope tooling lives in :mod:`patchbench.suites.sync_probe.mrope`.

Kept only while tests/conftest.py still imports ``patchbench.mrope``; nothing else may import it.
"""

from patchbench.suites.sync_probe.mrope import *  # noqa: F403
from patchbench.suites.sync_probe.mrope import MropeMethods, release_sources  # noqa: F401
