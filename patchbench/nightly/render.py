"""What a night found and its ``nightly.md``: per run folder (:class:`NightlyOutcome`), per unit
(:class:`UnitNightly`), per matrix (:class:`MatrixNightlyOutcome`), the exit-code order over
units (:data:`EXIT_ORDER`), and one renderer for every night (:func:`render_markdown` of a
:class:`NightSummary`): a run folder's page (the verdict, the budget, problems, regressions with
their numbers, underpowered gates, every gate, noise, change points, builds, the confirmation,
the history, the plots) or a matrix's page (one row per unit, the regressions of every unit, the
units that did not run ok).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from patchbench.config.nightly import NightlySettings
from patchbench.errors import (
    EXIT_ENV,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_UNDERPOWERED,
    EXIT_USAGE,
)
from patchbench.nightly.confirm import lines as confirm_lines
from patchbench.nightly.gates import UNDERPOWERED, GateResult
from patchbench.nightly.history import Night

EXIT_ORDER: tuple[int, ...] = (
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_ENV,
    EXIT_USAGE,
    EXIT_UNDERPOWERED,
    EXIT_OK,
)
"""Worst first: the exit code of a matrix night is the first of these that any unit has. A
regression in one unit comes before a run failure in another: the units are independent runs, so
one lost node or flaky cell must not turn a night that found a regression into a runner
problem (the summary still lists the failed units). The rest keep the single-config order."""

OUTCOME_OF_EXIT: dict[int, str] = {
    EXIT_REGRESSION: "red",
    EXIT_RUN_FAILED: "run failed",
    EXIT_ENV: "environment not ready",
    EXIT_USAGE: "config error",
    EXIT_UNDERPOWERED: "underpowered",
    EXIT_OK: "green",
}


def worst_exit(codes: Sequence[int]) -> int:
    """The worst of ``codes`` in :data:`EXIT_ORDER` (0 for none); a code not in it counts as 4."""
    known = [c if c in EXIT_ORDER else EXIT_RUN_FAILED for c in codes]
    return min(known, key=EXIT_ORDER.index) if known else EXIT_OK


@dataclass
class NightlyOutcome:
    """What gating one run folder found: exit code, gate results, the night (None when the folder
    could not be read), files written, problems, outcome (red / underpowered / green, "failed"),
    headline, the history's state (``history_info``: path, recorded, already_recorded,
    nights_before, error), plots (relative to the run folder), settings, and as nightly.json
    has them the noise table, change points, builds, likely causes, blocked variants, the
    confirmation, the ``schedule.repeats: auto`` choice and the red story
    (:meth:`patchbench.nightly.story.Story.to_json`)."""

    exit_code: int
    results: list[GateResult]
    night: Night | None
    summary_path: Path | None = None
    json_path: Path | None = None
    problems: list[str] = field(default_factory=list)
    outcome: str = "green"
    headline: str = ""
    history_info: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)
    settings: NightlySettings | None = None
    noise: list[dict[str, Any]] = field(default_factory=list)
    change_points: list[dict[str, Any]] = field(default_factory=list)
    builds: list[dict[str, Any]] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    confirmation: dict[str, Any] | None = None
    repeats: dict[str, Any] | None = None
    story: dict[str, Any] | None = None


@dataclass
class UnitNightly:
    """One unit of a night (a row of the matrix nightly.md, ``units[]`` of its json): its run
    from matrix.json (``status``, ``run_exit_code``, ``message``), its nightly ``exit_code``
    (4, or 3 / 2 when its bench ended so, for a unit that did not run), ``outcome`` (red when
    a gate failed, else the word of the code), history ``key``, ``failing`` results, paths
    relative to the matrix folder (``summary``, ``report``), what gating found (``gated``) and
    its ``confirmation``."""

    id: str
    key: str | None
    labels: dict[str, Any]
    gpu_type: str | None
    status: str
    run_exit_code: int | None
    exit_code: int
    outcome: str
    headline: str
    message: str = ""
    failing: list[GateResult] = field(default_factory=list)
    summary: str | None = None
    report: str | None = None
    gated: NightlyOutcome | None = None
    confirmation: dict[str, Any] | None = None

    @property
    def rank_code(self) -> int:
        """The code this unit adds to the matrix's: 1 when a gate failed, else ``exit_code``."""
        return EXIT_REGRESSION if self.outcome == "red" else self.exit_code

    def to_json(self) -> dict[str, Any]:
        """The unit's entry in the matrix nightly.json (every field but ``gated``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gated"}
        return out | {"failing": [r.to_json() for r in self.failing]}


@dataclass
class MatrixNightlyOutcome:
    """What :func:`nightly_on_matrix_run` did: the matrix exit code (:func:`worst_exit` over
    the units), its outcome word, headline, every unit, and the files it wrote."""

    exit_code: int
    outcome: str
    headline: str
    matrix_dir: Path
    units: list[UnitNightly]
    summary_path: Path | None = None
    json_path: Path | None = None


@dataclass
class NightSummary:
    """What one ``nightly.md`` shows: the night's ``name`` (config or matrix), ``exit_code`` and
    ``headline``, its ``units``, and ``matrix_dir``: None for a run folder's page (one unit,
    its gates in full), the matrix run folder for a matrix's page (one row per unit)."""

    name: str
    exit_code: int
    headline: str
    units: list[UnitNightly]
    matrix_dir: Path | None = None


