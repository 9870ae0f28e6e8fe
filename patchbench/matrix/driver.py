"""The driver of a matrix run (make or resume the folder, hand the units to an executor, record
each as it ends, write the report also after failures and Ctrl-C) and the ``patchbench matrix``
command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from patchbench.config import config_from_mapping
from patchbench.envs.nodes import (
    BUILD_FLAG,
    DEFAULT_ENV_ROOT,
    EnvPlan,
    missing_env_message,
    size_txt,
)
from patchbench.errors import ConfigError, EnvironmentNotReady, Interrupted, RunFailed, UsageError
from patchbench.inputs import RESULTS_DIR
from patchbench.matrix.executors import Executor, LocalExecutor, log, make_executor
from patchbench.matrix.record import (
    MatrixRecord,
    UnitRecord,
    done_units,
    read_matrix_record,
    write_matrix_record,
)
from patchbench.matrix.spec import Matrix, Unit, load_matrix
from patchbench.records import write_json


def _utc_stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _check_resume(m: Matrix, matrix_dir: Path) -> MatrixRecord:
    """The record of the folder to resume; ConfigError when it is none or a unit's config
    changed."""
    if not matrix_dir.is_dir():
        raise ConfigError(
            f"--resume {matrix_dir}: no such folder (give a matrix run folder, "
            "results/<stamp>-<name>/)"
        )
    try:
        old = read_matrix_record(matrix_dir)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"--resume {matrix_dir}: no readable matrix.json there ({e}); give a matrix run folder"
        ) from None
    changed = []
    for u in m.units:
        p = matrix_dir / "configs" / f"{u.id}.yaml"
        if p.exists() and not _same_config(p, u):
            changed.append(u.id)
    if changed:
        raise ConfigError(
            f"--resume {matrix_dir}: the config of unit(s) {', '.join(changed)} "
            f"differs from what ran there ({matrix_dir}/configs/<unit>.yaml); a "
            "resumed matrix must measure the same thing: start a new matrix run"
        )
    return old


def _same_config(path: Path, u: Unit) -> bool:
    """Whether the config recorded at ``path`` (JSON or YAML) validates to ``u``'s config, both
    with their secrets redacted (:meth:`Config.redacted`: the record keeps no secret)."""
    try:
        old = config_from_mapping(yaml.safe_load(path.read_text()), str(path), check_files=False)
    except (ConfigError, OSError, yaml.YAMLError, TypeError):
        return False
    return old.redacted().model_dump(mode="json") == u.config.redacted().model_dump(mode="json")


def _new_record(
    m: Matrix,
    executor: Executor,
    address: str | None,
    old: MatrixRecord | None,
    done: set[str],
) -> MatrixRecord:
    """The record a run starts with: every unit pending but the ``done`` ones of ``old``."""
    units = []
    for u in m.units:
        prev = old.unit(u.id) if old is not None and u.id in done else None
        units.append(
            prev.model_copy()
            if prev is not None
            else UnitRecord(
                id=u.id,
                labels=u.labels,
                gpu_type=u.gpu_type,
                sglang=u.sglang,
                config=f"configs/{u.id}.yaml",
                config_name=u.config.name,
            )
        )
    rec = MatrixRecord(
        name=m.spec.name,
        matrix=str(m.path.resolve()),
        description=m.spec.description,
        executor=executor.name,
        address=address,
        axes=list(m.spec.axes) or ["config"],
        started_at=_utc_stamp(),
        units=units,
    )
    if old is not None:
        rec.started_at = old.started_at or rec.started_at
        rec.resumes = [*(old.resumes or []), _utc_stamp()]
    return rec


def _open_run(
    m: Matrix,
    executor: Executor,
    address: str | None,
    resume: str | os.PathLike | None,
    results: str | os.PathLike | None,
    envs: list[EnvPlan],
) -> tuple[Path, MatrixRecord, set[str]]:
    """(the matrix run folder, new or resumed, its record, the units done there), with each
    unit's config and matrix.json written."""
    if resume:
        matrix_dir = Path(resume)
        old: MatrixRecord | None = _check_resume(m, matrix_dir)
        done = done_units(matrix_dir)
    else:
        matrix_dir = Path(results or RESULTS_DIR) / f"{_utc_stamp()}-{m.spec.name}"
        matrix_dir.mkdir(parents=True, exist_ok=False)
        old, done = None, set()
    # the validated config as JSON (YAML readers read it too), its secrets redacted: a record
    # only. The unit gets its real config from the executor's spec (in memory, or Ray's object
    # store) and writes it into its own private temporary folder (execute.py, mkdtemp: mode 0700)
    for u in m.units:
        cfg = u.config.redacted().model_dump(mode="json")
        write_json(matrix_dir / "configs" / f"{u.id}.yaml", cfg)
    rec = _new_record(m, executor, address, old, done)
    rec.environments = envs or None
    write_matrix_record(matrix_dir, rec)
    return matrix_dir, rec, done


