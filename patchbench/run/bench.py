"""``patchbench bench CONFIG``: :func:`run_bench` (docs/design.md, "Data flow of one run")."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.config import Config, load_config
from patchbench.errors import EnvironmentNotReady, Interrupted, RunFailed, UsageError
from patchbench.records import ResultsWriteError, make_dir
from patchbench.run import cell as cellmod
from patchbench.run import preflight
from patchbench.run.cell import LaunchSpecFn, run_cell, utc_stamp
from patchbench.run.lock import (
    RunFolderGone,
    RunLock,
    check_folder,
    folder_identity,
    holder_text,
)
from patchbench.run.lock import acquire as lock_run_folder
from patchbench.run.looks import (
    sequential_design,
    sequential_look,
    sequential_primaries,
    sequential_record,
)
from patchbench.run.manifest import cell_entry, new_manifest
from patchbench.run.plan import (
    Cell,
    cell_done,
    cell_suites,
    check_instrumentation,
    check_releases,
    plan,
    too_few_repeats,
)
from patchbench.run.ports import port_taken_by
from patchbench.run.progress import BenchProgress, say, stamped
from patchbench.run.signals import signum_of, terminate_like_ctrl_c
from patchbench.run.variants import VariantEnv, check_resume_identity, is_cpu, prepare_variants
from patchbench.runfolder import read_cell, resume_command, write_manifest
from patchbench.runfolder.models import (
    ManifestCell,
    OverheadBreakdown,
    RunManifest,
    RunTimings,
    StopBreakdown,
)

__all__ = [
    "run_bench",
    "plan",
    "sequential_design",
    "sequential_primaries",
    "EnvironmentNotReady",
    "RunFailed",
]

#: how to run patchbench again from this environment (the venv's console script need not be on PATH)
PROG = f"{sys.executable} -m patchbench"


def run_bench(
    config: Config | str | os.PathLike,
    *,
    results_root: str | os.PathLike | None = None,
    resume: str | os.PathLike | None = None,
    port: int | None = None,
    kill_stale: bool = False,
    verbose: bool = False,
    log: Callable[[str], None] | None = None,
    nvml: Any = "auto",
    python_start_s: float | None = None,
    restart_variants: list[str] | None = None,
    launch_spec: LaunchSpecFn | None = None,
    make_env: bool = False,
) -> Path:
    """Run a config (a Config or a file's path) end to end; returns the run folder.

    ``results_root``: where the new run folder goes (unless ``resume``, a run folder to
    complete); ``kill_stale``: stop servers orphaned by a killed run (else only reported);
    ``log``: where every line goes (None: the console); ``nvml``: an Nvml, None or "auto";
    ``python_start_s``: seconds spent before the call (counted in the overhead);
    ``restart_variants``: with ``resume``, variants to start over; ``launch_spec``: replaces
    :func:`patchbench.run.cell.launch_spec`; ``make_env``: make the environment of a build
    no environment here has (:mod:`patchbench.envs.layers`) instead of refusing it.

    Raises ConfigError / PatchError / UsageError (exit 2) or EnvironmentNotReady (exit 3) before
    any server starts; RunFolderBusy (exit 4); RunFailed (exit 4) when a cell failed, a timed cell
    is incomplete, the report was not written or a failed cell left the server port to another
    process (the run stops there); Interrupted (exit 130, 143 for SIGTERM). What finished is kept.
    """
    t_call = time.monotonic()
    cfg = config if isinstance(config, Config) else load_config(config)
    if restart_variants and not resume:
        raise UsageError(
            "--restart-variant needs --resume RUN_DIR (a new run starts every variant)"
        )
    if results_root is None and resume is None:
        raise UsageError("run_bench needs results_root (where the run folder goes) or resume")
    run = BenchRun(
        cfg,
        log=log,
        launch=cellmod.launch_spec if launch_spec is None else launch_spec,
        restart_variants=list(restart_variants or []),
        make_env=make_env,
    )
    try:
        with terminate_like_ctrl_c(log=run.say):
            try:
                cells = run.set_up(
                    resume, results_root, port, kill_stale, nvml, t_call, python_start_s
                )
                run.run_cells(cells)
            except ResultsWriteError as e:  # results folder unwritable or full: exit 4
                run.stopped(e)
                raise
            except RunFolderGone:  # deleted under the run: nothing more is written (exit 4)
                run.end_quietly()
                raise
            except KeyboardInterrupt as e:
                raise run.interrupted(e) from None
        with terminate_like_ctrl_c(log=run.say):  # a signal in the report: measured is kept
            try:
                run.finish(t_call - (python_start_s or 0.0))
            except KeyboardInterrupt as e:
                raise run.interrupted_in_report(e) from None
        for line in run.summary_lines(verbose):
            run.say(line)
        if run.port_busy:
            raise RunFailed(run.port_busy, run.run_dir)
        problems = run.problems()
        if problems:
            again = f"; to run the failed cells again: {run.resume_command()}" if run.failed else ""
            raise RunFailed(
                f"{'; '.join(problems)}; see {run.run_dir}/*/*/cell.json{again}", run.run_dir
            )
        return run.run_dir
    finally:
        for lock in run.locks:
            lock.release()


def new_run_dir(root: Path, stamp: str, name: str) -> Path:
    """Create a new run folder ``root/<stamp>-<name>`` (``-2``, ``-3``, ... when taken); raises
    ResultsWriteError (exit 4) when it cannot be created."""
    for k in range(1, 1000):
        path = root / (f"{stamp}-{name}" if k == 1 else f"{stamp}-{name}-{k}")
        try:
            return make_dir(path, exist_ok=False)
        except FileExistsError:
            continue
    raise RunFailed(f"{root}: 999 run folders named {stamp}-{name}[-k] already exist")


def _compare_and_report(run_dir: Path, *, log: Callable[[str], None]) -> str | None:
    """Write compare.json, the report and the verdict summary; returns why it failed, or None."""
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


@dataclass
class BenchRun:
    """One invocation of ``bench``; the fields after ``restart_variants`` are set by
    :meth:`set_up`."""

    cfg: Config
    log: Callable[[str], None] | None
    launch: LaunchSpecFn
    restart_variants: list[str]
    make_env: bool = False
    locks: list[RunLock] = field(default_factory=list)
    run_dir: Path | None = None
    manifest: RunManifest | None = None
    progress: BenchProgress | None = None
    variants: dict[str, VariantEnv] = field(default_factory=dict)
    port: int = 0
    #: the --port given (a resume without one keeps its run's), None: server.port
    given_port: int | None = None
    nvml: Any = None
    resumed: bool = False
    failed: int = 0
    #: timed cells (run now or earlier) whose record says incomplete (the run exits 4)
    incomplete: list[str] = field(default_factory=list)
    processed: set[int] = field(default_factory=set)
    #: set when a failed cell left the server port held by another process: the run stops
    port_busy: str | None = None
    #: the run folder's identity once it is ours (:func:`patchbench.run.lock.folder_identity`),
    #: checked before every write: a folder deleted under the run stops it (RunFolderGone)
    folder_id: tuple[int, int] | None = None

    @property
    def entries(self) -> list[ManifestCell]:
        """This invocation's cell entries (``manifest.cells``)."""
        return self.manifest.cells if self.manifest is not None else []

    @property
    def timings(self) -> RunTimings:
        """This invocation's timings (a resumed run's are its last ``resumes`` entry)."""
        m = self.manifest
        return m.resumes[-1].timings_s if self.resumed else m.timings_s

    def say(self, msg: str) -> None:
        """One line: to the caller's log, else stamped on the console (above the progress bar)."""
        if self.log is not None:
            self.log(msg)
        elif self.progress is not None:
            self.progress.log(stamped(msg))
        else:
            say(msg)

    def save(self) -> None:
        """Write the manifest (atomically); raises ResultsWriteError when it cannot,
        RunFolderGone when the run folder was deleted under the run."""
        check_folder(self.run_dir, self.folder_id)
        write_manifest(self.run_dir, self.manifest)

    def resume_command(self) -> str:
        """The command that resumes this run (:func:`patchbench.runfolder.resume_command`)."""
        return resume_command(self.run_dir, self.cfg.source, self.given_port, PROG)

    def hold(self, lock: RunLock) -> None:
        self.locks.append(lock)
        if lock.previous:
            self.say(
                f"run folder lock: {holder_text(lock.previous)} ended without releasing it "
                "(it died); taken over"
            )

    # ------------------------------------------------------------------ before the first cell
    def set_up(
        self, resume, results_root, port, kill_stale, nvml, t_call, python_start_s
    ) -> list[Cell]:
        """Everything before the first cell, checks first; returns the cells."""
        cfg = self.cfg
        old = preflight.resume_manifest(cfg, Path(resume)) if resume else None
        self.given_port = port or (old.port if old is not None else None)
        if resume:  # one writer per folder: refused before anything slow or written
            self.hold(lock_run_folder(resume))
            # the lock is free, so the run before this one is gone: stop what it left running
            preflight.stop_orphans_of(Path(resume), log=self.say)
        make = "yes" if self.make_env else "no"
        env = preflight.check_environment(cfg, resumed=old, make=make, log=self.say)
        check_instrumentation(cfg)  # a conflicting instrumentation argument: exit 2 first
        check_releases(cfg)  # a suite the clients' release cannot run: before any launch
        preflight.launch_fits_or_raise(cfg, self.given_port or cfg.server.port)
        preflight.ensure_model(cfg, log=self.say)
        # absolute: suites run clients in the cell's folder (cwd) and hand them paths in the run
        root = Path(resume).parent if resume else Path(results_root).resolve()
        preflight.report_stale_servers(root, kill=kill_stale, log=self.say)
        self.variants = prepare_variants(cfg, log=self.say)
        if resume:  # every variant runs what its cells already there ran, or starts over
            current = {v: ve.identity for v, ve in self.variants.items()}
            check_resume_identity(Path(resume), current, self.restart_variants, log=self.say)
        self.port = self.given_port or cfg.server.port
        preflight.port_free_or_raise(cfg.server.host, self.port)
        if nvml == "auto":
            from patchbench.run.gpu import open_nvml

            nvml = open_nvml() if not is_cpu(cfg) else None
        self.nvml = nvml
        if resume:
            self.run_dir = Path(resume).resolve()
        else:
            self.run_dir = new_run_dir(root, utc_stamp(), cfg.name)
            self.hold(lock_run_folder(self.run_dir))
        self.folder_id = folder_identity(self.run_dir)
        cells = plan(cfg)
        timings = RunTimings(setup=round(time.monotonic() - t_call, 3))
        if python_start_s is not None:
            timings.python_start = round(python_start_s, 3)
        self.resumed = old is not None
        self.manifest = new_manifest(
            cfg,
            self.run_dir,
            env,
            self.variants,
            timings,
            started=(old.started_at if old is not None else None) or utc_stamp(),
            resumed=old,
            resumed_at=utc_stamp(),
            nvml=self.nvml,
        )
        if self.given_port:
            self.manifest.port = self.given_port
        self.save()
        self.say(f"run folder {self.run_dir}")
        short = too_few_repeats(cfg)
        if short:
            self.say(f"speed: {short}")
        self.progress = BenchProgress(
            len(cells), plan={c.label: cell_suites(cfg, c) for c in cells}
        )
        return cells

    # ------------------------------------------------------------------ the cells
    def run_cells(self, cells: list[Cell]) -> None:
        """Run ``cells`` (skipping those done), look by look for a sequential schedule."""
        design = sequential_design(self.cfg)
        looks = list(design.looks) if design else [self.cfg.schedule.max_repeats]
        decision = None
        for li, n_rounds in enumerate(looks):
            for cell in cells:
                if cell.index in self.processed or (
                    cell.kind == "timed" and cell.repeat >= n_rounds
                ):
                    continue
                self.processed.add(cell.index)
                self.run_or_skip(cell)
                if self.port_busy:
                    break
            if self.port_busy:
                break
            if design is None:
                continue
            decision = self.look(design, li, n_rounds, decision)
            if decision is None or decision.stop:
                break
        self.progress.set_total(len(self.processed))
        self.progress.close()

    def run_or_skip(self, cell: Cell) -> None:
        """Run and record ``cell`` (the manifest is rewritten), or record it as done."""
        skipped = cell_done(self.run_dir, cell, self.cfg)
        if skipped:
            rec = read_cell(cell.path(self.run_dir))
            self.say(f"{cell.label}: done already, skipped")
            self.progress.cell_skipped(cell.label)
        else:
            self.progress.cell_started(cell.label)
            rec = run_cell(
                self.cfg,
                cell,
                self.variants[cell.variant],
                self.run_dir,
                port=self.port,
                log=self.say,
                progress=self.progress,
                nvml=self.nvml,
                launch=self.launch,
                folder_id=self.folder_id,
            )
            self.progress.cell_finished(rec.status, rec.timings_s)
            self.failed += rec.status == "failed"
            if rec.status == "failed":
                self.check_port(cell)
        if cell.kind == "timed" and rec is not None and rec.status == "incomplete":
            self.incomplete.append(cell.label)
        self.entries.append(cell_entry(cell, self.run_dir, rec, skipped=skipped))
        if not skipped:
            self.save()

    def check_port(self, cell: Cell) -> None:
        """After a failed ``cell``: when another process answers on the server port, every
        later cell would fail on it, so :attr:`port_busy` says why the run stops and how on."""
        host = self.cfg.server.host
        holder = port_taken_by(host, self.port)
        if holder is not None:
            self.port_busy = (
                f"port {self.port} on {host} is taken by another process: {holder}; the run "
                f"stopped after cell {cell.label} (finished cells are kept in {self.run_dir}); "
                f"free it and resume with `{self.resume_command()}`, or resume on another port "
                "(--port N, or server.port in the config)"
            )

    def look(self, design, look_index: int, n_rounds: int, previous):
        """The sequential look after ``n_rounds`` rounds, recorded; None: the run stops."""
        decision, why = sequential_look(self.cfg, self.run_dir, design, look_index, previous)
        self.manifest.sequential = sequential_record(
            self.cfg, design, self.manifest.sequential, look_index, n_rounds, decision, why
        )
        self.save()
        self.say(
            f"sequential look {look_index + 1} of {len(design.looks)} after {n_rounds} rounds: "
            + self.manifest.sequential.reason
        )
        return decision

    # ------------------------------------------------------------------ how it ends
    def problems(self) -> list[str]:
        """Why the run exits 4: failed cells, incomplete timed cells, an unwritten report."""
        out = []
        if self.failed:
            out.append(f"{self.failed} of {len(self.processed)} cells failed")
        if self.incomplete:
            shown = ", ".join(self.incomplete[:5]) + (", ..." if len(self.incomplete) > 5 else "")
            out.append(
                f"{len(self.incomplete)} timed cell(s) incomplete ({shown}): a suite's "
                "measurement is invalid, no verdict comes from it"
            )
        err = self.manifest.report_error if self.manifest is not None else None
        if err:
            out.append(f"the report could not be written ({err.splitlines()[0][:200]})")
        return out

    def _end(self) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.manifest is not None:
            self.manifest.ended_at = utc_stamp()

    def end_quietly(self) -> None:
        """The run folder is gone: close the progress bar, write nothing."""
        self._end()

    def stopped(self, e: ResultsWriteError) -> None:
        """The results folder cannot be written: note it, say how to resume."""
        self._end()
        if self.manifest is not None:
            self.manifest.error = str(e)
            try:
                self.save()
            except ResultsWriteError:
                pass
        if self.run_dir is not None:
            e.run_dir = self.run_dir
            self.say(
                f"stopped: {e}; finished cells are kept in {self.run_dir}; once it is writable, "
                f"resume with: {self.resume_command()}"
            )

    def interrupted(self, e: BaseException) -> Interrupted:
        """A signal stopped the run: mark the manifest, say how to resume; the error."""
        self._end()
        if self.run_dir is None:
            return Interrupted("interrupted before any cell ran", signum=signum_of(e))
        if self.manifest is not None:
            self.manifest.interrupted = True
            self.save()
        cmd = self.resume_command()
        self.say(f"interrupted; finished cells are kept in {self.run_dir}; resume with: {cmd}")
        return Interrupted(
            f"interrupted by signal {signum_of(e)}; finished cells are kept in "
            f"{self.run_dir}; resume with `{cmd}`",
            signum=signum_of(e),
            run_dir=self.run_dir,
        )

    def interrupted_in_report(self, e: BaseException) -> Interrupted:
        """A signal stopped the report: recorded as its error; the error to raise."""
        name = signal.Signals(signum_of(e)).name
        self.manifest.report_error = f"interrupted by {name} while the report was written"
        self.save()
        cmd = f"{PROG} report {self.run_dir}"
        self.say(f"interrupted during the report; every cell is kept; write it with: {cmd}")
        return Interrupted(
            f"interrupted by {name} while the report was written; every cell finished and is "
            f"kept in {self.run_dir}; write the report with `{cmd}`",
            signum=signum_of(e),
            run_dir=self.run_dir,
        )

    def finish(self, t_run: float) -> None:
        """Record the end, write the report, then this invocation's timings."""
        self.manifest.ended_at = utc_stamp()  # the measurements end here; the report reads it
        self.save()
        t_report = time.monotonic()
        report_error = _compare_and_report(self.run_dir, log=self.say)
        t = self.timings
        t.report = round(time.monotonic() - t_report, 3)
        t.total = round(time.monotonic() - t_run, 3)
        t.harness_overhead_share = overhead_share(self.entries, t)
        t.overhead_breakdown_s = overhead_breakdown(self.entries, t)
        t.server_stop_breakdown_s = stop_breakdown(self.run_dir, self.entries)
        if report_error:
            self.manifest.report_error = report_error
        self.save()

    def summary_lines(self, verbose: bool) -> list[str]:
        """Total time and overhead share (with ``verbose`` the breakdown)."""
        t = self.timings
        out = [
            f"done in {t.total:.0f} s; harness overhead "
            f"{100 * (t.harness_overhead_share or 0):.1f}% of wall time; {self.run_dir}"
        ]
        if verbose:
            b, s = t.overhead_breakdown_s, t.server_stop_breakdown_s
            out.append(
                f"overhead breakdown: python start {b.python_start:.1f} s, "
                f"server stops {b.server_stop:.1f} s, setup {b.setup:.1f} s, "
                f"flushes {b.flush:.1f} s, report {b.report:.1f} s, other {b.other:.1f} s; "
                f"stop phases {s.model_dump(mode='json')}"
            )
        return out


# ---------------------------------------------------- where the wall time went (goal < 5 %)
def _inside_s(entries: list[ManifestCell]) -> float:
    """Seconds of server start-up and the suites themselves in the cells this invocation ran."""
    return sum(
        (e.timings_s.get("server_start") or 0.0)
        + sum(v or 0.0 for k, v in e.timings_s.items() if k.startswith("suite:"))
        for e in entries
        if not e.skipped
    )


def overhead_share(entries: list[ManifestCell], timings: RunTimings) -> float | None:
    """Share of ``timings.total`` outside start-ups and suites of the cells run; None: none ran."""
    if not timings.total or all(e.skipped for e in entries):
        return None
    return round(max(0.0, timings.total - _inside_s(entries)) / timings.total, 4)


def overhead_breakdown(entries: list[ManifestCell], timings: RunTimings) -> OverheadBreakdown:
    """The harness overhead in seconds per part (``other``: the rest of the wall time outside
    server start-ups and the suites)."""
    ran = [e.timings_s for e in entries if not e.skipped]
    stop = sum(t.get("server_stop") or 0.0 for t in ran)
    flush = sum(v or 0.0 for t in ran for k, v in t.items() if k.startswith("flush:"))
    setup, report = timings.setup or 0.0, timings.report or 0.0
    start = timings.python_start or 0.0
    other = (timings.total or 0.0) - _inside_s(entries) - stop - flush - setup - report - start
    return OverheadBreakdown(
        python_start=round(start, 3),
        setup=round(setup, 3),
        server_stop=round(stop, 3),
        flush=round(flush, 3),
        report=round(report, 3),
        other=round(max(0.0, other), 3),
    )


def stop_breakdown(run_dir: Path, entries: list[ManifestCell]) -> StopBreakdown:
    """Seconds of this invocation's server stops per phase (exit, port, gpu), from cell.json."""
    out = {"exit": 0.0, "port": 0.0, "gpu": 0.0}
    for e in entries:
        rec = None if e.skipped else read_cell(run_dir / e.dir)
        b = rec.server.stop_breakdown_s if rec is not None else None
        if b is not None:
            for k in out:
                out[k] += float(getattr(b, k) or 0.0)
    return StopBreakdown(**{k: round(v, 3) for k, v in out.items()})
