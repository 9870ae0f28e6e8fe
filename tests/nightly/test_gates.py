"""Nightly gates (patchbench/nightly/gates.py): the same-run gate as the report's verdict mapped onto
threshold and consecutive nights, the history tests against scipy or by hand, Holm across the
night's history tests, and each outcome (fail, warn, pass, quiet, inconclusive, underpowered,
ungated, skipped, missing) on hand-made nights."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from patchbench.config.nightly import Gate, NightlySettings
from patchbench.nightly.gates import evaluate, night_outcome
from patchbench.nightly.history import Night
from tools.calibration.nightly import with_report

TPUT = "output_throughput_tok_s"
ITL = "itl_median_ms"
KB = ("baseline", "serving", TPUT)
KV = ("patched", "serving", TPUT)


def night(i: int, values: dict, run_id: str | None = None) -> Night:
    """Night ``i`` with its report's verdicts (tools.calibration.nightly.with_report)."""
    return with_report(
        Night(
            run_id=run_id or f"n{i:02d}",
            night_utc=f"2026-01-{i:02d}T03:00:00Z",
            config_name="c",
            baseline="baseline",
            values=dict(values),
            units={("serving", TPUT): "tok/s", ("serving", ITL): "ms"},
            better={("serving", TPUT): "higher", ("serving", ITL): "lower"},
        )
    )


def settings(**gate_kw) -> NightlySettings:
    """One gate; no noise is learned (learn_min_nights 365, no run_cv_pct) and no learning hold
    (hold_while_learning false) unless asked."""
    kw = {
        k: gate_kw.pop(k)
        for k in list(gate_kw)
        if k
        in (
            "alpha",
            "min_repeats",
            "history_test",
            "pass_alpha",
            "learn_min_nights",
            "run_cv_pct",
            "underpowered_on",
            "hold_while_learning",
        )
    }
    kw.setdefault("learn_min_nights", 365)
    kw.setdefault("hold_while_learning", False)  # these tests judge the rule itself
    gate = dict(metric=f"serving.{TPUT}", threshold_pct=5, against="same_run") | gate_kw
    return NightlySettings(window_nights=5, min_history_nights=3, gates=[Gate(**gate)], **kw)


def only(results, **match):
    out = [r for r in results if all(getattr(r, k) == v for k, v in match.items())]
    assert len(out) == 1, out
    return out[0]


# ---------------------------------------------------------------------------------------------
# same-run gate: the report's verdict


def _logs(b: list[float], v: list[float]) -> np.ndarray:
    return np.log(np.asarray(v)) - np.log(np.asarray(b))


def test_clear_regression_fails_with_the_reports_numbers():
    b, v = [100.0, 101.0, 99.0], [90.0, 91.0, 89.0]
    t = night(28, {KB: b, KV: v}, "tonight")
    [r] = evaluate([], t, settings())
    assert (r.kind, r.variant, r.status) == ("same_run", "patched", "fail")
    d = _logs(b, v)
    assert r.change_pct == pytest.approx(100 * math.expm1(d.mean()))
    assert r.p_value == pytest.approx(stats.ttest_1samp(d, 0.0).pvalue, rel=1e-9)  # two-sided
    lo = d.mean() - stats.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert r.bound_pct == pytest.approx(100 * math.expm1(lo))  # the 95 % interval's worse end
    assert r.value == 90.0 and r.reference == 100.0 and r.n == 3
    assert r.level == pytest.approx(0.05)  # one primary: the report's whole alpha
    assert "the report says regressed" in r.reason and "worse than the 5 % threshold" in r.reason


def test_one_repeat_never_gates_even_on_a_large_change():
    t = night(28, {KB: [100.0], KV: [50.0]}, "tonight")
    [r] = evaluate([], t, settings())
    assert r.status == "ungated" and "1 paired repeat(s), 3 needed" in r.reason
    assert night_outcome([r]) == "underpowered"


