"""Our ``strict`` multiple-choice parser: deterministic, never random (docs/cases.md M1-M3; its
policy below and in docs/mmmu.md). How options are found in the text is :mod:`.strict_refs`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .strict_refs import (
    LABEL_ANY,
    Options,
    clean_text,
    norm_text,
    read_references,
    ref_at,
    ref_list,
)

# How a person grades a free-text answer, in order (docs/mmmu.md, "Strict parser policy", gives
# the cases): 1. the LAST explicit commitment wins (:func:`_commitments`), unless a later revision
# names another option; 2. otherwise a sentence that names exactly one option (:func:`_sentences`);
# 3. otherwise unparsed: "ambiguous" when several options are named, else "no_answer".

NO_ANSWER = "no_answer"
AMBIGUOUS = "ambiguous"
UNPARSED_KINDS = (NO_ANSWER, AMBIGUOUS)


@dataclass(frozen=True)
class StrictParse:
    """One strict parse: ``letter`` (an option letter, or None), ``status`` (``"answer"``,
    ``"no_answer"`` or ``"ambiguous"``) and ``rule`` (which rule decided, for audits)."""

    letter: str | None
    status: str
    rule: str


_MARKER = re.compile(
    r"\b(?:final\s+(?:answer|choice|option|selection)"
    r"|(?:correct|right|best|only\s+correct|proper|most\s+(?:likely|appropriate|accurate|"
    r"suitable|plausible|reasonable))\s+(?:answer|option|choice|response|match|one)s?"
    r"|(?:that|which|this)\s+leaves(?:\s+(?:us\s+with|only))?|leaving(?:\s+only)?"
    r"|by\s+(?:the\s+process\s+of\s+)?elimination"
    r"|the\s+answer|answer|my\s+(?:final\s+)?(?:answer|choice|pick|selection)"
    r"|i(?:\s+would|'d|\s+will|'ll|\s+must|\s+should)?\s+(?:choose|select|pick|go\s+with|opt\s+for)"
    r"|i(?:'m|\s+am)\s+(?:going\s+with|choosing|picking|selecting|opting\s+for)"
    r"|(?:change|revise|correct)\s+my\s+answer\s+to|(?:choose|select|pick)|i\s+meant"
    r"|(?:so(?![ \t]+(?:is|are|was|were|does|do|did|has|have|can|could|would)\b)|thus|"
    r"therefore|hence|it\s+is|it's|it\s+must\s+be|this\s+is|that\s+is|"
    r"i\s+think|i\s+believe|i\s+guess|i\s+would\s+say|i'd\s+say)(?=[\s,:]))"
    r"(?![\w'])(?:\s+(?:choice|option|letter)(?![\w']))?"
    r"(?:[ \t]*(?:is|would\s+be|should\s+be|will\s+be|must\s+be|to\s+be|remains|becomes|=|:|-|–|—))*"
    r"(?:[ \t]*(?:likely|probably|clearly|definitely|therefore|thus|then|indeed|actually|"
    r"most\s+likely|simply|now|still|,))*[ \t:]*",
    re.I,
)
# markers that conclude without naming an answer: what follows must end the sentence
_WEAK = re.compile(
    r"(?:so|thus|therefore|hence|it\s+is|it's|it\s+must\s+be|this\s+is|that\s+is|"
    r"i\s+think|i\s+believe|i\s+guess|i\s+would\s+say|i'd\s+say)\b",
    re.I,
)
_SENT_END = re.compile(
    r"[ \t]*[.!]?[ \t]*(?:$|\n|(?<=[.!])\s+(?=[A-Z(]))"
    r"|[ \t]*(?:;|[—–]|-[ \t]|,[ \t]*(?:since|because|as|given|not)\b)",
    re.M | re.I,
)
_IS_CORRECT = re.compile(
    r"[ \t]*(?:is|seems\s+to\s+be|appears\s+to\s+be|would\s+be|must\s+be|should\s+be)[ \t]+"
    r"(?:the[ \t]+)?(?:(?:most[ \t]+)?likely[ \t]+|only[ \t]+|clearly[ \t]+|definitely[ \t]+)?"
    r"(?:the[ \t]+)?(?:correct|right|best|answer|most[ \t]+(?:likely|appropriate|accurate|"
    r"plausible|suitable|reasonable))\b",
    re.I,
)
_HYPOTHETICAL = re.compile(
    r"(?:\b(?:if|whether|assuming|assume|suppose|unless|why|how)\b[^.;!?,\n]{0,40}"
    r"|\b(?:don't|do\s+not|doesn't|does\s+not|didn't|wouldn't|would\s+not|cannot|can't)\s+"
    r"(?:think|believe|say|agree|feel)\b[^.;!?\n]{0,40})$",
    re.I,
)
_BARE_BEFORE = re.compile(r"(?:^|[\n.:;!?,]|\b(?:so|thus|therefore|hence|and|then))[ \t]*$", re.I)
_PURE_LABEL = re.compile(
    r"^[ \t]*(?:[-•][ \t]*)?(?:(?:option|choice|answer|letter)[ \t]*[:\-]?[ \t]*)?[(\[]?[ \t]*"
    r"(?P<l>[A-Za-z])[ \t]*[)\]]?[ \t]*[.:!]?[ \t]*$",
    re.I | re.M,
)
_LINE_LABEL = re.compile(
    r"^[ \t]*(?:[-•][ \t]*)?(?:\((?P<a>[A-Za-z])\)|\[(?P<b>[A-Za-z])\]|"
    r"(?P<c>[A-Z])[.):])[ \t]*(?P<rest>.*)$"
)
_REVISION = re.compile(
    r"^\W*(?:wait|actually|no\b|correction|on\s+second\s+thought|on\s+(?:closer|further)|"
    r"however|but|hmm|instead|rather|scratch\s+that|upon\s+(?:further|closer)|re-?consider|"
    r"after\s+(?:all|reconsider|further)|i\s+was\s+wrong|let\s+me\s+reconsider)",
    re.I,
)


# a revision sentence that only hedges ("But (A) could also be right") changes no answer
_HEDGED = re.compile(r"\b(?:also|too|as\s+well|equally|could|might|may)\b", re.I)
_BUT = re.compile(r"[^.\n]*?\bbut\s+(?:rather\s+|instead\s+)?(?:(?:it\s+is|it's)\s+)?", re.I)
_OPTION_WORD_REF = re.compile(r"\s*[(\[]?\s*([A-Za-z])\s*[)\]]?(?![\w'])")


def _commitment_at(s: str, m: re.Match, opts: Options) -> tuple[list[str], int] | None:
    """What a marker commits to: ``(letters, end)``, or None (nothing, or a rejection)."""
    pos = m.end()
    weak = _WEAK.match(s, m.start()) is not None and not re.search(
        r"answer|option|choice|letter", m.group(0), re.I
    )
    if re.match(r"not\b", s[pos : pos + 4], re.I):
        # "the answer is not A but B": the part after "but" commits
        but = _BUT.match(s, pos)
        if not but:
            return None
        pos = but.end()
    got = ref_list(s, pos, opts)
    if not got:
        return None
    if weak and not _SENT_END.match(s, got[1]):
        return None  # "so A pretty ...", "it is C-shaped": not a conclusion
    if _REJECTED_NEXT.match(s, got[1]):
        return None  # "I think option B is wrong"
    return got


# before a bare "choose" / "select" / "pick": someone else's choice, a maybe, a negation
_NOT_SPEAKER = re.compile(
    r"\b(?:might|may|could|often|usually|sometimes|typically|to|not|never|\w+n't|someone|"
    r"somebody|people|students|many|most|others|one|you)[ \t]+(?:\w+[ \t]+)?$",
    re.I,
)


def _speaker_commits(line: str, m: re.Match) -> bool:
    """False for a bare "choose"/"select"/"pick" marker that states no choice of the writer:
    "Someone might pick A", "Students often choose A", "I would not choose A"."""
    if not re.match(r"choose|select|pick", m.group(0), re.I):
        return True
    return not _NOT_SPEAKER.search(line[: m.start()])


def _line_spans(s: str) -> list[tuple[int, int]]:
    out, pos = [], 0
    for line in s.split("\n"):
        out.append((pos, pos + len(line)))
        pos += len(line) + 1
    return out


def _echo_lines(s: str, opts: Options) -> set[int]:
    """Indices of lines that merely echo options: "(A) red" lines when there are two or more,
    and single lines holding two or more "label text" pairs ("(A) red (B) blue ...")."""
    lines = s.split("\n")
    single: list[int] = []
    out: set[int] = set()
    for i, line in enumerate(lines):
        m = _LINE_LABEL.match(line)
        if m:
            letter = (m.group("a") or m.group("b") or m.group("c")).upper()
            if opts.texts.get(letter) and norm_text(m.group("rest")) == opts.texts[letter]:
                single.append(i)
                continue
        pairs: set[str] = set()
        rest, pos = [], 0
        for m in LABEL_ANY.finditer(line):
            k = (m.group(1) or m.group(2)).upper()
            end = opts.own_text_after(line, k, m.end())
            if end and m.start() >= pos:
                pairs.add(k)
                rest.append(line[pos : m.start()])
                pos = end
        rest.append(line[pos:])
        # what is left besides the pairs: a short lead-in ("The options are") and separators
        few = len(re.findall(r"[A-Za-z]{2,}", rest[0])) <= 4 and not re.search(
            r"[A-Za-z]{2,}", re.sub(r"\b(?:and|or)\b", " ", " ".join(rest[1:]))
        )
        if len(pairs) >= 2 and few and not _MARKER.search(line):
            out.add(i)
    if len(single) >= 2:
        out.update(single)
    return out


def _commitments(s: str, opts: Options, echo: set[int]) -> list[tuple[int, list[str], str]]:
    """Every explicit commitment: ``(position, letters, rule)`` in text order."""
    found: list[tuple[int, list[str], str]] = []
    spans = _line_spans(s)
    for i, (a, b) in enumerate(spans):
        if i not in echo:
            line = s[a:b]
            found += _marker_commitments(line, a, opts)
            found += _declared_right(line, a, opts)
            found += _label_line(line, a, opts)
            text_line = _label_text_line(line, opts)
            if text_line and not _walk_goes_on(s, spans[i + 1 :], text_line, opts):
                found.append((a, [text_line], "label line"))
    lead = _first_line_lead(s, spans, opts, echo)
    if lead and not any(p == lead[0] for p, _, _ in found):
        found.append(lead)
    found.sort(key=lambda x: x[0])
    return found


# "B is the answer: ...": the marker is said of the option before it
_IS_BEFORE = re.compile(r"[ \t]+(?:is|was)[ \t]+$", re.I)
_REF_END = re.compile(
    r"(?:\(\s*[A-Za-z]\s*\)|\[\s*[A-Za-z]\s*\]|(?<![\w'])[A-Z]|\b(?:option|choice)\s+[A-Za-z])$",
    re.I,
)


def _said_of_option(before: str, opts: Options) -> bool:
    """True when ``before`` ends with an option and "is" ("B is", "(B) is", "Blue is")."""
    m = _IS_BEFORE.search(before)
    if not m:
        return False
    head = before[: m.start()]
    return bool(_REF_END.search(head)) or any(e == len(head) for _, e, _ in opts.find_texts(head))


def _marker_commitments(line: str, a: int, opts: Options) -> list[tuple[int, list[str], str]]:
    """Commitments that follow a marker ("Answer: b", "the answer is (D)", "I'd go with A") on
    ``line`` (which starts at ``a``), outside hypotheticals and other people's choices."""
    out = []
    for m in _MARKER.finditer(line):
        before = line[: m.start()]
        if _HYPOTHETICAL.search(before) or _said_of_option(before, opts):
            continue
        got = _commitment_at(line, m, opts)
        if got and _speaker_commits(line, m):
            out.append((a + m.start(), got[0], "commitment"))
    return out


