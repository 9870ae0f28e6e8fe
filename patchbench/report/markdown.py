"""report.md and report-details.md, each section rendered from the typed comparison alone, and
:func:`render_run` (compare.json, plots and both files of a run folder).

report.md, what a reviewer reads in order: the answer (one line per variant: what the run can
and cannot decide), the header (what ran), the primaries table at the level each verdict used,
failed cells, A/A noise, drift and cell warnings, the GPU and server-log blocks, each suite's
``report_section``, the PR figure, a link to the details, the Methods with their sources and the
notes. report-details.md: each primary per repeat, each suite's ``report_block`` (Before /
After), the secondary metrics and the other plots.
"""

from __future__ import annotations

import re
from pathlib import Path

from patchbench import records
from patchbench.analysis.comparison import Comparison, Row
from patchbench.analysis.fingerprints import COUNTER_TOLERANCE, HIT_SHARE_POINTS
from patchbench.config import changes_text, uncommitted_text, uncompiled_text
from patchbench.report.text import (
    DECIDE_CAP,
    DECIDE_POWER,
    VERDICT_MARK,
    decide_note,
    esc,
    exactness,
    fmt_change,
    fmt_ci,
    fmt_value,
    host_text,
    host_warnings,
    local_paths,
    margin_txt,
    outlier_text,
    partial_lines,
    sentence,
    shown_value,
)
from patchbench.suite import get_suite

#: the second file of a report: what a reviewer looks up, not what they read first
DETAILS_NAME = "report-details.md"
#: the plot report.md shows; the others are in the details file
PR_FIGURE_STEM = "pr_figure"
#: a PR block longer than this many lines is folded
FOLD_LINES = 15


def _header(cmp: Comparison) -> list[str]:
    run = cmp.run
    acc = any(r.metric.endswith("_acc") for r in cmp.rows)
    tiny = (
        " (tiny random weights: accuracy near 0 is expected; this run shows the pipeline)"
        if acc
        else " (tiny random weights: this run shows the pipeline, not a model's speed)"
    )
    lines = [
        "## What ran",
        "",
        "| | |",
        "|---|---|",
        f"| run | `{cmp.run_id}` |",
        f"| model | `{run.model}`{tiny if run.tiny else ''} |",
        _sglang_row(cmp),
    ]
    for v in [cmp.baseline] + cmp.variants:
        info = run.variants.get(v)
        if info is None:
            continue
        src = _source_cell(cmp, v)
        patches = ", ".join(f"`{p.name}` ({(p.sha256 or '?')[:12]})" for p in info.patches)
        desc = src + (patches or ("no patches" if info.from_source else "stock"))
        if info.server_args:
            desc += "; server args " + " ".join(f"`{a}`" for a in info.server_args)
        if info.env:
            desc += "; env " + " ".join(f"`{k}={val}`" for k, val in info.env.items())
        if info.build is not None and src:
            # a git build: its commit and changes lead the cell, its version is the sglang row;
            # only the environment is left to say (the checkout's path stays on this machine)
            env = re.search(r" on (\S+) \(sglang", info.build)
            desc += f"; environment `{esc(env.group(1))}`" if env else ""
        elif info.build is not None:
            desc += f"; build {esc(info.build)}"
        tag = " (baseline)" if v == cmp.baseline else (" (A/A)" if v in cmp.aa_variants else "")
        lines.append(f"| variant `{v}`{tag} | {desc} |")
    lines += _uncommitted_rows(cmp)
    host = host_text(cmp, gpu=False)
    lines += [f"| host | {esc(host)} |"] if host else []
    lines += [
        f"| GPU | {run.gpu or 'none (CPU engine)'} |",
        f"| patchbench commit | `{run.commit}` |",
        f"| schedule | {cmp.repeats} timed repeat(s), {cmp.order} |",
    ]
    d = cmp.design
    if d.kind == "sequential":
        most = f" of at most {d.looks[-1]}" if d.looks else ""
        why = d.stop_reason if d.partial is None else f"partial: {d.partial}"
        lines.append(f"| sequential | {d.stopped_after or d.rounds}{most} repeats; {why} |")
    words = {"correctness": "correctness cells only", "first": "first round only"}
    suites = []
    for x in cmp.suites:
        r = cmp.suite_rounds.get(x, "all")
        if r == "all":
            suites.append(x)
            continue
        rounds = "rounds " + ", ".join(map(str, r)) if isinstance(r, list) else words.get(r, r)
        suites.append(f"{x} ({rounds})")
    corr = [c["dir"] for c in cmp.correctness_cells]
    inst = [f"{c['variant']}/rep{c['repeat']}" for c in cmp.cells if c.get("instrumented")]
    lines += [
        f"| suites | {', '.join(suites) or 'none'} |",
        "| timed cells | no instrumentation, no profiler |",
        f"| untimed correctness cells | {', '.join(corr) if corr else 'none'} |",
    ]
    if inst:
        lines.append(f"| instrumented timed cells (old run) | {', '.join(inst)} |")
    if run.started_at:
        lines.append(f"| time | {run.started_at} to {run.ended_at or '(unfinished)'} |")
    return lines + [""]


