"""report.md (GitHub-flavoured, pasteable into a PR) and the ``report`` / ``compare`` commands.

Layout of report.md, in this order:

1. header: config, model, sglang release, each variant's patches with their sha256, GPU and
   driver, this repo's commit, run id, repeats and schedule;
2. verdicts first: one line per variant (counts of improved / regressed / ...), the warnings that
   taint it (incomplete cells, suite warnings such as images dropped, outputs changed);
3. the delta table per variant: verdict, metric, baseline, variant, change %, interval, method,
   (noise floor), notes;
4. output identity (serving identical share, first difference, MMMU identical share);
5. MMMU paired summary (flips, McNemar p, identical responses; per subject folded);
6. sync probe (``suites.sync_probe.report_block`` per variant when the suite has it);
7. the PR-style blocks "Accuracy Tests" and "Benchmarking", Before (baseline, first repeat) and
   After (each variant), from each suite's ``report_block(summary_dir)``; long blocks folded in
   ``<details>``;
8. plots, methods, notes.

Every number in the tables comes from compare.json, formatted by :func:`fmt_value` /
:func:`fmt_pct`.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from patchbench import EXIT_OK, EXIT_USAGE, records
from patchbench.compare import (CellView, CompareSettings, RunView, compare_view, load_run,
                                settings_of)
from patchbench.suite import load_suite

VERDICT_ORDER = {"regressed": 0, "improved": 1, "changed": 2, "incomplete": 3,
                 "no significant change": 4}
VERDICT_MARK = {"regressed": "🔴 regressed", "improved": "🟢 improved", "changed": "🟡 changed",
                "incomplete": "⚪ incomplete", "no significant change": "no significant change"}
FOLD_LINES = 15


def fmt_value(x: float | None) -> str:
    """A measured value: 2 decimals when |x| >= 1, else 4 significant digits; "n/a" for None."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:.4g}"


def fmt_pct(x: float | None) -> str:
    """A change in percent with sign and 2 decimals ("+10.00%"); "n/a" for None."""
    if x is None:
        return "n/a"
    return f"{x:+.2f}%"