# "(A) would be right for cities", "(C) is correct if ...": right only under a condition
_CONDITION_AFTER = re.compile(
    r"[ \t]+(?:for|if|when|whenever|in\s+(?:a|an|another|other|some)|under|unless|only\s+if)\b",
    re.I,
)


def _declared_right(line: str, a: int, opts: Options) -> list[tuple[int, list[str], str]]:
    """Options declared right on ``line``: "(B) is correct", "Option C is the best answer",
    "D is the answer"; not negated, hypothetical or conditional ("(A) would be right for ...")."""
    out = []
    for m in re.finditer(r"\b(?:option|choice)\b|\(|\[|\b[A-Z](?![\w'])", line, re.I):
        if m.group(0).isalpha() and len(m.group(0)) == 1:
            if not m.group(0).isupper() or not _BARE_BEFORE.search(line[: m.start()]):
                continue
        ref = ref_at(line, m.start(), opts) if not opts.text_at(line, m.start()) else None
        if ref is None:
            got = (
                _OPTION_WORD_REF.match(line, m.end())
                if m.group(0).lower() in ("option", "choice")
                else None
            )
            if not got or got.group(1).upper() not in opts.letters:
                continue
            ref = (got.group(1).upper(), got.end())
        right = _IS_CORRECT.match(line, ref[1])
        if (
            right
            and not _CONDITION_AFTER.match(line, right.end())
            and not _HYPOTHETICAL.search(line[: m.start()])
            and not re.search(r"\bnot\s+$", line[: m.start()], re.I)
        ):
            out.append((a + m.start(), [ref[0]], "commitment"))
    return out


