"""Load sweeps of the serving suite: naming, curve metrics by hand, declarations and the family,
and a synthetic run folder whose change helps only at low load."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from patchbench.analysis.build import build_comparison
from patchbench.suite import SuiteResult, get_suite
from patchbench.suites.serving.curve import (
    frontier,
    goodput_req_s,
    max_load_at_slo,
    per_user_tok_s,
    request_tpot_ms,
    slo_ratio,
)
from patchbench.suites.serving.params import Params
from patchbench.suites.serving.points import curve_primaries, declarations, merge_points
from patchbench.suites.serving.sweep import (
    Slo,
    Sweep,
    metric_at,
    point_key,
    point_of,
    point_order,
)
from tests.synthetic import make_run, make_sweep_run


def _recs(rows):
    """requests.json from (status, ttft_ms, e2e_ms, output_len) rows."""
    return {
        "status": [r[0] for r in rows],
        "ttft_ms": [r[1] for r in rows],
        "e2e_ms": [r[2] for r in rows],
        "output_len": [r[3] for r in rows],
        "generated_text": ["x"] * len(rows),
    }


# --- naming -----------------------------------------------------------------------------------


def test_point_names():
    assert point_key("max_concurrency", 16) == "c16"
    assert point_key("max_concurrency", 16.0) == "c16"
    assert point_key("request_rate", 2.5) == "r2.5"
    n = metric_at("output_throughput_tok_s", "c16")
    assert n == "output_throughput_tok_s@c16"
    assert n.split("@")[0] == "output_throughput_tok_s" and point_of(n) == "c16"
    assert point_of("itl_median_ms") is None


def test_sweep_validation_and_prompts():
    sw = Sweep(points=[64, 1, 16, 4], prompts_per_load=4)
    assert sw.keys() == ["c1", "c4", "c16", "c64"]
    assert [sw.num_prompts(p, 200) for p in sw.sorted_points()] == [32, 32, 64, 256]
    assert Sweep(points=[1, 2]).num_prompts(2, 200) == 200
    for bad in ([1, 1], [0, 4], [1.5]):
        with pytest.raises(ValidationError):
            Sweep(points=bad)
    # the order is a permutation, the same for the same seed, different across seeds
    orders = {tuple(point_order(sw, s)) for s in range(20)}
    assert all(sorted(o) == [1, 4, 16, 64] for o in orders) and len(orders) > 1
    assert point_order(sw, 7) == point_order(sw, 7)


# --- curve metrics by hand --------------------------------------------------------------------


def test_tpot_goodput_by_hand():
    # TPOT = (e2e - ttft) / (n - 1): 50, 100, 300 ms; the failed request and n=1 have none
    recs = _recs(
        [
            ("ok", 100.0, 550.0, 10),  # tpot 50: meets both
            ("ok", 2500.0, 3400.0, 10),  # ttft 2500 > 2000: misses
            ("ok", 200.0, 2900.0, 10),  # tpot 300 > 200: misses
            ("failed", None, None, 0),
            ("ok", 150.0, 150.0, 1),  # one token: judged on TTFT alone: meets
        ]
    )
    assert request_tpot_ms(recs) == [50.0, 100.0, 300.0, None, None]
    assert goodput_req_s(recs, 2.0, Slo()) == pytest.approx(1.0)  # 2 good in 2 s
    assert goodput_req_s(recs, 2.0, Slo(ttft_ms=3000, tpot_ms=400)) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        goodput_req_s(recs, 0.0, Slo())
    # per user: 1000 / median(50, 100, 300) = 10 tok/s
    assert per_user_tok_s(recs) == pytest.approx(10.0)


def test_slo_ratio_by_hand():
    # p50 of TTFT (100, 200, 300) = 200 -> 200/400 = 0.5; p50 of TPOT (10, 20, 30) = 20 -> 20/10 = 2
    recs = _recs([("ok", 100.0, 190.0, 10), ("ok", 200.0, 380.0, 10), ("ok", 300.0, 570.0, 10)])
    assert slo_ratio(recs, Slo(ttft_ms=400, tpot_ms=10, percentile=50)) == pytest.approx(2.0)
    assert slo_ratio(recs, Slo(ttft_ms=400, tpot_ms=40, percentile=50)) == pytest.approx(0.5)
    assert slo_ratio(_recs([("failed", None, None, 0)]), Slo()) is None


def test_max_load_interpolation_and_answers():
    # ratio 0.5 at 4, 1.5 at 16: crosses 1 halfway -> 10
    got = max_load_at_slo([1, 4, 16, 64], [0.2, 0.5, 1.5, 3.0])
    assert got.answer == "within the sweep" and got.value == pytest.approx(10.0)
    got = max_load_at_slo([1, 4], [1.2, 0.5])
    assert got.answer == "not reached" and got.value is None
    got = max_load_at_slo([4, 1, 16], [0.5, 0.1, 0.9])
    assert got.answer == "beyond the sweep" and got.value == 16
    # meeting it again above a failing point does not count; a point with no measurement fails
    assert max_load_at_slo([1, 4, 16], [0.5, 2.0, 0.5]).value == pytest.approx(1 + 0.5 / 1.5 * 3)
    assert max_load_at_slo([1, 4], [0.5, None]).value == 1
    with pytest.raises(ValueError):
        max_load_at_slo([1], [])


def test_frontier_by_hand():
    # (per GPU, per user): c1 (10, 100), c4 (35, 90), c16 (30, 50) dominated by c4, c64 (80, 20)
    pts = [(10.0, 100.0), (35.0, 90.0), (30.0, 50.0), (80.0, 20.0)]
    assert frontier(pts) == [3, 1, 0]
    assert frontier([(1.0, 1.0), (1.0, 1.0)]) == [0, 1]  # ties dominate neither


# --- declarations, family ---------------------------------------------------------------------


def test_declarations_and_family():
    serving = get_suite("serving")
    single = Params()
    assert serving.declarations(single) == dict(serving.metrics)
    p = Params.model_validate({"sweep": {"points": [1, 4, 16, 64]}})
    d = serving.declarations(p)
    prim = [n for n, i in d.items() if i.primary]
    assert prim == curve_primaries(p.sweep)
    assert prim[:2] == ["goodput_at_slo_req_s", "max_concurrency_at_slo_count"]
    assert len(prim) == 2 + 2 * 4
    assert d["ttft_median_ms@c16"].primary is False and d["ttft_median_ms@c16"].kind == "run"
    assert d["concurrency@c1"].kind == "descriptive"
    assert d["goodput_req_s@c4"].better == "higher"
    rate = declarations(
        Params.model_validate({"sweep": {"axis": "request_rate", "points": [1]}}), {}
    )
    assert "max_request_rate_at_slo_req_s" in rate


def test_merge_points_marks_undelivered():
    p = Params.model_validate(
        {"sweep": {"points": [1, 8], "slo": {"ttft_ms": 1000, "tpot_ms": 100}}}
    )
    recs = _recs([("ok", 100.0, 1000.0, 10)] * 4)  # tpot 100: meets
    ok = {
        "output_throughput_tok_s": 40.0,
        "itl_median_ms": 100.0,
        "concurrency": 1.0,
        "duration_s": 2.0,
        "completed_count": 4.0,
    }
    r1 = SuiteResult(metrics=dict(ok))
    r8 = SuiteResult(metrics=dict(ok, concurrency=2.0))  # 2 of 8 asked: not delivered
    out = merge_points(p, {1: r1, 8: r8}, {1: recs, 8: recs}, get_suite("serving").metrics)
    assert out.metrics["output_throughput_tok_s@c1"] == 40.0
    assert out.metrics["goodput_req_s@c1"] == pytest.approx(2.0)
    assert "output_throughput_tok_s@c8" not in out.metrics  # never judged
    assert out.metrics["concurrency@c8"] == 2.0  # descriptive kept
    assert any("c8" in w and "not delivered" in w for w in out.warnings)
    assert out.meta["sweep"]["points"]["c8"]["delivered"] is False
    # only c1 delivered and meets the SLO: beyond the sweep, a lower bound
    assert out.metrics["max_concurrency_at_slo_count"] == 1
    assert out.bounds["max_concurrency_at_slo_count"] == "lower"
    assert out.meta["sweep"]["max_load_at_slo"]["answer"] == "beyond the sweep"
    assert out.metrics["goodput_at_slo_req_s"] == pytest.approx(2.0)
    # the release's own --goodput (0.5.23) is a cross-check: recorded, a warning when it differs
    single = get_suite("serving").metrics
    same = merge_points(p, {1: r1, 8: r8}, {1: recs, 8: recs}, single, {1: 2.0, 8: None})
    assert same.meta["sweep"]["points"]["c1"]["tool_goodput_req_s"] == 2.0
    assert not any("--goodput" in w for w in same.warnings)
    off = merge_points(p, {1: r1, 8: r8}, {1: recs, 8: recs}, single, {1: 0.5})
    assert any("c1" in w and "--goodput" in w for w in off.warnings)


# --- a synthetic run: helps only at low load --------------------------------------------------


def test_change_at_low_load_only(tmp_path):
    import numpy as np

    rng = np.random.default_rng(3)
    n = 8
    sweep = {"points": [1, 4, 16, 64]}
    metrics: dict = {}
    for k, base in zip(["c1", "c4", "c16", "c64"], [30.0, 100.0, 300.0, 600.0], strict=True):
        gain = 1.15 if k in ("c1", "c4") else 1.0
        b = base * np.exp(rng.normal(0, 0.02, n))
        metrics[f"output_throughput_tok_s@{k}"] = {
            "baseline": list(b),
            "patched": list(b * gain * np.exp(rng.normal(0, 0.01, n))),
        }
    run = make_run(
        tmp_path, metrics={"serving": metrics}, suites_params={"serving": {"sweep": sweep}}
    )
    cmp = build_comparison(run)
    v = {r.metric: r.verdict for r in cmp.rows}
    assert v["output_throughput_tok_s@c1"] == "improved"
    assert v["output_throughput_tok_s@c4"] == "improved"
    assert v["output_throughput_tok_s@c16"] != "improved"
    assert v["output_throughput_tok_s@c64"] != "improved"
    rows = {r.metric: r for r in cmp.rows}
    assert all(rows[f"output_throughput_tok_s@{k}"].primary for k in ("c1", "c64"))
    # four primaries in the family: the lowest p value is judged at 1 - 0.05/4
    confs = sorted(r.confidence for r in cmp.rows if r.primary)
    assert confs[-1] == pytest.approx(1 - 0.05 / 4)


def sweep_run(root, **kw):
    """A synthetic sweep run folder (tests.synthetic.make_sweep_run)."""
    return make_sweep_run(root, **kw)


def test_sweep_report_and_plots(tmp_path):
    from patchbench.report import render_run

    run = sweep_run(tmp_path, gains={"c1": 1.15, "c4": 1.15})
    text = render_run(run).read_text()
    assert "## Load curve (serving)" in text
    assert "patched: output throughput improved at concurrency 1-4" in text
    # the SLO the curve metrics are judged at (the sweep's default, MLPerf's llama2-70b server)
    assert "- SLO: TTFT <= 2000 ms and TPOT <= 200 ms" in text and "at p99)" in text
    assert "| patched | 16 |" in text  # one table row per point
    assert "- Load sweep: a metric named `<metric>@<point>`" in text  # Methods
    pngs = {p.name for p in (run / "plots").glob("*.png")}
    assert {"pr_figure.png", "curve_latency.png", "curve_change.png", "curve_frontier.png"} <= pngs


def _label_boxes(points):
    """(annotations, their window extents) of :func:`label_points` on a log-x figure."""
    from patchbench.suites import new_figure
    from patchbench.suites.serving.render import label_points

    fig, (ax,) = new_figure(5.2)
    for j in {p[3] for p in points}:
        mine = sorted((x, y) for _k, x, y, jj in points if jj == j)
        ax.plot(*zip(*mine, strict=True), "-o", color=f"C{j}")
    ax.set_xscale("log")
    notes = label_points(ax, points)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return notes, [n.get_window_extent(r) for n in notes]


def test_curve_latency_labels_never_overlap():
    """Three variants whose points sit at one spot (no change), a label's width apart (the
    "c8c8" case) and far apart: one label per load where they crowd, one per point where they
    do not, and no two labels overlap."""
    same = [("c1", 30.0, 29.0, j) for j in range(3)] + [("c8", 40.0, 176.0, j) for j in range(3)]
    notes, boxes = _label_boxes(same)
    assert [n.get_text() for n in notes] == ["c1", "c8"]  # one per load, dark grey
    close = [("c8", 40.0 * (1 - 0.015 * j), 176.0 + 3 * j, j) for j in range(3)]
    close += [("c1", 30.0, 29.0, 0), ("c1", 27.0, 33.0, 1), ("c1", 25.0, 36.0, 2)]
    notes, boxes = _label_boxes(close)
    assert sorted(n.get_text() for n in notes).count("c8") == 1
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), [n.get_text() for n in notes]
    far = [("c4", 30.0, 100.0, 0), ("c4", 45.0, 150.0, 1)]
    notes, boxes = _label_boxes(far)
    assert [n.get_text() for n in notes] == ["c4", "c4"]
    assert [n.get_color() for n in notes] == ["C0", "C1"]
    assert boxes[0].x1 < boxes[1].x0  # the left point's label on its left side


def test_point_labels_and_bounds_shown(tmp_path):
    from patchbench.suites.serving.points import point_label

    assert (
        point_label("Output token throughput (tok/s):", "max_concurrency", 16)
        == "Output token throughput at concurrency 16 (tok/s):"
    )
    assert point_label("Goodput", "request_rate", 2.5) == "Goodput at request rate 2.5"
    name = "max_concurrency_at_slo_count"
    run = make_run(
        tmp_path,
        metrics={"serving": {name: {"baseline": [64.0] * 3, "patched": [64.0] * 3}}},
        bounds={
            (v, k, "serving"): {name: "lower"} for v in ("baseline", "patched") for k in range(3)
        },
        suites_params={"serving": {"sweep": {"points": [1, 64]}}},
    )
    row = build_comparison(run).row("serving", name, "patched")
    assert row.baseline_bound == "lower" and row.variant_bound == "lower"
    assert any("bound" in n for n in row.notes)


def test_sweep_config_dry_run_costs():
    from patchbench.config import load_config
    from patchbench.run.plan import describe_plan

    text = describe_plan(load_config("configs/pr9460-sweep-h200.yaml"))
    assert "c1: 32 prompts" in text and "c64: 256 prompts" in text
    assert "a repeat of the 2 variants" in text
    assert "serving.output_throughput_tok_s@c64" in text  # the sequential rule sees the sweep


def test_sweep_calibration_rows():
    from patchbench.suites.serving import PRIMARY
    from tools.calibration.sweep import primaries, sweep_row, sweep_table

    assert sorted(primaries(1)) == sorted(PRIMARY)
    assert len(primaries(4)) == 10
    row = sweep_row(4, 8, 0.03, 0.10, 10, seed=7)
    assert row.improved >= 8 and row.false_calls <= 2
    assert "| 4 | 10 | fixed 8 | 3% | 10 |" in "\n".join(sweep_table([row], 0.10))


def test_sweep_calibration_replays_the_configs_sequential_schedule():
    """The shipped sweep configs' schedule (4..8 rounds, O'Brien-Fleming, the runner's futility)
    is read as the runner reads it and replayed on the trials: the rows say how many rounds ran."""
    from pathlib import Path

    from tools.calibration.sweep import config_schedule, sweep_row, sweep_table

    shipped = {"min": 4, "max": 8, "step": 2, "boundary": "obrien-fleming", "futility": 0.2}
    for cfg in ("configs/pr9460-sweep-h200.yaml", "configs/presets/sweep-h200.yaml"):
        assert config_schedule(Path(cfg)) == (4, shipped)
    want = dict(shipped, boundary="pocock")
    with pytest.raises(ValueError, match="no serving.sweep"):
        config_schedule(Path("configs/pr9460-h200.yaml"))
    row = sweep_row(4, 0, 0.03, 0.10, 6, seed=7, schedule=want)
    assert row.repeats == 8 and row.improved >= 4 and row.false_calls <= 1
    assert 6 * 4 <= row.rounds_null <= 6 * 8 and 6 * 4 <= row.rounds_effect <= 6 * 8
    line = sweep_table([row], 0.10)[-1]
    assert line.startswith("| 4 | 10 | sequential 4..8 step 2 (pocock) | 3% | 6 |")


def test_gates_name_points_and_curve_metrics():
    from patchbench.config.nightly import Gate
    from patchbench.nightly.gates import metric_unit

    g = Gate(metric="serving.output_throughput_tok_s@c16", threshold_pct=5)
    assert (g.suite, g.metric_name) == ("serving", "output_throughput_tok_s@c16")
    bare = Gate(metric="ttft_p99_ms@r2.5", threshold_pct=5)
    assert (bare.suite, bare.metric_name) == (None, "ttft_p99_ms@r2.5")
    assert Gate(metric="serving.goodput_at_slo_req_s", threshold_pct=5).metric_name == (
        "goodput_at_slo_req_s"
    )
    assert metric_unit("serving", "itl_median_ms@c4") == "ms"


def test_history_keeps_per_point_metrics(tmp_path):
    from patchbench.nightly.history import night_from_run

    run = sweep_run(tmp_path, n=3, points=(1, 4))
    night = night_from_run(run)
    keys = {m for (_v, s, m) in night.values if s == "serving"}
    assert {"output_throughput_tok_s@c1", "itl_median_ms@c4", "goodput_at_slo_req_s"} <= keys


# --- an undelivered point is descriptive: never judged, never stops a sequential run ----------


def test_merge_points_names_what_it_leaves_out():
    p = Params.model_validate({"sweep": {"points": [1, 8], "slo": {"ttft_ms": 1, "tpot_ms": 1}}})
    recs = _recs([("ok", 100.0, 1000.0, 10)] * 4)  # misses the SLO everywhere
    m = {"output_throughput_tok_s": 40.0, "concurrency": 1.0, "duration_s": 2.0}
    out = merge_points(
        p,
        {1: SuiteResult(metrics=dict(m)), 8: SuiteResult(metrics=dict(m, concurrency=2.0))},
        {1: recs, 8: recs},
        get_suite("serving").metrics,
    )
    why = out.meta["not_judged"]
    assert "not delivered" in why["output_throughput_tok_s@c8"]
    assert "itl_median_ms@c8" in why and "goodput_req_s@c8" in why
    assert "concurrency@c8" not in why  # descriptive: kept
    assert not any(k.endswith("@c1") for k in why)
    assert why["max_concurrency_at_slo_count"].startswith("not reached")
    ok = merge_points(
        p,
        {1: SuiteResult(metrics=dict(m))} | {8: SuiteResult(metrics=dict(m, concurrency=8.0))},
        {1: _recs([("ok", 0.1, 1.0, 10)] * 4), 8: _recs([("ok", 0.1, 1.0, 10)] * 4)},
        get_suite("serving").metrics,
    )
    assert "not_judged" not in ok.meta  # every point delivered and the SLO met


def _config_of(run):
    """The run's config as the runner holds it (loaded from YAML, model files not checked)."""
    import yaml

    from patchbench.config import load_config
    from patchbench.records import read_json

    p = run / "config.yaml"
    p.write_text(yaml.safe_dump(read_json(run / "manifest.json")["config"]))
    return load_config(p, check_files=False)