def test_quiet_night_passes_and_noisy_night_is_inconclusive():
    t = night(
        28,
        {KB: [100.0, 101.0, 99.0, 100.0, 100.0], KV: [100.5, 101.0, 99.2, 100.1, 99.9]},
        "tonight",
    )
    [r] = evaluate([], t, settings())
    assert r.status == "pass" and r.bound_pct > -5.0
    t = night(28, {KB: [100.0, 100.0, 100.0], KV: [110.0, 90.0, 100.0]}, "tonight")
    [r] = evaluate([], t, settings())
    assert r.status == "inconclusive" and r.bound_pct < -5.0
    assert night_outcome([r]) == "underpowered"


def test_significant_but_within_threshold_is_not_red():
    t = night(28, {KB: [100.0, 101.0, 99.0, 100.0], KV: [98.0, 99.0, 97.0, 98.0]}, "tonight")
    assert t.comparisons[KV].verdict == "regressed"  # the report: -2 %, significant
    [r] = evaluate([], t, settings())  # tight: shown not worse than -5 %
    assert r.status == "pass" and r.change_pct == pytest.approx(-2.0, abs=0.01)


def test_lower_is_better_and_explicit_direction():
    kb, kv = ("baseline", "serving", ITL), ("patched", "serving", ITL)
    t = night(28, {kb: [50.0, 51.0, 49.0], kv: [56.0, 57.0, 55.0]}, "tonight")
    [r] = evaluate([], t, settings(metric=ITL))
    assert r.better == "lower" and r.status == "fail"
    [r] = evaluate([], t, settings(metric=ITL, direction="higher"))  # slower is "better" now
    assert r.status == "pass"


def test_the_reports_family_sets_the_level():
    """One family: the report's (Holm over the variant's primaries), not one of the nightly's.
    ITL alone is significant at 0.05; beside a throughput far from significant its Holm level is
    0.025, where the report calls it inconclusive, and so does the gate."""
    kb, kv = ("baseline", "serving", ITL), ("patched", "serving", ITL)
    d = np.array([0.08, 0.10, 0.03, 0.15])  # +9 % ITL, some spread
    p = stats.ttest_1samp(d, 0.0).pvalue
    assert 0.025 < p < 0.05
    b = [50.0, 50.0, 50.0, 50.0]
    itl = {kb: b, kv: list(50.0 * np.exp(d))}
    gates = settings(metric=ITL)
    [r] = evaluate([], night(28, itl, "t"), gates)
    assert r.status == "fail" and r.level == pytest.approx(0.05)
    both = {**itl, KB: [100.0, 100.0, 100.0, 100.0], KV: [120.0, 80.0, 101.0, 99.0]}
    [r] = evaluate([], night(28, both, "t"), gates)
    assert r.status == "inconclusive" and r.level == pytest.approx(0.025)
    assert r.p_value == pytest.approx(p, rel=1e-9)


def test_never_red_while_the_report_says_inconclusive():
    """Ratios -1 %, -1 %, -22 % (mean -8 %): a one-sided test on a known 1.5 % run noise would
    call it a regression; the report (paired t on its own spread) says inconclusive, so the
    night is not red: with the noise known it is underpowered (tonight far noisier than it)."""
    t = night(28, {KB: [100.0, 100.0, 100.0], KV: [99.0, 99.0, 78.0]}, "tonight")
    assert t.comparisons[KV].verdict == "inconclusive"
    for kw in ({}, {"run_cv_pct": 1.5}, {"run_cv_pct": 1.5, "alpha": 0.5, "threshold_pct": 1}):
        res = evaluate([], t, settings(**kw))
        assert night_outcome(res) != "red" and [r.status for r in res] != ["fail"]
    [r] = evaluate([], t, settings(run_cv_pct=1.5))
    assert r.status == "underpowered" and "clearly above the prior noise" in r.reason


def test_quiet_when_the_noise_is_known_and_the_repeats_suffice():
    """The report is inconclusive (its 95 % interval reaches -10 %, and it is not within the 5 %
    margin); at a known 3 % run noise tonight's spread is ordinary and 3 pairs meet the targets
    of a 10 % threshold: quiet (green). Known to be 1 %, the same night is far noisier than
    that: underpowered."""
    t = night(28, {KB: [100.0, 100.0, 100.0], KV: [95.5, 104.0, 99.0]}, "tonight")
    assert t.comparisons[KV].verdict == "inconclusive"
    [r] = evaluate([], t, settings(run_cv_pct=3.0, threshold_pct=10))
    assert r.status == "quiet" and r.bound_pct < -10 and r.repeats_needed <= 3, r.reason
    assert night_outcome([r]) == "green"
    [r] = evaluate([], t, settings(run_cv_pct=1.0, threshold_pct=10))
    assert r.status == "underpowered" and "clearly above" in r.reason


