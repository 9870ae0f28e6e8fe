"""MMMU at several concurrencies in one cell (patchbench/suites/mmmu/load.py): names, the passes
against the chat stub, answers changed between concurrencies, the pairing per concurrency, the
deterministic-mode control and the smallest detectable change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from scipy.stats import norm

from patchbench.analysis import power
from patchbench.errors import ConfigError
from patchbench.records import read_jsonl, write_jsonl
from patchbench.suites.mmmu import (
    METRICS,
    MmmuSuite,
    Params,
    load,
    report_block,
    report_section,
    run,
)
from tests.helpers import suite_context
from tests.suites.test_mmmu_client import ctx_for, demo_dir, stub_factory  # noqa: F401
from tests.suites.test_mmmu_pairing import cell


def test_concurrency_list_and_names():
    assert Params(concurrency=8).loads == [] and Params(concurrency=[8]).loads == []
    assert Params(concurrency=[8, 1]).loads == ["c1", "c8"]
    for bad in ([], [1, 1], [0, 4], 2000):
        with pytest.raises(ValidationError, match="concurrency"):
            Params(concurrency=bad)
    suite = MmmuSuite()
    assert suite.declarations(Params(concurrency=8)) == METRICS
    d = suite.declarations(Params(concurrency=[1, 8]))
    assert len(d) == 2 * len(METRICS) + 1
    assert d["mmmu_overall_acc@c8"].primary and d["mmmu_overall_acc@c1"].kind == "accuracy"
    assert d["mmmu_overall_acc@c8"].label == "Overall accuracy at concurrency 8"
    assert d["mmmu_batch_changed_count@c8"].kind == "descriptive"
    assert "mmmu_batch_changed_count@c1" not in d and "mmmu_overall_acc" not in d


def test_two_concurrencies_in_one_cell(stub_factory, demo_dir, tmp_path):  # noqa: F811
    # the second pass (concurrency 4) answers B where the first answered A on the Art questions
    def behaviour(text, n):
        return 200, "Answer: B" if n == 2 and "What colour is the shape" in text else "Answer: A"

    stub, url = stub_factory(behaviour)
    ctx = ctx_for(url, tmp_path / "rep0" / "mmmu", tmp_path / "cache")
    flushes = []
    ctx.server.flush_cache = lambda: flushes.append(1)
    res = run(ctx, Params(dataset_path=str(demo_dir), concurrency=[4, 1]))
    c1, c4 = (read_jsonl(ctx.out_dir / k / "records.jsonl") for k in ("c1", "c4"))
    art = [r["id"] for r in c1 if r["subject"] == "Art"]
    assert art and len(c1) == len(c4) == 21 and flushes == [1]  # flushed between the passes
    assert stub.max_inflight <= 4
    assert res.metrics["mmmu_batch_changed_count@c4"] == len(art)
    assert res.metrics["mmmu_asked_count@c1"] == res.metrics["mmmu_asked_count@c4"] == 21
    right_a = sum(r["verdict"] == "correct" for r in c1)
    assert res.metrics["mmmu_correct_count@c1"] == right_a
    assert not any("@" not in m for m in res.metrics)
    assert set(res.meta["concurrency"]) == {"c1", "c4"} and res.meta["parser"] == "strict"
    block = report_block(ctx.out_dir)
    assert block.startswith("[concurrency 1]\n") and "\n\n[concurrency 4]\n" in block
    # the deterministic control (a correctness cell): the highest concurrency only, flat files
    ctl = ctx_for(url, tmp_path / "correctness" / "mmmu", tmp_path / "cache")
    res = run(
        ctl, Params(dataset_path=str(demo_dir), concurrency=[4, 1], deterministic_control=True)
    )
    assert res.meta["deterministic_control"] == {"concurrency": 4, "flag": load.FLAG}
    assert (
        len(read_jsonl(ctl.out_dir / "records.jsonl")) == 21 and "mmmu_asked_count" in res.metrics
    )


def _write(root: Path, v: str, sub: str, recs: list[dict]) -> None:
    write_jsonl(root / v / sub / "records.jsonl", recs)


def test_pairing_per_concurrency_and_the_control(tmp_path):
    # c1: identical arms; c8: questions 1 and 2 flip right->wrong in the variant. Under the
    # deterministic mode question 1 flips the same way (the patch), question 2 does not.
    base = ["correct", "correct", "wrong", "correct"]
    for v, c8 in (("baseline", base), ("patched", ["wrong", "wrong", "wrong", "correct"])):
        _write(tmp_path, v, "rep0/mmmu/c1", cell(base))
        _write(tmp_path, v, "rep0/mmmu/c8", cell(c8))
    _write(tmp_path, "baseline", "correctness/mmmu", cell(base))
    _write(tmp_path, "patched", "correctness/mmmu", cell(["wrong", "correct", "wrong", "correct"]))
    dirs = [[tmp_path / v / "rep0" / "mmmu"] for v in ("baseline", "patched")]
    p = MmmuSuite().pair(*dirs, Params(concurrency=[1, 8], deterministic_control=True))
    assert set(p["accuracy"]) >= {"mmmu_overall_acc@c1", "mmmu_overall_acc@c8"}
    assert p["accuracy"]["mmmu_overall_acc@c8"]["variant"] == [0.0, 0.0, 0.0, 1.0]
    c1, c8 = p["by_concurrency"]["c1"], p["by_concurrency"]["c8"]
    assert "accuracy" not in c8 and c1["flips"] == 0 and c8["right_to_wrong"] == 2
    assert [f["cause"] for f in c8["flipped"]] == ["patch", "batching"]
    assert (c8["flips_patch"], c8["flips_batching"]) == (1, 1)
    # without the control's records: a note, no causes
    (tmp_path / "patched" / "correctness" / "mmmu" / "records.jsonl").unlink()
    p = MmmuSuite().pair(*dirs, Params(concurrency=[1, 8], deterministic_control=True))
    assert "flips_patch" not in p["by_concurrency"]["c8"]
    assert p["by_concurrency"]["c8"]["notes"][0].startswith("deterministic control: ")


def test_report_names_each_concurrency_and_the_changed_answers(tmp_path):
    a, b = ["correct"] * 30 + ["wrong"] * 30, ["correct"] * 27 + ["wrong"] * 33
    for v, c8 in (("baseline", a), ("patched", b)):
        _write(tmp_path, v, "rep0/mmmu/c1", cell(a))
        _write(tmp_path, v, "rep0/mmmu/c8", cell(c8))
    dirs = [[tmp_path / v / "rep0" / "mmmu"] for v in ("baseline", "patched")]
    pair = MmmuSuite().pair(*dirs, Params(concurrency=[1, 8]))
    rows = [
        {
            "suite": "mmmu",
            "metric": "mmmu_batch_changed_count@c8",
            "variant": "patched",
            "label": "Answers changed from concurrency 1 to 8 (same cell)",
            "baseline_repeats": [0.0],
            "variant_repeats": [3.0],
        }
    ]
    cmp = {
        "baseline": "baseline",
        "settings": {"confidence": 0.95},
        "pairs": {"mmmu": {"patched": pair}},
        "rows": rows,
    }
    text = "\n".join(report_section(json.loads(json.dumps(cmp))))
    # 3 of 60 questions differ: sd of the differences sqrt(3 (1 - 3/60)^2 + 57 (3/60)^2) / 59)
    mde = load.detectable_pt(pair["accuracy"]["mmmu_overall_acc@c8"], 0.95)
    assert f"| patched | 8 | 1 | 60 | 0.500 | 0.450 | 3 | 0 | 0.25 | 95.0% | {mde:.1f} |" in text
    assert "| patched | 1 | 1 | 60 | 0.500 | 0.500 | 0 | 0 | 1 | 100.0% | n/a |" in text
    assert (
        "- Answers changed from concurrency 1 to 8 (same cell), per repeat: baseline 0; patched 3\n"
        in text
    )


def test_detectable_change_has_the_stated_power():
    d = [0.0] * 180 + [-1.0] * 15 + [1.0] * 5
    acc = {
        "baseline": [1.0 if x < 0 else 0.0 for x in d],
        "variant": [1.0 if x > 0 else 0.0 for x in d],
    }
    mde = load.detectable_pt(acc, 0.95)
    sd = float(__import__("numpy").std(d, ddof=1))
    assert power.power(200, mde / 100, sd, 0.05) == pytest.approx(0.8, abs=1e-6)
    # the normal approximation (z_0.975 + z_0.8) sd / sqrt(n), a little below the t's
    approx = 100 * (norm.ppf(0.975) + norm.ppf(0.8)) * sd / 200**0.5
    assert approx < mde < 1.01 * approx
    assert load.detectable_pt({"baseline": [1.0, 0.0], "variant": [1.0, 0.0]}, 0.95) is None


def test_control_needs_the_pins_deterministic_mode(tmp_path):
    srt = tmp_path / "sglang" / "srt"
    srt.mkdir(parents=True)
    (srt / "server_args.py").write_text("enable_mixed_chunk: bool = False\n")
    ctx = suite_context(None, tmp_path / "correctness" / "mmmu", tmp_path, sglang_version="0.0.1")
    ctx.variant_sglang_dir = tmp_path / "sglang"
    params = Params(deterministic_control=True)
    assert MmmuSuite().instrumentation(ctx, Params()) is None
    with pytest.raises(ConfigError, match=r"sglang 0\.0\.1 has no deterministic"):
        MmmuSuite().instrumentation(ctx, params)
    (srt / "arg_groups" / "fields").mkdir(parents=True)
    (srt / "arg_groups" / "fields" / "exec_.py").write_text("enable_deterministic_inference = 1\n")
    assert MmmuSuite().instrumentation(ctx, params).server_args == [load.FLAG]
    assert load.is_control(ctx, params) and not load.is_control(ctx, Params())


def test_a_run_judges_each_concurrency(tmp_path):
    from patchbench.analysis.build import build_comparison
    from tests.synthetic import make_run

    a, b = ["correct"] * 30 + ["wrong"] * 30, ["correct"] * 27 + ["wrong"] * 33
    vals = {"baseline": [0.5], "patched": [0.5]}
    run_dir = make_run(
        tmp_path,
        metrics={"mmmu": {"mmmu_overall_acc@c1": vals, "mmmu_batch_changed_count@c8": vals}},
        suites_params={"mmmu": {"concurrency": [1, 8]}},
    )
    for v, c8 in (("baseline", a), ("patched", b)):
        _write(run_dir, v, "rep0/mmmu/c1", cell(a))
        _write(run_dir, v, "rep0/mmmu/c8", cell(c8))
    cmp = build_comparison(run_dir)
    rows = {r.metric: r for r in cmp.rows}
    r8 = rows["mmmu_overall_acc@c8"]
    assert r8.primary and r8.kind == "accuracy" and r8.n_pairs == 60
    assert (r8.baseline_value, r8.variant_value) == (0.5, 0.45)
    assert r8.label == "Overall accuracy at concurrency 8" and "Newcombe" in r8.method
    assert rows["mmmu_overall_acc@c1"].variant_value == 0.5
    text = "\n".join(report_section(cmp))
    assert "| patched | 8 | 1 | 60 | 0.500 | 0.450 | 3 | 0 |" in text
    assert "(same cell), per repeat: baseline 0.5; patched 0.5" in text


def test_one_concurrency_with_the_control_keeps_todays_pair(tmp_path):
    for v, recs in (("baseline", ["correct", "wrong"]), ("patched", ["wrong", "wrong"])):
        _write(tmp_path, v, "rep0/mmmu", cell(recs))
        _write(tmp_path, v, "correctness/mmmu", cell(recs))
    dirs = [[tmp_path / v / "rep0" / "mmmu"] for v in ("baseline", "patched")]
    p = MmmuSuite().pair(*dirs, Params(concurrency=8, deterministic_control=True))
    assert "by_concurrency" not in p and p["accuracy"]["mmmu_overall_acc"]["variant"] == [0.0, 0.0]
    assert (p["flips_patch"], p["flips_batching"]) == (1, 0)
    cmp = {"baseline": "baseline", "pairs": {"mmmu": {"patched": p}}, "aa_variants": []}
    text = "\n".join(report_section(cmp))
    assert "- patched: flips by cause (deterministic-mode control): 1 the patch's, 0 " in text