_MARK = {
    "fail": "❌ fail",
    "warn": "⚠️ warn",
    "pass": "✅ pass",
    "quiet": "✅ quiet",
    "inconclusive": "❔ inconclusive",
    "underpowered": "❔ underpowered",
    "ungated": "➖ ungated",
    "skipped": "⏳ skipped",
    "missing": "⛔ missing",
    "learning": "📚 learning",
}

_UNIT_MARK = {
    "red": "❌ red",
    "run failed": "💥 run failed",
    "environment not ready": "🔧 environment not ready",
    "config error": "⛔ config error",
    "underpowered": "❔ underpowered",
    "learning": "📚 learning",
    "green": "✅ green",
    "no gates": "⚪ no gates",
}


def fmt(x: float | None, nd: int = 4) -> str:
    """``x`` with ``nd`` significant digits, or "n/a"."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}g}"


def _num(x: float | None, unit: str) -> str:
    """A value with its unit ("90 tok/s"), or "n/a"."""
    return f"{fmt(x)} {unit}".rstrip() if x is not None else "n/a"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


def _cell(x: object) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def gate_line(r: GateResult) -> str:
    """One regression: ``**suite.metric** (variant, kind): value vs reference; reason``."""
    return (
        f"**{r.suite}.{r.metric}** ({r.variant}, {r.kind.replace('_', '-')}): "
        f"{_num(r.value, r.unit)} vs {_num(r.reference, r.unit)}; {r.reason}"
    )


def render_markdown(night: NightSummary) -> str:
    """The ``nightly.md`` of a night: a run folder's page when ``night.matrix_dir`` is None (its
    one unit must have been gated), else the matrix's page (see the module docstring)."""
    matrix = night.matrix_dir is not None
    lines = [f"# Nightly {'matrix ' if matrix else ''}{night.name}: {night.headline}", ""]
    if matrix:
        lines += _matrix_intro(night)
    else:
        lines += _run_intro(night, _gated(night))
    lines += _regressions(night)
    if matrix:
        lines += _matrix_tail(night)
    else:
        lines += _run_tail(_gated(night))
    return "\n".join(lines) + "\n"


def _gated(night: NightSummary) -> NightlyOutcome:
    [unit] = night.units
    assert unit.gated is not None and unit.gated.night is not None
    return unit.gated


def _regressions(night: NightSummary) -> list[str]:
    """Every failing gate of every unit (a matrix's lines name the unit)."""
    lines = []
    for u in night.units:
        prefix = f"`{u.id}`: " if night.matrix_dir is not None else ""
        lines += [f"- {prefix}{gate_line(r)}" for r in u.failing]
    return ["## Regressions", "", *lines, ""] if lines else []


# ------------------------------------------------------------------------------ a run's page


