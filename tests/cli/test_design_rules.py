"""What the report decides per design (docs/design.md, Data flow 5-6), through the real ``report`` path on
synthetic run folders (tests.synthetic): one family per report, a sequential run's verdicts
from the sequential rule, and a run that knows whether it is finished."""

from __future__ import annotations

import math

import numpy as np
import pytest

from patchbench.analysis.build import build_comparison
from patchbench.analysis.sequential import nominal_levels
from patchbench.cli import main
from tests.synthetic import make_run

TPUT = "output_throughput_tok_s"
SEQ = {"min": 4, "max": 8, "step": 2}


def _serving(**arms):
    return {"serving": {TPUT: dict(arms)}}


def test_fixed_design_one_holm_family_across_variants(tmp_path):
    """Two patches with one primary each: one family of 2 (Holm), not a family per variant."""
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    strong = [120.0, 121.0, 119.0, 120.6, 119.4]
    weak = [100.2, 101.9, 98.8, 100.1, 99.9]
    run = make_run(
        tmp_path,
        variants={"baseline": [], "a": ["p1"], "b": ["p2"]},
        metrics=_serving(baseline=base, a=strong, b=weak),
    )
    cmp = build_comparison(run)
    assert cmp.design.kind == "fixed" and cmp.design.family == 2
    a = cmp.row("serving", TPUT, "a")
    b = cmp.row("serving", TPUT, "b")
    assert a.verdict == "improved" and a.confidence == pytest.approx(1 - 0.05 / 2)
    assert b.confidence == pytest.approx(1 - 0.05)  # Holm's second step
    assert "one family per report" in cmp.design.split


def test_an_aa_variant_is_not_in_the_family(tmp_path):
    base = [100.0, 101.0, 99.0, 100.5]
    run = make_run(
        tmp_path,
        variants={"baseline": [], "same": [], "a": ["p1"]},
        metrics=_serving(baseline=base, same=[x * 1.001 for x in base], a=[x * 1.2 for x in base]),
    )
    cmp = build_comparison(run)
    assert cmp.design.family == 1
    assert cmp.row("serving", TPUT, "a").confidence == pytest.approx(0.95)


def test_an_incomplete_primary_keeps_its_place(tmp_path):
    """A failed cell makes one variant's primary incomplete: the other's level stays alpha/2."""
    base = [100.0, 101.0, 99.0, 100.5]
    run = make_run(
        tmp_path,
        variants={"baseline": [], "a": ["p1"], "b": ["p2"]},
        metrics=_serving(baseline=base, a=[x * 1.2 for x in base], b=base),
        cell_status={("b", 2): "failed"},
    )
    cmp = build_comparison(run)
    assert cmp.design.family == 2
    assert cmp.row("serving", TPUT, "b").verdict == "incomplete"
    assert cmp.row("serving", TPUT, "a").confidence == pytest.approx(1 - 0.05 / 2)


def _seq_run(tmp_path, ratios, rounds, name="r"):
    base = [100.0 + (k % 3) for k in range(rounds)]
    return make_run(
        tmp_path / name,
        metrics=_serving(
            baseline=base, patched=[b * math.exp(r) for b, r in zip(base, ratios, strict=False)]
        ),
        repeats=rounds,
        schedule_repeats=SEQ,
    )


def test_sequential_run_shows_the_rules_decision(tmp_path, capsys):
    ratios = [0.18, 0.19, 0.18, 0.19]
    run = _seq_run(tmp_path, ratios, 4)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    cmp = build_comparison(run)
    d = cmp.design
    assert d.kind == "sequential" and d.stopped_after == 4 and d.partial is None
    row = cmp.row("serving", TPUT, "patched")
    level = nominal_levels((4, 6, 8), 0.05)[0]
    assert row.verdict == "improved" and row.decided_after == 4
    assert row.confidence == pytest.approx(1 - level)
    assert "sequential rule (look 1 of 3)" in "; ".join(row.notes)
    report = (run / "report.md").read_text()
    assert (
        "| sequential | 4 of at most 8 repeats; every primary decided after 4 repeats |" in report
    )
    assert "Output token throughput" in out and "improved" in out
    assert "Partial run" not in report and "Partial run" not in out


