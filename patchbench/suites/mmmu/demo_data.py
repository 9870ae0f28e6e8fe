"""Generated demo questions in the MMMU schema with known answers: simple pictures drawn with
Pillow (one kind per subject; the Music kind has images as options, as the real five-image
question) in the hub's parquet layout, loaded through ``dataset_path`` like a local copy of
MMMU/MMMU; deterministic for a given ``(n, seed)``.
CLI: ``python -m patchbench.suites.mmmu.demo_data OUT_DIR [--n N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from patchbench.suites.mmmu.data import quiet_datasets

SPLIT = "validation"
COLOURS = {
    "red": (220, 30, 30),
    "blue": (30, 60, 220),
    "green": (30, 160, 60),
    "yellow": (235, 200, 20),
    "purple": (130, 40, 170),
    "orange": (240, 130, 20),
}
SHAPES = ["circle", "square", "triangle", "diamond"]
WORDS = "apple river stone cloud piano tiger lemon rocket garden candle mirror planet".split()
SIZE = 224

SUBJECT_KINDS: list[tuple[str, str]] = [
    ("Art", "colour"),
    ("Basic_Medical_Science", "shape"),
    ("Math", "count"),
    ("Computer_Science", "read"),
    ("Accounting", "add"),
    ("History", "compare"),
    ("Music", "pick_image"),
]


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no scalable default font
        return ImageFont.load_default()


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    img = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    return img, ImageDraw.Draw(img)


def _shape(
    draw: ImageDraw.ImageDraw,
    shape: str,
    box: tuple[int, int, int, int],
    fill: tuple[int, int, int],
) -> None:
    x0, y0, x1, y1 = box
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    elif shape == "triangle":
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=fill)
    elif shape == "diamond":
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        draw.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def shape_image(shape: str, colour: str) -> Image.Image:
    """One filled ``shape`` of ``colour`` in the middle of a white 224x224 RGB image."""
    img, d = _canvas()
    _shape(d, shape, (40, 40, SIZE - 40, SIZE - 40), COLOURS[colour])
    return img


def dots_image(n: int, rng: random.Random, mode: str = "RGB") -> Image.Image:
    """``n`` black dots (radius 10) on a 4x4 grid, at distinct random cells. ``mode`` "L" or "RGBA"
    gives a grayscale / transparent image (the suite must convert those to RGB)."""
    cells = rng.sample(range(16), n)
    img, d = _canvas()
    for c in cells:
        cx, cy = 28 + (c % 4) * 56, 28 + (c // 4) * 56
        d.ellipse((cx - 10, cy - 10, cx + 10, cy + 10), fill=(0, 0, 0))
    if mode == "RGBA":
        rgba = img.convert("RGBA")
        rgba.putalpha(255)
        return rgba
    return img.convert(mode)


def text_image(text: str) -> Image.Image:
    """``text`` printed in black, large, on a white 224x224 image."""
    img, d = _canvas()
    d.text((SIZE // 2, SIZE // 2), text, fill=(0, 0, 0), font=_font(36), anchor="mm")
    return img


#: what a question maker returns: (question, options literal, answer, question_type, images, subfield)
Made = tuple[str, str, str, str, list, str]


def _mc(question: str, options: list[str], right: int, images: list, subfield: str) -> Made:
    """A multiple-choice question; ``right``: the index of the right option."""
    return question, repr(options), chr(ord("A") + right), "multiple-choice", images, subfield


def _open(question: str, answer: str, images: list, subfield: str) -> Made:
    """An open question (no options)."""
    return question, "[]", answer, "open", images, subfield


def _ask_colour(k: int, rng: random.Random) -> Made:
    """Which of four colours is the shape."""
    colours = rng.sample(sorted(COLOURS), 4)
    right = rng.randrange(4)
    img = shape_image(rng.choice(SHAPES), colours[right])
    return _mc("What colour is the shape in <image 1>?", colours, right, [img], "Colour")


def _ask_shape(k: int, rng: random.Random) -> Made:
    """Which shape is drawn."""
    right = rng.randrange(4)
    img = shape_image(SHAPES[right], rng.choice(sorted(COLOURS)))
    return _mc("<image 1> Which shape is drawn in the picture?", SHAPES, right, [img], "Morphology")


def _ask_count(k: int, rng: random.Random) -> Made:
    """How many dots (RGB, grayscale or RGBA by ``k``): open for odd ``k``, else multiple choice."""
    n = rng.randint(1, 9)
    images = [dots_image(n, rng, ["RGB", "L", "RGBA"][k % 3])]
    question = "How many black dots are there in <image 1>?"
    if k % 2:
        return _open(question, str(n), images, "Counting")
    choices = sorted({n, *rng.sample([x for x in range(1, 10) if x != n], 3)})
    return _mc(question, [str(c) for c in choices], choices.index(n), images, "Counting")


def _ask_read(k: int, rng: random.Random) -> Made:
    """Which word is printed (open)."""
    word = rng.choice(WORDS)
    return _open(
        "Which word is printed in <image 1>?",
        word,
        [text_image(word)],
        "Optical character recognition",
    )


def _ask_add(k: int, rng: random.Random) -> Made:
    """The sum of two printed dollar amounts (open)."""
    a, b = rng.randint(100, 4000), rng.randint(100, 4000)
    return _open(
        "An invoice lists the amounts in <image 1> and <image 2>. What is the total in dollars?",
        str(a + b),
        [text_image(f"${a}"), text_image(f"${b}")],
        "Financial accounting",
    )


def _ask_compare(k: int, rng: random.Random) -> Made:
    """Which of two images has more dots (the options are the images)."""
    a, b = rng.sample(range(1, 10), 2)
    images = [dots_image(a, rng), dots_image(b, rng)]
    question = "Which image has more black dots? <image 1> <image 2>"
    return _mc(question, ["<image 1>", "<image 2>"], 0 if a > b else 1, images, "Cartography")


def _ask_pick_image(k: int, rng: random.Random) -> Made:
    """Image 1 names a colour; which of four squares (images 2..5, shuffled) shows it."""
    n_opts = 4
    colours = rng.sample(sorted(COLOURS), n_opts)
    target = rng.randrange(n_opts)
    order = list(range(n_opts))
    rng.shuffle(order)  # option i shows image order[i] + 2
    images = [text_image(colours[target])] + [
        shape_image("square", colours[i]) for i in sorted(range(n_opts), key=lambda i: order[i])
    ]
    return _mc(
        "<image 1> Which option shows a square of the colour named in the first image?",
        [f"<image {order[i] + 2}>" for i in range(n_opts)],
        target,
        images,
        "Music notation",
    )


#: demo kind -> its question maker ``(k, rng) -> row without id``
MAKERS = {
    "colour": _ask_colour,
    "shape": _ask_shape,
    "count": _ask_count,
    "read": _ask_read,
    "add": _ask_add,
    "compare": _ask_compare,
    "pick_image": _ask_pick_image,
}


def generate_rows(n: int = 63, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """``n`` questions as rows of the MMMU schema, ``{subject: [row, ...]}``, round-robin over the
    seven subjects. Images are PIL images. Raises ValueError when ``n < 1``."""
    if n < 1:
        raise ValueError(f"n={n}: at least one question")
    rng = random.Random(seed)
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s, _ in SUBJECT_KINDS}
    for i in range(n):
        subject, kind = SUBJECT_KINDS[i % len(SUBJECT_KINDS)]
        k = len(rows[subject]) + 1
        question, options, answer, qtype, imgs, subfield = MAKERS[kind](k, rng)
        row: dict[str, Any] = {
            "id": f"{SPLIT}_{subject}_{k}",
            "question": question,
            "options": options,
            "explanation": "",
        }
        row |= {f"image_{j}": imgs[j - 1] if j <= len(imgs) else None for j in range(1, 8)}
        row |= {
            "img_type": repr(["Diagrams"]),
            "answer": answer,
            "topic_difficulty": ["Easy", "Medium", "Hard"][k % 3],
            "question_type": qtype,
            "subfield": subfield,
        }
        rows[subject].append(row)
    return {s: r for s, r in rows.items() if r}


def features():
    """The ``datasets.Features`` of an MMMU subject (images as ``datasets.Image``)."""
    import datasets

    f = {k: datasets.Value("string") for k in ("id", "question", "options", "explanation")}
    for j in range(1, 8):
        f[f"image_{j}"] = datasets.Image()
    for k in ("img_type", "answer", "topic_difficulty", "question_type", "subfield"):
        f[k] = datasets.Value("string")
    return datasets.Features(f)


def generate(out_dir: str | Path, n: int = 63, seed: int = 0) -> dict[str, int]:
    """Write ``n`` demo questions under ``out_dir`` (files replaced atomically); returns
    ``{subject: question count}``. Raises ValueError when ``n < 1``."""
    import datasets

    counts: dict[str, int] = {}
    with quiet_datasets():
        for subject, rows in generate_rows(n, seed).items():
            cols = {k: [r[k] for r in rows] for k in rows[0]}
            ds = datasets.Dataset.from_dict(cols, features=features())
            target = Path(out_dir) / subject / f"{SPLIT}-00000-of-00001.parquet"
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.tmp")
            ds.to_parquet(str(tmp))
            os.replace(tmp, target)
            counts[subject] = len(rows)
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m patchbench.suites.mmmu.demo_data", description=__doc__.split("\n")[0]
    )
    ap.add_argument("out_dir")
    ap.add_argument("--n", type=int, default=63)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    counts = generate(a.out_dir, a.n, a.seed)
    print(f"wrote {sum(counts.values())} questions to {a.out_dir}: {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
