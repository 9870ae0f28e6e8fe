"""Pairing two MMMU cells: flips, McNemar exact p (checked against statsmodels and a binomial
test computed independently with scipy), identical-response share, refusals."""
from __future__ import annotations

import pytest
from scipy.stats import binomtest
from statsmodels.stats.contingency_tables import mcnemar

from patchbench.suites.mmmu import PairingError, pair

BASE = {"question_type": "multiple-choice", "prompt_sha256": "h", "parser": "strict",
        "parser_seed": None, "sampling": {"temperature": 0.0, "max_tokens": 30},
        "protocol": "patchbench"}


def cell(verdicts: list[str], responses: list[str] | None = None, **over) -> list[dict]:
    out = []
    for i, v in enumerate(verdicts):
        r = dict(BASE, id=f"validation_Art_{i + 1}", verdict=v,
                 response=(responses[i] if responses else v))
        r.update(over)
        out.append(r)
    return out


def test_flips_and_mcnemar():
    # 40 questions: 20 both right, 10 both wrong, 8 right->wrong, 2 wrong->right
    a = ["correct"] * 20 + ["wrong"] * 10 + ["correct"] * 8 + ["wrong"] * 2
    b = ["correct"] * 20 + ["wrong"] * 10 + ["wrong"] * 8 + ["correct"] * 2
    res = pair(cell(a), cell(b))
    assert (res["both_right"], res["both_wrong"], res["right_to_wrong"],
            res["wrong_to_right"]) == (20, 10, 8, 2)
    want = mcnemar([[20, 8], [2, 10]], exact=True).pvalue
    assert res["mcnemar_p"] == pytest.approx(want)
    # independently: exact McNemar = two-sided binomial test of 2 successes in 10 at p=0.5
    assert res["mcnemar_p"] == pytest.approx(binomtest(2, 10, 0.5).pvalue)
    assert res["mcnemar_p"] == pytest.approx(112 / 1024)  # 2 * (1+10+45)/2^10, by hand
    assert res["verdict"] == "no significant change"
    assert res["changed_count"] == 10 and res["identical_response_share"] == pytest.approx(0.75)
    assert res["acc_a"] == pytest.approx(28 / 40) and res["acc_b"] == pytest.approx(22 / 40)


def test_significant_regression_and_improvement():
    a = ["correct"] * 12 + ["wrong"] * 8
    b = ["wrong"] * 12 + ["wrong"] * 8
    res = pair(cell(a), cell(b))
    assert res["mcnemar_p"] == pytest.approx(2 / 2 ** 12)
    assert res["verdict"] == "regressed"
    assert pair(cell(b), cell(a))["verdict"] == "improved"


def test_identical_cells():
    a = ["correct", "wrong", "unparsed"]
    res = pair(cell(a), cell(a))
    assert res["mcnemar_p"] == 1.0 and res["verdict"] == "no significant change"
    assert res["identical_response_share"] == 1.0 and res["changed"] == []


def test_same_verdict_different_text_is_listed():
    a = cell(["correct", "correct"], ["B", "B"])
    b = cell(["correct", "correct"], ["B", "Answer: B"])
    res = pair(a, b)
    assert res["identical_response_share"] == 0.5
    assert res["changed"] == [{"id": "validation_Art_2", "verdict_a": "correct",
                               "verdict_b": "correct", "response_a": "B",
                               "response_b": "Answer: B"}]


def test_failed_questions_make_it_incomplete():
    res = pair(cell(["correct", "failed", "wrong"]), cell(["correct", "correct", "wrong"]))
    assert res["n_paired"] == 2 and res["n_failed_either"] == 1
    assert res["verdict"] == "incomplete"


@pytest.mark.parametrize("over,msg", [
    ({"prompt_sha256": "other"}, "prompts differ"),
    ({"parser": "official"}, "parser differ"),
    ({"sampling": {"temperature": 0.7, "max_tokens": 30}}, "sampling settings differ"),
    ({"protocol": "sglang-2025"}, "protocol differ"),
])
def test_refusals(over, msg):
    with pytest.raises(PairingError, match=msg):
        pair(cell(["correct"] * 3), cell(["correct"] * 3, **over))


def test_refuses_different_question_lists():
    a = cell(["correct"] * 3)
    b = cell(["correct"] * 2)
    with pytest.raises(PairingError,
                       match=r"question lists differ: 1 only in a \(validation_Art_3\)"):
        pair(a, b)
