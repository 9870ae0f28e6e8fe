"""Denominators (M5), intervals, and the PR-style block and file shapes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from patchbench.suites.mmmu import report_block
from patchbench.suites.mmmu.data import DOMAINS, SUBJECT_DOMAIN, SUBJECTS, subject_of
from patchbench.suites.mmmu.params import Params
from patchbench.suites.mmmu.scoring import (
    Tally,
    answer_dict,
    format_block,
    summarize,
    tally,
    val_dict,
    wilson,
    write_outputs,
)


def recs(subject: str, verdicts: dict[str, int]) -> list[dict]:
    out, i = [], 0
    for v, n in verdicts.items():
        for _ in range(n):
            i += 1
            out.append({"id": f"validation_{subject}_{i}", "verdict": v})
    return out


def test_m5_denominators():
    # X: 30 asked, 15 correct. Y: 30 asked, 20 failed, 10 answered all correct.
    r = recs("Art", {"correct": 15, "wrong": 15}) + recs("Math", {"failed": 20, "correct": 10})
    sc = tally(r)
    assert sc.overall.asked == 60 and sc.overall.correct == 25
    assert sc.overall.acc == pytest.approx(25 / 60)
    assert round(sc.overall.acc, 3) == 0.417  # not 0.625, not 0.75
    assert sc.overall.answered_acc == pytest.approx(25 / 40)
    assert sc.subjects["Math"].answered == 10 and sc.subjects["Math"].failed == 20
    assert sc.subjects["Math"].acc == pytest.approx(10 / 30)
    res, _ = summarize(r, Params())
    assert res.metrics["mmmu_overall_acc"] == pytest.approx(25 / 60)
    assert res.metrics["mmmu_answered_acc"] == pytest.approx(25 / 40)
    assert res.metrics["mmmu_failed_count"] == 20 and res.metrics["mmmu_asked_count"] == 60
    assert res.status == "incomplete" and "20 of 60" in res.errors[0]
    # domains are pooled over questions
    assert res.metrics["mmmu_art_and_design_acc"] == pytest.approx(0.5)
    assert res.metrics["mmmu_science_acc"] == pytest.approx(1 / 3)


def test_subject_and_domain_of_ids():
    assert subject_of("validation_Art_Theory_12") == "Art_Theory"
    assert (
        subject_of("validation_Diagnostics_and_Laboratory_Medicine_3")
        == "Diagnostics_and_Laboratory_Medicine"
    )
    assert subject_of("dev_Art_1") == "Art"
    assert SUBJECT_DOMAIN["Art_Theory"] == "Art and Design"
    with pytest.raises(ValueError, match="validation_Cooking_1"):
        subject_of("validation_Cooking_1")
    assert len(SUBJECTS) == 30 and sum(len(v) for v in DOMAINS.values()) == 30


def test_wilson_by_hand():
    # Wilson 95 %: (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z = 1.959964
    k, n, z = 25, 60, 1.959963984540054
    p = k / n
    c = (p + z * z / (2 * n)) / (1 + z * z / n)
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(c - h, abs=1e-9) and hi == pytest.approx(c + h, abs=1e-9)
    assert wilson(0, 0) == (None, None)


def test_unparsed_counts_and_warning():
    r = recs("Art", {"correct": 2, "unparsed": 1, "wrong": 1})
    res, sc = summarize(r, Params())
    assert res.metrics["mmmu_unparsed_count"] == 1 and res.metrics["mmmu_overall_acc"] == 0.5
    assert res.status == "ok" and "1 of 4" in res.warnings[0]


# The PR's "Before" block (as printed in sglang PR #9460's description), from "Evaluating..." on.
PR_BEFORE = """Evaluating...
{'Accounting': {'acc': 0.433, 'num': 30},
 'Agriculture': {'acc': 0.533, 'num': 30},
 'Architecture_and_Engineering': {'acc': 0.367, 'num': 30},
 'Art': {'acc': 0.567, 'num': 30},
 'Art_Theory': {'acc': 0.7, 'num': 30},
 'Basic_Medical_Science': {'acc': 0.667, 'num': 30},
 'Biology': {'acc': 0.367, 'num': 30},
 'Chemistry': {'acc': 0.267, 'num': 30},
 'Clinical_Medicine': {'acc': 0.4, 'num': 30},
 'Computer_Science': {'acc': 0.3, 'num': 30},
 'Design': {'acc': 0.633, 'num': 30},
 'Diagnostics_and_Laboratory_Medicine': {'acc': 0.433, 'num': 30},
 'Economics': {'acc': 0.3, 'num': 30},
 'Electronics': {'acc': 0.133, 'num': 30},
 'Energy_and_Power': {'acc': 0.4, 'num': 30},
 'Finance': {'acc': 0.267, 'num': 30},
 'Geography': {'acc': 0.3, 'num': 30},
 'History': {'acc': 0.733, 'num': 30},
 'Literature': {'acc': 0.833, 'num': 30},
 'Manage': {'acc': 0.3, 'num': 30},
 'Marketing': {'acc': 0.5, 'num': 30},
 'Materials': {'acc': 0.433, 'num': 30},
 'Math': {'acc': 0.333, 'num': 30},
 'Mechanical_Engineering': {'acc': 0.367, 'num': 30},
 'Music': {'acc': 0.233, 'num': 30},
 'Overall': {'acc': 0.452, 'num': 900},
 'Overall-Art and Design': {'acc': 0.533, 'num': 120},
 'Overall-Business': {'acc': 0.36, 'num': 150},
 'Overall-Health and Medicine': {'acc': 0.533, 'num': 150},
 'Overall-Humanities and Social Science': {'acc': 0.7, 'num': 120},
 'Overall-Science': {'acc': 0.327, 'num': 150},
 'Overall-Tech and Engineering': {'acc': 0.362, 'num': 210},
 'Pharmacy': {'acc': 0.6, 'num': 30},
 'Physics': {'acc': 0.367, 'num': 30},
 'Psychology': {'acc': 0.6, 'num': 30},
 'Public_Health': {'acc': 0.567, 'num': 30},
 'Sociology': {'acc': 0.633, 'num': 30}}
