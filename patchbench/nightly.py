"""The nightly regression job: run a config, append it to the history, evaluate the gates.

``patchbench nightly CONFIG [--history PATH]``        run the config, record, gate (CI's command)
``patchbench nightly --from-run RUN_DIR [CONFIG]``     the same on a finished run folder (no run)
``patchbench nightly --record-only RUN_DIR [CONFIG]``  only append a finished run (e.g. after the
                                                       history was locked or corrupt that night)
``patchbench nightly MATRIX.yaml [--on local|ray] [--address ADDR] [--results DIR]``
                                                       run a matrix (patchbench/matrix.py), then
                                                       the job on every unit; one summary
``--from-run`` / ``--record-only`` also take a matrix run folder (every unit).

A matrix unit's nights are keyed ``<config name>@<unit id>`` in the history (unit ids are stable
across matrix runs); the matrix night's exit code is the worst unit's in :data:`EXIT_ORDER`
(a regression first, unlike one config's order below: see there).

The gates themselves (settings, tests, Holm across the night, outcomes) live in
patchbench/gates.py; the trend plots in patchbench/trend.py; the SQLite history in
patchbench/history.py. docs/nightly.md explains the error budget.

Exit codes (patchbench/errors.py), worst first: 4 the run failed (an exception of the runner,
failed cells, no comparison), 3 the environment is not ready or the history cannot be used,
2 bad usage or config (including a gate whose metric the run does not produce), 1 a gate found a
regression (red night), 5 underpowered (nothing failed, but a gated metric stayed inconclusive or
the night had too few repeats to gate), 0 green (every gate shown not regressed, or waiting for
history). The summary always lists every gate, so a night that exits 3 or 4 still shows the
regressions it could see.

Outputs in the run folder: ``nightly.md`` (for $GITHUB_STEP_SUMMARY), ``nightly.json``
(dashboards), ``plots/nightly-<suite>.<metric>.png`` (trend per gated metric).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patchbench.config import load_config
from patchbench.errors import (
    EXIT_ENV,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_UNDERPOWERED,
    EXIT_USAGE,
    ConfigError,
    EnvironmentNotReady,
    PatchError,
    RunFailed,
    UsageError,
)
from patchbench.gates import (
    DEFAULT_HISTORY,
    Gate,
    GateResult,
    NightlySettings,
    evaluate,
    night_outcome,
)
from patchbench.history import History, HistoryError, Night, dump_json, night_from_run
from patchbench.matrix.driver import run_matrix
from patchbench.matrix.spec import is_matrix_file, load_matrix
from patchbench.records import read_json, write_json, write_text
from patchbench.trend import plot_trend, write_plots

HISTORY_ENV = "PATCHBENCH_HISTORY"
NIGHTLY_SCHEMA = 2
"""nightly.json schema: 2 added ``outcome``, per-gate ``p_value``/``level``/``bound_pct``/``test``/``n``
and removed ``ci_low_pct``/``ci_high_pct``/``band_*`` (version 1)."""


def history_path(settings: NightlySettings, cli_path: str | None = None) -> Path:
    """Where the history lives: ``--history`` > $PATCHBENCH_HISTORY > ``nightly.history_path``.

    ``~`` and ``$VARS`` are expanded; a relative path is taken from the current directory.
    """
    raw = cli_path or os.environ.get(HISTORY_ENV) or settings.history_path
    return Path(os.path.expandvars(os.path.expanduser(raw))).absolute()


def _fmt(x: float | None, nd: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}g}"


def _num(x: float | None, unit: str) -> str:
    """A value with its unit ("90 tok/s"), or "n/a"."""
    return f"{_fmt(x)} {unit}".rstrip() if x is not None else "n/a"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


def night_from_compare(
    compare: dict, *, config_name: str | None = None, night_utc: str | None = None
) -> Night:
    """A :class:`Night` from a compare.json dict alone (values = the repeats it lists)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / str(compare.get("run_id") or "run")
        run.mkdir()
        n = night_from_run(run, compare=compare)
    n.run_dir = None
    if config_name:
        n.config_name = config_name
    if night_utc:
        n.night_utc = night_utc
    return n


# ---------------------------------------------------------------------------------------------
# outputs

_MARK = {
    "fail": "❌ fail",
    "warn": "⚠️ warn",
    "pass": "✅ pass",
    "inconclusive": "❔ inconclusive",
    "ungated": "➖ ungated",
    "skipped": "⏳ skipped",
    "missing": "⛔ missing",
}


