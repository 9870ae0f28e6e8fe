"""Pairing two MMMU cells: flips, McNemar exact p (checked against statsmodels and a binomial
test computed independently with scipy), identical-response share, refusals."""

from __future__ import annotations

import re

import pytest
from scipy.stats import binomtest
from statsmodels.stats.contingency_tables import mcnemar

from patchbench.suite import PairingRefused
from patchbench.suites.mmmu.pairing import PairingError, check_pairable, pair_records

BASE = {
    "question_type": "multiple-choice",
    "prompt_sha256": "h",
    "parser": "strict",
    "parser_seed": None,
    "sampling": {"temperature": 0.0, "max_tokens": 30},
    "protocol": "patchbench",
}


def cell(verdicts: list[str], responses: list[str] | None = None, **over) -> list[dict]:
    out = []
    for i, v in enumerate(verdicts):
        r = dict(
            BASE,
            id=f"validation_Art_{i + 1}",
            verdict=v,
            response=(responses[i] if responses else v),
        )
        r.update(over)
        out.append(r)
    return out


def pair(a: list[dict], b: list[dict]) -> dict:
    """One repeat each."""
    return pair_records([a], [b])


def test_flips_and_mcnemar():
    # 40 questions: 20 both right, 10 both wrong, 8 right->wrong, 2 wrong->right
    a = ["correct"] * 20 + ["wrong"] * 10 + ["correct"] * 8 + ["wrong"] * 2
    b = ["correct"] * 20 + ["wrong"] * 10 + ["wrong"] * 8 + ["correct"] * 2
    res = pair(cell(a), cell(b))
    assert (res["both_right"], res["both_wrong"], res["right_to_wrong"], res["wrong_to_right"]) == (
        20,
        10,
        8,
        2,
    )
    want = mcnemar([[20, 8], [2, 10]], exact=True).pvalue
    assert res["mcnemar_p"] == pytest.approx(want)
    # independently: exact McNemar = two-sided binomial test of 2 successes in 10 at p=0.5
    assert res["mcnemar_p"] == pytest.approx(binomtest(2, 10, 0.5).pvalue)
    assert res["mcnemar_p"] == pytest.approx(112 / 1024)  # 2 * (1+10+45)/2^10, by hand
    assert res["flips"] == 10 and res["identical_share"] == pytest.approx(0.75)
    assert res["acc_a"] == pytest.approx(28 / 40) and res["acc_b"] == pytest.approx(22 / 40)


def test_significant_regression_and_improvement():
    a = ["correct"] * 12 + ["wrong"] * 8
    b = ["wrong"] * 12 + ["wrong"] * 8
    res = pair(cell(a), cell(b))
    assert res["mcnemar_p"] == pytest.approx(2 / 2**12)
    assert (res["right_to_wrong"], res["wrong_to_right"]) == (12, 0)
    back = pair(cell(b), cell(a))
    assert (back["right_to_wrong"], back["wrong_to_right"]) == (0, 12)
    assert back["mcnemar_p"] == pytest.approx(2 / 2**12)


def test_identical_cells():
    a = ["correct", "wrong", "unparsed"]
    res = pair(cell(a), cell(a))
    assert res["mcnemar_p"] == 1.0 and res["flips"] == 0 and res["flipped"] == []
    assert res["identical_share"] == 1.0


def test_same_verdict_different_text_is_not_identical():
    a = cell(["correct", "correct"], ["B", "B"])
    b = cell(["correct", "correct"], ["B", "Answer: B"])
    res = pair(a, b)
    assert res["identical_share"] == 0.5 and res["flips"] == 0


def test_failed_questions_are_left_out_and_counted():
    res = pair(cell(["correct", "failed", "wrong"]), cell(["correct", "correct", "wrong"]))
    assert res["n"] == 2 and res["n_failed_either"] == 1
    assert res["notes"] == [
        "1 questions failed in every paired repeat (in either cell) and are left out"
    ]
    assert res["identical_share"] == 1.0  # over the two questions answered in both