# a label that opens a line: "(A)", "[A]", "A." / "A)" / "A:" / "A -", "Option D:", "Answer: (B)"
_LABEL_HEAD = re.compile(
    r"[ \t]*(?:[-•][ \t]*)?(?:(?:final[ \t]+)?answer[ \t]*[:\-]?[ \t]*)?"
    r"(?:\([ \t]*(?P<a>[A-Za-z])[ \t]*\)|\[[ \t]*(?P<b>[A-Za-z])[ \t]*\]|(?-i:(?P<c>[A-Z]))[ \t]*[.):\-]"
    r"|(?:option|choice)[ \t]*[(\[]?[ \t]*(?P<d>[A-Za-z])[ \t]*[)\]]?[ \t]*[.:\-]?)",
    re.I,
)


def _label_text_line(line: str, opts: Options) -> str | None:
    """The letter of a line that is one label with that option's own text and nothing else
    ("(A) Mitochondria", "Option D: Golgi apparatus."), else None. Two or more such lines are an
    echoed list (:func:`_echo_lines`)."""
    lh = _LABEL_HEAD.match(line)
    if not lh:
        return None
    letter = next(g for g in lh.groups() if g).upper()
    end = opts.own_text_after(line, letter, lh.end()) if letter in opts.letters else None
    if end and re.fullmatch(r"[ \t]*[.!]?[ \t]*", line[end:]):
        return letter
    return None


