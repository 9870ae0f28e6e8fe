"""Answer extraction for MMMU responses: our ``strict`` parser and the ``official`` one.

Two parsers for multiple-choice responses, one normalisation for open (short-answer) questions:

- :func:`parse_official_mc` re-implements the official MMMU multiple-choice parser
  (MMMU-Benchmark/MMMU, ``mmmu/utils/eval_utils.py``, ``parse_multi_choice_response``; also copied
  into sglang's ``benchmark/mmmu/eval_utils.py``): strip ``,.!?;:'`` from both ends, pad with spaces,
  look for ``(X)``; if none, for `` X ``; if none and the response has more than 5 words, for option
  texts (case-insensitive substring); among several candidates the one whose LAST occurrence is
  latest wins (``np.argmax`` semantics: the first candidate on ties); no candidate -> a random letter.
  Our version takes the random generator as an argument (``random.Random(seed)``), so the pick is
  seeded and recorded; with ``rng=None`` it returns ``None`` instead of picking (the "fallback
  counted wrong" convention of tests/data/mmmu-official).
- :func:`parse_strict` is ours, deterministic and never random (cases.md M1-M3): reasoning blocks
  (``<think>...</think>``) are ignored; an explicit commitment ("Answer: B", "the answer is (D)",
  "Final answer: A", "option C") wins and the last one in the text wins; otherwise a bare letter
  that is a whole line / the whole response, or a leading ``X.``/``X)``/``(X)``/``X:`` label;
  otherwise the exact text of one option; lines that merely echo an option (``(A) red`` when A is
  "red") are ignored; anything else is ``None`` (unparsed). A capital letter inside a word or
  sentence ("A pretty girl", "I don't know", "None of the above") is never an answer.
- Open questions (HF ``question_type == "open"``, the official key's ``"short-answer"``) go through
  :func:`parse_open` / :func:`eval_open` only: the official normalisation (key sub-responses after
  "is ", "answer ", "=" ...; numbers extracted, commas dropped, rounded to 2 decimals; strings
  lower-cased and matched as substrings). They never pass through a letter parser.
"""
from __future__ import annotations

import random
import re
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "parse_official_mc", "parse_strict", "parse_open", "eval_open", "eval_mc",
    "normalize_str", "extract_numbers", "is_open", "option_letters",
]

_STRIP_CHARS = [",", ".", "!", "?", ";", ":", "'"]


def option_letters(n: int) -> list[str]:
    """Letters of ``n`` options: ``["A", "B", ...]``. Raises ValueError beyond 26 options."""
    if not 0 <= n <= 26:
        raise ValueError(f"{n} options: at most 26 are supported")
    return [chr(ord("A") + i) for i in range(n)]


def is_open(question_type: str) -> bool:
    """True for open questions: HF MMMU says ``"open"``, the official answer key ``"short-answer"``.

    Raises ValueError for any other value than those and ``"multiple-choice"``.
    """
    if question_type in ("open", "short-answer"):
        return True
    if question_type == "multiple-choice":
        return False
    raise ValueError(f"question_type {question_type!r}: expected 'multiple-choice', 'open' or "
                     "'short-answer'")


# --------------------------------------------------------------------------------------------
# official multiple-choice parser
# --------------------------------------------------------------------------------------------

def _last_index_argmax(values: Sequence[int]) -> int:
    """``np.argmax``: index of the first maximum."""
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def official_mc_candidates(response: str, all_choices: Sequence[str],
                           index2ans: Mapping[str, str]) -> str | None:
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
    return candidates[_last_index_argmax(starts)]


def parse_official_mc(response: str, all_choices: Sequence[str], index2ans: Mapping[str, str],
                      rng: random.Random | None) -> tuple[str | None, bool]:
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


# --------------------------------------------------------------------------------------------
# strict multiple-choice parser (ours)
# --------------------------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)
# an explicit commitment; group "tail" is what follows the marker on that line
_MARKERS = re.compile(
    r"\b(?:final\s+answer|correct\s+(?:answer|option|choice)|best\s+(?:answer|option|choice)"
    r"|the\s+answer|answer|my\s+choice|my\s+answer"
    r"|i(?:\s+would|'d|\s+will)?\s+(?:choose|select|pick|go\s+with))"
    r"(?:\s+(?:is|would\s+be|should\s+be|will\s+be))?\s*(?:[:=\-]|is)?\s*(?P<tail>[^\n]*)",
    re.I)
