"""The answer line per variant (patchbench/report/text.py): what the run can and cannot decide,
what would decide it and at what cost; bounds never get repeats to decide; a one-point sweep's
goodput stays out of the family; a negative profiler overhead is never shown as a number.
Expected values computed by hand in the comments."""

from __future__ import annotations

import math

import pytest

from patchbench import records, report
from patchbench.analysis import power
from patchbench.analysis.build import build_comparison
from patchbench.report.text import console_summary, decide_note, repeats_to_decide, sentence
from patchbench.suite import MetricInfo
from tests.synthetic import declare_suite, make_run, make_sweep_run

THR = MetricInfo("higher", "tok/s", label="Output throughput", primary=True, margin=5.0)
TTFT = MetricInfo("lower", "ms", label="Mean TTFT", primary=True, margin=5.0)
GPU = " or on a GPU (an H200 config: `make bench` runs configs/pr9460-h200.yaml)"


@pytest.fixture(autouse=True)
def declared(monkeypatch):
    declare_suite(monkeypatch, "bench", {"thr": THR, "ttft": TTFT})


def _timed(run, seconds: dict[str, float]):
    """Give every cell of each variant the wall time ``seconds[variant]`` (cell.json)."""
    for c in records.read_json(run / "manifest.json")["cells"]:
        p = run / c["dir"] / "cell.json"
        cell = records.read_json(p)
        cell["timings_s"] = {"cell": seconds[c["variant"]]}
        records.write_json(p, cell)
    return run


def test_two_repeats_are_not_decidable_and_say_the_noise(tmp_path):
    # log ratios ln 1.1 and ln 1.21 = 2 ln 1.1: sd (ddof 1) = ln 1.1 / sqrt 2 = 0.0674 -> ±6.7 %
    run = make_run(
        tmp_path, metrics={"bench": {"thr": {"baseline": [100, 100], "patched": [110, 121]}}}
    )
    cmp = build_comparison(run)
    assert cmp.row("bench", "thr", "patched").log_ratio_sd == pytest.approx(math.log(1.1) / 2**0.5)
    s = sentence(cmp, "patched")
    assert s.startswith(
        "patched vs baseline: speed: not decidable here (2 paired repeats, fewer than the 3 a "
        "verdict needs; run-to-run noise ±6.7% on this host); to decide: "
    )
    assert "inconclusive" not in s and "n/a" not in s


def test_to_decide_names_the_repeats_and_minutes_from_the_cell_times(tmp_path):
    # baseline cells 60 s, patched 100 s: a round is 160 s. Log ratios ln 1.10 and ln 1.101: the
    # sd (0.00064) is tiny against the effect (0.096), so the floor, 3 repeats, decides it:
    # 3 x 160 s = 480 s = 8 minutes
    run = make_run(
        tmp_path / "a",
        metrics={"bench": {"thr": {"baseline": [100, 100], "patched": [110, 110.1]}}},
    )
    cmp = build_comparison(_timed(run, {"baseline": 60.0, "patched": 100.0}))
    assert sentence(cmp, "patched").endswith(
        "; to decide: run config synthetic again with schedule.repeats: 3 (about 8 minutes here, "
        "from this run's cell times)" + GPU
    )
    # noisier: log ratios ln 1.05 and ln 1.15 (sd 0.0643, mean 0.0943, outside the ±5 % margin):
    # the t test's n at 80 % power, alpha 0.05; minutes n x 160 / 60
    run = make_run(
        tmp_path / "b", metrics={"bench": {"thr": {"baseline": [100, 100], "patched": [105, 115]}}}
    )
    cmp = build_comparison(_timed(run, {"baseline": 60.0, "patched": 100.0}))
    lr = [math.log(1.05), math.log(1.15)]
    sd, effect = abs(lr[1] - lr[0]) / 2**0.5, sum(lr) / 2
    n = power.n_needed(effect, sd, 0.05, 0.8, floor=3, cap=50)
    assert n is not None and 3 < n < 50
    assert f"schedule.repeats: {n} (about {n * 160 / 60:.0f} minutes here," in sentence(
        cmp, "patched"
    )
    # an ab run (its config "ab-<preset>", built in memory): rerun ab with --repeats
    cmp.run.name = "ab-cpu-demo"
    s = sentence(cmp, "patched")
    assert f"to decide: run the ab command again with --repeats {n} (about" in s
    # ... or the same ab command with the H200 preset: `ab --preset pr-h200` alone names no change
    assert s.endswith(" or on a GPU (your ab command again with `--preset pr-h200`)")
    assert "or on a GPU (an H200 config" in sentence(
        cmp.model_copy(update={"run": cmp.run.model_copy(update={"name": "demo-cpu"})}), "patched"
    )