def _run_intro(night: NightSummary, g: NightlyOutcome) -> list[str]:
    """The run, the error budget, the problems."""
    t = g.night
    assert t is not None
    lines = [
        f"Run `{t.run_id}` · night {t.night_utc} · commit "
        f"`{(t.git_sha or 'unknown')[:12]}` · sglang {t.sglang_version or '?'}"
        f" · machine {t.machine or 'unknown'} · exit code {night.exit_code}",
        "",
    ]
    if g.settings is not None:
        lines += [_budget(g.settings), ""]
    if g.blocked:
        lines += ["## Patch does not apply", ""] + [f"- **{x}**" for x in g.blocked] + [""]
    if g.problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in g.problems] + [""]
    return lines + story_lines(g.story)


def story_lines(story: dict[str, Any] | None) -> list[str]:
    """The red night's story (patchbench.nightly.story): the new failures first, then since when
    each gate is red and whether the cause is yesterday's; "learning (k of n nights)"."""
    if not story or not (story.get("lines") or story.get("learning")):
        return []
    lines = ["## Since when", ""] + [f"- {x['text']}" for x in story.get("lines") or []]
    if story.get("lines"):
        cause = (
            "same cause as yesterday"
            if story.get("same_as_yesterday")
            else (
                "not the same cause as yesterday" if story.get("yesterday") else "the first night"
            )
        )
        lines.append(f"- red since {str(story.get('since_utc'))[:10]}: {cause}")
    if story.get("learning"):
        k, n = story["learning"]["nights"], story["learning"]["needed"]
        lines.append(
            f"- learning ({k} of {n} nights): the noise is not learned yet, so a gate is red only "
            "for a change beyond doubt"
        )
    return lines + [""]


def mde_lines(results: Sequence[GateResult] | Sequence[dict[str, Any]]) -> list[str]:
    """What each gate can see: the smallest change its test shows with 80 % power at tonight's
    noise and repeats (``mde_pct``), and whether its threshold is below that (blind there)."""
    rows = []
    for r in results:
        g = r if isinstance(r, dict) else r.to_json()
        if g.get("mde_pct") is None:
            continue
        thr = g.get("threshold_pct")
        blind = (
            f"blind to changes between {thr:g} % and {g['mde_pct']:.1f} %"
            if isinstance(thr, (int, float)) and g["mde_pct"] > thr
            else "sees its threshold"
        )
        rows.append(
            f"| {g['suite']}.{g['metric']} ({str(g['kind']).replace('_', '-')}) | {g['variant']} "
            f"| {g.get('n')} | {g['mde_pct']:.1f} % | {fmt(thr)} % | {blind} |"
        )
    if not rows:
        return []
    return [
        "## What the gates can see",
        "",
        "| gate | variant | repeats | smallest change seen (80 % power) | threshold | |",
        "|---|---|---:|---:|---:|---|",
        *rows,
        "",
        "The minimum detectable change of each test at tonight's noise (the learned one, or "
        "tonight's spread when it is larger or none is known) and repeats, at the test's level "
        "(same-run: the report's, two-sided; history: alpha / the night's history tests): the "
        "exact noncentral t (Cohen 1988, ch. 2; statsmodels).",
        "",
    ]


def _budget(s: NightlySettings) -> str:
    return (
        f"Error budget: {s.false_red_nights_per_month:g} false red night(s) "
        f"per 30 nights -> Holm across tonight's gate tests at "
        f"{s.family_alpha:.3g}; a gate needs {s.min_repeats} runs per "
        f"variant"
        + (f"; run noise stated in the config: {s.run_cv_pct:g} % CV" if s.run_cv_pct else "")
    )


