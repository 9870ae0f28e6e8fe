"""Demo questions (schema, answers checked against the pictures) and dataset loading paths."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from patchbench.suites.mmmu import Params
from patchbench.suites.mmmu.data import SUBJECT_DOMAIN, DatasetUnavailable, load_questions
from patchbench.suites.mmmu.demo_data import COLOURS, generate, generate_rows

FIELDS = [
    "id",
    "question",
    "options",
    "explanation",
    *[f"image_{i}" for i in range(1, 8)],
    "img_type",
    "answer",
    "topic_difficulty",
    "question_type",
    "subfield",
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("demo")
    counts = generate(d, n=63, seed=0)
    assert sum(counts.values()) == 63
    return d


def test_schema_and_variety(demo):
    rows = [r for rs in generate_rows(63, 0).values() for r in rs]
    assert all(list(r) == FIELDS for r in rows)
    subjects = {r["id"].rsplit("_", 1)[0].removeprefix("validation_") for r in rows}
    assert len(subjects) == 7 and len({SUBJECT_DOMAIN[s] for s in subjects}) == 6
    assert all(isinstance(ast.literal_eval(r["options"]), list) for r in rows)
    n_images = [sum(r[f"image_{i}"] is not None for i in range(1, 8)) for r in rows]
    assert max(n_images) == 5 and sum(n > 1 for n in n_images) >= 18
    assert sum(r["question_type"] == "open" for r in rows) >= 18
    assert any(o.startswith("<image") for r in rows for o in ast.literal_eval(r["options"]))
    assert generate_rows(63, 0)["Art"][0]["answer"] == generate_rows(63, 0)["Art"][0]["answer"]


def test_answers_match_the_pictures(demo):
    qs = load_questions("MMMU/MMMU", demo, "validation", list(SUBJECT_DOMAIN), None)
    assert len(qs) == 63
    checked = 0
    for q in qs:
        if q.subject == "Art":  # colour of the shape, read from the centre pixel
            px = q.images[1].convert("RGB").getpixel((112, 112))
            answer = q.options[ord(q.answer) - 65]
            assert px == COLOURS[answer], q.id
            checked += 1
        if q.subject == "Math":  # count black blobs independently (scipy connected components)
            a = np.asarray(q.images[1].convert("L")) < 128
            n = ndimage.label(a)[1]
            gold = int(q.answer) if q.is_open else int(q.options[ord(q.answer) - 65])
            assert n == gold, q.id
            checked += 1
        if q.subject == "History":
            counts = [ndimage.label(np.asarray(q.images[i].convert("L")) < 128)[1] for i in (1, 2)]
            assert q.answer == ("A" if counts[0] > counts[1] else "B"), q.id
        if q.subject == "Music":  # the option image's colour is the colour named in image 1
            opt_img = int(q.options[ord(q.answer) - 65].split()[1].rstrip(">"))
            px = q.images[opt_img].convert("RGB").getpixel((112, 112))
            assert px in COLOURS.values()
            others = [
                q.images[int(o.split()[1].rstrip(">"))].convert("RGB").getpixel((112, 112))
                for o in q.options
                if o != q.options[ord(q.answer) - 65]
            ]
            assert px not in others
    assert checked == 18
    modes = {q.images[1].mode for q in qs if q.subject == "Math"}
    assert {"L", "RGBA"} <= modes  # the suite must convert these to RGB


def test_limit_is_round_robin_over_subjects(demo):
    qs = load_questions("MMMU/MMMU", demo, "validation", ["Art", "Math", "Music"], 5)
    assert [q.id for q in qs] == [
        "validation_Art_1",
        "validation_Art_2",
        "validation_Math_1",
        "validation_Math_2",
        "validation_Music_1",
    ]


def test_save_to_disk_copy_loads_too(demo, tmp_path):
    import datasets

    parts = [
        datasets.load_dataset("parquet", data_files=str(p), split="train")
        for p in sorted(demo.glob("*/validation-*.parquet"))
    ]
    datasets.DatasetDict({"validation": datasets.concatenate_datasets(parts)}).save_to_disk(
        str(tmp_path / "saved")
    )
    qs = load_questions("MMMU/MMMU", tmp_path / "saved", "validation", ["Music", "Art"], None)
    assert len(qs) == 18 and {q.subject for q in qs} == {"Music", "Art"}
    assert qs[0].subject == "Music"  # the subject order asked for


def test_errors(tmp_path, demo):
    with pytest.raises(DatasetUnavailable, match="does not exist"):
        load_questions("MMMU/MMMU", tmp_path / "missing", "validation", ["Art"])
    with pytest.raises(DatasetUnavailable, match=r"no 'test' questions"):
        load_questions("MMMU/MMMU", demo, "test", ["Art"])
    with pytest.raises(ValueError, match="unknown MMMU subjects"):
        load_questions("MMMU/MMMU", demo, "validation", ["Cooking"])


def test_params():
    p = Params()
    assert p.parser == "strict" and len(p.subjects) == 30 and p.max_tokens == 30
    assert p.concurrency == 16 and p.temperature == 0
    assert Params(protocol="sglang-2025").parser == "official"
    assert Params(protocol="sglang-2025", parser="strict").parser == "strict"
    with pytest.raises(ValueError, match="unknown subjects"):
        Params(subjects=["Cooking"])
    with pytest.raises(ValueError, match="extra"):
        Params(max_token=3)
