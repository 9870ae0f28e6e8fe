"""The official MMMU parsing (MMMU-Benchmark/MMMU ``mmmu/utils/eval_utils.py``, copied into
sglang's ``benchmark/mmmu/eval_utils.py``; docs/mmmu.md, "Two parsers"): the multiple-choice
parser, its letter check and the normalisation of open questions (HF ``question_type ==
"open"``, the key's ``"short-answer"``), which never pass a letter parser.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_STRIP_CHARS = [",", ".", "!", "?", ";", ":", "'"]


def is_open(question_type: str) -> bool:
    """True for open questions (HF MMMU ``"open"``, the official key's ``"short-answer"``), False
    for ``"multiple-choice"``; ValueError for anything else."""
    if question_type in ("open", "short-answer"):
        return True
    if question_type == "multiple-choice":
        return False
    raise ValueError(
        f"question_type {question_type!r}: expected 'multiple-choice', 'open' or 'short-answer'"
    )


# --------------------------------------------------------------------------------- multiple choice


def official_mc_candidates(
    response: str, all_choices: Sequence[str], index2ans: Mapping[str, str]
) -> str | None:
    """The official parser without its random fallback: the letter, or None when it would pick."""
    for ch in _STRIP_CHARS:
        response = response.strip(ch)
    response = " " + response + " "
    index_ans = True
    ans_with_brack = False
    candidates: list[str] = []
    for choice in all_choices:
        if f"({choice})" in response:
            candidates.append(choice)
            ans_with_brack = True
    if not candidates:
        for choice in all_choices:
            if f" {choice} " in response:
                candidates.append(choice)
    if not candidates and len(response.split()) > 5:
        for index, ans in index2ans.items():
            if ans.lower() in response.lower():
                candidates.append(index)
                index_ans = False
    if not candidates:
        return None
    if len(candidates) == 1:
        return candidates[0]
    if index_ans:
        if ans_with_brack:
            starts = [response.rfind(f"({c})") for c in candidates]
        else:
            starts = [response.rfind(f" {c} ") for c in candidates]
    else:
        starts = [response.lower().rfind(index2ans[c].lower()) for c in candidates]
    return candidates[max(range(len(starts)), key=starts.__getitem__)]  # np.argmax: first max


def parse_official_mc(
    response: str,
    all_choices: Sequence[str],
    index2ans: Mapping[str, str],
    rng: random.Random | None,
) -> tuple[str | None, bool]:
    """The official MMMU multiple-choice parse of ``response``.

    Returns ``(letter, fell_back)``. ``fell_back`` is True when no rule matched: the letter is then
    ``rng.choice(all_choices)`` (one draw from ``rng``, as the official ``random.choice``), or
    None when ``rng`` is None.
    """
    letter = official_mc_candidates(response, all_choices, index2ans)
    if letter is not None:
        return letter, False
    if rng is None:
        return None, True
    return rng.choice(list(all_choices)), True


def eval_mc(gold: str | list[str], pred: str | None) -> bool:
    """Official ``eval_multi_choice``: exact letter equality (any of a list of golds)."""
    if pred is None:
        return False
    if isinstance(gold, list):
        return pred in gold
    return gold == pred


# --------------------------------------------------------------------------------- open questions


def _check_is_number(s: str) -> bool:
    try:
        float(s.replace(",", ""))
        return True
    except ValueError:
        return False


def normalize_str(s: str) -> list[Any]:
    """Official ``normalize_str``: a number -> ``[round(float, 2)]`` (commas dropped); a string ->
    ``[lower]``, a one-character string -> ``[" x", "x "]`` (to avoid trivial substring hits)."""
    s = s.strip()
    if _check_is_number(s):
        return [round(float(s.replace(",", "")), 2)]
    s = s.lower()
    if len(s) == 1:
        return [" " + s, s + " "]
    return [s]


_NUM_COMMAS = re.compile(r"-?\b\d{1,3}(?:,\d{3})+\b")
_NUM_SCI = re.compile(r"-?\d+(?:\.\d+)?[eE][+-]?\d+")
_NUM_SIMPLE = re.compile(r"-?(?:\d+\.\d+|\.\d+|\d+\b)(?![eE][+-]?\d+)(?![,\d])")


def extract_numbers(s: str) -> list[str]:
    """Official ``extract_numbers``: numbers with thousands commas, then scientific, then plain."""
    return _NUM_COMMAS.findall(s) + _NUM_SCI.findall(s) + _NUM_SIMPLE.findall(s)


_INDICATORS = ["could be ", "so ", "is ", "thus ", "therefore ", "final ", "answer ", "result "]


def _key_subresponses(response: str) -> list[str]:
    response = response.strip().strip(".").lower()
    subs = re.split(r"\.\s(?=[A-Z])|\n", response)
    indicators = list(_INDICATORS)
    keys: list[str] = []
    for i, resp in enumerate(subs):
        if i == len(subs) - 1:
            indicators.append("=")
        shortest = None
        for ind in indicators:
            if ind in resp:
                tail = resp.split(ind)[-1].strip()
                if not shortest or len(tail) < len(shortest):
                    shortest = tail
        if shortest and shortest.strip() not in [":", ",", ".", "!", "?", ";", ":", "'"]:
            keys.append(shortest)
    return keys or [response]


def parse_open(response: str) -> list[Any]:
    """Official ``parse_open_response``: the candidate values (floats and lower-cased strings),
    deduplicated, in first-seen order (the official code returns them in set order, which only
    matters for display)."""
    keys = _key_subresponses(response)
    preds: list[str] = list(keys)
    for k in keys:
        preds.extend(extract_numbers(k))
    out: list[Any] = []
    for p in preds:
        for v in normalize_str(p):
            if v not in out:
                out.append(v)
    return out


def eval_open(gold: str | list[str], preds: Iterable[Any]) -> bool:
    """Official ``eval_open``: a string prediction is correct when a normalised gold string is a
    substring of it; a number when it equals a normalised gold number (after rounding to 2 dp)."""
    golds = gold if isinstance(gold, list) else [gold]
    norm: list[Any] = []
    for g in golds:
        norm.extend(normalize_str(str(g)))
    for p in preds:
        if isinstance(p, str):
            if any(isinstance(n, str) and n in p for n in norm):
                return True
        elif p in norm:
            return True
    return False