def render_markdown(
    tonight: Night,
    results: list[GateResult],
    *,
    exit_code: int,
    headline: str,
    history_info: dict,
    problems: list[str],
    plots: list[str],
    settings: NightlySettings | None = None,
) -> str:
    """nightly.md: the verdict first, failing gates with their numbers, then every gate."""
    failing = [r for r in results if r.status == "fail"]
    lines = [f"# Nightly {tonight.config_name}: {headline}", ""]
    lines.append(
        f"Run `{tonight.run_id}` · night {tonight.night_utc} · commit "
        f"`{(tonight.git_sha or 'unknown')[:12]}` · sglang {tonight.sglang_version or '?'}"
        f" · exit code {exit_code}"
    )
    lines.append("")
    if settings is not None:
        lines.append(
            f"Error budget: {settings.false_red_nights_per_month:g} false red night(s) "
            f"per 30 nights -> Holm across tonight's gate tests at "
            f"{settings.family_alpha:.3g}; a gate needs {settings.min_repeats} runs per "
            f"variant"
            + (
                f"; run noise stated in the config: {settings.run_cv_pct:g} % CV"
                if settings.run_cv_pct
                else ""
            )
        )
        lines.append("")
    if problems:
        lines += ["## Problems", ""] + [f"- {p}" for p in problems] + [""]
    if failing:
        lines += ["## Regressions", ""]
        for r in failing:
            lines.append(
                f"- **{r.suite}.{r.metric}** ({r.variant}, {r.kind.replace('_', '-')}): "
                f"{_num(r.value, r.unit)} vs {_num(r.reference, r.unit)}; {r.reason}"
            )
        lines.append("")
    under = [r for r in results if r.status in ("inconclusive", "ungated")]
    if under and not failing:
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
        lines += [
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
                f"{_pct(r.change_pct)} | {_pct(r.bound_pct)} | {_fmt(r.threshold_pct)} % "
                f"| {pl} | {_MARK.get(r.status, r.status)} |"
            )
        lines.append("")
        notes = [r for r in results if r.status in ("warn", "skipped", "missing")]
        if notes:
            lines += ["<details><summary>Notes on gates that did not pass cleanly</summary>", ""]
            lines += [
                f"- {r.suite}.{r.metric} ({r.variant}, {r.kind}): {r.status}: {r.reason}"
                for r in notes
            ]
            lines += ["", "</details>", ""]
    else:
        lines += ["No gates are configured (`nightly.gates` in the config).", ""]
    lines.append(
        f"History: `{history_info.get('path')}` · "
        f"{'recorded' if history_info.get('recorded') else 'NOT recorded'} · "
        f"{history_info.get('nights_before', 0)} earlier night(s) of this config"
    )
    if history_info.get("error"):
        lines.append(f"\nHistory error: {history_info['error']}")
    if plots:
        lines += ["", "Trend plots (in the run artifact): " + ", ".join(f"`{p}`" for p in plots)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# matrix units in the history


def matrix_unit_id(run_dir: str | os.PathLike) -> str | None:
    """The unit id when ``run_dir`` is a unit folder of a matrix run (``<matrix run>/<unit id>/``
    whose parent's ``matrix.json`` lists that id, patchbench/matrix.py), else None."""
    run = Path(run_dir)
    try:
        man = read_json(run.parent / "matrix.json")
    except (OSError, ValueError):
        return None
    units = man.get("units") if isinstance(man, dict) else None
    ids = {u.get("id") for u in units or [] if isinstance(u, dict)}
    return run.name if run.name in ids else None


def history_key(config_name: str, unit_id: str) -> str:
    """The history's config key of a matrix unit: ``<config name>@<unit id>`` (unit ids are
    stable across matrix runs, so each unit's nights form one series)."""
    return f"{config_name}@{unit_id}"


def key_night(night: Night, unit_id: str | None) -> Night:
    """Key ``night`` as matrix unit ``unit_id`` (no-op for None or a night already keyed):
    ``config_name`` becomes ``<config name>@<unit id>``, and ``run_id`` gets the same
    ``@<unit id>`` suffix so two units of one config started in the same second (the run id is
    ``<UTC stamp>-<config name>``) stay two nights. Returns ``night`` (changed in place)."""
    if unit_id:
        suffix = f"@{unit_id}"
        if not night.config_name.endswith(suffix):
            night.config_name = history_key(night.config_name, unit_id)
        if not night.run_id.endswith(suffix):
            night.run_id += suffix
    return night


# ---------------------------------------------------------------------------------------------
# the job


@dataclass
class NightlyOutcome:
    """What :func:`nightly_on_run` did: exit code, night outcome (red / underpowered / green),
    gate results, the files it wrote."""

    exit_code: int
    results: list[GateResult]
    night: Night | None
    summary_path: Path | None = None
    json_path: Path | None = None
    problems: list[str] = field(default_factory=list)
    outcome: str = "green"


def _settings_from_manifest(run_dir: Path) -> NightlySettings | None:
    try:
        m = read_json(run_dir / "manifest.json")
    except (OSError, ValueError):
        return None
    cfg = m.get("config") if isinstance(m, dict) else None
    if isinstance(cfg, dict) and isinstance(cfg.get("nightly"), dict):
        return NightlySettings.model_validate(cfg["nightly"])
    return None


def _ensure_compare(run_dir: Path, compare_settings: Any) -> tuple[dict | None, str | None]:
    """compare.json of the run, made by :func:`patchbench.analysis.compare_run` when missing;
    (its JSON, None) or (None, why there is none)."""
    path = run_dir / "compare.json"
    if not path.is_file():
        from patchbench.analysis import compare_run
        from patchbench.comparison import CompareSettings

        try:
            settings = compare_settings  # None: the run's own compare: section
            if isinstance(settings, dict):
                settings = CompareSettings.model_validate(settings)
            compare_run(run_dir, settings)
        except Exception as e:  # noqa: BLE001 (reported, never hides the verdict)
            return None, (
                f"no compare.json, and compare_run failed: {type(e).__name__}: {e}\n"
                + traceback.format_exc(limit=3)
            )
        if not path.is_file():
            return None, "compare_run did not write compare.json"
    try:
        return read_json(path), None
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable: {e}"


def nightly_on_run(
    run_dir: str | os.PathLike,
    settings: NightlySettings,
    *,
    history: str | os.PathLike | None = None,
    compare_settings: Any = None,
    record: bool = True,
    run_problems: Sequence[str] = (),
    out: Any = None,
    unit_id: str | None = None,
) -> NightlyOutcome:
    """Record a finished run folder in the history, evaluate the gates, write the outputs.

    run_dir: the run folder (docs/CONTRACTS.md); history: the SQLite path (default
    :func:`history_path`); compare_settings: for compare_run when compare.json is missing;
    run_problems: failures the runner reported (they make the exit code 4); unit_id: the matrix
    unit this folder is (default: found by :func:`matrix_unit_id`): its nights are keyed
    ``<config name>@<unit id>`` in the history (:func:`key_night`).
    Writes RUN/nightly.md, RUN/nightly.json, RUN/plots/nightly-*.png. Never raises for a history
    problem: the night stays in the folder and ``--record-only RUN_DIR`` appends it later.
    """
    out = out or sys.stdout
    run = Path(run_dir)
    problems = list(run_problems)
    hpath = Path(history) if history else history_path(settings)
    compare, cmp_err = _ensure_compare(run, compare_settings)
    if cmp_err:
        problems.append(cmp_err)
    try:
        tonight = night_from_run(run, compare=compare)
    except (OSError, ValueError) as e:
        print(f"nightly: cannot read the run folder: {e}", file=sys.stderr)
        return NightlyOutcome(
            EXIT_RUN_FAILED, [], None, problems=problems + [str(e)], outcome="failed"
        )
    key_night(tonight, unit_id or matrix_unit_id(run))
    problems += tonight.problems
    if not tonight.values:
        problems.append(f"{run}: no metrics in the run folder (no summary.json with status ok)")
    hinfo: dict[str, Any] = {
        "path": str(hpath),
        "recorded": False,
        "nights_before": 0,
        "error": None,
    }
    prior: list[Night] = []
    history_failed = False
    try:
        with History(hpath, timeout_s=settings.lock_timeout_s) as h:
            if record and tonight.values:
                added = h.record(tonight)
                hinfo["recorded"] = True
                hinfo["already_recorded"] = not added
            longest = max([g.consecutive_nights for g in settings.gates] or [1])
            prior = h.nights(
                tonight.config_name,
                before_utc=tonight.night_utc,
                exclude_run_id=tonight.run_id,
                limit=max(settings.window_nights + longest, 60),
            )
            hinfo["nights_before"] = len(prior)
    except HistoryError as e:
        history_failed = True
        hinfo["error"] = str(e)
        problems.append(
            f"history unavailable: {e}. Tonight's results are kept in {run}; append "
            f"them later with: patchbench nightly --record-only {run} --history {hpath}"
        )
    # gates: with no history, the same-run gates still run (history gates are then skipped)
    results = evaluate(prior, tonight, settings)
    if history_failed:
        for r in results:
            if r.kind == "history" and r.status == "skipped":
                r.reason = "history unavailable (see problems)"
    plots, plot_problems = (
        write_plots(run, prior, tonight, results, settings) if results else ([], [])
    )
    problems += plot_problems
    failing = [r for r in results if r.status == "fail"]
    missing = [r for r in results if r.status == "missing"]
    outcome = night_outcome(results)
    run_failed = bool(run_problems) or bool(tonight.problems) or bool(cmp_err) or not tonight.values
    if run_failed:
        code, headline = EXIT_RUN_FAILED, "RUN FAILED"
    elif history_failed:
        code, headline = EXIT_ENV, "HISTORY UNAVAILABLE"
    elif missing:
        code, headline = EXIT_USAGE, "GATE CONFIG ERROR"
    elif outcome == "red":
        code, headline = EXIT_REGRESSION, f"REGRESSION ({len(failing)} gate result(s) failed)"
    elif outcome == "underpowered":
        n = sum(1 for r in results if r.status in ("inconclusive", "ungated"))
        code, headline = (
            EXIT_UNDERPOWERED,
            (f"UNDERPOWERED (no regression shown, {n} gate result(s) inconclusive or ungated)"),
        )
    else:
        code, headline = EXIT_OK, "no regression"
    if failing and code != EXIT_REGRESSION:
        headline += f", and {len(failing)} regression(s)"
    md = render_markdown(
        tonight,
        results,
        exit_code=code,
        headline=headline,
        history_info=hinfo,
        problems=problems,
        plots=plots,
        settings=settings,
    )
    summary_path = write_text(run / "nightly.md", md)
    json_path = write_json(
        run / "nightly.json",
        {
            "schema": NIGHTLY_SCHEMA,
            "run_id": tonight.run_id,
            "night_utc": tonight.night_utc,
            "config_name": tonight.config_name,
            "git_sha": tonight.git_sha,
            "exit_code": code,
            "outcome": outcome,
            "headline": headline,
            "history": hinfo,
            "settings": settings.model_dump(mode="json"),
            "family_alpha": settings.family_alpha,
            "failing": [r.to_json() for r in failing],
            "gates": [r.to_json() for r in results],
            "problems": problems,
            "plots": plots,
            "night": dump_json(tonight),
        },
    )
    print(f"nightly: {headline} (exit {code}); summary {summary_path}", file=out)
    for r in failing:
        print(
            f"  REGRESSION {r.suite}.{r.metric} [{r.variant}, {r.kind}]: {_fmt(r.value)} {r.unit}"
            f" vs {_fmt(r.reference)} {r.unit}: {r.reason}",
            file=out,
        )
    for p in problems:
        print(f"  problem: {p.splitlines()[0]}", file=out)
    return NightlyOutcome(code, results, tonight, summary_path, json_path, problems, outcome)


def record_only(
    run_dir: str | os.PathLike,
    history: str | os.PathLike,
    timeout_s: float = 10.0,
    out: Any = None,
    unit_id: str | None = None,
) -> int:
    """Append a finished run folder to the history (no gates). Exit 0, or 3 (history error),
    4 (the folder holds no metrics). A matrix unit's folder (``unit_id``, default found by
    :func:`matrix_unit_id`) is keyed ``<config name>@<unit id>`` as :func:`nightly_on_run` does."""
    out = out or sys.stdout
    try:
        night = night_from_run(run_dir)
    except (OSError, ValueError) as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    key_night(night, unit_id or matrix_unit_id(run_dir))
    if not night.values:
        print(
            f"nightly: {run_dir}: no metrics to record (no summary.json with status ok)",
            file=sys.stderr,
        )
        return EXIT_RUN_FAILED
    try:
        with History(history, timeout_s=timeout_s) as h:
            added = h.record(night)
    except HistoryError as e:
        print(f"nightly: history unavailable: {e}", file=sys.stderr)
        return EXIT_ENV
    print(
        f"nightly: {'recorded' if added else 'already recorded'} {night.run_id} "
        f"({len(night.values)} metric series) in {history}",
        file=out,
    )
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# nightly over a matrix

MATRIX_NIGHTLY_SCHEMA = 1
"""The matrix run folder's nightly.json (``"kind": "matrix"``; each unit's own nightly.json keeps
:data:`NIGHTLY_SCHEMA`)."""

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

_UNIT_MARK = {
    "red": "❌ red",
    "run failed": "💥 run failed",
    "environment not ready": "🔧 environment not ready",
    "config error": "⛔ config error",
    "underpowered": "❔ underpowered",
    "green": "✅ green",
}


def worst_exit(codes: Sequence[int]) -> int:
    """The worst of ``codes`` in :data:`EXIT_ORDER` (0 for none); a code not in it counts as 4."""
    known = [c if c in EXIT_ORDER else EXIT_RUN_FAILED for c in codes]
    return min(known, key=EXIT_ORDER.index) if known else EXIT_OK


@dataclass
class UnitNightly:
    """One unit of a matrix night (a row of the matrix nightly.md, ``units[]`` of its json).

    ``status``/``run_exit_code``/``message``: the unit's run, from matrix.json; ``exit_code``:
    the unit's nightly exit code (what its own nightly.md says; for a unit that did not run, 4,
    or 3 / 2 when its bench ended so); ``outcome``: red when any gate of the unit failed,
    otherwise the word of ``exit_code`` (:data:`OUTCOME_OF_EXIT`); ``key``: its history key;
    ``failing``: its failing gate results (GateResult.to_json()); ``summary``/``report``: paths
    relative to the matrix run folder, None when absent."""

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
    failing: list[dict] = field(default_factory=list)
    summary: str | None = None
    report: str | None = None

    @property
    def rank_code(self) -> int:
        """The code this unit adds to the matrix's: 1 when a gate failed, else ``exit_code``."""
        return EXIT_REGRESSION if self.outcome == "red" else self.exit_code


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


def _unit_section_settings(
    matrix_dir: Path, uid: str
) -> tuple[NightlySettings | None, Any, str | None]:
    """The nightly settings and compare section a unit ran with, from
    ``configs/<unit id>.yaml`` of the matrix run (else the unit's manifest, else defaults);
    (settings, compare section, error line)."""
    import yaml
    from pydantic import ValidationError

    path = matrix_dir / "configs" / f"{uid}.yaml"
    raw: Any = None
    if path.is_file():
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            return None, None, f"{path}: unreadable: {str(e).splitlines()[0]}"
    if isinstance(raw, dict):
        try:
            return (
                NightlySettings.model_validate(raw.get("nightly") or {}),
                raw.get("compare"),
                None,
            )
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in ("nightly", *err["loc"]))
            return None, None, f"{path}: key {where}: {err['msg']}"
    return _settings_from_manifest(matrix_dir / uid) or NightlySettings(), None, None