def _run_tail(g: NightlyOutcome) -> list[str]:
    """Underpowered gates, the gate table with notes, the history's state, the plots."""
    results = g.results
    lines: list[str] = []
    under = [r for r in results if r.status in UNDERPOWERED]
    if under and not any(r.status == "fail" for r in results):
        lines += [
            "## Underpowered",
            "",
            "Nothing was shown to regress, but these gates could not show that nothing "
            "did (more repeats or a quieter machine would):",
            "",
        ]
        lines += [
            f"- {r.suite}.{r.metric} ({r.variant}, {r.kind.replace('_', '-')}): {r.reason}"
            for r in under
        ]
        lines.append("")
    if results:
        lines += _gate_table(results) + mde_lines(results)
    else:
        lines += ["No gates are configured (`nightly.gates` in the config).", ""]
    lines += _noise_lines(g.noise) + _change_lines(g.change_points)
    lines += _build_lines(g.builds, g.causes)
    if g.confirmation is not None:
        lines += confirm_lines(g.confirmation)
    h = g.history_info
    lines.append(
        f"History: `{h.get('path')}` · "
        f"{'recorded' if h.get('recorded') else 'NOT recorded'} · "
        f"{h.get('nights_before', 0)} earlier night(s) of this config"
    )
    if h.get("error"):
        lines.append(f"\nHistory error: {h['error']}")
    if g.plots:
        lines += ["", "Trend plots (in the run artifact): " + ", ".join(f"`{p}`" for p in g.plots)]
    return lines