def _walk_goes_on(s: str, later: list[tuple[int, int]], letter: str, opts: Options) -> bool:
    """True when the next line that opens with a label names the option after ``letter``: the
    label line heads a per-option walk ("A. Mitochondria" / "B. Nucleus: ..."), not an answer
    followed by why the others fail ("B. Nucleus" / "A. Mitochondria: ...")."""
    i = opts.letters.index(letter)
    for a, b in later:
        m = _LINE_LABEL.match(s[a:b]) or _LABEL_HEAD.match(s[a:b])
        if m:
            return next(g for g in m.groups() if g).upper() in opts.letters[i + 1 : i + 2]
    return False


def _label_line(line: str, a: int, opts: Options) -> list[tuple[int, list[str], str]]:
    """A line that is only an option label ("B", "(b)", "**Option C**"), or only several
    ("(A) and (D)": a multi-option commitment)."""
    pl = _PURE_LABEL.match(line)
    if pl and pl.group("l").upper() in opts.letters:
        return [(a, [pl.group("l").upper()], "label line")]
    lead = len(line) - len(line.lstrip(" \t-•"))
    got = ref_list(line, lead, opts) if line.strip() else None
    if got and len(got[0]) > 1 and re.fullmatch(r"[\s.!,;]*", line[got[1] :]):
        return [(a, got[0], "label line")]
    return []


# what ends the clause of an option a line opens with
_LEAD_BREAK = re.compile(
    r"[ \t]*(?:[.!;](?=\s|$)|[—–]|-(?=[ \t])|$"
    r"|,(?=[ \t]*(?:since|because|as|not|given|while|whereas|due)\b))",
    re.I,
)
# what right after a leading option takes it back or hedges it
_HEDGE_OR_CHANGE = re.compile(
    r"(?:or|maybe|perhaps|possibly|wait|actually|hmm|no(?=[ \t]*[,.;!—–]|[ \t]+wait)|"
    r"on\s+second\s+thought|"
    r"correction|scratch\s+that)\b",
    re.I,
)
_HEDGE = re.compile(r"(?:or|maybe|perhaps|possibly)\b", re.I)
_WORD_LEAD = re.compile(r"[ \t]*(?:[-•][ \t]*)?(?:option|choice)[ \t]*(?P<c>[A-Za-z])\b", re.I)
_BARE_LEAD = re.compile(
    r"[ \t]*(?:[-•][ \t]*)?(?P<c>[A-Z])(?=[ \t]*(?:[;—–]|-[ \t]"
    r"|,[ \t]*(?:since|because|as|not|given|while|whereas|due)\b))"
)


