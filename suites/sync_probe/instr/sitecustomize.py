"""Loaded by every Python process of a server that runs with the sync_probe suite's in-server
cross-check (the suite's ``instrumentation`` hook puts this folder on the server's PYTHONPATH).

With ``PATCHBENCH_MROPE_PROBE_DIR`` set it imports ``patchbench_mrope_instr`` (beside this file),
which counts and cross-checks sglang's mrope position computations; without it nothing happens.
Then it runs the next ``sitecustomize.py`` further down ``sys.path`` (e.g. patchbench's own
shims/site one), as Python would have without this file. Standard library only: the server's
processes need not be able to import ``patchbench``.
"""

import os
import sys


def _chain():
    """Run the first sitecustomize.py on sys.path *after* this file's folder, if any (only later
    entries: two chaining sitecustomize files never import each other in a loop)."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(e) if e else "" for e in sys.path]
    if here not in entries:
        return
    for entry in entries[entries.index(here) + 1 :]:
        if not entry or entry == here:
            continue
        cand = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location(
                "_patchbench_sync_probe_next_sitecustomize", cand
            )
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return


if os.environ.get("PATCHBENCH_MROPE_PROBE_DIR"):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import patchbench_mrope_instr  # noqa: F401
    finally:
        sys.path.pop(0)

_chain()