def test_consecutive_nights_warn_then_fail():
    bad = lambda i: night(i, {KB: [100.0, 101.0, 99.0], KV: [90.0, 91.0, 89.0]})  # noqa: E731
    good = lambda i: night(i, {KB: [100.0, 101.0, 99.0], KV: [100.0, 101.0, 99.5]})  # noqa: E731
    s = settings(consecutive_nights=2)
    t = night(28, bad(28).values, "tonight")
    [r] = evaluate([good(1)], t, s)
    assert r.status == "warn" and r.nights_held == 1 and "held on 1 of the 2" in r.reason
    assert night_outcome([r]) == "green"
    [r] = evaluate([good(1), bad(2)], t, s)
    assert r.status == "fail" and r.nights_held == 2 and "on 2 nights in a row" in r.reason


def test_aa_variants_are_not_gated_against_the_baseline():
    t = night(28, {KB: [100.0, 101.0, 99.0], KV: [90.0, 91.0, 89.0]}, "tonight")
    t.aa_variants = ["patched"]
    assert evaluate([], t, settings()) == []


# ---------------------------------------------------------------------------------------------
# history gate

HIST = [
    [100.0, 101.0, 99.0],
    [102.0, 101.0, 100.0],
    [98.0, 99.0, 100.0],
    [101.0, 100.0, 102.0],
    [99.0, 98.0, 100.0],
]


def hist_settings(**kw) -> NightlySettings:
    return settings(against="history", **kw)


def test_history_step_fails_and_steady_passes():
    prior = [night(i + 1, {KB: v}) for i, v in enumerate(HIST)]
    [r] = evaluate(prior, night(28, {KB: [90.0, 91.0, 89.0]}, "tonight"), hist_settings())
    assert (r.kind, r.variant, r.status, r.n_history) == ("history", "baseline", "fail", 5)
    # the prediction t by hand: tonight's mean log value against the 5 nightly means
    m = [np.mean(np.log(n)) for n in HIST]
    tt = (np.mean(np.log([90.0, 91.0, 89.0])) - np.mean(m)) / (np.std(m, ddof=1) * math.sqrt(1.2))
    assert r.p_value == pytest.approx(stats.t.cdf(tt, 4), rel=1e-9)
    assert r.reference == 100.0 and r.window_run_ids == [f"n{i:02d}" for i in range(1, 6)]
    [r] = evaluate(prior, night(28, {KB: [100.0, 100.5, 99.5]}, "tonight"), hist_settings())
    assert r.status == "pass"


def test_history_window_is_the_last_k_nights_and_later_nights_are_ignored():
    prior = [night(i + 1, {KB: [200.0, 201.0, 199.0]}) for i in range(2)]
    prior += [night(i + 3, {KB: v}) for i, v in enumerate(HIST)]
    prior.append(night(29, {KB: [10.0, 10.0, 10.0]}))  # after tonight
    [r] = evaluate(prior, night(28, {KB: [100.0, 100.5, 99.5]}, "tonight"), hist_settings())
    assert r.window_run_ids == [f"n{i:02d}" for i in range(3, 8)] and r.status == "pass"


def test_history_warming_up_is_skipped_and_welch_is_selectable():
    prior = [night(i + 1, {KB: v}) for i, v in enumerate(HIST[:2])]
    [r] = evaluate(prior, night(28, {KB: [50.0, 50.0, 50.0]}, "tonight"), hist_settings())
    assert r.status == "skipped" and "warming up: 2 night(s)" in r.reason
    assert night_outcome([r]) == "green"
    prior = [night(i + 1, {KB: v}) for i, v in enumerate(HIST)]
    [r] = evaluate(
        prior, night(28, {KB: [90.0, 91.0, 89.0]}, "tonight"), hist_settings(history_test="welch")
    )
    assert r.status == "fail" and r.test.startswith("Welch")
    ref = stats.ttest_ind(
        np.log([90.0, 91.0, 89.0]), np.log(sum(HIST, [])), equal_var=False, alternative="less"
    )
    assert r.p_value == pytest.approx(ref.pvalue, rel=1e-9)


