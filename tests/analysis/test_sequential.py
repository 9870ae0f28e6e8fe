"""Group-sequential repeats (patchbench/analysis/sequential.py): boundaries against the published tables and
an independent computation, the Holm step-down, conditional power against a simulation, and the
stopping logic on synthetic sequences (clear effect, clear null, hopeless (futile), ambiguous; A/A
controls never hold a run open)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from patchbench.analysis.sequential import (
    FUTILITY,
    Design,
    boundary,
    conditional_power,
    continuation_probability,
    decide,
    looks_from_schedule,
    nominal_levels,
    replay,
)

M5 = math.log1p(0.05)  # +-5 % margin on the log scale


# Jennison & Turnbull (2000), Table 2.1 (Pocock C_P) and Table 2.3 (O'Brien-Fleming C_B),
# two-sided alpha = 0.05, K equally spaced looks
@pytest.mark.parametrize(
    "k, pocock, obf", [(2, 2.178, 1.977), (3, 2.289, 2.004), (4, 2.361, 2.024), (5, 2.413, 2.040)]
)
def test_boundaries_match_the_published_tables(k, pocock, obf):
    b = boundary(range(1, k + 1), 0.05, "pocock")
    assert len(set(b)) == 1 and b[0] == pytest.approx(pocock, abs=6e-4)
    o = boundary(range(1, k + 1), 0.05, "obrien-fleming")
    assert o[-1] == pytest.approx(obf, abs=6e-4)  # C_B is the last look's value
    assert o[0] == pytest.approx(obf * math.sqrt(k), abs=2e-3)  # c * sqrt(K / 1) at look 1


def test_unequal_looks_against_scipy_multivariate_normal():
    looks = (4, 6, 8, 10, 12)
    b = boundary(looks, 0.05)
    cov = np.array([[math.sqrt(min(a, c) / max(a, c)) for c in looks] for a in looks])
    p = stats.multivariate_normal(mean=np.zeros(5), cov=cov).cdf(
        np.full(5, b[0]), lower_limit=np.full(5, -b[0]), rng=np.random.default_rng(1)
    )
    assert 1.0 - p == pytest.approx(0.05, abs=5e-4)
    assert continuation_probability(b, looks) == pytest.approx(0.95, abs=1e-6)
    # unequal spacing: a smaller constant than equally spaced K = 5 (2.413), larger than K = 4
    assert 2.30 < b[0] < 2.413


def test_boundary_by_simulation_of_the_look_statistics():
    looks = np.array([4, 6, 8, 10, 12])
    b = boundary(tuple(looks), 0.05, "obrien-fleming")
    rng = np.random.default_rng(7)
    incr = rng.standard_normal((200_000, looks[-1]))
    s = np.cumsum(incr, axis=1)[:, looks - 1] / np.sqrt(looks)
    crossed = np.mean(np.any(np.abs(s) >= np.asarray(b), axis=1))
    assert crossed == pytest.approx(0.05, abs=0.0025)


def test_one_look_is_the_fixed_sample_test():
    assert boundary([5], 0.05)[0] == pytest.approx(1.959964, abs=1e-5)
    assert nominal_levels([5], 0.05)[0] == pytest.approx(0.05)


def test_schedule_looks_and_errors():
    assert looks_from_schedule(4, 12, 2) == (4, 6, 8, 10, 12)
    assert looks_from_schedule(4, 11, 3) == (4, 7, 10, 11)
    with pytest.raises(ValueError, match="repeats.min"):
        looks_from_schedule(2, 10, 2)
    with pytest.raises(ValueError, match="max"):
        looks_from_schedule(6, 4, 2)


D = Design.from_schedule(4, 12, 2)


def test_stops_early_on_a_clear_effect():
    up = [0.10, 0.11, 0.09, 0.10, 0.12, 0.10]  # +10 %, sd 0.011
    down = [-0.10, -0.11, -0.09, -0.10, -0.12, -0.10]
    out = replay(
        {"v": {"tput": up, "itl_ms": down}},
        {"tput": M5, "itl_ms": M5},
        design=D,
        better={"tput": "higher", "itl_ms": "lower"},
    )
    assert out.stop and out.look_index == 0 and out.n_repeats == 4
    assert out.metrics[("v", "tput")].decision == "improved"
    assert out.metrics[("v", "itl_ms")].decision == "improved"  # latency down is better
    # hand: mean 0.1, sd of [.1,.11,.09,.1] = 0.008165, t = 24.49, df 3
    d = out.metrics[("v", "tput")]
    assert d.p_value == pytest.approx(2 * stats.t.sf(0.1 / (0.0081650 / 2), 3), rel=1e-3)


def test_stops_as_equivalent_on_a_clear_null():
    null = [0.004, -0.003, 0.002, -0.004, 0.001, 0.0]
    out = replay({"v": {"tput": null}}, {"tput": M5}, design=D)
    assert out.stop and out.look_index == 0
    d = out.metrics[("v", "tput")]
    assert d.decision == "equivalent" and d.look == 0
    # hand: the 1 - 2*level t-interval at n = 4 lies inside +-log(1.05)
    x = np.array(null[:4])
    q = stats.t.ppf(1 - D.level(0, 0.05), 3)
    half = q * x.std(ddof=1) / 2
    assert abs(x.mean()) + half < M5


def test_runs_to_max_on_an_ambiguous_sequence():
    amb = [0.10, -0.05, 0.08, -0.06, 0.09, -0.04, 0.07, -0.07, 0.10, -0.05, 0.06, -0.03]
    out = replay({"v": {"tput": amb}}, {"tput": M5}, design=D)
    assert out.stop and out.look_index == 4 and out.n_repeats == 12
    assert out.metrics[("v", "tput")].decision == "inconclusive"
    assert "maximum of 12 repeats" in out.reason
    part = replay({"v": {"tput": amb[:7]}}, {"tput": M5}, design=D)  # a resumed run: 7 on disk
    assert not part.stop and part.look_index == 1


def test_holm_step_down_across_primaries():
    # two primaries; at look 0 the level for alpha/2 and for alpha differ; a metric whose p lies
    # between them is rejected only after the other one was
    lvl1, lvl2 = D.level(0, 0.025), D.level(0, 0.05)
    assert lvl1 < lvl2
    strong = [0.10, 0.11, 0.09, 0.10]
    # pick a t so that p is between lvl1 and lvl2 (df 3)
    p_mid = math.sqrt(lvl1 * lvl2)
    t_mid = stats.t.isf(p_mid / 2, 3)
    sd = 0.02
    base = np.array([-1.0, 1.0, -1.0, 1.0]) * sd * math.sqrt(3) / 2  # sample sd = sd
    mid = list(base + t_mid * sd / 2)
    out = decide(0, {"v": {"a": strong, "b": mid}}, {}, design=D)
    assert out.metrics[("v", "b")].p_value == pytest.approx(p_mid, rel=1e-6)
    assert out.metrics[("v", "b")].decision == "improved"
    out = decide(0, {"v": {"a": [0.1, -0.1, 0.1, -0.1], "b": mid}}, {}, design=D)
    assert out.metrics[("v", "b")].decision == "continue"  # first step needs lvl1: not met


def test_a_decision_is_kept_at_later_looks_and_counts_for_holm():
    first = decide(0, {"v": {"a": [0.1, 0.11, 0.09, 0.1]}}, {}, design=D)
    later = decide(
        1, {"v": {"a": [0.1, 0.11, 0.09, 0.1, -0.3, -0.3]}}, {}, design=D, previous=first
    )
    assert later.metrics[("v", "a")].decision == "improved"
    assert later.metrics[("v", "a")].look == 0


def test_too_few_repeats_is_an_error():
    with pytest.raises(ValueError, match="needs 6"):
        decide(1, {"v": {"a": [0.1] * 5}}, {}, design=D)


def test_false_positive_rate_by_simulation():
    """Under no effect (one primary, 4..12 by 2, Pocock), the t-based levels keep the chance of
    any improved/regressed near alpha = 0.05 (binomial sd at 2000 trials: 0.005)."""
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(2000):
        x = rng.normal(0, 0.04, 12)
        out = replay({"v": {"a": x}}, {"a": M5}, design=D)
        hits += out.metrics[("v", "a")].decision in ("improved", "regressed")
    assert 0.03 <= hits / 2000 <= 0.07


# ---------------------------------------------------------------------------------------------
# futility (conditional power) and controls

DF = Design.from_schedule(4, 12, 2, futility=FUTILITY)


@pytest.mark.parametrize("mean, sd", [(0.02, 0.05), (0.0, 0.03), (0.06, 0.04)])
def test_conditional_power_against_a_simulation(mean, sd):
    """The n repeats so far are fixed, the N - n to come are N(mean, sd); the last look's
    decision uses the t quantiles with sd as the standard deviation."""
    n, big_n, le, lq = 4, 12, 0.01, 0.01
    p_eff, p_eq = conditional_power(
        mean, sd, n, big_n, effect_level=le, margin=M5, equivalence_level=lq
    )
    rng = np.random.default_rng(11)
    final = (n * mean + rng.normal(mean, sd, (200_000, big_n - n)).sum(axis=1)) / big_n
    se = sd / math.sqrt(big_n)
    crit = stats.t.ppf(1 - le / 2, big_n - 1) * se
    half = M5 - stats.t.ppf(1 - lq, big_n - 1) * se
    assert p_eff == pytest.approx(np.mean(np.abs(final) >= crit), abs=0.004)
    assert p_eq == pytest.approx(np.mean(np.abs(final) < half), abs=0.004)
    with pytest.raises(ValueError, match="n_final"):
        conditional_power(mean, sd, 12, 12, effect_level=le)


def test_stops_for_futility_on_a_hopeless_sequence():
    # sd 27 %: at 12 repeats the TOST interval alone is wider than +-5 % and the estimate
    # (-1.2 %) is far from any boundary, so neither decision can be reached
    hope = [0.3, -0.25, 0.2, -0.3, 0.25, -0.2, 0.3, -0.3, 0.2, -0.25, 0.3, -0.2]
    out = replay({"v": {"tput": hope}}, {"tput": M5}, design=DF)
    assert out.stop and out.look_index == 0 and out.n_repeats == 4
    d = out.metrics[("v", "tput")]
    assert d.decision == "inconclusive" and d.reason.startswith("futile: conditional power")
    assert "1 primary metric(s) inconclusive (futile" in out.reason
    # hand: the 1 - 2*level interval at 12 repeats with this sd is wider than the margin
    sd = float(np.std(hope[:4], ddof=1))
    q = stats.t.ppf(1 - DF.level(4, 0.05), 11)
    assert q * sd / math.sqrt(12) > M5
    # without a futility stop the same sequence runs to the maximum
    assert replay({"v": {"tput": hope}}, {"tput": M5}, design=D).n_repeats == 12


def test_runs_to_max_on_an_ambiguous_sequence_with_futility():
    # a promising +5 % that never crosses the boundary: conditional power stays above FUTILITY
    amb = [0.13, -0.01, 0.11, 0.01, 0.10, 0.00, 0.08, 0.00]
    d48 = Design.from_schedule(4, 8, 2, futility=FUTILITY)
    out = replay({"v": {"tput": amb}}, {"tput": M5}, design=d48)
    assert out.stop and out.look_index == 2 and out.n_repeats == 8
    assert out.metrics[("v", "tput")].decision == "inconclusive"
    assert "maximum of 8 repeats" in out.reason
    p = stats.ttest_1samp(amb, 0.0).pvalue
    assert p > d48.level(2, 0.05)  # not improved at the last look (scipy's t-test)
    for k, n in enumerate((4, 6)):  # the looks before went on
        look = decide(k, {"v": {"tput": amb}}, {"tput": M5}, design=d48)
        assert look.metrics[("v", "tput")].decision == "continue" and not look.stop, n


def test_futility_is_non_binding():
    # "a" is futile at look 0, but "b" holds the run open; at look 1 "a" is tested again on
    # all 6 repeats (a futile metric is not frozen, unlike a decided one)
    a = [0.3, -0.28, 0.02, -0.02, 0.01, 0.0]
    b = [0.13, -0.01, 0.11, 0.01, 0.10, 0.1]
    ratios = {"v": {"a": a, "b": b}}
    first = decide(0, ratios, {"a": M5, "b": M5}, design=DF)
    assert first.metrics[("v", "a")].decision == "futile"
    assert first.metrics[("v", "b")].decision == "continue" and not first.stop
    assert "1 futile" in first.reason
    second = decide(1, ratios, {"a": M5, "b": M5}, design=DF, previous=first)
    again = second.metrics[("v", "a")]
    assert again.n == 6
    assert again.p_value == pytest.approx(stats.ttest_1samp(a, 0.0).pvalue, rel=1e-9)


def test_futility_never_adds_a_false_positive():
    """Non-binding futility only removes looks: on the same null sequences every
    improved/regressed with futility is one without it too (so the rate stays <= alpha)."""
    rng = np.random.default_rng(5)
    with_f = without = 0
    for _ in range(600):
        x = {"v": {"a": rng.normal(0, 0.05, 12), "b": rng.normal(0, 0.03, 12)}}
        hit_f = {
            k
            for k, d in replay(x, {"a": M5, "b": M5}, design=DF).metrics.items()
            if d.decision in ("improved", "regressed")
        }
        hit = {
            k
            for k, d in replay(x, {"a": M5, "b": M5}, design=D).metrics.items()
            if d.decision in ("improved", "regressed")
        }
        assert hit_f <= hit
        with_f += bool(hit_f)
        without += bool(hit)
    assert without <= 0.07 * 600


def test_an_aa_control_never_holds_the_run_open():
    clear = [0.10, 0.11, 0.09, 0.10, 0.12, 0.10]
    amb = [0.10, -0.05, 0.08, -0.06, 0.09, -0.04, 0.07, -0.07, 0.10, -0.05, 0.06, -0.03]
    ratios = {"aa": {"tput": amb}, "v": {"tput": clear + [0.1] * 6}}
    out = replay(ratios, {"tput": M5}, design=D, controls=["aa"])
    assert out.stop and out.n_repeats == 4
    assert out.metrics[("v", "tput")].decision == "improved"
    assert out.metrics[("aa", "tput")].decision == "inconclusive"  # recorded, not waited for
    assert "A/A variants do not hold the run open" in out.reason
    # a control is a measurement, outside the family: v's primary has the whole alpha
    assert out.metrics[("v", "tput")].level == pytest.approx(D.level(0, 0.05))
    # without the control the A/A's ambiguous sequence holds the run to the maximum
    assert replay(ratios, {"tput": M5}, design=D).n_repeats == 12


def test_design_rejects_a_bad_futility_threshold():
    with pytest.raises(ValueError, match="futility"):
        Design.from_schedule(4, 12, 2, futility=1.0)


# ---------------------------------------------------------------------------------------------
# one family per report: every primary of every variant but the controls


def test_one_holm_family_across_variants():
    """Two variants with one primary each form one family of 2: the first share is alpha/2 at the
    look's boundary, and once one is rejected the other is tested at the whole alpha."""
    lvl_half, lvl_all = D.level(0, 0.025), D.level(0, 0.05)
    p_mid = math.sqrt(lvl_half * lvl_all)  # between the two levels
    sd = 0.02
    base = np.array([-1.0, 1.0, -1.0, 1.0]) * sd * math.sqrt(3) / 2  # sample sd = sd
    mid = list(base + stats.t.isf(p_mid / 2, 3) * sd / 2)
    strong = [0.2, 0.21, 0.19, 0.2]
    out = decide(0, {"v": {"a": strong}, "w": {"a": mid}}, {}, design=D)
    assert out.family == 2
    assert out.metrics[("v", "a")].level == pytest.approx(lvl_half)
    assert out.metrics[("w", "a")].decision == "improved"
    assert out.metrics[("w", "a")].level == pytest.approx(lvl_all)
    # without the strong one the mid p-value misses alpha/2
    out = decide(0, {"v": {"a": [0.1, -0.1, 0.1, -0.1]}, "w": {"a": mid}}, {}, design=D)
    assert out.metrics[("w", "a")].decision == "continue"
    assert out.metrics[("w", "a")].level == pytest.approx(lvl_half)


