"""The serving suite's pair hook (patchbench.suites.serving.pairing) and its report section and
plots, on hand-made requests.json files whose answers are counted by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchbench.suite import PairingRefused, get_suite


def _req(
    tmp: Path,
    name: str,
    texts: list[str],
    *,
    input_len: list[int] | None = None,
    status: list[str] | None = None,
    ttft: list[float] | None = None,
    itl: list[list[float]] | None = None,
) -> Path:
    d = tmp / name
    d.mkdir(parents=True)
    n = len(texts)
    ttft = ttft or [10.0 + i for i in range(n)]
    itl = itl or [[1.0, 2.0] for _ in range(n)]
    (d / "requests.json").write_text(
        json.dumps(
            {
                "generated_text": texts,
                "input_len": input_len or [5] * n,
                "status": status or ["ok"] * n,
                "error": [""] * n,
                "ttft_ms": ttft,
                "itl_ms": itl,
                "e2e_ms": [t + sum(x) for t, x in zip(ttft, itl, strict=True)],
                "output_len": [2] * n,
            }
        )
    )
    return d


def test_identity_by_index_counts_and_wilson_interval(tmp_path):
    from statsmodels.stats.proportion import proportion_confint

    b = _req(tmp_path, "b0", ["aa", "bb", "cc", "dd"], status=["ok", "ok", "ok", "failed"])
    v = _req(tmp_path, "v0", ["aa", "bX", "cc", "dd"])
    p = get_suite("serving").pair([b], [v], None)
    # request 3 failed in the baseline: left out; of 3 paired, 2 identical; "bb" vs "bX" differ at 1
    assert p["identity"]["n"] == 3 and p["identity"]["identical"] == 2
    lo, hi = proportion_confint(2, 3, alpha=0.05, method="wilson")
    assert p["identity"]["share_ci"] == pytest.approx([lo, hi])
    assert p["identity"]["first_diff"] == [{"repeat": 0, "request": 1, "char": 1}]
    assert p["request_pairing"] == {"ok": True, "reason": ""}
    assert p["repeats"][0]["failed_either"] == 1


def test_prompts_that_differ_at_an_index_are_refused(tmp_path):
    b = _req(tmp_path, "b0", ["a", "b"], input_len=[5, 7])
    v = _req(tmp_path, "v0", ["a", "b"], input_len=[5, 8])
    with pytest.raises(PairingRefused, match=r"request 1: prompt length 7 vs 8"):
        get_suite("serving").pair([b], [v], None)


def test_one_repeat_refused_the_other_used_with_a_note(tmp_path):
    b0 = _req(tmp_path, "b0", ["a", "b"], input_len=[5, 7])
    v0 = _req(tmp_path, "v0", ["a", "b"], input_len=[5, 8])
    b1 = _req(tmp_path, "b1", ["a", "b"])
    v1 = _req(tmp_path, "v1", ["a", "c"])
    p = get_suite("serving").pair([b0, b1], [v0, v1], None)
    assert p["identity"]["n"] == 2 and p["identity"]["identical"] == 1
    assert "paired repeat 0" in p["request_pairing"]["reason"]
    assert any("paired repeat 0: prompts differ" in n for n in p["notes"])


def test_short_and_missing_files_are_notes_naming_the_file_and_counts(tmp_path):
    b0 = _req(tmp_path, "b0", ["a", "b", "c"])
    v0 = _req(tmp_path, "v0", ["a", "b"])
    b1 = tmp_path / "b1"
    b1.mkdir()
    v1 = _req(tmp_path, "v1", ["a"])
    p = get_suite("serving").pair([b0, b1], [v0, v1], None)
    assert p["identity"]["n"] == 2
    assert any(
        str(v0 / "requests.json") in n and "holds 2 requests, the other cell 3" in n and "0..1" in n
        for n in p["notes"]
    )
    assert any(str(b1 / "requests.json") in n and "missing" in n for n in p["notes"])


def test_ecdf_values_and_thinning(tmp_path):
    from patchbench.suites.serving.pairing import _thin

    assert _thin([3.0, 1.0, 2.0]) == [1.0, 2.0, 3.0]
    xs = [float(i) for i in range(10001)]
    t = _thin(xs, cap=101)
    assert len(t) == 101 and t[0] == 0.0 and t[-1] == 10000.0 and t[50] == 5000.0
    b = _req(tmp_path, "b0", ["a", "b"], ttft=[20.0, 10.0], itl=[[3.0], [1.0, 2.0]])
    v = _req(tmp_path, "v0", ["a", "b"], ttft=[5.0, 6.0], itl=[[1.0], [1.0]])
    e = get_suite("serving").pair([b], [v], None)["ecdf"]
    assert e["baseline"] == {"ttft_ms": [10.0, 20.0], "itl_ms": [1.0, 2.0, 3.0], "itl_ms_n": 3}
    assert e["variant"]["ttft_ms"] == [5.0, 6.0]


def test_request_level_intervals_only_with_one_paired_repeat(tmp_path):
    ttft_b = [10.0, 12.0, 11.0, 13.0, 9.0, 10.5]
    b = _req(tmp_path, "b0", list("abcdef"), ttft=ttft_b)
    v = _req(tmp_path, "v0", list("abcdef"), ttft=[2 * x for x in ttft_b])
    p = get_suite("serving").pair([b], [v], None)
    d = p["descriptive"]["ttft_median_ms"]
    # every request exactly doubled: the median doubles (+100 %) in every resample
    assert d["change_pct"] == pytest.approx(100.0)
    assert d["low_pct"] == pytest.approx(100.0) and d["high_pct"] == pytest.approx(100.0)
    b1 = _req(tmp_path, "b1", list("abcdef"))
    v1 = _req(tmp_path, "v1", list("abcdef"))
    assert "descriptive" not in get_suite("serving").pair([b, b1], [v, v1], None)


def test_report_section_flags_against_the_aa_share_and_shows_refusals(tmp_path):
    cmp = {
        "baseline": "base",
        "aa_variants": ["aa"],
        "run_id": "r",
        "settings": {"identity_share_tolerance": 0.02},
        "pairs": {
            "serving": {
                "aa": {
                    "identity": {
                        "n": 100,
                        "identical": 98,
                        "share": 0.98,
                        "share_ci": [0.93, 0.99],
                        "first_diff_char_median": 4,
                    }
                },
                "patched": {
                    "identity": {
                        "n": 100,
                        "identical": 90,
                        "share": 0.90,
                        "share_ci": [0.83, 0.94],
                        "first_diff_char_median": 7,
                    }
                },
            }
        },
        "refusals": {"serving": {"other": "paired repeat 0: prompts differ"}},
    }
    md = "\n".join(get_suite("serving").report_section(cmp))
    assert (
        "| patched | 90/100 (90.0%) | [83.0%, 94.0%] | 7 | A/A share 98.0% | ⚠ outputs changed |"
        in md
    )
    assert "| aa | 98/100 (98.0%)" in md and "| aa |" in md and "100% (A/A) | ok |" in md
    assert "| other | refused | | | | paired repeat 0: prompts differ |" in md


def test_plots_write_both_ecdfs(tmp_path):
    b = _req(tmp_path, "b0", ["a", "b"])
    v = _req(tmp_path, "v0", ["a", "b"])
    pair = get_suite("serving").pair([b], [v], None)
    cmp = {"baseline": "base", "run_id": "r", "pairs": {"serving": {"patched": pair}}}
    paths = get_suite("serving").plots(cmp, tmp_path / "plots")
    assert [p.name for p in paths] == ["ecdf_ttft.png", "ecdf_itl.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_metric_declarations():
    m = get_suite("serving").metrics
    prim = sorted(n for n, i in m.items() if i.primary)
    assert prim == sorted(
        ["output_throughput_tok_s", "itl_median_ms", "ttft_median_ms", "e2e_latency_median_ms"]
    )
    assert all(m[n].kind == "run" and m[n].margin == 5.0 for n in prim)
    assert all(i.kind == "descriptive" for n, i in m.items() if n.endswith("_count"))
    assert m["itl_p99_ms"].kind == "run" and not m["itl_p99_ms"].primary