def _not_run_code(run_exit_code: int | None) -> int:
    return run_exit_code if run_exit_code in (EXIT_ENV, EXIT_USAGE) else EXIT_RUN_FAILED


def nightly_on_matrix_run(
    matrix_dir: str | os.PathLike,
    *,
    settings: dict[str, NightlySettings] | None = None,
    compare_settings: dict[str, Any] | None = None,
    history: str | os.PathLike | None = None,
    record: bool = True,
    out: Any = None,
) -> MatrixNightlyOutcome:
    """Run the nightly job on every unit of a finished matrix run folder and write one summary.

    matrix_dir: ``results/<stamp>-<name>/`` (patchbench/matrix.py: ``matrix.json``, one folder
    per unit id, ``configs/<unit id>.yaml``). settings / compare_settings: {unit id: value}
    (default: from each unit's ``configs/<unit id>.yaml``). history: the SQLite path for every
    unit (default: :func:`history_path` of the unit's settings). Each unit with a run folder gets
    :func:`nightly_on_run` (its nightly.md / nightly.json in its folder), keyed
    ``<config name>@<unit id>`` in the history; a unit whose run did not end ok also counts as a
    run failure (exit 4, or 3 / 2 when its bench ended so), and one without a folder is listed
    with its status and message, never left out. Writes MATRIX/nightly.md and
    MATRIX/nightly.json; the exit code is the worst unit's in :data:`EXIT_ORDER`.

    Raises FileNotFoundError / ValueError when ``matrix.json`` is missing or unreadable.
    """
    out = out or sys.stdout
    mdir = Path(matrix_dir)
    man = read_json(mdir / "matrix.json")
    if not isinstance(man, dict) or not isinstance(man.get("units"), list):
        raise ValueError(f"{mdir / 'matrix.json'}: no units list (not a matrix run folder)")
    settings = settings or {}
    compare_settings = compare_settings or {}
    units: list[UnitNightly] = []
    for u in man["units"]:
        uid = str(u.get("id"))
        status = str(u.get("status") or "pending")
        run_code = u.get("exit_code")
        message = str(u.get("message") or "")
        udir = mdir / uid
        row = UnitNightly(
            id=uid,
            key=history_key(str(u.get("config_name") or "?"), uid),
            labels=dict(u.get("labels") or {}),
            gpu_type=u.get("gpu_type"),
            status=status,
            run_exit_code=run_code,
            exit_code=EXIT_OK,
            outcome="green",
            headline="",
            message=message,
            report=f"{uid}/report.md" if (udir / "report.md").is_file() else None,
        )
        units.append(row)
        s, cmp_section, err = (
            (settings[uid], compare_settings.get(uid), None)
            if uid in settings
            else _unit_section_settings(mdir, uid)
        )
        if status != "ok":
            line = f"the unit's run ended {status}" + (
                f" (bench exit {run_code})" if run_code is not None else ""
            )
            row.message = f"{line}: {message}" if message else line
        if s is None:
            row.exit_code = EXIT_USAGE
            row.outcome, row.headline = OUTCOME_OF_EXIT[EXIT_USAGE], err or "no nightly settings"
            row.message = "; ".join(x for x in (row.message, err) if x)
            print(f"nightly: unit {uid}: {row.headline}", file=out)
            continue
        if not (udir / "manifest.json").is_file():
            row.exit_code = _not_run_code(run_code) if status != "ok" else EXIT_RUN_FAILED
            row.outcome = OUTCOME_OF_EXIT[row.exit_code]
            row.headline = "NOT RUN" if status != "ok" else "RUN FOLDER MISSING"
            if status == "ok":
                row.message = f"{udir}: no manifest.json (the unit's run folder is missing)"
            print(f"nightly: unit {uid}: {row.headline}: {row.message}", file=out)
            continue
        print(f"nightly: unit {uid}:", file=out)
        res = nightly_on_run(
            udir,
            s,
            history=history or history_path(s),
            compare_settings=cmp_section,
            record=record,
            run_problems=[row.message] if status != "ok" else [],
            out=out,
            unit_id=uid,
        )
        if res.night is not None:
            row.key = res.night.config_name
        code = res.exit_code
        if status != "ok":
            code = worst_exit([code, _not_run_code(run_code)])
        row.exit_code = code
        row.failing = [r.to_json() for r in res.results if r.status == "fail"]
        row.outcome = "red" if row.failing else OUTCOME_OF_EXIT.get(code, "run failed")
        try:
            row.headline = str(read_json(udir / "nightly.json").get("headline") or "")
        except (OSError, ValueError):
            row.headline = ""
        row.summary = f"{uid}/nightly.md" if res.summary_path else None
    code = worst_exit([r.rank_code for r in units])
    counts: dict[str, int] = {}
    for r in units:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    tally = ", ".join(f"{n} {w}" for w, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    worst_word = OUTCOME_OF_EXIT[code]
    n_worst = sum(1 for r in units if r.rank_code == code)
    headline = (
        f"no regression in {len(units)} unit(s)"
        if code == EXIT_OK
        else f"{worst_word.upper() if code != 1 else 'REGRESSION'} in {n_worst} of "
        f"{len(units)} unit(s) ({tally})"
    )
    if not units:
        code, headline = EXIT_RUN_FAILED, "the matrix run has no units"
    name = str(man.get("name") or mdir.name)
    md = render_matrix_markdown(name, mdir, units, code, headline)
    summary = write_text(mdir / "nightly.md", md)
    js = write_json(
        mdir / "nightly.json",
        {
            "schema": MATRIX_NIGHTLY_SCHEMA,
            "kind": "matrix",
            "matrix": name,
            "matrix_dir": str(mdir.resolve()),
            "exit_code": code,
            "outcome": OUTCOME_OF_EXIT.get(code, "run failed"),
            "headline": headline,
            "exit_order": list(EXIT_ORDER),
            "units": [asdict(r) for r in units],
        },
    )
    print(f"nightly matrix {name}: {headline} (exit {code}); summary {summary}", file=out)
    return MatrixNightlyOutcome(
        code, OUTCOME_OF_EXIT.get(code, "run failed"), headline, mdir, units, summary, js
    )


def _cell(x: Any) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def render_matrix_markdown(
    name: str, matrix_dir: Path, units: list[UnitNightly], exit_code: int, headline: str
) -> str:
    """The matrix run folder's nightly.md: the verdict, one row per unit (outcome, exit code,
    history key, link to its nightly.md), then each red unit's failing gates with their
    numbers and each unit that did not run ok with its message."""
    label_keys: list[str] = []
    for r in units:
        label_keys += [k for k in r.labels if k not in label_keys]
    lines = [f"# Nightly matrix {name}: {headline}", ""]
    lines.append(
        f"Matrix run `{matrix_dir.name}` · {len(units)} unit(s) · exit code {exit_code}, the "
        "worst unit's in the order " + " > ".join(f"{OUTCOME_OF_EXIT[c]} {c}" for c in EXIT_ORDER)
    )
    lines += [
        "",
        "| unit | " + "".join(f"{_cell(k)} | " for k in label_keys) + "gpu type | run | "
        "outcome | exit | history key | details |",
        "|---|" + "---|" * len(label_keys) + "---|---|---|---:|---|---|",
    ]
    for r in units:
        unit = f"[{r.id}]({r.summary})" if r.summary else f"`{r.id}`"
        if r.failing:
            detail = "; ".join(
                f"{f['suite']}.{f['metric']} ({f['variant']}, {f['kind'].replace('_', '-')}) "
                f"{_pct(f.get('change_pct'))}"
                for f in r.failing
            )
        else:
            detail = r.headline if r.status == "ok" else r.message.split("\n")[0][:200]
        lines.append(
            f"| {unit} | "
            + "".join(f"{_cell(r.labels.get(k, ''))} | " for k in label_keys)
            + f"{_cell(r.gpu_type or 'any')} | {_cell(r.status)} | "
            f"{_UNIT_MARK.get(r.outcome, r.outcome)} | {r.exit_code} | `{_cell(r.key)}` | "
            f"{_cell(detail)} |"
        )
    lines.append("")
    red = [r for r in units if r.failing]
    if red:
        lines += ["## Regressions", ""]
        for r in red:
            for f in r.failing:
                lines.append(
                    f"- `{r.id}`: **{f['suite']}.{f['metric']}** ({f['variant']}, "
                    f"{f['kind'].replace('_', '-')}): {_num(f.get('value'), f.get('unit', ''))}"
                    f" vs {_num(f.get('reference'), f.get('unit', ''))}; {f.get('reason', '')}"
                )
        lines.append("")
    bad = [r for r in units if r.status != "ok" or r.summary is None]
    if bad:
        lines += ["## Units that did not run ok", ""]
        lines += [f"- `{r.id}`: {r.message or r.headline or r.status}" for r in bad]
        lines.append("")
    links = [r for r in units if r.report]
    if links:
        lines.append(
            "Reports: " + ", ".join(f"[{r.id}]({r.report})" for r in links) + " · matrix "
            "report: [report.md](report.md)"
        )
    return "\n".join(lines) + "\n"


def nightly_matrix(
    path: str | os.PathLike,
    *,
    on: str = "local",
    address: str | None = None,
    results: str | os.PathLike | None = None,
    history: str | os.PathLike | None = None,
    executor: Any = None,
    out: Any = None,
    **executor_kw: Any,
) -> MatrixNightlyOutcome:
    """``patchbench nightly MATRIX.yaml``: run the matrix (:func:`patchbench.matrix.run_matrix`,
    ``on`` "local" or "ray" at ``address``, or ``executor``), then :func:`nightly_on_matrix_run`
    on its folder with each unit's own ``nightly``/``compare`` sections. Units that did not end
    ok are gated on what they left and listed as failed.

    Raises ConfigError (exit 2) for a bad matrix, EnvironmentNotReady (3) when Ray is missing,
    Interrupted (130/143) on Ctrl-C / SIGTERM (finished units kept, nothing gated).
    """
    m = load_matrix(path)
    try:
        mdir = run_matrix(path, on, address, results=results, executor=executor, **executor_kw)
    except RunFailed as e:
        if not e.run_dir:
            raise
        mdir = Path(e.run_dir)
    return nightly_on_matrix_run(
        mdir,
        settings={u.id: u.config.nightly for u in m.units},
        compare_settings={u.id: u.config.compare for u in m.units},
        history=history,
        out=out,
    )


def record_only_matrix(
    matrix_dir: str | os.PathLike, history: str | os.PathLike | None, out: Any = None
) -> int:
    """``--record-only MATRIX_RUN_DIR``: append every unit folder of a matrix run to the history,
    each under its key; the worst exit code of :func:`record_only` (units without a folder are
    named and count as 4)."""
    mdir = Path(matrix_dir)
    codes = []
    for u in read_json(mdir / "matrix.json").get("units", []):
        uid = str(u.get("id"))
        if not (mdir / uid / "manifest.json").is_file():
            print(
                f"nightly: unit {uid}: no run folder to record ({u.get('status')})", file=sys.stderr
            )
            codes.append(EXIT_RUN_FAILED)
            continue
        s, _, err = _unit_section_settings(mdir, uid)
        if s is None:
            print(f"nightly: unit {uid}: {err}", file=sys.stderr)
            codes.append(EXIT_USAGE)
            continue
        codes.append(
            record_only(mdir / uid, history or history_path(s), s.lock_timeout_s, out, unit_id=uid)
        )
    return worst_exit(codes)


def _load(config: str) -> tuple[Any, NightlySettings]:
    cfg = load_config(config)
    return cfg, NightlySettings.model_validate(cfg.nightly or {})


def add_matrix_arguments(p: argparse.ArgumentParser) -> None:
    """The options ``patchbench nightly`` takes for a matrix file (as ``patchbench matrix``)."""
    p.add_argument(
        "--on",
        choices=("local", "ray"),
        help="a matrix: local runs the units one after another here (default); ray: one Ray "
        "task per unit",
    )
    p.add_argument("--address", help="a matrix on Ray: the cluster (default: RAY_ADDRESS or local)")
    p.add_argument(
        "--results",
        metavar="DIR",
        help="a matrix: parent of the matrix run folder (default results/)",
    )


def _matrix_cli(a: argparse.Namespace) -> int | None:
    """The matrix forms of ``patchbench nightly`` (a matrix file, or ``--from-run`` /
    ``--record-only`` of a matrix run folder); None when the arguments are not about a matrix."""
    folder = a.from_run or a.record_only
    matrix_folder = bool(folder) and (Path(folder) / "matrix.json").is_file()
    try:
        is_matrix = bool(a.config) and is_matrix_file(a.config)
    except ConfigError as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_USAGE
    matrix_opts = [
        o for o, v in (("--on", a.on), ("--address", a.address), ("--results", a.results)) if v
    ]
    if not is_matrix and not matrix_folder:
        if matrix_opts:
            print(
                f"nightly: {', '.join(matrix_opts)}: only for a matrix file (a config with "
                "axes/units/base, patchbench/matrix.py)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return None
    try:
        m = load_matrix(a.config) if is_matrix else None
        if folder and matrix_opts:
            raise ConfigError(f"{', '.join(matrix_opts)}: not with --from-run / --record-only")
        if a.config and not is_matrix:
            raise ConfigError(
                f"{folder} is a matrix run folder: give its matrix file or no config, not "
                f"{a.config}"
            )
        if matrix_folder and a.record_only:
            return record_only_matrix(folder, a.history)
        if matrix_folder:
            return nightly_on_matrix_run(
                folder,
                settings={u.id: u.config.nightly for u in m.units} if m else None,
                compare_settings={u.id: u.config.compare for u in m.units} if m else None,
                history=a.history,
            ).exit_code
        if folder:
            raise ConfigError(
                f"{a.config} is a matrix file, but {folder} is no matrix run folder "
                "(no matrix.json)"
            )
        return nightly_matrix(
            a.config, on=a.on or "local", address=a.address, results=a.results, history=a.history
        ).exit_code
    except UsageError as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentNotReady as e:
        print(f"nightly: environment not ready: {e}", file=sys.stderr)
        return EXIT_ENV
    except (OSError, ValueError) as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``patchbench nightly`` (the one command line, patchbench/cli.py, uses
    these too)."""
    p.add_argument("config", nargs="?", help="the experiment config or a matrix file (YAML)")
    p.add_argument(
        "--history",
        help=f"SQLite history file (default: ${HISTORY_ENV}, else the "
        f"config's nightly.history_path, else {DEFAULT_HISTORY})",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument("--from-run", metavar="RUN_DIR", help="gate a finished run folder; run nothing")
    g.add_argument(
        "--record-only", metavar="RUN_DIR", help="only append a finished run folder to the history"
    )
    add_matrix_arguments(p)


def cli(argv: list[str]) -> int:
    """``patchbench nightly ...`` from raw arguments (see the module docstring); the exit code."""
    p = argparse.ArgumentParser(prog="patchbench nightly", description=__doc__.split("\n")[0])
    add_arguments(p)
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    return run_args(a)


def run_args(a: argparse.Namespace) -> int:
    """``patchbench nightly`` from parsed arguments (:func:`add_arguments`); the exit code."""
    matrix_code = _matrix_cli(a)
    if matrix_code is not None:
        return matrix_code
    cfg = None
    settings: NightlySettings | None = None
    if a.config:
        try:
            cfg, settings = _load(a.config)
        except ConfigError as e:
            print(f"nightly: {e}", file=sys.stderr)
            return EXIT_USAGE
    folder = a.from_run or a.record_only
    if folder:
        if not Path(folder).is_dir():
            print(f"nightly: {folder}: no such run folder", file=sys.stderr)
            return EXIT_USAGE
        settings = settings or _settings_from_manifest(Path(folder)) or NightlySettings()
        hpath = history_path(settings, a.history)
        if a.record_only:
            return record_only(folder, hpath, settings.lock_timeout_s)
        return nightly_on_run(
            folder, settings, history=hpath, compare_settings=cfg.compare if cfg else None
        ).exit_code
    if not a.config:
        print(
            "patchbench nightly: give a CONFIG (or --from-run / --record-only RUN_DIR)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    assert settings is not None and cfg is not None
    hpath = history_path(settings, a.history)
    try:
        from patchbench import bench
    except ImportError as e:
        print(f"nightly: the runner (patchbench.bench) cannot be imported: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    env_error = getattr(bench, "EnvironmentNotReady", None)
    run_error = getattr(bench, "RunFailed", None)
    run_problems: list[str] = []
    try:
        run_dir = bench.run_bench(a.config)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 (reported, never hides the verdict)
        if env_error is not None and isinstance(e, env_error):
            print(f"nightly: environment not ready: {e}", file=sys.stderr)
            return EXIT_ENV
        if isinstance(e, (ConfigError, PatchError)):
            print(f"nightly: {e}", file=sys.stderr)
            return EXIT_USAGE
        known = run_error is not None and isinstance(e, run_error)
        print(f"nightly: the run failed: {type(e).__name__}: {e}", file=sys.stderr)
        if not known:
            traceback.print_exc()
        run_dir = getattr(e, "run_dir", None)
        if not run_dir or not Path(run_dir).is_dir():
            return EXIT_RUN_FAILED
        run_problems.append(f"the run failed: {type(e).__name__}: {e}")
    outcome = nightly_on_run(
        run_dir, settings, history=hpath, compare_settings=cfg.compare, run_problems=run_problems
    )
    return outcome.exit_code


__all__ = [
    "NightlySettings",
    "Gate",
    "GateResult",
    "NightlyOutcome",
    "evaluate",
    "nightly_on_run",
    "record_only",
    "history_path",
    "plot_trend",
    "render_markdown",
    "night_from_compare",
    "cli",
    "DEFAULT_HISTORY",
    "HISTORY_ENV",
    "NIGHTLY_SCHEMA",
    "MATRIX_NIGHTLY_SCHEMA",
    "EXIT_ORDER",
    "MatrixNightlyOutcome",
    "UnitNightly",
    "history_key",
    "key_night",
    "matrix_unit_id",
    "nightly_matrix",
    "nightly_on_matrix_run",
    "record_only_matrix",
    "worst_exit",
]
