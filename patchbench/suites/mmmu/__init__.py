"""MMMU accuracy suite: the PR's "Accuracy Tests" protocol, a strict parser, the official parser
for comparison with published numbers, and question-by-question pairing of two cells
(docs/mmmu.md). ``patchbench score-mmmu`` is :func:`.scoring.run_args`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench.records import read_json
from patchbench.suite import (
    MetricInfo,
    Suite,
    comparison_get,
    register,
    suite_pairs,
    suite_refusals,
)
from patchbench.suites import folded, new_figure, save_titled
from patchbench.suites.mmmu import load
from patchbench.suites.mmmu.bench import DEMO_DATASET, run
from patchbench.suites.mmmu.data import DOMAINS, domain_metric
from patchbench.suites.mmmu.pairing import pair_repeats as pair_repeats  # the one pairing
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
    """The PR-style "Accuracy Tests" block of one cell from its ``val_sglang.json`` (and
    ``summary.json``, when there, for time, protocol and parser), one per ``c<N>/`` pass of
    several concurrencies; FileNotFoundError without it."""
    d = Path(summary_dir)
    passes = sorted(p.parent for p in d.glob("c*/val_sglang.json"))
    if not (d / "val_sglang.json").exists() and passes:
        return "\n\n".join(f"[concurrency {p.name[1:]}]\n" + report_block(p) for p in passes)
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


# --------------------------------------------------------------------------- rendering


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _num(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else f"{x:.2f}"


def report_section(comparison: Any) -> list[str]:
    """Markdown "MMMU paired": per variant the paired accuracies, flips, McNemar p, identical
    responses, then the subjects with flips folded; a refusal's reason instead of numbers."""
    pairs = suite_pairs(comparison, "mmmu")
    refusals = suite_refusals(comparison, "mmmu")
    if not pairs and not refusals:
        return []
    if any("by_concurrency" in p for p in pairs.values()):
        return load.report_lines(comparison, pairs, refusals)
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
            lines += folded(f"{v}: subjects with flips ({len(subj)})", t)
        lines += [f"- {v}: {n}" for n in p.get("notes") or []]
        if "flips_patch" in p:
            lines.append(
                f"- {v}: flips by cause (deterministic-mode control): {p['flips_patch']} the "
                f"patch's, {p['flips_batching']} batching's"
            )
    if pairs and not subject_plot_variants(comparison):
        lines += [""] if lines[-1] else []
        lines += ["No subject's accuracy changed and no answer flipped: no per-subject plot.", ""]
    return lines


def subject_plot_variants(comparison: Any) -> list[str]:
    """The variants :func:`plot_subjects` draws: those not A/A (all when every one is) with a
    subject that flipped or changed accuracy; [] when none (no plot)."""
    pairs = suite_pairs(comparison, "mmmu")
    aa = set(comparison_get(comparison, "aa_variants", []) or [])
    variants = [v for v in pairs if v not in aa] or list(pairs)

    def moved(d: dict) -> bool:
        return bool(d.get("right_to_wrong") or d.get("wrong_to_right") or d["acc_a"] != d["acc_b"])

    return [v for v in variants if any(map(moved, (pairs[v].get("subjects") or {}).values()))]


def plot_subjects(comparison: Any, out: Path) -> Path | None:
    """Per-subject accuracy change (variant - baseline, points) with its flips, one panel per
    variant of :func:`subject_plot_variants`; None (no file) when there is none."""
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
    title = f"MMMU accuracy per subject: {', '.join(variants)} vs {base}"
    return save_titled(fig, out, comparison, title)


@register
class MmmuSuite(Suite):
    """The MMMU accuracy suite."""

    name = "mmmu"
    Params = Params
    metrics = METRICS
    run = staticmethod(run)
    report_section = staticmethod(report_section)
    report_block = staticmethod(report_block)

    def declarations(self, params: Any) -> dict[str, MetricInfo]:
        """:data:`METRICS`, each at each concurrency of a list (:func:`.load.declarations`)."""
        return load.declarations(params, METRICS)

    instrumentation = staticmethod(load.instrumentation)

    def hf_datasets(self, params: Params) -> list[tuple[str, str, str | None]]:
        """MMMU from the hub or ``dataset_path`` (the demo questions need nothing)."""
        if params.dataset == DEMO_DATASET:
            return []
        return [(f"suite mmmu: dataset {params.dataset}", params.dataset, params.dataset_path)]

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: Params
    ) -> dict | None:
        return load.pair(list(baseline_dirs), list(variant_dirs), params)

    def plots(self, comparison: Any, out_dir: Path) -> list[Path]:
        p = plot_subjects(comparison, Path(out_dir) / "mmmu_subjects.png")
        return [p] if p is not None else []
