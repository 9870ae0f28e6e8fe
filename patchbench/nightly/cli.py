"""``patchbench nightly``: its options, and which night they ask for (see :mod:`patchbench.nightly`).

Every form ends in an exit code (docs/nightly.md); errors the user can cause are reported on
stderr as one ``nightly: ...`` line with their code, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

from patchbench import inputs
from patchbench.config import load_config
from patchbench.errors import (
    EXIT_ENV,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    ConfigError,
    EnvironmentNotReady,
    PatchError,
    UsageError,
)
from patchbench.matrix.spec import is_matrix_file, load_matrix
from patchbench.nightly.builds import (
    BuildRow,
    blocked,
    blocked_line,
    check_patches,
    prune_after_night,
    without_variants,
)
from patchbench.nightly.confirm import maybe_confirm
from patchbench.nightly.gates import DEFAULT_HISTORY, NightlySettings
from patchbench.nightly.job import (
    HISTORY_ENV,
    add_confirmation,
    history_path,
    nightly_on_run,
    record_only,
    settings_from_manifest,
)
from patchbench.nightly.matrix_night import (
    nightly_matrix,
    nightly_on_matrix_run,
    record_only_matrix,
)
from patchbench.nightly.repeats import pick_repeats, record_repeats


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
    p.add_argument(
        "--build-envs",
        action="store_true",
        help="a matrix: build an environment a unit's pin lacks (as `patchbench matrix "
        "--build-envs`; without it such a matrix is refused before anything runs, exit 3)",
    )


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
    """``patchbench nightly ...`` from raw arguments (see :mod:`patchbench.nightly`); the exit
    code."""
    import patchbench.nightly

    doc = patchbench.nightly.__doc__ or ""
    p = argparse.ArgumentParser(prog="patchbench nightly", description=doc.split("\n")[0])
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
            cfg = load_config(a.config)
            settings = NightlySettings.model_validate(cfg.nightly or {})
        except ConfigError as e:
            print(f"nightly: {e}", file=sys.stderr)
            return EXIT_USAGE
    folder = a.from_run or a.record_only
    if folder:
        if not Path(folder).is_dir():
            print(f"nightly: {folder}: no such run folder", file=sys.stderr)
            return EXIT_USAGE
        settings = settings or settings_from_manifest(Path(folder)) or NightlySettings()
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
    return _run_and_gate(a.config, cfg, settings, history_path(settings, a.history))


def _run_and_gate(config: str, cfg: Any, settings: NightlySettings, hpath: Path) -> int:
    """Run the config (patchbench.run.bench.run_bench), then gate its run folder; a run that fails
    is gated on the folder it left (exit 4), a config or environment problem exits 2 / 3."""
    try:
        from patchbench.run import bench
    except ImportError as e:
        print(
            f"nightly: the runner (patchbench.run.bench) cannot be imported: {e}", file=sys.stderr
        )
        return EXIT_RUN_FAILED
    env_error = getattr(bench, "EnvironmentNotReady", None)
    run_error = getattr(bench, "RunFailed", None)
    run_problems: list[str] = []
    plan = None
    if cfg.schedule.auto:
        try:
            plan, auto_config = pick_repeats(config, cfg, settings, hpath)
        except ValueError as e:
            print(f"nightly: {config}: schedule.repeats: auto: {e}", file=sys.stderr)
            return EXIT_USAGE
        except OSError as e:  # the results root cannot hold the resolved config
            print(
                f"nightly: {config}: schedule.repeats: auto: cannot write the resolved config "
                f"({e}); make the results folder writable",
                file=sys.stderr,
            )
            return EXIT_ENV
        config = str(auto_config)
    checked = _check_builds(config, cfg)
    if isinstance(checked, int):
        return checked
    run_config, blocked = checked
    try:
        run_dir = bench.run_bench(run_config, results_root=inputs.RESULTS_DIR)
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
        run_dir,
        settings,
        history=hpath,
        compare_settings=cfg.compare,
        run_problems=run_problems,
        blocked=blocked,
    )
    if plan is not None:
        record_repeats(outcome.json_path, plan)
    conf = maybe_confirm(
        run_config, outcome, lambda p: bench.run_bench(p, results_root=inputs.RESULTS_DIR)
    )
    if conf is not None:
        add_confirmation(outcome, conf.to_json(), conf.rows())
    pruned = prune_after_night(hpath, settings.lock_timeout_s)
    if pruned:
        print(f"nightly: {pruned}", file=sys.stderr)
    return outcome.exit_code


def _check_builds(config: str, cfg: Any) -> tuple[str, list[BuildRow]] | int:
    """Before a night runs: resolve each variant's build (``latest`` to a release) and check its
    patches there (:func:`patchbench.nightly.builds.check_patches`). A variant whose patch
    conflicts or is already upstream cannot run: the night runs the config without it (a copy
    kept beside the run folders, :func:`patchbench.nightly.builds.keep_config`) and says so.
    Returns (the config to run, the blocked rows), or the exit code when nothing can run (3: no
    environment / index, or the copy cannot be written; 2: the baseline's patch is blocked)."""
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
        return config, []
    for r in bad:
        print(f"nightly: {blocked_line(r)}", file=sys.stderr)
    try:
        path = without_variants(config, sorted({r.variant for r in bad}))
    except ValueError as e:
        print(f"nightly: nothing can run tonight: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # the results root cannot hold the copy
        print(f"nightly: cannot write the config without {bad[0].variant}: {e}", file=sys.stderr)
        return EXIT_ENV
    return str(path), bad


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
        o
        for o, v in (
            ("--on", a.on),
            ("--address", a.address),
            ("--results", a.results),
            ("--build-envs", a.build_envs),
        )
        if v
    ]
    if not is_matrix and not matrix_folder:
        if matrix_opts:
            print(
                f"nightly: {', '.join(matrix_opts)}: only for a matrix file (a config with "
                "axes/units/base, patchbench.matrix)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return None
    try:
        return _matrix_night(a, folder, is_matrix, matrix_folder, matrix_opts)
    except UsageError as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentNotReady as e:
        print(f"nightly: environment not ready: {e}", file=sys.stderr)
        return EXIT_ENV
    except (OSError, ValueError) as e:
        print(f"nightly: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED


def _matrix_night(
    a: argparse.Namespace,
    folder: str | None,
    is_matrix: bool,
    matrix_folder: bool,
    matrix_opts: list[str],
) -> int:
    """Run and gate a matrix file, or gate / record a matrix run folder; the exit code. Raises
    ConfigError (a UsageError) for arguments that do not fit together."""
    m = load_matrix(a.config) if is_matrix else None
    if folder and matrix_opts:
        raise ConfigError(f"{', '.join(matrix_opts)}: not with --from-run / --record-only")
    if a.config and not is_matrix:
        raise ConfigError(
            f"{folder} is a matrix run folder: give its matrix file or no config, not {a.config}"
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
            f"{a.config} is a matrix file, but {folder} is no matrix run folder (no matrix.json)"
        )
    kw = {"build_envs": True} if a.build_envs else {}
    return nightly_matrix(
        a.config, on=a.on or "local", address=a.address, results=a.results, history=a.history, **kw
    ).exit_code
