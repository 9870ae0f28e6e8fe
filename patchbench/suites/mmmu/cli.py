"""``runner.py score-mmmu RESPONSES --answer-key FILE [--parser strict|official] [--seed N]
[--fallback random|unparsed] [--out DIR] [--disagreements]``.

Re-scores saved responses without a server. RESPONSES is one of:

- a folder in the official MMMU example-output layout: ``<Subject>/output.json``, each a list of
  ``{"id", "question_type", "answer", "all_choices", "index2ans", "response"}`` (as
  tests/data/mmmu-official/llava1.5_13b); open questions carry no ``all_choices``;
- a ``records.jsonl`` written by this suite (``response``, ``question_type``, ``index2ans``);
- a single ``output.json`` list as above.

``--answer-key``: the official ``answer_dict_val.json`` (``{id: {"question_type",
"ground_truth"}}``); its gold and question type win over those in RESPONSES. Questions of the key
missing from RESPONSES count as asked and failed (no response), so the denominator is the key.
``--parser official`` uses the official random fallback seeded with ``--seed`` (default 42);
``--fallback unparsed`` counts those as unparsed instead. Prints the PR-style block and the
counts; ``--out DIR`` also writes records.jsonl, answer_sglang.json, val_sglang.json,
scores.json and summary.json there.

``--disagreements``: every multiple-choice response where the strict and the official parse differ
(the official one without its random pick: "fallback" where it would pick), as a markdown table on
stdout, and, with ``--out``, as ``disagreements.md`` and ``disagreements.csv`` there: for a person
to audit a new model's outputs (columns: id, subject, gold, strict, strict_rule, official,
response).

Exit codes: 0 done, 2 bad usage or unreadable input (the message names the file and key).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import patchbench.suites.mmmu.parsers as parsers
import patchbench.suites.mmmu.scoring as scoring
from patchbench.errors import EXIT_OK, EXIT_USAGE, UsageError
from patchbench.records import read_json, read_jsonl, write_json, write_text
from patchbench.suites.mmmu.data import subject_of
from patchbench.suites.mmmu.params import Params


class InputError(UsageError, ValueError):
    """Responses or answer key that cannot be read; the message names the file and key (exit 2)."""


def load_responses(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{id: {"response", "question_type", "index2ans", "gold"?}}`` from any RESPONSES form."""
    path = Path(path)
    items: list[dict] = []
    if path.is_dir():
        files = sorted(path.glob("*/output.json"))
        if not files:
            raise InputError(f"{path}: no <Subject>/output.json files (official example layout)")
        for f in files:
            data = read_json(f)
            if not isinstance(data, list):
                raise InputError(f"{f}: expected a list of responses, got {type(data).__name__}")
            items.extend((f, x) for x in data)  # type: ignore[arg-type]
    elif path.suffix == ".jsonl":
        items = [(path, x) for x in read_jsonl(path)]  # type: ignore[misc]
    elif path.exists():
        data = read_json(path)
        if not isinstance(data, list):
            raise InputError(f"{path}: expected a list of responses or a records.jsonl")
        items = [(path, x) for x in data]  # type: ignore[misc]
    else:
        raise InputError(f"{path}: no such file or folder")
    out: dict[str, dict[str, Any]] = {}
    for f, x in items:  # type: ignore[misc]
        if "id" not in x or "response" not in x:
            raise InputError(f"{f}: an entry lacks 'id' or 'response' (keys {sorted(x)})")
        index2ans = x.get("index2ans") or {}
        out[x["id"]] = {
            "response": x["response"],
            "question_type": x.get("question_type"),
            "index2ans": index2ans,
            "all_choices": x.get("all_choices") or list(index2ans),
            "gold": x.get("answer", x.get("gold")),
        }
    return out


