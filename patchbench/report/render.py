"""report.md from its sections, and :func:`render_run`: compare.json, plots, report.md and
report-details.md of a run folder."""

from __future__ import annotations

from pathlib import Path

from patchbench import records, runfolder
from patchbench.analysis.build import build_comparison
from patchbench.analysis.comparison import CompareSettings, Comparison, write_comparison
from patchbench.report.answer import _partial, _primaries, sentence
from patchbench.report.details import DETAILS_NAME, PR_FIGURE_STEM, _plot_lines, render_details
from patchbench.report.fmt import _esc
from patchbench.report.sections import (
    _failures,
    _gpu_block,
    _header,
    _health,
    _methods,
    _server_log_block,
    _suite_sections,
)


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
    """The report.md text of a comparison (sections in :mod:`patchbench.report`): what a reviewer
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
        from patchbench.report.plots import make_plots

        paths, pnotes = make_plots(cmp, run_dir / "plots")
    details = render_details(cmp, run_dir, paths, pnotes)
    records.write_text(run_dir / DETAILS_NAME, details)
    manifest = runfolder.read_manifest(run_dir)
    text = render_markdown(cmp, manifest, run_dir, paths, pnotes, details=details)
    return records.write_text(run_dir / "report.md", text)
