"""The serving suite's "Output identity" table (patchbench/suites/serving/render.py) on a load
sweep: a row per load, then every load's requests together, as the answer counts them (a demo
showed 8/8, the lowest load alone, under an answer of 56/56). Wilson intervals by hand."""

from __future__ import annotations

from patchbench.suites.serving.render import identity_flags, report_section


def _ident(same: int, n: int, lo: float, hi: float) -> dict:
    return {"n": n, "identical": same, "share": same / n, "share_ci": [lo, hi]}


def _cmp(c8_same: int) -> dict:
    c1 = _ident(8, 8, 0.676, 1.0)
    c8 = _ident(c8_same, 48, 0.5, 1.0)
    pair = {
        "identity": c1,
        "points": {"c1": {"identity": c1}, "c8": {"identity": c8}},
        "repeats": [{"repeat_index": 0, "requests_compared": [0, 3], "paired": 4}],
    }
    return {"pairs": {"serving": {"patched": pair}}, "aa_variants": [], "settings": {}, "rows": []}


def test_a_row_per_load_and_the_loads_together():
    lines = report_section(_cmp(48))
    rows = [ln for ln in lines if ln.startswith("| patched")]
    # 56 of 56: Wilson 95 % (z = 1.95996): low = n / (n + z^2) = 56 / 59.8415 = 0.93580
    assert rows == [
        "| patched @ c1 | 8/8 (100.0%) | [67.6%, 100.0%] | n/a | 100% (deterministic engine) | ok |",
        "| patched @ c8 | 48/48 (100.0%) | [50.0%, 100.0%] | n/a | 100% (deterministic engine) | ok |",
        "| patched, all 2 loads | 56/56 (100.0%) | [93.6%, 100.0%] | n/a | 100% (deterministic engine) | ok |",
    ]
    assert "- patched: compared at c1 repeat 0 requests 0..3 (4 paired)" in lines


def test_the_flag_judges_every_load_not_the_lowest_alone():
    # c1 8/8 alone would pass; with c8 at 40/48 the loads together are 48/56 = 85.7 %
    f = identity_flags(_cmp(40))["patched"]
    assert f["flag"] and abs(f["share"] - 48 / 56) < 1e-12
    assert f["reason"] == "85.7% of requests identical (reference: 100% (deterministic engine))"
