"""The nightly pipeline: a night is a list of :class:`NightUnit` (a single run: one; a matrix: one
per unit, :mod:`patchbench.nightly.matrix_night`); :func:`run_night` records each unit's run
folder in the history, evaluates its gates and writes its ``nightly.md``, ``nightly.json`` and
trend plots there. :func:`nightly_on_run` is the night of one run folder, :func:`run_and_gate`
runs a config first (``patchbench nightly CONFIG``). Everything is read through the typed
readers (manifest, compare.json, cells, ``matrix.json``).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.analysis.comparison import Comparison, read_comparison
from patchbench.config.nightly import NightlySettings
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
)
from patchbench.matrix.record import read_matrix_record
from patchbench.nightly.builds import (
    BuildRow,
    blocked,
    blocked_exit,
    blocked_line,
    check_patches,
    night_builds,
    rows_of_run,
    without_variants,
)
from patchbench.nightly.changepoints import confirm_by_run, detect_history
from patchbench.nightly.gates import (
    UNDERPOWERED,
    GateResult,
    evaluate,
    night_outcome,
    same_machine,
)
from patchbench.nightly.history import (
    History,
    HistoryError,
    Night,
    dump_json,
    night_builds_of,
    night_from_run,
    read_red,
    record_change_points,
    record_confirmation,
    record_noise,
    record_red,
)
from patchbench.nightly.noise import learn
from patchbench.nightly.render import (
    OUTCOME_OF_EXIT,
    NightlyOutcome,
    NightSummary,
    UnitNightly,
    fmt,
    render_markdown,
    worst_exit,
)
from patchbench.nightly.story import Story, tell
from patchbench.nightly.trend import write_plots
from patchbench.records import printable, write_json, write_text
from patchbench.run.lock import RunLock
from patchbench.runfolder import RunFolderError, read_manifest

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


# ---------------------------------------------------------------------------------------------
# matrix units in the history


def matrix_unit_id(run_dir: str | os.PathLike) -> str | None:
    """The unit id when ``run_dir`` is a unit folder of a matrix run (``<matrix run>/<unit id>/``
    whose parent's ``matrix.json`` lists that id, patchbench.matrix), else None."""
    run = Path(run_dir)
    try:
        rec = read_matrix_record(run.parent)
    except (OSError, ValueError):
        return None
    return run.name if rec.unit(run.name) is not None else None


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
# what a night gates, and what it found


@dataclass
class NightUnit:
    """One unit of a night: its run folder (``has_folder`` False: none), ``settings`` (None:
    invalid, ``settings_error`` says why), ``compare_settings`` (for compare.json when missing;
    None: the run's own), the matrix ``unit_id`` (keys its nights ``<config>@<unit id>``) with
    ``config_name``, ``labels``, ``gpu_type``, ``status``, ``run_exit_code``, ``message`` from
    matrix.json, ``run_problems`` the runner reported (exit 4), the ``blocked`` variants whose
    patch does not apply (exit 2) and the ``schedule.repeats: auto`` choice (``repeats``).
    """

    run_dir: Path
    settings: NightlySettings | None
    compare_settings: Any = None
    unit_id: str | None = None
    has_folder: bool = True
    config_name: str = "?"
    labels: dict[str, Any] = field(default_factory=dict)
    gpu_type: str | None = None
    status: str = "ok"
    run_exit_code: int | None = None
    message: str = ""
    settings_error: str | None = None
    run_problems: list[str] = field(default_factory=list)
    blocked: list[BuildRow] = field(default_factory=list)
    repeats: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------------
# the pipeline


def run_night(
    units: Sequence[NightUnit],
    *,
    history: str | os.PathLike | None = None,
    record: bool = True,
    out: Any = None,
    announce: bool = False,
) -> list[UnitNightly]:
    """Gate every unit of a night (:func:`gate_unit`), in order; one :class:`UnitNightly` each.

    history: the SQLite path of every unit (default: :func:`history_path` of the unit's
    settings); record: append each night to the history; announce: print a line naming each unit
    before it is gated (a matrix night)."""
    out = out or sys.stdout
    return [gate_unit(u, history=history, record=record, out=out, announce=announce) for u in units]


def gate_unit(
    unit: NightUnit,
    *,
    history: str | os.PathLike | None = None,
    record: bool = True,
    out: Any = None,
    announce: bool = False,
) -> UnitNightly:
    """Gate one unit: a unit without settings is a config error (2), one without a run folder a
    run failure (4, or 3 / 2 when its bench ended so); otherwise its folder is recorded and
    gated, with nightly.md, nightly.json and the trend plots written there, and a run that did
    not end ok counts as a run failure too. Never raises for a history problem."""
    out = out or sys.stdout
    uid = unit.unit_id or unit.run_dir.name
    row = UnitNightly(
        id=uid,
        key=history_key(unit.config_name, uid),
        labels=dict(unit.labels),
        gpu_type=unit.gpu_type,
        status=unit.status,
        run_exit_code=unit.run_exit_code,
        exit_code=EXIT_OK,
        outcome="green",
        headline="",
        message=unit.message,
        report=f"{uid}/report.md" if (unit.run_dir / "report.md").is_file() else None,
    )
    if unit.settings is None:
        row.exit_code = EXIT_USAGE
        row.outcome = OUTCOME_OF_EXIT[EXIT_USAGE]
        row.headline = unit.settings_error or "no nightly settings"
        row.message = "; ".join(x for x in (row.message, unit.settings_error) if x)
        print(f"nightly: unit {uid}: {row.headline}", file=out)
        return row
    if not unit.has_folder:
        ok = unit.status == "ok"
        row.exit_code = EXIT_RUN_FAILED if ok else _not_run_code(unit.run_exit_code)
        row.outcome = OUTCOME_OF_EXIT[row.exit_code]
        row.headline = "RUN FOLDER MISSING" if ok else "NOT RUN"
        if ok:
            row.message = f"{unit.run_dir}: no manifest.json (the unit's run folder is missing)"
        print(f"nightly: unit {uid}: {row.headline}: {row.message}", file=out)
        return row
    if announce:
        print(f"nightly: unit {uid}:", file=out)
    hpath = Path(history) if history else history_path(unit.settings)
    res = row.gated = _gate_run(unit, hpath, record)
    code = res.exit_code
    if unit.status != "ok":
        code = worst_exit([code, _not_run_code(unit.run_exit_code)])
    row.exit_code = code
    row.failing = [r for r in res.results if r.status == "fail"]
    row.outcome = "red" if row.failing else OUTCOME_OF_EXIT.get(code, "run failed")
    if row.outcome == "green" and res.outcome in ("learning", "no gates"):
        row.outcome = res.outcome
    row.headline = res.headline
    if res.night is not None:
        row.key = res.night.config_name
        _write_outputs(unit.run_dir, row, out)
        row.summary = f"{uid}/nightly.md"
    return row


def _not_run_code(run_exit_code: int | None) -> int:
    return run_exit_code if run_exit_code in (EXIT_ENV, EXIT_USAGE) else EXIT_RUN_FAILED


def _ensure_compare(run_dir: Path, compare_settings: Any) -> tuple[Comparison | None, str | None]:
    """The run's typed compare.json, made by :func:`patchbench.analysis.build.compare_run` when
    missing; (it, None) or (None, why there is none)."""
    path = run_dir / "compare.json"
    if not path.is_file():
        from patchbench.analysis.build import compare_run
        from patchbench.analysis.comparison import CompareSettings

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
        return read_comparison(path), None
    except RunFolderError as e:
        return None, f"{path}: unreadable: {e}"


def _gate_run(unit: NightUnit, hpath: Path, record: bool) -> NightlyOutcome:
    """Record the unit's run folder in the history at ``hpath``, evaluate the gates and draw
    RUN/plots/nightly-*.png (the outcome's ``night`` is None when the folder cannot be read)."""
    run, settings = unit.run_dir, unit.settings
    assert settings is not None
    problems = list(unit.run_problems)
    comparison, cmp_err = _ensure_compare(run, unit.compare_settings)
    if cmp_err:
        problems.append(cmp_err)
    host = comparison.run.host if comparison is not None else None
    problems += [f"GPU: {w}" for w in (host.gpu_warnings if host is not None else [])]
    try:
        tonight = night_from_run(run, comparison)
    except (OSError, ValueError) as e:
        print(f"nightly: cannot read the run folder: {e}", file=sys.stderr)
        return NightlyOutcome(
            EXIT_RUN_FAILED, [], None, problems=problems + [str(e)], outcome="failed"
        )
    key_night(tonight, unit.unit_id)
    problems += tonight.problems
    if not tonight.values:
        problems.append(f"{run}: no metrics in the run folder (no summary.json with status ok)")
    prior, hinfo = _record_and_read(run, hpath, tonight, settings, record, problems)
    # gates: with no history, the same-run gates still run (history gates are then skipped)
    results = evaluate(prior, tonight, settings)
    if hinfo["error"]:
        for r in results:
            if r.kind == "history" and r.status == "skipped":
                r.reason = "history unavailable (see problems)"
    plots, plot_problems = (
        write_plots(run, prior, tonight, results, settings) if results else ([], [])
    )
    problems += plot_problems
    # the history gates' noise and the change points: this machine's nights only
    noise_rows = noise_table(same_machine(prior, tonight), results, settings)
    try:
        points = change_points(same_machine(prior, tonight), tonight, results)
    except ImportError as e:  # ruptures missing from this environment
        points = []
        problems.append(f"change points not computed: {e} (make setup installs ruptures)")
    if hinfo["recorded"] and not hinfo["error"]:
        try:
            with History(hpath, timeout_s=settings.lock_timeout_s) as h:
                record_noise(h, tonight.config_name, tonight.run_id, noise_rows)
                record_change_points(h, tonight.config_name, tonight.run_id, points)
        except HistoryError as e:
            problems.append(f"could not store the learned noise and change points: {e}")
    failed_run = bool(unit.run_problems or tonight.problems or cmp_err or not tonight.values)
    code, headline = _exit_of(results, failed_run, bool(hinfo["error"]))
    builds, causes = night_builds(
        [*rows_of_run(unit.run_dir), *unit.blocked],
        tonight,
        prior,
        results,
        points,
        None if hinfo["error"] else hpath,
        settings.lock_timeout_s,
        record=bool(hinfo["recorded"]),
        problems=problems,
    )
    story = _story(results, tonight, prior, noise_rows, builds, hpath, settings, hinfo, problems)
    if story.lines or (story.learning and code == EXIT_OK):
        headline += f": {story.summary()}"
    code, headline = blocked_exit(code, headline, unit.blocked)
    return NightlyOutcome(
        code,
        results,
        tonight,
        problems=problems,
        outcome=night_outcome(results),
        headline=headline,
        history_info=hinfo,
        plots=plots,
        settings=settings,
        noise=noise_rows,
        change_points=points,
        builds=builds,
        causes=causes,
        blocked=[blocked_line(r) for r in unit.blocked],
        repeats=unit.repeats,
        story=story.to_json(),
    )


def _story(
    results: list[GateResult],
    tonight: Night,
    prior: Sequence[Night],
    noise_rows: list[dict[str, Any]],
    builds: list[dict[str, Any]],
    hpath: Path,
    settings: NightlySettings,
    hinfo: dict[str, Any],
    problems: list[str],
) -> Story:
    """Tonight's red story (:func:`patchbench.nightly.story.tell`) from the failing gates the
    history holds, and tonight's failing gates stored there (when tonight was recorded). A
    history problem is added to ``problems``; the story then starts tonight."""
    red: dict[str, list[dict]] = {}
    yesterday: list[dict] = []
    ok = not hinfo["error"]
    if ok:
        try:
            with History(hpath, timeout_s=settings.lock_timeout_s) as h:
                red = read_red(h, tonight.config_name)
                if prior:
                    yesterday = night_builds_of(h, prior[-1].run_id)
        except HistoryError as e:
            problems.append(f"could not read the earlier red nights: {e}")
            ok = False
    night_cv = {(r["suite"], r["metric"]): r.get("night_cv_pct") for r in noise_rows}
    story = tell(
        results, tonight, prior, red, night_cv_pct=night_cv, builds=builds,
        builds_yesterday=yesterday, learn_min_nights=settings.learn_min_nights,
    )  # fmt: skip
    if ok and hinfo["recorded"]:
        try:
            with History(hpath, timeout_s=settings.lock_timeout_s) as h:
                record_red(h, tonight.config_name, tonight.run_id, [x.row() for x in story.lines])
        except HistoryError as e:
            problems.append(f"could not store tonight's red gates: {e}")
    return story


def noise_table(
    prior: Sequence[Night], results: Sequence[GateResult], settings: NightlySettings
) -> list[dict[str, Any]]:
    """The noise of every gated (suite, metric) as the gates used it
    (:func:`patchbench.nightly.noise.learn` on the nights before tonight; :meth:`Noise.to_json`), with
    ``repeats_needed`` (the most any of its tests needs; None when one cannot reach the targets)
    and ``repeats`` tonight (the most runs of its tests)."""
    rows = []
    for suite, metric in sorted({(r.suite, r.metric) for r in results if r.status != "missing"}):
        n = learn(
            prior,
            suite,
            metric,
            prior_cv_pct=settings.run_cv_pct,
            min_nights=settings.learn_min_nights,
        )
        if n is None:
            continue
        mine = [r for r in results if (r.suite, r.metric) == (suite, metric) and r.noise_source]
        needs = [r.repeats_needed for r in mine if r.p_value is not None]
        row = n.to_json()
        row["repeats_needed"] = (
            None if not needs or any(x is None for x in needs) else max(needs)  # type: ignore[type-var]
        )
        row["repeats_tonight"] = max((r.n for r in mine), default=0)
        rows.append(row)
    return rows


def change_points(
    prior: Sequence[Night], tonight: Night, results: Sequence[GateResult]
) -> list[dict[str, Any]]:
    """Change points over the whole history and tonight (:func:`patchbench.nightly.changepoints.
    detect_history`) of every (variant, suite, metric) a gate looked at."""
    keys = sorted({(r.variant, r.suite, r.metric) for r in results if r.variant != "*"})
    better = {(r.suite, r.metric): r.better for r in results if r.better}
    nights = [*prior, tonight] if tonight.values else list(prior)
    return [c.to_json() for c in detect_history(nights, keys, better)]  # type: ignore[arg-type]


def _record_and_read(
    run: Path,
    hpath: Path,
    tonight: Night,
    settings: NightlySettings,
    record: bool,
    problems: list[str],
) -> tuple[list[Night], dict[str, Any]]:
    """Append tonight to the history (``record``) and read the nights before it that the gates
    need; (those nights, the history's state). A history problem is added to ``problems`` (with
    the command that appends ``run``'s night later) and to the state's ``error``; nothing is
    raised."""
    hinfo: dict[str, Any] = {
        "path": str(hpath),
        "recorded": False,
        "nights_before": 0,
        "error": None,
    }
    prior: list[Night] = []
    try:
        with History(hpath, timeout_s=settings.lock_timeout_s) as h:
            if record and tonight.values:
                added = h.record(tonight)
                hinfo["recorded"] = True
                hinfo["already_recorded"] = not added
            # every night: the noise and the change points are learned from the whole history
            prior = h.nights(
                tonight.config_name, before_utc=tonight.night_utc, exclude_run_id=tonight.run_id
            )
            hinfo["nights_before"] = len(prior)
    except HistoryError as e:
        hinfo["error"] = str(e)
        problems.append(
            f"history unavailable: {e}. Tonight's results are kept in {run}; append "
            f"them later with: patchbench nightly --record-only {run} --history {hpath}"
        )
    return prior, hinfo


def add_confirmation(res: NightlyOutcome, conf: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Add a confirmation run (``conf``: :meth:`patchbench.nightly.confirm.Confirmation.to_json`,
    ``rows``: its history rows) to a gated night: rewrite its nightly.md / nightly.json and
    store the rows in the history (a history problem is added to the night's problems)."""
    assert res.night is not None and res.settings is not None and res.night.run_dir
    res.confirmation = conf
    # a change on tonight alone is confirmed by the confirmation run that confirmed its metric
    marked = confirm_by_run(res.change_points, rows, res.night.run_id)
    hpath = res.history_info.get("path")
    if hpath and rows and res.history_info.get("recorded") and not res.history_info.get("error"):
        try:
            with History(hpath, timeout_s=res.settings.lock_timeout_s) as h:
                record_confirmation(h, res.night.config_name, res.night.run_id, rows)
                if marked:
                    record_change_points(
                        h, res.night.config_name, res.night.run_id, res.change_points
                    )
        except HistoryError as e:
            res.problems.append(f"could not store the confirmation run: {e}")
    run = Path(res.night.run_dir)
    row = UnitNightly(
        id=run.name, key=res.night.config_name, labels={}, gpu_type=None, status="ok",
        run_exit_code=None, exit_code=res.exit_code, outcome=res.outcome, headline=res.headline,
        failing=[r for r in res.results if r.status == "fail"], gated=res,
    )  # fmt: skip
    _write_files(run, row)


def _exit_of(results: list[GateResult], failed_run: bool, history_failed: bool) -> tuple[int, str]:
    """(exit code, headline) of one run's night, worst first: the run failed (4), the history
    is unavailable (3), a gate's metric is missing (2), red (1), underpowered (5), green (0)."""
    failing = [r for r in results if r.status == "fail"]
    outcome = night_outcome(results)
    if failed_run:
        code, headline = EXIT_RUN_FAILED, "RUN FAILED"
    elif history_failed:
        code, headline = EXIT_ENV, "HISTORY UNAVAILABLE"
    elif any(r.status == "missing" for r in results):
        code, headline = EXIT_USAGE, "GATE CONFIG ERROR"
    elif outcome == "red":
        code, headline = EXIT_REGRESSION, f"REGRESSION ({len(failing)} gate result(s) failed)"
    elif outcome == "learning":
        held = [r for r in results if r.status == "learning"]
        code = EXIT_OK
        headline = (
            f"LEARNING (no red until the noise is learned, unless beyond doubt; {len(held)} "
            f"gate result(s) would have failed)"
        )
    elif outcome == "underpowered":
        n = sum(1 for r in results if r.status in UNDERPOWERED)
        code = EXIT_UNDERPOWERED
        headline = (
            f"UNDERPOWERED (no regression shown, {n} gate result(s) underpowered, "
            f"inconclusive or ungated)"
        )
    elif outcome == "no gates":
        code, headline = EXIT_OK, "NO GATES (nothing was checked: nightly.gates in the config)"
    else:
        code, headline = EXIT_OK, "no regression"
    if failing and code != EXIT_REGRESSION:
        headline += f", and {len(failing)} regression(s)"
    return code, headline


def _write_outputs(run: Path, row: UnitNightly, out: Any) -> None:
    """RUN/nightly.md and RUN/nightly.json of a gated unit (their paths set on ``row.gated``),
    and the console lines: the headline, each regression, each problem."""
    _write_files(run, row)
    res = row.gated
    assert res is not None
    print(f"nightly: {res.headline} (exit {res.exit_code}); summary {res.summary_path}", file=out)
    for r in row.failing:
        print(
            f"  REGRESSION {r.suite}.{r.metric} [{r.variant}, {r.kind}]: {fmt(r.value)} {r.unit}"
            f" vs {fmt(r.reference)} {r.unit}: {r.reason}",
            file=out,
        )
    for x in (res.story or {}).get("lines") or []:
        print(f"  {x['text']}", file=out)
    for line in [*res.blocked, *res.causes]:
        print(f"  {line}", file=out)
    for p in res.problems:
        print(f"  problem: {p.splitlines()[0]}", file=out)


def _write_files(run: Path, row: UnitNightly) -> None:
    """RUN/nightly.md and RUN/nightly.json of a gated unit (their paths set on ``row.gated``)."""
    res = row.gated
    assert res is not None and res.night is not None and res.settings is not None
    tonight, settings, failing = res.night, res.settings, row.failing
    page = NightSummary(tonight.config_name, res.exit_code, res.headline, [row])
    res.summary_path = write_text(run / "nightly.md", printable(render_markdown(page)))
    res.json_path = write_json(
        run / "nightly.json",
        {
            "schema": NIGHTLY_SCHEMA,
            "run_id": tonight.run_id,
            "night_utc": tonight.night_utc,
            "config_name": tonight.config_name,
            "git_sha": tonight.git_sha,
            "exit_code": res.exit_code,
            "outcome": res.outcome,
            "headline": res.headline,
            "history": res.history_info,
            "settings": settings.model_dump(mode="json"),
            "family_alpha": settings.family_alpha,
            "failing": [r.to_json() for r in failing],
            "gates": [r.to_json() for r in res.results],
            "problems": res.problems,
            "plots": res.plots,
            "noise": res.noise,
            "change_points": res.change_points,
            "builds": res.builds,
            "likely_causes": res.causes,
            "blocked": res.blocked,
            "confirmation": res.confirmation,
            "story": res.story,
            "night": dump_json(tonight),
        }
        | ({"repeats": res.repeats} if res.repeats is not None else {}),
    )


# ---------------------------------------------------------------------------------------------
# one run folder


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
    blocked: Sequence[BuildRow] = (),
    repeats: dict[str, Any] | None = None,
) -> NightlyOutcome:
    """The night of one finished run folder (:func:`run_night` of one :class:`NightUnit`):
    recorded in the history at ``history`` (default :func:`history_path`), gated, RUN/nightly.md,
    nightly.json and plots/nightly-*.png written. ``unit_id``: default found by
    :func:`matrix_unit_id`; the other arguments fill the unit. Never raises for a history
    problem: the night stays in the folder and ``--record-only RUN_DIR`` appends it later.
    """
    run = Path(run_dir)
    unit = NightUnit(
        run,
        settings,
        compare_settings,
        unit_id=unit_id or matrix_unit_id(run),
        run_problems=list(run_problems),
        blocked=list(blocked),
        repeats=repeats,
    )
    [row] = run_night([unit], history=history, record=record, out=out)
    assert row.gated is not None
    return row.gated


def record_only(
    run_dir: str | os.PathLike,
    history: str | os.PathLike,
    timeout_s: float = 10.0,
    out: Any = None,
    unit_id: str | None = None,
) -> int:
    """Append a finished run folder to the history (no gates). Exit 0, or 3 (history error),
    2 (a run id that cannot name a folder), 4 (the folder holds no metrics). A matrix unit's
    folder (``unit_id``, default found by :func:`matrix_unit_id`) is keyed
    ``<config name>@<unit id>`` as :func:`nightly_on_run` does."""
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
        what = "history unavailable" if e.exit_code == EXIT_ENV else e.kind
        print(f"nightly: {what} (exit {e.exit_code}): {e}", file=sys.stderr)
        return e.exit_code
    print(
        f"nightly: {'recorded' if added else 'already recorded'} {night.run_id} "
        f"({len(night.values)} metric series) in {history}",
        file=out,
    )
    return EXIT_OK


class RunNotFinished(RunFailed):
    """``--record-only`` / ``--from-run`` of a run folder whose run has not ended: its manifest
    has no ``ended_at`` (a run still going, or one killed before its end: resume it first), or
    there is no manifest (exit 4, "run not finished")."""

    kind = "run not finished"


def hold_finished_run(run_dir: Path) -> RunLock | None:
    """Take ``run_dir``'s lock (:func:`patchbench.run.lock.acquire`, purpose "nightly": a report
    holding it is waited for) and check that its run ended (the manifest's ``ended_at``, which
    ``bench`` writes when its measurements end, after a signal or a write failure too); the
    lock, to release once the night is recorded and gated, or None for a folder this user
    cannot write (an archive: no run can write it either). Raises RunFolderBusy (exit 4) naming
    a live run or report that holds it, :class:`RunNotFinished` (exit 4)."""
    from patchbench.run.lock import REPORT_WAIT_S, acquire

    lock = (
        acquire(run_dir, purpose="nightly", wait_s=REPORT_WAIT_S)
        if os.access(run_dir, os.W_OK)
        else None
    )
    try:
        if not (run_dir / "manifest.json").is_file():
            raise RunNotFinished(f"{run_dir}: no manifest.json: not a run folder bench wrote")
        try:
            ended = read_manifest(run_dir).ended_at
        except RunFolderError as e:
            raise RunNotFinished(f"{run_dir}: its manifest is unreadable: {e}") from None
        if not ended:
            raise RunNotFinished(
                f"{run_dir}: the run has not ended (its manifest has no ended_at): it was killed "
                f"before its end; finish it with `patchbench bench CONFIG --resume {run_dir}`, "
                "then record or gate it"
            )
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def settings_from_manifest(run_dir: Path) -> NightlySettings | None:
    """The ``nightly`` section of the config a run folder ran with (its typed manifest), or None
    when the manifest cannot be read or has none."""
    try:
        cfg = read_manifest(run_dir).config
    except RunFolderError:
        return None
    if cfg is not None and "nightly" in cfg.model_fields_set:
        return NightlySettings.model_validate(cfg.nightly)
    return None


# ---------------------------------------------------------------------------------------------
# a config: run it, then gate it


def run_and_gate(
    cfg: Any, *, history: Path, run_bench: Callable[[Any], Path], out: Any = None
) -> int:
    """``patchbench nightly CONFIG``: resolve the builds and check the patches
    (:func:`check_builds`), choose the repeats (``schedule.repeats: auto``,
    :func:`patchbench.nightly.repeats.pick_repeats`), run the config with ``run_bench``
    (:class:`patchbench.config.Config` -> run folder, e.g. ``patchbench.run.bench.run_bench``),
    gate the run folder with the history at ``history``, and run the confirmation of a red night
    on a new build. A run that fails is gated on the folder it left (exit 4); a config or
    environment problem exits 2 / 3 before anything runs. Returns the exit code."""
    from patchbench.nightly.confirm import maybe_confirm
    from patchbench.nightly.repeats import pick_repeats

    out = out or sys.stdout
    settings: NightlySettings = cfg.nightly
    plan = None
    if cfg.schedule.auto:
        try:
            plan, cfg = pick_repeats(cfg, history, out=out)
        except ValueError as e:
            print(f"nightly: {cfg.source}: schedule.repeats: auto: {e}", file=sys.stderr)
            return EXIT_USAGE
    checked = check_builds(cfg)
    if isinstance(checked, int):
        return checked
    cfg, blocked_rows = checked
    run_problems: list[str] = []
    try:
        run_dir = run_bench(cfg)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 (reported, never hides the verdict)
        if isinstance(e, EnvironmentNotReady):
            print(f"nightly: environment not ready: {e}", file=sys.stderr)
            return EXIT_ENV
        if isinstance(e, (ConfigError, PatchError)):
            print(f"nightly: {e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"nightly: the run failed: {type(e).__name__}: {e}", file=sys.stderr)
        if not isinstance(e, RunFailed):
            traceback.print_exc()
        run_dir = getattr(e, "run_dir", None)
        if not run_dir or not Path(run_dir).is_dir():
            return EXIT_RUN_FAILED
        run_problems.append(f"the run failed: {type(e).__name__}: {e}")
    outcome = nightly_on_run(
        run_dir,
        settings,
        history=history,
        compare_settings=cfg.compare,
        run_problems=run_problems,
        out=out,
        blocked=blocked_rows,
        repeats=plan.to_json() if plan is not None else None,
    )
    conf = maybe_confirm(cfg, outcome, run_bench, out)
    if conf is not None:
        add_confirmation(outcome, conf.to_json(), conf.rows())
    return outcome.exit_code


def check_builds(cfg: Any) -> tuple[Any, list[BuildRow]] | int:
    """Before a night runs: resolve each variant's build (``latest`` to a release) and check its
    patches there (:func:`patchbench.nightly.builds.check_patches`). A variant whose patch
    conflicts or is already upstream cannot run: the night runs a copy of the config without it
    (:func:`patchbench.nightly.builds.without_variants`) and says so. Returns (the config to run,
    the blocked rows), or the exit code when nothing can run (3: no environment or index; 2: a
    config error, or the baseline's patch is blocked)."""
    from patchbench.envs.builds import resolve_builds
    from patchbench.run.variants import is_cpu

    try:
        resolve_builds(cfg, cpu=is_cpu(cfg))
    except EnvironmentNotReady as e:
        print(f"nightly: environment not ready: {e}", file=sys.stderr)
        return EXIT_ENV
    except (ConfigError, PatchError) as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_USAGE
    bad = blocked(check_patches(cfg))
    if not bad:
        return cfg, []
    for r in bad:
        print(f"nightly: {blocked_line(r)}", file=sys.stderr)
    try:
        return without_variants(cfg, sorted({r.variant for r in bad})), bad
    except ValueError as e:
        print(f"nightly: nothing can run tonight: {e}", file=sys.stderr)
        return EXIT_USAGE