def _seq_run(tmp_path, undelivered, n=4):
    return make_sweep_run(
        tmp_path,
        n=n,
        points=(1, 16),
        gains={"c1": 1.3, "c16": 1.3},
        undelivered=undelivered,
        schedule_repeats={"min": 4, "max": 8, "step": 2},
    )


@pytest.mark.parametrize(
    "undelivered",
    [
        {("patched", 1): ["c16"]},
        {(v, k): ["c16"] for v in ("baseline", "patched") for k in range(4)},
    ],
    ids=["one-cell", "every-cell"],
)
def test_an_undelivered_point_never_stops_or_holds_a_sequential_run(tmp_path, undelivered):
    from patchbench.analysis.build import look_decision
    from patchbench.run.looks import sequential_design, sequential_look

    run = _seq_run(tmp_path, undelivered)
    dec, complete = look_decision(run, 0)
    assert complete == 4 and dec is not None and dec.look_index == 0
    got = {m: d.decision for (v, m), d in dec.metrics.items()}
    for name in ("output_throughput_tok_s@c16", "itl_median_ms@c16"):
        # never decided (no row at all when no cell delivered the point)
        assert got.get(f"serving.{name}", "continue") in ("continue", "inconclusive")
    assert got["serving.output_throughput_tok_s@c1"] == "improved"
    assert dec.stop  # the delivered point decides; the undelivered one does not hold it open
    # the runner's look: no "missing pair" stop for a point left out on purpose
    cfg = _config_of(run)
    design = sequential_design(cfg)
    look, why = sequential_look(cfg, run, design, 0)
    assert why is None and look is not None and look.look_index == 0
    cmp = build_comparison(run)
    row = cmp.row("serving", "output_throughput_tok_s@c16", "patched")
    if len(undelivered) == 1:
        assert row.verdict == "incomplete" and any("not delivered" in x for x in row.notes)
    else:
        assert row is None
    assert cmp.row("serving", "output_throughput_tok_s@c1", "patched").verdict == "improved"


