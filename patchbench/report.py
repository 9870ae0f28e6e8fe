"""report.md (GitHub-flavoured, pasteable into a PR), report-details.md, the console summary
and ``patchbench report``.

Renders only from the typed :class:`~patchbench.comparison.Comparison` (and the manifest for the
header). report.md is what a reviewer reads, in this order:

1. header: config, model, sglang release, each variant's patches with their sha256, GPU, commit,
   run id, repeats, which cells were instrumented;
2. the answer: one sentence per variant (its primaries with change, interval and verdict; an
   inconclusive one with about how many repeats would decide);
3. the primaries table, at the Holm-adjusted level each verdict used (stated); baseline and
   variant from the estimator of the change (geometric means of the paired repeats), outlier
   repeats named; the failed and incomplete cells with their reasons and the primaries they
   affect (only when there are any);
4. the A/A health check and cell warnings; the GPU block (cells whose GPU was throttled or shared,
   from each cell's NVML summary) and the server-log block (retractions and out-of-memory events
   each suite's server logged, per cell);
5. suite sections (each suite's ``report_section`` hook; per-cell tables folded with
   :func:`patchbench.suites.folded`), pairing refusals with their reasons;
6. the PR figure, a link to the details file, methods with their sources, notes.

report-details.md holds what a reviewer looks up: each primary's values per repeat, the PR-style
blocks (each suite's ``report_block`` hook, Before (baseline) and After (variants)), the
secondary table (raw intervals, exploratory, no coloured verdicts) and the other plots.

The verdict words are those of :data:`VERDICT_MARK` in every place (report, console, answer).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from patchbench import logscan, records, runfolder
from patchbench.analysis import build_comparison
from patchbench.comparison import CompareSettings, Comparison, Row, write_comparison
from patchbench.rundata import variant_parts
from patchbench.runfolder import models

VERDICT_MARK = {
    "regressed": "🔴 regressed",
    "improved": "🟢 improved",
    "equivalent": "🔵 equivalent",
    "inconclusive": "⚪ inconclusive",
    "incomplete": "⚪ incomplete",
}
FOLD_LINES = 15


def fmt_value(x: float | None) -> str:
    """A number for a table: 4 significant digits, thousands grouped; "n/a" for None."""
    if x is None:
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def fmt_bounded(x: float | None, bound: str | None) -> str:
    """:func:`fmt_value` with "≥" / "≤" in front when the value is only a lower / upper bound."""
    return {"lower": "≥", "upper": "≤"}.get(bound or "", "") + fmt_value(x)


def shown_value(r: Row, arm: str) -> str:
    """The value of ``arm`` ("baseline" or "variant") a table shows, from the estimator of the
    row's change (:class:`~patchbench.comparison.Row`: geometric means of paired repeats for run
    rows): accuracy in percent ("41.3%", so that the two values differ by the change in points),
    other rows by :func:`fmt_bounded`."""
    x = r.baseline_value if arm == "baseline" else r.variant_value
    if r.kind == "accuracy" and r.change_unit == "pt" and x is not None:
        return f"{100 * x:.1f}%"
    return fmt_bounded(x, r.baseline_bound if arm == "baseline" else r.variant_bound)


def values_txt(r: Row) -> str:
    """A deterministic row's two values, bounds marked: "507 -> 90", "507 -> ≥6"."""
    return f"{shown_value(r, 'baseline')} -> {shown_value(r, 'variant')}"


def exactness(r: Row) -> str:
    """How a deterministic row's values are known: "a bound" when either value is only a bound,
    "exact" when shown exact (every arm measured at least twice with no spread, or the suite's
    test proves the value deterministic: ``Row.exact_by``), else "one measurement per arm"."""
    if r.baseline_bound or r.variant_bound:
        return "a bound"
    return "exact" if r.exact_by else "one measurement per arm"


def fmt_change(x: float | None, unit: str) -> str:
    """A change in its unit: "+20.1%", "+0.1 pt", "-2 count"; "n/a" for None."""
    if x is None:
        return "n/a"
    if x == 0 or (unit in ("%", "pt") and round(x, 1) == 0):
        x = 0.0  # "+0.0", never "-0.0", for a change that rounds to zero
    if unit == "%":
        return f"{x:+.1f}%"
    if unit == "pt":
        return f"{x:+.1f} pt"
    return f"{x:+g}" + (f" {unit}" if unit else "")


def fmt_pct(x: float | None) -> str:
    """A percentage change: "+20.1%"."""
    return fmt_change(x, "%")


def fmt_ci(lo: float | None, hi: float | None, unit: str = "%") -> str:
    """An interval "[+18.3%, +21.9%]" (points: "[-0.9, +1.1]"); "n/a" when absent."""
    if lo is None or hi is None:
        return "n/a"
    if unit == "%":
        return f"[{lo:+.1f}%, {hi:+.1f}%]"
    return f"[{lo:+.1f}, {hi:+.1f}]"


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _code(text: str, summary: str) -> str:
    body = f"```\n{text.rstrip()}\n```"
    if text.count("\n") + 1 > FOLD_LINES:
        return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"
    return body


def _name(r: Row) -> str:
    return (r.label or r.metric).rstrip(":").strip()


def _margin_txt(r: Row) -> str:
    if r.margin is None:
        return ""
    return f"±{r.margin:g} pt" if r.change_unit == "pt" else f"±{r.margin:g}%"


