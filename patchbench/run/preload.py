"""Import the report's heavy modules while the first server starts, not after the last cell.

The report after the last cell needs matplotlib, statsmodels and scipy.stats (about 2 s of
imports on the 2-core CPU machine, docs/design.md "Harness overhead"). The harness spends the
first server's start-up (15 s or more) waiting, so :func:`start` imports them in a daemon thread
right after the first launch and :func:`wait` joins it once the server is ready: the imports
never overlap a suite (no instrumentation or harness work inside timed cells). A module that
fails to import here is ignored: the report imports it again and reports the error where it
belongs.
"""

from __future__ import annotations

import importlib
import threading

#: what the report and the comparison import after the last cell
MODULES = (
    "patchbench.report",
    "patchbench.report.plots",
    "patchbench.analysis.build",
    "scipy.stats",
    "statsmodels.stats.contingency_tables",
    "statsmodels.stats.proportion",
)

_lock = threading.Lock()
_thread: threading.Thread | None = None


def _import_all(names: tuple[str, ...]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the report imports it again and says what broke
            pass


def start(names: tuple[str, ...] = MODULES) -> bool:
    """Start importing ``names`` in a daemon thread, once per process; returns True when this
    call started it (False: started before)."""
    global _thread
    with _lock:
        if _thread is not None:
            return False
        _thread = threading.Thread(
            target=_import_all, args=(names,), name="patchbench-preload", daemon=True
        )
        _thread.start()
        return True


def wait(timeout_s: float = 60.0) -> None:
    """Block until the imports started by :func:`start` are done (at most ``timeout_s``
    seconds); returns at once when none were started or they finished."""
    t = _thread
    if t is not None:
        t.join(timeout_s)
