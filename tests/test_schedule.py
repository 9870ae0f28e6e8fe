"""Cell order (patchbench.schedule) and the progress estimate (patchbench.progress)."""
from pathlib import Path

import pytest

from patchbench.progress import BenchProgress, eta_s, fmt_duration
from patchbench.schedule import plan_cells


def test_interleaved_abba_and_correctness_cells_first():
    cells = plan_cells(["a", "b"], 2, correctness=True)
    assert [(c.index, c.variant, c.repeat, c.kind) for c in cells] == [
        (0, "a", 0, "correctness"), (1, "b", 0, "correctness"),
        (2, "a", 0, "timed"), (3, "b", 0, "timed"), (4, "b", 1, "timed"), (5, "a", 1, "timed")]
    assert [c.dirname for c in cells[:3]] == ["correctness", "correctness", "rep0"]
    assert cells[4].path("/r") == Path("/r/b/rep1") and cells[0].label == "a/correctness"
    assert [c.kind for c in plan_cells(["a"], 3)] == ["timed"] * 3


@pytest.mark.parametrize("bad", [dict(variants=[], repeats=1), dict(variants=["a"], repeats=0),
                                 dict(variants=["a"], repeats=1, order="zigzag")])
def test_bad_plans_are_refused(bad):
    with pytest.raises(ValueError):
        plan_cells(**bad)


def test_eta_is_the_median_finished_cell_times_cells_left():
    assert eta_s([], 3) is None
    assert eta_s([10.0, 30.0, 12.0], 4) == 48.0  # median 12 s x 4
    assert eta_s([5.0], 0) == 0.0
    assert [fmt_duration(x) for x in (None, 42.4, 185, 3720)] == ["?", "42s", "3m05s", "1h02m"]


def test_progress_counts_skipped_and_finished_cells():
    from rich.console import Console
    now = [0.0]
    con = Console(record=True, width=120, force_terminal=False)
    p = BenchProgress(4, console=con, live=False, clock=lambda: now[0])
    p.cell_skipped()
    p.cell_started("a/rep0")
    now[0] = 20.0
    p.cell_finished("ok")
    assert p.line() == "progress: 2/4 cells, elapsed 20s, ETA 40s"
    assert "progress: 2/4 cells, elapsed 20s, ETA 40s" in con.export_text()