def test_history_consecutive_judges_the_streak_against_the_nights_before_it():
    s = hist_settings(consecutive_nights=2)
    prior = [night(i + 1, {KB: v}) for i, v in enumerate(HIST)]
    [r] = evaluate(prior, night(28, {KB: [90.0, 91.0, 89.0]}, "tonight"), s)
    assert r.status == "warn"
    prior.append(night(6, {KB: [90.0, 90.5, 89.5]}))
    [r] = evaluate(prior, night(28, {KB: [90.0, 91.0, 89.0]}, "tonight"), s)
    assert r.status == "fail" and r.n_history == 5 and "n06" not in r.window_run_ids


def test_a_bad_night_leaves_the_reference_so_the_next_clean_night_is_green():
    prior = [night(i + 1, {KB: v}) for i, v in enumerate(HIST)]
    prior.append(night(6, {KB: [80.0, 81.0, 79.0]}))  # a red night
    [r] = evaluate(prior, night(28, {KB: [100.0, 100.5, 99.5]}, "tonight"), hist_settings())
    assert r.status == "pass" and "n06" not in r.window_run_ids
    # a step that persists stays red until history_since accepts the new level
    prior += [night(7, {KB: [80.0, 80.5, 79.5]})]
    [r] = evaluate(prior, night(28, {KB: [80.0, 80.5, 79.5]}, "tonight"), hist_settings())
    assert r.status == "fail"
    prior += [night(8, {KB: [80.5, 79.0, 80.0]})]
    s = hist_settings().model_copy(update={"history_since": "2026-01-06T00:00:00Z"})
    [r] = evaluate(prior, night(28, {KB: [80.0, 80.5, 79.5]}, "tonight"), s)
    assert r.status == "pass" and r.window_run_ids == ["n06", "n07", "n08"]
    with pytest.raises(ValueError, match="ISO-8601"):
        NightlySettings(history_since="last week")


def test_a_much_better_night_leaves_the_reference_too():
    # the rule is symmetric (an unbiased reference under drift): a night far above the others is
    # left out like a night far below them, so tonight's ordinary level is not judged against it
    prior = [night(i + 1, {KB: v}) for i, v in enumerate(HIST)]
    prior.append(night(6, {KB: [120.0, 121.0, 119.0]}))
    [r] = evaluate(prior, night(28, {KB: [100.0, 100.5, 99.5]}, "tonight"), hist_settings())
    assert r.status == "pass" and "n06" not in r.window_run_ids


def test_night_noise_df_counts_nights_not_variants():
    from patchbench.nightly.noise import MAD_EFFICIENCY, sigma_steps

    rng = np.random.default_rng(3)
    drift = rng.normal(0.0, 0.02, 11)
    series = [drift + rng.normal(0.0, 0.001, 11) for _ in range(2)]
    pooled, shared = sigma_steps(series), sigma_steps(series, shared=True)
    assert shared.sigma == pooled.sigma and shared.n == pooled.n == 20
    assert pooled.df == pytest.approx(MAD_EFFICIENCY * 19)
    assert shared.df == pytest.approx(MAD_EFFICIENCY * 9)  # one series' 10 differences


def test_pooled_night_df_grows_with_variants_only_as_far_as_their_run_noise_is_independent():
    from patchbench.nightly.noise import _pooled_df

    two = [[0.0, 0.1, 0.2], [0.0, 0.1, 0.2]]
    assert _pooled_df(4.0, two, 0.0, 0.01) == pytest.approx(8.0)  # no drift: 2 series' df
    assert _pooled_df(4.0, two, 0.01, 0.01) == pytest.approx(4.0)  # all drift: one series'
    # night^2 / level^2 = 0.5: df = 4 * 2 / (1 + 0.25)
    assert _pooled_df(4.0, two, math.sqrt(0.5), 1.0) == pytest.approx(6.4)
    assert _pooled_df(4.0, two[:1], 0.0, 0.01) == 4.0  # one series


