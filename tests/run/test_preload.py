"""patchbench.run.cell.preload: the report's imports in a thread while the first server starts."""

import importlib
import sys

from patchbench.run.cell import REPORT_MODULES, preload


def test_preload_imports_once_and_a_broken_module_does_not_stop_it(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    names = ("no_such_module_patchbench", "colorsys")
    t = preload(names)
    assert preload(names) is t  # once per process
    t.join(timeout=30)
    assert not t.is_alive()
    assert "colorsys" in sys.modules  # the broken name before it did not stop it


def test_the_preloaded_modules_are_the_reports():
    """Every module named is importable here, and the report path's heavy ones are listed."""
    for name in REPORT_MODULES:
        importlib.import_module(name)
    assert {"patchbench.report.plots", "statsmodels.stats.contingency_tables"} <= set(
        REPORT_MODULES
    )
