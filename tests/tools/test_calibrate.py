"""tools/calibrate.py and tools.calibration: its rates come from the comparison code
(patchbench.analysis.build), its in-memory shortcut gives the same verdicts as run folders through
compare_run, and its noise model and sequential rows do what the docstrings say. A few trials each
(a smoke test, not the calibration itself). The slow ones are marked ``calibration``: left out of
the default run, run by ``make test-calibration`` and the daily CI job."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from patchbench.analysis.comparison import CompareSettings
from tools.calibration import designs, model, stopping, tables, trials

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cal():
    spec = importlib.util.spec_from_file_location("calibrate", REPO / "tools" / "calibrate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = mod
    spec.loader.exec_module(mod)
    return mod


def _trial(seed, repeats, speedup=None, run_cv=0.03, run_id="t"):
    rng = np.random.default_rng(seed)
    return model.simulate(
        rng,
        model.Model(run_cv=run_cv, questions=60),
        repeats,
        speedup=speedup or {},
        syncs={},
        run_id=run_id,
    )


@pytest.mark.calibration
def test_in_memory_verdicts_equal_run_folder_verdicts(tmp_path):
    s = CompareSettings()
    for seed, speedup in ((1, {}), (2, {"patch-a": 0.10}), (3, {"patch-b": -0.08})):
        tr = _trial(seed, 3, speedup, run_id=f"t{seed}")
        mem = trials.compare_trial(tr, s)
        disk = trials.compare_trial(tr, s, via_folders=True, root=tmp_path)

        def key(cmp):
            return {
                (r.variant, r.metric): (r.verdict, r.change, r.low, r.high, r.confidence)
                for r in cmp.rows
                if r.primary
            }

        km, kd = key(mem), key(disk)
        assert set(km) == {
            (v, m)
            for v in ("aa", "patch-a", "patch-b")
            for ms in model.PRIMARIES.values()
            for m in ms
        }
        assert km.keys() == kd.keys()
        for k in km:
            assert km[k][0] == kd[k][0], k
            for a, b in zip(km[k][1:], kd[k][1:], strict=True):
                assert (a is None and b is None) or a == pytest.approx(b, rel=1e-9, abs=1e-12), k
        assert mem.health.ok == disk.health.ok


def test_mmmu_average_matches_the_suites_pair_hook(tmp_path):
    from patchbench import records
    from patchbench.suites.mmmu import pair_repeats
    from tests.synthetic import mmmu_rows

    tr = _trial(5, 3)
    dirs = {}
    for (v, k), c in tr.correct.items():
        d = tmp_path / v / f"rep{k}"
        records.write_jsonl(
            d / "records.jsonl", mmmu_rows(["correct" if x else "wrong" for x in c])
        )
        dirs[(v, k)] = d
    real = pair_repeats(
        [dirs[("baseline", k)] for k in range(3)], [dirs[("patch-a", k)] for k in range(3)]
    )["accuracy"]["mmmu_overall_acc"]
    mine = trials.mmmu_accuracy(tr.correct, "baseline", "patch-a", [0, 1, 2])["mmmu_overall_acc"]
    assert mine["ids"] == real["ids"]
    assert mine["baseline"] == pytest.approx(real["baseline"])
    assert mine["variant"] == pytest.approx(real["variant"])


def test_huge_effect_always_improved_and_rates_follow_the_settings():
    m = model.Model(run_cv=0.01, questions=60)
    c = trials.run_row(m, 5, 6, 0, CompareSettings(), scenarios=("effect",), effect=0.5)
    assert (c.effect, c.new_power) == (6, 6)
    # the same trials with min_repeats above the repeats: the comparison judges nothing
    c = trials.run_row(
        m, 5, 6, 0, CompareSettings(min_repeats=6), scenarios=("effect",), effect=0.5
    )
    assert (c.effect, c.new_power) == (6, 0)


def test_one_repeat_runs_are_never_judged():
    m = model.Model(run_cv=0.03, questions=60)
    c = trials.run_row(m, 1, 4, 0, CompareSettings(), scenarios=("effect",), effect=0.5)
    assert (c.effect, c.new_power) == (4, 0)
    c = trials.run_row(m, 1, 4, 0, CompareSettings(), scenarios=("null",))
    assert c.null == 4 and c.new_run_any == 0
    # every run-level primary of the null patches: inconclusive, never equivalent either
    assert all(c.equiv[x] == 0 for x in model.PRIMARIES["serving"])


def test_noise_model_run_cv_without_request_noise():
    # request noise off: a cell's output throughput is n*L / sum of wave maxima, every request
    # of a cell scaled by exp(s), s ~ N(0, run_cv) (TTFT adds < 2 % of E2E): the log sd over
    # cells is the run CV
    m = model.Model(run_cv=0.05, req_cv=0.0, questions=10)
    tr = model.simulate(
        np.random.default_rng(0), m, 200, speedup={"patch-a": 0.10}, syncs={}, run_id="t"
    )
    x = np.log(tr.values("baseline", "serving", "output_throughput_tok_s"))
    assert x.std(ddof=1) == pytest.approx(0.05, rel=0.15)
    ratio = np.exp(
        np.mean(np.log(tr.values("patch-a", "serving", "output_throughput_tok_s"))) - x.mean()
    )
    assert ratio == pytest.approx(1.10, abs=0.015)
    e2e = tr.values("baseline", "serving", "e2e_latency_median_ms")
    itl = tr.values("baseline", "serving", "itl_median_ms")
    assert np.corrcoef(np.log(e2e), np.log(itl))[0, 1] > 0.95  # one server: one speed


def test_calibrate_smoke_design_table_of_a_fixed_config(cal, capsys):
    """The default run's smoke test of tools/calibrate.py (the slow rows: -m calibration): one
    trial of the design table for a fixed-repeat config prints its row and the verdict line."""
    argv = ["--config", str(REPO / "configs" / "demo-cpu.yaml"), "--design-only", "--trials", "1"]
    rc = cal.main(argv + ["--design-repeats", "--sequential"])
    out = capsys.readouterr().out
    assert rc == 1  # 2 repeats cannot reach the power target
    assert "| fixed 2 | 1 / 1 | 2.0 / 2 | 2.0 / 2 |" in out
    assert "| fixed 5 (today: every suite in every cell) | 1 / 1 |" in out
    assert not [ln for ln in out.splitlines() if ln.startswith("| sequential")]  # none asked
    assert "demo-cpu.yaml: fixed 2 repeats at run CV 3%: " in out and "(NOT met)" in out


@pytest.mark.calibration
def test_main_prints_the_tables(cal, capsys):
    rc = cal.main(
        ["--trials", "2", "--cvs", "0.03", "--search-max", "5", "--design-repeats", "6"]
        + ["--sequential", "4:6:2:obrien-fleming"]
    )
    out = capsys.readouterr().out
    assert rc in (0, 1)
    assert "| 3% | 1 | 2 / 0 |" in out
    assert "| fixed 5 (today: every suite in every cell) | 2 / 2 |" in out
    # the PR config runs MMMU in the first three rounds: so does every row but today's reference
    assert "| fixed 6, MMMU in the first 3 rounds | 2 / 2 |" in out
    assert "| sequential 4..6 step 2 (obrien-fleming), MMMU in the first 3 rounds | 2 / 2 |" in out
    assert "| sequential 4..12 step 2 (obrien-fleming), MMMU in the first 3 rounds | 2 / 2 |" in out
    assert "pr9460-h200.yaml: " in out and " repeats at run CV 3%: " in out


@pytest.mark.calibration
def test_sequential_rows_use_the_runners_stopping_rule():
    from patchbench.analysis.sequential import FUTILITY, Design, looks_from_schedule

    plan = stopping.sequential_plan(
        REPO / "configs" / "pr9460-h200.yaml", stopping.SeqSpec(4, 12, 2)
    )
    assert plan.design == Design(
        looks_from_schedule(4, 12, 2), alpha=0.05, kind="pocock", futility=FUTILITY
    )
    assert plan.controls == ("aa",)  # the A/A variant never holds the run open
    assert sorted(k for k, *_ in plan.primaries) == sorted(
        f"serving.{m}" for m in model.PRIMARIES["serving"]
    )  # MMMU accuracy and host syncs gain nothing from repeats: they never hold a run up
    assert all(mg == pytest.approx(math.log(1.05)) for *_, mg in plan.primaries)
    # no noise at all: every null primary is equivalent at the first look, patch-a's +10 % improved
    quiet = model.Model(run_cv=1e-4, req_cv=0.0, questions=30)
    tr = model.simulate(
        np.random.default_rng(0), quiet, 12, speedup={"patch-a": 0.10}, syncs={}, run_id="q"
    )
    assert trials.sequential_stop(tr, plan) == 4
    # 30 % run noise: nothing can be decided by 12 repeats, so the runner's rule stops for
    # futility at the first look; without a futility stop nothing stops before the last look
    loud = model.Model(run_cv=0.30, questions=30)
    tr = model.simulate(np.random.default_rng(1), loud, 12, speedup={}, syncs={}, run_id="l")
    assert trials.sequential_stop(tr, plan) == 4
    no_fut = stopping.sequential_plan(
        REPO / "configs" / "pr9460-h200.yaml", stopping.SeqSpec(4, 12, 2, futility=0.0)
    )
    assert trials.sequential_stop(tr, no_fut) == 12
    cut = model.truncate(tr, 6)
    assert cut.repeats == 6 and max(k for _, k in cut.metrics) == 5
    assert cut.values("aa", "serving", "ttft_median_ms").tolist() == (
        tr.values("aa", "serving", "ttft_median_ms")[:6].tolist()
    )


@pytest.mark.calibration
def test_sequential_row_counts_the_rounds_that_ran():
    plan = stopping.sequential_plan(
        REPO / "configs" / "pr9460-h200.yaml", stopping.SeqSpec(4, 8, 2)
    )
    quiet = model.Model(run_cv=1e-4, req_cv=0.0, questions=30)
    c = trials.run_row(quiet, 0, 3, 0, CompareSettings(), plan=plan)
    assert c.reps == {"null": [4, 4, 4], "effect": [4, 4, 4], "small": []}
    # no effect: a report whose A/A check passes has host syncs exact and the 4 serving
    # primaries of both patches decided (equivalent, or a change within the margin: p-values of
    # a null are uniform however small the noise); MMMU with 30 questions cannot show +-2
    # points. A failed A/A check downgrades every verdict.
    ok = c.null - c.aa_failed
    assert c.decided_run["null"] == 8 * ok and c.decided["null"] == 10 * ok
    # +10 %: the same, and patch-a's throughput improved in every report whose A/A check passed
    ok = c.decided_run["effect"] // 8
    assert c.decided_run["effect"] == 8 * ok and c.decided["effect"] == 10 * ok
    assert c.new_power == ok


def test_design_table_cost_columns():
    c = trials.Counts(null=2, effect=1, new_fp_patch=1, new_power=1)
    c.reps = {"null": [8, 8], "effect": [4], "small": []}
    c.decided = {"null": 6, "effect": 9}
    c.decided_run = {"null": 2, "effect": 5}
    cost = designs.Cost(
        cells=4,
        startup_s=60.0,
        serving_s=79.0,
        mmmu_s=76.0,
        correctness_s=20.0,
        correctness_cells=4,
    )
    line = tables.design_table([("a design", c, False)], 0.03, cost)[2]
    # MMMU in every round. No effect: 8 rounds x 4 cells x (60 + 79 + 76) s = 6880 s, plus 4
    # correctness cells x (60 + 20) s = 320 s: 7200 s = 2.0 h (120 min); 3 primaries a report /
    # 2.0 h = 1.50, 1 run-level / 2.0 = 0.50. +10 %: 4 rounds = 3440 + 320 = 3760 s = 1.0444 h
    # (63 min); 9 / 1.0444 = 8.62, 5 / 1.0444 = 4.79
    assert "| a design | 2 / 1 | 8.0 / 8 | 4.0 / 4 | 25.0% " in line
    assert "| 3.00 / 1.00 | 9.00 / 5.00 | 120 / 63 | 1.50 / 0.50 | 8.62 / 4.79 |" in line
    # MMMU in the first round only: 4 x (8 x (60 + 79) + 76) + 320 = 5072 s = 1.4089 h (85
    # min): 3 / 1.4089 = 2.13, 1 / 1.4089 = 0.71; +10 %: 4 x (4 x 139 + 76) + 320 = 2848 s =
    # 0.7911 h (47 min): 9 / 0.7911 = 11.38, 5 / 0.7911 = 6.32
    line = tables.design_table([("a design", c, True)], 0.03, cost)[2]
    assert "| 3.00 / 1.00 | 9.00 / 5.00 | 85 / 47 | 2.13 / 0.71 | 11.38 / 6.32 |" in line
    assert "+5%" not in tables.design_table([("a design", c, False)], 0.03, cost)[0]
    c.small, c.small_power, c.reps["small"] = 4, 1, [4, 4, 4, 4]
    head, _, line = tables.design_table([("a design", c, False)], 0.03, cost)
    assert "| +5% output throughput called improved |" in head
    assert "| 100.0% [20.7, 100.0] | 25.0% [4.6, 69.9] |" in line  # +10 % 1/1, +5 % 1/4
    assert head.count("|") == line.count("|")


def test_mmmu_first_judges_mmmu_on_repeat_0_and_the_rest_on_every_repeat():
    """suites.mmmu.rounds: first in the simulation: each MMMU row's change is the accuracy
    difference of repeat 0 alone (by hand from the simulated correctness), every other row has
    the all-rounds comparison's change (its interval differs: MMMU in one run per arm decides
    nothing and leaves the family, verdicts.accuracy_rule, so the Holm levels are looser)."""
    s = CompareSettings()
    tr = _trial(7, 4, {"patch-a": 0.10})
    first = trials.compare_trial(tr, s, mmmu_first=True)
    every = trials.compare_trial(tr, s)

    def rows(cmp, pick):
        return {
            (r.variant, r.metric): (r.verdict, r.change)
            for r in cmp.rows
            if r.primary and pick(r.suite)
        }

    def rest(x):
        return x != "mmmu"

    assert rows(first, rest) == rows(every, rest) and rows(first, rest)
    assert first.design.family == every.design.family - 2  # patch-a's and patch-b's MMMU
    assert first.row("mmmu", "mmmu_overall_acc", "patch-a").undecided
    for v in ("aa", "patch-a", "patch-b"):
        row = first.row("mmmu", "mmmu_overall_acc", v)
        by_hand = 100 * (tr.correct[(v, 0)].mean() - tr.correct[("baseline", 0)].mean())
        over_all = 100 * np.mean(
            [tr.correct[(v, k)].mean() - tr.correct[("baseline", k)].mean() for k in range(4)]
        )
        assert row.change == pytest.approx(by_hand, abs=1e-9)
        assert every.row("mmmu", "mmmu_overall_acc", v).change == pytest.approx(over_all)
    assert first.suite_rounds["mmmu"] == [0]
    with pytest.raises(ValueError, match="via-folders"):
        trials.compare_trial(tr, s, via_folders=True, mmmu_first=True)
    assert designs.Cost(4, 60.0, 79.0, 76.0, 30.0, 4).hours(0.5, True) == pytest.approx(
        (4 * (0.5 * 139 + 0.5 * 76) + 4 * 90) / 3600
    )  # fewer rounds than one: MMMU ran in that share of them
    # the PR config runs MMMU in its first 3 rounds and no correctness cell (nothing
    # instrumented); the demo MMMU in every round and one correctness cell per variant
    assert designs.config_schedule(REPO / "configs" / "pr9460-h200.yaml") == (3, 0)
    assert designs.config_schedule(REPO / "configs" / "demo-cpu.yaml") == (0, 3)
    assert designs.mmmu_label(1) == ", MMMU in the first round only"
    assert designs.mmmu_label(3) == ", MMMU in the first 3 rounds" and designs.mmmu_label(0) == ""


def test_config_repeats_reads_a_sequential_schedule(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("schedule:\n  repeats: {min: 4, max: 10, step: 3, boundary: obrien-fleming}\n")
    fixed, seq, s = designs.config_repeats(p)
    assert fixed is None and seq == stopping.SeqSpec(4, 10, 3, "obrien-fleming")
    p.write_text("schedule:\n  repeats: 7\ncompare:\n  confidence: 0.9\n")
    assert designs.config_repeats(p) == (7, None, CompareSettings(confidence=0.9))
    assert stopping.parse_seq("4:12:2") == stopping.SeqSpec(4, 12, 2, "pocock")


def test_seq_spec_futility_and_an_aa_variant_never_holds_the_run():
    assert stopping.parse_seq("4:12:2:pocock:0.2") == stopping.SeqSpec(4, 12, 2, "pocock", 0.2)
    spec = stopping.parse_seq("4:12:2:pocock:0")
    assert spec.label == "sequential 4..12 step 2 (pocock) [no futility]"
    for bad in ("4:12:2:pocock:1.5", "4:12:2:pocock:x", "4:12:2:pocock:0:aa"):
        with pytest.raises(Exception, match="MIN:MAX:STEP|futility"):
            stopping.parse_seq(bad)
    cfg = REPO / "configs" / "pr9460-h200.yaml"
    plan = stopping.sequential_plan(cfg, spec)
    assert plan.design.futility == 0.0 and plan.controls == ("aa",)
    # the A/A variant alone is ambiguous (30 % noise only there): it is a measured control, so
    # the rule stops at the first look (the patches are noise-free nulls)
    quiet = model.Model(run_cv=1e-4, req_cv=0.0, questions=30)
    tr = model.simulate(np.random.default_rng(0), quiet, 12, speedup={}, syncs={}, run_id="q")
    rng = np.random.default_rng(1)
    for k in range(12):
        f = math.exp(rng.normal(0.0, 0.3))
        for m in model.PRIMARIES["serving"]:
            tr.metrics[("aa", k)]["serving"][m] *= f
    assert trials.sequential_stop(tr, plan) == 4


@pytest.mark.calibration
def test_design_only_prints_just_the_design_table(cal, capsys):
    rc = cal.main(
        ["--design-only", "--trials", "2", "--design-repeats", "6", "--small-effect", "0.05"]
        + ["--sequential", "4:6:2:pocock:0.2", "--mmmu-rounds", "all"]
    )
    out = capsys.readouterr().out
    assert rc in (0, 1)
    assert "| run CV |" not in out  # no CV rows
    assert "| fixed 5 (today: every suite in every cell) | 2 / 2 |" in out
    assert "| fixed 6 | 2 / 2 |" in out
    assert "| sequential 4..6 step 2 (pocock) [futility 0.2] | 2 / 2 |" in out
    assert "+5% output throughput called improved" in out


def test_nightly_auto_repeats_rows_use_the_jobs_planner():
    import yaml

    from patchbench.config.nightly import NightlySettings
    from tools.calibration.nightly import auto_repeats

    raw = yaml.safe_load((REPO / "configs" / "nightly-h200.yaml").read_text())
    s = NightlySettings.model_validate(raw["nightly"])
    quiet = auto_repeats(s, 0.015, 1, 5)
    assert quiet.source == "learned" and not quiet.capped
    assert s.min_repeats <= quiet.repeats <= s.max_repeats
    noisy = auto_repeats(s, 0.06, 1, 8)
    assert noisy.capped and noisy.repeats == s.max_repeats and "capped at 12" in noisy.why


def test_nightly_quiet_only_rows_gate_the_same_quiet_nights_as_the_full_rows():
    import yaml

    from patchbench.config.nightly import NightlySettings
    from tools.calibration.nightly import gate_rates

    raw = yaml.safe_load((REPO / "configs" / "nightly-h200.yaml").read_text())
    s = NightlySettings.model_validate(raw["nightly"])
    kw = {"drift": 0.02, "warm": 6, "quiet": 2}
    full = gate_rates(s, 8, 0.03, 3, 5, **kw)
    quiet = gate_rates(s, 8, 0.03, 3, 5, steps=False, **kw)
    assert (quiet.green, quiet.underpowered, quiet.false_red_per_30, quiet.nights) == (
        full.green,
        full.underpowered,
        full.false_red_per_30,
        full.nights,
    )
    assert math.isnan(quiet.patch_within) and math.isnan(quiet.stock_within)


def test_order_table_interleaved_misleads_under_a_period_of_two_rounds(cal, capsys):
    """Every 8th cell 10 % slow at a tiny run CV, 4 variants: interleaved slows the baseline
    in every even round (it opens them), so the A/A variant looks faster in every trial; the
    table prints one row per period and order."""
    rc = cal.main(
        [
            "--order-only",
            "--periods",
            "8",
            "--repeats",
            "8",
            "--trials",
            "2",
            "--target-cv",
            "0.001",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0 and out[0] == "Run CV 0.1%, 8 repeats, every P-th cell 10% slower:"
    assert out[-2].startswith("| 8 | interleaved | 2 | ")
    assert out[-2].split(" | ")[4].startswith("100.0% [")  # the A/A variant
    assert out[-1].startswith("| 8 | randomized | 2 | ")