def check_envs(executor: Executor, units: list, log=log) -> list[EnvPlan]:
    """Announce where each pin's python comes from on each node; returns the plans. Raises
    EnvironmentNotReady (exit 3) naming each missing environment the executor may not build."""
    plans = executor.plan_envs(units)
    for p in plans:
        log(f"environment: {p.describe()}")
    builds = [p for p in plans if p.source == "build"]
    if builds and not executor.build_envs:
        raise EnvironmentNotReady(missing_env_message(builds))
    if builds:
        total = sum(p.expected_gb or 0 for p in builds)
        log(
            f"{BUILD_FLAG}: building {len(builds)} environment(s) as their units start "
            f"({size_txt(total) if total else 'size unknown'} in all)"
        )
    return plans


def run_matrix(
    path: str | os.PathLike,
    on: str = "local",
    address: str | None = None,
    *,
    resume: str | os.PathLike | None = None,
    results: str | os.PathLike | None = None,
    executor: Executor | None = None,
    log=log,
    matrix: Matrix | None = None,
    **executor_kw,
) -> Path:
    """Run every unit of a matrix; returns the matrix run folder.

    ``on``: "local" or "ray" (``address``: the cluster); ``executor`` overrides both;
    ``executor_kw`` go to :func:`patchbench.matrix.executors.make_executor`. ``resume``: a
    matrix run folder whose units not ``ok`` run again (through ``bench --resume``).
    ``results``: the parent folder (default results/). ``matrix``: the loaded matrix.

    Raises ConfigError (2) for a bad matrix; EnvironmentNotReady (3) for Ray missing or an
    environment it may not build; RunFailed (4) when a unit did not end ok; Interrupted
    (130/143) after Ctrl-C/SIGTERM (finished units kept).
    """
    m = matrix if matrix is not None else load_matrix(path)
    if executor is None:
        executor = make_executor(on, address=address, resources=m.spec.resources, **executor_kw)
    if resume:
        _check_resume(m, Path(resume))
    done = done_units(Path(resume)) if resume else set()
    try:
        envs = check_envs(executor, [u for u in m.units if u.id not in done], log)
    except BaseException:
        close = getattr(executor, "close", None)
        if close:
            close()
        raise
    matrix_dir, rec, done = _open_run(m, executor, address, resume, results, envs)
    todo = [u for u in m.units if u.id not in done]
    log(
        f"matrix run folder {matrix_dir}: {len(todo)} of {len(m.units)} units to run on "
        f"{executor.name}"
    )
    interrupted = _execute(executor, todo, matrix_dir, rec, log)
    if interrupted is not None:
        from patchbench.run.signals import signum_of

        cmd = f"{sys.executable} -m patchbench matrix {path} --on {executor.name} --resume {matrix_dir}"
        raise Interrupted(
            f"interrupted; finished units are kept in {matrix_dir}; resume with `{cmd}`",
            signum=signum_of(interrupted),
            run_dir=matrix_dir,
        )
    bad = [u for u in rec.units if u.status != "ok"]
    if bad:
        raise RunFailed(
            f"{len(bad)} of {len(m.units)} units did not end ok ("
            + "; ".join(f"{u.id}: {u.status}" for u in bad[:5])
            + f"); see {matrix_dir}/matrix.json and report.md",
            matrix_dir,
        )
    log(f"done: {len(m.units)} units in {matrix_dir}")
    return matrix_dir


def _execute(
    executor: Executor, todo: list, matrix_dir: Path, rec: MatrixRecord, log
) -> BaseException | None:
    """Run ``todo`` on ``executor`` (SIGTERM like Ctrl-C), then close it, stamp the end and write
    the report; returns the KeyboardInterrupt that stopped the run, or None."""
    from patchbench.run.signals import terminate_like_ctrl_c

    def record(uid: str, **fields: Any) -> None:
        unit = rec.unit(uid)
        assert unit is not None, uid
        for k, v in fields.items():
            setattr(unit, k, v)
        write_matrix_record(matrix_dir, rec)

    partial = {u.id for u in todo if (matrix_dir / u.id / "manifest.json").exists()}
    interrupted: BaseException | None = None
    try:
        with terminate_like_ctrl_c(log=log):
            try:
                executor.run(todo, matrix_dir, record, partial)
            except KeyboardInterrupt as e:
                interrupted = e
    finally:
        close = getattr(executor, "close", None)
        if close:
            close()
        rec.ended_at = _utc_stamp()
        if interrupted is not None:
            rec.interrupted = True
        write_matrix_record(matrix_dir, rec)
        try:
            from patchbench.matrix.report import write_matrix_report

            write_matrix_report(matrix_dir)
        except Exception as e:  # noqa: BLE001 - a report problem must not hide the units' results
            log(f"matrix report failed: {type(e).__name__}: {e}")
    return interrupted