def test_a_failed_cell_still_stops_the_sequential_look(tmp_path):
    from patchbench.records import read_json
    from patchbench.run.looks import sequential_design, sequential_look

    run = _seq_run(tmp_path, {})
    summ = run / "patched" / "rep1" / "serving" / "summary.json"
    data = read_json(summ)
    del data["metrics"]["output_throughput_tok_s@c16"]  # gone with no reason: a failure
    summ.write_text(__import__("json").dumps(data))
    cfg = _config_of(run)
    look, why = sequential_look(cfg, run, sequential_design(cfg), 0)
    assert look is None and "patched/rep1 serving.output_throughput_tok_s@c16" in why


def test_pr_figure_curve_panels_use_the_log_ratio_axis(tmp_path):
    """The PR figure's per-load panels read as its other run panels: a log-ratio axis ticked in
    %, every change inside the ticked range's ends, the margin band and the better direction
    labelled, a title of at most two lines."""
    from patchbench.analysis.comparison import read_comparison
    from patchbench.report import plots, render_run

    run = sweep_run(tmp_path, gains={"c1": 1.4, "c4": 1.15})
    render_run(run)
    fig = plots.plot_pr_figure(read_comparison(run))
    curve = [ax for ax in fig.axes if ax.get_title().endswith("per load")]
    assert len(curve) == 2
    for ax in curve:
        assert ax.get_yscale() == "function"
        assert "log-ratio axis" in ax.get_ylabel() and "better" in ax.get_ylabel()
        assert any(t.get_text().startswith(" margin ±5") for t in ax.texts)
        assert ax.get_title().count("\n") <= 1
        lo, hi = ax.get_ylim()
        changes = [y for line in ax.lines for y in line.get_ydata() if len(line.get_ydata()) == 1]
        assert changes and all(lo < y < hi for y in changes)
    thr = next(ax for ax in curve if "throughput" in ax.get_title().lower())
    assert "better ↑" in thr.get_ylabel()
    # +40 % at c1: the ticks reach past +30 % (round values only)
    assert max(thr.get_yticks()) >= 30


