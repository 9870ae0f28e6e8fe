"""report.md (GitHub-flavoured, pasteable into a PR), the console summary and ``patchbench report``.

Renders only from the typed :class:`~patchbench.comparison.Comparison` (and the manifest for the
header). Layout, in this order:

1. header: config, model, sglang release, each variant's patches with their sha256, GPU, commit,
   run id, repeats, which cells were instrumented;
2. the answer: one sentence per variant (its primaries with change, interval and verdict);
3. the primaries table, at the Holm-adjusted level each verdict used (stated);
4. the A/A health check and cell warnings; the GPU block (cells whose GPU was throttled or shared,
   from each cell's NVML summary) and the server-log block (retractions and out-of-memory events
   each suite's server logged, per cell);
5. suite sections (each suite's ``report_section`` hook), pairing refusals with their reasons;
6. PR-style blocks (each suite's ``report_block`` hook), Before (baseline) and After (variants);
7. the folded secondary table (raw intervals, exploratory, no coloured verdicts);
8. plots, methods with their sources, notes.
"""

from __future__ import annotations

import re
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


def values_txt(r: Row) -> str:
    """A deterministic row's two values, bounds marked: "507 -> 90", "507 -> ≥6"."""
    return (
        f"{fmt_bounded(r.baseline_value, r.baseline_bound)} -> "
        f"{fmt_bounded(r.variant_value, r.variant_bound)}"
    )


def exactness(r: Row) -> str:
    """ "exact" for a deterministic row, "a bound" when either value is only a bound."""
    return "a bound" if r.baseline_bound or r.variant_bound else "exact"


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
    """The verdict of a row in words: "improved", "improved, within ±5%", "equivalent within
    ±2 pt", "inconclusive (1 repeat ...)"."""
    if r.verdict in ("improved", "regressed") and r.within_margin:
        return f"{r.verdict}, within {_margin_txt(r)}"
    if r.verdict == "equivalent":
        margin = _margin_txt(r)
        # a deterministic count with no margin is equivalent only when it is exactly equal
        return f"equivalent within {margin}" if margin else "unchanged"
    return r.verdict