def _sglang_row(cmp: Comparison) -> str:
    """The header's sglang row: the run's release, or each arm's version as built when the
    manifest records builds (and the environments' releases where a source build's differs)."""
    run = cmp.run
    built = {v: run.variants[v].built for v in [cmp.baseline] + cmp.variants if v in run.variants}
    built = {v: b for v, b in built.items() if b is not None}
    if not built:
        return f"| sglang | `{run.sglang}` |"
    arms = ", ".join(f"`{v}` `{b.version or '?'}`" for v, b in built.items())
    if all(b.version == b.release for b in built.values()):  # releases, each in its own
        return f"| sglang | {arms} |"
    envs = list(dict.fromkeys(b.release or "?" for b in built.values()))
    envs_txt = ", ".join(f"`{e}`" for e in envs)
    return f"| sglang | as built: {arms} (over an environment whose own sglang is {envs_txt}) |"


def _uncommitted_rows(cmp: Comparison) -> list[str]:
    """One header row per distinct set of uncommitted edits the arms' checkouts had (a git
    build's ``uncommitted``; patchbench.config.uncommitted_text), naming the arms; [] when none
    had any."""
    seen: dict[tuple, list[str]] = {}
    for v in [cmp.baseline] + cmp.variants:
        info = cmp.run.variants.get(v)
        u = info.built.uncommitted if info is not None and info.built is not None else None
        if u is not None and u.count:
            seen.setdefault((u.count, tuple(u.files)), []).append(v)
    return [
        f"| uncommitted edits | {', '.join(f'`{v}`' for v in arms)}: "
        f"{esc(uncommitted_text(n, list(files)))} |"
        for (n, files), arms in seen.items()
    ]


def _source_cell(cmp: Comparison, variant: str) -> str:
    """A git build's name, the files its range changes and what it left out, as the start of
    its header cell ("" for any other arm)."""
    b = cmp.run.variants[variant].built
    name = b.name() if b is not None else None
    if b is None or name is None:
        return ""
    out = esc(name) + "; "
    if b.changes is not None:
        c = b.changes
        files = changes_text(c.count, [f"`{esc(f)}`" for f in c.files], c.outside)
        out += f"changes from `{cmp.baseline}`: {files}; "
        if c.uncompiled is not None and c.uncompiled.count:
            out += esc(uncompiled_text(c.uncompiled.count, c.uncompiled.files)) + "; "
    return out


def _answer(cmp: Comparison) -> list[str]:
    lines = ["## Answer", ""]
    partial = partial_lines(cmp)
    if partial:
        lines += [f"**{partial[0]}**"] + [f"`{x.split(': ', 1)[1]}`" for x in partial[1:]] + [""]
    warn = host_warnings(cmp)
    if warn:
        lines += [f"**{w}**" for w in warn] + [""]
    return lines + [f"- {sentence(cmp, v)}" for v in cmp.variants] + [""]