def test_itl_of_bunched_reads_is_withheld_never_judged():
    """A median ITL under a tenth of the median TPOT times the client's reads of bunched chunks
    (a busy client: 0.01 ms gaps beside 20 ms per token), not decode steps: the point's ITL
    metrics are withheld and named in meta.not_judged; a plausible ITL (8 of 10 ms) is kept."""
    from patchbench.suites.serving.validity import coalesced_itl

    assert coalesced_itl({"itl_median_ms": 8.0, "tpot_median_ms": 10.0}) is None
    assert coalesced_itl({"itl_median_ms": 1.0, "tpot_median_ms": 10.0}) is None  # at the floor
    why = coalesced_itl({"itl_median_ms": 0.01, "tpot_median_ms": 19.8})
    assert why and "0.01 ms" in why and "19.8 ms" in why
    assert coalesced_itl({"itl_median_ms": 0.0, "tpot_median_ms": 0.0}) is None  # nothing timed
    assert coalesced_itl({"tpot_median_ms": 10.0}) is None

    p = Params.model_validate({"sweep": {"points": [1, 8]}})
    recs = _recs([("ok", 100.0, 1000.0, 10)] * 4)
    base = {"output_throughput_tok_s": 40.0, "concurrency": 1.0, "duration_s": 2.0}
    r1 = SuiteResult(
        metrics=dict(base, tpot_median_ms=19.8),
        meta={"not_judged": {"itl_median_ms": why, "itl_p99_ms": why}},
    )
    r8 = SuiteResult(metrics=dict(base, concurrency=8.0, itl_median_ms=18.0, tpot_median_ms=20.0))
    out = merge_points(p, {1: r1, 8: r8}, {1: recs, 8: recs}, get_suite("serving").metrics)
    assert out.meta["not_judged"]["itl_median_ms@c1"] == why
    assert "itl_p99_ms@c1" in out.meta["not_judged"]
    assert "itl_median_ms@c1" not in out.metrics and out.metrics["itl_median_ms@c8"] == 18.0
    assert "itl_median_ms@c8" not in out.meta["not_judged"]
