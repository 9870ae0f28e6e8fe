"""Pairing MMMU cells question by question: the one MMMU pairing (docs/mmmu.md, "Pairing")."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from patchbench import stats
from patchbench.records import read_jsonl
from patchbench.suite import PairingRefused, read_file
from patchbench.suites.mmmu.data import DOMAINS, SUBJECT_DOMAIN, domain_metric, subject_of

Record = Mapping[str, Any]


class PairingError(PairingRefused, ValueError):
    """Two cells that must not be paired; the message names every difference."""


def _examples(items: Iterable[Any], k: int = 5) -> str:
    items = list(items)
    more = f" (+{len(items) - k} more)" if len(items) > k else ""
    return ", ".join(map(str, items[:k])) + more


def _values(records: Sequence[Record], get) -> set[str]:
    return {json.dumps(get(r), sort_keys=True) for r in records}


def _fallback_mode(records: Sequence[Record]) -> str | None:
    """The official parser's fallback mode of one cell: ``official_fallback`` where recorded, else
    read off the records (a fallback with a parsed letter: "random"; without: "unparsed"); None
    for the strict parser or when no record says."""
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
    ("parser seed", lambda r: r.get("parser_seed")),
    ("protocol", lambda r: r.get("protocol")),
    ("temperature", lambda r: _sampling(r, "temperature")),
    ("max_tokens", lambda r: _sampling(r, "max_tokens")),
    ("other sampling settings", lambda r: _sampling(r, None)),
)


def check_pairable(a: Sequence[Record], b: Sequence[Record]) -> None:
    """Raise :class:`PairingError` naming every difference that forbids pairing the records of
    cell ``a`` with those of cell ``b``: question lists, prompts (``prompt_sha256``), parser,
    official fallback mode, parser seed, protocol, sampling. ValueError when a side is empty."""
    for side, recs in (("a", a), ("b", b)):
        if not recs:
            raise ValueError(f"no MMMU records to pair ({side} is empty)")
    problems: list[str] = []
    ids_a, ids_b = [r["id"] for r in a], [r["id"] for r in b]
    for side, ids in (("a", ids_a), ("b", ids_b)):
        if len(set(ids)) != len(ids):
            problems.append(f"a question id appears twice in {side}")
    only_a, only_b = sorted(set(ids_a) - set(ids_b)), sorted(set(ids_b) - set(ids_a))
    if only_a or only_b:
        problems.append(
            f"question lists differ: {len(only_a)} only in a ({_examples(only_a)}), "
            f"{len(only_b)} only in b ({_examples(only_b)})"
        )
    by_b = {r["id"]: r for r in b}
    diff = [
        r["id"]
        for r in a
        if r["id"] in by_b and r.get("prompt_sha256") != by_b[r["id"]].get("prompt_sha256")
    ]
    if diff:
        problems.append(
            f"prompts differ (prompt_sha256) for {len(diff)} questions: {_examples(diff)}"
        )
    for label, get in _SETTINGS:
        sa, sb = _values(a, get), _values(b, get)
        if sa != sb:
            problems.append(
                f"{label} differ: a {', '.join(sorted(sa))} vs b {', '.join(sorted(sb))}"
            )
        if label == "parser":  # the fallback mode is named right after the parser
            fa, fb = _fallback_mode(a), _fallback_mode(b)
            if fa != fb and fa is not None and fb is not None:
                problems.append(f"official fallback mode differ: a {fa!r} vs b {fb!r}")
    if problems:
        raise PairingError("cannot pair these MMMU cells: " + "; ".join(problems))


def pair_repeats(baseline_dirs: list[Path], variant_dirs: list[Path]) -> dict[str, Any] | None:
    """The ``records.jsonl`` of repeat k of each cell (``baseline_dirs[k]``, ``variant_dirs[k]``)
    paired by :func:`pair_records`; a repeat without both files is left out with a note. None
    when no repeat has both."""
    reps_a, reps_b, notes = [], [], []
    for k, (da, db) in enumerate(zip(baseline_dirs, variant_dirs, strict=True)):
        (ra, why_a), (rb, why_b) = (
            read_file(Path(d) / "records.jsonl", read_jsonl) for d in (da, db)
        )
        if ra is None or rb is None:
            notes.append(
                f"paired repeat {k}: not used: " + "; ".join(w for w in (why_a, why_b) if w)
            )
            continue
        reps_a.append(ra)
        reps_b.append(rb)
    return pair_records(reps_a, reps_b, notes) if reps_a else None


def pair_records(
    reps_a: list[list[Record]], reps_b: list[list[Record]], notes: list[str] | None = None
) -> dict[str, Any]:
    """Question-by-question pairing of the baseline (``reps_a``: the records of each repeat) and
    one variant (``reps_b``, as many repeats) over every paired repeat (docs/mmmu.md, "Pairing";
    :class:`PairingError` names a refused repeat). Returns ``{"repeats_used", "n" (questions),
    "n_failed_either", "acc_a", "acc_b", "both_right", "both_wrong", "right_to_wrong",
    "wrong_to_right" (sums over questions of max(a - b, 0) / max(b - a, 0)), "flips",
    "mcnemar_p" (exact McNemar on the rounded counts), "identical_share" (mean over repeats of
    the share of identical responses among the questions that failed in neither cell),
    "accuracy": {metric: {"ids", "baseline", "variant", "cells"}} (overall, answered: questions
    whose request failed in no used repeat, and each domain), "flipped": [{"id", "subject",
    "baseline", "variant"}], "subjects": {subject: {"n", "acc_a", "acc_b", "right_to_wrong",
    "wrong_to_right"}}, "notes"}``."""
    from statsmodels.stats.contingency_tables import mcnemar

    notes = list(notes or [])
    per_q: dict[str, dict[str, Any]] = {}
    ident: list[float] = []
    for k, (ra, rb) in enumerate(zip(reps_a, reps_b, strict=True)):
        try:
            check_pairable(ra, rb)
        except (PairingError, ValueError) as e:
            raise PairingError(f"paired repeat {k}: {e}") from None
        same = _add_repeat(per_q, ra, rb)
        if same:
            ident.append(sum(same) / len(same))
    used = len(reps_a)
    qs = {i: q for i, q in per_q.items() if q["a"]}
    failed = len(per_q) - len(qs)
    ids = sorted(qs)
    a = [sum(qs[i]["a"]) / len(qs[i]["a"]) for i in ids]
    b = [sum(qs[i]["b"]) / len(qs[i]["b"]) for i in ids]
    r2w = sum(max(x - y, 0.0) for x, y in zip(a, b, strict=True))
    w2r = sum(max(y - x, 0.0) for x, y in zip(a, b, strict=True))
    both_r = sum(min(x, y) for x, y in zip(a, b, strict=True))
    both_w = sum(min(1 - x, 1 - y) for x, y in zip(a, b, strict=True))
    n = len(ids)
    table = [[round(both_r), round(r2w)], [round(w2r), round(both_w)]]
    subjects, flipped = _by_subject(ids, qs, a, b)
    if failed:
        notes.append(
            f"{failed} questions failed in every paired repeat (in either cell) and are left out"
        )
    return {
        "repeats_used": used,
        "n": n,
        "n_failed_either": failed,
        "acc_a": sum(a) / n if n else None,
        "acc_b": sum(b) / n if n else None,
        "both_right": both_r,
        "both_wrong": both_w,
        "right_to_wrong": r2w,
        "wrong_to_right": w2r,
        "flips": len(flipped),
        "mcnemar_p": float(mcnemar(table, exact=True).pvalue) if n else None,
        "identical_share": sum(ident) / len(ident) if ident else None,
        "accuracy": _accuracy(ids, qs, a, b, used),
        "flipped": flipped,
        "subjects": dict(sorted(subjects.items())),
        "notes": notes,
    }


def _add_repeat(per_q: dict[str, dict[str, Any]], ra: list[Record], rb: list[Record]) -> list:
    """Add one paired repeat's verdicts to ``per_q`` ({id: {"subject", "a" / "b": [correct per
    used repeat], "answered"}}); returns, per question answered in both cells, whether the two
    responses are identical."""
    by_b = {r["id"]: r for r in rb}
    same = []
    for r in ra:
        q = per_q.setdefault(
            r["id"],
            {
                "subject": r.get("subject") or subject_of(r["id"]),
                "a": [],
                "b": [],
                "answered": True,
            },
        )
        other = by_b[r["id"]]
        if r.get("verdict") == "failed" or other.get("verdict") == "failed":
            q["answered"] = False  # as in each cell's own tally: a reply came back
            continue
        q["a"].append(r.get("verdict") == "correct")
        q["b"].append(other.get("verdict") == "correct")
        same.append(r.get("response") == other.get("response"))
    return same


def _accuracy(
    ids: list[str], qs: dict[str, dict[str, Any]], a: list[float], b: list[float], used: int
) -> dict[str, dict[str, Any]]:
    """:func:`pair_records`' ``accuracy`` (metrics that cover no question left out)."""

    def entry(keep) -> dict[str, Any]:
        idx = [j for j, i in enumerate(ids) if keep(i)]
        return {
            "ids": [ids[j] for j in idx],
            "baseline": [a[j] for j in idx],
            "variant": [b[j] for j in idx],
            "cells": _cells([ids[j] for j in idx], qs, used),
        }

    accuracy = {
        "mmmu_overall_acc": entry(lambda i: True),
        "mmmu_answered_acc": entry(lambda i: qs[i]["answered"]),
    }
    for d in DOMAINS:
        accuracy[domain_metric(d)] = entry(lambda i, d=d: SUBJECT_DOMAIN.get(qs[i]["subject"]) == d)
    return {m: e for m, e in accuracy.items() if e["ids"]}


