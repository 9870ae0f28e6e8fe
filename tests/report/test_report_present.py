"""What a reviewer reads agrees with itself: shown values from the change's estimator, outlier
repeats named, one vocabulary, repeats to decide, the PR figure's axes, no empty plot, and a
report.md that leaves the details to report-details.md."""

from __future__ import annotations

import copy
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from patchbench import report
from patchbench.analysis import power
from patchbench.analysis.build import OUTLIER_Z, describe_pairs, verdicts
from patchbench.analysis.comparison import Row, read_comparison
from patchbench.cli import main
from patchbench.report import plots
from patchbench.report import text as rtext
from patchbench.report.markdown import DETAILS_NAME
from patchbench.suite import MetricInfo
from tests.synthetic import declare_suite, make_run

DEMO = Path(__file__).parent.parent / "data" / "golden" / "demo-cpu" / "run"
DECL = {
    "output_throughput_tok_s": MetricInfo(
        "higher", "tok/s", label="Output throughput (tok/s)", primary=True, margin=5.0
    ),
    "mean_ttft_ms": MetricInfo("lower", "ms", label="Mean TTFT", primary=True, margin=5.0),
}


@pytest.fixture
def declared(monkeypatch):
    declare_suite(monkeypatch, "bench", DECL)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The golden demo run rendered once (plots included): (run folder, console output)."""
    import contextlib
    import io

    run = tmp_path_factory.mktemp("demo") / "run"
    shutil.copytree(DEMO, run)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(run)]) == 0
    return run, out.getvalue()


# ------------------------------------------------------------------- one estimator


def _table(text: str, head: str) -> list[list[str]]:
    """The body cells of the first markdown table after ``head``."""
    lines = text[text.index(head) :].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("| variant"))
    out = []
    for ln in lines[start + 2 :]:
        if not ln.startswith("|"):
            break
        out.append([c.strip() for c in ln.strip("|").split(" | ")])
    return out


def test_shown_values_reproduce_the_shown_change(demo):
    """In compare.json and in the printed primaries table, variant / baseline of every run row is
    1 + change (to the printed precision: 4 significant digits)."""
    run, _ = demo
    cmp = read_comparison(run)
    runs = [r for r in cmp.rows if r.kind == "run" and r.change is not None and r.n_pairs]
    assert runs
    for r in runs:
        assert 100 * (r.variant_value / r.baseline_value - 1) == pytest.approx(r.change, abs=1e-9)
        pairs = [
            (r.baseline_repeats[i], r.variant_repeats[i]) for i in range(len(r.paired_repeats))
        ]
        assert r.baseline_value == pytest.approx(math.exp(np.mean(np.log([p[0] for p in pairs]))))
    text = (run / "report.md").read_text()
    checked = 0
    for cells in _table(text, "## Primary metrics"):
        b, v, change = cells[2], cells[3], cells[4]
        if not change.endswith("%") or b.endswith("%"):
            continue  # accuracy (points) and counts
        shown = 100 * (float(v) / float(b) - 1)
        # 4 significant digits on each value: at most ~0.1% of relative error
        assert shown == pytest.approx(float(change.rstrip("%")), abs=0.15), cells
        checked += 1
    assert checked == 8


def test_accuracy_values_differ_by_the_change_in_points(demo):
    run, _ = demo
    for r in read_comparison(run).rows:
        if r.kind == "accuracy" and r.change is not None:
            assert 100 * (r.variant_value - r.baseline_value) == pytest.approx(r.change)
            assert rtext.shown_value(r, "baseline") == f"{100 * r.baseline_value:.1f}%"


# ------------------------------------------------------------------- outliers


def test_an_outlier_repeat_is_named_and_changes_no_verdict(tmp_path, declared, monkeypatch):
    thr_b = [100.0, 101.0, 99.0, 100.5, 100.0]
    thr_v = [110.0, 111.3, 108.7, 110.4, 160.0]  # rep4: +60% where the others are +10%
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "output_throughput_tok_s": {"baseline": thr_b, "patched": thr_v},
                "mean_ttft_ms": {"baseline": [50.0] * 5, "patched": [50.0, 50.1, 49.9, 50, 50]},
            }
        },
    )
    text = report.render_run(run, plots=False).read_text()
    cmp = read_comparison(run)
    r = cmp.row("bench", "output_throughput_tok_s", "patched")
    assert r.outlier_repeats == [4]
    assert cmp.row("bench", "mean_ttft_ms", "patched").outlier_repeats == []
    # the change is the test's on every pair, the outlier included
    assert r.change == pytest.approx(100 * verdicts.run_test(thr_b, thr_v, 3).estimate)
    assert "outlier repeat: rep4 (descriptive)" in text
    assert "3.5 robust sd (1.4826 x MAD)" in text  # the rule, in the Methods
    details = (run / "report-details.md").read_text()
    assert "**100 -> 160 (+60.0%) outlier**" in details
    # the link lists what the details file holds: no suite here has a PR-style block
    assert "### Before (" not in details and "PR-style blocks" not in text
    assert "[report-details.md](report-details.md): each primary's values per repeat." in text
    # with no outlier rule at all, every verdict is the same
    from patchbench.analysis import build as analysis

    monkeypatch.setattr(analysis, "OUTLIER_Z", 1e9)
    report.render_run(run, plots=False)
    again = read_comparison(run)
    assert again.row("bench", "output_throughput_tok_s", "patched").outlier_repeats == []
    assert [x.verdict for x in again.rows] == [x.verdict for x in cmp.rows]


def _described(d, margin=5.0):
    ks = list(range(len(d)))
    r = Row(suite="s", metric="m", variant="v", kind="run", paired_repeats=ks)
    describe_pairs(r, [(1.0, math.exp(x)) for x in d], margin)
    return r


def test_outlier_rule_needs_three_pairs_spread_and_more_than_the_margin():
    r = _described([0.1, 1.6])
    assert r.outlier_repeats == [] and r.log_ratio_sd is not None  # 2 pairs: no rule
    r = _described([0.1] * 3, margin=None)  # no spread, no margin: nothing named
    assert r.outlier_repeats == [] and r.log_ratio_sd == pytest.approx(0)
    # far by the robust sd and by more than the margin (log 1.05 ~ 0.049): named
    d = np.array([0.0, 0.01, -0.01, 0.02, 0.5])
    z = np.abs(d - np.median(d)) / sps.median_abs_deviation(d, scale="normal")
    assert [k for k, zk in enumerate(z) if zk > OUTLIER_Z] == [4]
    assert _described(d).outlier_repeats == [4]
    # a tight cluster makes the MAD tiny: +-1% is many robust sd away yet inside the margin
    tight = [0.005, -0.005, 0.004, -0.0099, 0.005]
    assert _described(tight, margin=None).outlier_repeats == [1, 3]
    assert _described(tight).outlier_repeats == []
    # three equal ratios (MAD 0) and one 20% away: the margin still names it
    assert _described([0.1, 0.1, 0.1, 0.3]).outlier_repeats == [3]


# ------------------------------------------------------------------- vocabulary


def test_console_and_report_use_the_verdict_words(demo):
    run, out = demo
    words = set(rtext.VERDICT_MARK)
    assert "unchanged" not in out and "unchanged" not in (run / "report.md").read_text()
    for r in read_comparison(run).rows_for(primary=True):
        assert rtext.verdict_text(r).split(",")[0].split(" within")[0] in words


# ------------------------------------------------------------------- repeats to decide


def _inconclusive(**kw) -> Row:
    base = dict(
        suite="s",
        metric="m",
        variant="v",
        kind="run",
        primary=True,
        verdict="inconclusive",
        change_unit="%",
        confidence=0.95,
        margin=5.0,
        n_pairs=3,
    )
    return Row(**(base | kw))


def _t_power(n: int, effect: float, sd: float, alpha: float) -> float:
    """Power of the two-sided paired t test, from scipy's noncentral t directly."""
    df, nc = n - 1, math.sqrt(n) * abs(effect) / sd
    crit = sps.t.ppf(1 - alpha / 2, df)
    return sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc)


