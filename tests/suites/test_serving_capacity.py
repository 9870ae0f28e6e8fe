"""The capacity search (patchbench/suites/serving/capsearch.py) on synthetic attainment curves with
brackets computed by hand, the per-request SLO attainment (attainment.py) on hand-made records,
the paired capacity verdict through the comparison (capacity.py's metrics, the calibration's
in-memory run data), the config's validation, a 2-probe search through the real probe path
with a fake bench_serving, the probes in compare.json and the figures (capplot.py) on a
synthetic run folder, and configs/capacity-cpu.yaml on real servers (e2e)."""

from __future__ import annotations

import json
import math

import pytest

from patchbench.config import config_from_mapping
from patchbench.errors import ConfigError
from patchbench.suites.serving import Params, run
from patchbench.suites.serving.attainment import AttainmentSlo, attainment
from patchbench.suites.serving.capacity import CAPACITY, arm_interval, report_lines, round_seed
from patchbench.suites.serving.capacity import CapacityPair as CapacityPairModel
from patchbench.suites.serving.capsearch import search
from tests.suites.test_serving_multi_point import REC, pkg, recording_ctx  # noqa: F401 (fixture)

# --- the search on synthetic curves -------------------------------------------------------------


def linear(c: float) -> float:
    """Score falling 1 % a unit of load: 0.95 at 5, 0.94 at 6."""
    return (100 - c) / 100


def test_smooth_curve_doubles_down_then_bisects_and_interpolates():
    s = search(linear, target=0.945, start=16, maximum=256, precision=0.1)
    # 16 (0.84) fails, 8 (0.92) fails, 4 (0.96) meets; bisect 6 (0.94) fails, 5 (0.95) meets
    assert [p.load for p in s.probes] == [16, 8, 4, 6, 5]
    assert (s.answer, s.lo, s.hi) == ("bracket", 5, 6)
    # interpolated where the score crosses 0.945 between 0.95 at 5 and 0.94 at 6
    assert s.value == pytest.approx(5.5)


def test_previous_bracket_costs_two_probes_and_a_moved_one_recovers():
    s = search(linear, target=0.945, start=16, maximum=256, prior=(5, 6))
    assert [p.load for p in s.probes] == [5, 6] and s.value == pytest.approx(5.5)
    # the previous bracket (8, 9) no longer holds: 8 fails, steps of its width 1 doubling: 7
    # fails, 5 meets; bisect 6 fails
    s = search(linear, target=0.945, start=16, maximum=256, prior=(8, 9))
    assert [p.load for p in s.probes] == [8, 7, 5, 6] and (s.lo, s.hi, s.answer) == (
        5,
        6,
        "bracket",
    )
    # from a bracket below: 3 meets, step 2 to 5 meets, step 4 to 9 fails; bisect 7, 6 fail
    s = search(linear, target=0.945, start=16, maximum=256, prior=(3, 5))
    assert [p.load for p in s.probes] == [3, 5, 9, 7, 6] and (s.lo, s.hi) == (5, 6)


def test_cliff_is_a_bracket_not_a_root():
    s = search(lambda c: 1.0 if c <= 40 else 0.1, target=0.95, start=16, maximum=256, precision=0.1)
    # 16, 32 meet, 64 fails; 48 fails, 40 meets, 44 fails; 44 - 40 = 4 <= 0.1 x 40
    assert [p.load for p in s.probes] == [16, 32, 64, 48, 40, 44]
    assert (s.answer, s.lo, s.hi, s.value) == ("cliff", 40, 44, 40)


def test_beyond_the_range_is_a_bound_and_never_met_has_no_value():
    s = search(lambda c: 1.0, target=0.95, start=16, maximum=100)
    assert [p.load for p in s.probes] == [16, 32, 64, 100]
    assert (s.answer, s.lo, s.hi, s.value) == ("beyond", 100, None, None)
    s = search(lambda c: 0.0, target=0.95, start=16, maximum=100)
    assert [p.load for p in s.probes] == [16, 8, 4, 2, 1]
    assert (s.answer, s.lo, s.hi, s.value) == ("never", None, 1, None)
    # a dither of +1 at precision 0.1 moves the first probe to floor(16 x 1.1) = 17
    s = search(lambda c: 1.0, target=0.95, start=16, maximum=100, precision=0.1, dither=1.0)
    assert [p.load for p in s.probes] == [17, 34, 68, 100]
    with pytest.raises(ValueError, match="dither"):
        search(linear, target=0.9, start=1, maximum=10, dither=2.0)
    with pytest.raises(ValueError, match="bad search range"):
        search(linear, target=0.9, start=1, maximum=0)