def load_answer_key(path: str | Path) -> dict[str, dict[str, Any]]:
    """The official answer key ``{id: {"question_type", "ground_truth"}}``."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected {{id: {{question_type, ground_truth}}}}")
    for qid, v in data.items():
        if not isinstance(v, dict) or "ground_truth" not in v or "question_type" not in v:
            raise InputError(f"{path}: key {qid!r} lacks question_type / ground_truth")
    return data


def score_saved(
    responses: dict[str, dict[str, Any]],
    key: dict[str, dict[str, Any]],
    *,
    parser: str,
    seed: int | None,
    fallback: str = "random",
) -> list[dict[str, Any]]:
    """Records (as the suite writes them) for every question of ``key``, in key order."""
    rng = random.Random(seed) if parser == "official" and fallback == "random" else None
    records = []
    for qid, k in key.items():
        r = responses.get(qid)
        qtype = k["question_type"]
        index2ans = (r or {}).get("index2ans") or {}
        all_choices = (r or {}).get("all_choices") or list(index2ans)
        s = scoring.score_response(
            None if r is None else r["response"],
            question_type=qtype,
            gold=k["ground_truth"],
            all_choices=all_choices,
            index2ans=index2ans,
            parser=parser,
            rng=rng,
            failed=r is None or r["response"] is None,
        )
        records.append(
            {
                "id": qid,
                "subject": subject_of(qid),
                "question_type": qtype,
                "prompt_sha256": None,
                "response": None if r is None else r["response"],
                "parsed": s.parsed,
                "verdict": s.verdict,
                "latency_s": None,
                "prompt_tokens": None,
                "completion_tokens": None,
                "error": "no response in the file" if r is None else None,
                "gold": k["ground_truth"],
                "index2ans": index2ans,
                "fallback": s.fallback,
                "unparsed_kind": s.unparsed_kind,
                "parse_rule": s.rule,
                "parser": parser,
                "parser_seed": seed if parser == "official" else None,
                "official_fallback": fallback if parser == "official" else None,
            }
        )
    return records


DISAGREEMENT_COLUMNS = ("id", "subject", "gold", "strict", "strict_rule", "official", "response")


def disagreements(
    responses: dict[str, dict[str, Any]], key: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Multiple-choice questions of ``key`` whose strict and official parses differ, in key order.

    Each row: ``{"id", "subject", "gold", "strict" (a letter, "no_answer" or "ambiguous"),
    "strict_rule", "official" (a letter, or "fallback" where the official parser would pick at
    random), "response"}``. Questions without a response are left out.
    """
    rows = []
    for qid, k in key.items():
        r = responses.get(qid)
        if r is None or r["response"] is None or parsers.is_open(k["question_type"]):
            continue
        index2ans = r.get("index2ans") or {}
        choices = r.get("all_choices") or list(index2ans)
        st = parsers.parse_strict_detail(r["response"], choices, index2ans)
        off, _ = parsers.parse_official_mc(r["response"], choices, index2ans, None)
        if st.letter != off:
            rows.append(
                {
                    "id": qid,
                    "subject": subject_of(qid),
                    "gold": k["ground_truth"],
                    "strict": st.letter or st.status,
                    "strict_rule": st.rule,
                    "official": off or "fallback",
                    "response": r["response"],
                }
            )
    return rows


def _md_cell(v: Any) -> str:
    return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ⏎ ").strip()


