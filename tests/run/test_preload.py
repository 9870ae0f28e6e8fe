"""patchbench.run.preload: the report's imports in a thread while the first server starts."""

import sys

from patchbench.run import preload


def test_start_imports_once_ignores_a_broken_module_and_wait_joins(monkeypatch):
    monkeypatch.setattr(preload, "_thread", None)
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    assert preload.start(("no_such_module_patchbench", "colorsys")) is True
    assert preload.start(("colorsys",)) is False  # once per process
    preload.wait(timeout_s=30)
    assert not preload._thread.is_alive()
    assert "colorsys" in sys.modules  # the broken name before it did not stop it


def test_wait_without_start_returns_at_once(monkeypatch):
    monkeypatch.setattr(preload, "_thread", None)
    preload.wait(timeout_s=0.0)


def test_the_preloaded_modules_are_the_reports():
    """Every module named is importable here, and the report path's heavy ones are listed."""
    import importlib

    for name in preload.MODULES:
        importlib.import_module(name)
    assert {"patchbench.report.plots", "statsmodels.stats.contingency_tables"} <= set(
        preload.MODULES
    )