def test_max_probes_caps_the_search():
    # the smooth curve needs 16, 8, 4, 6, 5 (above); three probes: 16, 8 fail, 4 meets -> the
    # bracket so far [4, 8], interpolated between 0.96 at 4 and 0.92 at 8: 4 + 0.015/0.04 x 4
    s = search(linear, target=0.945, start=16, maximum=256, precision=0.1, max_probes=3)
    assert [p.load for p in s.probes] == [16, 8, 4]
    assert (s.answer, s.lo, s.hi) == ("bracket", 4, 8) and s.value == pytest.approx(5.5)
    # two probes, both failing: no bracket, "capped" with only the failing end
    s = search(linear, target=0.945, start=16, maximum=256, max_probes=2)
    assert [p.load for p in s.probes] == [16, 8]
    assert (s.answer, s.lo, s.hi, s.value) == ("capped", None, 8, None)
    # growing: 16, 32, 64 meet, the cap stops the doubling: met at 64, no failing end
    s = search(lambda c: 1.0, target=0.95, start=16, maximum=1000, max_probes=3)
    assert (s.answer, s.lo, s.hi, s.value) == ("capped", 64, None, None)
    # a cap the search never reaches changes nothing
    s = search(linear, target=0.945, start=16, maximum=256, precision=0.1, max_probes=5)
    assert [p.load for p in s.probes] == [16, 8, 4, 6, 5] and s.answer == "bracket"
    with pytest.raises(ValueError, match="max_probes"):
        search(linear, target=0.9, start=1, maximum=10, max_probes=0)


# --- per-request attainment ---------------------------------------------------------------------


RECS = {
    # r0 meets; r1 TTFT too slow; r2 TPOT (300 ms) too slow; r3 errored; r4 cut; r5 asked for 0
    # tokens; r6 one token (no TPOT), meets; r7 meets
    "status": ["ok", "ok", "ok", "failed", "cut", "asked_zero", "ok", "ok"],
    "ttft_ms": [100.0, 3000.0, 100.0, None, None, None, 100.0, 150.0],
    "e2e_ms": [550.0, 3090.0, 2800.0, None, None, None, 100.0, 600.0],
    "output_len": [10, 10, 10, 0, 3, 0, 1, 10],
}


def test_attainment_share_and_percentile_rules_by_hand():
    slo = AttainmentSlo(ttft_ms=2000, tpot_ms=200, rule="share", target=0.5)
    a = attainment(RECS, slo)
    # judged: 6 (cut and asked_zero left out); every bound met: r0, r6, r7; errored: r3
    assert (a.judged, a.met, a.errored, a.excluded) == (6, 3, 1, 2)
    assert a.score == pytest.approx(3 / 6) and a.meets
    # per bound: TTFT met by r0, r2, r6, r7; TPOT by r0, r1, r6, r7
    assert a.per_bound == pytest.approx({"ttft_ms": 4 / 6, "tpot_ms": 4 / 6})
    pct = attainment(RECS, slo.model_copy(update={"rule": "percentile", "target": 0.6}))
    assert pct.score == pytest.approx(4 / 6) and pct.meets
    e2e = attainment(RECS, AttainmentSlo(ttft_ms=None, tpot_ms=None, e2e_ms=600, rule="share"))
    assert e2e.score == pytest.approx(3 / 6)  # r0, r6, r7
    assert "TTFT <= 2000 ms and TPOT <= 200 ms" in slo.definition()
    with pytest.raises(ValueError, match="at least one"):
        AttainmentSlo(ttft_ms=None, tpot_ms=None)


# --- the verdict ----------------------------------------------------------------------------------


def _comparison(base, var, repeats, schedule=None):
    from patchbench.analysis import build as analysis
    from patchbench.analysis.comparison import CompareSettings
    from tools.calibration.capacity import BASE, VAR, _Serving, run_data

    values = {(BASE, k): b for k, b in enumerate(base)} | {(VAR, k): v for k, v in enumerate(var)}
    data = run_data(values, repeats, {"start": 8}, schedule or repeats)
    return analysis.build_comparison(data, CompareSettings(), suites={"serving": _Serving()})