#: log ratios the rule (serving's +-5 % margin, futility 0.2) decides only at its last look
AMBIGUOUS = [0.05, 0.0, 0.06, 0.01, 0.04, 0.0, 0.06, 0.02]


@pytest.mark.parametrize("rounds", [1, 2, 3, 4, 5, 6, 7])
def test_sequential_run_interrupted_at_each_round_is_partial(tmp_path, capsys, rounds):
    """An ambiguous effect: the rule runs to 8 rounds; a folder stopped at any earlier round
    gives no decisive verdict, says where it stopped and prints the resume command."""
    ratios = AMBIGUOUS
    run = _seq_run(tmp_path, ratios[:rounds], rounds)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    cmp = build_comparison(run)
    assert cmp.design.partial is not None and cmp.design.rounds == rounds
    # before the first look the rounds it needs are missing cells: incomplete, never decisive
    assert cmp.row("serving", TPUT, "patched").verdict in ("inconclusive", "incomplete")
    resume = f"patchbench bench --resume {run}"  # no config file: the manifest holds it
    report = (run / "report.md").read_text()
    assert "Partial run" in report and resume in report
    assert "Partial run" in out and resume in out
    assert f"{rounds} complete round(s)" in report


def test_sequential_run_finished_at_the_maximum_is_not_partial(tmp_path):
    cmp = build_comparison(_seq_run(tmp_path, AMBIGUOUS, 8))
    assert cmp.design.partial is None and cmp.design.stopped_after == 8


def test_fixed_run_missing_planned_rounds_is_partial(tmp_path, capsys):
    base = [100.0, 101.0, 99.0, 100.5, 100.0]
    run = make_run(
        tmp_path,
        metrics=_serving(baseline=base, patched=[x * 1.2 for x in base]),
        cell_status={("baseline", 4): "missing", ("patched", 4): "missing"},
    )
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    cmp = build_comparison(run)
    assert cmp.design.partial.startswith("1 of the 5 planned rounds did not run")
    assert cmp.row("serving", TPUT, "patched").verdict in ("inconclusive", "incomplete")
    assert "Partial run" in out and "--resume" in out


def test_the_aa_variant_measures_noise_and_changes_no_verdict(tmp_path):
    """An A/A variant that comes out "improved" by chance: the patch's verdict stands, the report
    shows the A/A's run-to-run CV next to the config's assumed noise, and never says the machine
    was too noisy."""
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    same = [x * f for x, f in zip(base, (1.031, 1.029, 1.030, 1.032, 1.028), strict=True)]
    run = make_run(
        tmp_path,
        variants={"baseline": [], "same": [], "a": ["p1"]},
        metrics=_serving(baseline=base, same=same, a=[x * 1.2 for x in base]),
        compare={"assumed_cv": {TPUT: 1.5}},
    )
    assert main(["report", str(run)]) == 0
    cmp = build_comparison(run)
    aa_row = cmp.row("serving", TPUT, "same")
    assert aa_row.verdict == "inconclusive" and "never improved or regressed" in aa_row.notes[-1]
    assert not cmp.health.ok
    assert cmp.row("serving", TPUT, "a").verdict == "improved"
    assert cmp.row("serving", TPUT, "a").verdict_before_health is None
    (noise,) = cmp.health.noise
    import statistics

    d = [math.log(y / x) for x, y in zip(base, same, strict=True)]
    assert noise.cv_pct == pytest.approx(100 * statistics.stdev(d) / math.sqrt(2))
    assert noise.low_pct < noise.cv_pct < noise.high_pct and noise.assumed_pct == 1.5
    report = (run / "report.md").read_text()
    assert "too noisy" not in report and "downgraded" not in report
    assert "run-to-run CV" in report and "the config assumes 1.5%" in report
    assert "no verdict is changed by it" in report


