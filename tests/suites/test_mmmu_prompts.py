"""Prompt building on real MMMU questions (tests/data/mmmu-samples) and on generated ones."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

import pytest
from PIL import Image

from patchbench.suites.mmmu.data import Question, parse_options
from patchbench.suites.mmmu.prompts import (
    PromptError,
    build_messages,
    png_data_url,
    prompt_sha256,
    prompt_text,
)

SAMPLES = Path(__file__).parent.parent / "data" / "mmmu-samples"


def load_samples() -> list[Question]:
    out = []
    for i, line in enumerate((SAMPLES / "data.jsonl").read_text().splitlines()):
        row = json.loads(line)
        images = {
            n: Image.open(SAMPLES / row[f"image_{n}"])
            for n in range(1, 11)
            if row.get(f"image_{n}")
        }
        qid = next((Path(row["image_1"]).stem.rsplit("_", 1)[0] for _ in [0]), f"q{i}")
        out.append(
            Question(
                id=qid,
                subject="Music",
                question=row["question"],
                options=parse_options(row["options"], qid),
                answer=row["answer"],
                question_type="multiple-choice",
                images=images,
            )
        )
    return out


def decode(url: str) -> Image.Image:
    assert url.startswith("data:image/png;base64,")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


@pytest.fixture(scope="module")
def music() -> Question:
    return next(q for q in load_samples() if q.id == "test_Music_251")


def test_five_image_music_question(music):
    msgs, sha, n = build_messages(music)
    parts = msgs[0]["content"]
    kinds = [p["type"] for p in parts]
    # <image 1> first, then "... (A) " <image 4>, "(B) " <image 2>, "(C) " <image 5>,
    # "(D) " <image 3>
    assert kinds == [
        "image_url",
        "text",
        "image_url",
        "text",
        "image_url",
        "text",
        "image_url",
        "text",
        "image_url",
        "text",
    ]
    assert n == 5
    texts = [p["text"] for p in parts if p["type"] == "text"]
    assert texts[0] == " is a substitution for how many parts of the basic division?\n\n(A) "
    assert texts[1:4] == ["\n(B) ", "\n(C) ", "\n(D) "]
    assert texts[4] == "\n\nAnswer with the option's letter from the given choices directly."
    assert not any("<image" in t for t in texts)
    sent = [decode(p["image_url"]["url"]) for p in parts if p["type"] == "image_url"]
    order = [1, 4, 2, 5, 3]
    for img, n_img in zip(sent, order, strict=True):
        src = Image.open(SAMPLES / f"images/test_Music_251_{n_img}.png")
        assert img.mode == "RGB" and img.size == src.size
        assert img.tobytes() == src.convert("RGB").tobytes()
    assert len(sha) == 64 and sha == prompt_sha256(msgs)


def test_sglang_2025_protocol_sends_first_image_only(music):
    msgs, _, n = build_messages(music, protocol="sglang-2025")
    parts = msgs[0]["content"]
    assert n == 1 and [p["type"] for p in parts] == ["text", "image_url", "text"]
    assert parts[0]["text"] == ""
    # the script's prompt.split(">")[1]: the text up to the next ">"
    assert parts[2]["text"] == (
        " is a substitution for how many parts of the basic division?\n\n(A) <image 4"
    )
    assert decode(parts[1]["image_url"]["url"]).size == (252, 154)


def test_all_samples_build_and_modes_convert():
    qs = load_samples()
    assert len(qs) == 21
    for q in qs:
        msgs, sha, n = build_messages(q)
        text = "".join(p.get("text", "") for p in msgs[0]["content"])
        assert "<image" not in text
        assert n == len(re.findall(r"<image (\d+)>", prompt_text(q)))
    gray = Image.open(SAMPLES / "images/validation_Energy_and_Power_24_1.png")
    assert gray.mode == "L" and decode(png_data_url(gray)).mode == "RGB"
    pal = Image.new("P", (4, 4))
    assert decode(png_data_url(pal)).mode == "RGB"


def test_prompt_text_shapes():
    q = Question(
        id="validation_Art_1",
        subject="Art",
        question="Q?",
        options=["x", "y"],
        answer="A",
        question_type="multiple-choice",
    )
    assert prompt_text(q) == (
        "Q?\n\n(A) x\n(B) y\n\nAnswer with the option's letter from the given choices directly."
    )
    o = Question(
        id="validation_Art_2",
        subject="Art",
        question="Q?",
        options=[],
        answer="3",
        question_type="open",
    )
    assert prompt_text(o) == "Q?\n\nAnswer the question using a single word or phrase."
    msgs, sha1, n = build_messages(o)
    assert n == 0 and msgs[0]["content"] == [{"type": "text", "text": prompt_text(o)}]
    _, sha2, _ = build_messages(o, open_template="{question}\nOne word.")
    assert sha1 != sha2


def test_missing_image_is_an_error():
    q = Question(
        id="validation_Art_3",
        subject="Art",
        question="See <image 2>",
        options=[],
        answer="x",
        question_type="open",
        images={1: Image.new("RGB", (2, 2))},
    )
    with pytest.raises(PromptError, match=r"validation_Art_3.*<image 2>.*image_2 is empty"):
        build_messages(q)


def test_options_literal_parsing():
    assert parse_options("['$6', '$7']") == ["$6", "$7"]
    assert parse_options("[]") == []
    with pytest.raises(ValueError, match="validation_Art_9"):
        parse_options("not a list", "validation_Art_9")


# ------------------------------------------------------------------------------------------
# images the text never names
# ------------------------------------------------------------------------------------------


def _three_image_question() -> Question:
    imgs = {n: Image.new("RGB", (4 + n, 4), (40 * n, 0, 0)) for n in (1, 2, 3)}
    return Question(
        id="validation_Art_1",
        subject="Art",
        question="Which <image 1> is red?",
        options=["a", "b"],
        answer="A",
        question_type="multiple-choice",
        images=imgs,
    )


def test_unreferenced_images_follow_the_text_in_order():
    from patchbench.suites.mmmu.prompts import unreferenced_images

    q = _three_image_question()
    msgs, _, n = build_messages(q)
    parts = msgs[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url", "image_url"]
    assert n == 3
    # widths 5, 6, 7 identify images 1, 2, 3
    assert [decode(p["image_url"]["url"]).size[0] for p in parts if p["type"] == "image_url"] == [
        5,
        6,
        7,
    ]
    assert unreferenced_images(q, prompt_text(q)) == [2, 3]
    # the PR's protocol still sends image_1 only
    _, _, n_pr = build_messages(q, protocol="sglang-2025")
    assert n_pr == 1


@pytest.mark.parametrize("protocol,unref,not_sent", [("patchbench", 1, 0), ("sglang-2025", 1, 1)])
def test_unreferenced_and_not_sent_are_counted(monkeypatch, protocol, unref, not_sent):
    from patchbench.suites.mmmu import bench, scoring
    from patchbench.suites.mmmu.client import Outcome
    from patchbench.suites.mmmu.params import Params

    q = _three_image_question()
    q2 = Question(
        id="validation_Art_2",
        subject="Art",
        question="<image 1> colour?",
        options=["a", "b"],
        answer="B",
        question_type="multiple-choice",
        images={1: Image.new("RGB", (4, 4))},
    )
    monkeypatch.setattr(bench, "load_questions", lambda *a, **k: [q, q2])
    params = Params(protocol=protocol, parser="strict")
    prepared = bench.prepare(params, None)
    assert [p["images_unreferenced"] for p in prepared] == [[2, 3], []]
    records = bench.score_records(
        prepared, [Outcome("A", None, 0.1), Outcome("b", None, 0.1)], params
    )
    assert [r["n_images"] for r in records] == [3, 1]
    result, sc = scoring.summarize(records, params)
    assert result.meta["images_unreferenced_questions"] == unref
    assert result.meta["images_not_sent_questions"] == not_sent
    assert result.metrics["mmmu_images_not_sent_count"] == not_sent
    art = sc.as_dict()["subjects"]["Art"]
    assert (art["images_unreferenced"], art["images_not_sent"]) == (unref, not_sent)
    assert result.metrics["mmmu_correct_count"] == 2