def _primaries(cmp: Comparison) -> list[str]:
    rows = cmp.rows_for(primary=True)
    if not rows:
        return ["## Primary metrics", "", "(no suite of this run declares primary metrics)", ""]
    d = cmp.design
    fam = 100 * (1 - d.alpha)
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
    if any(r.kind == "deterministic" for r in rows):
        intro += " Deterministic counts are compared exactly, outside the family."
    lines = [
        "## Primary metrics",
        "",
        intro + " Baseline and variant are the geometric means of the paired repeats, "
        "so their ratio is the change (accuracy: the mean over the paired questions; counts: the "
        "value).",
        "",
        "| variant | metric | baseline | variant | change | interval | level | verdict | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        level = f"{100 * r.confidence:.2f}%" if r.confidence else exactness(r)
        extra = [outlier_text(r), decide_note(r, cmp.settings.min_repeats)]
        notes = list(r.notes) + [x for x in extra if x]
        lines.append(
            f"| {r.variant} | {esc(r.name())} | {shown_value(r, 'baseline')} | "
            f"{shown_value(r, 'variant')} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {level} | "
            f"{VERDICT_MARK.get(r.verdict, r.verdict)}"
            f"{', within ' + margin_txt(r) if r.within_margin else ''} | "
            f"{esc('; '.join(notes))} |"
        )
    return lines + [""]


def _failures(cmp: Comparison) -> list[str]:
    """The failed and incomplete cells with their reasons, then the primaries they affect."""
    if not cmp.failed_cells:
        return []
    lines = ["## Failed and incomplete cells", "", "| cell | status | reason |", "|---|---|---|"]
    lines += [f"| {c.cell} | {c.status} | {esc(c.reason)} |" for c in cmp.failed_cells] + [""]
    affected = {
        f"- `{a.variant}` {a.suite} {a.metric}: incomplete{': no value' if a.no_value else ''} "
        f"(cells {', '.join(a.cells)})"
        for a in cmp.affected
    }
    if affected:
        lines += ["Primary metrics these cells affect:", ""] + sorted(affected) + [""]
    return lines


def _health(cmp: Comparison) -> list[str]:
    """The A/A noise, the baseline's drift and the cell warnings."""
    lines = []
    if cmp.aa_variants:
        lines += [
            "## A/A noise",
            "",
            "A/A variants are measurements of the noise between identical arms; they change no "
            "verdict.",
            "",
        ]
        for n in cmp.health.noise:
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
            lines.append(f"- {txt}")
        lines += [f"- {esc(x)}" for x in cmp.health.notes] + [""]
    found = [d for d in cmp.drift if d.found]
    if found:
        lines += ["## Drift", ""]
        for d in found:
            lines.append(
                f"- {d.suite} / {(d.label or d.metric).rstrip(':').strip()}: the baseline drifts "
                f"{d.slope_pct:+.2f}%/round (95% interval {d.low_pct:+.2f} to "
                f"{d.high_pct:+.2f}, p = {d.p:.2g}, {d.n} rounds)"
                + (
                    "; under this unbalanced schedule its verdicts are inconclusive"
                    if cmp.order == "sequential"
                    else f"; the {cmp.order} schedule balances it across the arms"
                )
            )
        lines.append("")
    warn = [(s, v, w) for s, per in cmp.cell_warnings.items() for v, ws in per.items() for w in ws]
    if warn:
        lines += ["<details><summary>cell warnings</summary>", ""]
        lines += [f"- {s} / {v}: {esc(w)}" for s, v, w in warn] + ["", "</details>", ""]
    return lines


def _gpu(cmp: Comparison) -> list[str]:
    """The cells whose GPU was throttled or shared (each cell's ``gpu`` flags), then how the
    timed cells' GPUs differ (``run.host.gpu_warnings``); nothing when no cell was sampled."""
    sampled = [c for c in cmp.cells if c.get("gpu") is not None]
    flagged = [c for c in sampled if c["gpu"]]
    if not sampled:
        return []
    h = cmp.run.host
    differ = [f"**{esc(w[0].upper() + w[1:])}.**" for w in (h.gpu_warnings if h else [])]
    if not flagged:
        n = len(sampled)
        lines = ["## GPU", "", f"no throttling and no foreign process in the {n} sampled cell(s)"]
        return lines + [x for d in differ for x in ("", d)] + [""]
    lines = [
        "## GPU",
        "",
        f"**{len(flagged)} of {len(sampled)} sampled cell(s) ran on a throttled or "
        "shared GPU**; their timings are biased (compare them with the other repeats):",
        "",
    ]
    lines += [f"- {c['variant']}/rep{c['repeat']}: {esc('; '.join(c['gpu']))}" for c in flagged]
    return lines + [""] + [x for d in differ for x in (d, "")]


def _server_log(cmp: Comparison) -> list[str]:
    """Per suite, the cells where the server logged retractions or out-of-memory events."""
    lines = []
    for suite in cmp.suites:
        for c in cmp.cells:
            e = (c.get("server_log") or {}).get(suite)
            if e is None:
                continue
            lines.append(
                f"- {suite} / {c['variant']}/rep{c['repeat']}: {e['retractions']} "
                f"retraction(s) of {e['retracted_requests']} request(s), "
                f"{e['oom']} out-of-memory event(s)"
                + (f" (first: {esc(e['first'])})" if e["first"] else "")
            )
    if not lines:
        return []
    head = (
        "retractions and out-of-memory events the server logged while a "
        "suite ran; they change what that suite measured in that cell:"
    )
    return ["## Server log", "", head, ""] + lines + [""]


def _suite_sections(cmp: Comparison, notes: list[str]) -> list[str]:
    lines = []
    for suite in cmp.suites:
        for v, why in (cmp.refusals.get(suite) or {}).items():
            lines += [f"**{suite} / {v}: not paired** - {esc(why)}", ""]
        try:
            obj = get_suite(suite)
        except Exception:  # noqa: BLE001 - an unknown suite, or one failing to import: no section
            continue
        try:
            lines += list(obj.report_section(cmp) or [])
        except Exception as e:  # noqa: BLE001 - a section must never cost the report
            notes.append(f"{suite} report_section failed: {type(e).__name__}: {e}")
    return lines


def _methods(cmp: Comparison) -> list[str]:
    from patchbench.analysis.build import OUTLIER_RULE

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
        f"(whichever needs fewer); capped at {DECIDE_CAP}; never for a bound (more repeats "
        "cannot move it). Accuracy: in questions, sd from the interval (normal).",
        "- The answer: output identity and accuracy first, then the decided primaries, then "
        "what is undecided; run-level primaries with fewer paired repeats than a verdict needs "
        "are one clause with the run-to-run noise (the median of their sd of paired log ratios); "
        "to decide: the most repeats any undecided run-level primary needs, and the minutes a "
        "run with that many would take here (each arm's mean timed cell per round, plus the "
        "correctness cells).",
    ]
    if cmp.order == "sequential":
        lines.append(
            "- Schedule: unbalanced (order: sequential, the same order every round): "
            + esc(cmp.unbalanced_reason or "no reason recorded")
        )
    elif cmp.order == "randomized":
        lines.append(
            "- Schedule: each round's order drawn from the seed in the manifest's config, every "
            "variant once in every position of each block of as many rounds as variants."
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


def _plot_lines(plots: list[Path]) -> list[str]:
    return [line for p in plots for line in (f"![{p.stem}]({p.as_posix()})", "")]


def render_markdown(
    cmp: Comparison,
    plots: list[Path] | None = None,
    notes: list[str] | None = None,
    *,
    details: str | None = None,
) -> str:
    """The report.md text of a comparison. ``plots``: the plot paths (relative to the run
    folder); ``notes``: extra notes; ``details``: the details file's text, whose sections the
    link to it lists (None: what the comparison would give it). This machine's paths are made
    portable (:func:`patchbench.report.text.local_paths`)."""
    notes = list(notes or [])
    plots = list(plots or [])
    pr_fig = [p for p in plots if p.stem == PR_FIGURE_STEM]
    lines = (
        [f"# patchbench: {cmp.run.name}", ""]
        + _answer(cmp)
        + _header(cmp)
        + _primaries(cmp)
        + _failures(cmp)
        + _health(cmp)
    )
    lines += _gpu(cmp) + _server_log(cmp) + _suite_sections(cmp, notes)
    if pr_fig:
        lines += ["## Plots", ""] + _plot_lines(pr_fig)
    has = {
        "each primary's values per repeat": "## Primary metrics per repeat",
        "each suite's PR-style blocks (Before / After)": "### Before (",
        "the secondary metrics": "## Secondary metrics",
    }
    what = [w for w, head in has.items() if details is None or head in details]
    if details is None and not cmp.rows_for(primary=False):
        what.remove("the secondary metrics")
    more = len(plots) - len(pr_fig)
    if more:
        what.append(f"{more} more plot{'s' if more > 1 else ''}")
    if what:
        link = f"[{DETAILS_NAME}]({DETAILS_NAME}): " + ", ".join(what) + "."
        lines += ["## Details", "", link, ""]
    lines += _methods(cmp)
    all_notes = list(cmp.notes) + notes
    if all_notes:
        lines += ["## Notes", ""] + [f"- {esc(n)}" for n in all_notes] + [""]
    return local_paths("\n".join(lines).rstrip() + "\n")


# ---------------------------------------------------------------- report-details.md


def _pr_blocks(cmp: Comparison, run_dir: Path, notes: list[str]) -> list[str]:
    """Each suite's ``report_block`` of the first ok repeat of the baseline (Before) and of
    each non-A/A variant (After)."""
    lines = []
    after = [v for v in cmp.variants if v not in cmp.aa_variants] or cmp.variants
    for suite in cmp.suites:
        try:
            obj = get_suite(suite)
        except Exception:  # noqa: BLE001 - an unknown suite, or one that fails to import: no block
            continue
        sec = []
        for label, v in [("Before", cmp.baseline)] + [("After", x) for x in after]:
            ok = [
                c
                for c in cmp.cells
                if c["variant"] == v and (c.get("suites") or {}).get(suite) == "ok"
            ]
            if not ok:
                continue
            k = ok[0]["repeat"]
            try:
                blk = obj.report_block(run_dir / v / f"rep{k}" / suite)
            except Exception as e:  # noqa: BLE001
                notes.append(f"{suite} report_block of {v}/rep{k} failed: {type(e).__name__}: {e}")
                continue
            if blk:
                body = f"```\n{blk.rstrip()}\n```"
                if blk.count("\n") + 1 > FOLD_LINES:
                    body = f"<details><summary>{suite}: {label} ({v})</summary>\n\n{body}\n\n</details>"
                sec += [f"### {label} ({v}, rep{k})", "", body, ""]
        if sec:
            lines += [f"## {suite}: PR blocks", ""] + sec
    return lines


def _secondary(cmp: Comparison) -> list[str]:
    """Every non-primary row: values, change, raw interval, method; no coloured verdicts; one
    table per suite, in the run's suite order, so a suite's rows (the traffic workloads, say) are
    found by their heading."""
    rows = cmp.rows_for(primary=False)
    if not rows:
        return []
    lines = [
        "## Secondary metrics",
        "",
        f"Exploratory: raw {100 * cmp.settings.confidence:g}% intervals, no multiplicity "
        "correction, not verdicts.",
        "",
    ]
    order = [s for s in cmp.suites if any(r.suite == s for r in rows)]
    order += sorted({r.suite for r in rows} - set(order))
    for suite in order:
        mine = [r for r in rows if r.suite == suite]
        lines += [f"### {suite} ({len(mine)} row{'s' if len(mine) != 1 else ''})", ""]
        lines += _secondary_table(mine) + [""]
    return lines


def _secondary_table(rows: list[Row]) -> list[str]:
    lines = [
        "| variant | metric | baseline | variant | change | interval | method | notes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r.descriptive
        desc = (
            f"request-level (descriptive only): {fmt_ci(d.get('low_pct'), d.get('high_pct'))}; "
            if d
            else ""
        )
        lines.append(
            f"| {r.variant} | `{r.metric}` | {shown_value(r, 'baseline')} | "
            f"{shown_value(r, 'variant')} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {esc(r.method or '')} | "
            f"{esc(desc + '; '.join(r.notes))} |"
        )
    return lines


def _repeat_cell(r: Row, i: int, k: int) -> str:
    """One repeat: "466.9 -> 420.7 (-9.9%)" (accuracy "41.3% -> 42.9%"), an outlier in bold,
    "-" where an arm has no value."""
    b = r.baseline_repeats[i] if i < len(r.baseline_repeats) else None
    v = r.variant_repeats[i] if i < len(r.variant_repeats) else None

    def one(x: float | None) -> str:
        if x is None:
            return "-"
        return f"{100 * x:.1f}%" if r.kind == "accuracy" else fmt_value(x)

    txt = f"{one(b)} -> {one(v)}"
    if b is not None and v is not None and r.kind == "run" and r.change_unit == "%" and b > 0:
        txt += f" ({fmt_change(100 * (v / b - 1), '%')})"
    return f"**{txt} outlier**" if k in r.outlier_repeats else txt


def _per_repeat(cmp: Comparison) -> list[str]:
    """Each primary's baseline -> variant in every timed round its suite ran."""
    rows = [r for r in cmp.rows_for(primary=True) if r.baseline_repeats or r.variant_repeats]
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
        heads = ["correctness cell"] * n if rounds == "correctness" else [f"rep{k}" for k in ks]
        lines += [
            f"| variant | {suite} metric | " + " | ".join(heads) + " |",
            "|---|---|" + "---|" * n,
        ]
        lines += [
            f"| {r.variant} | {esc(r.short_label())} | "
            + " | ".join(_repeat_cell(r, i, k) for i, k in enumerate(ks))
            + " |"
            for r in rs
        ]
        lines.append("")
    return lines


def _server_metrics(cmp: Comparison) -> list[str]:
    """The arms' server fingerprints: each suite's hit rate per arm, then what differs beyond
    the tolerances (patchbench.analysis.fingerprints)."""
    srv = cmp.server
    if srv is None:
        return []
    arms = [cmp.baseline, *cmp.variants]
    lines = [
        "## Server metrics",
        "",
        "The server's own `/metrics`, scraped before and after each timed suite: the "
        "prefix-cache hit rate (cached / prompt tokens of the counters' increases; mean over "
        "the cells) per arm.",
        "",
        "| suite | " + " | ".join(esc(a) for a in arms) + " |",
        "|---" * (len(arms) + 1) + "|",
    ]
    for suite, per in srv.hit_share.items():
        vals = [per.get(a) for a in arms]
        lines.append(
            f"| {suite} | "
            + " | ".join("n/a" if x is None else f"{100 * x:.1f}%" for x in vals)
            + " |"
        )
    found = srv.warnings + srv.differences
    lines += (
        [""] + [f"- {esc(d)}" for d in found]
        if found
        else [
            "",
            f"No difference between the arms' fingerprints beyond the tolerances (hit rate "
            f"{HIT_SHARE_POINTS:g} points, counters {100 * COUNTER_TOLERANCE:g}%) and no "
            "difference in the servers' configuration.",
        ]
    )
    return lines + [""]


def render_details(
    cmp: Comparison, run_dir: Path, plots: list[Path] | None = None, notes: list[str] | None = None
) -> str:
    """The report-details.md text (``plots`` relative to ``run_dir``, whose cells the suites'
    ``report_block`` hooks read). A ``report_block`` that fails adds a line to ``notes``. This
    machine's paths are made portable (:func:`patchbench.report.text.local_paths`)."""
    notes = notes if notes is not None else []
    lines = [
        f"# patchbench details: {cmp.run_id}",
        "",
        "The report is [report.md](report.md); this file holds what it leaves out.",
        "",
    ]
    lines += _per_repeat(cmp) + _pr_blocks(cmp, run_dir, notes) + _secondary(cmp)
    lines += _server_metrics(cmp)
    more = [p for p in plots or [] if p.stem != PR_FIGURE_STEM]
    if more:
        lines += ["## Plots", ""] + _plot_lines(more)
    return local_paths("\n".join(lines).rstrip() + "\n")


def render_run(run_dir: str | Path, settings=None, *, plots: bool = True) -> Path:
    """Build compare.json, plots, report.md and report-details.md of a run folder from its files
    alone (``settings``: CompareSettings, None: the run's own); returns report.md's path.
    Raises RunFolderError / SchemaTooNew (exit 2) for an unusable manifest."""
    from patchbench.analysis.build import compare_run

    run_dir = Path(run_dir)
    cmp = compare_run(run_dir, settings)
    paths, notes = [], []
    if plots:
        from patchbench.report.plots import make_plots

        paths, notes = make_plots(cmp, run_dir / "plots")
    rel = [p.relative_to(run_dir) if p.is_relative_to(run_dir) else p for p in paths]
    details = render_details(cmp, run_dir, rel, notes)
    records.write_text(run_dir / DETAILS_NAME, records.printable(details))
    text = render_markdown(cmp, rel, notes, details=details)
    return records.write_text(run_dir / "report.md", records.printable(text))
