"""MMMU accuracy suite: the PR's "Accuracy Tests" protocol, a deterministic parser, the official
parser for comparison with published numbers, and question-by-question pairing of two cells.

Public surface (docs/CONTRACTS.md, "Suites"):

- :class:`MmmuSuite` (registered as "mmmu"): ``run``, ``pair`` (every paired repeat, question by
  question: :func:`pair_repeats`), ``report_section`` and ``plots`` (paired table, per-subject
  difference with flips), ``report_block``;
- :class:`Params` (pydantic, extra="forbid"), :func:`run` ``(ctx, params) -> SuiteResult``,
  :data:`METRICS` (``mmmu_overall_acc`` primary, kind "accuracy", margin 2 points);
- :func:`pair` ``(records_a, records_b) -> dict``: one repeat's flips, McNemar exact p,
  identical-response share (:mod:`.pairing`);
- :func:`report_block` ``(summary_dir) -> str``: the PR-style block of one cell;
- :func:`cli` ``(argv) -> int``: ``patchbench score-mmmu``.

Modules: data (loading, subjects, domains), demo_data (generated questions), prompts (messages,
images, hashes), client (aiohttp), parsers (strict, official, open), scoring (verdicts, tallies,
file shapes), pairing, bench (run), cli.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench.records import read_json, read_jsonl
from patchbench.suite import (
    MetricInfo,
    PairingRefused,
    Suite,
    SuiteContext,
    SuiteResult,
    comparison_get,
    register,
    suite_pairs,
    suite_refusals,
)
from patchbench.suites.mmmu import pairing
from patchbench.suites.mmmu.bench import domain_metric, run
from patchbench.suites.mmmu.cli import cli
from patchbench.suites.mmmu.data import DOMAINS, SUBJECT_DOMAIN, subject_of
from patchbench.suites.mmmu.pairing import PairingError, pair
from patchbench.suites.mmmu.params import Params
from patchbench.suites.mmmu.scoring import format_block

#: practical-equivalence margin of the accuracies, in points of accuracy
MARGIN_PT = 2.0


def _acc(label: str, primary: bool = False) -> MetricInfo:
    return MetricInfo("higher", "acc", label, primary=primary, kind="accuracy", margin=MARGIN_PT)


def _count(label: str, better: str = "none") -> MetricInfo:
    return MetricInfo(better, "count", label, kind="descriptive")


METRICS: dict[str, MetricInfo] = {
    "mmmu_overall_acc": _acc("Overall accuracy", primary=True),
    "mmmu_answered_acc": _acc("Accuracy over answered questions (failed requests left out)"),
    **{domain_metric(d): _acc(f"Overall-{d}") for d in DOMAINS},
    "mmmu_asked_count": _count("Questions asked"),
    "mmmu_answered_count": _count("Questions answered (a reply came back, unparsed included)"),
    "mmmu_correct_count": _count("Correct answers"),
    "mmmu_failed_count": _count("Failed requests", "lower"),
    "mmmu_unparsed_count": _count("Unparsed answers"),
    "mmmu_no_answer_count": _count("Unparsed: no answer"),
    "mmmu_ambiguous_count": _count("Unparsed: several options, no final commitment"),
    "mmmu_images_unreferenced_count": _count("Questions with images their text does not name"),
    "mmmu_images_not_sent_count": _count("Questions with an image not sent", "lower"),
    "mmmu_fallback_count": _count("Official parser random fallbacks"),
}


def report_block(summary_dir: str | Path) -> str:
    """The PR-style "Accuracy Tests" block of one cell, from its mmmu folder alone
    (``val_sglang.json``; ``summary.json`` for the benchmark time, protocol and parser).

    Raises FileNotFoundError naming the missing val_sglang.json.
    """
    d = Path(summary_dir)
    val = read_json(d / "val_sglang.json")
    meta: dict = {}
    if (d / "summary.json").exists():
        meta = read_json(d / "summary.json").get("meta", {})
    block = format_block(val, benchmark_time_s=meta.get("duration_s"))
    if meta:
        sc = meta.get("scores", {}).get("overall", {})
        seed = f", seed {meta.get('parser_seed')}" if meta.get("parser") == "official" else ""
        block += (
            f"\n(patchbench: protocol {meta.get('protocol')}, parser {meta.get('parser')}"
            f"{seed}; asked {sc.get('asked')}, failed {sc.get('failed')}, "
            f"unparsed {sc.get('unparsed')}; accuracy over asked)"
        )
    return block


# --------------------------------------------------------------------------- pairing over repeats


def _read_records(suite_dir: Path) -> tuple[list[dict] | None, str | None]:
    p = Path(suite_dir) / "records.jsonl"
    if not p.is_file():
        return None, f"{p}: missing"
    try:
        return read_jsonl(p), None
    except (OSError, ValueError) as e:
        return None, f"{p}: unreadable ({e})"


def pair_repeats(baseline_dirs: list[Path], variant_dirs: list[Path]) -> dict[str, Any] | None:
    """Question-by-question pairing of the baseline and one variant over every paired repeat.

    Each repeat k (``baseline_dirs[k]`` with ``variant_dirs[k]``, their ``records.jsonl``) goes
    through :func:`.pairing.pair` first, which checks that the cells may be paired (same
    questions, prompts, parser, sampling); a refusal there raises :class:`PairingRefused` naming
    the repeat and the reason. A question's correctness in an arm is then its share of
    ``correct`` verdicts over the repeats where it failed in neither cell (greedy repeats are near
    copies: the question, not the repeat, is the unit); questions that failed in every repeat are
    left out and counted.

    Returns ``{"repeats_used", "n" (questions), "n_failed_either", "acc_a", "acc_b",
    "both_right", "both_wrong", "right_to_wrong", "wrong_to_right" (sums over questions of
    max(a - b, 0) / max(b - a, 0): the usual counts when repeats agree), "flips", "mcnemar_p"
    (exact McNemar on the rounded discordant counts), "identical_share" (mean over repeats of the
    identical-response share), "accuracy": {metric: {"ids", "baseline", "variant", "cells"}} for
    mmmu_overall_acc, mmmu_answered_acc (questions whose request failed in no used repeat of
    either cell: "answered" as in :class:`.scoring.Tally`, unparsed replies included)
    and each domain, "flipped": [{"id", "subject", "baseline", "variant"}], "subjects":
    {subject: {"n", "acc_a", "acc_b", "right_to_wrong", "wrong_to_right"}}, "notes"}``; None when
    no repeat has records in both cells.
    """
    from statsmodels.stats.contingency_tables import mcnemar

    notes: list[str] = []
    per_q: dict[str, dict[str, Any]] = {}
    ident: list[float] = []
    used = _collect_repeats(baseline_dirs, variant_dirs, per_q, ident, notes)
    if not used:
        return None
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
    p = float(mcnemar(table, exact=True).pvalue) if n else None
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
        "mcnemar_p": p,
        "identical_share": sum(ident) / len(ident) if ident else None,
        "accuracy": _accuracy(ids, qs, a, b, used),
        "flipped": flipped,
        "subjects": dict(sorted(subjects.items())),
        "notes": notes,
    }


def _collect_repeats(
    baseline_dirs: list[Path],
    variant_dirs: list[Path],
    per_q: dict[str, dict[str, Any]],
    ident: list[float],
    notes: list[str],
) -> int:
    """Pair every repeat that has records in both cells (:func:`.pairing.pair`, which refuses
    cells that must not be paired: PairingRefused naming the repeat) and add its verdicts to
    ``per_q`` (:func:`_add_repeat`) and its identical-response share to ``ident``; a repeat
    without both files is a note. Returns the number of repeats used."""
    used = 0
    for k, (da, db) in enumerate(zip(baseline_dirs, variant_dirs, strict=True)):
        ra, why_a = _read_records(da)
        rb, why_b = _read_records(db)
        if ra is None or rb is None:
            notes.append(
                f"paired repeat {k}: not used: " + "; ".join(w for w in (why_a, why_b) if w)
            )
            continue
        try:
            res = pairing.pair(ra, rb)
        except (PairingError, ValueError) as e:
            raise PairingRefused(f"paired repeat {k}: {e}") from None
        used += 1
        if res.get("identical_response_share") is not None:
            ident.append(float(res["identical_response_share"]))
        _add_repeat(per_q, ra, rb)
    return used


def _add_repeat(per_q: dict[str, dict[str, Any]], ra: list[dict], rb: list[dict]) -> None:
    """Add one paired repeat's verdicts (baseline records ``ra``, variant records ``rb``) to
    ``per_q``: {id: {"subject", "a" / "b": [correct per used repeat], "answered"}}."""
    by_b = {r["id"]: r for r in rb}
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
            # "answered" as in each cell's own tally: a reply came back (parsed or not)
            q["answered"] = False
            continue
        q["a"].append(r.get("verdict") == "correct")
        q["b"].append(other.get("verdict") == "correct")


def _accuracy(
    ids: list[str], qs: dict[str, dict[str, Any]], a: list[float], b: list[float], used: int
) -> dict[str, dict[str, Any]]:
    """:func:`pair_repeats`' ``accuracy``: per metric the question ids it covers and their
    per-question correctness in each arm (``a`` / ``b``, aligned with ``ids``), and ``cells``:
    the repeats behind those means and each arm's cell-shift variance parts
    (:func:`_cells`); metrics that cover no question left out."""

    def acc_entry(keep) -> dict[str, Any]:
        idx = [j for j, i in enumerate(ids) if keep(i)]
        return {
            "ids": [ids[j] for j in idx],
            "baseline": [a[j] for j in idx],
            "variant": [b[j] for j in idx],
            "cells": _cells([ids[j] for j in idx], qs, used),
        }

    accuracy = {
        "mmmu_overall_acc": acc_entry(lambda i: True),
        "mmmu_answered_acc": acc_entry(lambda i: qs[i]["answered"]),
    }
    for d in DOMAINS:
        accuracy[domain_metric(d)] = acc_entry(
            lambda i, d=d: SUBJECT_DOMAIN.get(qs[i]["subject"]) == d
        )
    return {m: e for m, e in accuracy.items() if e["ids"]}


def _cells(ids: list[str], qs: dict[str, dict[str, Any]], used: int) -> dict[str, Any]:
    """The repeats of each arm and each arm's cell-shift variance parts
    (:func:`patchbench.stats.cell_variance` of its repeats x questions matrix, over the questions
    answered in every used repeat; None with one repeat), as plain dicts for compare.json: the
    analysis pools them over every arm of the run (patchbench.analysis.verdicts.accuracy_test)."""
    from dataclasses import asdict

    from patchbench import stats

    full = [i for i in ids if len(qs[i]["a"]) == used]
    out: dict[str, Any] = {"repeats_baseline": used, "repeats_variant": used}
    for arm, key in (("baseline", "a"), ("variant", "b")):
        cv = None
        if used >= 2 and len(full) >= 2:
            y = [[float(qs[i][key][k]) for i in full] for k in range(used)]
            cv = stats.cell_variance([y])
        out[arm] = asdict(cv) if cv is not None else None
    return out


def _by_subject(
    ids: list[str], qs: dict[str, dict[str, Any]], a: list[float], b: list[float]
) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    """(per subject: questions, mean correctness in each arm, summed flips; the questions whose
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


# --------------------------------------------------------------------------- rendering


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _num(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else f"{x:.2f}"


def report_section(comparison: Any) -> list[str]:
    """Markdown "MMMU paired": per variant questions, accuracy before/after (questions that did
    not fail), right->wrong and wrong->right flips, McNemar p, identical responses; then the
    subjects with flips; a refusal's reason instead of numbers. From the comparison only."""
    pairs = suite_pairs(comparison, "mmmu")
    refusals = suite_refusals(comparison, "mmmu")
    if not pairs and not refusals:
        return []
    lines = [
        "## MMMU paired",
        "",
        "A question's correctness is averaged over the paired repeats first (flips can be "
        "fractions when repeats disagree).",
        "",
        "| variant | repeats | questions | accuracy before | accuracy after | right→wrong "
        "| wrong→right | McNemar p | identical responses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v, p in pairs.items():
        ish = p.get("identical_share")
        lines.append(
            f"| {v} | {p.get('repeats_used')} | {p.get('n')} | {_fmt(p.get('acc_a'))} | "
            f"{_fmt(p.get('acc_b'))} | {_num(p.get('right_to_wrong', 0))} | "
            f"{_num(p.get('wrong_to_right', 0))} | {_fmt(p.get('mcnemar_p'), '.3g')} | "
            f"{'n/a' if ish is None else format(ish * 100, '.1f') + '%'} |"
        )
    for v, reason in refusals.items():
        lines.append(f"| {v} | pairing refused: {reason} | | | | | | | |")
    lines.append("")
    for v, p in pairs.items():
        subj = {
            s: d
            for s, d in (p.get("subjects") or {}).items()
            if d.get("right_to_wrong") or d.get("wrong_to_right")
        }
        if subj:
            t = [
                "| subject | n | before | after | right→wrong | wrong→right |",
                "|---|---|---|---|---|---|",
            ]
            for s, d in subj.items():
                t.append(
                    f"| {s} | {d['n']} | {d['acc_a']:.3f} | {d['acc_b']:.3f} | "
                    f"{_num(d['right_to_wrong'])} | {_num(d['wrong_to_right'])} |"
                )
            lines += [
                f"<details><summary>{v}: subjects with flips ({len(subj)})</summary>",
                "",
                *t,
                "",
                "</details>",
                "",
            ]
        lines += [f"- {v}: {n}" for n in p.get("notes") or []]
    if pairs and not subject_plot_variants(comparison):
        lines += [""] if lines[-1] else []
        lines += ["No subject's accuracy changed and no answer flipped: no per-subject plot.", ""]
    return lines


def _subject_moved(d: dict) -> bool:
    """Whether one subject's entry shows anything: a flip or a change of accuracy."""
    return bool(
        d.get("right_to_wrong") or d.get("wrong_to_right") or d.get("acc_a") != d.get("acc_b")
    )


def subject_plot_variants(comparison: Any) -> list[str]:
    """The variants :func:`plot_subjects` draws: those that are not A/A (all when every variant
    is A/A) with at least one subject that flipped or changed; [] when none (no plot)."""
    pairs = suite_pairs(comparison, "mmmu")
    aa = set(comparison_get(comparison, "aa_variants", []) or [])
    variants = [v for v in pairs if v not in aa] or list(pairs)
    return [
        v
        for v in variants
        if any(_subject_moved(d) for d in (pairs[v].get("subjects") or {}).values())
    ]


def plot_subjects(comparison: Any, out: Path) -> Path | None:
    """Per-subject accuracy difference (variant - baseline, percentage points) with the
    wrong->right / right->wrong flips per subject: one panel per variant of
    :func:`subject_plot_variants`, subjects shared. None (no file) when no subject of any
    variant flipped or changed: such a plot would be empty."""
    from patchbench.suites import new_figure, save_png

    pairs = suite_pairs(comparison, "mmmu")
    variants = subject_plot_variants(comparison)
    if not variants:
        return None
    names = list(dict.fromkeys(s for v in variants for s in pairs[v]["subjects"]))
    fig, axes = new_figure(max(3.0, 0.28 * len(names) + 1.5), ncols=len(variants))
    base = comparison_get(comparison, "baseline", "baseline")
    for k, (v, ax) in enumerate(zip(variants, axes, strict=True)):
        p, subj = pairs[v], pairs[v]["subjects"]
        diffs = [100 * (subj[s]["acc_b"] - subj[s]["acc_a"]) if s in subj else 0.0 for s in names]
        ax.barh(
            range(len(names)),
            diffs,
            label=f"{v} - {base}",
            color=["C2" if d > 0 else ("C3" if d < 0 else "0.6") for d in diffs],
        )
        for i, s in enumerate(names):
            st = subj.get(s) or {}
            w2r, r2w = st.get("wrong_to_right", 0), st.get("right_to_wrong", 0)
            if w2r or r2w:
                ax.annotate(
                    f"+{_num(w2r)}/-{_num(r2w)}",
                    (diffs[i], i),
                    xytext=(4 if diffs[i] >= 0 else -4, 0),
                    textcoords="offset points",
                    va="center",
                    ha="left" if diffs[i] >= 0 else "right",
                    fontsize=7,
                )
        lim = max(5.0, 1.3 * max(abs(d) for d in diffs))  # all zero: a readable +-5 pt axis
        ax.set_xlim(-lim, lim)
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(names)), names if k == 0 else [""] * len(names), fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("accuracy change (percentage points)")
        if k == 0:
            ax.set_ylabel("MMMU subject")
        ax.plot([], [], " ", label="+a/-b: wrong->right / right->wrong flips")
        ax.legend(fontsize=7, loc="best")
        ax.set_title(
            f"{v}: flips {p.get('flips')}, McNemar p = {_fmt(p.get('mcnemar_p'), '.3g')}",
            fontsize=9,
        )
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(
        f"MMMU accuracy per subject: {', '.join(variants)} vs {base}   "
        f"[{comparison_get(comparison, 'run_id', '')}]",
        fontsize=10,
    )
    fig.tight_layout()
    return save_png(fig, out)


@register
class MmmuSuite(Suite):
    """The MMMU accuracy suite (see the module docstring)."""

    name = "mmmu"
    Params = Params
    metrics = METRICS
    needs_server = True

    def run(self, ctx: SuiteContext, params: Params) -> SuiteResult:
        return run(ctx, params)

    def doctor_checks(self, cfg: Any, params: Params) -> list[tuple[str, bool, str]]:
        """MMMU must be local (``dataset_path``), in the HF hub cache, or the hub reachable;
        the generated demo questions need nothing."""
        from patchbench.doctor import hf_dataset_check
        from patchbench.suites.mmmu.bench import DEMO_DATASET

        if params.dataset == DEMO_DATASET:
            return []
        return [
            hf_dataset_check(
                f"suite mmmu: dataset {params.dataset}", params.dataset, params.dataset_path
            )
        ]

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: Params
    ) -> dict | None:
        """:func:`pair_repeats` (raises PairingRefused when :mod:`.pairing` refuses a repeat)."""
        return pair_repeats(list(baseline_dirs), list(variant_dirs))

    def report_section(self, comparison: Any) -> list[str]:
        return report_section(comparison)

    def plots(self, comparison: Any, out_dir: Path) -> list[Path]:
        p = plot_subjects(comparison, Path(out_dir) / "mmmu_subjects.png")
        return [p] if p is not None else []

    def report_block(self, suite_dir: Path) -> str | None:
        return report_block(suite_dir)


__all__ = [
    "MmmuSuite",
    "Params",
    "run",
    "METRICS",
    "pair",
    "pair_repeats",
    "PairingError",
    "report_block",
    "cli",
]