def verdict_text(r: Row) -> str:
    """The verdict of a row in the words of :data:`VERDICT_MARK` (report, console and answer
    alike): "improved", "improved, within ±5%", "equivalent within ±2 pt", "equivalent" (an
    equal deterministic count), "inconclusive"."""
    if r.verdict in ("improved", "regressed") and r.within_margin:
        return f"{r.verdict}, within {_margin_txt(r)}"
    if r.verdict == "equivalent":
        margin = _margin_txt(r)
        # a deterministic count with no margin is equivalent only when it is exactly equal
        return f"equivalent within {margin}" if margin else "equivalent"
    return r.verdict


def short_name(r: Row) -> str:
    """A row's label without its parenthetical or trailing qualifier, for the one-line answer
    (:meth:`~patchbench.comparison.Row.short_label`)."""
    return r.short_label()


# ---------------------------------------------------------------- what an inconclusive row needs

#: the chance of a decision that the repeats-to-decide estimate aims at
DECIDE_POWER = 0.8
#: paired repeats beyond which the estimate says only "more than"
DECIDE_CAP = 50
#: questions beyond this multiple of the row's questions: only "more than"
DECIDE_QUESTIONS_CAP = 20


@dataclass
class Decide:
    """How much data would likely decide an inconclusive row: ``n`` paired repeats (``unit``
    "repeats") or questions ("questions"), None when more than ``cap``; ``what`` the decision
    that needs the fewest ("the observed -8.8%" or "equivalence within ±5%"); ``sd`` the noise
    used, as text; ``pairs`` the data it was measured on, as text."""

    n: int | None
    cap: int
    unit: str
    what: str
    sd: str
    pairs: str


def _n_needed(
    sd: float,
    effect: float,
    margin: float | None,
    alpha: float,
    *,
    t_df: bool,
    floor: int,
    cap: int,
) -> tuple[int | None, str] | None:
    """The smallest n (``floor`` <= n <= ``cap``) that gives :data:`DECIDE_POWER` to one of two
    decisions, and which: showing ``effect`` (two-sided, level ``alpha``: n >= ((q(1 - alpha/2)
    + q(power)) sd / |effect|)^2) or, when |effect| < ``margin``, equivalence by TOST at
    ``alpha`` assuming the true change is ``effect`` (n >= ((q(1 - alpha) + q(1 - (1 -
    power)/2)) sd / (margin - |effect|))^2). q: Student's t with n - 1 degrees of freedom when
    ``t_df``, else the normal. Returns (None, what) when more than ``cap``; None when neither
    decision can happen (no change seen and no margin)."""
    from scipy import stats as sps

    goals = []
    if effect != 0:
        goals.append(("effect", abs(effect), 1 - alpha / 2, DECIDE_POWER))
    if margin is not None and abs(effect) < margin:
        goals.append(("equivalence", margin - abs(effect), 1 - alpha, 1 - (1 - DECIDE_POWER) / 2))
    best: tuple[int | None, str] | None = None
    for what, gap, pa, pb in goals:
        z = (sps.norm.ppf(pa) + sps.norm.ppf(pb)) * sd / gap
        n = max(floor, math.ceil(z * z))
        while t_df and n <= cap:
            q = sps.t.ppf(pa, n - 1) + sps.t.ppf(pb, n - 1)
            if n * gap * gap >= (q * sd) ** 2:
                break
            n += 1
        got = n if n <= cap else None
        if best is None or (got is not None and (best[0] is None or got < best[0])):
            best = (got, what)
    return best


def repeats_to_decide(r: Row, min_repeats: int) -> Decide | None:
    """How many paired repeats (accuracy: questions) would likely decide an inconclusive
    primary at the noise this run saw and the level its verdict used (:func:`_n_needed`).

    Run rows: the observed sd of the paired log ratios (2 pairs or more), t quantiles, at least
    ``min_repeats``. Accuracy rows: the per-question sd the shown interval implies (half-width
    x sqrt(questions) / z), normal quantiles, in questions (repeats of a greedy run are near
    copies; the question is the unit). None for other rows and where the noise is unknown."""
    if r.verdict != "inconclusive" or not r.primary or r.change is None or r.confidence is None:
        return None
    alpha = 1 - r.confidence
    if r.kind == "run" and r.change_unit == "%" and r.log_ratio_sd is not None:
        effect = math.log1p(r.change / 100)
        margin = math.log1p(r.margin / 100) if r.margin is not None else None
        got = _n_needed(
            r.log_ratio_sd, effect, margin, alpha, t_df=True, floor=min_repeats, cap=DECIDE_CAP
        )
        cap, unit, pairs = DECIDE_CAP, "repeats", f"{r.n_pairs} pairs"
        sd = f"sd of paired log ratios {100 * r.log_ratio_sd:.1f}%"
    elif r.kind == "accuracy" and r.low is not None and r.high is not None and r.n_pairs:
        from scipy import stats as sps

        half = (r.high - r.low) / 2
        sd_q = half * math.sqrt(r.n_pairs) / sps.norm.ppf(1 - alpha / 2)
        cap = DECIDE_QUESTIONS_CAP * r.n_pairs
        got = _n_needed(sd_q, r.change, r.margin, alpha, t_df=False, floor=r.n_pairs, cap=cap)
        unit, sd, pairs = "questions", f"interval ±{half:.1f} pt", f"{r.n_pairs} questions"
    else:
        return None
    if got is None:
        return None
    n, what = got
    what = (
        f"equivalence within {_margin_txt(r)}"
        if what == "equivalence"
        else f"the observed {fmt_change(r.change, r.change_unit)}"
    )
    return Decide(n, cap, unit, what, sd, pairs)


