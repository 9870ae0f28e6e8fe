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
    output_len: list[int] | None = None,
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
                "output_len": output_len or [2] * n,
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


# ---------------------------------------------------------------- files read back
def _summary(d: Path, requested: float) -> None:
    (d / "summary.json").write_text(json.dumps({"metrics": {"requested_count": requested}}))


def test_a_file_shorter_than_its_summary_is_a_note_even_when_both_are_short(tmp_path):
    # both cells sent 4 requests; both files were cut to 2: "2/2 identical" must not pass unseen
    b = _req(tmp_path, "b0", ["a", "b"])
    v = _req(tmp_path, "v0", ["a", "b"])
    _summary(b, 4)
    _summary(v, 4)
    p = get_suite("serving").pair([b], [v], None)
    assert p["identity"]["n"] == 2
    assert (
        f"paired repeat 0: {b / 'requests.json'} (baseline) holds 2 requests, its summary.json "
        "says 4 were sent: the file is short" in p["notes"]
    )
    assert any(str(v / "requests.json") in n and "(variant)" in n for n in p["notes"])
    r = p["repeats"][0]
    assert (r["baseline_expected"], r["variant_expected"], r["requests_compared"]) == (4, 4, [0, 1])
    md = "\n".join(
        get_suite("serving").report_section(
            {"baseline": "b", "run_id": "r", "pairs": {"serving": {"v": p}}}
        )
    )
    assert "- v: compared repeat 0 requests 0..1 (2 paired)" in md
    assert "the file is short" in md
    # a summary that agrees with the file: no note
    _summary(b, 2)
    _summary(v, 2)
    assert get_suite("serving").pair([b], [v], None)["notes"] == []


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda d: d["ttft_ms"].pop(), "ttft_ms holds 2 values, generated_text 3"),
        (lambda d: d["ttft_ms"].__setitem__(1, -4.0), "ttft_ms[1] = -4.0: expected a number >= 0"),
        (lambda d: d["itl_ms"].__setitem__(0, ["x"]), "itl_ms[0] = ['x']: expected a list"),
        (lambda d: d["status"].__setitem__(2, "done"), "status[2] = 'done': expected ok / failed"),
        (lambda d: d.update(input_len="5,5,5"), "input_len is not a list"),
        (lambda d: d.update(generated_text={"0": "a"}), "no generated_text list"),
    ],
)
def test_a_mis_shaped_file_is_unreadable_and_its_repeat_not_used(tmp_path, damage, why):
    b0 = _req(tmp_path, "b0", ["a", "b", "c"])
    v0 = _req(tmp_path, "v0", ["a", "b", "c"])
    data = json.loads((v0 / "requests.json").read_text())
    damage(data)
    (v0 / "requests.json").write_text(json.dumps(data))
    b1 = _req(tmp_path, "b1", ["a", "b"])
    v1 = _req(tmp_path, "v1", ["a", "x"])
    p = get_suite("serving").pair([b0, b1], [v0, v1], None)
    # only repeat 1 was used: 1 of its 2 requests identical, none of repeat 0's
    assert p["identity"]["n"] == 2 and p["identity"]["identical"] == 1
    assert [r["repeat_index"] for r in p["repeats"]] == [1]
    (u,) = p["unreadable"]
    assert u.startswith(f"{v0 / 'requests.json'}: not a valid requests.json (") and why in u
    assert any(n.startswith("paired repeat 0: not used: ") and why in n for n in p["notes"])


def test_unreadable_and_empty_files(tmp_path):
    b0 = _req(tmp_path, "b0", ["a"])
    v0 = _req(tmp_path, "v0", ["a"])
    (v0 / "requests.json").write_bytes(b"\xff\xfe{not json")
    b1 = _req(tmp_path, "b1", [])
    v1 = _req(tmp_path, "v1", [])
    p = get_suite("serving").pair([b0, b1], [v0, v1], None)
    assert p["request_pairing"]["ok"] is False and p["identity"] is None
    assert any(str(v0 / "requests.json") in u and "unreadable" in u for u in p["unreadable"])
    assert any(
        n.startswith("paired repeat 1: not used:") and "holds no requests" in n for n in p["notes"]
    )
    md = "\n".join(
        get_suite("serving").report_section(
            {"baseline": "b", "run_id": "r", "pairs": {"serving": {"v": p}}}
        )
    )
    assert "| v | n/a | n/a | n/a | n/a | not paired:" in md and "holds no requests" in md


def test_requests_problem_accepts_what_the_suite_writes():
    from patchbench.suites.serving.parse import request_records, requests_problem

    row = json.loads(
        (Path(__file__).parent.parent / "data" / "serving" / "v0513_flagged_notoken_mixed.jsonl")
        .read_text()
        .splitlines()[-1]
    )
    assert requests_problem(request_records(row)) is None
    assert requests_problem([1, 2]) == "not a JSON object but list"


def test_variant_outputs_far_shorter_than_the_baseline_are_a_note(tmp_path):
    """Without ignore_eos lengths may differ; a share of outputs less than half the baseline's
    (streams ended early) is named, never silently paired as a speed-up."""
    b = _req(tmp_path, "b0", ["a"] * 10, output_len=[40] * 10)
    v = _req(tmp_path, "v0", ["a"] * 10, output_len=[3, 3, 40, 40, 40, 40, 40, 40, 40, 40])
    p = get_suite("serving").pair([b], [v], None)
    assert any(
        "2 of 10 variant outputs are less than half as long as the baseline's" in n
        and "request 0: 3 vs 40" in n
        for n in p["notes"]
    ), p["notes"]
    ok = _req(tmp_path, "v1", ["a"] * 10, output_len=[3] + [40] * 9)  # one in ten: not flagged
    assert not any(
        "less than half" in n for n in get_suite("serving").pair([b], [ok], None)["notes"]
    )
