"""The nightly job on a matrix run folder: one night unit per matrix unit (:func:`matrix_units`),
gated by :func:`patchbench.nightly.job.run_night`, and one summary over the units (the matrix
folder's ``nightly.md`` / ``nightly.json``, :func:`nightly_on_matrix_run`); ``--record-only`` of
a matrix run (:func:`record_only_matrix`); ``patchbench nightly MATRIX.yaml``
(:func:`nightly_matrix`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from patchbench.config.nightly import NightlySettings
from patchbench.errors import (
    EXIT_OK,
    EXIT_REGRESSION,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    ConfigError,
    RunFailed,
)
from patchbench.matrix.record import UnitRecord, read_matrix_record
from patchbench.nightly.builds import BuildRow, blocked_line
from patchbench.nightly.job import (
    NightUnit,
    add_confirmation,
    history_path,
    record_only,
    run_night,
    settings_from_manifest,
)
from patchbench.nightly.render import (
    EXIT_ORDER,
    OUTCOME_OF_EXIT,
    MatrixNightlyOutcome,
    NightSummary,
    UnitNightly,
    render_markdown,
    worst_exit,
)
from patchbench.records import printable, write_json, write_text

MATRIX_NIGHTLY_SCHEMA = 1
"""The matrix run folder's nightly.json (``"kind": "matrix"``; each unit's own nightly.json keeps
:data:`patchbench.nightly.job.NIGHTLY_SCHEMA`)."""


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
    return settings_from_manifest(matrix_dir / uid) or NightlySettings(), None, None


def matrix_units(
    matrix_dir: Path,
    units: Sequence[UnitRecord],
    settings: dict[str, NightlySettings],
    compare_settings: dict[str, Any],
    blocked: dict[str, list[BuildRow]] | None = None,
) -> list[NightUnit]:
    """The night's unit of every matrix unit: its folder, its settings (``settings`` /
    ``compare_settings`` by unit id, else :func:`_unit_section_settings`), how its run ended
    (a run that did not end ok carries that as a run problem) and the variants its patches kept
    from running (``blocked`` by unit id, :func:`check_matrix_patches`)."""
    out = []
    for u in units:
        if u.id in settings:
            s, cmp_section, err = settings[u.id], compare_settings.get(u.id), None
        else:
            s, cmp_section, err = _unit_section_settings(matrix_dir, u.id)
        message = u.message
        if u.status != "ok":
            line = f"the unit's run ended {u.status}" + (
                f" (bench exit {u.exit_code})" if u.exit_code is not None else ""
            )
            message = f"{line}: {message}" if message else line
        out.append(
            NightUnit(
                matrix_dir / u.id,
                s,
                cmp_section,
                unit_id=u.id,
                has_folder=(matrix_dir / u.id / "manifest.json").is_file(),
                config_name=u.config_name or "?",
                labels=u.labels,
                gpu_type=u.gpu_type,
                status=u.status,
                run_exit_code=u.exit_code,
                message=message,
                settings_error=err,
                run_problems=[message] if u.status != "ok" else [],
                blocked=list((blocked or {}).get(u.id, [])),
            )
        )
    return out


def nightly_on_matrix_run(
    matrix_dir: str | os.PathLike,
    *,
    settings: dict[str, NightlySettings] | None = None,
    compare_settings: dict[str, Any] | None = None,
    history: str | os.PathLike | None = None,
    record: bool = True,
    out: Any = None,
    blocked: dict[str, list[BuildRow]] | None = None,
    confirm: dict[str, Any] | None = None,
    run_bench: Any = None,
    not_here: str = "",
) -> MatrixNightlyOutcome:
    """Gate every unit of a finished matrix run folder (``matrix.json``, one folder per unit id,
    ``configs/<unit id>.yaml``) and write MATRIX/nightly.md and nightly.json; the exit code is the
    worst unit's in :data:`EXIT_ORDER`.

    settings / compare_settings: {unit id: section} (default: each unit's
    ``configs/<unit id>.yaml``); history: the SQLite path of every unit (default: each unit's
    :func:`history_path`). A unit is keyed ``<config name>@<unit id>``; one whose run did not
    end ok also counts as a run failure, one without a folder is listed, never left out.
    blocked: {unit id: rows of its variants a patch kept from running} (exit 2). confirm: {unit
    id: its Config}: a red unit's confirmation, run with ``run_bench`` (Config -> run folder) or,
    with None, planned and said why not here (``not_here``). Raises FileNotFoundError /
    ValueError when ``matrix.json`` is missing or unreadable."""
    out = out or sys.stdout
    mdir = Path(matrix_dir)
    rec = read_matrix_record(mdir)
    units = matrix_units(mdir, rec.units, settings or {}, compare_settings or {}, blocked)
    rows = run_night(units, history=history, record=record, out=out, announce=True)
    for r in rows:
        if confirm and r.id in confirm:
            _confirm_unit(confirm[r.id], r, run_bench, not_here, out)
    code, headline = _matrix_verdict(rows)
    name = rec.name or mdir.name
    summary = NightSummary(name, code, headline, rows, matrix_dir=mdir)
    md_path = write_text(mdir / "nightly.md", printable(render_markdown(summary)))
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
            "units": [r.to_json() for r in rows],
        },
    )
    print(f"nightly matrix {name}: {headline} (exit {code}); summary {md_path}", file=out)
    return MatrixNightlyOutcome(
        code, OUTCOME_OF_EXIT.get(code, "run failed"), headline, mdir, rows, md_path, js
    )


def _confirm_unit(cfg: Any, row: UnitNightly, run_bench: Any, not_here: str, out: Any) -> None:
    """A red unit's confirmation (:func:`patchbench.nightly.confirm.maybe_confirm` with the
    unit's merged config ``cfg``), added to its own nightly.md / nightly.json and the history,
    and kept on the row for the matrix summary."""
    from patchbench.nightly.confirm import maybe_confirm

    res = row.gated
    if res is None or res.night is None or res.outcome != "red":
        return
    print(f"nightly: unit {row.id}: confirmation", file=out)
    conf = maybe_confirm(cfg, res, run_bench, out, not_here)
    if conf is None:
        return
    add_confirmation(res, conf.to_json(), conf.rows())
    row.confirmation = conf.to_json()


def check_matrix_patches(m: Any, out: Any = None) -> dict[str, list[BuildRow]]:
    """Before a matrix night runs: every unit's named patches checked on its pin
    (:func:`patchbench.nightly.builds.check_patches`), each state printed to ``out``. A unit
    variant whose patch conflicts or is already upstream cannot run: the unit (``m``'s, changed
    in place: its config) leaves it out, so the unit runs
    stock and the rest, and its night exits 2 as a single night does. Returns {unit id: its
    blocked rows}. Raises ConfigError (exit 2, before anything runs) when a unit's baseline is
    blocked."""
    from patchbench.nightly.builds import blocked, check_patches, without_variants

    out = out or sys.stdout
    found: dict[str, list[BuildRow]] = {}
    for u in m.units:
        rows = check_patches(u.config, release=u.sglang)
        for r in rows:
            if r.patch:
                print(f"nightly: unit {u.id}: sglang {u.sglang}: {r.summary}", file=out)
        bad = blocked(rows)
        if not bad:
            continue
        for r in bad:
            print(f"nightly: unit {u.id}: {blocked_line(r)}", file=out)
        drop = sorted({r.variant for r in bad})
        try:
            u.config = without_variants(u.config, drop)
        except ValueError as e:
            raise ConfigError(
                f"unit {u.id}: nothing can run tonight: {e} ({blocked_line(bad[0])})"
            ) from None
        found[u.id] = bad
    return found


def _matrix_verdict(rows: list[UnitNightly]) -> tuple[int, str]:
    """(exit code, headline) of a matrix night: the worst unit's code in :data:`EXIT_ORDER`,
    the number of units that have it and a tally of the outcomes."""
    if not rows:
        return EXIT_RUN_FAILED, "the matrix run has no units"
    code = worst_exit([r.rank_code for r in rows])
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    tally = ", ".join(f"{n} {w}" for w, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    if code == EXIT_OK:
        return code, f"no regression in {len(rows)} unit(s)"
    worst = OUTCOME_OF_EXIT[code].upper() if code != EXIT_REGRESSION else "REGRESSION"
    n_worst = sum(1 for r in rows if r.rank_code == code)
    return code, f"{worst} in {n_worst} of {len(rows)} unit(s) ({tally})"


def record_only_matrix(
    matrix_dir: str | os.PathLike, history: str | os.PathLike | None, out: Any = None
) -> int:
    """``--record-only MATRIX_RUN_DIR``: append every unit folder of a matrix run to the history,
    each under its key; the worst exit code of :func:`record_only` (units without a folder are
    named and count as 4)."""
    mdir = Path(matrix_dir)
    codes = []
    for u in read_matrix_record(mdir).units:
        if not (mdir / u.id / "manifest.json").is_file():
            print(f"nightly: unit {u.id}: no run folder to record ({u.status})", file=sys.stderr)
            codes.append(EXIT_RUN_FAILED)
            continue
        s, _, err = _unit_section_settings(mdir, u.id)
        if s is None:
            print(f"nightly: unit {u.id}: {err}", file=sys.stderr)
            codes.append(EXIT_USAGE)
            continue
        codes.append(
            record_only(
                mdir / u.id, history or history_path(s), s.lock_timeout_s, out, unit_id=u.id
            )
        )
    return worst_exit(codes)


def nightly_matrix(
    path: str | os.PathLike,
    *,
    on: str = "local",
    address: str | None = None,
    results: str | os.PathLike | None = None,
    history: str | os.PathLike | None = None,
    executor: Any = None,
    out: Any = None,
    run_bench: Any = None,
    **executor_kw: Any,
) -> MatrixNightlyOutcome:
    """``patchbench nightly MATRIX.yaml``: check every unit's patches on its pin
    (:func:`check_matrix_patches`), run the matrix (:func:`patchbench.matrix.driver.run_matrix`
    ``on`` "local" or "ray" at ``address``, or ``executor``), then :func:`nightly_on_matrix_run`
    with each unit's sections and configs. Confirmations run with ``run_bench``, else here with
    ``patchbench.run.bench.run_bench`` when the units ran here; otherwise they are planned.

    Raises ConfigError (exit 2: a bad matrix, a unit whose baseline is blocked),
    EnvironmentNotReady (3: Ray missing, a pin without environment unless ``build_envs=True``),
    Interrupted (130/143: finished units kept, nothing gated)."""
    from patchbench.matrix.driver import run_matrix
    from patchbench.matrix.spec import load_matrix

    m = load_matrix(path)
    blocked_rows = check_matrix_patches(m, out)
    try:
        mdir = run_matrix(
            path, on, address, results=results, executor=executor, matrix=m, **executor_kw
        )
    except RunFailed as e:
        if not e.run_dir:
            raise
        mdir = Path(e.run_dir)
    if run_bench is None and on == "local" and executor is None:
        from patchbench import inputs
        from patchbench.run import bench

        def run_bench(cfg: Any) -> Path:
            return bench.run_bench(cfg, results_root=results or inputs.RESULTS_DIR)

    return nightly_on_matrix_run(
        mdir,
        settings={u.id: u.config.nightly for u in m.units},
        compare_settings={u.id: u.config.compare for u in m.units},
        history=history,
        out=out,
        blocked=blocked_rows,
        confirm={u.id: u.config for u in m.units},
        run_bench=run_bench,
        not_here=(
            f"the matrix ran its units on {on}; a confirmation runs on one machine of the "
            "unit's GPU type"
        ),
    )