def test_history_test_df_is_satterthwaites_on_what_was_estimated():
    """The history test's variance is (1 + 1/K) level^2 + c run^2 (night^2 = level^2 - run^2 /
    repeats): Satterthwaite's df on level^2's and run^2's own df, not the night part's alone."""
    from patchbench.nightly.gates import _known_variance
    from patchbench.nightly.noise import Noise, Scale

    run, level, k, n, rep = 0.03, 0.0132, 7, 12, 12.0
    night = math.sqrt(level**2 - run**2 / rep)
    noise = Noise("s", "m", Scale(run, 150.0, 0), Scale(level, 4.0, 0), night, rep, 13, "learned")
    var, df = _known_variance(noise, n, [n] * k)
    f = 1 + 1 / k
    assert var == pytest.approx(f * night**2 + run**2 / n * f)
    # every night ran `repeats` runs: the run part cancels, the df is level^2's
    assert df == pytest.approx(4.0)
    var2, df2 = _known_variance(noise, 6, [n] * k)  # tonight fewer runs: some run df enters
    rest = run**2 * (1 / 6 + 1 / (k * n) - f / rep)
    lv = f * level**2
    assert var2 == pytest.approx(lv + rest)
    assert df2 == pytest.approx((lv + rest) ** 2 / (lv**2 / 4.0 + rest**2 / 150.0))
    # no night-to-night part learned: the run noise alone, on its df
    quiet = Noise("s", "m", Scale(run, 150.0, 0), Scale(0.008, 4.0, 0), 0.0, rep, 13, "learned")
    assert _known_variance(quiet, n, [n] * k) == (pytest.approx(run**2 / n * f), 150.0)


# ---------------------------------------------------------------------------------------------
# configuration problems


def test_missing_metric_and_unknown_direction():
    t = night(28, {KB: [100.0, 101.0, 99.0], KV: [90.0, 91.0, 89.0]}, "tonight")
    res = evaluate([], t, settings(metric="serving.nonexistent_ms", against="both"))
    assert [(r.kind, r.status) for r in res] == [("same_run", "missing"), ("history", "missing")]
    assert TPUT in res[0].reason
    t.values[("baseline", "serving", "weird")] = [1.0]
    [r] = evaluate([], t, settings(metric="weird"))
    assert r.status == "missing" and "direction" in r.reason


def test_settings_validation_and_budget():
    s = NightlySettings()
    assert (s.window_nights, s.min_history_nights, s.min_repeats) == (7, 3, 3)
    assert s.family_alpha == pytest.approx(1 / 30)
    assert NightlySettings(false_red_nights_per_month=3).family_alpha == pytest.approx(0.1)
    assert NightlySettings(alpha=0.01).family_alpha == 0.01
    with pytest.raises(ValueError, match="require_ci_excludes_zero was removed"):
        Gate(metric="x_ms", threshold_pct=5, require_ci_excludes_zero=False)
    with pytest.raises(ValueError, match="min_history_nights"):
        NightlySettings(window_nights=3, min_history_nights=4)
    with pytest.raises(ValueError):
        Gate(metric="x_ms", threshold_pct=0)


# ---------------------------------------------------------------------------------------------
# machines: the history gates compare a night with its own machine's nights


def _on(i: int, level: float, machine: str | None) -> Night:
    n = night(i, {KB: [level, level + 1, level - 1], KV: [level, level + 1.5, level - 1.5]})
    n.machine = machine
    return n


