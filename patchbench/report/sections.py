"""report.md's other sections: the header (config, model, patches, GPU, schedule), failed and
incomplete cells, the A/A noise and drift, the GPU and server-log blocks, each suite's section,
and the Methods."""

from __future__ import annotations

from pathlib import Path

from patchbench import records, runfolder
from patchbench.analysis.comparison import Comparison
from patchbench.analysis.rundata import variant_parts
from patchbench.config import sglang_label
from patchbench.report.decide import DECIDE_CAP, DECIDE_POWER
from patchbench.report.fmt import _esc
from patchbench.run import logscan
from patchbench.runfolder import models


def _header(man: runfolder.RunManifest, cmp: Comparison) -> list[str]:
    cfg = man.config
    model = (cfg.model.path if cfg else None) or man.model or "?"
    gpu_s = gpu_name(man.gpu) or "none (CPU engine)"
    lines = [
        f"# patchbench: {cfg.name if cfg else cmp.run_id}",
        "",
        "| | |",
        "|---|---|",
        f"| run | `{cmp.run_id}` |",
        f"| model | `{model}`"
        + (
            " (tiny random weights: accuracy near 0 is expected; this run shows the pipeline)"
            if cfg and cfg.model.tiny
            else ""
        )
        + " |",
        f"| sglang | `{man.sglang_version or (sglang_label(cfg.sglang) if cfg else '?')}` |",
    ]
    for v in [cmp.baseline] + cmp.variants:
        pats, args, env = variant_parts(man.variants_json().get(v))
        ps = man.patches.get(v) or [models.PatchHash(name=p) for p in pats]
        source = (man.builds.get(v) or {}).get("kind") in ("git", "wheel")
        desc = ", ".join(f"`{p.name}` ({(p.sha256 or '?')[:12]})" for p in ps) or (
            "no patches" if source else "stock"  # a checkout or wheel is not the stock release
        )
        if args:
            desc += "; server args " + " ".join(f"`{a}`" for a in args)
        if env:
            desc += "; env " + " ".join(f"`{k}={val}`" for k, val in env.items())
        if v in man.builds:  # the run named builds: each arm's (patchbench.envs.builds)
            desc += f"; build {man.builds[v].get('describe', '?')}"
        tag = " (baseline)" if v == cmp.baseline else (" (A/A)" if v in cmp.aa_variants else "")
        lines.append(f"| variant `{v}`{tag} | {desc} |")
    inst = [f"{c['variant']}/rep{c['repeat']}" for c in cmp.cells if c.get("instrumented")]
    corr = [c["dir"] for c in cmp.correctness_cells]
    rounds = cmp.suite_rounds
    order = cfg.schedule.order if cfg else "interleaved"
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
    :func:`patchbench.run.gpu.cell_flags`). Nothing when no cell was sampled (CPU run, no NVML)."""
    from patchbench.run.gpu import cell_flags

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
    :func:`patchbench.run.logscan.scan_server_log`); they change what that suite measured."""
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