def test_verdicts_keep_their_words_in_order_identity_decided_undecided(tmp_path):
    # 3 repeats: +10 % in every repeat (improved); TTFT +10 %, -10 %, +2 %: inconclusive
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "thr": {"baseline": [100, 102, 98], "patched": [110, 112.2, 107.8]},
                "ttft": {"baseline": [50, 50, 50], "patched": [55, 45, 51]},
            }
        },
    )
    cmp = build_comparison(run)
    cmp.pairs = {"serving": {"patched": {"identity": {"n": 48, "identical": 47}}}}
    parts = sentence(cmp, "patched").split("; ")
    assert parts[0] == "patched vs baseline: outputs identical 47/48"
    assert parts[1] == "Output throughput +10.0% [+10.0%, +10.0%] improved"
    assert parts[2].startswith("Mean TTFT +0.3% [") and parts[2].endswith("] inconclusive")
    assert parts[3].startswith("to decide: run config synthetic again with schedule.repeats: ")
    assert "not decidable here" not in sentence(cmp, "patched")


def test_identity_counts_every_point_and_names_the_suites(tmp_path):
    """A sweep's loads and the traffic suite's workloads each hold their own identity count: the
    answer and the comment sum a suite's points (4 + 24 requests, 23 + 4 identical) and name the
    suites when there are several; one suite keeps the bare count."""
    from patchbench.report.comment import identity_line

    run = make_run(tmp_path, metrics={"bench": {"thr": {"baseline": [1, 1], "patched": [1, 1]}}})
    cmp = build_comparison(run)
    one = {"identity": {"n": 4, "identical": 4}}  # the top level: the first point's
    cmp.pairs = {
        "serving": {
            "patched": dict(one, points={"c1": one, "c8": {"identity": {"n": 24, "identical": 23}}})
        },
        "traffic": {"patched": {"points": {"sp": {"identity": {"n": 8, "identical": 8}}}}},
    }
    assert sentence(cmp, "patched").startswith(
        "patched vs baseline: outputs identical: serving 27/28, traffic 8/8; "
    )
    assert (
        identity_line(cmp)
        == "Outputs identical to `baseline`: `patched` serving 27/28, traffic 8/8."
    )
    del cmp.pairs["traffic"]
    assert sentence(cmp, "patched").startswith("patched vs baseline: outputs identical 27/28; ")


def test_a_bound_never_gets_repeats_to_decide(tmp_path, monkeypatch, capsys):
    # the variant's value is a lower bound in every repeat (the sweep's highest load met the SLO)
    load = MetricInfo("higher", "req", label="Highest load meeting the SLO", primary=True)
    declare_suite(monkeypatch, "bench", {"max_load": load})
    run = make_run(
        tmp_path,
        metrics={"bench": {"max_load": {"baseline": [40, 44, 38], "patched": [41, 40, 44]}}},
        bounds={("patched", k, "bench"): {"max_load": "lower"} for k in range(3)},
    )
    cmp = build_comparison(run)
    row = cmp.row("bench", "max_load", "patched")
    assert row.variant_bound == "lower" and row.verdict == "inconclusive"
    assert repeats_to_decide(row, 3) is None and decide_note(row, 3) is None
    s = sentence(cmp, "patched")
    assert "(a bound: more repeats cannot decide it)" in s and "≥" in s
    assert "to decide" not in s.replace("cannot decide", "") and "repeats:" not in s
    assert "repeats to decide" not in report.render_markdown(cmp)
    # the console shows the bound's values as report.md does (geometric means 40.59 -> >=41.63),
    # never a change in percent (a bound has none)
    console_summary(cmp)
    table = capsys.readouterr().out
    assert "40.59 -> ≥41.63" in table and "+2.6%" not in table


def test_one_point_sweep_keeps_goodput_out_of_the_family(tmp_path):
    # one point: goodput at the SLO is that point's goodput (the throughput in req/s): secondary;
    # the family is the highest load, throughput and median ITL at c16, per variant: 3
    cmp = build_comparison(make_sweep_run(tmp_path / "one", points=(16,)))
    assert not cmp.row("serving", "goodput_at_slo_req_s", "patched").primary
    assert {r.metric for r in cmp.rows_for("patched", primary=True)} == {
        "max_concurrency_at_slo_count",
        "output_throughput_tok_s@c16",
        "itl_median_ms@c16",
    }
    assert cmp.design.family == 3
    # two points: goodput at the SLO is the best of two, a primary of its own: 2 + 2 x 2
    two = build_comparison(make_sweep_run(tmp_path / "two", points=(1, 16)))
    assert two.row("serving", "goodput_at_slo_req_s", "patched").primary
    assert two.design.family == 6