def _count_suite(monkeypatch, by: str | None):
    from patchbench.analysis import build as analysis
    from patchbench.suite import MetricInfo

    info = MetricInfo(
        "lower", "count", "syncs", primary=True, kind="deterministic", deterministic_by=by
    )
    monkeypatch.setattr(
        analysis, "suite_declarations", lambda name, notes: (None, {"syncs_count": info})
    )


@pytest.mark.parametrize(
    ("rounds", "by", "shown"),
    [
        (1, None, "one measurement per arm"),
        (2, None, "exact"),
        (1, "tests/test_x.py::test_y", "exact"),
    ],
)
def test_a_count_is_exact_only_when_shown_exact(tmp_path, monkeypatch, rounds, by, shown):
    from patchbench.report import sentence

    _count_suite(monkeypatch, by)
    run = make_run(
        tmp_path,
        metrics={"probe": {"syncs_count": {"baseline": [4] * rounds, "patched": [3] * rounds}}},
    )
    cmp = build_comparison(run)
    row = cmp.row("probe", "syncs_count", "patched")
    assert row.verdict == "improved"
    assert f"syncs 4 -> 3 improved ({shown})" in sentence(cmp, "patched")
    assert row.exact_by == ({1: by, 2: "repeats"}[rounds] if by or rounds == 2 else None)


# ---------------------------------------------------------------------------------------------
# balanced schedules and drift (item 4)


def _cfg(tmp_path, schedule: str):
    p = tmp_path / "c.yaml"
    p.write_text(
        "name: t\nsglang: 0.5.1.post3\nmodel: {path: .cache/models/tiny-qwen25vl-tf4, tiny: true}\n"
        "server: {args: [--device=cpu]}\nvariants: {baseline: [], patched: [null-comment]}\n"
        f"schedule: {schedule}\nsuites: {{serving: {{}}}}\n"
    )
    return p


def test_an_unbalanced_order_needs_a_reason_for_timed_suites(tmp_path):
    from patchbench.config import load_config
    from patchbench.errors import ConfigError

    with pytest.raises(ConfigError, match="schedule.unbalanced_reason"):
        load_config(_cfg(tmp_path, "{repeats: 3, order: sequential}"))
    cfg = load_config(
        _cfg(tmp_path, '{repeats: 3, order: sequential, unbalanced_reason: "warm cache study"}')
    )
    assert cfg.schedule.unbalanced_reason == "warm cache study"


def _drifting(tmp_path, order, reason=None):
    # the baseline drifts -2 %/round (small noise); the patch is +10 % on top of the same drift
    noise = [1.0, 1.002, 0.998, 1.001, 0.999, 1.0, 1.002, 0.998]
    base = [100.0 * 0.98**k * e for k, e in enumerate(noise)]
    pat = [x * 1.10 * e for x, e in zip(base, reversed(noise), strict=True)]
    run = make_run(tmp_path, metrics=_serving(baseline=base, patched=pat), order=order)
    if reason is not None:
        import json

        man = json.loads((run / "manifest.json").read_text())
        man["config"]["schedule"]["unbalanced_reason"] = reason
        (run / "manifest.json").write_text(json.dumps(man))
    return run


def test_drift_is_reported_and_changes_verdicts_only_when_unbalanced(tmp_path):
    run = _drifting(tmp_path / "i", "interleaved")
    assert main(["report", str(run)]) == 0
    cmp = build_comparison(run)
    (d,) = [x for x in cmp.drift if x.metric == TPUT]
    assert d.found and d.slope_pct == pytest.approx(-2.0, abs=0.3) and d.alpha == 0.01
    assert cmp.row("serving", TPUT, "patched").verdict == "improved"
    text = (run / "report.md").read_text()
    assert "## Drift" in text and "drifts -2.0" in text and "balances it" in text

    run = _drifting(tmp_path / "s", "sequential", reason="a warm-cache study")
    assert main(["report", str(run)]) == 0
    cmp = build_comparison(run)
    row = cmp.row("serving", TPUT, "patched")
    assert row.verdict == "inconclusive" and "unbalanced schedule" in row.notes[-1]
    text = (run / "report.md").read_text()
    assert "a warm-cache study" in text and "(sequential schedule)" in text


