"""Scoring MMMU answers: a verdict per question, tallies per subject / domain / overall (pooled
over questions; accuracy = correct / asked: docs/cases.md M5), the files of sglang's
``benchmark/mmmu`` script, and ``patchbench score-mmmu`` (:func:`run_args`).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import pprint
import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import patchbench.suites.mmmu.parsers as P
from patchbench.errors import EXIT_OK, EXIT_USAGE, UsageError
from patchbench.records import read_json, read_jsonl, write_json, write_jsonl, write_text
from patchbench.stats import wilson_interval
from patchbench.suite import SuiteResult
from patchbench.suites.mmmu.data import DOMAINS, domain_metric, subject_of
from patchbench.suites.mmmu.params import Params

PARSERS = ("strict", "official")
VERDICTS = ("correct", "wrong", "unparsed", "failed")


@dataclass
class Scored:
    """The parse of one response: ``parsed`` (a letter, open-answer values, or None),
    ``fallback`` (the official parser found nothing: picked at random, or would have),
    ``unparsed_kind`` (``"no_answer"`` | ``"ambiguous"`` for an unparsed verdict), ``rule`` (the
    strict rule that decided)."""

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
    """Verdict of one response. Open questions use the official open normalisation under either
    ``parser`` ("strict" | "official"); ``rng``: the official random fallback (None: a fallback
    is unparsed). Raises ValueError for an unknown parser."""
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


def fallback_rng(parser: str, fallback: str, seed: int | None) -> random.Random | None:
    """The official parser's random fallback (one ``random.Random(seed)`` drawn in question
    order), or None where a fallback counts as unparsed."""
    return random.Random(seed) if parser == "official" and fallback == "random" else None


def scored_record(
    q: Mapping[str, Any],
    response: str | None,
    *,
    parser: str,
    seed: int | None,
    fallback: str,
    rng: random.Random | None,
    failed: bool = False,
    **more: Any,
) -> dict[str, Any]:
    """One line of ``records.jsonl`` (docs/CONTRACTS.md): question ``q`` (``id``, ``subject``,
    ``question_type``, ``gold``, ``index2ans``, optional ``all_choices``), its ``response`` parsed
    (:func:`score_response`) and the parser's settings; ``more``: what a run adds (prompt hash,
    latency, tokens, error, protocol, sampling, images)."""
    s = score_response(
        response,
        question_type=q["question_type"],
        gold=q["gold"],
        all_choices=q.get("all_choices") or list(q["index2ans"]),
        index2ans=q["index2ans"],
        parser=parser,
        rng=rng,
        failed=failed,
    )
    official = parser == "official"
    head = {k: q[k] for k in ("id", "subject", "question_type")}
    timing = {
        k: more.pop(k, None) for k in ("latency_s", "prompt_tokens", "completion_tokens", "error")
    }
    return {
        **head,
        "prompt_sha256": more.pop("prompt_sha256", None),
        "response": response,
        "parsed": s.parsed,
        "verdict": s.verdict,
        **timing,
        "gold": q["gold"],
        "index2ans": q["index2ans"],
        "fallback": s.fallback,
        "unparsed_kind": s.unparsed_kind,
        "parse_rule": s.rule,
        "parser": parser,
        "parser_seed": seed if official else None,
        "official_fallback": fallback if official else None,
        **more,
    }


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
    no_answer: int = 0
    ambiguous: int = 0
    correct: int = 0
    fallbacks: int = 0
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
        """Count one question (unparsed without a kind: ``no_answer``); ValueError for an unknown
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
        d = asdict(self)
        head = {"asked": d.pop("asked"), "answered": self.answered}
        ci = list(wilson(self.correct, self.asked))
        return {**head, **d, "acc": self.acc, "acc_ci95": ci, "answered_acc": self.answered_acc}


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
    """Pool records (``id`` or ``subject``, ``verdict``; optional ``fallback``,
    ``unparsed_kind``, ``images_unreferenced``, ``n_images``, ``n_images_sent``)."""
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
            for name in Tally.__dataclass_fields__:
                setattr(d, name, getattr(d, name) + getattr(t, name))
                setattr(out.overall, name, getattr(out.overall, name) + getattr(t, name))
        out.domains[domain] = d
    return out


