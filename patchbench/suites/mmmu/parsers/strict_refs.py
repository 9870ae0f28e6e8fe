"""How the strict MMMU parser finds options in a response (docs/mmmu.md, "Strict parser policy",
its first paragraph); the reading policy itself is in :mod:`.strict`."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

_REASONING = re.compile(r"<(think|thinking|reasoning)>.*?(?:</\1>|\Z)", re.S | re.I)
_LATEX_WRAP = re.compile(
    r"\\(?:boxed|text|textbf|textit|textrm|mathrm|mathbf|mathit|mbox|fbox|bf|it)\s*\{([^{}]*)\}"
)
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*(?:\{([^{}]*)\}\s*\{([^{}]*)\}|(\d)(\d))")
_LATEX_SQRT = re.compile(r"\\sqrt\s*(?:\{([^{}]*)\}|(\w))|\bsqrt\s*\(\s*([\w.]+)\s*\)")
_LATEX_SUP = re.compile(r"\^\{([^{}]*)\}")
_LATEX_SYMBOL = dict(
    zip(["pi", "times", "cdot", "div", "circ", "degree", "pm", "%", "$"], "π×·÷°°±%$", strict=True)
)
_LATEX_WORD = re.compile(
    r"\\(pi|times|cdot|div|circ|degree|pm|%|\$)(?![A-Za-z])|\\(?:left|right)(?![A-Za-z])|\\[,;:! ]"
)


def _frac(m: re.Match) -> str:
    a, b = (m.group(1), m.group(2)) if m.group(1) is not None else (m.group(3), m.group(4))
    a, b = (x.strip() if re.fullmatch(r"\s*[\w.√π]+\s*", x) else f"({x.strip()})" for x in (a, b))
    return f"{a}/{b}"


def _plain_math(s: str) -> str:
    """LaTeX math as plain text, the same in an option and a response: ``\\frac{1}{4}`` and
    ``\\tfrac14`` -> ``1/4``, ``\\sqrt{2}`` and ``sqrt(2)`` -> ``√2``, ``\\pi`` -> ``π``,
    ``^{2}`` -> ``^2``, ``\\times`` -> ``×``, ``^\\circ`` -> ``°``; ``\\left`` / ``\\right`` and
    spacing commands dropped."""
    if "\\" not in s and "sqrt" not in s and "^{" not in s:
        return s
    s = _LATEX_WORD.sub(lambda m: _LATEX_SYMBOL.get(m.group(1) or "", ""), s)
    for _ in range(4):
        t = _LATEX_SUP.sub(r"^\1", _LATEX_FRAC.sub(_frac, s))
        t = _LATEX_SQRT.sub(lambda m: "√" + next(g for g in m.groups() if g is not None), t)
        if t == s:
            break
        s = t
    return s.replace("^°", "°")


# a quantity's unit as a word or a symbol, with or without a space: "15 meters per second",
# "15m/s" and "15 m/s" all read "15 m/s"; "50 percent" and "50 %" read "50%"
_UNIT_WORDS = [
    (r"(?:met(?:er|re)s?|m)[ \t]+per[ \t]+(?:second|sec|s)", " m/s"),
    (r"(?:kilomet(?:er|re)s?|km)[ \t]+per[ \t]+(?:hour|h)", " km/h"),
    (r"kilomet(?:er|re)s?", " km"),
    (r"centimet(?:er|re)s?", " cm"),
    (r"millimet(?:er|re)s?", " mm"),
    (r"met(?:er|re)s?", " m"),
    (r"kilograms?", " kg"),
    (r"milligrams?", " mg"),
    (r"grams?", " g"),
    (r"seconds?", " s"),
    (r"minutes?", " min"),
    (r"hours?", " h"),
    (r"newtons?", " N"),
    (r"joules?", " J"),
    (r"watts?", " W"),
    (r"hertz", " Hz"),
    (r"(?:percent|per[ \t]+cent|%)", "%"),
    (r"(?:degrees?|°)", "°"),
]
# one pattern, a group per unit (in _UNIT_WORDS' order): the group that matched names it
_UNIT_WORD = re.compile(
    r"(?<=\d)[ \t]*(?:" + "|".join(f"({p})" for p, _ in _UNIT_WORDS) + r")(?![\w/])", re.I
)
_UNIT_SPACE = re.compile(
    r"(?<=\d)(?=(?:m/s|km/h|km|cm|mm|kg|mg|min|kPa|Pa|Hz|mol|mL|m|g|s|h|N|J|W|L)(?![\w/]))"
)


_DIGIT = re.compile(r"\d")
_AMPERSAND = re.compile(r"[ \t]+&[ \t]+")  # "Red & Blue" is "Red and Blue"; not "AT&T"
# a number grouped in thousands reads without its commas ("1,000" is "1000"); not a list
# ("10,100,1000") nor a decimal comma
_THOUSANDS = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,])")


def _units(s: str) -> str:
    """Units read one way (see ``_UNIT_WORDS``); only after a digit."""
    if not _DIGIT.search(s):
        return s
    s = _UNIT_WORD.sub(lambda m: _UNIT_WORDS[m.lastindex - 1][1], s)
    return _UNIT_SPACE.sub(" ", s)


_LATEX_DELIM = re.compile(r"\\[()\[\]]|\$+")
_MARKUP = re.compile(r"[*`]+|^[ \t]*#+[ \t]*|^[ \t]*>[ \t]*|(?<!\w)_{1,2}|_{1,2}(?!\w)", re.M)
# full-width brackets and CJK punctuation as ASCII (sentence punctuation with its space)
_WIDE = str.maketrans(
    dict(zip("（）：【】’“”\u00a0", '():[]\'"" ', strict=True))
    | {c: f"{a} " for c, a in zip("。，；！？", ".,;!?", strict=True)}
)


def clean_text(s: str) -> str:
    """``s`` with the markup a reader looks through removed and what may be written several ways
    written one way (docs/mmmu.md, "Strict parser policy": :func:`_plain_math`, :func:`_units`)."""
    s = _plain_math(_REASONING.sub(" ", s).translate(_WIDE))
    for _ in range(4):
        t = _LATEX_WRAP.sub(r"\1", s)
        if t == s:
            break
        s = t
    s = _LATEX_DELIM.sub("", s)
    s = _AMPERSAND.sub(" and ", _MARKUP.sub("", s))
    return _units(_THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), s))


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


_WORD_HYPHEN = re.compile(r"(?<=[^\W\d_])[-\u2010\u2011](?=[^\W\d_])")


def _unhyphen(low: str) -> str:
    """``low`` with hyphens between letters as spaces (same length: positions carry over)."""
    return _WORD_HYPHEN.sub(" ", low) if "-" in low or "\u2010" in low or "\u2011" in low else low


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class Options:
    """The options of one question, prepared for matching as docs/mmmu.md states it (letters
    upper-case, texts cleaned and lower-cased; plain string search, no per-question regex: the
    parser stays fast). Texts that are only an image placeholder or one letter, and texts two
    options share, are left out."""

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
        # searched with word hyphens as spaces ("Post-Impressionism" is "post impressionism"),
        # a leading "the" optional ("demand curve shifts right" is "The demand curve shifts
        # right"); longest first, so "dark red" is taken before "red"
        forms = [(k, _unhyphen(t)) for k, t in self.texts.items()]
        bare = [(k, t[4:]) for k, t in forms if t.startswith("the ") and len(t) > 8]
        forms += [(k, t) for k, t in bare if [u for _, u in forms + bare].count(t) == 1]
        self.order = sorted(forms, key=lambda kv: -len(kv[1]))

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
        orig = s.lower()
        low = _unhyphen(orig)
        q = _OPEN_QUOTE.match(s, pos)
        starts = [pos] + ([q.end()] if q else [])
        starts += [m.end() for p in list(starts) if (m := _ARTICLE.match(s, p))]
        for k, t in self.order:
            for p in starts:
                if low.startswith(t, p) and self._bounded(orig, p, p + len(t)):
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
        t = _unhyphen(t)
        p = _AFTER_LABEL.match(s, pos).end()
        orig = s.lower()
        low = _unhyphen(orig)
        if low.startswith(t, p) and self._bounded(orig, p, p + len(t)):
            end = p + len(t)
            return end + 1 if s[end : end + 1] == ")" else end
        return None

    def find_texts(self, s: str) -> list[tuple[int, int, str]]:
        """Every whole-word occurrence of an option text: ``(start, end, letter)``; a longer
        text wins over a shorter one it overlaps."""
        orig = s.lower()
        low = _unhyphen(orig)
        out: list[tuple[int, int, str]] = []
        for k, t in self.order:
            i = low.find(t)
            while i >= 0:
                e = i + len(t)
                if self._bounded(orig, i, e) and not any(i < b and a < e for a, b, _ in out):
                    out.append((i, e, k))
                i = low.find(t, i + 1)
        return out


# answer phrases of other languages, read as their English equivalents (zh, ja, ko, es, pt,
# fr, de, it, ru); CJK text has no word boundaries, so those patterns stand alone
_FOREIGN = [
    (re.compile(p, re.I), r)
    for p, r in [
        (r"(?:最终|最后|正确)?(?:的)?答案\s*(?:应该是|应为|应是|是|为|选)", " the answer is "),
        (r"(?:最终|最后|正确)?(?:的)?答案\s*:", " Answer: "),
        (r"(?:答えは|正解は|정답은|답은)", " the answer is "),
        (r"(?:答え|正解|정답)\s*:", " Answer: "),
        (r"是正确(?:的|答案|选项)?", " is correct"),
        (r"我(?:认为|觉得)", " I think "),
        (r"我?选(?:择)?(?=\s*[(\[]?[A-Za-z](?![A-Za-z]))", " I choose "),
        (r"选项", " option "),
        (r"或者?", " or "),
        (r"不是", " not "),
        (
            r"\b(?:(?:la|a)\s+)?(?:respuesta|resposta|risposta)(?:\s+(?:correcta|correta|corretta|"
            r"giusta|final|finale))?\s+(?:es|é|e|è)(?!\w)(?:\s+(?-i:la|a|o|el)(?=\s))?",
            " the answer is ",
        ),
        (
            r"\b(?:la\s+)?(?:bonne\s+)?réponse(?:\s+(?:correcte|finale))?\s+est(?:\s+(?-i:la|le)(?=\s))?",
            " the answer is ",
        ),
        (r"\b(?:die\s+)?(?:richtige\s+|korrekte\s+)?antwort\s+(?:ist|lautet)\b", " the answer is "),
        (r"(?<!\w)(?:правильный\s+)?ответ(?:\s+это|\s*[—–-])?(?!\w)", " the answer is "),
        (r"\b(?:respuesta|resposta|risposta|réponse|antwort)\s*:", " Answer: "),
        (r"\b(?:opción|opção|opzione)\b", " option "),
        (r"\b(?:je\s+pense\s+que|creo\s+que|acho\s+que|ich\s+denke|penso\s+che)\b", " I think "),
        (r"\b(?:je\s+choisis|elijo|escojo|escolho|ich\s+wähle|scelgo)\b", " I choose "),
    ]
]
# the words of _FOREIGN that ASCII text can hold: without one, _FOREIGN has nothing to do there
_FOREIGN_LATIN = re.compile(
    r"respuesta|resposta|risposta|antwort|opci|opzione|pense|creo|acho|denke|penso|choisis|"
    r"elijo|escojo|escolho|scelgo",
    re.I,
)
_ORDINALS = "first second third fourth fifth sixth seventh eighth ninth tenth".split()
_ORDINAL_REF = re.compile(
    r"\b(?:the\s+)?(?P<n>" + "|".join(_ORDINALS) + r"|last|1st|2nd|3rd|[4-9]th)"
    r"\s+(?:option|choice|alternative)\b",
    re.I,
)
_NUMBER_REF = re.compile(
    r"\b(?P<w>option|choice|alternative)\s*(?:#|no\.|number)?\s*(?P<o>[(\[]?)\s*(?P<n>[1-9])\s*"
    r"(?P<c>[)\]]?)(?![\w/]|[.,]\d)",
    re.I,
)


def read_references(s: str, opts: Options) -> str:
    """``s`` with other languages' answer phrases in English ("答案是 B" -> "the answer is B") and
    options named by position as letters ("the third option" -> "option C"; docs/mmmu.md)."""
    if not s.isascii() or _FOREIGN_LATIN.search(s):
        for pat, rep in _FOREIGN:
            s = pat.sub(rep, s)
    n = len(opts.letters)

    def ordinal(m: re.Match) -> str:
        w = m.group("n").lower()
        i = _ORDINALS.index(w) if w in _ORDINALS else int(re.sub(r"\D", "", w) or n) - 1
        return f"option {opts.letters[i]}" if 0 <= i < n else m.group(0)

    s = _ORDINAL_REF.sub(ordinal, s)
    if not any(_NUMERIC_TEXT.fullmatch(t) for t in opts.texts.values()):

        def number(m: re.Match) -> str:
            i = int(m.group("n")) - 1
            if not 0 <= i < n or bool(m.group("o")) != bool(m.group("c")):
                return m.group(0)
            return f"{m.group('w')} {opts.letters[i]}"

        s = _NUMBER_REF.sub(number, s)
    return s


_NUMERIC_TEXT = re.compile(r"[\d.,\s%]+")
IMAGE_ONLY = re.compile(r"(?:<image \d+>\s*)+")
_SEP = re.compile(
    r"\s*(?:,|;|/|&)?\s*(?:and/or|and|or(?:\s+(?:maybe|perhaps|possibly|probably))?|&)?\s*", re.I
)
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
