"""Scoring MMMU answers: verdict per question, counts and accuracies per subject / domain / overall.

Verdicts (records.jsonl ``verdict``): ``correct`` | ``wrong`` | ``unparsed`` | ``failed``.
``failed``: the request failed (no response). ``unparsed``: a response the parser could not place
(strict parser; official parser with its random pick disabled; an empty open answer); its
``unparsed_kind`` says why: ``no_answer`` (no option given) or ``ambiguous`` (several options left
standing, no single commitment; strict parser only). Each is counted per subject, domain and
overall, as are ``images_unreferenced`` (questions with an image their text never names, sent after
the text) and ``images_not_sent`` (questions with fewer images sent than they have).

Denominators (docs/cases.md M5): accuracy = correct / asked, where asked counts every question sent,
failed and unparsed included (a failed request can never raise the score). ``answered_acc`` =
correct / answered (answered = asked - failed) is reported separately and labelled. Subject,
domain and overall accuracies are all pooled over questions (domain = its subjects' questions
together), never means of means. Intervals: Wilson 95 % (statsmodels ``proportion_confint``,
``method="wilson"``).

File shapes of sglang's ``benchmark/mmmu`` script (``eval_result`` / ``process_result``):
``val_sglang.json`` ``{"Overall-<domain>": {"num", "acc"}, <subject>: {"num", "acc"}, ...,
"Overall": {"num", "acc"}}`` with acc rounded to 3 decimals, domains in the script's order, each
followed by its subjects; ``answer_sglang.json`` ``{id: {"pred_ans", "original_response",
"ground_truth", "question_type", "judge": "Correct"|"Wrong"}}``.
"""

from __future__ import annotations

import pprint
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import patchbench.suites.mmmu.parsers as P
from patchbench.stats import wilson_interval
from patchbench.suites.mmmu.data import DOMAINS, subject_of

PARSERS = ("strict", "official")
VERDICTS = ("correct", "wrong", "unparsed", "failed")


@dataclass
class Scored:
    """The parse of one response: ``parsed`` (a letter, a list of open-answer values, or None),
    ``verdict`` (see module docstring), ``fallback`` (True when the official parser found nothing
    and picked at random, or would have), ``unparsed_kind`` (``"no_answer"`` | ``"ambiguous"`` when
    the verdict is ``unparsed``, else None), ``rule`` (the strict rule that decided, else None)."""

    parsed: Any
    verdict: str
    fallback: bool = False
    unparsed_kind: str | None = None
    rule: str | None = None


def score_response(
    response: str | None,
    *,
    question_type: str,
    gold: Any,
    all_choices: Sequence[str],
    index2ans: Mapping[str, str],
    parser: str,
    rng: random.Random | None,
    failed: bool = False,
) -> Scored:
    """Verdict of one response.

    question_type: "multiple-choice", "open" or "short-answer" (open questions always use the
    official open normalisation, whatever ``parser`` says). parser: "strict" | "official".
    rng: the official parser's random fallback (one draw per fallback); None counts a fallback
    as unparsed. Raises ValueError for an unknown parser or question type.
    """
    if parser not in PARSERS:
        raise ValueError(f"parser {parser!r}: expected one of {', '.join(PARSERS)}")
    if failed or response is None:
        return Scored(None, "failed")
    if P.is_open(question_type):
        if not response.strip():
            return Scored(None, "unparsed", unparsed_kind=P.NO_ANSWER)
        preds = P.parse_open(response)
        return Scored(preds, "correct" if P.eval_open(gold, preds) else "wrong")
    if parser == "strict":
        d = P.parse_strict_detail(response, all_choices, index2ans)
        letter, fallback, kind, rule = d.letter, False, d.status, d.rule
    else:
        letter, fallback = P.parse_official_mc(response, all_choices, index2ans, rng)
        kind, rule = P.NO_ANSWER, None
    if letter is None:
        return Scored(None, "unparsed", fallback, kind, rule)
    return Scored(letter, "correct" if P.eval_mc(gold, letter) else "wrong", fallback, None, rule)


def wilson(k: int, n: int) -> tuple[float | None, float | None]:
    """Wilson 95 % interval of k successes in n (patchbench.stats); (None, None) when n == 0."""
    if n == 0:
        return None, None
    return wilson_interval(k, n, 0.95)