def test_repeats_to_decide_is_the_fewest_reaching_80_percent_power():
    """The effect goal: the smallest n (at least min_repeats) whose exact power (noncentral t,
    at the verdict's level) reaches 80 %."""
    sd, change = 0.05, 10.0
    d = rtext.repeats_to_decide(_inconclusive(change=change, log_ratio_sd=sd), 3)
    eff = math.log1p(change / 100)
    n = next(n for n in range(3, 100) if _t_power(n, eff, sd, 0.05) >= 0.8)
    assert _t_power(n - 1, eff, sd, 0.05) < 0.8 <= _t_power(n, eff, sd, 0.05)
    assert d is not None and d.n == n and d.unit == "repeats" and "+10.0%" in d.what
    assert rtext.decide_text(d, short=True) == f"about {n} repeats to decide"
    assert "80% power to show the observed +10.0%" in rtext.decide_text(d)


def test_repeats_to_decide_equivalence_and_cap():
    # a small observed change inside the margin: equivalence needs fewer repeats than the effect
    d = rtext.repeats_to_decide(_inconclusive(change=0.5, log_ratio_sd=0.02), 3)
    assert d is not None and d.what == "equivalence within ±5%" and d.n is not None
    eff, margin = math.log1p(0.005), math.log1p(0.05)
    assert d.n == 3 or power.tost_power(d.n - 1, eff, margin, 0.02, 0.05) < 0.8
    assert power.tost_power(d.n, eff, margin, 0.02, 0.05) >= 0.8
    # absurd: "more than" the cap
    d = rtext.repeats_to_decide(_inconclusive(change=0.1, log_ratio_sd=0.5), 3)
    assert d is not None and d.n is None
    assert rtext.decide_text(d, short=True) == f"more than {rtext.DECIDE_CAP} repeats to decide"
    # not inconclusive, or no noise seen: nothing to say
    assert rtext.repeats_to_decide(_inconclusive(change=5.0, verdict="improved"), 3) is None
    assert rtext.repeats_to_decide(_inconclusive(change=5.0, log_ratio_sd=None), 3) is None


