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

DATA = Path(__file__).parent / "data" / "mmmu-strict-corpus"
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
        assert P.parse_strict(resp, list(COLORS), COLORS) is None, resp


def test_deterministic():
    first = [grade(x) for x in CORPUS]
    assert [grade(x) for x in reversed(CORPUS)] == first[::-1]


def test_benchmark_script_runs(capsys):
    import importlib.util

    path = Path(__file__).parent.parent / "scripts" / "bench_mmmu_parser.py"
    spec = importlib.util.spec_from_file_location("bench_mmmu_parser", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--rounds", "1", "-n", "40"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["corpus", "llava"]
    assert all("40 responses in" in line for line in out)