def test_paired_capacity_ratio_by_hand():
    cmp = _comparison([10, 10, 10, 10], [11, 12, 11, 12], 4)
    r = cmp.row("serving", CAPACITY, "patched")
    assert r.primary and r.verdict == "improved"
    # log ratios ln 1.1, ln 1.2 twice: mean 0.138816, sd 0.050236, t(0.975, 3) = 3.182446
    d = [math.log(1.1), math.log(1.2)] * 2
    assert sum(d) / 4 == pytest.approx(0.138816, abs=1e-6)
    assert r.change == pytest.approx(14.891, abs=1e-3)
    assert (r.low, r.high) == (pytest.approx(6.065, abs=1e-3), pytest.approx(24.452, abs=1e-3))
    lines = report_lines(cmp, {"patched": "the SLO"})
    assert lines[2].startswith(
        "- patched carries +14.9 % [+6.1%, +24.5%] more load at the SLO (improved)"
    )
    # the baseline's capacity 10 in every round: a zero-width interval
    assert "baseline: capacity 10.0 [10.0, 10.0]" in lines[3]
    assert lines[-2] == "  - SLO: the SLO"


def test_a_bound_is_never_a_number():
    cmp = _comparison([10, 10, ">= 256: beyond", 10], [11, 12, 11, 12], 4)
    r = cmp.row("serving", CAPACITY, "patched")
    assert r.verdict == "incomplete"
    assert any("baseline/rep2: >= 256: beyond" in n for n in r.notes)


def test_arm_interval_by_hand():
    gm, lo, hi = arm_interval([8.0, 32.0], 0.95)
    # logs ln 8, ln 32: mean ln 16, sd ln 4 / sqrt 2, se ln 4 / 2; t(0.975, 1) = 12.7062
    assert gm == pytest.approx(16.0)
    assert lo == pytest.approx(16 * math.exp(-12.7062 * math.log(4) / 2), rel=1e-4)
    assert hi == pytest.approx(16 * math.exp(12.7062 * math.log(4) / 2), rel=1e-4)


# --- config -----------------------------------------------------------------------------------------


def _cfg(serving):
    return {
        "name": "cap",
        "sglang": "0.5.1.post3",
        "model": {"path": "m", "tiny": True},
        "variants": {"baseline": [], "p": []},
        "suites": {"serving": serving},
    }


def test_config_validation_names_bad_keys():
    cfg = config_from_mapping(_cfg({"capacity": {"slo": {"rule": "share", "target": 0.95}}}))
    cap = cfg.suite_params["serving"].capacity
    assert cap.slo.target == 0.95 and cap.start == 16 and cap.max == 256
    with pytest.raises(ConfigError, match="precison"):
        config_from_mapping(_cfg({"capacity": {"precison": 0.1}}))
    with pytest.raises(ConfigError, match="ttf_ms"):
        config_from_mapping(_cfg({"capacity": {"slo": {"ttf_ms": 1}}}))
    with pytest.raises(ConfigError, match="either sweep or capacity"):
        config_from_mapping(_cfg({"capacity": {}, "sweep": {"points": [1, 2]}}))
    with pytest.raises(ConfigError, match="min <= start <= max"):
        config_from_mapping(_cfg({"capacity": {"start": 512}}))


# --- two probes through the real probe path -------------------------------------------------------


def test_two_probe_search_with_a_fake_tool(tmp_path, pkg):  # noqa: F811 (fixture)
    flushes: list[float] = []
    ctx = recording_ctx(tmp_path, pkg, "cap", flushes)
    # the recording's 20 requests at every concurrency; an SLO every request meets
    slo = {"ttft_ms": 1e9, "tpot_ms": 1e9, "rule": "share", "target": 0.95}
    cap = {"slo": slo, "start": 2, "max": 4, "prompts_per_load": 1, "min_prompts": 20}
    res = run(ctx, Params(dataset_name="random-ids", num_prompts=20, capacity=cap))
    meta = res.meta["capacity"]
    assert [p["load"] for p in meta["probes"]] == [2, 4] and len(flushes) == 1
    assert meta["answer"] == "beyond" and CAPACITY not in res.metrics
    assert res.meta["not_judged"][CAPACITY].startswith(">= 4")
    assert all(p["score"] == 1.0 and p["judged"] == 20 for p in meta["probes"])
    # both probes in one client process (one import of the tool), handed over one at a time
    driver = (ctx.out_dir / "multi_point" / "stdout.txt").read_text()
    assert driver.count("imported") == 1
    assert [ln.split()[2] for ln in driver.splitlines() if " exit 0 " in ln] == ["c2", "c4"]
    # both probes with the round's seed (the same for every arm of the round)
    assert meta["seed"] == round_seed(None, ctx.repeat)
    for k in ("c2", "c4"):
        argv = json.loads((ctx.out_dir / "probes" / k / "argv.json").read_text())
        assert argv[argv.index("--seed") + 1] == str(meta["seed"])