OFFICIAL = {"parser": "official", "parser_seed": 42, "official_fallback": "random"}


@pytest.mark.parametrize(
    "base,over,msg",
    [
        ({}, {"prompt_sha256": "other"}, "prompts differ"),
        ({}, {"parser": "official"}, 'parser differ: a "strict" vs b "official"'),
        (
            OFFICIAL,
            {"official_fallback": "unparsed"},
            "official fallback mode differ: a 'random' vs b 'unparsed'",
        ),
        (OFFICIAL, {"parser_seed": 7}, "parser seed differ: a 42 vs b 7"),
        (
            {},
            {"sampling": {"temperature": 0.0, "max_tokens": 64}},
            "max_tokens differ: a 30 vs b 64",
        ),
        (
            {},
            {"sampling": {"temperature": 0.7, "max_tokens": 30}},
            "temperature differ: a 0.0 vs b 0.7",
        ),
        (
            {},
            {"sampling": {"temperature": 0.0, "max_tokens": 30, "top_k": 1}},
            "other sampling settings differ",
        ),
        ({}, {"protocol": "sglang-2025"}, "protocol differ"),
    ],
)
def test_refusals(base, over, msg):
    a = cell(["correct"] * 3, **base)
    b = cell(["correct"] * 3, **{**base, **over})
    with pytest.raises(PairingError, match=re.escape(msg)):
        check_pairable(a, b)
    with pytest.raises(PairingRefused, match="paired repeat 0: cannot pair"):  # the contract's
        pair(a, b)


def test_fallback_mode_read_off_records_without_the_field():
    # the same responses scored with and without the random pick: a refusal, never "improved"
    a = cell(["correct", "wrong"], parser="official", parser_seed=42)
    b = cell(["correct", "unparsed"], parser="official", parser_seed=42)
    a[1].update(fallback=True, parsed="C")
    b[1].update(fallback=True, parsed=None)
    with pytest.raises(
        PairingError, match="official fallback mode differ: a 'random' vs b 'unparsed'"
    ):
        pair(a, b)


def test_every_difference_is_named_at_once():
    with pytest.raises(PairingError) as e:
        pair(cell(["correct"] * 2), cell(["correct"] * 3, parser="official", prompt_sha256="x"))
    text = str(e.value)
    assert "question lists differ" in text and "prompts differ" in text and "parser differ" in text


def test_refuses_different_question_lists():
    a = cell(["correct"] * 3)
    b = cell(["correct"] * 2)
    with pytest.raises(
        PairingError, match=r"question lists differ: 1 only in a \(validation_Art_3\)"
    ):
        pair(a, b)


def test_refuses_a_repeat_that_differs():
    a1, a2 = cell(["correct"] * 3), cell(["correct"] * 3, parser_seed=5)
    b = cell(["correct"] * 3)
    with pytest.raises(PairingError, match=r"paired repeat 1: .*parser seed differ: a 5 vs b null"):
        pair_records([a1, a2], [b, b])