def _lead_at(line: str, opts: Options) -> tuple[str, int, str] | None:
    """The option a line opens with: ``(letter, end, rule)``. A letter label ("C.", "(B) blue",
    "B; ...", "Option C. ..."), its own text included, or an option's text that ends its clause
    ("Mitochondria. ...", "Paris, Texas; ..."); numeric texts are list numbers here, never
    leads."""
    m = _LINE_LABEL.match(line)
    if m:
        letter = (m.group("a") or m.group("b") or m.group("c")).upper()
        start = m.start("rest")
        return letter, opts.own_text_after(line, letter, start) or start, "label line"
    m = _BARE_LEAD.match(line) or _WORD_LEAD.match(line)
    if m and _LEAD_BREAK.match(line, m.end()) and line[m.end() :].strip():
        return m.group("c").upper(), m.end(), "label line"
    hit = opts.text_at(line, len(line) - len(line.lstrip(" \t-•")))
    if hit and not _NUMERIC.fullmatch(opts.texts[hit[0]]) and _LEAD_BREAK.match(line, hit[1]):
        return hit[0], hit[1], "text line"
    return None


def _parallel_leads(s: str, spans, echo: set[int], opts: Options, letter: str, pos: int) -> bool:
    """True when a sentence after ``pos`` opens with another option the way a per-option list
    does: a letter label that does not reject it ("B. ...", "(C) fits") or an option's text
    ending its clause ("Red: ...")."""
    for i, (a, b) in enumerate(spans):
        if i in echo or b <= pos:
            continue
        for m in _SENTENCE.finditer(s, max(a, pos), b):
            sent = m.group(0).strip().lstrip(".;:,!?—–- \t")
            lab = _LINE_LABEL.match(sent) or _PURE_LABEL.match(sent)
            if lab and next(g for g in lab.groups() if g).upper() != letter:
                if not _REJECT_AFTER.match(lab.groupdict().get("rest") or ""):
                    return True
            hit = opts.text_at(sent, len(sent) - len(sent.lstrip(" \t-•")))
            if hit and hit[0] != letter and _PARALLEL_END.match(sent, hit[1]):
                return True
    return False


_ANSWER_HEADING = re.compile(r"[ \t]*(?:final[ \t]+)?answer[ \t]*:?[ \t]*$", re.I)
_PARALLEL_END = re.compile(r"[ \t]*(?:[.:;!]|[—–]|-\s|$)")


def _tail_keeps_lead(line: str, end: int, letter: str, opts: Options) -> bool:
    """Whether what follows a leading option (``line[end:]``) leaves it the answer: not when it
    takes it back or hedges in the same sentence ("Nucleus — wait, no, the mitochondria", "B,
    or maybe C"), hedges towards another option in the next ("The nucleus. Or maybe the
    ribosome"), rejects, describes or weighs it ("(A) is wrong", "(B) shows ...", "(A) is
    tempting"), or names another option in the lead's own clause ("(A) red and (C) green")."""
    tail = line[end:]
    body = tail.lstrip(" \t.;:,—–-")
    if re.search(r"[.!?]$", line[: len(line) - len(body)].rstrip()):
        # a new sentence: a revision is read as one later ("B. Wait, (A) is better")
        nxt = _SENTENCE.match(body)
        if _HEDGE.match(body) and nxt and set(_mentions(nxt.group(0), opts)[0]) - {letter}:
            return False
    elif _HEDGE_OR_CHANGE.match(body):
        return False
    if (r := ref_at(body, 0, opts)) is not None and r[0] != letter:
        return True  # the tail is about another option
    if not _LEAD_BREAK.match(tail) and (
        _LEAD_REJECTED.match(tail) or _DESCRIBES.match(tail) or _CONSIDERED_AFTER.match(tail)
    ):
        return False
    brk = _LEAD_BREAK.search(tail)
    return not set(_mentions(line[: end + brk.start()], opts)[0]) - {letter}


def _first_line_lead(
    s: str, spans: list[tuple[int, int]], opts: Options, echo: set[int]
) -> tuple[int, list[str], str] | None:
    """The option the first line (after echoed options) opens with, when a reader takes it as
    the answer (see :func:`_lead_at`; an option's text only with more text after it):
    ``(position, [letter], rule)``. None when it opens a list ("(A) and (C) are both
    possible"), is rejected, described or hedged ("(A) is wrong", "(B) shows ...", "B, or maybe
    C"), its clause names another option, or the response goes through options one by one
    (another labelled line, or a parallel sentence: :func:`_parallel_leads`)."""
    lines = [i for i, (a, b) in enumerate(spans) if i not in echo and s[a:b].strip()]
    if lines and _ANSWER_HEADING.match(s[slice(*spans[lines[0]])]):
        lines = lines[1:]  # "### Answer" / "Answer:" on a line of its own
    if not lines:
        return None
    a, b = spans[lines[0]]
    line = s[a:b]
    got = _lead_at(line, opts)
    if not got or got[0] not in opts.letters:
        return None
    letter, end, rule = got
    if any(_LINE_LABEL.match(s[x:y]) for x, y in (spans[i] for i in lines[1:])):
        return None
    if rule == "text line" and not re.search(r"\w", s[a + end :]):
        return None  # the whole response is the option's text: the sentence rule reads it
    refs = ref_list(line, len(line) - len(line.lstrip(" \t-•")), opts)
    if refs and len(refs[0]) > 1:
        return None
    if not _tail_keeps_lead(line, end, letter, opts):
        return None
    if _parallel_leads(s, spans, echo, opts, letter, a + end):
        return None
    return a, [letter], rule