def test_withheld_reasons_name_what_was_found_whatever_is_missing():
    from patchbench.suites.serving.capacity import withheld_reason
    from patchbench.suites.serving.capsearch import Capacity

    cap = Capacity(start=8, min=1, max=32, max_probes=5)
    assert withheld_reason(cap, "beyond", 32, None, None).startswith(">= 32: the SLO is met")
    assert (
        withheld_reason(cap, "never", None, 1, None) == "never met: the SLO fails at concurrency 1"
    )
    assert withheld_reason(cap, "capped", 64, None, None) == (
        "not bracketed within max_probes = 5: the SLO is met at 64 (a bound, not a value)"
    )
    assert withheld_reason(cap, "capped", None, 8, None).endswith(
        "the SLO fails at 8 (a bound, not a value)"
    )
    # a client-bound first probe: nothing met below it, no bracket end (CI's real search once
    # crashed here formatting a None)
    assert withheld_reason(cap, "client-bound", None, None, 10) == (
        "not searched past concurrency 10: its probe was client-bound (neither meets nor fails "
        "the SLO); no load below it was met"
    )
    assert withheld_reason(cap, "client-bound", 7, None, 10).endswith("; the SLO is met at 7")


def test_a_client_bound_first_probe_withholds_the_capacity(tmp_path, pkg, monkeypatch):  # noqa: F811
    """The search's first probe client-bound: the cell ends ok with the capacity withheld and the
    probe named, no bracket (the pair hook and the figure take it: tests above)."""
    import patchbench.suites.serving.capacity as C
    from patchbench.suite import SuiteResult

    bound = "the client process used 95% of a core (> 90%)"

    class Bound:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def run(self, key, pdir, params, wrapper=None):
            return SuiteResult(meta={"client": {"bound": bound}})

    monkeypatch.setattr(C, "ClientSession", Bound)
    ctx = recording_ctx(tmp_path, pkg, "bound", [])
    cap = {"slo": {"ttft_ms": 1e9, "rule": "share", "target": 0.9}, "start": 10, "max": 32}
    res = run(ctx, Params(dataset_name="random-ids", num_prompts=20, capacity=cap))
    m = res.meta["capacity"]
    assert m["answer"] == "client-bound" and (m["lo"], m["hi"], m["value"]) == (None, None, None)
    assert m["probes"] == [{"load": 10, "score": None, "meets": None, "client_bound": bound}]
    assert CAPACITY not in res.metrics and res.metrics[C.PROBES] == 1
    assert res.meta["not_judged"][CAPACITY].startswith("not searched past concurrency 10")


# --- compare.json's probes, the capacity figure and the PR figure's panel ------------------------

SLO = {"ttft_ms": 1000, "tpot_ms": 30, "rule": "share", "target": 0.9}
#: per (arm, round): the probes [(concurrency, share), ...] in the order run, and the bracket
PROBES = {
    ("baseline", 0): ([(8, 1.0), (16, 0.5), (12, 0.92), (14, 0.7)], 12, 14),
    ("baseline", 1): ([(12, 0.95), (14, 0.6), (13, 0.8)], 12, 13),
    ("patched", 0): ([(8, 1.0), (16, 0.4), (12, 0.8), (10, 0.95)], 10, 12),
    ("patched", 1): ([(10, 0.91), (12, 0.85), (11, 0.88)], 10, 11),
}
#: each cell's capacity (the metric): interpolated within its bracket, as capsearch.search does
CAPS = {("baseline", 0): 12.18, ("baseline", 1): 12.25, ("patched", 0): 11.0, ("patched", 1): 10.33}