def decide_text(d: Decide, *, short: bool = False) -> str:
    """ "about 9 repeats to decide" (``short``, for the answer), or with what and the noise:
    "about 9 paired repeats would likely decide (80% power to show equivalence within ±5%; sd of
    paired log ratios 4.3% over 2 pairs)"; "more than 50 ..." past the cap."""
    if short:
        return f"{'about' if d.n is not None else 'more than'} {d.n or d.cap} {d.unit} to decide"
    unit = "paired repeats" if d.unit == "repeats" else d.unit
    head = (
        f"about {d.n} {unit} would likely decide"
        if d.n is not None
        else f"more than {d.cap} {unit} would be needed to decide"
    )
    return f"{head} ({100 * DECIDE_POWER:g}% power to show {d.what}; {d.sd} over {d.pairs})"


def decide_note(r: Row, min_repeats: int, *, short: bool = False) -> str | None:
    """What an inconclusive primary needs to be decided (:func:`decide_text` of
    :func:`repeats_to_decide`), or why no estimate is given (a run row with fewer than 2 paired
    repeats has no observed noise); None for a row that is decided or not primary."""
    d = repeats_to_decide(r, min_repeats)
    if d is not None:
        return decide_text(d, short=short)
    if r.verdict == "inconclusive" and r.primary and r.kind == "run" and r.log_ratio_sd is None:
        return (
            "noise unknown"
            if short
            else "repeats to decide: not estimated (the noise needs at least 2 paired repeats)"
        )
    return None


def outlier_text(r: Row) -> str | None:
    """ "outlier repeat: rep2" (descriptive, :data:`patchbench.analysis.OUTLIER_RULE`), or None."""
    if not r.outlier_repeats:
        return None
    reps = ", ".join(f"rep{k}" for k in r.outlier_repeats)
    return f"outlier repeat{'s' if len(r.outlier_repeats) > 1 else ''}: {reps} (descriptive)"


def _why_no_interval(r: Row) -> str:
    """A few words on why a row has no interval: the repeat count of its test's reason ("2
    paired repeats", "1 repeat"), else the start of its first note."""
    for n in r.notes:
        m = re.match(r"(\d+ paired repeats?|1 repeat|no paired repeats)\b", n)
        if m:
            return m.group(1)
    return (r.notes[0].split(":")[0] if r.notes else "no interval").strip()


def sentence(cmp: Comparison, variant: str) -> str:
    """One hyperfine-style sentence for ``variant``: each primary with its change, interval and
    verdict; a pairing refusal by its reason (:func:`sentence_parts` joined)."""
    head, parts = sentence_parts(cmp, variant)
    return head + ("; ".join(parts) if parts else "no primary metric")


def sentence_parts(cmp: Comparison, variant: str) -> tuple[str, list[str]]:
    """(``"<variant> vs <baseline>: "``, one clause per primary and pairing refusal)."""
    parts = []
    for r in cmp.rows_for(variant, primary=True):
        if r.kind == "deterministic":
            parts.append(f"{short_name(r)} {values_txt(r)} {verdict_text(r)} ({exactness(r)})")
            continue
        decide = decide_note(r, cmp.settings.min_repeats, short=True)
        if r.low is None or r.high is None:
            # no interval: say why in a few words instead of "n/a" (the table has the full note)
            why = "; ".join(x for x in (_why_no_interval(r), decide) if x)
            parts.append(
                f"{short_name(r)} {fmt_change(r.change, r.change_unit)} {verdict_text(r)} ({why})"
            )
            continue
        parts.append(
            f"{short_name(r)} {fmt_change(r.change, r.change_unit)} "
            f"{fmt_ci(r.low, r.high, r.change_unit)} {verdict_text(r)}"
            + (f" ({decide})" if decide else "")
        )
    for suite, per in cmp.refusals.items():
        if variant in per:
            parts.append(f"{suite} not paired: {per[variant]}")
    tag = " (A/A)" if variant in cmp.aa_variants else ""
    return f"{variant}{tag} vs {cmp.baseline}: ", parts


