"""Pairing MMMU cells question by question (did the patch change any answer?): the one MMMU pairing.

``pair(baseline, variant)``: the records (as written to ``records.jsonl``) of the baseline cell and
of the variant cell, either one repeat each (a list of records) or several repeats each (a list of
lists of records). Before comparing anything :func:`check_pairable` checks that every repeat of
both cells is comparable with the first baseline repeat: the same question ids, the same
``prompt_sha256`` per question, the same parser, official fallback mode (a seeded random pick or
counted unparsed), parser seed, protocol, temperature, max_tokens and other sampling settings;
otherwise :class:`PairingError` (a :class:`patchbench.suite.PairingRefused`) names every
difference, with up to five example questions.

Statistics: a question's correctness in a cell is the share of that cell's repeats in which its
verdict is ``correct`` (0 or 1 with one repeat). It is "right" when that share is above one half,
"wrong" below; exactly one half (an even number of repeats, split) is "unstable" and left out of
the table (counted). Flips: right->wrong (``right_to_wrong``, regressions) and wrong->right
(``wrong_to_right``, improvements). McNemar's exact test (statsmodels ``mcnemar(table,
exact=True)``: a two-sided binomial test on the discordant questions) gives the p-value. Verdict:
"no significant change" unless p < alpha (0.05), then "improved" (more wrong->right) or
"regressed"; "incomplete" whenever a request failed in any repeat of either cell (no verdict on a
partial run). Questions that failed anywhere are left out of the table and counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from patchbench.suite import PairingRefused
from patchbench.suites.mmmu.data import subject_of

Record = Mapping[str, Any]


class PairingError(PairingRefused, ValueError):
    """Two cells that must not be paired; the message says what differs (every difference)."""


def _examples(items: Iterable[Any], k: int = 5) -> str:
    items = list(items)
    more = f" (+{len(items) - k} more)" if len(items) > k else ""
    return ", ".join(map(str, items[:k])) + more


def _values(records: Sequence[Record], get) -> set[str]:
    return {json.dumps(get(r), sort_keys=True) for r in records}


def _fallback_mode(records: Sequence[Record]) -> str | None:
    """The official parser's fallback mode of one cell: ``official_fallback`` where recorded;
    else read off the records (a fallback with a parsed letter: "random"; without: "unparsed");
    None for the strict parser or when no record says."""
    modes = {r.get("official_fallback") for r in records if r.get("parser") == "official"}
    modes.discard(None)
    if modes:
        return ",".join(sorted(modes))
    for r in records:
        if r.get("parser") == "official" and r.get("fallback"):
            return "random" if r.get("parsed") is not None else "unparsed"
    return None


def _sampling(r: Record, key: str | None) -> Any:
    s = r.get("sampling") or {}
    if key is None:
        return {k: v for k, v in s.items() if k not in ("temperature", "max_tokens")}
    return s.get(key)


#: (label, getter) of every per-cell setting two paired cells must share
_SETTINGS = (
    ("parser", lambda r: r.get("parser")),
    ("official fallback mode", None),
    ("parser seed", lambda r: r.get("parser_seed")),
    ("protocol", lambda r: r.get("protocol")),
    ("temperature", lambda r: _sampling(r, "temperature")),
    ("max_tokens", lambda r: _sampling(r, "max_tokens")),
    ("other sampling settings", lambda r: _sampling(r, None)),
)


def _as_repeats(cell: Sequence[Any], side: str) -> list[list[Record]]:
    """One repeat (a list of records) or several (a list of lists) -> a list of repeats."""
    cell = list(cell)
    if not cell:
        raise ValueError(f"no MMMU records to pair ({side} is empty)")
    if all(isinstance(x, Mapping) for x in cell):
        return [cell]
    if all(isinstance(x, (list, tuple)) for x in cell):
        reps = [list(x) for x in cell]
        if any(not x for x in reps):
            raise ValueError(f"no MMMU records to pair ({side} has an empty repeat)")
        return reps
    raise ValueError(f"{side}: expected a list of records or a list of repeats (lists of records)")


def _cell_problems(ref: list[Record], other: list[Record], name: str) -> list[str]:
    problems: list[str] = []
    ids_r = [r["id"] for r in ref]
    ids_o = [r["id"] for r in other]
    if len(set(ids_o)) != len(ids_o):
        problems.append(f"a question id appears twice in {name}")
    only_r, only_o = sorted(set(ids_r) - set(ids_o)), sorted(set(ids_o) - set(ids_r))
    if only_r or only_o:
        problems.append(
            f"question lists differ: {len(only_r)} only in a ({_examples(only_r)}), "
            f"{len(only_o)} only in {name} ({_examples(only_o)})"
        )
    by_o = {r["id"]: r for r in other}
    diff_prompt = [
        r["id"]
        for r in ref
        if r["id"] in by_o and r.get("prompt_sha256") != by_o[r["id"]].get("prompt_sha256")
    ]
    if diff_prompt:
        problems.append(
            f"prompts differ (prompt_sha256) for {len(diff_prompt)} questions: "
            f"{_examples(diff_prompt)}"
        )
    for label, get in _SETTINGS:
        if get is None:
            fa, fo = _fallback_mode(ref), _fallback_mode(other)
            if fa != fo and fa is not None and fo is not None:
                problems.append(f"{label} differ: a {fa!r} vs {name} {fo!r}")
            continue
        sa, so = _values(ref, get), _values(other, get)
        if sa != so:
            problems.append(
                f"{label} differ: a {', '.join(sorted(sa))} vs {name} {', '.join(sorted(so))}"
            )
    return problems


def check_pairable(baseline: Sequence[Any], variant: Sequence[Any]) -> None:
    """Raise :class:`PairingError` naming every difference that forbids pairing.

    ``baseline`` / ``variant``: one repeat (a list of records) or a list of repeats. Every repeat
    is checked against the first baseline repeat ("a"); the other side is named "b" (or
    "a[k]" / "b[k]" for repeat k when there are several).
    """
    reps_a, reps_b = _as_repeats(baseline, "a"), _as_repeats(variant, "b")
    ref = reps_a[0]
    problems: list[str] = []
    if len({r["id"] for r in ref}) != len(ref):
        problems.append("a question id appears twice in a")
    for k, rep in enumerate(reps_a[1:], start=1):
        problems += _cell_problems(ref, rep, f"a[{k}]")
    for k, rep in enumerate(reps_b):
        problems += _cell_problems(ref, rep, "b" if len(reps_b) == 1 else f"b[{k}]")
    if problems:
        raise PairingError("cannot pair these MMMU cells: " + "; ".join(problems))


def _state(share: float) -> str:
    return "right" if share > 0.5 else "wrong" if share < 0.5 else "unstable"


def pair(
    baseline: Sequence[Any], variant: Sequence[Any], *, alpha: float = 0.05, max_changed: int = 200
) -> dict[str, Any]:
    """Paired comparison of two MMMU cells over their repeats (see module docstring).

    Args: ``baseline`` and ``variant``: each one repeat (a list of records) or a list of repeats
    (lists of records, e.g. ``[read_jsonl(d / "records.jsonl") for d in repeat_dirs]``); alpha:
    the McNemar significance level; max_changed: at most this many ``changed`` entries.

    Returns a dict:

    - ``repeats_a``, ``repeats_b``: repeats on each side;
    - ``n_paired``: questions in the table (answered in every repeat, not unstable);
      ``n_failed_either``: questions whose request failed in some repeat of either cell;
      ``n_unstable``: questions right in exactly half of one cell's repeats;
    - ``both_right``, ``both_wrong``, ``right_to_wrong``, ``wrong_to_right``: the 2x2 table;
      ``flips`` = right_to_wrong + wrong_to_right (the discordant count);
    - ``mcnemar_p``: McNemar exact p over the table (None when it is empty);
    - ``acc_a``, ``acc_b``: mean per-question correctness (averaged over repeats) over the
      questions answered everywhere (unstable ones included);
    - ``questions``: ``{id: {"subject", "acc_a", "acc_b"}}``: per-question correctness averaged
      over repeats (0..1), every question answered everywhere;
    - ``flipped``: ``[{"id", "subject", "acc_a", "acc_b", "direction"}]``, the discordant
      questions (direction "right_to_wrong" | "wrong_to_right");
    - ``subjects``: ``{subject: {"n", "acc_a", "acc_b", "right_to_wrong", "wrong_to_right"}}``;
    - ``identical_responses``, ``identical_response_share``: identical response strings over
      the (question, repeat k) pairs of baseline repeat k and variant repeat k, k below the
      smaller repeat count (questions answered everywhere);
    - ``changed``: ``[{"id", "verdict_a", "verdict_b", "response_a", "response_b"}]`` for the
      questions whose repeat-0 responses differ (responses cut to 200 characters, at most
      ``max_changed`` entries), ``changed_count`` (all of them);
    - ``unstable_a``, ``unstable_b``: questions whose verdict differs between repeats of a cell;
    - ``verdict``: "improved" | "regressed" | "no significant change" | "incomplete";
      ``alpha``.

    Raises :class:`PairingError` when the cells are not comparable and ValueError when a side
    is empty or malformed.
    """
    reps_a, reps_b = _as_repeats(baseline, "a"), _as_repeats(variant, "b")
    check_pairable(reps_a, reps_b)
    maps_a = [{r["id"]: r for r in rep} for rep in reps_a]
    maps_b = [{r["id"]: r for r in rep} for rep in reps_b]
    tally = _Tally(n_aligned=min(len(reps_a), len(reps_b)))
    for qid in (r["id"] for r in reps_a[0]):
        tally.add(qid, [m[qid] for m in maps_a], [m[qid] for m in maps_b])
    return tally.result(len(reps_a), len(reps_b), alpha, max_changed)


@dataclass
class _Tally:
    """The per-question counts of :func:`pair`, added question by question (:meth:`add`)."""

    n_aligned: int  # repeats k compared response by response (baseline k with variant k)
    table: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("both_right", "both_wrong", "right_to_wrong", "wrong_to_right"), 0
        )
    )
    failed_either: int = 0
    unstable: int = 0
    identical: int = 0
    compared: int = 0
    unstable_a: int = 0
    unstable_b: int = 0
    questions: dict[str, dict[str, Any]] = field(default_factory=dict)
    flipped: list[dict[str, Any]] = field(default_factory=list)
    subjects: dict[str, dict[str, Any]] = field(default_factory=dict)
    changed: list[dict[str, Any]] = field(default_factory=list)

    def add(self, qid: str, ra: list[Record], rb: list[Record]) -> None:
        """Count question ``qid``: its record in every baseline repeat (``ra``) and every
        variant repeat (``rb``)."""
        va, vb = [r["verdict"] for r in ra], [r["verdict"] for r in rb]
        if "failed" in va or "failed" in vb:
            self.failed_either += 1
            return
        subject = ra[0].get("subject") or subject_of(qid)
        share_a = mean(v == "correct" for v in va)
        share_b = mean(v == "correct" for v in vb)
        self.unstable_a += len({v == "correct" for v in va}) > 1
        self.unstable_b += len({v == "correct" for v in vb}) > 1
        self.questions[qid] = {"subject": subject, "acc_a": share_a, "acc_b": share_b}
        self._responses(qid, ra, rb)
        sa, sb = _state(share_a), _state(share_b)
        sub = self.subjects.setdefault(
            subject, {"n": 0, "sum_a": 0.0, "sum_b": 0.0, "right_to_wrong": 0, "wrong_to_right": 0}
        )
        sub["n"] += 1
        sub["sum_a"] += share_a
        sub["sum_b"] += share_b
        if "unstable" in (sa, sb):
            self.unstable += 1
            return
        if sa == sb:
            self.table["both_right" if sa == "right" else "both_wrong"] += 1
            return
        direction = "right_to_wrong" if sa == "right" else "wrong_to_right"
        self.table[direction] += 1
        sub[direction] += 1
        self.flipped.append(
            {
                "id": qid,
                "subject": subject,
                "acc_a": share_a,
                "acc_b": share_b,
                "direction": direction,
            }
        )

    def _responses(self, qid: str, ra: list[Record], rb: list[Record]) -> None:
        """Identical responses of the aligned repeats, and the question in ``changed`` when its
        repeat-0 responses differ."""
        for k in range(self.n_aligned):
            self.compared += 1
            self.identical += ra[k].get("response") == rb[k].get("response")
        a, b = ra[0], rb[0]
        if a.get("response") != b.get("response"):
            self.changed.append(
                {
                    "id": qid,
                    "verdict_a": a["verdict"],
                    "verdict_b": b["verdict"],
                    "response_a": (a.get("response") or "")[:200],
                    "response_b": (b.get("response") or "")[:200],
                }
            )

    def result(self, repeats_a: int, repeats_b: int, alpha: float, max_changed: int) -> dict:
        """:func:`pair`'s dict: the counts, McNemar's exact p and the verdict."""
        table, questions = self.table, self.questions
        n = sum(table.values())
        n11, n10 = table["both_right"], table["right_to_wrong"]
        n01, n00 = table["wrong_to_right"], table["both_wrong"]
        from statsmodels.stats.contingency_tables import mcnemar  # 0.8 s: only when compared

        p = float(mcnemar([[n11, n10], [n01, n00]], exact=True).pvalue) if n else None
        if self.failed_either:
            verdict = "incomplete"
        elif p is not None and p < alpha:
            verdict = "improved" if n01 > n10 else "regressed"
        else:
            verdict = "no significant change"
        nq = len(questions)
        return {
            "repeats_a": repeats_a,
            "repeats_b": repeats_b,
            "n_paired": n,
            "n_failed_either": self.failed_either,
            "n_unstable": self.unstable,
            **table,
            "flips": n10 + n01,
            "mcnemar_p": p,
            "acc_a": mean(q["acc_a"] for q in questions.values()) if nq else None,
            "acc_b": mean(q["acc_b"] for q in questions.values()) if nq else None,
            "questions": questions,
            "flipped": self.flipped,
            "subjects": {
                s: {
                    "n": v["n"],
                    "acc_a": v["sum_a"] / v["n"],
                    "acc_b": v["sum_b"] / v["n"],
                    "right_to_wrong": v["right_to_wrong"],
                    "wrong_to_right": v["wrong_to_right"],
                }
                for s, v in sorted(self.subjects.items())
            },
            "identical_responses": self.identical,
            "identical_response_share": (self.identical / self.compared if self.compared else None),
            "changed_count": len(self.changed),
            "changed": self.changed[:max_changed],
            "unstable_a": self.unstable_a,
            "unstable_b": self.unstable_b,
            "verdict": verdict,
            "alpha": alpha,
        }
