"""`patchbench report` re-checks what a run folder holds: a value no measurement can give (not
finite, a negative time, a rate above 1e9 per second or a positive one below 1e-6, an accuracy
outside [0, 1]) is left out of every verdict with a note naming it and its file, never rendered
as a change."""

from __future__ import annotations

import json
import math

import pytest

from patchbench import cli
from patchbench.analysis.rundata import impossible, read_run
from tests.synthetic import make_run


@pytest.mark.parametrize(
    ("metric", "x", "why"),
    [
        ("output_throughput_tok_s", 1e300, "above 1e+09 tok/s"),
        ("output_throughput_tok_s", 1e-300, "below 1e-06 tok/s"),
        ("output_throughput_tok_s@c16", 2e9, "above 1e+09 tok/s"),
        ("output_throughput_tok_s", 0.0, None),  # nothing finished: a goodput of 0
        ("goodput_req_s", -1.0, "below 1e-06 req/s"),
        ("itl_median_ms", -0.5, "below 0 ms"),
        ("itl_median_ms", 1.0000001e7, "above 1e+07 ms"),
        ("itl_median_ms", 1e7, None),
        ("duration_s", math.inf, "not a finite number"),
        ("mmmu_overall_acc", 1.5, "above 1 acc"),
        ("failed_count", -1.0, "below 0 count"),
        ("failed_count", 1e18, None),
        ("profiler_step_overhead_share", -0.2, None),  # a share may be below 0
        ("output_throughput_tok_s", None, None),
    ],
)
def test_the_plausible_bounds_by_unit(metric, x, why):
    assert impossible(metric, x) == why


def test_impossible_values_are_left_out_of_the_verdict_with_a_note_naming_the_file(tmp_path):
    run = make_run(
        tmp_path,
        metrics={
            "serving": {
                "output_throughput_tok_s": {
                    "baseline": [100.0, 100.0, 100.0],
                    "patched": [1e300, 1e-300, 110.0],
                },
                "itl_median_ms": {"baseline": [10.0, -3.0, 10.0], "patched": [9.0, 9.0, 9.0]},
            }
        },
    )
    data = read_run(run)
    assert data.value("patched", 0, "serving", "output_throughput_tok_s") is None
    assert data.value("patched", 2, "serving", "output_throughput_tok_s") == 110.0
    assert data.value("baseline", 1, "serving", "itl_median_ms") is None
    s0 = run / "patched" / "rep0" / "serving" / "summary.json"
    s1 = run / "patched" / "rep1" / "serving" / "summary.json"
    b1 = run / "baseline" / "rep1" / "serving" / "summary.json"
    expected = [
        f"impossible value output_throughput_tok_s = 1e+300 (above 1e+09 tok/s) in {s0}; left out",
        f"impossible value itl_median_ms = -3.0 (below 0 ms) in {b1}; left out",
        f"impossible value output_throughput_tok_s = 1e-300 (below 1e-06 tok/s) in {s1}; left out",
    ]
    assert sorted(n for n in data.notes if n.startswith("impossible")) == sorted(expected)

    assert cli.main(["report", str(run), "--no-plots"]) == 0
    cmp = json.loads((run / "compare.json").read_text())
    rows = {r["metric"]: r for r in cmp["rows"] if r["variant"] == "patched"}
    tput = rows["output_throughput_tok_s"]
    # one pair left (100 -> 110): no interval from one pair, and the row says why
    assert tput["verdict"] == "incomplete"
    assert tput["variant_repeats"] == [None, None, 110.0]
    assert f"patched/rep0: {expected[0]}" in "; ".join(tput["notes"])
    assert rows["itl_median_ms"]["baseline_repeats"] == [10.0, None, 10.0]
    report = (run / "report.md").read_text()
    for note in expected:
        assert note in report
    assert "1e+300" not in report.replace(expected[0], "")
    assert "e+29" not in report  # no change of 10^290 %