def _cells(ids: list[str], qs: dict[str, dict[str, Any]], used: int) -> dict[str, Any]:
    """Each arm's repeats and cell-shift variance parts (:func:`patchbench.stats.cell_variance`
    of its repeats x questions matrix over the questions answered in every used repeat; None
    with one repeat), pooled over the run's arms by patchbench.analysis.verdicts.accuracy_test."""
    full = [i for i in ids if len(qs[i]["a"]) == used]
    out: dict[str, Any] = {"repeats_baseline": used, "repeats_variant": used}
    for arm, key in (("baseline", "a"), ("variant", "b")):
        cv = None
        if used >= 2 and len(full) >= 2:
            cv = stats.cell_variance([[[float(qs[i][key][k]) for i in full] for k in range(used)]])
        out[arm] = asdict(cv) if cv is not None else None
    return out


def _by_subject(
    ids: list[str], qs: dict[str, dict[str, Any]], a: list[float], b: list[float]
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """(per subject: questions, mean correctness per arm, summed flips; the questions whose
    correctness differs between the arms)."""
    subjects: dict[str, dict[str, float]] = {}
    flipped = []
    for j, i in enumerate(ids):
        s = subjects.setdefault(
            qs[i]["subject"],
            {"n": 0, "acc_a": 0.0, "acc_b": 0.0, "right_to_wrong": 0.0, "wrong_to_right": 0.0},
        )
        s["n"] += 1
        s["acc_a"] += a[j]
        s["acc_b"] += b[j]
        s["right_to_wrong"] += max(a[j] - b[j], 0.0)
        s["wrong_to_right"] += max(b[j] - a[j], 0.0)
        if a[j] != b[j]:
            flipped.append(
                {"id": i, "subject": qs[i]["subject"], "baseline": a[j], "variant": b[j]}
            )
    for s in subjects.values():
        s["acc_a"] /= s["n"]
        s["acc_b"] /= s["n"]
    return subjects, flipped