def test_negative_profiler_overhead_reads_within_noise():
    from patchbench.analysis.comparison import Comparison
    from patchbench.suites.profile import report_section

    values = {"profiler_step_overhead_share": {"baseline": [-0.0502], "variant": [0.146]}}
    cmp = Comparison(
        baseline="baseline", variants=["v"], pairs={"profile": {"v": {"values": values}}}
    )
    text = "\n".join(report_section(cmp))
    assert "| profiler_step_overhead_share | within noise | 0.146 |" in text
    assert "-0.05" not in text and "-5" not in text


def test_a_run_stopped_by_its_deciding_primaries_says_so_and_the_minutes_saved(tmp_path):
    # throughput +10 % with little noise decides at the first look (4 rounds of at most 8);
    # TTFT (+-30 %) is not deciding (decide_on: [thr]) and ends inconclusive at that look.
    # Cells: baseline 60 s, patched 100 s: a round 160 s; 4 rounds not run: 640 s = 10.7 min
    thr_b, thr_p = [100, 101, 99, 100], [110, 111.2, 108.8, 110.1]
    run = make_run(
        tmp_path,
        metrics={
            "bench": {
                "thr": {"baseline": thr_b, "patched": thr_p},
                "ttft": {"baseline": [100, 100, 100, 100], "patched": [130, 75, 120, 80]},
            }
        },
        repeats=4,
        schedule_repeats={"min": 4, "max": 8, "step": 2, "decide_on": ["thr"]},
    )
    cmp = build_comparison(_timed(run, {"baseline": 60, "patched": 100}))
    assert cmp.design.stopped_after == 4 and cmp.design.decide_on == ["bench.thr"]
    assert cmp.row("bench", "thr", "patched").verdict == "improved"
    assert cmp.row("bench", "ttft", "patched").verdict == "inconclusive"
    assert sentence(cmp, "patched").endswith(
        "stopped after 4 of 8 rounds: thr decided; saved about 11 minutes"
    )


def test_an_accuracy_row_in_one_run_per_arm_says_what_would_decide_it():
    from patchbench.analysis.comparison import Row

    r = Row(
        suite="mmmu",
        metric="mmmu_overall_acc",
        variant="v",
        primary=True,
        kind="accuracy",
        verdict="inconclusive",
        change=0.4,
        confidence=0.95,
        low=-1.0,
        high=1.8,
        undecided="one run per arm cannot separate a change from server-to-server variation "
        "of about ±1.4 points; 4 rounds would (run sd 0.5 pt assumed)",
    )
    assert repeats_to_decide(r, 3) is None  # no questions-to-decide for a one-run row
    assert decide_note(r, 3, short=True) == (
        "one run per arm cannot separate a change from server-to-server variation of about "
        "±1.4 points; 4 rounds would"
    )


def test_undecided_accuracy_rows_keep_their_order(tmp_path):
    """MMMU at concurrency 1 and 8: both undecided, said in the rows' order (c1 first; the
    answer once reversed them), ahead of the other undecided clauses."""
    from patchbench.analysis.comparison import Row

    run = make_run(
        tmp_path, metrics={"bench": {"thr": {"baseline": [100, 100], "patched": [110, 121]}}}
    )
    cmp = build_comparison(run)

    def acc(key: str, label: str) -> Row:
        return Row(
            suite="mmmu",
            metric=f"mmmu_overall_acc@{key}",
            label=label,
            variant="patched",
            primary=True,
            kind="accuracy",
            verdict="inconclusive",
            change=0.0,
            change_unit="pt",
            confidence=0.95,
            low=-11.9,
            high=11.9,
        )

    cmp.rows = [
        acc("c1", "Overall accuracy at concurrency 1"),
        acc("c8", "Overall accuracy at concurrency 8"),
    ] + [r for r in cmp.rows]
    s = sentence(cmp, "patched")
    i1, i8, speed = (s.index(t) for t in ("concurrency 1", "concurrency 8", "speed: not decidable"))
    assert i1 < i8 < speed, s


def test_the_same_bound_in_both_arms_is_said_once(tmp_path, monkeypatch):
    """Every load of a sweep met the SLO in both arms: the highest load is "≥8" in both, said
    once ("both ≥8"), not "≥8 -> ≥8"."""
    load = MetricInfo("higher", "req", label="Highest load meeting the SLO", primary=True)
    declare_suite(monkeypatch, "bench", {"max_load": load})
    run = make_run(
        tmp_path,
        metrics={"bench": {"max_load": {"baseline": [8, 8], "patched": [8, 8]}}},
        bounds={
            (v, k, "bench"): {"max_load": "lower"}
            for v in ("baseline", "patched")
            for k in range(2)
        },
    )
    s = sentence(build_comparison(run), "patched")
    assert "Highest load meeting the SLO both ≥8 inconclusive" in s and "-> ≥8" not in s