def test_no_drift_without_a_trend(tmp_path):
    base = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2]
    cmp = build_comparison(
        make_run(tmp_path, metrics=_serving(baseline=base, patched=[x * 1.1 for x in base]))
    )
    (d,) = [x for x in cmp.drift if x.metric == TPUT]
    assert not d.found and d.n == 6


# ---------------------------------------------------------------------------------------------
# MMMU: the question as the unit plus the cell-to-cell variance (item 5)


def _mmmu_run(tmp_path, repeats: int):
    from tests.synthetic import mmmu_rows

    rng = np.random.default_rng(4)
    q = 200
    truth = rng.random(q) < 0.45
    recs, accs = {}, {}
    for v in ("baseline", "same", "patched"):
        for k in range(repeats):
            shift = rng.normal(0, 0.02)
            p = np.clip(np.where(truth, 0.9, 0.1) + shift, 0, 1)
            ok = rng.random(q) < p
            recs[(v, k)] = mmmu_rows(["correct" if x else "wrong" for x in ok])
            accs.setdefault(v, []).append(float(ok.mean()))
    return make_run(
        tmp_path,
        variants={"baseline": [], "same": [], "patched": ["p1"]},
        metrics={"mmmu": {"mmmu_overall_acc": accs}},
        mmmu_records=recs,
    )


def test_mmmu_interval_pools_the_cell_variance_over_every_arm(tmp_path):
    from patchbench import stats
    from patchbench.suites.mmmu import pair_repeats

    run = _mmmu_run(tmp_path / "r3", 3)
    cmp = build_comparison(run)
    row = cmp.row("mmmu", "mmmu_overall_acc", "patched")
    assert row.method.startswith("paired t on per-question differences")
    assert "repeats 3/3" in row.method and "cell" in row.method
    # the pooled estimate: the baseline's parts once, each variant's own
    dirs = {
        v: [run / v / f"rep{k}" / "mmmu" for k in range(3)] for v in ("baseline", "same", "patched")
    }
    parts = []
    for i, v in enumerate(("same", "patched")):
        c = pair_repeats(dirs["baseline"], dirs[v])["accuracy"]["mmmu_overall_acc"]["cells"]
        parts += ([stats.CellVariance(**c["baseline"])] if i == 0 else []) + [
            stats.CellVariance(**c["variant"])
        ]
    pooled = stats.pool_cell_variance(parts)
    assert pooled.df_between == 6
    acc = cmp.pairs["mmmu"]["patched"]["accuracy"]["mmmu_overall_acc"]
    t = stats.paired_items_t(acc["baseline"], acc["variant"], 3, 3, pooled)
    lo, hi = t.interval(1 - row.confidence)
    assert (row.low, row.high) == pytest.approx((100 * lo, 100 * hi))
    assert not any("not covered" in n for n in row.notes)


def test_mmmu_with_one_repeat_says_cell_variance_is_not_covered(tmp_path):
    cmp = build_comparison(_mmmu_run(tmp_path / "r1", 1))
    row = cmp.row("mmmu", "mmmu_overall_acc", "patched")
    assert "cell-level variance not covered" in row.method
    assert any("not covered" in n for n in row.notes)


def test_mmmu_interval_coverage_by_simulation():
    """A cell-level shift of half a point (sd): with 2 repeats per arm the pooled cell component
    keeps the coverage near 95 % (80 trials here; docs/mmmu.md has the published table), and the
    interval narrows from 2 to 5 repeats."""
    from tools.calibration.mmmu import MmmuModel, simulate_row

    m = MmmuModel(questions=900, cell_sd=0.005)
    two = simulate_row(m, 2, 80, seed=1)
    five = simulate_row(m, 5, 40, seed=1)
    assert two.coverage >= 0.88 and five.width_pt < two.width_pt