def val_dict(scores: Scores) -> dict[str, dict[str, Any]]:
    """``val_sglang.json``: ``{"Overall-<domain>" then its subjects: {"num" (asked), "acc"
    (rounded to 3 decimals, as the script)}, ..., "Overall": {...}}``."""

    def entry(t: Tally) -> dict[str, Any]:
        return {"num": t.asked, "acc": round(t.acc, 3) if t.asked else 0.0}

    out: dict[str, dict[str, Any]] = {}
    for domain, subs in DOMAINS.items():
        if domain in scores.domains:
            out[f"Overall-{domain}"] = entry(scores.domains[domain])
            out |= {s: entry(scores.subjects[s]) for s in subs if s in scores.subjects}
    out["Overall"] = entry(scores.overall)
    return out


def answer_dict(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``answer_sglang.json``: ``{id: {"pred_ans" (the letter; an open question's raw response),
    "original_response", "ground_truth", "question_type", "judge": "Correct" | "Wrong"}}``."""
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
    """The PR-style "Accuracy Tests" text of one run, as sglang's script printed it."""
    lines = [] if benchmark_time_s is None else [f"Benchmark time: {benchmark_time_s}"]
    lines += [
        "answers saved to: ./answer_sglang.json",
        "Evaluating...",
        pprint.pformat({k: {"acc": v["acc"], "num": v["num"]} for k, v in val.items()}),
        "eval out saved to ./val_sglang.json",
        f"Overall accuracy: {val['Overall']['acc']}",
    ]
    return "\n".join(lines)


def summarize(
    records: list[dict[str, Any]],
    params: Params,
    *,
    duration_s: float | None = None,
    extra_meta: dict | None = None,
) -> tuple[SuiteResult, Scores]:
    """The suite's summary from scored records (metrics with units; details in meta)."""
    sc = tally(records)
    o = sc.overall
    metrics = _metrics(sc, params)
    failed = [r for r in records if r["verdict"] == "failed"]
    errors = []
    if failed:
        errors.append(
            f"{len(failed)} of {o.asked} MMMU requests failed (counted wrong); first: "
            f"{failed[0]['id']}: {failed[0].get('error')}"
        )
    meta = {
        "protocol": params.protocol,
        "parser": params.parser,
        "parser_seed": params.seed if params.parser == "official" else None,
        "params": params.model_dump(mode="json"),
        "duration_s": duration_s,
        "scores": sc.as_dict(),
        "val": val_dict(sc),
        "accuracy_definition": "correct / asked (failed and unparsed count wrong); "
        "answered_acc = correct / (asked - failed)",
        "images_not_sent_questions": o.images_not_sent,
        "images_unreferenced_questions": o.images_unreferenced,
        "unparsed_no_answer": o.no_answer,
        "unparsed_ambiguous": o.ambiguous,
    }
    meta.update(extra_meta or {})
    status = "incomplete" if failed else "ok"
    return SuiteResult(
        status=status, metrics=metrics, errors=errors, warnings=_warnings(o, params), meta=meta
    ), sc


def _metrics(sc: Scores, params: Params) -> dict[str, float]:
    """The flat metrics of a cell's tally (accuracies NaN when nothing was asked)."""
    o = sc.overall
    metrics: dict[str, float] = {
        "mmmu_overall_acc": o.acc if o.acc is not None else float("nan"),
        "mmmu_answered_acc": o.answered_acc if o.answered_acc is not None else float("nan"),
    }
    for k in ("asked", "answered", "correct", "failed", "unparsed", "no_answer", "ambiguous"):
        metrics[f"mmmu_{k}_count"] = float(getattr(o, k))
    for k in ("images_unreferenced", "images_not_sent"):
        metrics[f"mmmu_{k}_count"] = float(getattr(o, k))
    for d, t in sc.domains.items():
        metrics[domain_metric(d)] = t.acc
    if params.parser == "official":
        metrics["mmmu_fallback_count"] = float(o.fallbacks)
    return metrics


def _warnings(o: Tally, params: Params) -> list[str]:
    """What the overall tally ``o`` asks the reader to know (unparsed, fallbacks, images)."""
    warnings = []
    if o.unparsed:
        warnings.append(
            f"{o.unparsed} of {o.asked} MMMU answers could not be parsed "
            f"({o.no_answer} no answer, {o.ambiguous} ambiguous; parser "
            f"{params.parser}; counted wrong)"
        )
    if o.fallbacks and params.parser == "official":
        how = (
            f"a seeded random letter (seed {params.seed})"
            if params.official_fallback == "random"
            else "counted unparsed"
        )
        warnings.append(f"{o.fallbacks} answers fell to the official parser's fallback: {how}")
    if o.images_not_sent:
        warnings.append(
            f"{o.images_not_sent} of {o.asked} MMMU questions were sent with fewer images than "
            "they have"
        )
    if o.images_unreferenced:
        warnings.append(
            f"{o.images_unreferenced} of {o.asked} MMMU questions have images their "
            "text never names (sent after the text)"
        )
    if params.protocol == "sglang-2025":
        warnings.append("protocol sglang-2025 (the PR's script): only image_1 is sent")
    return warnings


def write_outputs(out_dir: Path, records: list[dict[str, Any]], sc: Scores) -> None:
    """records.jsonl, answer_sglang.json, val_sglang.json, scores.json (atomic writes)."""
    out_dir = Path(out_dir)
    write_jsonl(out_dir / "records.jsonl", records)
    write_json(out_dir / "answer_sglang.json", answer_dict(records))
    write_json(out_dir / "val_sglang.json", val_dict(sc))
    write_json(out_dir / "scores.json", sc.as_dict())


# --------------------------------------------------------------------------- score-mmmu


class InputError(UsageError, ValueError):
    """Responses or answer key that cannot be read; the message names the file and key (exit 2)."""


def load_responses(path: str | Path) -> dict[str, dict[str, Any]]:
    """``{id: {"response", "question_type", "index2ans", "gold"?}}`` from any RESPONSES form."""
    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*/output.json"))
        if not files:
            raise InputError(f"{path}: no <Subject>/output.json files (official example layout)")
    elif not path.exists():
        raise InputError(f"{path}: no such file or folder")
    else:
        files = [path]
    items: list[tuple[Path, dict]] = []
    for f in files:
        data = read_jsonl(f) if f.suffix == ".jsonl" else read_json(f)
        if not isinstance(data, list):
            raise InputError(
                f"{f}: expected a list of responses or a records.jsonl, got {type(data).__name__}"
            )
        items += [(f, x) for x in data]
    out: dict[str, dict[str, Any]] = {}
    for f, x in items:
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
    rng = fallback_rng(parser, fallback, seed)
    records = []
    for qid, k in key.items():
        r = responses.get(qid) or {}
        q = {
            "id": qid,
            "subject": subject_of(qid),
            "question_type": k["question_type"],
            "gold": k["ground_truth"],
            "index2ans": r.get("index2ans") or {},
            "all_choices": r.get("all_choices"),
        }
        response = r.get("response")
        error = None if r else "no response in the file"
        records.append(
            scored_record(
                q,
                response,
                parser=parser,
                seed=seed,
                fallback=fallback,
                rng=rng,
                failed=response is None,
                error=error,
            )
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
        if r is None or r["response"] is None or P.is_open(k["question_type"]):
            continue
        index2ans = r.get("index2ans") or {}
        choices = r.get("all_choices") or list(index2ans)
        st = P.parse_strict_detail(r["response"], choices, index2ans)
        off, _ = P.parse_official_mc(r["response"], choices, index2ans, None)
        if st.letter != off:
            row = (qid, subject_of(qid), k["ground_truth"], st.letter or st.status, st.rule)
            row += (off or "fallback", r["response"])
            rows.append(dict(zip(DISAGREEMENT_COLUMNS, row, strict=True)))
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
    w.writerows(rows)
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


def run_args(a: argparse.Namespace) -> int:
    """``patchbench score-mmmu`` from parsed arguments (:func:`add_arguments`); the exit code."""
    try:
        responses = load_responses(a.responses)
        key = load_answer_key(a.answer_key)
        records = score_saved(responses, key, parser=a.parser, seed=a.seed, fallback=a.fallback)
    except (InputError, FileNotFoundError, json.JSONDecodeError, ValueError) as e:
        print(f"score-mmmu: {e}", file=sys.stderr)
        return EXIT_USAGE

    params = Params(parser=a.parser, seed=a.seed, official_fallback=a.fallback)
    result, sc = summarize(
        records, params, extra_meta={"responses": str(a.responses), "answer_key": str(a.answer_key)}
    )
    extra = [k for k in responses if k not in key]
    # the PR script's block, without its two "saved to ./..." lines (nothing is written there;
    # --out writes the files, and says where)
    block = format_block(val_dict(sc)).splitlines()
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
            1 for q, k in key.items() if q in responses and not P.is_open(k["question_type"])
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
