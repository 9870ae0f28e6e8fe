"""Group-sequential repeats (patchbench/sequential.py): boundaries against the published tables and
an independent computation, the Holm step-down, and the stopping logic on synthetic sequences."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from patchbench.sequential import (
    Design,
    boundary,
    continuation_probability,
    decide,
    looks_from_schedule,
    next_target,
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
    assert next_target(D, out) is None


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
    assert not part.stop and part.look_index == 1 and next_target(D, part) == 8


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