def _capacity_run(tmp_path, primary=True, rounds=2):
    from tests.synthetic import make_run

    meta = {
        (v, k, "serving"): {
            "capacity": {
                "answer": "bracket",
                "lo": lo,
                "hi": hi,
                "value": CAPS[v, k],
                "seed": round_seed(1, k),
                "probes": [{"load": c, "score": s, "meets": s >= 0.9} for c, s in probes],
            }
        }
        for (v, k), (probes, lo, hi) in PROBES.items()
        if k < rounds
    }
    caps = {v: [CAPS[v, k] for k in range(rounds)] for v in ("baseline", "patched")}
    cap = {"slo": SLO, "start": 8, "max": 32, "precision": 0.1, "primary": primary}
    return make_run(
        tmp_path,
        metrics={"serving": {CAPACITY: caps}},
        meta=meta,
        suites_params={"serving": {"seed": 1, "capacity": cap}},
    )


def test_compare_json_carries_each_arms_probes_per_round(tmp_path):
    from patchbench.analysis.comparison import read_comparison
    from patchbench.report import render_run

    run = _capacity_run(tmp_path)
    render_run(run, plots=False)
    pair = read_comparison(run).pairs["serving"]["patched"]
    assert pair["target"] == 0.9 and pair["slo_definition"].startswith(
        "TTFT <= 1000 ms and TPOT <= 30 ms; at least 90 % of requests meet every bound"
    )
    for arm, v in (("baseline", "baseline"), ("variant", "patched")):
        assert [r["repeat"] for r in pair[arm]] == [0, 1]
        for r in pair[arm]:
            probes, lo, hi = PROBES[v, r["repeat"]]
            assert r["probes"] == [list(p) for p in probes] and (r["lo"], r["hi"]) == (lo, hi)
            assert r["seed"] == round_seed(1, r["repeat"]) and r["answer"] == "bracket"
    # the same seed in both arms of a round, a new one each round
    assert [r["seed"] for r in pair["baseline"]] == [r["seed"] for r in pair["variant"]]
    assert pair["baseline"][0]["seed"] != pair["baseline"][1]["seed"]


def _drawn(ax):
    """(probe markers per colour, the vertical lines' x, the dashed lines' y, the bands' x
    extents)."""
    from matplotlib.colors import to_hex

    marks: dict[str, list] = {}
    vlines, dashed = [], []
    for line in ax.lines:
        xs, ys = list(line.get_xdata()), list(line.get_ydata())
        if line.get_marker() == "o" and len(xs) == 1:
            marks.setdefault(to_hex(line.get_color()), []).append((xs[0], ys[0]))
        elif line.get_linestyle() == "--":
            dashed.append(ys[0])
        elif len(xs) == 2 and xs[0] == xs[1] and line.get_linestyle() == "-":
            vlines.append(xs[0])
    bands = [(p.get_x(), p.get_x() + p.get_width()) for p in ax.patches]
    return marks, vlines, dashed, bands


def test_capacity_figure_draws_every_probe_the_target_and_each_arms_interval(tmp_path):
    import matplotlib.pyplot as plt

    from patchbench.analysis.comparison import read_comparison
    from patchbench.report import plots, render_run
    from patchbench.suites.serving.capplot import draw_capacity

    run = _capacity_run(tmp_path)
    render_run(run)
    assert (run / "plots" / "capacity.png").is_file()
    cmp = read_comparison(run)
    fig, ax = plt.subplots()
    assert draw_capacity(ax, cmp)
    marks, vlines, dashed, bands = _drawn(ax)
    # every probe of both rounds, per arm (C0 the baseline, C1 the variant)
    assert sorted(marks["#1f77b4"]) == sorted(p for k in (0, 1) for p in PROBES["baseline", k][0])
    assert sorted(marks["#ff7f0e"]) == sorted(p for k in (0, 1) for p in PROBES["patched", k][0])
    assert dashed == [0.9]
    # each arm's geometric mean over its rounds: sqrt(12.18 x 12.25), sqrt(11.0 x 10.33)
    assert vlines == [pytest.approx(12.2150, abs=1e-4), pytest.approx(10.6597, abs=1e-4)]
    # the band: the t interval on the logs, n = 2 (t(0.975, 1) = 12.7062): for the variant
    # half-width 12.7062 x |ln(11.0 / 10.33)| / 2 = 0.39928
    assert bands[1] == (
        pytest.approx(10.6597 * math.exp(-0.39928), rel=1e-4),
        pytest.approx(10.6597 * math.exp(0.39928), rel=1e-4),
    )
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[1] == "patched: capacity 10.7 [7.15, 15.9], 2 rounds"
    plt.close(fig)
    # the PR figure: the attainment panel first, beside the capacity's change panel
    pr = plots.plot_pr_figure(cmp)
    titles = [a.get_title() for a in pr.axes if a.get_visible() and a.axison]
    assert titles[0].startswith("Attainment against load") and len(titles) == 2
    plt.close(pr)


