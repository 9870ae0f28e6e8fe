"""The nightly regression job: run a config, append it to the history, evaluate the gates.

``patchbench nightly CONFIG [--history PATH]``        run the config, record, gate (CI's command)
``patchbench nightly --from-run RUN_DIR [CONFIG]``     the same on a finished run folder (no run)
``patchbench nightly --record-only RUN_DIR [CONFIG]``  only append a finished run (e.g. after the
                                                       history was locked or corrupt that night)

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.errors import (
    EXIT_ENV,
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_UNDERPOWERED,
    EXIT_USAGE,
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
    """compare.json of the run, made by patchbench.compare.compare_run when missing."""
    path = run_dir / "compare.json"
    if not path.is_file():
        try:
            from patchbench import compare as cmp
        except ImportError as e:
            return None, f"no compare.json and patchbench.compare cannot be imported ({e})"
        try:
            settings = compare_settings  # None: the run's own compare: section
            if isinstance(settings, dict):
                model = getattr(cmp, "CompareSettings", None)
                settings = model.model_validate(settings) if model else None
            cmp.compare_run(run_dir, settings)
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
) -> NightlyOutcome:
    """Record a finished run folder in the history, evaluate the gates, write the outputs.

    run_dir: the run folder (docs/CONTRACTS.md); history: the SQLite path (default
    :func:`history_path`); compare_settings: for compare_run when compare.json is missing;
    run_problems: failures the runner reported (they make the exit code 4).
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
    run_dir: str | os.PathLike, history: str | os.PathLike, timeout_s: float = 10.0, out: Any = None
) -> int:
    """Append a finished run folder to the history (no gates). Exit 0, or 3 (history error),
    4 (the folder holds no metrics)."""
    out = out or sys.stdout
    try:
        night = night_from_run(run_dir)
    except (OSError, ValueError) as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
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


def _load(config: str) -> tuple[Any, NightlySettings]:
    from patchbench.config import load_config

    cfg = load_config(config)
    return cfg, NightlySettings.model_validate(cfg.nightly or {})


def cli(argv: list[str]) -> int:
    """``patchbench nightly ...`` (see the module docstring). Returns the exit code."""
    p = argparse.ArgumentParser(prog="patchbench nightly", description=__doc__.split("\n")[0])
    p.add_argument("config", nargs="?", help="the experiment config (YAML)")
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
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code else EXIT_OK
    from patchbench.config import ConfigError

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
        p.print_usage(sys.stderr)
        print(
            "runner.py nightly: give a CONFIG (or --from-run / --record-only RUN_DIR)",
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
        patch_error = getattr(bench, "PatchProblem", None)
        if isinstance(e, ConfigError) or (patch_error is not None and isinstance(e, patch_error)):
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
]
