"""The strict parser against a hand-labelled corpus (tests/data/mmmu-strict-corpus).

``corpus.jsonl``: one free-text response a line, ``{"id", "family", "options", "response",
"label"}``; ``options`` names an option set of ``options.json`` (letter -> text); ``label`` is what
a person grading the response gives: the option letter, ``no_answer`` (no option given) or
``ambiguous`` (several options left standing, no single commitment). The labels were written with
the responses, before the parser was run on them; docs/mmmu.md states the policy they follow.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from patchbench.suites.mmmu import parsers as P

DATA = Path(__file__).parent.parent / "data" / "mmmu-strict-corpus"
OPTIONS = json.loads((DATA / "options.json").read_text())
CORPUS = [json.loads(line) for line in (DATA / "corpus.jsonl").read_text().splitlines()]
FAMILIES = sorted({x["family"] for x in CORPUS})


def grade(item: dict) -> str:
    opts = OPTIONS[item["options"]]
    r = P.parse_strict_detail(item["response"], list(opts), opts)
    assert (r.letter is None) == (r.status != "answer")
    return r.letter or r.status


def test_corpus_shape():
    assert len(CORPUS) >= 300
    assert len({x["id"] for x in CORPUS}) == len(CORPUS)
    counts = Counter(x["family"] for x in CORPUS)
    assert set(counts) == {
        "commitment",
        "revision",
        "sentence_one_option",
        "option_text",
        "echoed_list",
        "rejection",
        "refusal",
        "truncation",
        "multi_option",
        "reasoning_block",
        "case_markup",
        "commitment_discussion",
        "text_answer",
    }
    assert min(counts.values()) >= 20
    for x in CORPUS:
        opts = OPTIONS[x["options"]]
        assert x["label"] in list(opts) + ["no_answer", "ambiguous"], x["id"]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_agrees_with_every_label(family):
    items = [x for x in CORPUS if x["family"] == family]
    wrong = [
        (x["id"], x["response"], x["label"], grade(x)) for x in items if grade(x) != x["label"]
    ]
    assert wrong == []


def test_every_outcome_kind_is_present():
    labels = Counter(
        x["label"] if x["label"] in ("no_answer", "ambiguous") else "letter" for x in CORPUS
    )
    assert labels["letter"] >= 150 and labels["no_answer"] >= 40 and labels["ambiguous"] >= 20


COLORS = {"A": "red", "B": "blue", "C": "green", "D": "yellow"}


@pytest.mark.parametrize(
    "resp,want",
    [
        # the multi-option policy (docs/mmmu.md): several options as the answer -> ambiguous ...
        ("The correct answer is (B), (C), and (D).", ("ambiguous", "multi-option commitment")),
        ("Answer: A or C", ("ambiguous", "multi-option commitment")),
        ("(A) and (D)", ("ambiguous", "multi-option commitment")),
        # ... unless a later single commitment settles it
        ("The correct answer is (B), (C), and (D).\nFinal answer: C", ("C", "commitment")),
    ],
)
def test_multi_option_policy(resp, want):
    r = P.parse_strict_detail(resp, list(COLORS), COLORS)
    assert (r.letter or r.status, r.rule) == want


def test_rejected_and_discussed_options_get_no_credit():
    for resp in [
        "For option B we have a cool hue.",
        "Option (B) blue is for water, so it is incorrect here.",
        "(B) can be ruled out.",
        "It is not (B).",
    ]:
        assert P.parse_strict_detail(resp, list(COLORS), COLORS).letter is None, resp


def test_deterministic():
    first = [grade(x) for x in CORPUS]
    assert [grade(x) for x in reversed(CORPUS)] == first[::-1]


def test_benchmark_script_runs(capsys):
    import importlib.util

    path = Path(__file__).parents[2] / "scripts" / "bench_mmmu_parser.py"
    spec = importlib.util.spec_from_file_location("bench_mmmu_parser", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--rounds", "1", "-n", "40"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["corpus", "llava"]
    assert all("40 responses in" in line for line in out)


CELL = {
    "A": "Mitochondria",
    "B": "Nucleus",
    "C": "Ribosome",
    "D": "Golgi apparatus",
    "E": "Endoplasmic reticulum",
}
NUMS = {"A": "10", "B": "100", "C": "1000", "D": "0.1"}
SPEED = {"A": "5 m/s", "B": "15 m/s", "C": "50 m/s", "D": "0.5 m/s"}
MATH = {"A": "$\\frac{1}{2}$", "B": "$\\frac{1}{4}$", "C": "$\\sqrt{2}$", "D": "$2\\pi$"}
STYLES = {"A": "Impressionism", "B": "Post-Impressionism", "C": "Cubism", "D": "Fauvism"}


@pytest.mark.parametrize(
    "opts,resp,want",
    [
        # a line of one label and its own text commits; what follows discusses the others
        (CELL, "(A) Mitochondria\n\n(B) Nucleus would show pores; (C) is too small.", "A"),
        (CELL, "Option D: Golgi apparatus.\n\nOption A, mitochondria, would show cristae.", "D"),
        (CELL, "B. Nucleus\n\nA. Mitochondria: would show cristae.\nC. Ribosome: too small.", "B"),
        # a label beside its own text is one mention; "X would ..." discusses X
        (CELL, "It is the Golgi apparatus. It is not the nucleus (B), nor the ER (E).", "D"),
        (NUMS, "The total is 1000. B (100) would be the total after one step.", "C"),
        (NUMS, "The value is 1000, not 100.", "C"),
        (CELL, "I think option B is wrong.", "no_answer"),
        # option texts: hyphen or space alike, units and LaTeX read one way
        (STYLES, "post impressionism", "B"),
        (STYLES, "The painting belongs to Post Impressionism, not Impressionism.", "B"),
        (SPEED, "The answer is 15 meters per second.", "B"),
        (SPEED, "15m/s", "B"),
        (NUMS, "1,000", "C"),
        ({"A": "red", "B": "red and blue", "C": "blue"}, "Red & Blue", "B"),
        ({"A": "red", "B": "blue"}, "A & B", "ambiguous"),
        (
            {"A": "The demand curve shifts left", "B": "The demand curve shifts right"},
            "demand curve shifts right",
            "B",
        ),
        (MATH, "The probability is 1/4.", "B"),
        (MATH, "sqrt(2)", "C"),
        (MATH, "\\(2\\pi\\)", "D"),
        # answer phrases of other languages
        (CELL, "正确答案：C", "C"),
        (CELL, "我选择B，因为图中有核孔。", "B"),
        (CELL, "A resposta correta é a C.", "C"),
        (CELL, "La respuesta es A, no B.", "A"),
        (CELL, "Die Antwort lautet C.", "C"),
        (CELL, "Правильный ответ: A", "A"),
        (CELL, "答案是 A 或 B。", "ambiguous"),
        (CELL, "Die Antwort ist nicht A.", "no_answer"),
        # options by position; a number only where no option's text is a number
        (CELL, "I'd go with option #2", "B"),
        (CELL, "The answer is the second option.", "B"),
        (CELL, "the last option", "E"),
        (CELL, "Option 3 is incorrect.", "no_answer"),
        (NUMS, "Option 3", "no_answer"),
        # elimination and hedged lists
        (CELL, "A is wrong; B is wrong; D is wrong. That leaves C.", "C"),
        (CELL, "Option A is wrong. The correct one is E.", "E"),
        (CELL, "That leaves C and D.", "ambiguous"),
        (CELL, "I think it's A or maybe D.", "ambiguous"),
        (CELL, "I'm going with B. Options A, C and D don't match.", "B"),
    ],
)
def test_rules_beyond_the_corpus(opts, resp, want):
    r = P.parse_strict_detail(resp, list(opts), opts)
    assert (r.letter or r.status) == want
