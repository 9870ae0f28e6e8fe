"""``patchbench bench CONFIG``: the data flow of docs/design.md.

1. load and validate the config; 2. check the environment (installed sglang == the pin; the
tiny model built when asked; servers orphaned by an earlier, killed run; the port:
patchbench.run.preflight); 3. build one overlay per variant and verify it in the server's
environment (patchbench.run.variants) - all before any server starts; 4. plan the cells (one
untimed correctness cell per variant when a suite is instrumented or untimed, then the
interleaved timed repeats; patchbench.run.plan); 5. run each cell (patchbench.run.cell: start, run
suites, stop, record) with the overall progress on the console (patchbench.run.loop,
patchbench.run.progress), looking after whole rounds when the schedule is sequential
(patchbench.run.looks); 6-7. compare, report, and print the verdict summary.

Nothing measured is lost: every file is written atomically, the manifest
(patchbench.runfolder.RunManifest, patchbench.run.manifest) is rewritten after each cell, a
failed cell is recorded with the server log's tail and the run goes on, Ctrl-C, SIGTERM and
SIGHUP stop the server (and any client) and keep what finished (exit 130, 143 for SIGTERM), and
``--resume RUN_DIR`` runs only what is missing.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

from patchbench.config import Config, load_config
from patchbench.errors import EnvironmentNotReady, RunFailed, UsageError
from patchbench.inputs import RESULTS_DIR
from patchbench.records import ResultsWriteError, make_dir
from patchbench.run import preflight
from patchbench.run.cell import cell_suites, check_instrumentation, is_cpu, utc_stamp
from patchbench.run.identity import check_resume_identity, variant_identity
from patchbench.run.lock import RunLock, holder_text
from patchbench.run.lock import acquire as lock_run_folder
from patchbench.run.looks import sequential_design, sequential_primaries
from patchbench.run.loop import PROG, BenchRun
from patchbench.run.manifest import new_manifest
from patchbench.run.plan import plan
from patchbench.run.progress import BenchProgress, say
from patchbench.run.signals import terminate_like_ctrl_c
from patchbench.run.variants import prepare_variants
from patchbench.runfolder.models import RunTimings

# EnvironmentNotReady and RunFailed are what run_bench raises (patchbench.nightly reads them
# here); plan, sequential_design and sequential_primaries are read here by tools/calibrate.py
__all__ = [
    "run_bench",
    "plan",
    "sequential_design",
    "sequential_primaries",
    "EnvironmentNotReady",
    "RunFailed",
]


def run_bench(
    config: Config | str | os.PathLike,
    *,
    resume: str | os.PathLike | None = None,
    results_root: str | os.PathLike | None = None,
    port: int | None = None,
    kill_stale: bool = False,
    verbose: bool = False,
    log=None,
    nvml: Any = "auto",
    python_start_s: float | None = None,
    restart_variants: list[str] | None = None,
) -> Path:
    """Run a config end to end; returns the run folder. ``config``: a typed :class:`Config`
    (e.g. one derived from another with pydantic's ``model_copy``) or the path of a config file.

    Raises ConfigError / PatchError (exit 2) or EnvironmentNotReady (exit 3) before any server
    starts; RunFolderBusy (exit 4) when another live run writes the folder; RunFailed (exit 4)
    after the run when a cell failed, a timed cell is incomplete (a suite's measurement invalid)
    or the report could not be written (everything that finished is on disk); Interrupted
    (exit 130, 143 for SIGTERM) after Ctrl-C, SIGTERM or SIGHUP, once the server and any
    client are stopped (finished cells kept).
    ``kill_stale``: stop servers orphaned by an earlier killed run first (otherwise they are only
    reported). ``verbose``: print the timing breakdown at the end. ``nvml``: a patchbench.run.gpu.Nvml,
    None (no GPU checks) or "auto" (NVML where a GPU is present). ``python_start_s``: seconds
    this process spent before the call (interpreter start-up and imports; the command line
    passes it): counted in the total and the harness overhead. ``restart_variants``: with
    ``resume``, variants to start over (patchbench.run.identity.check_resume_identity; a resume
    whose variants' inputs changed is refused otherwise, exit 2).
    """
    t_call = time.monotonic()
    t_run = t_call - (python_start_s or 0.0)  # the run's wall clock starts with the process
    cfg = config if isinstance(config, Config) else load_config(config)
    run = BenchRun(str(cfg.source) if cfg.source else "CONFIG", say=log or say, log=log, cfg=cfg)
    run.restart_variants = list(restart_variants or [])
    if run.restart_variants and not resume:
        raise UsageError(
            "--restart-variant needs --resume RUN_DIR (a new run starts every variant)"
        )
    held: list[RunLock] = []
    try:
        return _run_locked(
            run,
            held,
            resume,
            results_root,
            port,
            kill_stale,
            nvml,
            t_call,
            t_run,
            python_start_s,
            verbose,
        )
    finally:
        for lock in held:
            lock.release()


def _run_locked(
    run, held, resume, results_root, port, kill_stale, nvml, t_call, t_run, python_start_s, verbose
) -> Path:
    """:func:`run_bench` once the run exists; the run folder's lock goes into ``held``."""
    with terminate_like_ctrl_c(log=run.console):
        try:
            cells = _set_up(
                run,
                held,
                resume=resume,
                results_root=results_root,
                port=port,
                kill_stale=kill_stale,
                nvml=nvml,
                t_call=t_call,
                python_start_s=python_start_s,
            )
            run.run_cells(cells)
        except ResultsWriteError as e:  # results folder unwritable or full: exit 4, one line
            run.stopped(e)
            raise
        except KeyboardInterrupt as e:
            raise run.interrupted(e) from None
    with terminate_like_ctrl_c(log=run.console):  # a signal in the report: measured is kept
        try:
            run.finish(lambda d: _compare_and_report(d, log=run.say), t_run)
        except KeyboardInterrupt as e:
            raise run.interrupted_in_report(e) from None
    for line in run.summary_lines(verbose):
        run.say(line)
    problems = run.problems()
    if problems:
        again = (
            f"; to run the failed cells again: {PROG} bench {run.config_path} --resume {run.run_dir}"
            if run.failed
            else ""
        )
        raise RunFailed(
            f"{'; '.join(problems)}; see {run.run_dir}/*/*/cell.json{again}", run.run_dir
        )
    return run.run_dir


def _set_up(
    run: BenchRun,
    held: list[RunLock],
    *,
    resume,
    results_root,
    port: int | None,
    kill_stale: bool,
    nvml: Any,
    t_call: float,
    python_start_s: float | None,
) -> list:
    """Everything before the first cell: the checks (nothing slow before the config and a
    resumed folder are known good), the overlays, the run folder and its first manifest, the
    progress bar. Fills ``run``; returns the planned cells."""
    cfg = run.cfg
    old = preflight.resume_manifest(cfg, Path(resume)) if resume else None
    if resume:  # one writer per folder: refused before anything slow or written
        _hold(run, held, lock_run_folder(resume))
    env = preflight.check_environment(cfg, resumed=old)
    check_instrumentation(cfg)  # a conflicting instrumentation argument: exit 2 first
    preflight.ensure_model(cfg)
    # absolute: suites run clients in the cell's folder (cwd) and hand them paths in the run
    root = Path(results_root).resolve() if results_root else RESULTS_DIR
    preflight.report_stale_servers(
        Path(resume).parent if resume else root, kill=kill_stale, log=run.say
    )
    run.variants = prepare_variants(cfg, log=run.say)
    if resume:  # every variant runs what its cells already there ran, or starts over
        check_resume_identity(
            Path(resume),
            {v: variant_identity(cfg, ve) for v, ve in run.variants.items()},
            run.restart_variants,
            log=run.say,
        )
    run.port = port or cfg.server.port
    preflight.port_free_or_raise(cfg.server.host, run.port)
    if nvml == "auto":
        from patchbench.run.gpu import open_nvml

        nvml = open_nvml() if not is_cpu(cfg) else None
    run.nvml = nvml
    if resume:
        run.run_dir = Path(resume).resolve()
        started = old.started_at or utc_stamp()
    else:
        run.run_dir = new_run_dir(root, utc_stamp(), cfg.name)
        _hold(run, held, lock_run_folder(run.run_dir))
        started = utc_stamp()
    cells = plan(cfg)
    timings = RunTimings(setup=round(time.monotonic() - t_call, 3))
    if python_start_s is not None:
        timings.python_start = round(python_start_s, 3)
    run.resumed = old is not None
    run.manifest = new_manifest(
        cfg,
        run.run_dir,
        env,
        run.variants,
        timings,
        started=started,
        resumed=old,
        resumed_at=utc_stamp(),
    )
    run.save()
    run.say(f"run folder {run.run_dir}")
    run.progress = BenchProgress(len(cells), plan={c.label: cell_suites(cfg, c) for c in cells})
    return cells


def new_run_dir(root: Path, stamp: str, name: str) -> Path:
    """Create and return a new run folder ``root/<stamp>-<name>``; when a run of the same config
    started in the same second took that name, ``-2``, ``-3``, ... (created atomically, so two
    runs never share one). Raises ResultsWriteError (exit 4) when it cannot be created."""
    for k in range(1, 1000):
        path = root / (f"{stamp}-{name}" if k == 1 else f"{stamp}-{name}-{k}")
        try:
            return make_dir(path, exist_ok=False)
        except FileExistsError:
            continue
    raise RunFailed(f"{root}: 999 run folders named {stamp}-{name}[-k] already exist")


def _hold(run: BenchRun, held: list[RunLock], lock: RunLock) -> None:
    held.append(lock)
    if lock.previous:
        run.say(
            f"run folder lock: {holder_text(lock.previous)} ended without releasing it "
            "(it died); taken over"
        )


def _compare_and_report(run_dir: Path, *, log=say) -> str | None:
    """Write compare.json, report.md and plots, then print the verdict summary; a failure here
    never loses the measurements. Returns why the report failed, or None."""
    try:
        from patchbench.report import render_run
    except ImportError as e:
        return f"report not available: {e}"
    try:
        out = render_run(run_dir)
    except Exception as e:  # noqa: BLE001 - the measurements are on disk; say what broke
        log(
            f"report failed ({type(e).__name__}: {e}); re-render with `patchbench report {run_dir}`"
        )
        return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    try:
        from patchbench.analysis.comparison import read_comparison
        from patchbench.report import console_summary

        console_summary(read_comparison(run_dir), out)
    except Exception as e:  # noqa: BLE001 - the summary is a courtesy; report.md is written
        log(f"report: {out} (console summary failed: {type(e).__name__}: {e})")
    return None