def test_history_gates_compare_nights_of_the_same_machine_only():
    """Two machines alternate, B 8 % slower than A. Unknown machines (None): the clean-nights
    rule keeps A's levels, and a quiet night on B fails at -6.45 % (a red every B night).
    Known: each night against its own machine's 4 nights, +0.00 %. A third machine, C, is
    learning on its own nights: skipped with none, held (not red) with 3 of 4."""
    from patchbench.nightly.story import tell

    s = settings(
        against="history", variants=["baseline"], threshold_pct=3, learn_min_nights=4,
        run_cv_pct=1.5, hold_while_learning=True,
    )  # fmt: skip
    blind = [_on(i, 100.0 if i % 2 else 92.0, None) for i in range(1, 9)]
    [r] = evaluate(blind, _on(9, 92.0, None), s)
    assert r.status == "fail" and r.reference == 100.0
    assert r.window_run_ids == ["n01", "n02", "n03", "n05", "n07"]
    lv = {x: np.mean(np.log([x, x + 1, x - 1])) for x in (92.0, 100.0)}  # a night's level
    assert r.change_pct == pytest.approx(100 * math.expm1(0.8 * (lv[92.0] - lv[100.0])))
    prior = [_on(i, 100.0 if i % 2 else 92.0, "A" if i % 2 else "B") for i in range(1, 9)]
    for level, m, ids in ((100.0, "A", ["n01", "n03", "n05", "n07"]),
                          (92.0, "B", ["n02", "n04", "n06", "n08"])):  # fmt: skip
        [r] = evaluate(prior, _on(9, level, m), s)
        assert (r.status, r.reference, r.window_run_ids) == ("pass", level, ids)
        assert r.change_pct == pytest.approx(0.0, abs=1e-9) and r.noise_source == "learned"
    t = _on(9, 80.0, "C")
    [r] = evaluate(prior, t, s)
    assert r.status == "skipped" and r.learning_nights == 0
    assert r.reason == "warming up: 0 night(s) in the history on this machine, 3 needed"
    assert tell([r], t, prior, {}, learn_min_nights=4).summary() == (
        "learning on this machine (0 of 4 nights)"
    )
    prior += [_on(i, 80.0, "C") for i in (9, 10, 11)]
    t = _on(12, 60.0, "C")  # 25 % slower: held, p > 0.001 on 3 nights' prediction t
    [r] = evaluate(prior, t, s)
    assert r.status == "learning" and r.learning_nights == 3
    lv = {x: np.mean(np.log([x, x + 1, x - 1])) for x in (60.0, 80.0)}
    assert r.change_pct == pytest.approx(100 * math.expm1(lv[60.0] - lv[80.0]))  # -25.003 %
    assert r.reason.startswith("learning on this machine (3 of 4 nights): would have been fail")
    st = tell([r], t, prior, {}, learn_min_nights=4)
    assert st.summary() == "learning on this machine (3 of 4 nights)" and st.machine == "C"
    assert st.to_json()["learning"] == {"nights": 3, "needed": 4, "machine": "C"}


def test_the_calibrations_machines_and_heavy_tailed_noise():
    """tools/calibration/nightly.py: a slower machine's serving metrics are worse by its share;
    Student-t noise (3 df) is scaled to the SD asked, so its median |e| is cv / sqrt 3 times
    t_3's 75 % quantile (scipy)."""
    from tools.calibration.nightly import Scenario, sim_night

    kbi = ("baseline", "serving", ITL)
    n = sim_night(0, np.random.default_rng(1), [("serving", TPUT), ("serving", ITL)], 3, 0.0,
                  0.0, Scenario(), machine="B", slow=0.08)  # fmt: skip
    assert n.machine == "B" and n.values[KB] == pytest.approx([92.0] * 3)
    assert n.values[kbi] == pytest.approx([100.0 / 0.92] * 3)
    t3 = sim_night(0, np.random.default_rng(2), [("serving", TPUT)], 20000, 0.03, 0.0,
                   Scenario(), dist="t3")  # fmt: skip
    e = np.log(np.asarray(t3.values[KB]) / 100.0)
    assert np.median(np.abs(e)) == pytest.approx(0.03 / 3**0.5 * stats.t(3).ppf(0.75), rel=0.03)


def test_a_night_without_gates_is_not_green():
    """Nothing checked is said as such: outcome "no gates", exit 0, a headline naming the key."""
    from patchbench.nightly.job import _exit_of

    assert night_outcome([]) == "no gates"
    code, headline = _exit_of([], failed_run=False, history_failed=False)
    assert code == 0 and headline.startswith("NO GATES") and "nightly.gates" in headline