eval out saved to ./val_sglang.json
Overall accuracy: 0.452"""


def pr_records() -> list[dict]:
    """900 records whose per-subject correct counts are the PR's accuracies x 30."""
    out = []
    for line in PR_BEFORE.splitlines():
        if "'num': 30}" in line:
            name = line.split("'")[1]
            acc = float(line.split("'acc': ")[1].split(",")[0])
            k = round(acc * 30)
            out += recs(name, {"correct": k, "wrong": 30 - k})
    return out


def test_block_reproduces_the_pr_text(tmp_path: Path):
    r = pr_records()
    assert len(r) == 900
    res, sc = summarize(r, Params(protocol="sglang-2025"))
    block = format_block(val_dict(sc))
    assert block.endswith(PR_BEFORE)  # domain and overall rows recomputed
    assert res.metrics["mmmu_overall_acc"] == pytest.approx(407 / 900)
    # report_block from the folder alone
    r2 = [dict(x, question_type="multiple-choice", response="A", parsed="A", gold="A") for x in r]
    write_outputs(tmp_path, r2, sc)
    (tmp_path / "summary.json").write_text(json.dumps(res.to_json("mmmu")))
    text = report_block(tmp_path)
    assert PR_BEFORE in text and "protocol sglang-2025, parser official, seed 42" in text


def test_val_dict_order_and_answer_shape():
    r = recs("Math", {"correct": 1}) + recs("Art", {"wrong": 1})
    sc = tally(r)
    assert list(val_dict(sc)) == [
        "Overall-Art and Design",
        "Art",
        "Overall-Science",
        "Math",
        "Overall",
    ]
    a = answer_dict(
        [
            {
                "id": "validation_Art_1",
                "question_type": "multiple-choice",
                "response": "(B) x",
                "parsed": "B",
                "gold": "B",
                "verdict": "correct",
            },
            {
                "id": "validation_Math_1",
                "question_type": "open",
                "response": None,
                "parsed": None,
                "gold": "3",
                "verdict": "failed",
            },
        ]
    )
    assert a["validation_Art_1"] == {
        "pred_ans": "B",
        "original_response": "(B) x",
        "ground_truth": "B",
        "question_type": "multiple-choice",
        "judge": "Correct",
    }
    assert a["validation_Math_1"]["judge"] == "Wrong"


def test_tally_rejects_unknown_verdict():
    with pytest.raises(ValueError, match="verdict 'maybe'"):
        Tally().add("maybe")


def test_unparsed_kinds_are_counted_per_subject_and_overall():
    from patchbench.suites.mmmu.scoring import score_response, tally

    opts = {"A": "red", "B": "blue"}
    kw = dict(
        question_type="multiple-choice",
        gold="A",
        all_choices=["A", "B"],
        index2ans=opts,
        parser="strict",
        rng=None,
    )
    resp = ["I cannot see the image.", "Either (A) or (B).", "Answer: a", "The answer is (B), (A)."]
    scored = [score_response(r, **kw) for r in resp]
    assert [(s.verdict, s.unparsed_kind) for s in scored] == [
        ("unparsed", "no_answer"),
        ("unparsed", "ambiguous"),
        ("correct", None),
        ("unparsed", "ambiguous"),
    ]
    recs = [
        {"id": f"validation_Art_{i}", "verdict": s.verdict, "unparsed_kind": s.unparsed_kind}
        for i, s in enumerate(scored)
    ]
    recs.append({"id": "validation_Math_1", "verdict": "unparsed"})  # an old record: no kind
    d = tally(recs).as_dict()
    assert (d["overall"]["unparsed"], d["overall"]["no_answer"], d["overall"]["ambiguous"]) == (
        4,
        2,
        2,
    )
    assert (d["subjects"]["Art"]["no_answer"], d["subjects"]["Art"]["ambiguous"]) == (1, 2)
    assert d["subjects"]["Math"]["no_answer"] == 1
