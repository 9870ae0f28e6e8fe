"""Chat messages for MMMU questions, and their hashes.

Protocols: ``"patchbench"``: the MMMU repository's prompt text (sglang's
``benchmark/mmmu/prompt_format.yaml``), images placed as docs/mmmu.md, "Images", states.
``"sglang-2025"``: what the PR's ``bench_sglang.py`` sent: ``prompt.split("<")[0]``, image_1 only,
``prompt.split(">")[1]`` (its own truncation, reproduced on purpose; a prompt without ``<`` or
``>`` is one text part). Images are PNG data URLs, converted to RGB (alpha dropped, as PIL does).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Callable
from typing import Any

from PIL import Image

from patchbench.suites.mmmu.data import IMAGE_TAG, Question

DEFAULT_MC_TEMPLATE = (
    "{question}\n\n{options}\n\nAnswer with the option's letter from the given choices directly."
)
DEFAULT_OPEN_TEMPLATE = "{question}\n\nAnswer the question using a single word or phrase."
DEFAULT_OPTION_FORMAT = "({letter}) {text}"

PROTOCOLS = ("patchbench", "sglang-2025")


class PromptError(ValueError):
    """A question that cannot be turned into a prompt (e.g. a placeholder without its image)."""


def png_data_url(img: Any) -> str:
    """A PIL image (or raw image bytes) as ``data:image/png;base64,...``, converted to RGB."""
    if isinstance(img, (bytes, bytearray)):
        img = Image.open(io.BytesIO(img))
    elif isinstance(img, dict) and img.get("bytes") is not None:  # datasets' undecoded form
        img = Image.open(io.BytesIO(img["bytes"]))
    if img.mode != "RGB":
        img = img.convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def prompt_text(
    q: Question,
    mc_template: str = DEFAULT_MC_TEMPLATE,
    open_template: str = DEFAULT_OPEN_TEMPLATE,
    option_format: str = DEFAULT_OPTION_FORMAT,
) -> str:
    """The prompt text, ``<image N>`` placeholders kept; KeyError for an unknown field."""
    if q.is_open:
        return open_template.format(question=q.question)
    lines = "\n".join(
        option_format.format(letter=letter, text=text)
        for letter, text in zip(q.all_choices, q.options, strict=True)
    )
    return mc_template.format(question=q.question, options=lines)


def _text_part(t: str) -> dict:
    return {"type": "text", "text": t}


def _image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def split_parts(text: str, q: Question, encode: Callable[[int], str]) -> list[dict]:
    """``text`` cut at every ``<image N>`` into text parts and image N (``encode(n)``: its data
    URL) in text order; PromptError naming the question when image N is missing."""
    parts: list[dict] = []
    pos = 0
    for m in IMAGE_TAG.finditer(text):
        if m.start() > pos:
            parts.append(_text_part(text[pos : m.start()]))
        n = int(m.group(1))
        if n not in q.images:
            raise PromptError(
                f"question {q.id}: the text names <image {n}> but image_{n} is "
                f"empty (images present: {sorted(q.images)})"
            )
        parts.append(_image_part(encode(n)))
        pos = m.end()
    if pos < len(text):
        parts.append(_text_part(text[pos:]))
    return parts


def unreferenced_images(q: Question, text: str) -> list[int]:
    """Numbers of the question's images that ``text`` never names with ``<image N>``, ascending."""
    named = {int(m.group(1)) for m in IMAGE_TAG.finditer(text)}
    return sorted(n for n in q.images if n not in named)


def build_messages(
    q: Question,
    protocol: str = "patchbench",
    mc_template: str = DEFAULT_MC_TEMPLATE,
    open_template: str = DEFAULT_OPEN_TEMPLATE,
    option_format: str = DEFAULT_OPTION_FORMAT,
) -> tuple[list[dict], str, int]:
    """``(messages, prompt_sha256, n_images_sent)``: one OpenAI user message of text and
    ``image_url`` parts; PromptError for a missing image or an unknown protocol."""
    text = prompt_text(q, mc_template, open_template, option_format)
    cache: dict[int, str] = {}

    def enc(n: int) -> str:
        if n not in cache:
            cache[n] = png_data_url(q.images[n])
        return cache[n]

    if protocol == "patchbench":
        content = split_parts(text, q, enc)
        content += [_image_part(enc(n)) for n in unreferenced_images(q, text)]
    elif protocol == "sglang-2025":
        if "<" in text and ">" in text and 1 in q.images:
            prefix = text.split("<")[0]
            suffix = text.split(">")[1]
            content = [_text_part(prefix), _image_part(enc(1)), _text_part(suffix)]
        else:
            content = [_text_part(text)]
    else:
        raise PromptError(f"protocol {protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    messages = [{"role": "user", "content": content}]
    n_images = sum(1 for p in content if p["type"] == "image_url")
    return messages, prompt_sha256(messages), n_images


def prompt_sha256(messages: list[dict]) -> str:
    """Hex sha256 of the canonical JSON of ``messages`` (sorted keys, compact separators)."""
    blob = json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