def _header(man: runfolder.RunManifest, cmp: Comparison) -> list[str]:
    cfg = man.config or models.RunConfig()
    ref = cfg.model or models.ModelRef()
    model = ref.path or man.model or "?"
    gpu_s = gpu_name(man.gpu) or "none (CPU engine)"
    lines = [
        f"# patchbench: {cfg.name or cmp.run_id}",
        "",
        "| | |",
        "|---|---|",
        f"| run | `{cmp.run_id}` |",
        f"| model | `{model}`"
        + (
            " (tiny random weights: accuracy near 0 is expected; this run shows the pipeline)"
            if ref.tiny
            else ""
        )
        + " |",
        f"| sglang | `{man.sglang_version or cfg.sglang or '?'}` |",
    ]
    for v in [cmp.baseline] + cmp.variants:
        pats, args, env = variant_parts(cfg.variants_json().get(v))
        ps = man.patches.get(v) or [models.PatchHash(name=p) for p in pats]
        desc = ", ".join(f"`{p.name}` ({(p.sha256 or '?')[:12]})" for p in ps) or "stock"
        if args:
            desc += "; server args " + " ".join(f"`{a}`" for a in args)
        if env:
            desc += "; env " + " ".join(f"`{k}={val}`" for k, val in env.items())
        if v in man.builds:  # the run named builds: each arm's (patchbench.builds)
            desc += f"; build {man.builds[v].get('describe', '?')}"
        tag = " (baseline)" if v == cmp.baseline else (" (A/A)" if v in cmp.aa_variants else "")
        lines.append(f"| variant `{v}`{tag} | {desc} |")
    inst = [f"{c['variant']}/rep{c['repeat']}" for c in cmp.cells if c.get("instrumented")]
    corr = [c["dir"] for c in cmp.correctness_cells]
    rounds = cmp.suite_rounds
    order = cfg.schedule.order
    lines += [
        f"| GPU | {gpu_s} |",
        f"| patchbench commit | `{(man.git_sha or '?')[:12]}` |",
        f"| schedule | {cmp.repeats} timed repeat(s), {order} |",
    ]
    d = cmp.design
    if d.kind == "sequential":
        most = f" of at most {d.looks[-1]}" if d.looks else ""
        why = d.stop_reason if d.partial is None else f"partial: {d.partial}"
        lines.append(f"| sequential | {d.stopped_after or d.rounds}{most} repeats; {why} |")
    suites_txt = ", ".join(
        f"{x} ({_rounds_txt(rounds[x])})" if x in rounds and rounds[x] != "all" else x
        for x in cmp.suites
    )
    lines += [
        f"| suites | {suites_txt or 'none'} |",
        "| timed cells | no instrumentation, no profiler |",
        f"| untimed correctness cells | {', '.join(corr) if corr else 'none'} |",
    ]
    if inst:
        lines.append(f"| instrumented timed cells (old run) | {', '.join(inst)} |")
    if man.started_at:
        lines.append(f"| time | {man.started_at} to {man.ended_at or '(unfinished)'} |")
    return lines + [""]


def _rounds_txt(r: object) -> str:
    """A suite's rounds in words: "correctness cells only", "first round", "rounds 0, 2"."""
    if r == "correctness":
        return "correctness cells only"
    if r == "first":
        return "first round only"
    if isinstance(r, list):
        return "rounds " + ", ".join(str(i) for i in r)
    return str(r)


def gpu_name(gpu: models.HostGpus | None) -> str | None:
    """The GPU model(s) of a manifest's ``gpu``: the names in ``gpus``, "NAME xN" for N equal
    GPUs; None without a GPU."""
    if gpu is None:
        return None
    names = [g.name or "?" for g in gpu.gpus]
    if not names:
        return "?"
    if len(set(names)) == 1:
        return names[0] + (f" x{len(names)}" if len(names) > 1 else "")
    return ", ".join(names)


