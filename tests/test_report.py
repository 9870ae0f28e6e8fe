"""report.md structure and numbers (against compare.json), the report/compare commands, plots."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from helpers_runs import make_requests, make_run, mmmu_rows
from patchbench import EXIT_OK, EXIT_USAGE
from patchbench.compare import compare_run, load_run
from patchbench.report import cli_compare, cli_report, render_run


def _full_run(root, **kw):
    rng = np.random.default_rng(0)
    n = 30

    def reqs(scale, texts=None):
        t = list(rng.lognormal(np.log(50 * scale), 0.3, n))
        itl = [list(rng.lognormal(np.log(5 * scale), 0.05, 8)) for _ in range(n)]
        return make_requests(t, itl, texts)

    texts = [f"out {i}" for i in range(n)]
    changed = list(texts)
    changed[0] = "out X"
    subjects = ["Art", "Math", "Math", "History"]
    args = dict(
        variants={"baseline": [], "patched": ["mrope-sync-free"]},
        metrics={"serving": {"output_throughput_tok_s": {"baseline": [100, 101, 99],
                                                         "patched": [110, 112, 109]},
                             "ttft_mean_ms": {"baseline": [50, 51, 52], "patched": [50.5, 50, 52]},
                             "itl_mean_ms": {"baseline": [5, 5.1, 5.05], "patched": [4.5, 4.55, 4.5]}},
                 "mmmu": {"mmmu_overall_acc": {"baseline": [0.5, 0.5, 0.5], "patched": [0.5, 0.75, 0.5]}}},
        requests={("baseline", 0): reqs(1.0, texts), ("patched", 0): reqs(0.9, changed)},
        mmmu_records={("baseline", 0): mmmu_rows(["correct", "wrong", "correct", "wrong"], subjects),
                      ("patched", 0): mmmu_rows(["wrong", "correct", "correct", "wrong"], subjects)},
        cell_status={("patched", 2): "failed"},
        warnings={("baseline", 0, "serving"): ["2 images dropped by the processor"]},
        patches_sha={"baseline": [], "patched": [{"name": "mrope-sync-free", "sha256": "ab" * 32}]},
        gpu={"gpus": [{"name": "NVIDIA H200", "memory_total_mib": 143771}], "driver": "570.1"})
    args.update(kw)
    return make_run(root, **args)


def _table_rows(md: str, variant: str) -> dict[str, list[str]]:
    """metric -> cells of the delta table of one variant."""
    sec = md.split(f"### {variant} vs ")[1].split("\n\n", 2)[1]
    out = {}
    for line in sec.splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        out[cells[2].strip("`")] = cells
    return out


def _num(s: str) -> float:
    return float(s.rstrip("%").replace("+", ""))


def test_report_sections_and_numbers(tmp_path):
    run = _full_run(tmp_path)
    path = render_run(run, plots=False)
    md = path.read_text()
    cmp = json.loads((run / "compare.json").read_text())
    for sec in ("## Verdict", "## Changes", "## Output identity", "## MMMU paired", "## Methods",
                "## Notes"):
        assert sec in md, sec
    assert md.index("## Verdict") < md.index("## Changes") < md.index("## MMMU paired")
    # header: sglang release, patch hash, GPU, driver, this repo's commit
    assert "`0.5.1.post3`" in md and "abababababab" in md and "NVIDIA H200, driver 570.1" in md
    assert "`deadbeefdead`" in md and "`mrope-sync-free`" in md
    assert "(tiny random weights, built here: MMMU accuracy near 0" in md  # the run's model is tiny
    rows = _table_rows(md, "patched")
    assert set(rows) == {r["metric"] for r in cmp["metrics"]}
    for r in cmp["metrics"]:
        cells = rows[r["metric"]]
        assert r["verdict"] in cells[0]
        assert _num(cells[3]) == pytest.approx(r["baseline_median"], abs=0.005)
        assert _num(cells[4]) == pytest.approx(r["variant_median"], abs=0.005)
        assert _num(cells[5]) == pytest.approx(r["change_pct"], abs=0.005)
        if r["ci_low_pct"] is not None:
            lo, hi = re.match(r"\[(.*), (.*)\]", cells[6]).groups()
            assert _num(lo) == pytest.approx(r["ci_low_pct"], abs=0.005)
            assert _num(hi) == pytest.approx(r["ci_high_pct"], abs=0.005)
        assert cells[7] == r["ci_method"]
    # the failed cell makes every metric incomplete, and the row says why
    assert all(r["verdict"] == "incomplete" for r in cmp["metrics"])
    thr = rows["output_throughput_tok_s"]
    assert "⚠" in thr[-1]
    notes = md.split("## Notes")[1]
    assert "patched/rep2: failed" in notes
    assert "2 images dropped by the processor" in notes          # suite warning next to serving rows
    assert "outputs changed" in notes                          # 1 of 30 texts differs on the CPU engine
    # MMMU paired summary numbers equal compare.json
    mm = cmp["mmmu_pairs"]["patched"]
    line = next(x for x in md.splitlines() if x.startswith("| patched | 4 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert (int(cells[4]), int(cells[5])) == (mm["right_to_wrong"], mm["wrong_to_right"])
    assert float(cells[6]) == pytest.approx(mm["mcnemar_p"], rel=1e-3)
    # serving identity: 29 of 30 identical
    assert "29/30 (96.7%)" in md


def test_report_pr_blocks_when_suites_have_them(tmp_path):
    import patchbench.suites.serving as serving
    run = _full_run(tmp_path, cell_status={})
    md = render_run(run, plots=False).read_text()
    if callable(getattr(serving, "report_block", None)):
        assert "## Benchmarking" in md
        assert "### Before (baseline, rep0)" in md and "### After (patched, rep0)" in md
        assert "Serving Benchmark Result" in md
    verdicts = {r["metric"]: r["verdict"] for r in json.loads((run / "compare.json").read_text())["metrics"]}
    assert verdicts["output_throughput_tok_s"] == "improved"
    assert verdicts["itl_mean_ms"] == "improved"


def test_cli_report_and_plots(tmp_path):
    run = _full_run(tmp_path, cell_status={})
    assert cli_report([str(run)]) == EXIT_OK
    md = (run / "report.md").read_text()
    assert "## Plots" in md and "plots/throughput.png" in md
    import matplotlib.image as mpimg
    for name in ("throughput", "latency", "ecdf_ttft", "ecdf_itl", "mmmu_subjects", "timeline"):
        png = run / "plots" / f"{name}.png"
        assert png.is_file(), name
        assert mpimg.imread(png).shape[1] == 900          # 900 px wide: legible in a PR
    assert cli_report([str(tmp_path / "nope")]) == EXIT_USAGE


def test_plot_objects(tmp_path):
    from patchbench import plots
    run = _full_run(tmp_path, cell_status={})
    cmp = compare_run(run)
    view = load_run(run)
    rid = cmp["run_id"]
    checks = [
        (plots.plot_throughput(cmp), "variant", "(tok/s)"),
        (plots.plot_latency(cmp), "metric", "latency (ms"),
        (plots.plot_ecdf(view, "ttft_ms"), "TTFT (ms)", "fraction of requests"),
        (plots.plot_ecdf(view, "itl_ms"), "ITL (ms)", "fraction of tokens"),
        (plots.plot_mmmu_subjects(cmp), "accuracy change (percentage points)", "MMMU subject"),
        (plots.plot_timeline(cmp), "position in the schedule", "(tok/s)"),
    ]
    for fig, xlab, ylab in checks:
        assert fig is not None
        ax = fig.axes[0]
        assert xlab in ax.get_xlabel() and ylab in ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
        assert ax.get_legend() is not None
        assert rid in fig._suptitle.get_text()
    # per-subject differences: Math 0.5 -> 1.0 (+50 pp), Art 1.0 -> 0.0 (-100 pp), History 0
    fig = checks[4][0]
    widths = {t.get_text(): p.get_width() for t, p in zip(fig.axes[0].get_yticklabels(),
                                                           fig.axes[0].patches)}
    assert widths == pytest.approx({"Art": -100.0, "History": 0.0, "Math": 50.0})
    # one panel per variant that is not A/A: a second variant gets its own (a fresh-user trial
    # found only the first variant plotted)
    two = {**cmp, "mmmu_pairs": {**cmp["mmmu_pairs"], "other": {
        "subjects": {"Math": {"acc_a": 0.5, "acc_b": 0.0, "wrong_to_right": 0, "right_to_wrong": 1}},
        "flips": 1, "mcnemar_p": 1.0}}}
    f2 = plots.plot_mmmu_subjects(two)
    assert [ax.get_title().split(":")[0] for ax in f2.axes] == ["patched", "other"]
    w2 = {t.get_text(): p.get_width() for t, p in zip(f2.axes[0].get_yticklabels(), f2.axes[1].patches)}
    assert w2 == pytest.approx({"Art": 0.0, "History": 0.0, "Math": -50.0})
    # timeline: one series per variant, values = the repeats
    tl = checks[5][0].axes[0]
    ys = {ln.get_label(): list(ln.get_ydata()) for ln in tl.get_lines()}
    assert ys["baseline"] == [100, 101, 99] and ys["patched"] == [110, 112, 109]
    import matplotlib.pyplot as plt
    plt.close("all")


def test_cli_compare_two_runs(tmp_path, capsys):
    a = make_run(tmp_path / "a", run_id="runA", metrics={"serving": {"output_throughput_tok_s": {
        "baseline": [100, 101, 99], "patched": [100, 100, 100]}}})
    b = make_run(tmp_path / "b", run_id="runB", metrics={"serving": {"output_throughput_tok_s": {
        "baseline": [100, 100, 100], "patched": [120, 121, 119]}}})
    out = tmp_path / "out"
    assert cli_compare([str(a), str(b), "--variant", "patched", "--out", str(out), "--no-plots"]) == EXIT_OK
    cmp = json.loads((out / "compare.json").read_text())
    r = cmp["metrics"][0]
    assert r["variant"] == "B:patched" and cmp["baseline"] == "A:baseline"
    assert r["baseline_repeats"] == [100, 101, 99] and r["variant_repeats"] == [120, 121, 119]
    assert r["verdict"] == "improved"
    assert "not interleaved" in (out / "report.md").read_text()
    c = make_run(tmp_path / "c", run_id="runC", sglang="0.5.23",
                 suites_params={"serving": {"num_prompts": 50}},
                 metrics={"serving": {"output_throughput_tok_s": {"baseline": [1], "patched": [1]}}})
    capsys.readouterr()
    assert cli_compare([str(a), str(c)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "sglang version: A='0.5.1.post3', B='0.5.23'" in err
    assert "patchbench.suites.serving.num_prompts" in err
    assert cli_compare([str(a), str(b), "--variant", "nope"]) == EXIT_USAGE


def test_report_sync_probe_and_failed_block(tmp_path, monkeypatch):
    import patchbench.suites.sync_probe as sp
    # the real block imports torch (slow on a shared CPU); what is tested here is the report
    monkeypatch.setattr(sp, "report_block", lambda d: f"PROBE TABLE {d.parent.parent.name}",
                        raising=False)
    run = make_run(tmp_path, metrics={
        "sync_probe": {"sync_d2h_reads_count": {"baseline": [2, 2], "patched": [0, 0]}},
        "mmmu": {"mmmu_overall_acc": {"baseline": [0.5, 0.5], "patched": [0.5, 0.5]}}})
    md = render_run(run, plots=False).read_text()
    sec = md.split("## Sync probe")[1].split("\n## ")[0]
    assert "PROBE TABLE baseline" in sec and "PROBE TABLE patched" in sec
    monkeypatch.delattr(sp, "report_block")
    md = render_run(run, plots=False).read_text()      # without a block: the metrics table
    sec = md.split("## Sync probe")[1].split("\n## ")[0]
    assert "`sync_d2h_reads_count`" in sec
    assert "| baseline | 2.00 |" in sec and "| patched | 0 |" in sec
    import patchbench.suites.mmmu as mmmu
    if callable(getattr(mmmu, "report_block", None)):
        # no val_sglang.json in the synthetic cells: the block is left out and a note says why
        assert "mmmu report_block of baseline/rep0 failed" in md
        assert "## Accuracy Tests" not in md
