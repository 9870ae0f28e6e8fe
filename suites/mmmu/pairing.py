"""Pairing two MMMU cells question by question (did the patch change any answer?).

``pair(records_a, records_b)``: records of the baseline cell (a) and of the variant cell (b), as
written to ``records.jsonl``. Before comparing anything it checks that the two runs are
comparable: the same question ids, the same ``prompt_sha256`` per question, the same parser (and
parser seed), and the same sampling settings; otherwise :class:`PairingError` says which differ
(with up to five examples).

Statistics: a question is "right" when its verdict is ``correct``. Flips: right->wrong
(``a_only``, regressions) and wrong->right (``b_only``, improvements). McNemar's exact test
(statsmodels ``mcnemar(table, exact=True)``: a two-sided binomial test on the discordant pairs)
gives the p-value. Verdict: "no significant change" unless p < alpha (0.05), then "improved"
(more wrong->right) or "regressed"; "incomplete" whenever a request failed in either cell
(no verdict on a partial run). Questions that failed in either cell are left out of the table
and counted.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from statsmodels.stats.contingency_tables import mcnemar


class PairingError(ValueError):
    """Two cells that cannot be paired; the message says what differs."""


def _examples(items: Iterable[Any], k: int = 5) -> str:
    items = list(items)
    more = f" (+{len(items) - k} more)" if len(items) > k else ""
    return ", ".join(map(str, items[:k])) + more


def _settings(records: list[Mapping[str, Any]], key: str) -> set:
    import json
    return {json.dumps(r.get(key), sort_keys=True) for r in records}


def check_pairable(records_a: list[Mapping[str, Any]], records_b: list[Mapping[str, Any]]) -> None:
    """Raise :class:`PairingError` naming every difference that forbids pairing."""
    problems: list[str] = []
    ids_a = [r["id"] for r in records_a]
    ids_b = [r["id"] for r in records_b]
    if len(set(ids_a)) != len(ids_a) or len(set(ids_b)) != len(ids_b):
        problems.append("a question id appears twice in one cell")
    only_a, only_b = sorted(set(ids_a) - set(ids_b)), sorted(set(ids_b) - set(ids_a))
    if only_a or only_b:
        problems.append(f"question lists differ: {len(only_a)} only in a ({_examples(only_a)}), "
                        f"{len(only_b)} only in b ({_examples(only_b)})")
    by_b = {r["id"]: r for r in records_b}
    diff_prompt = [r["id"] for r in records_a if r["id"] in by_b
                   and r.get("prompt_sha256") != by_b[r["id"]].get("prompt_sha256")]
    if diff_prompt:
        problems.append(f"prompts differ (prompt_sha256) for {len(diff_prompt)} questions: "
                        f"{_examples(diff_prompt)}")
    for key, label in (("parser", "parser"), ("parser_seed", "parser seed"),
                       ("sampling", "sampling settings"), ("protocol", "protocol")):
        sa, sb = _settings(records_a, key), _settings(records_b, key)
        if sa != sb:
            problems.append(f"{label} differ: a {sorted(sa)} vs b {sorted(sb)}")
    if problems:
        raise PairingError("cannot pair these MMMU cells: " + "; ".join(problems))


def pair(records_a: list[Mapping[str, Any]], records_b: list[Mapping[str, Any]], *,
         alpha: float = 0.05, max_changed: int = 200) -> dict[str, Any]:
    """Paired comparison of two cells (see module docstring).

    Returns ``{"n_paired", "n_failed_either", "both_right", "both_wrong", "right_to_wrong",
    "wrong_to_right", "mcnemar_p", "identical_response_share", "identical_responses",
    "changed": [{"id", "verdict_a", "verdict_b", "response_a", "response_b"}, ...],
    "changed_count", "acc_a", "acc_b", "verdict", "alpha"}``; acc_* over the paired questions.
    ``changed`` lists questions whose response string differs (at most ``max_changed``, responses
    cut to 200 characters). Raises :class:`PairingError` when the cells are not comparable and
    ValueError when they are empty.
    """
    records_a, records_b = list(records_a), list(records_b)
    if not records_a:
        raise ValueError("no MMMU records to pair")
    check_pairable(records_a, records_b)
    by_b = {r["id"]: r for r in records_b}
    n11 = n10 = n01 = n00 = 0
    failed_either = 0
    identical = 0
    changed: list[dict[str, Any]] = []
    for ra in records_a:
        rb = by_b[ra["id"]]
        if ra["verdict"] == "failed" or rb["verdict"] == "failed":
            failed_either += 1
            continue
        a_ok, b_ok = ra["verdict"] == "correct", rb["verdict"] == "correct"
        n11 += a_ok and b_ok
        n10 += a_ok and not b_ok
        n01 += b_ok and not a_ok
        n00 += not a_ok and not b_ok
        if ra.get("response") == rb.get("response"):
            identical += 1
        else:
            changed.append({"id": ra["id"], "verdict_a": ra["verdict"], "verdict_b": rb["verdict"],
                            "response_a": (ra.get("response") or "")[:200],
                            "response_b": (rb.get("response") or "")[:200]})
    n = n11 + n10 + n01 + n00
    p = float(mcnemar([[n11, n10], [n01, n00]], exact=True).pvalue) if n else None
    if failed_either:
        verdict = "incomplete"
    elif p is not None and p < alpha:
        verdict = "improved" if n01 > n10 else "regressed"
    else:
        verdict = "no significant change"
    return {"n_paired": n, "n_failed_either": failed_either, "both_right": n11,
            "both_wrong": n00, "right_to_wrong": n10, "wrong_to_right": n01,
            "mcnemar_p": p, "identical_responses": identical,
            "identical_response_share": identical / n if n else None,
            "changed_count": len(changed), "changed": changed[:max_changed],
            "acc_a": (n11 + n10) / n if n else None, "acc_b": (n11 + n01) / n if n else None,
            "verdict": verdict, "alpha": alpha}
