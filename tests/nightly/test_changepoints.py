"""Learned noise, the noise rules of the gates and change points (patchbench/nightly/noise.py,
changepoints.py, gates.py, history.py's derived tables): each method against scipy or a hand
computation, and the calibration's simulations on a few seeded trials."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from patchbench.config.nightly import Gate, NightlySettings
from patchbench.nightly import changepoints as cp
from patchbench.nightly import noise as robust
from patchbench.nightly.gates import evaluate, night_outcome
from patchbench.nightly.history import (
    History,
    Night,
    read_change_points,
    read_noise,
    record_change_points,
    record_noise,
)
from patchbench.nightly.noise import learn
from tools.calibration.nightly import Scenario, change_rates, gate_rates, sim_night, with_report

TPUT = ("serving", "output_throughput_tok_s")


def test_scales_against_hand_computations():
    rng = np.random.default_rng(1)
    groups = [rng.normal(0.0, 0.02, 6) + 0.5 * i for i in range(300)]  # a step every night
    s = robust.sigma_within(groups)
    assert s.sigma == pytest.approx(0.02, rel=0.05) and s.df == pytest.approx(0.37 * 1500)
    # pairwise |x_i - x_j| median over sqrt(2) Phi^-1(0.75), by hand on one group
    g = [0.0, 0.1, 0.3]
    assert robust.sigma_within([g]).sigma == pytest.approx(0.2 / (math.sqrt(2) * 0.6744897502))
    # first differences: a steady decline and one step do not inflate the level sigma
    x = rng.normal(0.0, 0.01, 200) - 0.003 * np.arange(200)
    x[100:] -= 0.2
    assert robust.sigma_steps([x]).sigma == pytest.approx(0.01, rel=0.15)
    d = np.diff([0.0, 1.0, 3.0, 2.0])
    assert robust.sigma_steps([[0.0, 1.0, 3.0, 2.0]]).sigma == pytest.approx(
        stats.median_abs_deviation(d, scale="normal") / math.sqrt(2)
    )


def test_outlier_rule_chi_square_and_power():
    m = robust.outliers([0.0, 0.01, -0.01, 0.5, 0.0], 0.01, k=3)
    assert m.tolist() == [False, False, False, True, False]
    # one at most (by default), never more than (n - 1) // 2, and nothing without a sigma
    assert robust.outliers([0.0, 1.0, 2.0, 3.0, 9.0], 0.01).tolist() == [0, 0, 0, 0, 1]
    assert robust.outliers([0.0, 1.0, 2.0, 3.0, 9.0], 0.01, most=5).sum() == 2
    assert not robust.outliers([0.0, 1.0, 5.0], math.nan).any()
    x = [0.01, -0.02, 0.03, 0.0]
    ratio, p = robust.noise_excess(x, 0.01)
    s2 = np.var(x, ddof=1)
    assert ratio == pytest.approx(math.sqrt(s2) / 0.01)
    assert p == pytest.approx(stats.chi2.sf(3 * s2 / 1e-4, 3))
    assert robust.noise_bound(40, 0.1) == pytest.approx(math.sqrt(40 / stats.chi2.ppf(0.9, 40)))
    se, step, thr, lvl = 0.01, 0.05, 0.03, 0.005
    one = stats.norm.sf((max(thr, stats.norm.ppf(1 - lvl) * se) - step) / se)
    assert robust.detect_power(se, step, thr, lvl, 3) == pytest.approx(1 - (1 - one) ** 3)
    n = robust.repeats_needed(lambda k: 0.03 / math.sqrt(k), step, thr, lvl)
    assert robust.detect_power(0.03 / math.sqrt(n - 1), step, thr, lvl, 3) >= 0.9
    assert robust.detect_power(0.03 / math.sqrt(n - 2), step, thr, lvl, 3) < 0.9


def _history(n: int, cv: float, repeats: int, seed: int = 3, **sc) -> list[Night]:
    rng = np.random.default_rng(seed)
    return [sim_night(i, rng, [TPUT], repeats, cv, 0.0, Scenario(**sc)) for i in range(n)]


def test_noise_is_learned_from_history_and_the_prior_comes_first():
    hist = _history(30, 0.03, 6)
    n = learn(hist[:5], *TPUT, prior_cv_pct=1.5)
    assert n.source == "prior" and n.to_json()["run_cv_pct"] == pytest.approx(1.5)
    assert learn(hist[:5], *TPUT) is None
    n = learn(hist, *TPUT, prior_cv_pct=1.5)
    assert n.source == "learned" and n.nights == 30
    assert n.run.sigma == pytest.approx(0.03, rel=0.15)
    assert n.pair_sigma == pytest.approx(n.run.sigma * math.sqrt(2), rel=1e-12)
    assert n.night_sigma < 0.01  # no night-to-night drift simulated
    # a 10 % step halfway leaves the run noise as it was
    for h in hist[15:]:
        for k, v in h.values.items():
            h.values[k] = [x * 0.9 for x in v]
    assert learn(hist, *TPUT).run.sigma == pytest.approx(n.run.sigma, rel=1e-9)


def _settings(**kw) -> NightlySettings:
    gates = [
        Gate(metric="serving.output_throughput_tok_s", threshold_pct=3, against="same_run"),
        Gate(
            metric="serving.output_throughput_tok_s",
            threshold_pct=3,
            against="history",
            variants=["baseline"],
        ),
    ]
    return NightlySettings(gates=gates, **kw)


def test_quiet_noisy_abnormal_and_short_nights():
    s = _settings()
    hist = _history(20, 0.015, 5)
    rng = np.random.default_rng(9)
    quiet = with_report(sim_night(20, rng, [TPUT], 5, 0.015, 0.0, Scenario()))
    res = evaluate(hist, quiet, s)
    assert night_outcome(res) == "green", [(r.status, r.reason) for r in res]
    assert {r.noise_source for r in res} == {"learned"}
    assert all(r.status in ("pass", "quiet") and r.repeats_needed for r in res)
    # one run 30 % slower: never red; the history gate sets it aside, the same-run gate (the
    # report's paired t, no outlier rule) sees a pair far noisier than learned: underpowered
    odd = sim_night(20, rng, [TPUT], 5, 0.015, 0.0, Scenario())
    odd.values[("baseline", *TPUT)][2] *= 0.7
    odd = with_report(odd)
    res = evaluate(hist, odd, s)
    assert night_outcome(res) == "underpowered"
    by = {r.kind: r for r in res}
    assert by["history"].set_aside == 1 and by["history"].status in ("pass", "quiet")
    assert by["same_run"].status == "underpowered" and "clearly above" in by["same_run"].reason
    # every run scattered 4x the learned noise: underpowered (exit 5), not green
    loud = with_report(sim_night(20, rng, [TPUT], 5, 0.06, 0.0, Scenario()))
    res = evaluate(hist, loud, s)
    assert night_outcome(res) in ("underpowered", "red")
    assert any(r.status == "underpowered" and "clearly above" in r.reason for r in res)
    # a 6 % noise history needs more repeats than 5: underpowered, and says how many
    # (over 8 nights: never quiet, since the noise needs more than 5)
    hist6 = _history(20, 0.06, 5)
    res = [
        r
        for _ in range(8)
        for r in evaluate(
            hist6, with_report(sim_night(20, rng, [TPUT], 5, 0.06, 0.0, Scenario())), s
        )
    ]
    short = [r for r in res if r.status == "underpowered"]
    assert short and all(r.repeats_needed is None or r.repeats_needed > 5 for r in short)
    assert not any(r.status == "quiet" for r in res)
    # a 5 % patch step turns red through the same-run gate only
    t = with_report(sim_night(20, rng, [TPUT], 5, 0.015, 0.0, Scenario(patch=0.05)))
    res = evaluate(hist, t, s)
    assert {(r.kind, r.status) for r in res if r.status == "fail"} == {("same_run", "fail")}
    # "bound": the strict rule (inconclusive nights are underpowered)
    assert _settings(underpowered_on="bound").underpowered_on == "bound"


def test_breakpoints_step_and_decline():
    rng = np.random.default_rng(5)
    x = rng.normal(0.0, 0.01, 60)
    assert cp.breakpoints(x, cp.series_sigma(x)) == []
    y = x.copy()
    y[40:] += math.log(0.95)
    [c] = cp.changes(y, cp.series_sigma(y))
    assert c.start == c.end == 40 and c.size_pct == pytest.approx(-5.0, abs=1.0)
    z = x.copy()
    z[30:] -= 0.003 * np.arange(1, 31) * 3
    [c] = cp.changes(z, cp.series_sigma(z))
    assert c.after < c.before and 28 <= c.start <= 45
    assert cp.breakpoints(x[:5], 0.01) == []


def test_detect_history_and_derived_tables(tmp_path):
    hist = _history(40, 0.015, 5)
    for h in hist[25:]:
        for k, v in h.values.items():
            h.values[k] = [x * 0.92 for x in v]
    pts = cp.detect_history(hist, [("baseline", *TPUT)], {TPUT: "higher"})
    [p] = pts
    assert p.run_id == hist[25].run_id and p.worse and p.size_pct == pytest.approx(-8, abs=1)
    assert p.detected_run_id == hist[-1].run_id and p.nights == 1
    with History(tmp_path / "h.sqlite") as h:
        assert read_change_points(h, "sim") == [] and read_noise(h, "sim") == []
        for n in hist:
            h.record(n)
        record_change_points(h, "sim", hist[-1].run_id, [p.to_json()])
        record_change_points(h, "sim", hist[-1].run_id, [p.to_json()])  # replaces
        row = learn(hist, *TPUT).to_json() | {"repeats_needed": 4}
        record_noise(h, "sim", hist[-1].run_id, [row])
    with History(tmp_path / "h.sqlite") as h:
        [r] = read_change_points(h, "sim")
        assert r["run_id"] == p.run_id and r["worse"] == 1 and r["size_pct"] == p.size_pct
        [n] = read_noise(h, "sim", hist[-1].run_id)
        assert n["repeats_needed"] == 4 and n["source"] == "learned"
        # an older night found the change; the latest night looked (its noise) and found none
        record_change_points(h, "sim", hist[-2].run_id, [p.to_json()])
        record_change_points(h, "sim", hist[-1].run_id, [])
        assert read_change_points(h, "sim") == []
        assert len(read_change_points(h, "sim", hist[-2].run_id)) == 1


def test_calibration_smoke():
    s = _settings()
    r = gate_rates(s, 5, 0.015, 3, 1, abnormal=0.2, warm=10, quiet=2)
    assert r.nights == 6 and 0 <= r.green <= 1 and r.patch_within >= 2 / 3
    c = change_rates(0.015, 5, 3, 1, start=20, horizon=20, quarter=40)
    assert c.detected == 1.0 and c.delay_median <= 14


def test_a_smaller_penalty_flags_at_least_as_often_on_the_same_quarters(capsys):
    """The penalty factor trades false flags for delay: on the same seeded quarters a smaller
    factor (3) flags more and catches the decline no later than the shipped one (8): the
    penalized optimum's number of segments does not grow with the penalty.
    tools/calibrate_nightly.py --penalties prints that table, one row per factor and noise."""
    import importlib.util

    lo = change_rates(0.03, 8, 6, 3, beta=3, start=20, horizon=10, quarter=40)
    hi = change_rates(0.03, 8, 6, 3, beta=8, start=20, horizon=10, quarter=40)
    assert lo.flags_per_quarter >= hi.flags_per_quarter
    assert lo.delay_median <= hi.delay_median
    path = Path(__file__).resolve().parents[2] / "tools" / "calibrate_nightly.py"
    spec = importlib.util.spec_from_file_location("calibrate_nightly", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--penalties", "8", "--trials", "1"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 8 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1.5 %", "3 %"]


def test_outlier_rule_by_hand():
    # sigma 0.1, k 4: night 3 is 1.0 above the medians on both sides (0 and 0): an outlier;
    # night 7 is the first night of a step (the median after it is its own level): kept
    x = [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    assert cp.outlier_nights(x, 0.1).tolist() == [i == 3 for i in range(11)]
    # the first night compares with the nights after it only; the newest night never
    assert cp.outlier_nights([1.0, 0.0, 0.0, 0.0, 0.0, 5.0], 0.1).tolist() == [1, 0, 0, 0, 0, 0]
    # within k sigmas: kept; no usable sigma: nothing
    assert not cp.outlier_nights(x, 0.3).any() and not cp.outlier_nights(x, math.nan).any()


def test_the_second_pass_takes_sigma_from_the_scatter_about_the_segments():
    """Twelve quiet nights whose first differences say sigma is 0.29 % (true: 1 %): PELT on
    that sigma (ruptures itself, penalty 5 log 12) cuts the noise in three; the scatter about
    those segments' medians, at its upper 90 % chi-square bound (scipy), is the sigma of the
    second pass, which finds no change."""
    import ruptures as rpt

    x = np.random.default_rng(66).normal(0.0, 0.01, 12)
    s = cp.series_sigma(x)
    assert s == pytest.approx(0.00286, abs=1e-5) and not cp.outlier_nights(x, s).any()
    z = ((x - np.median(x)) / s).reshape(-1, 1)
    edges = [0, *rpt.KernelCPD(kernel="linear", min_size=2).fit(z).predict(pen=5 * math.log(12))]
    assert edges == [0, 3, 6, 12]
    r = np.concatenate(
        [x[a:b] - np.median(x[a:b]) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    )
    bound = math.sqrt(np.sum(r**2) / 9) * math.sqrt(9 / stats.chi2.ppf(0.1, 9))
    seg = cp.analyse(x, s)
    assert seg.sigma == pytest.approx(bound) and seg.changes == [] and seg.edges == [0, 12]
    # by hand on a given segmentation: night 2 set aside, 6 nights in two segments: 4 df
    y = [0.0, 0.02, 0.9, -0.02, 1.0, 1.04, 0.96]
    by_hand = math.sqrt((0.02**2 * 2 + 0.04**2 * 2) / 4) * math.sqrt(4 / stats.chi2.ppf(0.1, 4))
    assert cp.residual_sigma(y, cp.Segmentation([2], [0, 4, 7], [])) == pytest.approx(by_hand)
    assert math.isnan(cp.residual_sigma([0.0, 1.0], cp.Segmentation([], [0, 1, 2], [])))


def _steps(n: int, at: int, factor: float, noise: float = 0.015, seed: int = 2) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0.0, noise, n)
    x[at:] += math.log(factor)
    return x


def test_a_spike_is_an_outlier_and_the_step_beside_it_is_sized_by_medians():
    """A one-night x6 spike two nights before a +35 % step: plain PELT reported one change of
    +141 % over 6 nights; the spike is an outlier and the step is one change on its night, +35 %."""
    x = _steps(43, 30, 1.35)
    x[28] += math.log(6.0)
    seg = cp.analyse(x, cp.series_sigma(x))
    assert seg.outliers == [28]
    [c] = seg.changes
    assert c.start == c.end == 30 and c.confirmed
    # the sizes are the medians of the segments, spike left out (by hand)
    assert c.before == pytest.approx(float(np.median(np.delete(x[:30], 28))))
    assert c.after == pytest.approx(float(np.median(x[30:])))
    assert c.size_pct == pytest.approx(35, abs=3)


def test_a_step_on_the_newest_night_is_new_and_unconfirmed_until_the_next_night():
    """A x10 release step on the newest night (plain PELT placed it on earlier, normal nights) is
    on its night, unconfirmed, and confirmed by the night after."""
    x = _steps(44, 43, 10.0)
    [c] = cp.changes(x[:43], cp.series_sigma(x[:43])) or [None]  # the night before: nothing
    assert c is None
    [c] = cp.changes(x, cp.series_sigma(x))
    assert (c.start, c.confirmed) == (43, False)
    assert c.size_pct == pytest.approx(100 * (math.exp(x[43] - np.median(x[:43])) - 1))
    y = np.append(x, x[43] + 0.01)
    [c] = cp.changes(y, cp.series_sigma(y))
    assert (c.start, c.confirmed) == (43, True) and c.size_pct == pytest.approx(900, rel=0.1)
    # a spike on the newest night: new tonight; the next, normal night sets it aside
    z = _steps(44, 50, 1.0)
    z[43] += math.log(6.0)
    [c] = cp.changes(z, cp.series_sigma(z))
    assert (c.start, c.confirmed) == (43, False)
    z = np.append(z, 0.0)
    assert cp.changes(z, cp.series_sigma(z)) == []
    assert cp.analyse(z, cp.series_sigma(z)).outliers == [43]


def test_a_confirmation_run_confirms_tonights_change():
    pts = [
        {"variant": "baseline", "suite": "s", "metric": "m", "run_id": "r2", "confirmed": False},
        {"variant": "baseline", "suite": "s", "metric": "m", "run_id": "r1", "confirmed": False},
        {"variant": "patched", "suite": "s", "metric": "m", "run_id": "r2", "confirmed": False},
    ]
    rows = [
        {"variant": "baseline", "suite": "s", "metric": "m", "verdict": "confirmed"},
        {"variant": "patched", "suite": "s", "metric": "m", "verdict": "not confirmed"},
    ]
    assert cp.confirm_by_run(pts, rows, "r2") == 1
    assert [p["confirmed"] for p in pts] == [True, False, False]


def test_changepoint_calibration_meets_its_targets():
    """tools/changepoint_calibration.py on fewer seeded histories (docs/nightly.md has the full
    table): steps of 10 % and more found (on their night, within a third of their size) in at
    least 90 % at 1.5 % night-level noise, of 20 % and more at 3 %; at most 0.1 false change
    points per quiet quarter with spikes, in tonight's view and over every night's run (the
    detector works in sigmas, so one noise level); and plain PELT fails the spikes."""
    from tools.changepoint_calibration import calibrate

    rows = {noise: calibrate(noise, 40, seed=11, nightly=noise == 0.015) for noise in (0.015, 0.03)}
    for noise, big in ((0.015, 10), (0.03, 20)):
        r = rows[noise]
        assert all(r.found[s] >= 0.9 for s in r.found if s >= big), r
        assert r.false_quiet <= 0.1 and r.drift >= 0.8, r
    assert rows[0.015].false_nightly <= 0.1 and rows[0.015].alerts <= 0.1, rows[0.015]
    old = calibrate(0.015, 40, seed=11, detector="legacy")
    assert old.false_quiet > 1.0 and old.found_last == 0.0
