"""How the strict MMMU parser finds options in a response: the markup a reader looks through,
option texts (case-insensitive whole words, the longest first), letter references and lists of
them. The reading policy itself is in :mod:`.strict` (docs/mmmu.md states it)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

_REASONING = re.compile(r"<(think|thinking|reasoning)>.*?(?:</\1>|\Z)", re.S | re.I)
_LATEX_WRAP = re.compile(
    r"\\(?:boxed|text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|fbox|bf|it)\s*\{([^{}]*)\}"
)
_LATEX_DELIM = re.compile(r"\\[()\[\]]|\$+")
_MARKUP = re.compile(r"[*`]+|^[ \t]*#+[ \t]*|^[ \t]*>[ \t]*|(?<!\w)_{1,2}|_{1,2}(?!\w)", re.M)
_WIDE = str.maketrans(
    {
        "（": "(",
        "）": ")",
        "：": ":",
        "【": "[",
        "】": "]",
        "’": "'",
        "“": '"',
        "”": '"',
        "\u00a0": " ",
    }
)


def clean_text(s: str) -> str:
    """Markup a reader looks through: reasoning blocks dropped (an unclosed one runs to the end),
    ``\\boxed{}``/``\\text{}``-style LaTeX unwrapped, ``$``, ``\\(``, ``\\)``, bold/italic
    ``*``/``_``, backticks, heading ``#`` and quote ``>`` removed, full-width brackets made ASCII."""
    s = _REASONING.sub(" ", s).translate(_WIDE)
    for _ in range(4):
        t = _LATEX_WRAP.sub(r"\1", s)
        if t == s:
            break
        s = t
    s = _LATEX_DELIM.sub("", s)
    return _MARKUP.sub("", s)


@functools.lru_cache(maxsize=8192)
def norm_text(s: str) -> str:
    """An option text as matched: cleaned (:func:`clean_text`), lower-case, whitespace runs as one
    space, surrounding spaces and punctuation stripped."""
    s = re.sub(r"\s+", " ", clean_text(s).strip().lower())
    return s.strip(" .,;:!?'\"")


_ARTICLE = re.compile(r"(?:the|an?)[ \t]+", re.I)
_OPEN_QUOTE = re.compile(r"([\"'(\[])[ \t]*")
_CLOSE_QUOTE = {'"': '"', "'": "'", "(": ")", "[": "]"}
_AFTER_LABEL = re.compile(r"[ \t]*[.:)\-\u2013,]?[ \t]*\(?")
LABEL_ANY = re.compile(r"(?:\(\s*([A-Za-z])\s*\)|\b([A-Za-z])[.):])\s*")


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class Options:
    """The options of one question, prepared for matching (letters upper-case, texts cleaned and
    lower-cased; plain string search, no per-question regex: the parser stays fast).

    An option text matches in any case, as whole words: a hyphen joins words ("ribosome-like" is
    not "ribosome", "acidic" is not "acid"); where texts overlap the longest wins ("amino acid"
    over "acid", "Paris, Texas" over "Paris"). Texts that are only an image placeholder or one
    letter, and texts two options share, are left out."""

    def __init__(self, all_choices: Sequence[str], index2ans: Mapping[str, str]):
        self.letters = [c.upper() for c in all_choices]
        texts: dict[str, str] = {}
        for k, v in index2ans.items():
            t = norm_text(str(v))
            # a text that is only an image placeholder or one letter names nothing by itself
            if t and not IMAGE_ONLY.fullmatch(t) and not re.fullmatch(r"[a-z]", t):
                texts[k.upper()] = t
        values = list(texts.values())
        self.texts = {k: t for k, t in texts.items() if values.count(t) == 1}
        # longest first, so "dark red" is taken before "red"
        self.order = sorted(self.texts.items(), key=lambda kv: -len(kv[1]))

    @staticmethod
    def _bounded(low: str, start: int, end: int) -> bool:
        """Whole words: no word character on either side, nor a character that joins one to
        the text (the "d." of a decimal, a hyphen: "ribosome-like")."""

        def joins(i: int, j: int) -> bool:
            if not 0 <= j < len(low):
                return False
            return (low[i] == "." and low[j].isdigit()) or (low[i] == "-" and low[j].isalnum())

        if start > 0 and (_is_word(low[start - 1]) or joins(start - 1, start - 2)):
            return False
        if end < len(low) and (_is_word(low[end]) or joins(end, end + 1)):
            return False
        return True

    def text_at(self, s: str, pos: int) -> tuple[str, int] | None:
        """``(letter, end)`` when an option's full text starts at ``pos``, else None. An opening
        quote or bracket and an article before the text are skipped; the closing quote or
        bracket after it is part of the reference."""
        low = s.lower()
        q = _OPEN_QUOTE.match(s, pos)
        starts = [pos] + ([q.end()] if q else [])
        starts += [m.end() for p in list(starts) if (m := _ARTICLE.match(s, p))]
        for k, t in self.order:
            for p in starts:
                if low.startswith(t, p) and self._bounded(low, p, p + len(t)):
                    end = p + len(t)
                    if q and p > pos and s[end : end + 1] == _CLOSE_QUOTE[q.group(1)]:
                        end += 1
                    return k, end
        return None

    def own_text_after(self, s: str, letter: str, pos: int) -> int | None:
        """End of ``letter``'s own text right after its label ("(C) green", "C. green",
        "C (green)"), else None."""
        t = self.texts.get(letter)
        if not t:
            return None
        p = _AFTER_LABEL.match(s, pos).end()
        low = s.lower()
        if low.startswith(t, p) and self._bounded(low, p, p + len(t)):
            end = p + len(t)
            return end + 1 if s[end : end + 1] == ")" else end
        return None

    def find_texts(self, s: str) -> list[tuple[int, int, str]]:
        """Every whole-word occurrence of an option text: ``(start, end, letter)``; a longer
        text wins over a shorter one it overlaps."""
        low = s.lower()
        out: list[tuple[int, int, str]] = []
        for k, t in self.order:
            i = low.find(t)
            while i >= 0:
                e = i + len(t)
                if self._bounded(low, i, e) and not any(i < b and a < e for a, b, _ in out):
                    out.append((i, e, k))
                i = low.find(t, i + 1)
        return out