def fmt_ci(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "n/a"
    return f"[{fmt_pct(lo)}, {fmt_pct(hi)}]"


def _code(text: str, summary: str) -> str:
    """A fenced block; folded in <details> when longer than FOLD_LINES lines."""
    body = f"```\n{text.rstrip()}\n```"
    if text.count("\n") + 1 > FOLD_LINES:
        return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"
    return body


def _esc(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


# --------------------------------------------------------------------------- sections

def _header(view: RunView, cmp: dict) -> list[str]:
    man = view.manifest
    cfg = man.get("config") or {}
    model = (cfg.get("model") or {}).get("path", "?")
    gpu = man.get("gpu") or None
    if gpu:
        host = man.get("host") or {}
        env = man.get("environment") or {}
        cuda = gpu.get("cuda") or host.get("cuda_build") or env.get("cuda_build")
        gpu_s = gpu_name(man) + (f", driver {gpu['driver']}" if gpu.get("driver") else "") + \
            (f", CUDA {cuda}" if cuda else "")
    else:
        gpu_s = "none (CPU engine)"
    lines = [f"# patchbench: {cfg.get('name', view.run_id)}", "",
             "| | |", "|---|---|",
             f"| run | `{view.run_id}` |",
             f"| config | `{cfg.get('name', '?')}` |",
             f"| model | `{model}`"
             + (" (tiny random weights, built here: MMMU accuracy near 0 and unparsed answers are "
                "expected; this run shows the pipeline, speed and output identity, not quality)"
                if (cfg.get("model") or {}).get("tiny") else "") + " |",
             f"| sglang | `{man.get('sglang_version') or cfg.get('sglang', '?')}` |"]
    patches = man.get("patches") or {}
    for v in view.variants:
        ps = patches.get(v)
        if ps is None:
            ps = [{"name": p, "sha256": None} for p in (cfg.get("variants") or {}).get(v, [])]
        desc = ", ".join(f"`{p.get('name')}` ({(p.get('sha256') or '?')[:12]})" for p in ps) or "stock"
        tag = " (baseline)" if v == view.baseline else (" (A/A)" if v in view.aa_variants else "")
        lines.append(f"| variant `{v}`{tag} | {desc} |")
    lines += [f"| GPU | {gpu_s} |",
              f"| torch | {(man.get('environment') or {}).get('torch') or 'n/a'} |",
              f"| patchbench commit | `{_short_sha(man.get('git_sha'))}` |",
              f"| schedule | {view.repeats} repeat(s), "
              f"{(cfg.get('schedule') or {}).get('order', 'interleaved')} |",
              f"| suites | {', '.join(view.suites) or 'none'} |"]
    if man.get("started_at"):
        lines.append(f"| time | {man.get('started_at')} to {man.get('ended_at') or '(unfinished)'} |")
    return lines + [""]


def _short_sha(sha: str | None) -> str:
    """12 hex digits, keeping envinfo's "-dirty" suffix (uncommitted changes)."""
    if not sha:
        return "?"
    return sha[:12] + ("-dirty" if sha.endswith("-dirty") else "")


def gpu_name(manifest: dict) -> str | None:
    """The GPU model(s) of a manifest: ``gpu.name`` or the names in ``gpu.gpus`` (patchbench.envinfo
    shape {"gpus": [{"name", "memory_total_mib"}], "driver"}), "NAME xN" for N equal GPUs; None
    without a GPU."""
    gpu = manifest.get("gpu") or None
    if not gpu:
        return None
    if gpu.get("name"):
        return str(gpu["name"])
    names = [str(g.get("name", "?")) for g in gpu.get("gpus") or []]
    if not names:
        return "?"
    if len(set(names)) == 1:
        return names[0] + (f" x{len(names)}" if len(names) > 1 else "")
    return ", ".join(names)


def _warnings_for(cmp: dict, suite: str, variant: str) -> list[str]:
    w = cmp.get("cell_warnings") or {}
    base = cmp.get("baseline")
    out = [f"{base} {x}" for x in (w.get(suite) or {}).get(base, [])]
    if variant != base:
        out += [f"{variant} {x}" for x in (w.get(suite) or {}).get(variant, [])]
    return out


class _Notes:
    """Numbered footnotes: the same text gets the same number."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.items:
            self.items.append(text)
        return f"⚠{self.items.index(text) + 1}"


def _verdict_summary(cmp: dict) -> list[str]:
    lines = ["## Verdict", ""]
    for v in cmp.get("variants", []):
        rows = [r for r in cmp["metrics"] if r["variant"] == v]
        counts = {k: sum(r["verdict"] == k for r in rows) for k in VERDICT_ORDER}
        aa = " (A/A: same code as the baseline; any verdict here is noise)" \
            if v in cmp.get("aa_variants", []) else ""
        parts = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        lines.append(f"- **{v}** vs **{cmp['baseline']}**{aa}: {parts or 'no metrics'}")
        key = [r for r in rows if r["verdict"] in ("regressed", "improved", "changed")]
        key.sort(key=lambda r: VERDICT_ORDER[r["verdict"]])
        for r in key[:6]:
            lines.append(f"  - {r['verdict']}: `{r['metric']}` {fmt_pct(r['change_pct'])} "
                         f"{fmt_ci(r['ci_low_pct'], r['ci_high_pct'])}")
        ident = (cmp.get("output_identity") or {}).get(v) or {}
        if ident.get("flag"):
            lines.append(f"  - ⚠ outputs changed: {'; '.join(ident.get('reasons', []))}")
        inc = counts.get("incomplete", 0)
        if inc:
            lines.append(f"  - ⚠ {inc} metric(s) incomplete: a cell failed or lacks the value "
                         "(see the notes of the table)")
    return lines + [""]


def _delta_tables(cmp: dict, notes: _Notes) -> list[str]:
    lines = ["## Changes", ""]
    has_floor = bool(cmp.get("aa_variants"))
    ident = cmp.get("output_identity") or {}
    for v in cmp.get("variants", []):
        rows = [r for r in cmp["metrics"] if r["variant"] == v]
        if not rows:
            continue
        rows.sort(key=lambda r: VERDICT_ORDER.get(r["verdict"], 9))
        aa = " (A/A)" if v in cmp.get("aa_variants", []) else ""
        lines += [f"### {v}{aa} vs {cmp['baseline']}", ""]
        head = ["verdict", "suite", "metric", cmp["baseline"], v, "change", "interval", "method"]
        if has_floor:
            head.append("noise floor")
        head.append("notes")
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join("---" for _ in head) + "|")
        for r in rows:
            marks = [notes.ref(f"{v}: {n}") for n in r.get("notes", [])
                     if not n.startswith("direction guessed")]
            marks += [notes.ref(f"{r['suite']}: {w}") for w in _warnings_for(cmp, r["suite"], v)]
            if r["suite"] in ("serving", "mmmu") and (ident.get(v) or {}).get("flag"):
                marks.append(notes.ref(f"{v}: outputs changed: {'; '.join(ident[v]['reasons'])}"))
            cells = [VERDICT_MARK.get(r["verdict"], r["verdict"]), r["suite"], f"`{r['metric']}`",
                     fmt_value(r["baseline_median"]), fmt_value(r["variant_median"]),
                     fmt_pct(r["change_pct"]), fmt_ci(r["ci_low_pct"], r["ci_high_pct"]),
                     _esc(r.get("ci_method") or "n/a")]
            if has_floor:
                cells.append("n/a" if r.get("noise_floor_pct") is None else
                             f"±{r['noise_floor_pct']:.2f}%")
            cells.append(" ".join(dict.fromkeys(marks)))
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(f"Baseline and variant columns: medians over repeats. Change: the paired estimate "
                 f"the interval is centred on; interval: {round(cmp.get('settings', {}).get('confidence', 0.95) * 100)}% "
                 "confidence (method per row; see Methods).")
    return lines + [""]


def _identity(cmp: dict) -> list[str]:
    ident = cmp.get("output_identity") or {}
    if not any((d or {}).get("serving") or (d or {}).get("mmmu_identical_share") is not None
               for d in ident.values()):
        return []
    lines = ["## Output identity", "",
             "| variant | serving: identical outputs | 95% CI | first difference (median char) "
             "| MMMU: identical responses | reference | flag |", "|---|---|---|---|---|---|---|"]
    for v, d in ident.items():
        sv = d.get("serving")
        if sv:
            share = f"{sv['identical']}/{sv['n']} ({sv['share'] * 100:.1f}%)"
            ci = f"[{sv['share_ci'][0] * 100:.1f}%, {sv['share_ci'][1] * 100:.1f}%]"
            fd = "n/a" if sv.get("first_diff_char_median") is None else f"{sv['first_diff_char_median']:g}"
        else:
            share, ci, fd = "n/a", "n/a", "n/a"
        mm = d.get("mmmu_identical_share")
        mm_s = "n/a" if mm is None else f"{mm * 100:.1f}%"
        ref = d.get("reference") or "n/a"
        if ref == "A/A share":
            ref = f"A/A share ({d.get('reference_share', 1) * 100:.1f}%)"
        flag = "⚠ outputs changed" if d.get("flag") else "ok"
        lines.append(f"| {v} | {share} | {ci} | {fd} | {mm_s} | {_esc(ref)} | {flag} |")
    return lines + [""]


def _mmmu(cmp: dict) -> list[str]:
    pairs = cmp.get("mmmu_pairs") or {}
    if not pairs:
        return []
    lines = ["## MMMU paired", "",
             "| variant | questions | accuracy before | accuracy after | right→wrong | wrong→right "
             "| McNemar p | identical responses |", "|---|---|---|---|---|---|---|---|"]
    for v, p in pairs.items():
        ish = p.get("identical_share")
        lines.append(f"| {v} | {p.get('n')} | {fmt_value(p.get('acc_a'))} | {fmt_value(p.get('acc_b'))} | "
                     f"{p.get('right_to_wrong')} | {p.get('wrong_to_right')} | "
                     f"{'n/a' if p.get('mcnemar_p') is None else format(p['mcnemar_p'], '.3g')} | "
                     f"{'n/a' if ish is None else format(ish * 100, '.1f') + '%'} |")
    lines.append("")
    for v, p in pairs.items():
        subj = {s: d for s, d in (p.get("subjects") or {}).items()
                if d.get("right_to_wrong") or d.get("wrong_to_right")}
        if subj:
            t = ["| subject | n | before | after | right→wrong | wrong→right |", "|---|---|---|---|---|---|"]
            for s, d in subj.items():
                t.append(f"| {_esc(s)} | {d['n']} | {d['acc_a']:.3f} | {d['acc_b']:.3f} | "
                         f"{d['right_to_wrong']} | {d['wrong_to_right']} |")
            lines += [f"<details><summary>{v}: subjects with flips ({len(subj)})</summary>", "",
                      *t, "", "</details>", ""]
    return lines


def _block(suite: str, cell: CellView, notes: list[str] | None = None) -> str | None:
    """The suite's report_block for one cell, or None when the suite has none or it fails (the
    failure is appended to ``notes``)."""
    try:
        fn = getattr(load_suite(suite), "report_block", None)
    except Exception as e:
        if notes is not None:
            notes.append(f"suite {suite} could not be imported: {type(e).__name__}: {e}")
        return None
    if not callable(fn) or not cell.suite_dir(suite).is_dir():
        return None
    try:
        return str(fn(cell.suite_dir(suite)))
    except Exception as e:
        if notes is not None:
            notes.append(f"{suite} report_block of {cell.variant}/rep{cell.repeat} failed: "
                         f"{type(e).__name__}: {e}")
        return None


def _first_ok(view: RunView, variant: str, suite: str) -> CellView | None:
    for k in range(view.repeats):
        c = view.cell(variant, k)
        if c.suite_ok(suite):
            return c
    for k in range(view.repeats):
        c = view.cell(variant, k)
        if c.suite_dir(suite).is_dir():
            return c
    return None


def _after_variants(view: RunView) -> list[str]:
    others = [v for v in view.variants[1:] if v not in view.aa_variants]
    return others or view.variants[1:]


def _sync_probe(view: RunView, cmp: dict, bnotes: list[str]) -> list[str]:
    if "sync_probe" not in view.suites:
        return []
    lines = ["## Sync probe", ""]
    any_block = False
    for v in view.variants:
        c = _first_ok(view, v, "sync_probe")
        blk = _block("sync_probe", c, bnotes) if c else None
        if blk:
            any_block = True
            lines += [f"**{v}** (rep{c.repeat})", "", _code(blk, f"sync probe: {v}"), ""]
    if not any_block:
        sp = cmp.get("sync_probe") or {}
        names = sorted({m for d in sp.values() for m in (d.get("metrics") or {})})
        if names:
            lines += ["| variant | " + " | ".join(f"`{n}`" for n in names) + " |",
                      "|---|" + "---|" * len(names)]
            for v, d in sp.items():
                ms = d.get("metrics") or {}
                lines.append(f"| {v} | " + " | ".join(fmt_value(ms.get(n)) for n in names) + " |")
            lines.append("")
        else:
            lines += ["(no sync probe results)", ""]
    return lines


def _pr_blocks(view: RunView, bnotes: list[str]) -> list[str]:
    lines = []
    for title, suite in (("Accuracy Tests", "mmmu"), ("Benchmarking", "serving")):
        if suite not in view.suites:
            continue
        sec = [f"## {title}", ""]
        got = False
        for label, v in [("Before", view.baseline)] + [("After", x) for x in _after_variants(view)]:
            c = _first_ok(view, v, suite)
            blk = _block(suite, c, bnotes) if c else None
            if blk is None:
                continue
            got = True
            sec += [f"### {label} ({v}, rep{c.repeat})", "", _code(blk, f"{title}: {label} ({v})"), ""]
        if got:
            lines += sec
    return lines


def _methods(cmp: dict) -> list[str]:
    s = cmp.get("settings") or {}
    return ["## Methods", "",
            f"- Changes are variant / baseline - 1. With 2 to {s.get('min_repeats_for_bootstrap', 50) - 1} "
            "paired repeats (repeat k of the baseline with repeat k of the variant, run interleaved) the "
            "interval is a Student-t interval on the log ratios; from "
            f"{s.get('min_repeats_for_bootstrap', 50)} on a {s.get('bootstrap_method', 'BCa')} bootstrap "
            f"({s.get('bootstrap_resamples')} resamples, seed {s.get('seed')}).",
            "- With one repeat, TTFT and E2E intervals pair request i with request i (same prompts, fixed "
            "seed) and ITL intervals resample whole requests (its values are correlated within a "
            "request); these intervals cover request-to-request noise only, not run-to-run noise.",
            "- A/A variants (same patches as the baseline) measure the noise floor: an effect whose "
            "size is within the floor is never called significant.",
            "- incomplete: a cell of the pair failed or lacks the value; no verdict is given.", ""]


# --------------------------------------------------------------------------- render

def render_markdown(view: RunView, cmp: dict, plot_paths: list[Path] | None = None,
                    extra_notes: list[str] | None = None) -> str:
    """The report.md text of a comparison (see the module docstring for its sections)."""
    notes = _Notes()
    bnotes: list[str] = []
    lines = _header(view, cmp) + _verdict_summary(cmp) + _delta_tables(cmp, notes) + \
        _identity(cmp) + _mmmu(cmp) + _sync_probe(view, cmp, bnotes) + _pr_blocks(view, bnotes)
    extra_notes = list(extra_notes or []) + bnotes
    if plot_paths:
        lines += ["## Plots", ""]
        for p in plot_paths:
            rel = p.relative_to(view.run_dir) if p.is_relative_to(view.run_dir) else p
            lines += [f"![{p.stem}]({rel.as_posix()})", ""]
    lines += _methods(cmp)
    all_notes = list(notes.items)
    if all_notes or cmp.get("notes") or extra_notes:
        lines += ["## Notes", ""]
        for i, n in enumerate(all_notes, 1):
            lines.append(f"{i}. ⚠{i} {_esc(n)}")
        for n in list(cmp.get("notes") or []) + list(extra_notes or []):
            lines.append(f"- {_esc(n)}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_view(view: RunView, out_dir: Path, settings: CompareSettings | None = None,
                plots: bool = True) -> Path:
    """compare.json, plots/*.png and report.md of ``view`` into ``out_dir``; returns report.md."""
    from patchbench.plots import make_plots
    cmp = compare_view(view, settings)
    records.write_json(out_dir / "compare.json", cmp)
    paths, pnotes = (make_plots(view, cmp, out_dir / "plots") if plots else ([], []))
    text = render_markdown(view, cmp, paths, pnotes)
    return records.write_text(out_dir / "report.md", text)


def render_run(run_dir: str | Path, settings: CompareSettings | None = None, *,
               plots: bool = True) -> Path:
    """Re-render compare.json, report.md and plots of a run folder from its files alone.

    Returns the path of report.md. Raises FileNotFoundError when the run has no manifest.json.
    """
    view = load_run(run_dir)
    return render_view(view, Path(run_dir), settings or settings_of(view), plots=plots)


def _console_summary(cmp: dict, report: Path) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is a requirement; stay usable without it
        for r in cmp["metrics"]:
            print(f"{r['variant']:>16} {r['metric']:<36} {fmt_pct(r['change_pct']):>9} {r['verdict']}")
        print(f"report: {report}")
        return
    t = Table(title=f"{cmp['run_id']}: variants vs {cmp['baseline']}")
    for h in ("variant", "metric", "change", "interval", "verdict"):
        t.add_column(h)
    for r in cmp["metrics"]:
        if r["verdict"] != "no significant change":
            t.add_row(r["variant"], r["metric"], fmt_pct(r["change_pct"]),
                      fmt_ci(r["ci_low_pct"], r["ci_high_pct"]), r["verdict"])
    c = Console()
    if t.row_count:
        c.print(t)
    else:
        c.print(f"{cmp['run_id']}: no significant change in {len(cmp['metrics'])} comparisons")
    c.print(f"report: {report}")


def cli_report(argv: list[str]) -> int:
    """``runner.py report RUN_DIR [--no-plots]``: re-render a run's compare.json, report.md, plots.

    Exit codes: 0 done, 2 (EXIT_USAGE) when RUN_DIR is not a run folder or its compare settings
    are invalid.
    """
    ap = argparse.ArgumentParser(prog="runner.py report",
                                 description="Re-render compare.json, report.md and plots of a run folder.")
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return EXIT_OK if e.code == 0 else EXIT_USAGE
    if not (a.run_dir / "manifest.json").is_file():
        print(f"error: {a.run_dir} is not a run folder (no manifest.json)", file=sys.stderr)
        return EXIT_USAGE
    try:
        view = load_run(a.run_dir)
        settings = settings_of(view)
    except (ValueError, OSError) as e:
        print(f"error: {a.run_dir}: {e}", file=sys.stderr)
        return EXIT_USAGE
    path = render_view(view, a.run_dir, settings, plots=not a.no_plots)
    _console_summary(records.read_json(a.run_dir / "compare.json"), path)
    return EXIT_OK


# --------------------------------------------------------------------------- runner.py compare

def protocol_differences(a: RunView, b: RunView) -> list[str]:
    """What makes two runs' numbers incomparable: sglang version, model, suite parameters
    (datasets, seeds, request counts), server arguments and environment, GPU model.

    Returns human-readable lines "what: A=..., B=..." (empty when the protocols match).
    """
    def g(view: RunView, *path):
        x = view.manifest
        for p in path:
            x = (x or {}).get(p) if isinstance(x, dict) else None
        return x

    diffs = []
    checks = [("sglang version", ("sglang_version",)), ("model", ("config", "model", "path")),
              ("tokenizer", ("config", "model", "tokenizer")),
              ("server args", ("config", "server", "args")),
              ("server env", ("config", "server", "env"))]
    for what, path in checks:
        x, y = g(a, *path), g(b, *path)
        if x != y:
            diffs.append(f"{what}: A={x!r}, B={y!r}")
    if gpu_name(a.manifest) != gpu_name(b.manifest):
        diffs.append(f"GPU: A={gpu_name(a.manifest)!r}, B={gpu_name(b.manifest)!r}")
    sa, sb = g(a, "config", "suites") or {}, g(b, "config", "suites") or {}
    for suite in sorted(set(sa) & set(sb)):
        pa, pb = sa[suite] or {}, sb[suite] or {}
        for key in sorted(set(pa) | set(pb)):
            if pa.get(key) != pb.get(key):
                diffs.append(f"suites.{suite}.{key}: A={pa.get(key)!r}, B={pb.get(key)!r}")
    if not set(sa) & set(sb) and (sa or sb):
        diffs.append(f"suites: no suite in common (A: {sorted(sa)}, B: {sorted(sb)})")
    return diffs


def cross_run_view(a: RunView, b: RunView, variant: str) -> RunView:
    """A view whose baseline is A's baseline ("A:<name>") and whose one variant is B's ``variant``
    ("B:<name>"); repeats pair by index (min of the two counts); suites: those both ran."""
    la, lb = f"A:{a.baseline}", f"B:{variant}"
    if la == lb:
        lb = lb + "'"
    reps = min(a.repeats, b.repeats)
    suites = [s for s in a.suites if s in b.suites]
    cells = {}
    schedule = []
    for k in range(reps):
        ca, cb = a.cell(a.baseline, k), b.cell(variant, k)
        cells[(la, k)] = CellView(la, k, ca.dir, ca.status, ca.error, ca.summaries)
        cells[(lb, k)] = CellView(lb, k, cb.dir, cb.status, cb.error, cb.summaries)
        schedule += [{"variant": la, "repeat": k, "position": 2 * k, "status": ca.status},
                     {"variant": lb, "repeat": k, "position": 2 * k + 1, "status": cb.status}]
    man = dict(b.manifest)
    cfg = dict(man.get("config") or {})
    cfg["variants"] = {la: (a.manifest.get("config") or {}).get("variants", {}).get(a.baseline, []),
                       lb: (b.manifest.get("config") or {}).get("variants", {}).get(variant, [])}
    cfg["baseline"] = la
    cfg["name"] = f"{(a.manifest.get('config') or {}).get('name', a.run_id)} vs " \
                  f"{(b.manifest.get('config') or {}).get('name', b.run_id)}"
    man["config"] = cfg
    man["patches"] = {la: (a.manifest.get("patches") or {}).get(a.baseline, []),
                      lb: (b.manifest.get("patches") or {}).get(variant, [])}
    man["derived_from"] = {"A": str(a.run_dir), "B": str(b.run_dir), "variant": variant}
    run_id = f"{a.run_id}:{a.baseline} vs {b.run_id}:{variant}"
    man["run_id"] = run_id
    notes = [f"cross-run comparison: A={a.run_dir} ({a.baseline}), B={b.run_dir} ({variant}); the two "
             "runs were not interleaved, so machine drift between them is not cancelled"]
    if a.repeats != b.repeats:
        notes.append(f"repeats differ (A {a.repeats}, B {b.repeats}); the first {reps} pair by index")
    dropped = sorted(set(a.suites) ^ set(b.suites))
    if dropped:
        notes.append(f"suites not in both runs, left out: {', '.join(dropped)}")
    return RunView(run_dir=b.run_dir, run_id=run_id, manifest=man, baseline=la, variants=[la, lb],
                   aa_variants=[], repeats=reps, suites=suites, cells=cells, schedule=schedule,
                   notes=notes)


def cli_compare(argv: list[str]) -> int:
    """``runner.py compare RUN_A RUN_B [--variant NAME] [--out DIR]``.

    Compares the baseline of RUN_A with variant NAME of RUN_B (default: B's first variant that is
    not its baseline, else B's baseline), e.g. the same config run at two commits. Refuses (exit 2)
    when the protocols differ (sglang version, model, suite parameters such as dataset and seed,
    server arguments, GPU), listing what differs. Writes compare.json, report.md and plots into
    ``--out`` (default ``RUN_B/compare-vs-<RUN_A name>-<variant>``). Exit codes: 0 done, 2 usage.
    """
    ap = argparse.ArgumentParser(prog="runner.py compare",
                                 description="Compare the baseline of RUN_A with a variant of RUN_B.")
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--variant", help="variant of RUN_B (default: its first non-baseline variant)")
    ap.add_argument("--out", type=Path, help="output folder")
    ap.add_argument("--no-plots", action="store_true")
    try:
        a = ap.parse_args(argv)
    except SystemExit as e:
        return EXIT_OK if e.code == 0 else EXIT_USAGE
    views = []
    for p in (a.run_a, a.run_b):
        if not (p / "manifest.json").is_file():
            print(f"error: {p} is not a run folder (no manifest.json)", file=sys.stderr)
            return EXIT_USAGE
        try:
            views.append(load_run(p))
        except (ValueError, OSError) as e:
            print(f"error: {p}: {e}", file=sys.stderr)
            return EXIT_USAGE
    va, vb = views
    variant = a.variant or (vb.variants[1] if len(vb.variants) > 1 else vb.baseline)
    if variant not in vb.variants:
        print(f"error: {a.run_b} has no variant '{variant}'; variants: {', '.join(vb.variants)}",
              file=sys.stderr)
        return EXIT_USAGE
    diffs = protocol_differences(va, vb)
    if diffs:
        print(f"refusing to compare {a.run_a} with {a.run_b}: the protocols differ:", file=sys.stderr)
        for d in diffs:
            print(f"  - {d}", file=sys.stderr)
        return EXIT_USAGE
    view = cross_run_view(va, vb, variant)
    out = a.out or (a.run_b / f"compare-vs-{a.run_a.name}-{variant}")
    try:
        settings = settings_of(vb)
    except ValueError as e:
        print(f"error: {a.run_b}: compare settings: {e}", file=sys.stderr)
        return EXIT_USAGE
    out.mkdir(parents=True, exist_ok=True)
    records.write_json(out / "compare-manifest.json", view.manifest)
    view.run_dir = out
    path = render_view(view, out, settings, plots=not a.no_plots)
    _console_summary(records.read_json(out / "compare.json"), path)
    return EXIT_OK