def test_repeats_average_per_question():
    # 4 questions, 2 repeats each, verdicts by hand (share of correct over the repeats):
    #   q1: a C,C (1)    b C,C (1)
    #   q2: a C,C (1)    b W,W (0)    -> right_to_wrong 1
    #   q3: a W,C (1/2)  b C,W (1/2)  -> half right and half wrong in both
    #   q4: a W,W (0)    b C,C (1)    -> wrong_to_right 1
    va = [["correct", "correct", "wrong", "wrong"], ["correct", "correct", "correct", "wrong"]]
    vb = [["correct", "wrong", "correct", "correct"], ["correct", "wrong", "wrong", "correct"]]
    res = pair_records([cell(v) for v in va], [cell(v) for v in vb])
    assert res["repeats_used"] == 2 and res["n"] == 4
    assert (res["both_right"], res["right_to_wrong"], res["wrong_to_right"], res["both_wrong"]) == (
        1.5,
        1,
        1,
        0.5,
    )
    assert res["flips"] == 2
    assert res["mcnemar_p"] == pytest.approx(1.0)  # 1 vs 1 discordant
    assert res["acc_a"] == pytest.approx((1 + 1 + 0.5 + 0) / 4)
    assert res["acc_b"] == pytest.approx((1 + 0 + 0.5 + 1) / 4)
    assert [(f["id"], f["baseline"], f["variant"]) for f in res["flipped"]] == [
        ("validation_Art_2", 1.0, 0.0),
        ("validation_Art_4", 0.0, 1.0),
    ]
    assert res["subjects"]["Art"]["right_to_wrong"] == 1 and res["subjects"]["Art"]["n"] == 4
    # responses are the verdict strings: identical only for q1 in each repeat
    assert res["identical_share"] == pytest.approx(0.25)


def test_significant_regression_over_repeats():
    a = ["correct"] * 12 + ["wrong"] * 8
    b = ["wrong"] * 20
    res = pair_records([cell(a)] * 3, [cell(b)] * 3)
    assert res["right_to_wrong"] == 12 and res["mcnemar_p"] == pytest.approx(2 / 2**12)


def test_empty_sides():
    with pytest.raises(ValueError, match="a is empty"):
        check_pairable([], cell(["correct"]))
    with pytest.raises(PairingError, match=r"paired repeat 1: no MMMU records to pair \(b is"):
        pair_records([cell(["correct"])] * 2, [cell(["correct"]), []])


def test_answered_accuracy_means_no_failed_request_as_in_each_cell(tmp_path):
    """ "answered" in the paired comparison is what each cell's own tally calls answered: a
    reply came back (unparsed included). q0: correct / correct; q1: unparsed in the baseline
    (answered, wrong); q2: its baseline request failed in repeat 1 (not answered; still in the
    overall accuracy through repeat 0); q3: wrong / correct."""
    from patchbench import records
    from patchbench.suites.mmmu import pair_repeats
    from tests.synthetic import mmmu_rows

    cells = {
        ("b", 0): ["correct", "unparsed", "correct", "wrong"],
        ("b", 1): ["correct", "unparsed", "failed", "wrong"],
        ("v", 0): ["correct", "correct", "correct", "correct"],
        ("v", 1): ["correct", "correct", "wrong", "correct"],
    }
    dirs = {}
    for key, verdicts in cells.items():
        d = tmp_path / f"{key[0]}{key[1]}"
        records.write_jsonl(d / "records.jsonl", mmmu_rows(verdicts))
        dirs[key] = d
    acc = pair_repeats([dirs[("b", 0)], dirs[("b", 1)]], [dirs[("v", 0)], dirs[("v", 1)]])[
        "accuracy"
    ]
    answered = acc["mmmu_answered_acc"]
    assert {k: v for k, v in answered.items() if k != "cells"} == {
        "ids": ["q0", "q1", "q3"],
        "baseline": [1.0, 0.0, 0.0],
        "variant": [1.0, 1.0, 1.0],
    }
    # the cell-shift variance parts of each arm (2 repeats: 1 df of repeats each)
    cells = answered["cells"]
    assert (cells["repeats_baseline"], cells["repeats_variant"]) == (2, 2)
    assert cells["baseline"]["df_between"] == 1 and cells["variant"]["df_between"] == 1
    # overall: q2 from repeat 0 only (its repeat 1 failed in the baseline)
    assert acc["mmmu_overall_acc"]["ids"] == ["q0", "q1", "q2", "q3"]
    assert acc["mmmu_overall_acc"]["baseline"] == [1.0, 0.0, 1.0, 0.0]
    assert acc["mmmu_overall_acc"]["variant"] == [1.0, 1.0, 1.0, 1.0]