def short_name(r: Row) -> str:
    """A row's label without its parenthetical or trailing qualifier, for the one-line answer:
    "Output token throughput (tok/s)" -> "Output token throughput", "host syncs per call
    (device-to-host reads + ...), summed over batch sizes" -> "host syncs per call"."""
    name = _name(r)
    return re.split(r" \(|, ", name, maxsplit=1)[0].strip() or name


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
        if r.low is None or r.high is None:
            # no interval: say why in a few words instead of "n/a" (the table has the full note)
            why = (r.notes[0].split(":")[0] if r.notes else "no interval").strip()
            parts.append(
                f"{short_name(r)} {fmt_change(r.change, r.change_unit)} {verdict_text(r)} ({why})"
            )
            continue
        parts.append(
            f"{short_name(r)} {fmt_change(r.change, r.change_unit)} "
            f"{fmt_ci(r.low, r.high, r.change_unit)} {verdict_text(r)}"
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
    seq = man.sequential
    if seq is not None:
        looks = seq.design.looks
        most = f" of at most {looks[-1]}" if looks else ""
        lines.append(f"| sequential | {seq.repeats_run}{most} repeats; {seq.reason} |")
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
    fam = 100 * cmp.settings.confidence
    lines = [
        "## Primary metrics",
        "",
        f"Intervals are at the Holm-adjusted level each verdict used (family confidence "
        f"{fam:g}% across each variant's primaries); equivalence is TOST at the same level.",
        "",
        "| variant | metric | baseline | variant | change | interval | level | verdict | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        level = f"{100 * r.confidence:.2f}%" if r.confidence else "exact"
        lines.append(
            f"| {r.variant} | {_esc(_name(r))} | {fmt_bounded(r.baseline_value, r.baseline_bound)} | "
            f"{fmt_bounded(r.variant_value, r.variant_bound)} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {level} | "
            f"{VERDICT_MARK.get(r.verdict, r.verdict)}"
            f"{', within ' + _margin_txt(r) if r.within_margin else ''} | {_esc('; '.join(r.notes))} |"
        )
    return lines + [""]


def _health(cmp: Comparison) -> list[str]:
    lines = []
    if cmp.aa_variants:
        lines += [
            "## A/A check",
            "",
            (
                "passed: every A/A variant came out equivalent or inconclusive"
                if cmp.health.ok
                else "**failed**: " + " ".join(cmp.health.notes)
            ),
            "",
        ]
    warn = [(s, v, w) for s, per in cmp.cell_warnings.items() for v, ws in per.items() for w in ws]
    if warn:
        lines += ["<details><summary>cell warnings</summary>", ""]
        lines += [f"- {s} / {v}: {_esc(w)}" for s, v, w in warn] + ["", "</details>", ""]
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
    rows = [r for r in cmp.rows if not r.primary]
    if not rows:
        return []
    lines = [
        "<details><summary>Secondary metrics (exploratory: raw "
        f"{100 * cmp.settings.confidence:g}% intervals, no multiplicity correction, "
        "not verdicts)</summary>",
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
            f"| {r.variant} | {r.suite} | `{r.metric}` | "
            f"{fmt_bounded(r.baseline_value, r.baseline_bound)} | "
            f"{fmt_bounded(r.variant_value, r.variant_bound)} | {fmt_change(r.change, r.change_unit)} | "
            f"{fmt_ci(r.low, r.high, r.change_unit)} | {_esc(r.method or '')} | "
            f"{_esc(desc + '; '.join(r.notes))} |"
        )
    return lines + ["", "</details>", ""]


def _methods(cmp: Comparison) -> list[str]:
    s = cmp.settings
    lines = [
        "## Methods",
        "",
        f"- Run-level metrics: repeat k of the baseline paired with repeat k of the variant "
        f"(interleaved schedule); a verdict needs at least {s.min_repeats} paired repeats. "
        "Request-level intervals inside one cell are descriptive only.",
        "- Verdicts: improved / regressed when the interval excludes no change; equivalent "
        "when TOST at the same level puts the change inside the margin; inconclusive otherwise.",
        "- A/A variants are compared like any variant; if one comes out improved or regressed, "
        "every verdict is downgraded to inconclusive.",
    ]
    if any("@" in r.metric for r in cmp.rows):
        lines.append(
            "- Load sweep: a metric named `<metric>@<point>` is that metric at one load (`c16`: "
            "concurrency 16, `r2.5`: 2.5 req/s), paired across repeats at that load; the "
            "curve's primaries (named by the suite) are in each variant's one Holm family; a "
            "point whose client did not deliver the load is not judged (docs/serving.md)."
        )
    lines += [f"- {name}: {src}" for name, src in cmp.methods.items()]
    return lines + [""]


def render_markdown(
    cmp: Comparison,
    manifest: runfolder.RunManifest,
    run_dir: Path,
    plot_paths: list[Path] | None = None,
    extra_notes: list[str] | None = None,
) -> str:
    """The report.md text of a comparison (sections in the module docstring)."""
    notes = list(extra_notes or [])
    lines = _header(manifest, cmp)
    lines += ["## Answer", ""] + [f"- {sentence(cmp, v)}" for v in cmp.variants] + [""]
    lines += (
        _primaries(cmp)
        + _health(cmp)
        + _gpu_block(cmp, run_dir)
        + _server_log_block(cmp, run_dir)
        + _suite_sections(cmp, notes)
        + _pr_blocks(cmp, run_dir, notes)
    )
    lines += _secondary(cmp)
    if plot_paths:
        lines += ["## Plots", ""]
        for p in plot_paths:
            rel = p.relative_to(run_dir) if p.is_relative_to(run_dir) else p
            lines += [f"![{p.stem}]({rel.as_posix()})", ""]
    lines += _methods(cmp)
    all_notes = list(cmp.notes) + notes
    if all_notes:
        lines += ["## Notes", ""] + [f"- {_esc(n)}" for n in all_notes] + [""]
    return "\n".join(lines).rstrip() + "\n"


def render_run(
    run_dir: str | Path, settings: CompareSettings | None = None, *, plots: bool = True
) -> Path:
    """Build compare.json, plots and report.md of a run folder from its files alone; returns
    report.md. Raises RunFolderError / SchemaTooNew (exit 2) for an unusable manifest."""
    run_dir = Path(run_dir)
    cmp = build_comparison(run_dir, settings)
    write_comparison(run_dir, cmp)
    paths, pnotes = [], []
    if plots:
        from patchbench.plots import make_plots

        paths, pnotes = make_plots(cmp, run_dir / "plots")
    text = render_markdown(cmp, runfolder.read_manifest(run_dir), run_dir, paths, pnotes)
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
        for line in answer:
            c.print(line, markup=False, highlight=False)
    except ImportError:
        if report is not None:
            print(f"report: {report}")
        for line in answer:
            print(line)
    return sents
