"""Loaded by every Python process of the sglang server when this folder is on PYTHONPATH.

With ``PATCHBENCH_PROFILE_RANGES=1`` it imports ``patchbench_profile_instr`` (beside this file),
which wraps sglang's decode step and mrope computation in ``torch.profiler.record_function``
ranges. Then, as Python would have without it, it imports the next ``sitecustomize`` found AFTER
this folder on ``sys.path`` (the harness has its own), once: a guard stops two chaining
sitecustomize files from importing each other forever.
"""

import os
import sys

if os.environ.get("PATCHBENCH_PROFILE_RANGES") == "1":
    import patchbench_profile_instr  # noqa: F401  (sits beside this file)


def _chain():
    if getattr(sys, "_patchbench_profile_site_chained", False):
        return
    sys._patchbench_profile_site_chained = True
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(e) for e in sys.path if e]
    after = entries[entries.index(here) + 1 :] if here in entries else entries
    for entry in after:
        if entry == here:
            continue
        cand = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_patchbench_profile_next_site", cand)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return


_chain()
