"""report.md's traffic section (patchbench/suites/traffic/render.py): per variant and workload
the requests, both arms' hit rates and the speed changes, from the comparison's rows alone."""

from __future__ import annotations

from patchbench.suites.traffic.render import report_section


def _row(metric: str, b: float, v: float, change: float | None = None, n: int = 1) -> dict:
    return {
        "suite": "traffic",
        "metric": metric,
        "variant": "ours",
        "baseline_value": b,
        "variant_value": v,
        "change": change,
        "primary": False,
        "verdict": "inconclusive",
        "n_pairs": n,
    }


def _cmp(n: int) -> dict:
    rows = []
    for w, hit in (("shared-prefix", (89.39, 80.0)), ("chat", (60.1, 60.1))):
        rows += [
            _row(f"output_throughput_tok_s@{w}", 438.4, 391.9, -10.59, n),
            _row(f"ttft_median_ms@{w}", 20.28, 34.17, 68.46, n),
            _row(f"itl_median_ms@{w}", 5.75, 5.90, 2.63, n),
            _row(f"completed_count@{w}", 8, 8),
            _row(f"prefix_cache_hit_pct@{w}", *hit),
        ]
    return {"rows": rows, "variants": ["ours"], "settings": {"min_repeats": 3}}


def test_a_row_per_workload_in_the_configs_order_with_both_hit_rates():
    lines = report_section(_cmp(1))
    assert lines[0] == "## Traffic workloads (traffic)"
    assert [ln for ln in lines if ln.startswith("| ours")] == [
        "| ours | shared-prefix | 8 | 89.4% / 80.0% | -10.6% | +68.5% | +2.6% |",
        "| ours | chat | 8 | 60.1% / 60.1% | -10.6% | +68.5% | +2.6% |",
    ]
    assert any("descriptive, not verdicts" in ln for ln in lines)
    # enough paired repeats: no such caveat
    assert not any("descriptive" in ln for ln in report_section(_cmp(3)))


def test_no_traffic_rows_no_section():
    assert report_section({"rows": [], "variants": ["ours"], "settings": {}}) == []