def _primaries(cmp: Comparison) -> list[str]:
    rows = [r for r in cmp.rows if r.primary]
    if not rows:
        return ["## Primary metrics", "", "(no suite of this run declares primary metrics)", ""]
    d = cmp.design
    fam = 100 * (1 - d.alpha)
    outside = (
        " Deterministic counts are compared exactly, outside the family."
        if any(r.kind == "deterministic" for r in rows)
        else ""
    )
    if d.kind == "sequential":
        intro = (
            f"Decided by the sequential rule ({d.boundary} boundary, looks after "
            f"{', '.join(str(n) for n in d.looks)} rounds; family confidence {fam:g}% over the "
            f"{d.family} primaries of the non-A/A variants): each interval is at the nominal "
            "level its decision used at its look; an equivalent one is the interval TOST checked."
        )
    else:
        intro = (
            f"Intervals are at the Holm-adjusted level each verdict used (family confidence "
            f"{fam:g}% over the {d.family} primaries of the non-A/A variants, one family per "
            "report); equivalence is TOST at the same level."
        )
    lines = [
        "## Primary metrics",
        "",
        intro + outside + " Baseline and variant are the geometric means of the paired repeats, "
        "so their ratio is the change (accuracy: the mean over the paired questions; counts: the "
        "value).",
        "",
        "| variant | metric | baseline | variant | change | interval | level | verdict | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        level = f"{100 * r.confidence:.2f}%" if r.confidence else exactness(r)
        lines.append(
            f"| {r.variant} | {_esc(_name(r))} | {shown_value(r, 'baseline')} | "
            f"{shown_value(r, 'variant')} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {level} | "
            f"{VERDICT_MARK.get(r.verdict, r.verdict)}"
            f"{', within ' + _margin_txt(r) if r.within_margin else ''} | "
            f"{_esc('; '.join(_primary_notes(r, cmp.settings.min_repeats)))} |"
        )
    return lines + [""]


def _primary_notes(r: Row, min_repeats: int) -> list[str]:
    """A primary's notes in the table: the row's own, its outlier repeats, and for an
    inconclusive row how many repeats would likely decide (:func:`decide_note`)."""
    extra = [outlier_text(r), decide_note(r, min_repeats)]
    return list(r.notes) + [x for x in extra if x]


def partial_lines(cmp: Comparison) -> list[str]:
    """What a partial run says (none for a finished one): that it is partial, where it stopped
    and the command that resumes it."""
    d = cmp.design
    if d.partial is None:
        return []
    out = [f"Partial run: {d.partial}; no primary verdict is decisive."]
    if d.resume:
        out.append(f"Resume with: {d.resume}")
    return out


def _partial(cmp: Comparison) -> list[str]:
    lines = partial_lines(cmp)
    if not lines:
        return []
    return [f"**{lines[0]}**"] + [f"`{x.split(': ', 1)[1]}`" for x in lines[1:2]] + [""]


def _aa_line(n) -> str:
    name = (n.label or n.metric).rstrip(":").strip()
    if n.cv_pct is None:
        txt = f"{n.variant} / {name}: fewer than 2 pairs, no noise estimate"
    else:
        txt = (
            f"{n.variant} / {name}: run-to-run CV {n.cv_pct:.2f}% (95% interval "
            f"{n.low_pct:.2f}-{n.high_pct:.2f}%, {n.n} pairs)"
        )
    if n.assumed_pct is not None:
        txt += f"; the config assumes {n.assumed_pct:g}%"
    return txt


def _drift_lines(cmp: Comparison) -> list[str]:
    """The drifts found in the baseline's values across rounds (none: nothing)."""
    found = [d for d in cmp.drift if d.found]
    if not found:
        return []
    unbalanced = cmp.order == "sequential"
    lines = ["## Drift", ""]
    for d in found:
        name = (d.label or d.metric).rstrip(":").strip()
        lines.append(
            f"- {d.suite} / {name}: the baseline drifts {d.slope_pct:+.2f}%/round (95% interval "
            f"{d.low_pct:+.2f} to {d.high_pct:+.2f}, p = {d.p:.2g}, {d.n} rounds)"
            + (
                "; under this unbalanced schedule its verdicts are inconclusive"
                if unbalanced
                else "; the interleaved schedule balances it across the arms"
            )
        )
    return lines + [""]


def _health(cmp: Comparison) -> list[str]:
    lines = []
    if cmp.aa_variants:
        lines += [
            "## A/A noise",
            "",
            "A/A variants are measurements of the noise between identical arms; they change no "
            "verdict.",
            "",
        ]
        lines += [f"- {_aa_line(n)}" for n in cmp.health.noise]
        lines += [f"- {_esc(x)}" for x in cmp.health.notes]
        lines += [""]
    lines += _drift_lines(cmp)
    warn = [(s, v, w) for s, per in cmp.cell_warnings.items() for v, ws in per.items() for w in ws]
    if warn:
        lines += ["<details><summary>cell warnings</summary>", ""]
        lines += [f"- {s} / {v}: {_esc(w)}" for s, v, w in warn] + ["", "</details>", ""]
    return lines


def _failures(cmp: Comparison, manifest: runfolder.RunManifest, run_dir: Path) -> list[str]:
    """## Failed and incomplete cells: each cell that failed, ended incomplete or was
    interrupted, with its reason (the cell's error; for an incomplete one, each incomplete
    suite's first error), then every primary metric those cells affect, marked incomplete (its
    verdict uses only the cells that finished; "no value" when no cell of it did). [] when every
    cell is ok."""
    from patchbench.suite import get_suite

    bad = [c for c in manifest.cells if c.status in ("failed", "incomplete", "interrupted")]
    if not bad:
        return []
    lines = [
        "## Failed and incomplete cells",
        "",
        "| cell | status | reason |",
        "|---|---|---|",
    ]
    hit: dict[tuple[str, str], list[str]] = {}  # (variant, suite) -> cells
    for c in bad:
        label = f"{c.variant}/{Path(c.dir).name or c.repeat}"
        reasons = [c.error] if c.error else []
        for suite, st in c.suites.items():
            if st not in ("failed", "incomplete"):
                continue
            hit.setdefault((c.variant, suite), []).append(label)
            summ = None
            try:
                summ = runfolder.read_summary(run_dir / c.dir / suite)
            except Exception:  # noqa: BLE001 - the reason is a courtesy; the status is shown
                pass
            if summ is not None and summ.errors and not (c.error and c.error in summ.errors[0]):
                reasons.append(f"{suite}: {summ.errors[0].splitlines()[0]}")
        text = "; ".join(r.splitlines()[0][:300] for r in reasons) or "(no reason recorded)"
        lines.append(f"| {label} | {c.status} | {_esc(text)} |")
    lines.append("")
    rows = {(r.variant, r.suite, r.metric): r for r in cmp.rows if r.primary}
    affected = []
    for (variant, suite), cells in hit.items():
        try:
            declared = get_suite(suite).metrics
        except Exception:  # noqa: BLE001 - a suite not registered here: its rows say
            declared = {}
        names = {m for m, info in declared.items() if getattr(info, "primary", False)}
        names |= {m for (_v, s, m) in rows if s == suite}
        targets = cmp.variants if variant == cmp.baseline else [variant]
        for m in names:
            for v in targets:
                shown = "incomplete" if (v, suite, m) in rows else "incomplete: no value"
                affected.append(f"- `{v}` {suite} {m}: {shown} (cells {', '.join(cells)})")
    if affected:
        lines += ["Primary metrics these cells affect:", ""] + sorted(set(affected)) + [""]
    return lines


def _cell_record(run_dir: Path, c: dict) -> runfolder.CellRecord | None:
    try:
        return runfolder.read_cell(records.cell_dir(run_dir, c["variant"], c["repeat"]))
    except Exception:  # noqa: BLE001 - a newer schema is refused elsewhere; this block only reads
        return None


def _gpu_block(cmp: Comparison, run_dir: Path) -> list[str]:
    """ "## GPU": the cells whose GPU was throttled (a biasing reason) or shared with a foreign
    process, with their flags (each cell's ``cell.json`` ``gpu`` summary:
    :func:`patchbench.gpu.cell_flags`). Nothing when no cell was sampled (CPU run, no NVML)."""
    from patchbench.gpu import cell_flags

    sampled, flagged = 0, []
    for c in cmp.cells:
        rec = _cell_record(run_dir, c)
        flags = cell_flags(rec) if rec is not None else None
        if flags is None:
            continue
        sampled += 1
        if flags:
            flagged.append((c, flags))
    if not sampled:
        return []
    if not flagged:
        return [
            "## GPU",
            "",
            f"no throttling and no foreign process in the {sampled} sampled cell(s)",
            "",
        ]
    lines = [
        "## GPU",
        "",
        f"**{len(flagged)} of {sampled} sampled cell(s) ran on a throttled or "
        "shared GPU**; their timings are biased (compare them with the other repeats):",
        "",
    ]
    lines += [f"- {c['variant']}/rep{c['repeat']}: {_esc('; '.join(f))}" for c, f in flagged]
    return lines + [""]


def _server_log_block(cmp: Comparison, run_dir: Path) -> list[str]:
    """ "## Server log": per suite, the cells where the server logged retractions or
    out-of-memory events while that suite ran (the suite's ``meta.server_log_scan``:
    :func:`patchbench.logscan.scan_server_log`); they change what that suite measured."""
    lines = []
    for suite in cmp.suites:
        for c in cmp.cells:
            try:
                sm = runfolder.read_summary(
                    records.suite_dir(run_dir, c["variant"], c["repeat"], suite)
                )
            except Exception:  # noqa: BLE001 - a newer schema is refused elsewhere
                continue
            scan = logscan.scan_of(sm.meta) if sm is not None else None
            if scan is None or (not scan.retractions_count and not scan.oom_count):
                continue
            first = (scan.first_lines or [""])[0]
            lines.append(
                f"- {suite} / {c['variant']}/rep{c['repeat']}: {scan.retractions_count} "
                f"retraction(s) of {scan.retracted_requests_count} request(s), "
                f"{scan.oom_count} out-of-memory event(s)"
                + (f" (first: {_esc(first)})" if first else "")
            )
    if not lines:
        return []
    return (
        [
            "## Server log",
            "",
            "retractions and out-of-memory events the server logged while a "
            "suite ran; they change what that suite measured in that cell:",
            "",
        ]
        + lines
        + [""]
    )


def _suite_sections(cmp: Comparison, notes: list[str]) -> list[str]:
    from patchbench.suite import get_suite

    lines = []
    for suite in cmp.suites:
        for v, why in (cmp.refusals.get(suite) or {}).items():
            lines += [f"**{suite} / {v}: not paired** - {_esc(why)}", ""]
        try:
            obj = get_suite(suite)
        except Exception:  # noqa: BLE001 - an unknown suite, or one failing to import: no section
            continue
        try:
            lines += list(obj.report_section(cmp) or [])
        except Exception as e:  # noqa: BLE001 - a section must never cost the report
            notes.append(f"{suite} report_section failed: {type(e).__name__}: {e}")
    return lines


def _first_ok(cmp: Comparison, variant: str, suite: str) -> int | None:
    for c in cmp.cells:
        if c["variant"] == variant and (c.get("suites") or {}).get(suite) == "ok":
            return c["repeat"]
    return None


def _pr_blocks(cmp: Comparison, run_dir: Path, notes: list[str]) -> list[str]:
    from patchbench.suite import get_suite

    lines = []
    after = [v for v in cmp.variants if v not in cmp.aa_variants] or cmp.variants
    for suite in cmp.suites:
        try:
            obj = get_suite(suite)
        except Exception:  # noqa: BLE001 - an unknown suite, or one that fails to import: no block
            continue
        sec = []
        for label, v in [("Before", cmp.baseline)] + [("After", x) for x in after]:
            k = _first_ok(cmp, v, suite)
            if k is None:
                continue
            try:
                blk = obj.report_block(run_dir / v / f"rep{k}" / suite)
            except Exception as e:  # noqa: BLE001
                notes.append(f"{suite} report_block of {v}/rep{k} failed: {type(e).__name__}: {e}")
                continue
            if blk:
                sec += [f"### {label} ({v}, rep{k})", "", _code(blk, f"{suite}: {label} ({v})"), ""]
        if sec:
            lines += [f"## {suite}: PR blocks", ""] + sec
    return lines


def _secondary(cmp: Comparison) -> list[str]:
    """ "## Secondary metrics" of the details file: every non-primary row with its values (the
    estimator of :func:`shown_value`), change, raw interval and method; no coloured verdicts."""
    rows = [r for r in cmp.rows if not r.primary]
    if not rows:
        return []
    lines = [
        "## Secondary metrics",
        "",
        f"Exploratory: raw {100 * cmp.settings.confidence:g}% intervals, no multiplicity "
        "correction, not verdicts.",
        "",
        "| variant | suite | metric | baseline | variant | change | interval | method | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        desc = ""
        if r.descriptive:
            d = r.descriptive
            desc = (
                f"request-level (descriptive only): {fmt_ci(d.get('low_pct'), d.get('high_pct'))}; "
            )
        lines.append(
            f"| {r.variant} | {r.suite} | `{r.metric}` | {shown_value(r, 'baseline')} | "
            f"{shown_value(r, 'variant')} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {_esc(r.method or '')} | "
            f"{_esc(desc + '; '.join(r.notes))} |"
        )
    return lines + [""]


def _repeat_cell(r: Row, i: int, k: int) -> str:
    """One repeat of a primary in the per-repeat table: "466.9 -> 420.7 (-9.9%)" (accuracy in
    percent: "41.3% -> 42.9%"), outliers in bold; "-" where an arm has no value."""
    b = r.baseline_repeats[i] if i < len(r.baseline_repeats) else None
    v = r.variant_repeats[i] if i < len(r.variant_repeats) else None

    def one(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{100 * x:.1f}%" if r.kind == "accuracy" else fmt_value(x)

    txt = f"{one(b)} -> {one(v)}"
    if b is not None and v is not None and r.kind == "run" and r.change_unit == "%" and b > 0:
        txt += f" ({fmt_pct(100 * (v / b - 1))})"
    return f"**{txt} outlier**" if k in r.outlier_repeats else txt


def _per_repeat(cmp: Comparison) -> list[str]:
    """ "## Primary metrics per repeat": each primary's baseline -> variant value in every timed
    round its suite ran (a run row's change per pair; outlier repeats in bold)."""
    rows = [r for r in cmp.rows if r.primary and (r.baseline_repeats or r.variant_repeats)]
    if not rows:
        return []
    lines = [
        "## Primary metrics per repeat",
        "",
        "baseline -> variant in each repeat (run metrics: that pair's change); an outlier "
        "repeat (rule in the report's Methods) is in bold.",
        "",
    ]
    by_suite: dict[str, list[Row]] = {}
    for r in rows:
        by_suite.setdefault(r.suite, []).append(r)
    for suite, rs in by_suite.items():
        n = max(max(len(r.baseline_repeats), len(r.variant_repeats)) for r in rs)
        rounds = cmp.suite_rounds.get(suite)
        ks = list(rounds) if isinstance(rounds, list) and len(rounds) == n else list(range(n))
        if rounds == "correctness":
            heads = ["correctness cell"] * n
        else:
            heads = [f"rep{k}" for k in ks]
        lines += [
            f"| variant | {suite} metric | " + " | ".join(heads) + " |",
            "|---|---|" + "---|" * n,
        ]
        lines += [
            f"| {r.variant} | {_esc(short_name(r))} | "
            + " | ".join(_repeat_cell(r, i, k) for i, k in enumerate(ks))
            + " |"
            for r in rs
        ]
        lines.append("")
    return lines


def _methods(cmp: Comparison) -> list[str]:
    from patchbench.analysis import OUTLIER_RULE

    s = cmp.settings
    lines = [
        "## Methods",
        "",
        f"- Run-level metrics: repeat k of the baseline paired with repeat k of the variant "
        f"({cmp.order} schedule); a verdict needs at least {s.min_repeats} paired repeats. "
        "Request-level intervals inside one cell are descriptive only.",
        "- Values shown: each arm's geometric mean over the paired repeats (their ratio is the "
        "change: exp(mean paired log ratio)); accuracy: mean correctness over the paired "
        "questions; counts: the median.",
        "- Verdicts: improved / regressed when the interval excludes no change; equivalent "
        "when TOST at the same level puts the change inside the margin; inconclusive otherwise.",
        f"- Error control per report: {cmp.design.split or 'no primary tested'}; secondaries "
        "are descriptive.",
        "- Drift: the baseline's values of each run-level primary, log value on the round index, "
        "slope t test at 0.01; it changes verdicts only under an unbalanced schedule.",
        "- A/A variants are measurements, outside the family: their run-to-run CV is the sd of "
        "their paired log ratios over sqrt 2 (chi-square interval); they never change a verdict.",
        f"- Outlier repeat (named only, never changes a verdict): {OUTLIER_RULE}.",
        f"- Repeats to decide (inconclusive primaries): fewest paired repeats for "
        f"{100 * DECIDE_POWER:g}% power at the verdict's level and the run's sd of paired log "
        "ratios (t, n - 1 df) to show the observed change or, inside the margin, equivalence "
        f"(whichever needs fewer); capped at {DECIDE_CAP}. Accuracy: in questions, sd from the "
        "interval (normal).",
    ]
    if cmp.order == "sequential":
        lines.append(
            "- Schedule: unbalanced (order: sequential, the same order every round): "
            + _esc(cmp.unbalanced_reason or "no reason recorded")
        )
    if any("@" in r.metric for r in cmp.rows):
        lines.append(
            "- Load sweep: a metric named `<metric>@<point>` is that metric at one load (`c16`: "
            "concurrency 16, `r2.5`: 2.5 req/s), paired across repeats at that load; the "
            "curve's primaries (named by the suite) are in the report's one Holm family; a "
            "point whose client did not deliver the load is not judged (docs/serving.md)."
        )
    lines += [f"- {name}: {src}" for name, src in cmp.methods.items()]
    return lines + [""]


#: the second file of a report: what a reviewer looks up, not what they read first
DETAILS_NAME = "report-details.md"
#: the plot report.md shows; the others are in the details file
PR_FIGURE_STEM = "pr_figure"


def _plot_lines(paths: list[Path], run_dir: Path) -> list[str]:
    lines = []
    for p in paths:
        rel = p.relative_to(run_dir) if p.is_relative_to(run_dir) else p
        lines += [f"![{p.stem}]({rel.as_posix()})", ""]
    return lines


def _details_link(cmp: Comparison, more_plots: int, details: str | None) -> list[str]:
    """ "## Details": what the details file holds (read from its text ``details`` when given),
    linked; [] when it holds nothing."""
    has = {
        "each primary's values per repeat": "## Primary metrics per repeat",
        "each suite's PR-style blocks (Before / After)": "### Before (",
        "the secondary metrics": "## Secondary metrics",
    }
    what = [w for w, head in has.items() if details is None or head in details]
    if details is None and not any(not r.primary for r in cmp.rows):
        what.remove("the secondary metrics")
    if more_plots:
        what.append(f"{more_plots} more plot{'s' if more_plots > 1 else ''}")
    if not what:
        return []
    return ["## Details", "", f"[{DETAILS_NAME}]({DETAILS_NAME}): " + ", ".join(what) + ".", ""]


def render_markdown(
    cmp: Comparison,
    manifest: runfolder.RunManifest,
    run_dir: Path,
    plot_paths: list[Path] | None = None,
    extra_notes: list[str] | None = None,
    *,
    details: str | None = None,
) -> str:
    """The report.md text of a comparison (sections in the module docstring): what a reviewer
    reads; per-repeat values, PR-style blocks, secondary metrics and every plot but the PR
    figure are in :func:`render_details`, whose text ``details`` (when given) decides what the
    link to it lists."""
    notes = list(extra_notes or [])
    plots = list(plot_paths or [])
    pr_fig = [p for p in plots if p.stem == PR_FIGURE_STEM]
    lines = _header(manifest, cmp)
    lines += ["## Answer", ""] + _partial(cmp)
    lines += [f"- {sentence(cmp, v)}" for v in cmp.variants] + [""]
    lines += (
        _primaries(cmp)
        + _failures(cmp, manifest, run_dir)
        + _health(cmp)
        + _gpu_block(cmp, run_dir)
        + _server_log_block(cmp, run_dir)
        + _suite_sections(cmp, notes)
    )
    if pr_fig:
        lines += ["## Plots", ""] + _plot_lines(pr_fig, run_dir)
    lines += _details_link(cmp, len(plots) - len(pr_fig), details)
    lines += _methods(cmp)
    all_notes = list(cmp.notes) + notes
    if all_notes:
        lines += ["## Notes", ""] + [f"- {_esc(n)}" for n in all_notes] + [""]
    return "\n".join(lines).rstrip() + "\n"


def render_details(
    cmp: Comparison,
    run_dir: Path,
    plot_paths: list[Path] | None = None,
    notes: list[str] | None = None,
) -> str:
    """The report-details.md text: each primary's values per repeat, each suite's PR-style
    blocks (``report_block`` of the first ok repeat, Before and After), the secondary metrics,
    and every plot but the PR figure. A ``report_block`` that fails adds a line to ``notes``."""
    notes = notes if notes is not None else []
    lines = [
        f"# patchbench details: {cmp.run_id}",
        "",
        "The report is [report.md](report.md); this file holds what it leaves out.",
        "",
    ]
    lines += _per_repeat(cmp) + _pr_blocks(cmp, run_dir, notes) + _secondary(cmp)
    more = [p for p in plot_paths or [] if p.stem != PR_FIGURE_STEM]
    if more:
        lines += ["## Plots", ""] + _plot_lines(more, run_dir)
    return "\n".join(lines).rstrip() + "\n"


def render_run(
    run_dir: str | Path, settings: CompareSettings | None = None, *, plots: bool = True
) -> Path:
    """Build compare.json, plots, report.md and report-details.md of a run folder from its files
    alone; returns report.md. Raises RunFolderError / SchemaTooNew (exit 2) for an unusable
    manifest."""
    run_dir = Path(run_dir)
    cmp = build_comparison(run_dir, settings)
    write_comparison(run_dir, cmp)
    paths, pnotes = [], []
    if plots:
        from patchbench.plots import make_plots

        paths, pnotes = make_plots(cmp, run_dir / "plots")
    details = render_details(cmp, run_dir, paths, pnotes)
    records.write_text(run_dir / DETAILS_NAME, details)
    manifest = runfolder.read_manifest(run_dir)
    text = render_markdown(cmp, manifest, run_dir, paths, pnotes, details=details)
    return records.write_text(run_dir / "report.md", text)


#: the console's width when stdout is not a terminal (rich would use 80)
CONSOLE_LOG_WIDTH = 120


def console_summary(cmp: Comparison, report: Path | None = None) -> list[str]:
    """Print the primaries table (rich when available), then the same sentences as report.md,
    one clause a line; returns the sentences."""
    sents = [sentence(cmp, v) for v in cmp.variants]
    answer = []
    for v in cmp.variants:
        head, parts = sentence_parts(cmp, v)
        answer.append(head.rstrip() + ("" if parts else " no primary metric"))
        answer += [f"  - {p}" for p in parts]
    try:
        from rich.console import Console
        from rich.table import Table

        c = Console()
        if not c.is_terminal:  # a log file or CI: no terminal width to fit, 80 wraps the table
            c = Console(width=max(c.width, CONSOLE_LOG_WIDTH))
        t = Table(title=f"{cmp.run_id}: primaries vs {cmp.baseline}")
        for h in ("variant", "metric", "change", "interval", "verdict"):
            t.add_column(h)
        for r in cmp.rows_for(primary=True):
            det = r.kind == "deterministic"
            t.add_row(
                r.variant,
                short_name(r),
                values_txt(r) if det else fmt_change(r.change, r.change_unit),
                exactness(r) if det else fmt_ci(r.low, r.high, r.change_unit),
                verdict_text(r),
            )
        if t.row_count:
            c.print(t)
        if report is not None:
            c.print(f"report: {report}")
        for line in partial_lines(cmp):
            c.print(line, markup=False, highlight=False, soft_wrap=True)
        for line in answer:
            c.print(line, markup=False, highlight=False)
    except ImportError:
        if report is not None:
            print(f"report: {report}")
        for line in partial_lines(cmp):
            print(line)
        for line in answer:
            print(line)
    return sents