def test_a_fixed_test_takes_its_whole_share_and_never_holds_the_run_open():
    from patchbench.analysis.sequential import FixedTest

    acc = FixedTest(p=0.03, estimate=0.02, n=900)
    null = [0.01, -0.01, 0.005, -0.005, 0.0, 0.0]
    # family of 2 (one run-level, one fixed): 0.03 > alpha/2, not rejected; the run-level one is
    # equivalent, so the run stops at the first look with the fixed test inconclusive
    out = replay({"v": {"tput": null}}, {"tput": M5}, design=D, fixed={"v": {"acc": acc}})
    assert out.stop and out.n_repeats == 4 and out.family == 2
    assert out.metrics[("v", "tput")].decision == "equivalent"
    d = out.metrics[("v", "acc")]
    assert d.decision == "inconclusive" and d.level == pytest.approx(0.025) and d.n == 900
    # once the run-level primary is rejected, the fixed test gets the whole alpha: 0.03 < 0.05
    # is not enough (0.03 > 0.05 is false): rejected
    strong = [0.2, 0.21, 0.19, 0.2, 0.2, 0.2]
    out = replay({"v": {"tput": strong}}, {"tput": M5}, design=D, fixed={"v": {"acc": acc}})
    assert out.metrics[("v", "acc")].decision == "improved"
    assert out.metrics[("v", "acc")].level == pytest.approx(0.05)
    assert out.metrics[("v", "acc")].change_pct == pytest.approx(2.0)
    # a fixed test alone: decided at the first look, the run stops there
    out = replay({}, {}, design=D, fixed={"v": {"acc": FixedTest(0.001, -0.03, 900)}})
    assert out.stop and out.n_repeats == 4
    assert out.metrics[("v", "acc")].decision == "regressed"