_CLAUSE_CUT = re.compile(
    r"\b(?:because|since|whereas|while|due\s+to|given\s+that|as\s+it|"
    r"as\s+the)\b|,\s*as\b",
    re.I,
)
_DISCUSS_LEAD = re.compile(
    r"^\W*(?:\d+[.)]\s*)?(?:(?:if|assuming|suppose|when)\b|(?:for|in|with|regarding|considering|"
    r"consider|looking\s+at|look\s+at|examining|examine|analy[sz]ing|evaluating|evaluate|about|"
    r"let's\s+(?:look\s+at|consider|examine|check|evaluate|analy[sz]e)|now|next|first|second|"
    r"third|checking|check|comparing|compare)\s*,?\s+(?:the\s+)?(?:options?\b|choices?\b|"
    r"\(\s*[A-Za-z]\s*\)|[A-Z][.):\s]))",
    re.I,
)
_DESCRIBES = re.compile(
    r"^\s*(?:suggests|states|says|shows|represents|refers|involves|mentions|proposes|"
    r"claims|indicates|lists|is\s+about|talks|would\s+mean|means|implies|focuses|"
    r"argues|assumes)\b|^\s*:\s|^\s+[-–]\s",
    re.I,
)
# options weighed, not chosen: "(A) is tempting", "red is a common distractor", "I considered B"
_CONSIDERED_AFTER = re.compile(
    r"^[^.;!?]{0,30}?\b(?:(?:is|are|seems?|looks?|sounds?)\s+(?:also\s+|quite\s+|very\s+)?"
    r"(?:tempting|attractive|close|a\s+close\s+second|a\s+(?:common\s+|likely\s+|classic\s+)?"
    r"(?:distractor|trap|mistake))|(?:might|may|could)\s+(?:seem|look|appear|sound)\s+"
    r"(?:right|correct|plausible|tempting|attractive))\b",
    re.I,
)
_CONSIDERED_BEFORE = re.compile(
    r"\b(?:considered|considering|compared\s+(?:to|with)|versus|vs\.?|(?:tempted\s+to|might|"
    r"may|could|often|usually|sometimes)\s+(?:pick|choose|select|say|go\s+with))\s+"
    r"(?:(?:the|option|choice)\s+)*$",
    re.I,
)
_REJECT_BEFORE = re.compile(
    r"(?:\b(?:not|than|instead\s+of|rather\s+than|unlike|except|nor|neither|exclude|excluding|"
    r"over|eliminate|eliminating|rule\s+out|(?:not|never|\w+n't)\s+(?:choose|select|pick|go\s+with))"
    r"|\b(?:cannot|can't|couldn't|could\s+not|isn't|is\s+not|"
    r"wasn't|won't|shouldn't)\s+be|\bisn't|\bis\s+not)\s+(?:(?:by|from|in|at|of|the|a|an|option|"
    r"choice|really|exactly|quite|necessarily)\s+)*$",
    re.I,
)
_REJECTS = (
    r"\b(?:(?:is|are|seems|appears)\s+(?:also\s+)?(?:incorrect|wrong|not|false|"
    r"unlikely|ruled\s+out|eliminated|irrelevant|inconsistent)|isn't|aren't|can\s+be\s+"
    r"(?:ruled\s+out|eliminated|excluded|discarded)|cannot|can't|does\s+not|doesn't|do\s+not|"
    r"don't|fails?|would\s+not|wouldn't|is\s+too|are\s+too|contradicts|doesn't)\b"
)
_REJECT_AFTER = re.compile(r"^[^.;!?]{0,40}?" + _REJECTS, re.I)
_REJECTED_NEXT = re.compile(r"[ \t]*" + _REJECTS, re.I)
# a rejection of a leading option: in its own clause, before any comma ("B. I considered red
# as well, but it fails" rejects red, not B)
_LEAD_REJECTED = re.compile(r"^[^.;!?,]{0,40}?" + _REJECTS, re.I)
# an option and what would follow from it: "(B) would show pores", "A ($1,200) would be the
# total for ten items"; not "B would be correct" (a declaration, see _declared_right)
_COUNTERFACTUAL = re.compile(
    r"^[ \t]*[)\]]?[ \t,]*would[ \t]+(?!(?:also[ \t]+|still[ \t]+)?be[ \t]+(?:the[ \t]+)?"
    r"(?:correct|right|best|answer|true|my)\b)(?:not[ \t]+)?[a-z]",
    re.I,
)
_SENTENCE = re.compile(r"[^\n]+?(?:[.!?](?=\s|$)|$)", re.M)


