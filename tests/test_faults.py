"""Faults refused where they enter (issue 25): impossible metric values, and (below) the run
folder lock, names, resume identity and exit codes. Fake-server and fast tests only."""

from __future__ import annotations

import math

from patchbench.cell import refuse_impossible
from patchbench.suite import SuiteResult


def test_impossible_metric_values_are_refused_where_they_enter():
    res = SuiteResult(
        status="ok",
        metrics={"a_ms": 1.0, "b_tok_s": math.nan, "c_s": math.inf, "d_count": 3.0},
    )
    assert refuse_impossible(res) == ["b_tok_s", "c_s"]
    assert res.status == "incomplete"
    assert res.metrics == {"a_ms": 1.0, "d_count": 3.0}
    assert res.errors == [
        "impossible value b_tok_s = nan refused (not a finite number)",
        "impossible value c_s = inf refused (not a finite number)",
    ]
    clean = SuiteResult(status="ok", metrics={"x_ms": 2.0})
    assert refuse_impossible(clean) == [] and clean.status == "ok"
