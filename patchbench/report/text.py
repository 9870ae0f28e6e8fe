"""The report's words and numbers, shared by report.md, report-details.md, the PR comment and
the console: verdict marks, values, changes and intervals as text, how many repeats would
decide an inconclusive primary, the answer's sentences and the console summary; the paths of
this machine made portable for what leaves it (:func:`local_paths`)."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from patchbench.analysis import power
from patchbench.analysis.comparison import Comparison, Row
from patchbench.analysis.sequential import DECIDED
from patchbench.config.schema import AB_NAME_PREFIX, uncompiled_text
from patchbench.inputs import REPO_ROOT

VERDICT_MARK = {
    "regressed": "🔴 regressed",
    "improved": "🟢 improved",
    "equivalent": "🔵 equivalent",
    "inconclusive": "⚪ inconclusive",
    "incomplete": "⚪ incomplete",
}


def esc(s: str) -> str:
    """Text safe in a markdown table cell, on one line."""
    return str(s).replace("|", "\\|").replace("\n", " ")


def local_paths(text: str, *, repo: Path = REPO_ROOT, home: str | None = None) -> str:
    """``text`` without this machine's absolute paths, for report.md, report-details.md and the
    PR comment: a path inside ``repo`` (the repository) relative to it (``/repo/results/R`` ->
    ``results/R``), then one under ``home`` (default: the user's, ``~``) from ``~``
    (``/home/me/m`` -> ``~/m``). A root matches only where a path starts, before a ``/``."""
    home = os.path.expanduser("~") if home is None else home
    for root, short in ((str(repo), ""), (home, "~/")):
        if root.startswith("/") and root.rstrip("/"):  # not "/", not an unexpanded "~"
            text = re.sub(rf"(?<![\w.~/-]){re.escape(root.rstrip('/'))}/", short, text)
    return text


def fmt_value(x: float | None) -> str:
    """4 significant digits, thousands grouped; "n/a" for None."""
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def fmt_bounded(x: float | None, bound: str | None) -> str:
    """:func:`fmt_value`, with "≥" / "≤" in front of a lower / upper bound."""
    return {"lower": "≥", "upper": "≤"}.get(bound or "", "") + fmt_value(x)


def shown_value(r: Row, arm: str) -> str:
    """The value of ``arm`` ("baseline" or "variant") a table shows: accuracy in percent
    ("41.3%", so the two differ by the change in points), else :func:`fmt_bounded`."""
    x = r.baseline_value if arm == "baseline" else r.variant_value
    if r.kind == "accuracy" and r.change_unit == "pt" and x is not None:
        return f"{100 * x:.1f}%"
    return fmt_bounded(x, r.baseline_bound if arm == "baseline" else r.variant_bound)


def values_txt(r: Row) -> str:
    """A deterministic or bounded row's two values: "507 -> 90", "507 -> ≥6", the same bound in
    both arms once: "both ≥8"."""
    b, v = shown_value(r, "baseline"), shown_value(r, "variant")
    if b == v and r.baseline_bound and r.baseline_bound == r.variant_bound:
        return f"both {b}"
    return f"{b} -> {v}"


def exactness(r: Row) -> str:
    """How a deterministic row's values are known: "no values", "a bound", "exact"
    (``Row.exact_by``) or "one measurement per arm"."""
    if r.baseline_value is None or r.variant_value is None:
        return "no values"
    if r.baseline_bound or r.variant_bound:
        return "a bound"
    return "exact" if r.exact_by else "one measurement per arm"


def fmt_change(x: float | None, unit: str) -> str:
    """ "+20.1%", "+0.1 pt", "-2 count"; "n/a" for None."""
    if x is None:
        return "n/a"
    if x == 0 or (unit in ("%", "pt") and round(x, 1) == 0):
        x = 0.0  # "+0.0", never "-0.0"
    if unit == "%":
        return f"{x:+.1f}%"
    if unit == "pt":
        return f"{x:+.1f} pt"
    return f"{x:+g}" + (f" {unit}" if unit else "")


def fmt_ci(lo: float | None, hi: float | None, unit: str = "%") -> str:
    """ "[+18.3%, +21.9%]", in points "[-0.9, +1.1]"; "n/a" when absent."""
    if lo is None or hi is None:
        return "n/a"
    if unit == "%":
        return f"[{lo:+.1f}%, {hi:+.1f}%]"
    return f"[{lo:+.1f}, {hi:+.1f}]"


def margin_txt(r: Row) -> str:
    """ "±5%", "±2 pt"; "" without a margin."""
    if r.margin is None:
        return ""
    return f"±{r.margin:g} pt" if r.change_unit == "pt" else f"±{r.margin:g}%"


def verdict_text(r: Row) -> str:
    """The verdict in the words of :data:`VERDICT_MARK`: "improved", "improved, within ±5%",
    "equivalent within ±2 pt", "equivalent" (an equal count), "inconclusive"."""
    if r.verdict in ("improved", "regressed") and r.within_margin:
        return f"{r.verdict}, within {margin_txt(r)}"
    if r.verdict == "equivalent":
        margin = margin_txt(r)  # a count with no margin is equivalent only when exactly equal
        return f"equivalent within {margin}" if margin else "equivalent"
    return r.verdict


# ---------------------------------------------------------------- repeats to decide

#: the power the repeats-to-decide estimate aims at
DECIDE_POWER = 0.8
#: paired repeats beyond which the estimate says only "more than"
DECIDE_CAP = 50
#: questions beyond this multiple of the row's questions: only "more than"
DECIDE_QUESTIONS_CAP = 20


def is_bound(r: Row) -> bool:
    """Whether an arm's value is only a bound (e.g. a load sweep's highest load meeting its SLO
    beyond the sweep's last point): the sweep's range limits it, so more repeats cannot decide
    it."""
    return bool(r.baseline_bound or r.variant_bound)


@dataclass
class Decide:
    """How much data would likely decide an inconclusive row: ``n`` paired repeats or questions
    (``unit``; None: more than ``cap``), ``what`` it would show, ``sd`` the noise used and
    ``pairs`` the data it was measured on, as text."""

    n: int | None
    cap: int
    unit: str
    what: str
    sd: str
    pairs: str


def _fewest(
    sd: float, effect: float, margin: float | None, alpha: float, dist: str, floor: int, cap: int
) -> tuple[int | None, str] | None:
    """(the fewest n, which goal) of two goals, by :func:`patchbench.analysis.power.n_needed` at
    :data:`DECIDE_POWER`: showing ``effect`` (two-sided at ``alpha``) or, when inside
    ``margin``, equivalence by TOST at ``alpha``; (None, the first goal) past ``cap``; None when
    neither can happen (no change seen and no margin)."""
    goals = []
    if effect != 0:
        goals.append(("effect", None))
    if margin is not None and abs(effect) < margin:
        goals.append(("equivalence", margin))
    best: tuple[int | None, str] | None = None
    for what, m in goals:
        n = power.n_needed(
            effect, sd, alpha, DECIDE_POWER, margin=m, dist=dist, floor=floor, cap=cap
        )
        if best is None or (n is not None and (best[0] is None or n < best[0])):
            best = (n, what)
    return best


def repeats_to_decide(r: Row, min_repeats: int) -> Decide | None:
    """How many paired repeats (accuracy: questions) would likely decide an inconclusive
    primary at this run's noise and the level its verdict used (:func:`_fewest`). Run rows: the
    sd of the paired log ratios (2 pairs or more), the t test, at least ``min_repeats``.
    Accuracy rows: the per-question sd the interval implies (half-width x sqrt(questions) / z),
    the z test, in questions. None for other rows, where the noise is unknown and for a bound
    (:func:`is_bound`: more repeats cannot decide it)."""
    if r.verdict != "inconclusive" or not r.primary or r.change is None or r.confidence is None:
        return None
    if is_bound(r) or r.undecided:
        return None
    alpha = 1 - r.confidence
    if r.kind == "run" and r.change_unit == "%" and r.log_ratio_sd is not None:
        effect = math.log1p(r.change / 100)
        margin = math.log1p(r.margin / 100) if r.margin is not None else None
        cap, unit, pairs = DECIDE_CAP, "repeats", f"{r.n_pairs} pairs"
        got = _fewest(r.log_ratio_sd, effect, margin, alpha, "t", min_repeats, cap)
        sd = f"sd of paired log ratios {100 * r.log_ratio_sd:.1f}%"
    elif r.kind == "accuracy" and r.low is not None and r.high is not None and r.n_pairs:
        from scipy import stats as sps

        half = (r.high - r.low) / 2
        sd_q = half * math.sqrt(r.n_pairs) / sps.norm.ppf(1 - alpha / 2)
        cap = DECIDE_QUESTIONS_CAP * r.n_pairs
        got = _fewest(sd_q, r.change, r.margin, alpha, "normal", r.n_pairs, cap)
        unit, sd, pairs = "questions", f"interval ±{half:.1f} pt", f"{r.n_pairs} questions"
    else:
        return None
    if got is None:
        return None
    n, what = got
    what = (
        f"equivalence within {margin_txt(r)}"
        if what == "equivalence"
        else f"the observed {fmt_change(r.change, r.change_unit)}"
    )
    return Decide(n, cap, unit, what, sd, pairs)


def decide_text(d: Decide, *, short: bool = False) -> str:
    """ "about 9 repeats to decide" (``short``), or with what and the noise: "about 9 paired
    repeats would likely decide (80% power to show ...; sd ... over 2 pairs)"; "more than 50
    ..." past the cap."""
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
    """What an inconclusive primary needs to be decided (:func:`decide_text`), or why no
    estimate is given (a run row with fewer than 2 pairs); None for a decided or secondary row."""
    if r.undecided and r.primary:  # what it cannot separate, and the rounds that would
        return r.undecided.split(" (")[0] if short else r.undecided
    d = repeats_to_decide(r, min_repeats)
    if d is not None:
        return decide_text(d, short=short)
    if (
        r.verdict == "inconclusive"
        and r.primary
        and r.kind == "run"
        and r.log_ratio_sd is None
        and not is_bound(r)
    ):
        return (
            "noise unknown"
            if short
            else "repeats to decide: not estimated (the noise needs at least 2 paired repeats)"
        )
    return None


# ---------------------------------------------------------------- the answer


def outlier_text(r: Row) -> str | None:
    """ "outlier repeat: rep2 (descriptive)", or None."""
    if not r.outlier_repeats:
        return None
    reps = ", ".join(f"rep{k}" for k in r.outlier_repeats)
    return f"outlier repeat{'s' if len(r.outlier_repeats) > 1 else ''}: {reps} (descriptive)"


def _why_no_interval(r: Row) -> str:
    """Why a row has no interval, in a few words: its test's repeat count ("2 paired repeats"),
    else the start of its first note."""
    for n in r.notes:
        m = re.match(r"(\d+ paired repeats?|1 repeat|no paired repeats)\b", n)
        if m:
            return m.group(1)
    return (r.notes[0].split(":")[0] if r.notes else "no interval").strip()


def _row_clause(r: Row, decide: str | None = None) -> str:
    """One primary in a few words: a count's two values, else its change and interval (or why
    it has none), then its verdict; ``decide``: what would decide it, in the parentheses."""
    if r.kind == "deterministic":
        return f"{r.short_label()} {values_txt(r)} {verdict_text(r)} ({exactness(r)})"
    change = f"{r.short_label()} {fmt_change(r.change, r.change_unit)}"
    if is_bound(r):
        change = f"{r.short_label()} {values_txt(r)}"
        decide = "a bound: more repeats cannot decide it"
    if r.low is None or r.high is None:  # say why in a few words (the table has the note)
        why = "; ".join(x for x in (_why_no_interval(r), decide) if x)
        return f"{change} {verdict_text(r)} ({why})"
    ci = fmt_ci(r.low, r.high, r.change_unit)
    return f"{change} {ci} {verdict_text(r)}" + (f" ({decide})" if decide else "")


def identity_counts(cmp: Comparison, variant: str) -> list[tuple[str, int, int]]:
    """(suite, identical, n) of each suite whose pair holds an output-identity count for
    ``variant``: summed over its points where it has them (``pairs[suite][variant]["points"]
    [key]["identity"]``: a sweep's loads, the traffic suite's workloads), else its one
    ``identity`` (ints ``n`` and ``identical``); [] without one."""
    out = []
    for suite, per in cmp.pairs.items():
        pair = per.get(variant)
        if not isinstance(pair, dict):
            continue
        points = pair.get("points")
        found = [p.get("identity") for p in points.values()] if isinstance(points, dict) else []
        found = [x for x in found or [pair.get("identity")] if isinstance(x, dict) and x.get("n")]
        if found:
            same = sum(int(x.get("identical", 0)) for x in found)
            out.append((suite, same, sum(int(x["n"]) for x in found)))
    return out


def identity_text(counts: list[tuple[str, int, int]]) -> str:
    """ "48/48" for one suite's count, "serving 48/48, traffic 16/16" for several."""
    if len(counts) == 1:
        return f"{counts[0][1]}/{counts[0][2]}"
    return ", ".join(f"{suite} {same}/{n}" for suite, same, n in counts)


def identity_clauses(cmp: Comparison, variant: str) -> list[str]:
    """ "outputs identical 48/48" (one suite) or "outputs identical: serving 48/48, traffic
    16/16" (:func:`identity_counts`); [] without one."""
    counts = identity_counts(cmp, variant)
    if not counts:
        return []
    return [f"outputs identical{':' if len(counts) > 1 else ''} {identity_text(counts)}"]


def run_minutes(cmp: Comparison, repeats: int) -> float | None:
    """Minutes a run of this config with ``repeats`` timed rounds would take on this host, from
    this run's cell times (``cells[*]["seconds"]``): ``repeats`` x the sum over the arms of each
    arm's mean ok timed cell, plus the correctness cells once. None when an arm has no timed
    cell time."""
    rnd = 0.0
    for v in [cmp.baseline, *cmp.variants]:
        xs = [
            c["seconds"]
            for c in cmp.cells
            if c["variant"] == v and c["status"] == "ok" and c.get("seconds") is not None
        ]
        if not xs:
            return None
        rnd += sum(xs) / len(xs)
    once = sum(c.get("seconds") or 0.0 for c in cmp.correctness_cells)
    return (repeats * rnd + once) / 60


def round_minutes(cmp: Comparison) -> float | None:
    """Minutes one timed round (every arm once) took on this host: the sum over the arms of each
    arm's mean ok timed cell time (:func:`run_minutes` without the correctness cells); None
    when an arm has none."""
    once = sum(c.get("seconds") or 0.0 for c in cmp.correctness_cells) / 60
    total = run_minutes(cmp, 1)
    return None if total is None else total - once


def stopped_early(cmp: Comparison) -> str | None:
    """ "stopped after 6 of 12 rounds: output throughput, median ITL decided; saved about 40
    minutes" when the sequential rule stopped before its last look (the deciding primaries of
    ``design.decide_on``, else every primary; the minutes: the rounds not run x
    :func:`round_minutes`); None otherwise."""
    d = cmp.design
    if d.kind != "sequential" or d.partial or not d.looks or d.stopped_after is None:
        return None
    k, most = d.stopped_after, d.looks[-1]
    if k >= most:
        return None
    what = ", ".join(x.split(".", 1)[-1] for x in d.decide_on) or "every primary"
    named = set(d.decide_on)
    deciding = [
        r
        for r in cmp.rows
        if r.primary
        and r.kind == "run"
        and r.variant not in cmp.aa_variants
        and (not named or f"{r.suite}.{r.metric}" in named)
    ]
    futile = sum(1 for r in deciding if r.verdict == "inconclusive")
    text = f"stopped after {k} of {most} rounds: {what} decided" + (
        f" or futile ({futile} inconclusive: unlikely to be decided by round {most})"
        if futile
        else ""
    )
    mins = round_minutes(cmp)
    if mins is not None:
        text += f"; saved about {(most - k) * mins:.0f} minutes"
    return text


def _noise_txt(rows: list[Row]) -> str:
    """ "run-to-run noise ±33% on this host": the median, over ``rows``, of the sd of their paired
    log ratios (percent of the log scale); "noise unknown" without one."""
    sds = sorted(100 * r.log_ratio_sd for r in rows if r.log_ratio_sd is not None)
    if not sds:
        return "run-to-run noise unknown (it needs 2 paired repeats)"
    mid = (sds[(len(sds) - 1) // 2] + sds[len(sds) // 2]) / 2
    return f"run-to-run noise ±{mid:.2g}% on this host"


#: a CPU run's GPU step: an ab run repeats its command with the H200 preset (it needs the
#: command's own --git/--range or --patch); a config run runs the PR's H200 config
GPU_AB = "on a GPU (your ab command again with `--preset pr-h200`)"
GPU_CONFIG = "on a GPU (an H200 config: `make bench` runs configs/pr9460-h200.yaml)"


def to_decide(cmp: Comparison, rows: list[Row]) -> str | None:
    """What would decide the undecided run-level primaries ``rows`` (no bound among them): a new
    run of the config with ``schedule.repeats: M`` (M: the most :func:`repeats_to_decide` any
    of them needs within :data:`DECIDE_CAP`; the noise unknown: ``compare.min_repeats``), its
    minutes here (:func:`run_minutes`), how many need more than the cap; on a CPU run, a GPU.
    None when nothing is estimated on a GPU run."""
    need = [d for d in (repeats_to_decide(r, cmp.settings.min_repeats) for r in rows) if d]
    finite = [d.n for d in need if d.n is not None]
    beyond = len(need) - len(finite)
    m = max(finite) if finite else None
    if not need and all(r.log_ratio_sd is None for r in rows):
        m = cmp.settings.min_repeats  # no noise known: at least the repeats a verdict needs
    parts = []
    if m is not None:
        mins = run_minutes(cmp, m)
        more = [f"about {mins:.0f} minutes here, from this run's cell times"] if mins else []
        if beyond:
            more.append(
                f"that decides {len(finite)} of the {len(rows)} undecided; the other {beyond} "
                f"need more than {DECIDE_CAP} repeats"
            )
        # an ab run's config is built in memory (AB_NAME_PREFIX): its user reruns ab
        again = (
            f"run the ab command again with --repeats {m}"
            if cmp.run.name.startswith(AB_NAME_PREFIX)
            else f"run config {cmp.run.name or cmp.run_id} again with schedule.repeats: {m}"
        )
        parts.append(again + (f" ({'; '.join(more)})" if more else ""))
    elif beyond:
        parts.append(f"more than {DECIDE_CAP} repeats here")
    if cmp.run.gpu is None:
        parts.append(GPU_AB if cmp.run.name.startswith(AB_NAME_PREFIX) else GPU_CONFIG)
    return "to decide: " + " or ".join(parts) if parts else None


@dataclass
class Answer:
    """One variant's answer: ``head`` ``"<variant> vs <baseline>: "``, its ``clauses`` in order
    (the first ``identity`` of them its output-identity clauses) and ``unstated``: the primaries
    no clause gives figures for (summed up in the "speed: not decidable here" clause)."""

    head: str
    clauses: list[str]
    identity: list[str]
    unstated: list[Row]
    decided: int = 0  # how many clauses lead: identity, what was left out, the decided rows


def left_out_clause(cmp: Comparison, variant: str) -> str | None:
    """What ``variant``'s git range left out of the run (compiled code no build here compiles,
    ``ab --allow-uncompiled``), as one clause (patchbench.config.uncompiled_text); None when
    nothing was."""
    info = cmp.run.variants.get(variant)
    b = info.built if info is not None else None
    u = b.changes.uncompiled if b is not None and b.changes is not None else None
    return uncompiled_text(u.count, u.files) if u is not None and u.count else None


def answer(cmp: Comparison, variant: str) -> Answer:
    """The answer for ``variant``: output identity first, then what its range left out of the
    run (:func:`left_out_clause`), accuracy, the decided primaries, then what is undecided:
    run-level primaries with fewer paired repeats than a verdict needs as one "not decidable
    here" clause with the run's noise, the others each with their interval, then what would
    decide them (:func:`to_decide`) and each pairing refusal."""
    ident = identity_clauses(cmp, variant)
    first, decided, undecided, speed, open_ = list(ident), [], [], [], []
    acc_open: list[str] = []  # undecided accuracy rows, in row order, ahead of the other undecided
    left = left_out_clause(cmp, variant)
    first += [left] if left else []
    min_n = cmp.settings.min_repeats
    for r in cmp.rows_for(variant, primary=True):
        run = r.kind == "run" and not is_bound(r) and r.verdict == "inconclusive"
        if run and r.n_pairs < min_n:
            speed.append(r)
            open_.append(r)
        elif r.kind == "accuracy":  # the decided first, an undecided one after them
            clause = _row_clause(r, decide_note(r, min_n, short=True))
            if r.verdict in DECIDED:
                first.append(clause)
            else:
                acc_open.append(clause)
        elif r.verdict in DECIDED:
            decided.append(_row_clause(r))
        else:
            undecided.append(_row_clause(r))
            open_ += [r] if run else []
    undecided[:0] = acc_open
    if speed:
        n = max(r.n_pairs for r in speed)
        undecided.append(
            f"speed: not decidable here ({n} paired repeat{'s' if n != 1 else ''}, fewer than "
            f"the {min_n} a verdict needs; {_noise_txt(speed)})"
        )
    decide = to_decide(cmp, open_) if open_ else None
    undecided += [decide] if decide else []
    early = stopped_early(cmp) if variant not in cmp.aa_variants else None
    undecided += [early] if early else []
    for suite, per in cmp.refusals.items():
        if variant in per:
            undecided.append(f"{suite} not paired: {per[variant]}")
    tag = " (A/A)" if variant in cmp.aa_variants else ""
    return Answer(
        f"{variant}{tag} vs {cmp.baseline}: ",
        first + decided + undecided,
        ident,
        speed,
        len(first) + len(decided),
    )


def sentence_parts(cmp: Comparison, variant: str) -> tuple[str, list[str]]:
    """(``"<variant> vs <baseline>: "``, the clauses of its answer in order): :func:`answer`."""
    a = answer(cmp, variant)
    return a.head, a.clauses


def sentence(cmp: Comparison, variant: str) -> str:
    """The answer for ``variant``, one line (:func:`sentence_parts`, clauses joined by "; ")."""
    head, parts = sentence_parts(cmp, variant)
    return head + ("; ".join(parts) if parts else "no primary metric")


def build_names(cmp: Comparison) -> list[str]:
    """One line per arm built from git, the baseline first: ``B = 8af4974fdfbe "its subject"``,
    then ``; changes from A: 2 files: ...`` for a range (the console and the PR comment); []
    when no arm is."""
    out = []
    for v in [cmp.baseline] + cmp.variants:
        info = cmp.run.variants.get(v)
        b = info.built if info is not None else None
        name = b.name() if b is not None else None
        if b is None or name is None:
            continue
        more = f"; changes from {cmp.baseline}: {b.changes.describe()}" if b.changes else ""
        out.append(f"{v} = {name}{more}")
    return out


def partial_lines(cmp: Comparison) -> list[str]:
    """What a partial run says: that it is partial and the command that resumes it ([] for a
    finished run)."""
    d = cmp.design
    if d.partial is None:
        return []
    return [f"Partial run: {d.partial}; no primary verdict is decisive."] + (
        [f"Resume with: {d.resume}"] if d.resume else []
    )


def host_text(cmp: Comparison, *, gpu: bool = True) -> str | None:
    """The host in one line: "2 CPUs, 7.7 GiB, no GPU; 1-minute load average 1.2-6.8 (timed
    cells, start and end)" (``gpu``: name the GPU too); None when the comparison knows nothing
    of its host."""
    h = cmp.run.host
    loads = h.readings() if h is not None else []
    if h is None or (h.cpu_count is None and h.memory_total_gib is None and not loads):
        return None
    parts = []
    if h.cpu_count is not None:
        usable = h.cpu_usable is not None and h.cpu_usable != h.cpu_count
        parts.append(f"{h.cpu_count} CPUs" + (f" ({h.cpu_usable} usable)" if usable else ""))
    if h.memory_total_gib is not None:
        parts.append(f"{h.memory_total_gib:g} GiB")
    if gpu:
        parts.append(cmp.run.gpu or "no GPU")
    load = (
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} (timed cells, start and end)"
        if loads
        else "load average not recorded"
    )
    return ", ".join(parts) + "; " + load


def host_warnings(cmp: Comparison) -> list[str]:
    """ "Warning (host): ..." per warning of the comparison's host (patchbench.analysis.hostload),
    then "Warning (GPU): ..." per difference of the timed cells' GPUs (``gpu_warnings``), then
    "Warning (server): ..." per warning of the arms' server fingerprints
    (patchbench.analysis.fingerprints)."""
    h, srv = cmp.run.host, cmp.server
    return (
        [f"Warning (host): {w}." for w in (h.warnings if h is not None else [])]
        + [f"Warning (GPU): {w}." for w in (h.gpu_warnings if h is not None else [])]
        + [f"Warning (server): {w}." for w in (srv.warnings if srv is not None else [])]
    )


#: the console's width when stdout is not a terminal (rich would use 80)
CONSOLE_LOG_WIDTH = 120


def console_summary(cmp: Comparison, report: Path | None = None) -> list[str]:
    """Print the primaries table (rich), the report's path, a partial run's resume command, the
    host and its warnings, then the answer: one line per variant (:func:`sentence`), printed
    once; returns them."""
    sents = [sentence(cmp, v) for v in cmp.variants]
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
            r.short_label(),
            values_txt(r) if det or is_bound(r) else fmt_change(r.change, r.change_unit),
            exactness(r) if det else fmt_ci(r.low, r.high, r.change_unit),
            verdict_text(r),
        )
    if t.row_count:
        c.print(t)
    if report is not None:
        c.print(f"report: {report}")
    for line in build_names(cmp):
        c.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in partial_lines(cmp):
        c.print(line, markup=False, highlight=False, soft_wrap=True)
    host = host_text(cmp)
    for line in ([f"host: {host}"] if host else []) + host_warnings(cmp):
        c.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in sents:
        c.print(line, markup=False, highlight=False, soft_wrap=True)
    return sents