def disagreements_markdown(rows: list[dict[str, Any]], n_mc: int) -> str:
    """The rows as a markdown table (responses on one line: a line break shows as ⏎), with a
    heading line counting them among ``n_mc`` multiple-choice responses."""
    lines = [
        f"Strict vs official parse: {len(rows)} of {n_mc} multiple-choice responses differ.",
        "",
        "| " + " | ".join(DISAGREEMENT_COLUMNS) + " |",
        "|" + "---|" * len(DISAGREEMENT_COLUMNS),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_md_cell(r[c]) for c in DISAGREEMENT_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def disagreements_csv(rows: list[dict[str, Any]]) -> str:
    """The rows as CSV (a header line, then one row per disagreement; responses verbatim)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(DISAGREEMENT_COLUMNS), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({c: r[c] for c in DISAGREEMENT_COLUMNS})
    return buf.getvalue()


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The options of ``patchbench score-mmmu`` (patchbench/cli.py uses these)."""
    ap.add_argument("responses", help="<Subject>/output.json folder, records.jsonl or output.json")
    ap.add_argument("--answer-key", required=True, help="answer_dict_val.json")
    ap.add_argument("--parser", choices=["strict", "official"], default="strict")
    ap.add_argument(
        "--seed",
        type=int,
        default=42,
        help="seed of the official parser's random fallback (default 42)",
    )
    ap.add_argument(
        "--fallback",
        choices=["random", "unparsed"],
        default="random",
        help="official parser: pick a seeded random letter, or count as unparsed",
    )
    ap.add_argument("--out", help="folder for records.jsonl, val_sglang.json, ...")
    ap.add_argument(
        "--disagreements",
        action="store_true",
        help="print the responses where strict and official parses differ (and "
        "write disagreements.md / .csv to --out)",
    )


def cli(argv: list[str]) -> int:
    """``patchbench score-mmmu`` from raw arguments (see module docstring); the exit code."""
    ap = argparse.ArgumentParser(
        prog="patchbench score-mmmu", description="Re-score saved MMMU responses."
    )
    add_arguments(ap)
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return EXIT_OK if e.code == 0 else EXIT_USAGE
    return run_args(a)


def run_args(a: argparse.Namespace) -> int:
    """``patchbench score-mmmu`` from parsed arguments (:func:`add_arguments`); the exit code."""
    try:
        responses = load_responses(a.responses)
        key = load_answer_key(a.answer_key)
        records = score_saved(responses, key, parser=a.parser, seed=a.seed, fallback=a.fallback)
    except (InputError, FileNotFoundError, json.JSONDecodeError, ValueError) as e:
        print(f"score-mmmu: {e}", file=sys.stderr)
        return EXIT_USAGE
    from patchbench.suites.mmmu.bench import summarize, write_outputs

    params = Params(parser=a.parser, seed=a.seed, official_fallback=a.fallback)
    result, sc = summarize(
        records, params, extra_meta={"responses": str(a.responses), "answer_key": str(a.answer_key)}
    )
    extra = [k for k in responses if k not in key]
    # the PR script's block, without its two "saved to ./..." lines (nothing is written there;
    # --out writes the files, and says where)
    block = scoring.format_block(scoring.val_dict(sc)).splitlines()
    print("\n".join(line for line in block if "saved to" not in line))
    o = sc.overall
    fb = (
        f", fallbacks {o.fallbacks} (seed {a.seed}, {a.fallback})" if a.parser == "official" else ""
    )
    print(
        f"parser {a.parser}: correct {o.correct} / asked {o.asked} = {o.acc:.4f}; answered "
        f"{o.answered}, failed {o.failed}, unparsed {o.unparsed} (no answer {o.no_answer}, "
        f"ambiguous {o.ambiguous}){fb}"
    )
    rows = None
    if a.disagreements:
        rows = disagreements(responses, key)
        n_mc = sum(
            1 for q, k in key.items() if q in responses and not parsers.is_open(k["question_type"])
        )
        print()
        print(disagreements_markdown(rows, n_mc), end="")
    if extra:
        print(
            f"warning: {len(extra)} responses have ids missing from the answer key "
            f"(ignored), e.g. {extra[0]}",
            file=sys.stderr,
        )
    if a.out:
        write_outputs(Path(a.out), records, sc)
        write_json(Path(a.out) / "summary.json", result.to_json("mmmu"))
        if rows is not None:
            write_text(Path(a.out) / "disagreements.md", disagreements_markdown(rows, n_mc))
            write_text(Path(a.out) / "disagreements.csv", disagreements_csv(rows))
        print(
            f"wrote records.jsonl, answer_sglang.json, val_sglang.json, summary.json to {a.out}",
            file=sys.stderr,
        )
    return EXIT_OK