def test_one_round_shows_the_bracket_and_no_panel_when_the_capacity_is_not_a_primary(tmp_path):
    import matplotlib.pyplot as plt

    from patchbench.analysis.build import compare_run
    from patchbench.report import plots
    from patchbench.suites.serving.capplot import draw_capacity

    cmp = compare_run(_capacity_run(tmp_path, primary=False, rounds=1))
    fig, ax = plt.subplots()
    assert draw_capacity(ax, cmp)
    assert _drawn(ax)[3] == [(12, 14), (10, 12)]  # one round: its bracket
    plt.close(fig)
    assert plots.plot_pr_figure(cmp) is None  # no primary: no PR figure, no panel


def test_a_client_bound_round_pairs_and_draws(tmp_path):
    """A round whose search stopped at a client-bound probe (score None, capacity withheld):
    compare.json keeps its judged probes and names the load, the figure marks it with a cross on
    the target line (a real CPU search under load produced one: the pair hook refused it)."""
    import matplotlib.pyplot as plt

    from patchbench.analysis.build import compare_run
    from patchbench.suites.serving.capplot import draw_capacity
    from tests.synthetic import make_run

    judged = [(4, 1.0), (7, 0.94), (13, 0.92)]
    meta = {
        ("baseline", 0, "serving"): {
            "capacity": {
                "answer": "bracket",
                "lo": 12,
                "hi": 14,
                "value": 12.18,
                "seed": round_seed(1, 0),
                "probes": [
                    {"load": c, "score": x, "meets": x >= 0.9} for c, x in PROBES["baseline", 0][0]
                ],
            }
        },
        ("patched", 0, "serving"): {
            "capacity": {
                "answer": "client-bound",
                "lo": 13,
                "hi": None,
                "value": None,
                "seed": round_seed(1, 0),
                "probes": [{"load": c, "score": x, "meets": True} for c, x in judged]
                + [{"load": 25, "score": None, "meets": None, "client_bound": "median send lag"}],
            }
        },
    }
    cap = {"slo": SLO, "start": 8, "max": 32, "precision": 0.1, "primary": True}
    run = make_run(
        tmp_path,
        metrics={"serving": {CAPACITY: {"baseline": [12.18], "patched": [None]}}},
        meta=meta,
        suites_params={"serving": {"seed": 1, "capacity": cap}},
    )
    cmp = compare_run(run)
    pair = cmp.pairs["serving"]["patched"]
    got = pair.variant[0] if hasattr(pair, "variant") else None
    if got is None:  # compare.json's dict form
        got = CapacityPairModel.model_validate(pair).variant[0]
    assert got.answer == "client-bound" and got.client_bound == 25
    assert got.probes == judged and got.lo == 13 and got.hi is None
    fig, ax = plt.subplots()
    assert draw_capacity(ax, cmp)
    crosses = [
        (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines if ln.get_marker() == "x"
    ]
    assert ([25], [0.9]) in crosses
    assert "client-bound probe (not judged)" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


# --- a real search on the CPU ---------------------------------------------------------------------


@pytest.mark.e2e
def test_real_capacity_search_on_the_cpu(capacity_cpu):
    """configs/capacity-cpu.yaml on real servers (the capacity_cpu fixture, tests/conftest.py):
    in every cell the probes ran with the round's seed (one per round, the same in both arms),
    each at its own concurrency, the bracket is the probes' (lo met the target, hi did not, within
    the precision), round 2 started from the arm's round-1 bracket, the first probe both arms
    share sent the same prompts, every probe carries its client's state (not client-bound: the
    search would have stopped there), and compare.json, the report and the figures carry it."""
    from patchbench.analysis.comparison import read_comparison
    from patchbench.config import load_config
    from patchbench.records import read_json
    from patchbench.suites.serving.capacity import round_dither

    cap = load_config("configs/capacity-cpu.yaml").suite_params["serving"].capacity
    arms = ("baseline", "mrope-sync-free")
    metas = {}
    for v in arms:
        for k in (0, 1):
            cell = capacity_cpu / v / f"rep{k}" / "serving"
            summary = read_json(cell / "summary.json")
            m = metas[v, k] = summary["meta"]["capacity"]
            assert summary["status"] == "ok" and m["seed"] == round_seed(1, k)
            assert summary["metrics"]["capacity_probes_count"] == len(m["probes"])
            for j, p in enumerate(m["probes"]):
                argv = read_json(cell / "probes" / f"c{p['load']}" / "command.json")["argv"]
                assert argv[argv.index("--seed") + 1] == str(m["seed"])
                assert argv[argv.index("--max-concurrency") + 1] == str(p["load"])
                client = read_json(cell / "probes" / f"c{p['load']}" / "summary.json")["meta"][
                    "client"
                ]
                if client["bound"]:  # a loaded host: the search stops there, nothing judged
                    assert j == len(m["probes"]) - 1 and m["answer"] == "client-bound", m
                    assert p["score"] is None and p["client_bound"] == client["bound"]
                    continue
                assert p["meets"] == (p["score"] >= cap.slo.target) and p["judged"] >= 16
                assert client["requests"] == p["judged"], client
                assert 0 <= client["send_lag_median_ms"] < client["send_gap_mean_ms"]
            score = {p["load"]: p["score"] for p in m["probes"]}
            lo, hi = m["lo"], m["hi"]
            assert 1 <= len(m["probes"]) <= cap.max_probes == 5  # the config's cap (CI time)
            if m["answer"] in ("client-bound", "capped"):  # withheld; lo: the highest load met
                assert (
                    CAPACITY not in summary["metrics"] and CAPACITY in summary["meta"]["not_judged"]
                )
                assert lo == max((p["load"] for p in m["probes"] if p["meets"]), default=None)
            else:
                assert m["answer"] in ("bracket", "cliff"), m  # the SLO is crossed within 1-32
                assert score[lo] >= 0.9 > score[hi]
                if len(m["probes"]) < cap.max_probes:  # not stopped by the cap: bisected
                    assert hi - lo <= max(1, cap.precision * lo)
                assert lo <= summary["metrics"][CAPACITY] <= hi
            # the first probe: from the start, then from the arm's round-1 bracket (its lo),
            # moved by the round's dither, within the range, floored
            prior = None if k == 0 else [metas[v, 0]["lo"], metas[v, 0]["hi"]]
            prior = None if prior == [None, None] else prior  # no end found in round 1
            assert m["prior"] == prior and m["dither"] == round_dither(m["seed"])
            first = cap.start if k == 0 or prior[0] is None else prior[0]
            moved = first * (1 + m["dither"] * cap.precision)
            assert m["probes"][0]["load"] == math.floor(min(max(moved, cap.min), cap.max))
            assert len({p["load"] for p in m["probes"]}) == len(m["probes"])
    # common random numbers: round 1's first probe is the same concurrency in both arms
    c = metas[arms[0], 0]["probes"][0]["load"]
    lens = [
        read_json(capacity_cpu / v / "rep0" / "serving" / "probes" / f"c{c}" / "requests.json")[
            "input_len"
        ]
        for v in arms
    ]
    assert lens[0] == lens[1] and len(lens[0]) == cap.num_prompts(c)
    pair = read_comparison(capacity_cpu).pairs["serving"][arms[1]]
    for arm, v in (("baseline", arms[0]), ("variant", arms[1])):
        got = [[list(p) for p in r["probes"]] for r in pair[arm]]
        want = [
            [[p["load"], p["score"]] for p in metas[v, k]["probes"] if p["score"] is not None]
            for k in (0, 1)
        ]
        assert got == want
    assert "## Capacity at the SLO (serving)" in (capacity_cpu / "report.md").read_text()
    assert {"capacity.png", "pr_figure.png"} <= {p.name for p in (capacity_cpu / "plots").iterdir()}