def test_a_control_is_never_improved_or_regressed():
    clear = [0.10, 0.11, 0.09, 0.10]
    out = decide(
        0, {"aa": {"tput": clear}, "v": {"tput": clear}}, {"tput": M5}, design=D, controls=["aa"]
    )
    assert out.family == 1
    assert out.metrics[("v", "tput")].decision == "improved"
    assert out.metrics[("aa", "tput")].decision == "inconclusive"  # the run stopped
    assert "never improved or regressed" in out.metrics[("aa", "tput")].reason
    flat = [0.001, -0.001, 0.0005, -0.0005]
    out = decide(
        0, {"aa": {"tput": flat}, "v": {"tput": clear}}, {"tput": M5}, design=D, controls=["aa"]
    )
    assert out.metrics[("aa", "tput")].decision == "equivalent"


def test_family_false_positive_rate_by_simulation():
    """Two variants x four primaries under no effect (Pocock 4..12 by 2): any improved/regressed
    in the report near or below alpha = 0.05 (independent primaries: the worst case for Holm)."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(1000):
        x = {v: {m: rng.normal(0, 0.04, 12) for m in "abcd"} for v in ("v", "w")}
        out = replay(x, dict.fromkeys("abcd", M5), design=D)
        hits += any(d.decision in ("improved", "regressed") for d in out.metrics.values())
    assert hits / 1000 <= 0.07
