"""A metric whose cells a suite found invalid: the report's row leaves those cells
out, says why, and never prints an interval the invalid values would have made (the stalled
night: ITL 0.011 ms against 5 ms gave [-100 %, +2,072,803,908 %]). Synthetic run folders."""

from __future__ import annotations

import math

import pytest

from patchbench import records
from patchbench.analysis.build import build_comparison
from patchbench.report.markdown import render_markdown
from tests.synthetic import make_run

ITL = "itl_median_ms"
BUNCHED = (
    "bunched: 20 of 20 requests got all tokens in one read (after the first token, under 0.05 ms "
    "a token, 20,000 tokens/s: ...): TPOT and ITL time the client's reads, not decode steps"
)


def _run(tmp_path, stalled: list[int]):
    """Baseline ITL 5.0, 5.1, 5.2 ms; the patched variant's 5.1, 5.2, 5.3 ms, except the rounds
    in ``stalled``, whose serving run the suite found bunched (ITL 0.011 ms, status incomplete)."""
    patched = [0.011 if k in stalled else 5.1 + 0.1 * k for k in range(3)]
    run = make_run(
        tmp_path,
        metrics={"serving": {ITL: {"baseline": [5.0, 5.1, 5.2], "patched": patched}}},
        suite_status={("patched", k, "serving"): "incomplete" for k in stalled},
    )
    for k in stalled:
        p = run / "patched" / f"rep{k}" / "serving" / "summary.json"
        records.write_json(p, dict(records.read_json(p), errors=[BUNCHED]))
    return run


def _row(cmp):
    (row,) = [r for r in cmp.rows if r.metric == ITL and r.variant == "patched"]
    return row


def test_a_metric_whose_every_cell_is_invalid_has_a_note_and_no_interval(tmp_path):
    cmp = build_comparison(_run(tmp_path, [0, 1, 2]))
    row = _row(cmp)
    assert row.verdict == "incomplete"
    assert row.variant_repeats == [None, None, None] and row.variant_value is None
    assert (row.change, row.low, row.high) == (None, None, None)
    (note,) = [n for n in row.notes if n.startswith("incomplete cells: ")]
    assert note == "incomplete cells: " + "; ".join(
        f"patched/rep{k}: incomplete: bunched: 20 of 20 requests got all tokens in one read"
        for k in range(3)
    )
    (line,) = [ln for ln in render_markdown(cmp).splitlines() if ln.startswith("| patched | ")]
    cells = [c.strip() for c in line.split(" | ")]
    assert cells[5] == "n/a" and "⚪ incomplete" in line  # the interval column, the verdict
    assert "patched/rep2: incomplete: bunched: 20 of 20 requests" in line


def test_an_invalid_cell_leaves_the_row_with_the_valid_pairs_only(tmp_path):
    """Round 1 stalled: the row pairs rounds 0 and 2 (5.0 / 5.1 and 5.2 / 5.3 ms): the variant's
    value is their geometric mean sqrt(5.1 x 5.3), the change exp(mean log ratio) - 1 =
    sqrt(5.1 / 5.0 x 5.3 / 5.2) - 1 = +1.96 %; the row stays out of the verdicts, with no
    interval from 2 pairs."""
    row = _row(build_comparison(_run(tmp_path, [1])))
    assert row.verdict == "incomplete" and row.paired_repeats == [0, 2]
    assert row.variant_repeats == [5.1, None, 5.3]
    assert row.variant_value == pytest.approx(math.sqrt(5.1 * 5.3))
    assert row.change == pytest.approx(100 * (math.sqrt(5.1 / 5.0 * 5.3 / 5.2) - 1))
    assert row.notes == [
        "2 paired repeats: fewer than compare.min_repeats = 3 cannot separate the patch from "
        "run-to-run noise",
        "incomplete cells: patched/rep1: incomplete: bunched: 20 of 20 requests got all tokens "
        "in one read",
    ]
    assert (row.low, row.high) == (None, None)  # 2 pairs: no interval