def test_one_pair_says_the_noise_is_unknown():
    r = _inconclusive(change=8.0, log_ratio_sd=None, n_pairs=1)
    assert rtext.decide_note(r, 3, short=True) == "noise unknown"
    assert "at least 2 paired repeats" in rtext.decide_note(r, 3)
    assert rtext.decide_note(_inconclusive(change=8.0, verdict="improved"), 3) is None


def test_every_inconclusive_primary_says_what_would_decide(demo):
    run, _ = demo
    text = (run / "report.md").read_text()
    for cells in _table(text, "## Primary metrics"):
        if "inconclusive" in cells[7]:
            assert "would likely decide" in cells[8] or "would be needed to decide" in cells[8]
    assert "Repeats to decide (inconclusive primaries)" in text


# ------------------------------------------------------------------- PR figure


def test_pct_ticks_are_round_and_apart():
    lo, hi = math.log(0.7), math.log(1.5)
    ticks = plots.pct_ticks(lo, hi)
    assert 0.0 in ticks and all(lo <= math.log1p(t / 100) <= hi for t in ticks)
    pos = sorted(math.log1p(t / 100) for t in ticks)
    assert min(b - a for a, b in zip(pos, pos[1:], strict=False)) >= (hi - lo) / 6 - 1e-12
    assert set(ticks) <= {0.0, 1, 2, 5, 10, 20, 30, 50, -1, -2, -5, -10, -20, -30}
    assert -30 in ticks  # a -30 % change is ticked where the axis reaches it


