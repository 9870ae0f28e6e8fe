"""The one rule for an accuracy row measured in one run per arm: never improved, regressed or
equivalent, outside the family, and it says what it cannot separate and the rounds that would
(patchbench.analysis.verdicts.accuracy_rule), in the fixed and the sequential design alike."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from patchbench.analysis import family, verdicts
from patchbench.analysis.comparison import Row


def _rounds_by_hand(effect: float, sd: float, alpha: float, target: float) -> int:
    """The fewest n >= 2 whose paired t test reaches ``target`` power: scipy's noncentral t
    (independent of the statsmodels power the code uses)."""
    n = 2
    while True:
        df, nc = n - 1, effect / sd * math.sqrt(n)
        crit = sps.t.ppf(1 - alpha / 2, df)
        pw = sps.nct.sf(crit, df, nc) + sps.nct.cdf(-crit, df, nc)
        if pw >= target:
            return n
        n += 1


def test_one_run_per_arm_states_the_spread_and_the_rounds_by_hand():
    # run sd 0.5 pt: two runs differ by N(0, 2 x 0.25 pt^2), +-1.96 x 0.707 = +-1.39 points;
    # a round pair's difference: sqrt(0.5^2 + 2 x 0.5^2) = 0.866 pt (item se 0.5 pt)
    text = verdicts.accuracy_rule((1, 1), 0.005, 2.0, 0.05)
    n = _rounds_by_hand(0.02, math.sqrt(0.005**2 + 2 * 0.005**2), 0.05, 0.8)
    assert n == 4  # d = 2.31: 3 rounds give 0.56 power, 4 give 0.85 (scipy nct)
    assert text.startswith(
        "one run per arm cannot separate a change from server-to-server variation of about "
        f"±1.4 points; {n} rounds would"
    )
    assert verdicts.accuracy_rule((2, 2), 0.005, 2.0, 0.05) is None
    assert verdicts.accuracy_rule((3, 3), 0.005, 2.0, 0.05) is None
    # a noisier question set needs more rounds: item se 1 pt, sd 1.22 pt, d = 1.63
    n2 = _rounds_by_hand(0.02, math.sqrt(0.01**2 + 2 * 0.005**2), 0.05, 0.8)
    assert f"{n2} rounds would" in verdicts.accuracy_rule((1, 1), 0.01, 2.0, 0.05)
    assert n2 > n


def _arms(q: int = 900, flips: int = 60, seed: int = 3):
    """900 questions, ``flips`` of them right in the variant only: +6.7 points, p tiny."""
    rng = np.random.default_rng(seed)
    b = (rng.uniform(size=q) < 0.45).astype(float)
    v = b.copy()
    wrong = np.flatnonzero(b == 0)[:flips]
    v[wrong] = 1.0
    return b, v


def test_a_large_change_in_one_run_per_arm_is_inconclusive_and_two_runs_decide():
    b, v = _arms()
    one = verdicts.accuracy_test(b, v, margin_pt=2.0)
    assert one.p is not None and one.p < 1e-6  # the questions alone would call it
    assert one.undecided and one.undecided in one.notes
    verdict, iv, within = verdicts.verdict(
        one, better="higher", alpha=0.05, margin=2.0, equivalent=True
    )
    assert verdict == "inconclusive" and iv is not None and not within  # shown, not decided
    two = verdicts.accuracy_test(b, v, (2, 2), margin_pt=2.0)
    assert two.undecided is None
    assert (
        verdicts.verdict(two, better="higher", alpha=0.05, margin=2.0, equivalent=False)[0]
        == "improved"
    )


def test_one_run_rows_leave_the_family_so_both_designs_see_the_same_rule():
    b, v = _arms()
    one = verdicts.accuracy_test(b, v, margin_pt=2.0)
    two = verdicts.accuracy_test(b, v, (2, 2), margin_pt=2.0)
    rows = [
        (
            Row(
                suite="mmmu", metric="mmmu_overall_acc", variant="x", primary=True, kind="accuracy"
            ),
            t,
        )
        for t in (one, two)
    ]
    fam = family.primary_family(rows, [])
    assert [t for _, t in fam] == [two]
    # the fixed design's judge: the one-run row stays inconclusive with its interval shown
    r = Row(
        suite="mmmu",
        metric="mmmu_overall_acc",
        variant="x",
        primary=True,
        kind="accuracy",
        better="higher",
        margin=2.0,
    )
    family.judge(r, one, 0.95)
    assert r.verdict == "inconclusive" and r.low is not None and r.high is not None