def _noise_lines(rows: list[dict]) -> list[str]:
    """The noise each gated metric was judged with and the repeats the targets need at it."""
    if not rows:
        return []

    def cv(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f} %"

    lines = [
        "## Noise",
        "",
        "| metric | from | run CV | paired CV | night-to-night CV | nights | repeats needed | "
        "repeats tonight |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        need = r.get("repeats_needed")
        lines.append(
            f"| {r['suite']}.{r['metric']} | {r['source']} | {cv(r['run_cv_pct'])} | "
            f"{cv(r['pair_cv_pct'])} | {cv(r['night_cv_pct'])} | {r['nights']} | "
            f"{'more than 64' if need is None else need} | {r.get('repeats_tonight', '')} |"
        )
    lines += [
        "",
        "Repeats needed: the fewest runs a night for a gate's step (5 % for a 3 % threshold) to "
        "turn a night red within 3 nights in 90 % of cases, at this noise "
        "(`prior`: the config's `run_cv_pct`, until the history holds enough nights).",
        "",
    ]
    return lines


def _build_lines(builds: list[dict], causes: list[str]) -> list[str]:
    """What each variant ran (release, patch, state; a variant that could not run is marked) and
    the release changes named as a step's likely cause."""
    if not builds:
        return []
    lines = ["## sglang builds", "", "| variant | sglang | patch | state | detail |"]
    lines.append("|---|---|---|---|---|")
    for b in builds:
        state = b.get("state") or "stock"
        if not b.get("ran", True):
            state += " (not run)"
        lines.append(
            f"| {_cell(b['variant'])} | {_cell(b.get('sglang_release') or '?')} | "
            f"{_cell(b.get('patch') or '-')} | {_cell(state)} | {_cell(b.get('detail') or '')} |"
        )
    lines.append("")
    if causes:
        lines += ["Likely cause:", ""] + [f"- {c}" for c in causes] + [""]
    return lines


def _change_lines(points: list[dict]) -> list[str]:
    """The change points over the whole history, worse ones first."""
    if not points:
        return []
    lines = ["## Change points (whole history)", ""]
    for p in sorted(points, key=lambda p: (not p.get("worse"), p["start_utc"] or "")):
        span = (
            f"night {p['start_utc']}"
            if p["nights"] == 1
            else f"nights {p['start_utc']} .. {p['end_utc']} ({p['nights']} nights)"
        )
        if p.get("confirmed") is not None and not p["confirmed"]:
            span += ", new tonight, unconfirmed"
        what = {True: "worse", False: "better", None: "changed"}[p.get("worse")]
        d = p["after"] - p["before"]
        lines.append(
            f"- {p['suite']}.{p['metric']} ({p['variant']}): {what} by {_pct(p['size_pct'])} "
            f"({fmt(p['before'])} -> {fmt(p['after'])}, {'+' if d >= 0 else ''}{fmt(d)}), {span}"
        )
    return lines + [""]


def _gate_table(results: list[GateResult]) -> list[str]:
    """Every gate result in a table, then notes on those that did not pass cleanly."""
    lines = [
        "## Gates",
        "",
        "| gate | variant | tonight | reference | change | worst plausible | "
        "threshold | p (Holm level) | status |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        pl = (
            f"{r.p_value:.2g} ({r.level:.2g})"
            if r.p_value is not None and r.level is not None
            else "n/a"
        )
        lines.append(
            f"| {r.suite}.{r.metric} ({r.kind.replace('_', '-')}) | {r.variant} | "
            f"{_num(r.value, r.unit)} | {_num(r.reference, r.unit)} | "
            f"{_pct(r.change_pct)} | {_pct(r.bound_pct)} | {fmt(r.threshold_pct)} % "
            f"| {pl} | {_MARK.get(r.status, r.status)} |"
        )
    lines.append("")
    notes = [r for r in results if r.status in ("warn", "skipped", "missing")]
    if notes:
        lines += ["<details><summary>Notes on gates that did not pass cleanly</summary>", ""]
        lines += [
            f"- {r.suite}.{r.metric} ({r.variant}, {r.kind}): {r.status}: {r.reason}" for r in notes
        ]
        lines += ["", "</details>", ""]
    return lines


# --------------------------------------------------------------------------- a matrix's page


def _matrix_intro(night: NightSummary) -> list[str]:
    """The matrix run, then one table row per unit."""
    assert night.matrix_dir is not None
    units = night.units
    label_keys: list[str] = []
    for r in units:
        label_keys += [k for k in r.labels if k not in label_keys]
    lines = [
        f"Matrix run `{night.matrix_dir.name}` · {len(units)} unit(s) · exit code "
        f"{night.exit_code}, the worst unit's in the order "
        + " > ".join(f"{OUTCOME_OF_EXIT[c]} {c}" for c in EXIT_ORDER),
        "",
        "| unit | " + "".join(f"{_cell(k)} | " for k in label_keys) + "gpu type | run | "
        "outcome | exit | history key | details |",
        "|---|" + "---|" * len(label_keys) + "---|---|---|---:|---|---|",
    ]
    lines += [_unit_row(r, label_keys) for r in units]
    lines.append("")
    return lines


def _unit_row(r: UnitNightly, label_keys: list[str]) -> str:
    unit = f"[{r.id}]({r.summary})" if r.summary else f"`{r.id}`"
    if r.failing:
        detail = "; ".join(
            f"{f.suite}.{f.metric} ({f.variant}, {f.kind.replace('_', '-')}) {_pct(f.change_pct)}"
            for f in r.failing
        )
    else:
        detail = r.headline if r.status == "ok" else r.message.split("\n")[0][:200]
    return (
        f"| {unit} | "
        + "".join(f"{_cell(r.labels.get(k, ''))} | " for k in label_keys)
        + f"{_cell(r.gpu_type or 'any')} | {_cell(r.status)} | "
        f"{_UNIT_MARK.get(r.outcome, r.outcome)} | {r.exit_code} | `{_cell(r.key)}` | "
        f"{_cell(detail)} |"
    )


def _matrix_tail(night: NightSummary) -> list[str]:
    """The units' confirmation runs, the units that did not run ok, and links to the units'
    reports."""
    lines: list[str] = []
    confirmed = [r for r in night.units if r.confirmation]
    if confirmed:
        lines += ["## Confirmation runs", ""]
        for r in confirmed:
            c = r.confirmation or {}
            head = f"- `{r.id}`: variant `{c.get('variant')}`, sglang {c.get('old_release')} vs "
            head += f"{c.get('new_release')}: "
            if c.get("skipped"):
                lines.append(head + f"not run: {c['skipped']}")
            elif c.get("error"):
                lines.append(head + f"failed: {c['error']}")
            else:
                lines.append(head + "; ".join(x["text"] for x in c.get("results") or []))
        lines.append("")
    bad = [r for r in night.units if r.status != "ok" or r.summary is None]
    if bad:
        lines += ["## Units that did not run ok", ""]
        lines += [f"- `{r.id}`: {r.message or r.headline or r.status}" for r in bad]
        lines.append("")
    links = [r for r in night.units if r.report]
    if links:
        lines.append(
            "Reports: " + ", ".join(f"[{r.id}]({r.report})" for r in links) + " · matrix "
            "report: [report.md](report.md)"
        )
    return lines