_BRACKET_REF = re.compile(r"\(\s*([A-Z])\s*\)|\[\s*([A-Z])\s*\]")
_WORD_REF = re.compile(r"\b(?:option|choice)s?\s*:?\s*", re.I)
_BARE_PAIR = re.compile(
    r"(?<![\w'])([A-Z])(?:\s*,\s*|\s*,?\s+(?:and|or(?:\s+(?:maybe|perhaps|possibly|probably))?)\s+)"
    r"([A-Z])(?![\w'])"
)
_NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")  # "1,200"; not the comma after "1000, "
_NUMERIC = re.compile(r"[\d.,\s%]+")
_OPERATOR_AFTER = re.compile(r"^\s*[=+*/^×÷<>]|^\s+-\s")
_OPERATOR_BEFORE = re.compile(r"[+*/^×÷]\s*$|\s-\s*$")


def _merge_label_text(clause: str, spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Sorted mention spans with a label and its own option's text side by side ("the nucleus
    (B)", "(B) the nucleus") joined into one mention, read by what is around both."""
    out: list[tuple[int, int, str]] = []
    for s0, e0, k in spans:
        if out and out[-1][2] == k and re.fullmatch(r"[ \t,:\-–—]*", clause[out[-1][1] : s0]):
            out[-1] = (out[-1][0], max(e0, out[-1][1]), k)
        else:
            out.append((s0, e0, k))
    return out


def _mentions(clause: str, opts: Options) -> tuple[list[str], list[str], list[str], bool]:
    """Letters named in ``clause``: ``(named, rejected, discussed, starts_with_ref)``.

    A mention is a bracketed capital "(C)", "option c" / "options B and D", two capitals joined
    by "and" / "or" / a comma ("between B and C"), or an option's full text. Rejected: "not (A)",
    "rather than red", "(B) can be ruled out". Discussed: "option A shows ...", "(A) suggests".
    Numeric option texts count only where every number of the clause is an option text, and no
    option text counts as an operand ("x^2 =", "1,200 + 300").
    """
    spans: list[tuple[int, int, str]] = []
    for m in _BRACKET_REF.finditer(clause):
        spans.append((m.start(), m.end(), (m.group(1) or m.group(2))))
    for m in _WORD_REF.finditer(clause):
        got = ref_list(clause, m.end(), opts)
        if got:
            for k in got[0]:
                spans.append((m.start(), got[1], k))
    for m in _BARE_PAIR.finditer(clause):
        if m.group(1) in opts.letters and m.group(2) in opts.letters:
            spans.append((m.start(1), m.end(1), m.group(1)))
            spans.append((m.start(2), m.end(2), m.group(2)))
    texts = opts.find_texts(clause)
    numbers = [(m.start(), m.end()) for m in _NUMBER.finditer(clause)]
    numeric = [t for t in texts if _NUMERIC.fullmatch(opts.texts[t[2]])]
    if any(not any(a <= n0 and n1 <= b for a, b, _ in numeric) for n0, n1 in numbers):
        texts = [t for t in texts if t not in numeric]
    texts = [
        t
        for t in texts
        if not _OPERATOR_AFTER.match(clause[t[1] :]) and not _OPERATOR_BEFORE.search(clause[: t[0]])
    ]
    spans.extend(texts)
    spans = _merge_label_text(clause, sorted(x for x in spans if x[2] in opts.letters))
    named, rejected, discussed = [], [], []
    for s0, e0, k in spans:
        if _REJECT_BEFORE.search(clause[:s0]) or _REJECT_AFTER.match(clause[e0:]):
            rejected.append(k)
        elif (
            _DESCRIBES.match(clause[e0:])
            or _COUNTERFACTUAL.match(clause[e0:])
            or _CONSIDERED_AFTER.match(clause[e0:])
            or _HYPOTHETICAL.search(clause[:s0])
            or _CONSIDERED_BEFORE.search(clause[:s0])
        ):
            discussed.append(k)
        else:
            named.append(k)
    lead = bool(spans) and not clause[: spans[0][0]].strip(" \t-•*:#0123456789.)")
    return named, rejected, discussed, lead


def _sentences(s: str, opts: Options, echo: set[int]) -> list[dict[str, Any]]:
    """The sentences outside echo lines, each with its named / rejected letters and kind."""
    out: list[dict[str, Any]] = []
    for i, (a, b) in enumerate(_line_spans(s)):
        if i in echo:
            continue
        for m in _SENTENCE.finditer(s[a:b]):
            sent = m.group(0).strip()
            if not sent:
                continue
            cut = _CLAUSE_CUT.search(sent)
            main = sent[: cut.start()] if cut and cut.start() > 0 else sent
            named, rejected, discussed, lead = _mentions(main, opts)
            _, all_rejected, _, _ = _mentions(sent, opts)
            after_lead = ""
            if lead:
                r = ref_at(main, len(main) - len(main.lstrip(" \t-•*:#0123456789.)")), opts)
                after_lead = main[r[1] :] if r else ""
            discuss = bool(_DISCUSS_LEAD.match(sent)) or (
                lead and bool(_DESCRIBES.match(after_lead))
            )
            out.append(
                {
                    "pos": a + m.start(),
                    "text": sent,
                    "named": list(dict.fromkeys(named)),
                    "rejected": rejected + all_rejected,
                    "discussed": discussed,
                    "lead": lead,
                    "discuss": discuss,
                    "question": sent.endswith("?"),
                    "revision": bool(_REVISION.match(sent)) and not _HEDGED.search(sent),
                }
            )
    # a per-option list: two or more sentences opening with different options
    leads = {x["named"][0] for x in out if x["lead"] and x["named"]}
    if len(leads) >= 2:
        for x in out:
            if x["lead"]:
                x["discuss"] = True
    return out


def parse_strict_detail(
    response: str | None, all_choices: Sequence[str], index2ans: Mapping[str, str]
) -> StrictParse:
    """The strict parse of one multiple-choice response, with its status and rule.

    ``all_choices``: the option letters (``["A", "B", ...]``); ``index2ans``: letter -> option
    text. Deterministic (no randomness), a pure function of its arguments. See the comment block
    above and docs/mmmu.md for the rules.
    """
    if response is None or not str(response).strip():
        return StrictParse(None, NO_ANSWER, "empty")
    opts = Options(all_choices, index2ans)
    # runs of spaces and tabs read as one space: option texts match across them
    s = re.sub(r"[^\S\n]+", " ", read_references(clean_text(str(response)), opts))
    if not s.strip():
        return StrictParse(None, NO_ANSWER, "reasoning only")
    echo = _echo_lines(s, opts)
    sents = _sentences(s, opts, echo)

    found = _commitments(s, opts, echo)
    if found:
        pos, letters, rule = found[-1]
        # a later revision that names one other option ("Wait, actually (C) fits better")
        for x in sents:
            if (
                x["pos"] > pos
                and x["revision"]
                and len(x["named"]) == 1
                and not x["question"]
                and x["named"][0] not in letters
            ):
                return StrictParse(x["named"][0], "answer", "revision")
        if len(letters) == 1:
            return StrictParse(letters[0], "answer", rule)
        return StrictParse(None, AMBIGUOUS, "multi-option commitment")

    naming = [x for x in sents if x["named"] and not x["discuss"] and not x["question"]]
    if naming:
        last = naming[-1]
        singles = [x for x in naming if len(x["named"]) == 1]
        if len(last["named"]) == 1:
            distinct = {x["named"][0] for x in singles}
            if len(distinct) == 1 or last["revision"]:
                return StrictParse(last["named"][0], "answer", "sentence")
        return StrictParse(None, AMBIGUOUS, "several options")
    # options left standing, and every option a per-option analysis went through
    named = {
        k
        for x in sents
        for k in x["named"] + x["discussed"] + (x["rejected"] if x["discuss"] else [])
    }
    if len(named) >= 2:
        return StrictParse(None, AMBIGUOUS, "several options discussed")
    if echo and not named:
        return StrictParse(None, NO_ANSWER, "echoed options only")
    return StrictParse(None, NO_ANSWER, "nothing")