_OPTION_WORD = re.compile(r"\b(?:option|choice)\s+\(?(?P<l>[A-Z])\)?(?![A-Za-z0-9])")
_LETTER_IS_CORRECT = re.compile(
    r"(?:^|[\s(])\(?(?P<l>[A-Z])\)?\s+is\s+(?:the\s+)?(?:correct|right|best|answer)\b")
# a letter label at the start of a text: "B", "(B)", "B.", "B)", "B:", "**B**"
_LEADING = re.compile(
    r"^\W{0,3}?(?:\((?P<a>[A-Z])\)|(?P<b>[A-Z])\**(?:[.):]|\s*$))\**\s*(?P<rest>.*)$", re.S)


def _norm_text(s: str) -> str:
    s = re.sub(r"\s+", " ", s.strip().lower())
    return s.strip(" .,;:!?'\"*`")


def _option_text_match(text: str, index2ans: Mapping[str, str]) -> str | None:
    """The letter of the one option whose text equals ``text`` (normalised), else None."""
    t = _norm_text(text)
    if not t:
        return None
    hits = [k for k, v in index2ans.items() if _norm_text(str(v)) == t]
    return hits[0] if len(hits) == 1 else None


def _commitment(tail: str, letters: set[str], index2ans: Mapping[str, str]) -> str | None:
    """What an explicit marker commits to: a letter label, or one option's exact text."""
    tail = tail.strip().strip("*`\"' ")
    m = _LEADING.match(tail)
    if m:
        letter = m.group("a") or m.group("b")
        if letter in letters:
            return letter
        return None
    return _option_text_match(tail, index2ans)


def _is_echo(letter: str, rest: str, index2ans: Mapping[str, str]) -> bool:
    """``(A) red`` where A is "red": the line repeats an option, it commits to nothing."""
    opt = index2ans.get(letter)
    return bool(rest.strip()) and opt is not None and _norm_text(rest) == _norm_text(str(opt))


def parse_strict(response: str | None, all_choices: Sequence[str],
                 index2ans: Mapping[str, str]) -> str | None:
    """Our deterministic multiple-choice parse; None means unparsed (see module docstring).

    Order: (1) the last explicit commitment anywhere in the text ("Answer: B", "the answer is D.",
    "option C", "B is correct"); (2) the last line that is only a letter label, or a leading label
    of a line that does not merely echo its option; a response whose labelled lines are all echoes
    of the option list is unparsed; (3) a response (or a line) equal to one option's text.
    """
    if response is None:
        return None
    letters = set(all_choices)
    text = _THINK.sub(" ", response)
    if not text.strip():
        return None

    # (1) explicit commitments: the last one wins
    found: list[tuple[int, str]] = []
    for m in _MARKERS.finditer(text):
        c = _commitment(m.group("tail"), letters, index2ans)
        if c is not None:
            found.append((m.start(), c))
    for rx in (_OPTION_WORD, _LETTER_IS_CORRECT):
        for m in rx.finditer(text):
            if m.group("l") in letters:
                found.append((m.start("l"), m.group("l")))
    if found:
        return max(found)[1]

    # (2) letter labels, line by line; the last label that is not an echo wins. A line that
    # repeats its option ("(B) blue" when B is "blue") is an echo; one such line alone is an
    # answer ("C. A pretty girl standing"), several are an echoed option list and commit to nothing.
    labels: list[str] = []
    echoes: list[str] = []
    for line in text.splitlines():
        m = _LEADING.match(line.strip())
        if not m:
            continue
        letter = m.group("a") or m.group("b")
        if letter not in letters:
            continue
        (echoes if _is_echo(letter, m.group("rest"), index2ans) else labels).append(letter)
    if labels:
        return labels[-1]
    if len(echoes) == 1:
        return echoes[0]
    if len(echoes) > 1:
        return None

    # (3) exact option text: the whole response, else the last line that is one
    whole = _option_text_match(text, index2ans)
    if whole is not None:
        return whole
    for line in reversed(text.splitlines()):
        hit = _option_text_match(line, index2ans)
        if hit is not None:
            return hit
    return None


def eval_mc(gold: str | list[str], pred: str | None) -> bool:
    """Official ``eval_multi_choice``: exact letter equality (any of a list of golds)."""
    if pred is None:
        return False
    if isinstance(gold, list):
        return pred in gold
    return gold == pred


# --------------------------------------------------------------------------------------------
# open questions: the official normalisation
# --------------------------------------------------------------------------------------------

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