def test_pr_figure_axes(demo):
    """Run panels on the log-ratio axis (ticks in %), counts on their own scale, the margin band
    (only behind points with an interval) and the better direction labelled, titles of at most 2
    lines."""
    run, _ = demo
    cmp = read_comparison(run)
    fig = plots.plot_pr_figure(cmp)
    axes = [ax for ax in fig.axes if ax.axison]
    titles = [ax.get_title() for ax in axes]
    assert all(t.count("\n") <= 1 for t in titles)
    by = dict(zip(titles, axes, strict=True))
    thr = by["Output token throughput"]
    assert thr.get_xscale() == "function"
    assert "log-ratio axis" in thr.get_xlabel() and "better →" in thr.get_xlabel()
    assert any(t.get_text() == "+5%" for t in thr.get_xticklabels())
    # the demo's 2 paired repeats give no interval: no band, no margin label on the panel
    assert not any(t.get_text().startswith("margin") for t in thr.texts)
    acc = by["Overall accuracy"]  # 63 paired questions: an interval, so the +-2 pt band
    assert any(t.get_text() == "margin ±2 pt" for t in acc.texts)
    syncs = by["host syncs per call"]
    assert syncs.get_xscale() == "linear" and "← better" in syncs.get_xlabel()
    lo, hi = syncs.get_xlim()
    assert lo < 0 and hi > 507  # the counts themselves, not a change scaled to +-0.05
    assert "equivalence margin" in [t.get_text() for t in fig.legends[0].get_texts()]
    import matplotlib.pyplot as plt

    plt.close(fig)


# ------------------------------------------------------------------- no empty plot


def test_mmmu_subject_plot_skipped_when_nothing_moved(tmp_path):
    from patchbench.suite import get_suite

    same = {"n": 2, "acc_a": 0.5, "acc_b": 0.5, "right_to_wrong": 0.0, "wrong_to_right": 0.0}
    pair = {
        "repeats_used": 1,
        "n": 2,
        "acc_a": 0.5,
        "acc_b": 0.5,
        "right_to_wrong": 0.0,
        "wrong_to_right": 0.0,
        "flips": 0,
        "mcnemar_p": 1.0,
        "identical_share": 1.0,
        "subjects": {"Art": same},
        "notes": [],
    }
    cmp = {"baseline": "base", "run_id": "r", "pairs": {"mmmu": {"patched": pair}}}
    suite = get_suite("mmmu")
    assert suite.plots(cmp, tmp_path / "plots") == []
    assert not (tmp_path / "plots" / "mmmu_subjects.png").exists()
    md = "\n".join(suite.report_section(cmp))
    assert "no per-subject plot" in md
    moved = copy.deepcopy(cmp)
    moved["pairs"]["mmmu"]["patched"]["subjects"]["Art"]["acc_b"] = 0.0
    assert [p.name for p in suite.plots(moved, tmp_path / "plots")] == ["mmmu_subjects.png"]


# ------------------------------------------------------------------- length


def test_report_md_leaves_details_to_the_second_file(demo):
    run, _ = demo
    text = (run / "report.md").read_text()
    details = (run / DETAILS_NAME).read_text()
    assert len(text.encode()) < 16_000  # the golden demo: about 35 KB with everything inline
    assert "![pr_figure](plots/pr_figure.png)" in text
    assert "ecdf_ttft" not in text and "![ecdf_ttft](plots/ecdf_ttft.png)" in details
    assert "## Primary metrics per repeat" in details and "## Secondary metrics" in details
    assert "### Before (baseline, rep0)" in details and "Before (baseline" not in text
    assert re.search(r"\| rep0 \| rep1 \|", details)


def test_no_pr_figure_when_no_primary_has_a_value(tmp_path, declared):
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                # the variant's cells have no value: incomplete rows, nothing to draw
                "output_throughput_tok_s": {"baseline": [100, 101], "patched": [None, None]},
                "mean_ttft_ms": {"baseline": [50, 51], "patched": [None, None]},
            }
        },
        repeats=2,
    )
    text = report.render_run(run).read_text()
    assert {r.verdict for r in read_comparison(run).rows} == {"incomplete"}
    assert not (run / "plots" / "pr_figure.png").exists()
    assert "no PR figure: no primary metric has a value to draw" in text