@dataclass
class Tally:
    """Counts of one group of questions; accuracies derived (None when the group is empty)."""

    asked: int = 0
    failed: int = 0
    unparsed: int = 0
    correct: int = 0
    fallbacks: int = 0
    no_answer: int = 0
    ambiguous: int = 0
    images_unreferenced: int = 0
    images_not_sent: int = 0

    @property
    def answered(self) -> int:
        return self.asked - self.failed

    @property
    def acc(self) -> float | None:
        return self.correct / self.asked if self.asked else None

    @property
    def answered_acc(self) -> float | None:
        return self.correct / self.answered if self.answered else None

    def add(
        self,
        verdict: str,
        fallback: bool = False,
        unparsed_kind: str | None = None,
        images_unreferenced: bool = False,
        images_not_sent: bool = False,
    ) -> None:
        """Count one question. An unparsed verdict without ``unparsed_kind`` (records written
        before the kinds existed) counts as ``no_answer``. Raises ValueError for an unknown
        verdict or kind."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict {verdict!r}: expected one of {VERDICTS}")
        self.asked += 1
        self.failed += verdict == "failed"
        self.unparsed += verdict == "unparsed"
        self.correct += verdict == "correct"
        self.fallbacks += bool(fallback)
        if verdict == "unparsed":
            kind = unparsed_kind or P.NO_ANSWER
            if kind not in P.UNPARSED_KINDS:
                raise ValueError(f"unparsed_kind {kind!r}: expected one of {P.UNPARSED_KINDS}")
            self.no_answer += kind == P.NO_ANSWER
            self.ambiguous += kind == P.AMBIGUOUS
        self.images_unreferenced += bool(images_unreferenced)
        self.images_not_sent += bool(images_not_sent)

    def as_dict(self) -> dict[str, Any]:
        lo, hi = wilson(self.correct, self.asked)
        return {
            "asked": self.asked,
            "answered": self.answered,
            "failed": self.failed,
            "unparsed": self.unparsed,
            "no_answer": self.no_answer,
            "ambiguous": self.ambiguous,
            "correct": self.correct,
            "fallbacks": self.fallbacks,
            "images_unreferenced": self.images_unreferenced,
            "images_not_sent": self.images_not_sent,
            "acc": self.acc,
            "acc_ci95": [lo, hi],
            "answered_acc": self.answered_acc,
        }


@dataclass
class Scores:
    """Tallies per subject (domain order), per domain and overall."""

    subjects: dict[str, Tally] = field(default_factory=dict)
    domains: dict[str, Tally] = field(default_factory=dict)
    overall: Tally = field(default_factory=Tally)

    def as_dict(self) -> dict[str, Any]:
        return {
            "overall": self.overall.as_dict(),
            "domains": {k: v.as_dict() for k, v in self.domains.items()},
            "subjects": {k: v.as_dict() for k, v in self.subjects.items()},
        }


def tally(records: Iterable[Mapping[str, Any]]) -> Scores:
    """Pool records (each with ``id`` or ``subject``, ``verdict``; optional ``fallback``,
    ``unparsed_kind``, ``images_unreferenced``, ``n_images`` and ``n_images_sent``)."""
    subj: dict[str, Tally] = {}
    for r in records:
        s = r.get("subject") or subject_of(r["id"])
        not_sent = (
            r.get("n_images") is not None
            and r.get("n_images_sent") is not None
            and r["n_images_sent"] < r["n_images"]
        )
        subj.setdefault(s, Tally()).add(
            r["verdict"],
            r.get("fallback", False),
            r.get("unparsed_kind"),
            bool(r.get("images_unreferenced")),
            not_sent,
        )
    out = Scores()
    for domain, subs in DOMAINS.items():
        present = [s for s in subs if s in subj]
        if not present:
            continue
        d = Tally()
        for s in present:
            t = subj[s]
            out.subjects[s] = t
            for name in (
                "asked",
                "failed",
                "unparsed",
                "correct",
                "fallbacks",
                "no_answer",
                "ambiguous",
                "images_unreferenced",
                "images_not_sent",
            ):
                setattr(d, name, getattr(d, name) + getattr(t, name))
                setattr(out.overall, name, getattr(out.overall, name) + getattr(t, name))
        out.domains[domain] = d
    return out


def val_dict(scores: Scores) -> dict[str, dict[str, Any]]:
    """``val_sglang.json``: per domain then its subjects, then "Overall"; num = asked, acc over
    asked rounded to 3 decimals (the script rounds the same way)."""
    out: dict[str, dict[str, Any]] = {}
    for domain, subs in DOMAINS.items():
        if domain not in scores.domains:
            continue
        d = scores.domains[domain]
        out[f"Overall-{domain}"] = {"num": d.asked, "acc": round(d.acc, 3)}
        for s in subs:
            if s in scores.subjects:
                t = scores.subjects[s]
                out[s] = {"num": t.asked, "acc": round(t.acc, 3)}
    out["Overall"] = {
        "num": scores.overall.asked,
        "acc": round(scores.overall.acc, 3) if scores.overall.asked else 0.0,
    }
    return out


def answer_dict(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``answer_sglang.json``: pred_ans = the parsed letter (multiple-choice) or the raw response
    (open, as the script stored it); failed requests kept with pred_ans None and judge "Wrong"."""
    out = {}
    for r in records:
        open_q = P.is_open(r["question_type"])
        out[r["id"]] = {
            "pred_ans": r["response"] if open_q else r["parsed"],
            "original_response": r["response"],
            "ground_truth": r["gold"],
            "question_type": r["question_type"],
            "judge": "Correct" if r["verdict"] == "correct" else "Wrong",
        }
    return out


def format_block(val: Mapping[str, Any], *, benchmark_time_s: float | None = None) -> str:
    """The PR-style "Accuracy Tests" text of one run, as sglang's script printed it: the
    per-subject dictionary pretty-printed (``pprint``: keys sorted, one per line) and
    ``Overall accuracy: 0.452``."""
    lines = []
    if benchmark_time_s is not None:
        lines.append(f"Benchmark time: {benchmark_time_s}")
    lines.append("answers saved to: ./answer_sglang.json")
    lines.append("Evaluating...")
    lines.append(pprint.pformat({k: {"acc": v["acc"], "num": v["num"]} for k, v in val.items()}))
    lines.append("eval out saved to ./val_sglang.json")
    lines.append(f"Overall accuracy: {val['Overall']['acc']}")
    return "\n".join(lines)