IMAGE_ONLY = re.compile(r"(?:<image \d+>\s*)+")
_SEP = re.compile(r"\s*(?:,|;|/|&)?\s*(?:and/or|and|or|&)?\s*", re.I)
_REF_WORD = re.compile(
    r"(?:option|choice|letter)\s*:?\s*[(\[]?\s*(?P<l>[A-Za-z])\s*[)\]]?(?![\w'])", re.I
)
_REF_BARE = re.compile(
    r"\(\s*(?P<a>[A-Za-z])\s*\)|\[\s*(?P<b>[A-Za-z])\s*\]"
    r"|(?P<c>[A-Z])(?![\w'])"
    r"|(?P<d>[a-z])(?=[ \t]*[.):!]?[ \t]*(?:$|\n))"  # a lone lower-case letter ending the line
    r"|(?P<e>[a-z])(?=[.):;][ \t])",
    re.M,
)  # a lower-case label "b) ..." / "b. ..."


def ref_at(s: str, pos: int, opts: Options) -> tuple[str, int] | None:
    """``(letter, end)`` of an option reference starting at ``pos``: "(b)", "[B]", "B",
    "option c", a lone lower-case letter, or the option's full text (text first: "A pretty girl"
    is option text, not the letter A). None when there is none or the letter is no option."""
    hit = opts.text_at(s, pos)
    if hit:
        return hit
    m = _REF_WORD.match(s, pos) or _REF_BARE.match(s, pos)
    if not m:
        return None
    letter = next(g for g in m.groups() if g).upper()
    if letter not in opts.letters:
        return None
    # "(C) green" / "C. green" / "C (green)": the option's own text after its label
    return letter, opts.own_text_after(s, letter, m.end()) or m.end()


def ref_list(s: str, pos: int, opts: Options) -> tuple[list[str], int] | None:
    """One reference, or several joined by commas / "and" / "or": ``(letters, end)``. After a
    comma or semicolon, references that open a new clause ("I'd go with D; B is tempting",
    "Answer: C, A and B both ignore friction") are not part of the list."""
    first = ref_at(s, pos, opts)
    if not first:
        return None
    letters, end = [first[0]], first[1]
    cut: tuple[int, int, bool] | None = None  # (letters, end, semicolon) before the last , / ;
    while True:
        sep = _SEP.match(s, end)
        if not sep or sep.end() == end:
            break
        nxt = ref_at(s, sep.end(), opts)
        if not nxt:
            break
        if re.match(r"\s*[,;]", sep.group(0)):
            cut = (len(letters), end, ";" in sep.group(0))
        letters.append(nxt[0])
        end = nxt[1]
    new_clause = cut and (_ANY_WORD if cut[2] else _NEW_CLAUSE)
    if new_clause and new_clause.match(s, end) and not _LIST_AFFIRMED.match(s, end):
        letters, end = letters[: cut[0]], cut[1]
    return list(dict.fromkeys(letters)), end


# after a comma, a predicate right after the listed options: they are the subject of a new clause
_NEW_CLAUSE = re.compile(
    r"[ \t]+(?:(?:both|also|each|all|alone|too|then|only)[ \t]+)*"
    r"(?:is|are|was|were|would|could|might|may|can|cannot|will|do|does|did|has|have|had|"
    r"isn't|aren't|wasn't|weren't|wouldn't|couldn't|can't|won't|don't|doesn't|didn't|"
    r"seems?|appears?|looks?|fails?|ignores?|lacks?|needs?|requires?|misses?|"
    r"describes?|shows?|suggests?|refers?|represents?|contradicts?|gives?|makes?)\b",
    re.I,
)
# after a semicolon any word opens a new clause
_ANY_WORD = re.compile(r"[ \t]+[a-z]", re.I)
# ... unless it affirms the list: "Answer: A, C are both correct"
_LIST_AFFIRMED = re.compile(
    r"[ \t]+(?:(?:both|also|all)[ \t]+)*(?:is|are|seem|appear)[ \t]+"
    r"(?:(?:both|also|all|equally)[ \t]+)*(?:correct|right|true|valid|possible|plausible|"
    r"acceptable|answers?)\b",
    re.I,
)