def describe_matrix(
    m: Matrix,
    resume: str | os.PathLike | None = None,
    envs: list[EnvPlan] | None = None,
    envs_note: str = "",
) -> str:
    """The units of a matrix, one line each, for ``--dry-run`` (with ``resume``: which are done;
    ``envs``: where each pin's python would come from)."""
    done = done_units(Path(resume)) if resume else set()
    res = m.spec.resources
    lines = [
        f"matrix     {m.path}",
        f"name       {m.spec.name}",
        f"units      {len(m.units)} (resources per unit: num_gpus={res.num_gpus}, "
        f"num_cpus={res.num_cpus})",
    ]
    for u in m.units:
        mark = " (done)" if u.id in done else ""
        sets = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in u.overrides.items())
        lines.append(
            f"  {u.id}{mark}: gpu_type={u.gpu_type or 'any'} sglang={u.sglang} "
            f"config={u.config_path.name}{' ' + sets if sets else ''}"
        )
    if resume:
        lines.append(
            f"{sum(u.id in done for u in m.units)} of {len(m.units)} units done, "
            f"{sum(u.id not in done for u in m.units)} to run"
        )
    if envs:
        lines.append(f"environments{' (' + envs_note + ')' if envs_note else ''}:")
        lines += [f"  {p.describe()}" for p in envs]
        if any(p.source == "build" for p in envs):
            lines.append(f"  a missing environment is built only with {BUILD_FLAG}")
    return "\n".join(lines)


# ------------------------------------------------------------------------- the command
def add_cli_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``patchbench matrix`` (an argparse parser)."""
    p.add_argument("matrix", help="the matrix file (YAML): a base config with axes, or units")
    p.add_argument(
        "--on",
        choices=("local", "ray"),
        default="local",
        help="local: one unit after another here (default); ray: one Ray task per unit",
    )
    p.add_argument(
        "--address",
        help="the Ray cluster (default: RAY_ADDRESS, a running local cluster, or a new local one)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the units, run nothing")
    p.add_argument(
        "--resume",
        metavar="MATRIX_RUN_DIR",
        help="run only the units not finished ok in MATRIX_RUN_DIR",
    )
    p.add_argument(
        "--results", metavar="DIR", help="parent of the matrix run folder (default results/)"
    )
    p.add_argument(
        "--env-setup",
        choices=("auto", "make", "current"),
        help="how a unit gets its pin's environment (default: auto locally, make on "
        "Ray: `make setup SGLANG=<pin>` into a persistent venv per pin on each node)",
    )
    p.add_argument(
        "--build-envs",
        action="store_true",
        help="build an environment a unit's pin lacks (`make setup`: about 8-9 GB each; "
        "without it such a matrix is refused before anything runs, exit 3)",
    )
    p.add_argument(
        "--env-root",
        metavar="DIR",
        help=f"where nodes keep those venvs (default {DEFAULT_ENV_ROOT})",
    )
    p.add_argument(
        "--no-ship-code",
        action="store_true",
        help="Ray: do not send this checkout "
        "as the job's working_dir (every node has it at the same path)",
    )


def run_cli(a: argparse.Namespace) -> int:
    """``patchbench matrix`` from parsed arguments; returns 0 or raises a PatchbenchError."""

    if a.dry_run:
        m = load_matrix(a.matrix)
        mode = a.env_setup or ("make" if a.on == "ray" else "auto")
        ex = LocalExecutor(env_setup=mode, env_root=a.env_root)
        note = (
            "this machine; a Ray node is looked at when the matrix starts" if a.on == "ray" else ""
        )
        print(describe_matrix(m, a.resume, ex.plan_envs(m.units), note))
        return 0
    kw: dict[str, Any] = {"build_envs": a.build_envs}
    if a.env_setup:
        kw["env_setup"] = a.env_setup
    if a.on == "ray":
        kw.update(env_root=a.env_root, ship_code=not a.no_ship_code)
    elif a.env_root or a.no_ship_code:
        raise UsageError("--env-root and --no-ship-code are for --on ray")
    run_matrix(a.matrix, a.on, a.address, resume=a.resume, results=a.results, **kw)
    return 0
