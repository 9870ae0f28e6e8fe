"""One cell (one server lifetime of one variant) in four named steps: start, run suites, stop,
record. :func:`run_cell` strings them together; :class:`CellRun` holds the cell's state.

- **start**: the launch spec (the variant's overlay and environment, plus the correctness cell's
  instrumentation), markers that tie the server to this run (patchbench.run.server), the server's pid
  and process group written to ``cell.json`` at once (so a server orphaned by a killed runner is
  found again: patchbench.run.stale), readiness, then the liveness watch (patchbench.run.liveness) and,
  on a GPU, the NVML sampler (patchbench.run.gpu).
- **run suites**: suites that need no server first, then the others on the server; between two
  suites ``/flush_cache`` (its 200 is the scheduler's own answer, so it doubles as the health
  check: see :meth:`CellRun._between_suites`, bounded by ``server.stall_timeout_s``); during a
  suite only the liveness watch's scheduler heartbeat (no generation) is sent to the server. A
  death of any server process, or a stall (no heartbeat answer, no reply of the suite, a stopped
  server or client process for ``server.stall_timeout_s``), stops the suite at once
  (``ServerLost``) and fails the cell with "the sglang scheduler (pid N) died" or "the server
  stopped answering (scheduler pid N in state S)" and the server log's tail.
- **stop**: the liveness watch first (a stop is not a death), then a fast stop of the group
  (patchbench.run.server: the results are on disk already).
- **record**: the instrumentation's ``collect`` results, the cell's status, timings and the GPU
  summary, written to ``cell.json`` (patchbench.runfolder.CellRecord).

Never raises for a failure of the server or a suite (the cell is marked failed); an interrupt
(Ctrl-C, SIGTERM, SIGHUP) stops the server, marks the cell interrupted and propagates.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench import runfolder
from patchbench.config import Config
from patchbench.config.args import check_args, split_args
from patchbench.envs import envinfo
from patchbench.errors import ConfigError
from patchbench.records import ResultsWriteError, make_dir
from patchbench.run import logscan, preload
from patchbench.run.liveness import ServerLost, ServerWatch
from patchbench.run.order import Cell
from patchbench.run.ports import (
    MARKER_CELL,
    MARKER_RUN_DIR,
    MARKER_RUNNER_PID,
    MARKER_RUNNER_START,
    runner_start,
)
from patchbench.run.server import LaunchSpec, ServerError, SglangServer, scan_log, tail
from patchbench.run.signals import signum_of
from patchbench.run.variants import VariantEnv, client_python, client_release, stock_client_env
from patchbench.runfolder import models
from patchbench.runfolder.models import CellRecord
from patchbench.shims import CALLED_MARKER, HOOKS_ENV
from patchbench.suite import (
    Instrumentation,
    ServerInfo,
    SuiteContext,
    SuiteError,
    SuiteResult,
    get_suite,
)

DONE_STATUSES = ("ok", "incomplete")


def utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def is_cpu(cfg: Config) -> bool:
    """True when ``server.args`` asks for ``--device cpu``."""
    a = cfg.server.args
    return any(x == "--device=cpu" for x in a) or any(
        a[i] == "--device" and i + 1 < len(a) and a[i + 1] == "cpu" for i in range(len(a))
    )


def refuse_impossible(res: SuiteResult) -> list[str]:
    """Refuse metric values that cannot be measurements (NaN, infinite, not a number) where they
    enter the run: each is removed from ``res.metrics`` (so no mean ever averages it) and named
    in ``res.errors``; an ``ok`` result becomes ``incomplete`` (no verdict on it). Returns the
    refused metric names. Suites check their own ranges (e.g. the serving suite's
    :func:`patchbench.suites.serving.parse.row_problem`)."""
    bad = []
    for name, v in list(res.metrics.items()):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            bad.append(name)
            res.errors.append(f"impossible value {name} = {v!r} refused (not a finite number)")
            del res.metrics[name]
    if bad and res.status == "ok":
        res.status = "incomplete"
    return bad


def launch_spec(cfg: Config, venv: VariantEnv, cdir: Path, port: int) -> LaunchSpec:
    """How this variant's server is launched into ``cdir`` (tests replace this function):
    ``server.args`` followed by the variant's ``server_args`` (:meth:`Config.server_args_of`),
    the variant's environment (``server.env`` plus its ``env``, the overlay first on PYTHONPATH:
    :func:`patchbench.run.variants.prepare_variants`) and its build's interpreter."""
    s = cfg.server
    return LaunchSpec(
        python=venv.python,
        model_path=cfg.model_ref,
        host=s.host,
        port=port,
        args=cfg.server_args_of(venv.name),
        env=dict(venv.server_env),
        log_path=cdir / "server.log",
        ready_timeout_s=s.ready_timeout_s,
        stop_grace_s=s.stop_grace_s,
        port_close_timeout_s=s.port_close_timeout_s,
        flush_retries=s.flush_retries,
        flush_pause_s=s.flush_pause_s,
        stall_timeout_s=s.stall_timeout_s,
    )


def suite_done(path: Path) -> bool:
    """True when ``path/summary.json`` says ok or incomplete."""
    s = runfolder.read_summary(path)
    return s is not None and s.status in DONE_STATUSES


def cell_suites(cfg: Config, cell: Cell) -> list[str]:
    """The suites a cell runs, in config order. A correctness cell: the untimed suites and those
    with instrumentation; when none of them talks to the server, also the timed server suites,
    so that the instrumented server sees traffic. A timed cell of round k: the timed suites whose
    ``rounds`` include k (:meth:`Config.rounds_of`)."""
    if cell.kind == "correctness":
        picked = [
            s
            for s in cfg.suites
            if not get_suite(s).timed
            or get_suite(s).instrumentation(_placeholder_ctx(cfg, s), cfg.suite_params[s])
            is not None
        ]
        if not any(get_suite(s).needs_server for s in picked):
            picked = [s for s in cfg.suites if s in picked or get_suite(s).needs_server]
        return picked
    return [s for s in cfg.suites if get_suite(s).timed and cell.repeat in cfg.rounds_of(s)]


def cell_done(run_dir: Path, cell: Cell, cfg: Config) -> bool:
    """A cell is done when each of its suites has a summary with status ok/incomplete."""
    return all(suite_done(cell.path(run_dir) / s) for s in cell_suites(cfg, cell))


def needs_correctness_cells(
    cfg: Config, ctx_for: Callable[[str], SuiteContext] | None = None
) -> bool:
    """True when a suite of ``cfg`` is untimed or declares instrumentation (``ctx_for(suite)``
    gives the context the hook is asked with; a placeholder one by default)."""
    for name in cfg.suites:
        s = get_suite(name)
        if not s.timed:
            return True
        ctx = ctx_for(name) if ctx_for else _placeholder_ctx(cfg, name)
        if s.instrumentation(ctx, cfg.suite_params[name]) is not None:
            return True
    return False


def _placeholder_ctx(cfg: Config, suite: str, variant: str | None = None) -> SuiteContext:
    site = envinfo.stock_site_dir()
    stock = (site / "sglang") if site else Path("sglang")
    root = Path("/nonexistent-run")
    return SuiteContext(
        server=None,
        out_dir=root / suite,
        run_dir=root,
        cache_dir=root / ".cache",
        variant=variant or cfg.baseline,
        repeat=0,
        baseline=cfg.baseline,
        sglang_version=client_release(cfg),
        python=client_python(cfg),
        stock_env={},
        variant_sglang_dir=stock,
        stock_sglang_dir=stock,
        device="cpu" if is_cpu(cfg) else "cuda",
    )


def _show(flag: str, value: str | None) -> str:
    return flag if value is None else f"{flag} {value}"


def instrumentation_args(
    cfg: Config, variant: str, wanted: list[tuple[str, list[str]]]
) -> list[str]:
    """The server arguments a correctness cell of ``variant`` adds for its instrumentation.

    wanted: ``[(suite, Instrumentation.server_args)]`` in config order. A flag the launch
    command already has with the same value (or a switch already given), or that an earlier
    suite asked for the same way, is added once. Returns the arguments to append.
    Raises ConfigError (exit 2) naming both sides when a suite's instrumentation needs a flag
    that ``server.args``, the variant's ``server_args`` or another suite's instrumentation sets
    differently, or when it asks for an argument the harness owns.
    """
    have: dict[str, tuple[str | None, str]] = {}
    for key, args in (
        ("server.args", cfg.server.args),
        (f"variants.{variant}.server_args", cfg.variants[variant].server_args),
    ):
        for _, flag, val in split_args(list(args)):
            if flag:
                have[flag] = (val, key)
    out: list[str] = []
    for suite, args in wanted:
        where = f"the {suite} suite's instrumentation"
        try:
            check_args(list(args), f"{where} (server_args)")
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for i, flag, val in split_args(list(args)):
            if not flag:
                out.append(val or "")  # not a flag (sglang has no positional arguments)
                continue
            if flag in have:
                old, by = have[flag]
                if old != val:
                    raise ConfigError(
                        f"{where} needs {_show(flag, val)} in the correctness cell of variant "
                        f"'{variant}', but {by} sets {_show(flag, old)}; remove one of them "
                        f"(suites.{suite} or {by})"
                    )
                continue
            have[flag] = (val, where)
            out += [args[i]] if (val is None or "=" in args[i]) else [args[i], val]
    return out


def check_instrumentation(cfg: Config) -> dict[str, list[str]]:
    """{variant: server arguments its correctness cell adds} (empty lists when none), computed
    before any server starts so that a conflict is refused first (see
    :func:`instrumentation_args`; raises ConfigError)."""
    out: dict[str, list[str]] = {}
    for v in cfg.variants:
        wanted = []
        for name in cfg.suites:
            ins = get_suite(name).instrumentation(
                _placeholder_ctx(cfg, name, v), cfg.suite_params[name]
            )
            if ins is not None and ins.server_args:
                wanted.append((name, list(ins.server_args)))
        out[v] = instrumentation_args(cfg, v, wanted)
    return out


# ---------------------------------------------------------------------------------- the cell
@dataclass
class CellRun:
    """The state of one cell while its steps run; see the module docstring.

    ``record`` is the cell.json being built; ``server`` / ``watch`` exist between start and stop.
    ``progress``: a patchbench.run.progress.BenchProgress (or None); ``nvml``: a patchbench.run.gpu.Nvml
    (None: no GPU checks).
    """

    cfg: Config
    cell: Cell
    venv: VariantEnv
    run_dir: Path
    port: int
    log: Callable[[str], None] = print
    progress: Any = None
    nvml: Any = None
    record: CellRecord = field(init=False)
    server: SglangServer | None = None
    watch: ServerWatch | None = None
    sampler: Any = None
    instrumentation: dict[str, Instrumentation] = field(default_factory=dict)
    _t0: float = 0.0

    def __post_init__(self) -> None:
        self.cdir = self.cell.path(self.run_dir)
        make_dir(self.cdir)
        self._t0 = time.monotonic()
        base = self.cfg.builds.get(self.cfg.baseline)
        site = base.env.site_dir if base is not None else envinfo.stock_site_dir()
        self.stock_dir = (site or Path(".")) / "sglang"
        planned = cell_suites(self.cfg, self.cell)
        todo = [s for s in planned if not suite_done(self.cdir / s)]
        kept = [s for s in planned if s not in todo]  # finished by an earlier launch
        self.suites = {s: get_suite(s) for s in todo}
        self.local = [s for s in todo if not self.suites[s].needs_server]
        self.remote = [s for s in todo if s not in self.local]
        earlier = runfolder.read_cell(self.cdir) if kept else None
        self.record = CellRecord(
            variant=self.cell.variant,
            repeat=self.cell.repeat,
            index=self.cell.index,
            status="running",
            started_at=utc_stamp(),
            cell_kind=self.cell.kind,
            instrumented=False,
            runner_pid=os.getpid(),
        )
        # a resumed cell: the suites an earlier launch finished keep their status in the record
        # (their summaries stay as they are), and the note says which launch measured them
        for s in kept:
            self.record.suites[s] = runfolder.read_summary(self.cdir / s).status
        if kept:
            when = earlier.started_at if earlier is not None and earlier.started_at else "unknown"
            self.record.notes.append(
                f"resumed: {', '.join(kept)} kept from an earlier launch (started {when}, "
                f"its own server); this launch ran {', '.join(todo)}"
            )
            if earlier is not None and earlier.server.pid is not None:
                self.record.notes.append(f"earlier launch's server: pid {earlier.server.pid}")
        self.write()

    # ------------------------------------------------------------------ helpers
    def say(self, msg: str, suite: str | None = None) -> None:
        self.log(f"{self.cell.label}" + (f"/{suite}" if suite else "") + f": {msg}")

    def write(self) -> None:
        runfolder.write_cell(self.cdir, self.record)

    def ctx(self, suite: str, server: ServerInfo | None, *, make: bool = True) -> SuiteContext:
        """The suite's context in this cell; ``make``: create its folder (not when the suite is
        only asked for its instrumentation: a suite that does not run leaves no empty folder)."""
        out = self.cdir / suite
        if make:
            make_dir(out)
        return SuiteContext(
            server=server,
            out_dir=out,
            run_dir=self.run_dir,
            cache_dir=self.run_dir / ".cache",
            variant=self.cell.variant,
            repeat=self.cell.repeat,
            baseline=self.cfg.baseline,
            sglang_version=client_release(self.cfg),
            python=client_python(self.cfg),
            stock_env=stock_client_env(self.cfg),
            variant_sglang_dir=self.venv.sglang_dir,
            stock_sglang_dir=self.stock_dir,
            device="cpu" if is_cpu(self.cfg) else "cuda",
            log=lambda m, _s=suite: self.say(m, _s),
        )

    def server_info(self) -> ServerInfo:
        srv, spec, watch = self.server, self.server.spec, self.watch
        return ServerInfo(
            base_url=srv.base_url,
            host=spec.host,
            port=spec.port,
            model_path=spec.model_path,
            tokenizer_path=self.cfg.tokenizer_ref,
            log_path=spec.log_path,
            pid=srv.pid,
            flush_cache=srv.flush_cache,
            alive=lambda: srv.alive() and not (watch and watch.dead.is_set()),
            progress=watch.progress if watch is not None else None,
        )

    # ------------------------------------------------------------------ step 1: start
    def _instrument(self, spec: LaunchSpec) -> None:
        """Correctness cells only: every suite's instrumentation into the server's environment."""
        if self.cell.kind != "correctness":
            return
        hooks: list[str] = []
        wanted: list[tuple[str, list[str]]] = []
        for name in self.cfg.suites:
            ins = get_suite(name).instrumentation(
                self.ctx(name, None, make=False), self.cfg.suite_params[name]
            )
            if ins is None:
                continue
            self.instrumentation[name] = ins
            if ins.out_dir is not None:
                make_dir(ins.out_dir)
            spec.env.update(ins.env)
            hooks += [str(p) for p in ins.hooks]
            if ins.server_args:
                wanted.append((name, list(ins.server_args)))
        added = instrumentation_args(self.cfg, self.cell.variant, wanted)
        spec.args = list(spec.args) + added
        if added:
            self.record.instrumentation_args = added
        if hooks:  # imported in every server process by the site hook (patchbench/shims/site)
            spec.env[HOOKS_ENV] = os.pathsep.join(hooks)
        self.record.instrumented = bool(self.instrumentation)

    def start(self) -> None:
        """Launch, record the pid, wait until ready, start watching."""
        spec = launch_spec(self.cfg, self.venv, self.cdir, self.port)
        spec.env.update(
            {
                MARKER_RUN_DIR: str(Path(self.run_dir).resolve()),
                MARKER_CELL: self.cell.label,
                MARKER_RUNNER_PID: str(os.getpid()),
                MARKER_RUNNER_START: repr(runner_start()),
            }
        )
        self._instrument(spec)
        self.server = SglangServer(spec)
        self.say(f"starting server on port {self.port}")
        self.server.start()
        preload.start()  # the report's imports, while this process waits for the server anyway
        self.record.server = models.ServerRecord(**self.server.record())
        self.write()  # the pid is on disk before anything can hang
        t0 = time.monotonic()
        try:
            self.record.timings_s["server_start"] = round(self.server.wait_ready(), 3)
        except ServerError:
            # a start that failed is still start-up time, not the harness's overhead
            self.record.timings_s["server_start"] = round(time.monotonic() - t0, 3)
            raise
        preload.wait()  # done before any suite runs
        self.say(f"server ready in {self.record.timings_s['server_start']:.1f} s")
        self.watch = ServerWatch(
            self.server.proc,
            self.server.pgid,
            on_death=lambda d: self.say(f"{d.message()}; stopping the suite"),
            stall_timeout_s=spec.stall_timeout_s,
            heartbeat=self.server.heartbeat,
        )
        self.watch.start()
        self.record.liveness = models.Liveness(watched=self.watch.describe())
        if self.nvml is not None:
            from patchbench.run.gpu import GpuSampler

            self.sampler = GpuSampler(self.nvml, ours=self._our_pids).start()

    def _our_pids(self) -> set[int]:
        import psutil

        pids = {os.getpid()}
        try:
            pids |= {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        return pids

    # ------------------------------------------------------------------ step 2: run suites
    def run_suites(self, names: list[str]) -> None:
        """Run ``names`` in order (on the server when it is started). Raises ServerError when the
        server died or stopped answering: the remaining suites are then not run."""
        for i, name in enumerate(names):
            if self.server is not None and i > 0:
                self._between_suites(name)
            self.run_suite(name)
            if self.watch is not None and self.watch.dead.is_set():
                raise ServerError(self.watch.lost.message(), self._log_tail())

    def _between_suites(self, name: str) -> None:
        """Flush the radix cache before ``name``. ``/flush_cache`` answers 200 only with the
        scheduler's own reply (``TokenizerManager.flush_cache`` awaits the scheduler's
        ``FlushCacheReqOutput``, sglang 0.5.1.post3 and 0.5.23; docs/FACTS.md section 4), so a
        200 proves the scheduler answers and no ``/health`` follows: sglang's ``/health`` sleeps
        1 s before it looks (``health_generate``), a second per timed cell for nothing. A refused
        or unanswered flush raises (server.FlushFailed / ServerDied)."""
        t = time.monotonic()
        self.server.flush_cache()
        self.record.timings_s[f"flush:{name}"] = round(time.monotonic() - t, 3)

    def _scan_log(self, res: SuiteResult, start_offset: int | None) -> None:
        """Count the server's retractions and out-of-memory lines during this suite
        (patchbench/run/logscan.py) into ``meta["server_log_scan"]``, with a warning when non-zero;
        a suite that scanned its own slice already is left as it is."""
        if start_offset is None or "server_log_scan" in res.meta:
            return
        path = self.server.spec.log_path
        try:
            scan = logscan.scan_server_log(path, start_offset=start_offset)
        except OSError as e:
            scan = {"error": f"cannot read {path}: {e}"}
        res.meta["server_log_scan"] = scan
        warning = logscan.taint_warning(scan)
        if warning:
            res.warnings.append(warning)

    def _log_tail(self) -> str:
        return self.server.log_tail() if self.server is not None else ""

    def run_suite(self, name: str) -> None:
        """Run one suite and write its summary; a failure is recorded, never raised (except an
        interrupt)."""
        if self.progress is not None:
            self.progress.suite_started(name)
        t = time.monotonic()
        info = self.server_info() if self.server is not None else None
        log_off = logscan.log_size(self.server.spec.log_path) if self.server is not None else None
        scope = self.watch.cancel_scope() if self.watch is not None else contextlib.nullcontext()
        try:
            with scope:
                res = self.suites[name].run(self.ctx(name, info), self.cfg.suite_params[name])
            if not isinstance(res, SuiteResult):
                raise TypeError(f"suite {name} returned {type(res).__name__}, not SuiteResult")
        except ServerLost as e:
            res = SuiteResult(
                status="failed",
                errors=[f"{e.death.message()}; the suite was stopped at once:\n{self._log_tail()}"],
            )
        except (SuiteError, ServerError) as e:
            res = SuiteResult(status="failed", errors=[str(e)])
        except (KeyboardInterrupt, ResultsWriteError):
            raise  # a results folder that cannot be written ends the run (run_cell)
        except Exception as e:  # noqa: BLE001 - a suite bug must not lose the other cells
            res = SuiteResult(
                status="failed", errors=[f"{type(e).__name__}: {e}", traceback.format_exc()]
            )
        refuse_impossible(res)
        if self.server is not None:
            self._check_server_after(res)
            self._scan_log(res, log_off)
        dt = time.monotonic() - t
        res.meta.setdefault("duration_s", round(dt, 3))
        runfolder.write_summary(self.cdir / name, res.to_json(name))
        self.record.suites[name] = res.status
        self.record.timings_s[f"suite:{name}"] = round(dt, 3)
        self.say(
            res.status + (f" - {res.errors[0].splitlines()[0][:200]}" if res.errors else ""), name
        )
        self.write()

    def _check_server_after(self, res: SuiteResult) -> None:
        called = scan_log(self.server.spec.log_path, CALLED_MARKER)
        if called:
            res.status = "failed"
            res.errors.append(f"a CPU stand-in was called, results invalid: {called[0]}")
        if res.status == "failed" and self.watch is not None and not self.watch.dead.is_set():
            self.watch.dead.wait(1.0)  # a failed request may be the server dying: let it be seen
        death = self.watch.lost if self.watch is not None else None
        if death is not None and not any(death.message() in e for e in res.errors):
            res.status = "failed"
            res.errors.append(f"{death.message()} during the suite:\n{self._log_tail()}")
        elif death is None and not self.server.alive():
            res.status = "failed"
            res.errors.append(
                f"the server died during the suite (exit code "
                f"{self.server.proc.returncode}):\n" + self._log_tail()
            )

    # ------------------------------------------------------------------ step 3: stop
    def stop(self) -> None:
        """Stop watching, then stop the server group; a stop failure fails the cell."""
        if self.watch is not None:
            self.watch.close()
            live = self.record.liveness
            if self.watch.death is not None and live is not None:
                live.death = models.ServerDeath(**self.watch.death.to_json())
            if self.watch.stall is not None and live is not None:
                live.stall = models.ServerStall(**self.watch.stall.to_json())
            if self.watch.lost is not None and live is not None:
                live.killed_clients = list(self.watch.killed_clients)
        if self.server is None:
            return
        t = time.monotonic()
        try:
            self.server.stop(nvml=self.nvml)
        except ServerError as e:
            self._fail(str(e))
        self.record.timings_s["server_stop"] = round(time.monotonic() - t, 3)
        self.record.server.events = self.server.events
        self.record.server.stop_breakdown_s = models.StopBreakdown(**self.server.stop_breakdown_s)
        if self.sampler is not None:
            g = self.sampler.close()
            self.record.gpu = g
            self.record.notes += g.flags

    # ------------------------------------------------------------------ step 4: record
    def finish(self, *, best_effort: bool = False) -> CellRecord:
        """Collect the instrumentation, settle the status, write cell.json; returns the record.

        ``best_effort``: an error is already on its way out; a cell.json that cannot be written
        (ResultsWriteError) is then only logged, so that error is the one reported."""
        for name, ins in self.instrumentation.items():
            if ins.collect is None or ins.out_dir is None:
                continue
            try:
                self.record.instrumentation[name] = ins.collect(Path(ins.out_dir))
            except Exception as e:  # noqa: BLE001 - one broken collector must not lose the cell
                self.record.instrumentation[name] = {"error": f"{type(e).__name__}: {e}"}
        self.record.timings_s["cell"] = round(time.monotonic() - self._t0, 3)
        if self.record.status == "running":
            st = set(self.record.suites.values())
            self.record.status = (
                "failed" if "failed" in st else "incomplete" if "incomplete" in st else "ok"
            )
        self.record.ended_at = utc_stamp()
        try:
            self.write()
        except ResultsWriteError as e:
            if not best_effort:
                raise
            self.say(f"cell.json not updated either: {e}")
        return self.record

    # ------------------------------------------------------------------ outcomes
    def _fail(self, message: str) -> None:
        self.record.status = "failed"
        self.record.error = f"{self.record.error or ''}\n{message}".strip()

    def failed(self, e: ServerError) -> None:
        """The server failed (start, death, health): the cell fails; suites not run are marked."""
        self._fail(str(e))
        for s in self.remote:
            if s not in self.record.suites:
                runfolder.write_summary(
                    self.cdir / s,
                    SuiteResult(
                        status="failed", errors=[f"not run: {str(e).splitlines()[0]}"]
                    ).to_json(s),
                )
                self.record.suites[s] = "failed"
        self.say(f"FAILED - {str(e).splitlines()[0]}")

    def interrupted(self, e: BaseException) -> None:
        import signal as _signal

        self.record.status = "interrupted"
        self.record.error = f"interrupted by {_signal.Signals(signum_of(e)).name}"


def run_cell(
    cfg: Config,
    cell: Cell,
    venv: VariantEnv,
    run_dir: Path,
    *,
    port: int,
    log: Callable[[str], None] = print,
    progress: Any = None,
    nvml: Any = None,
    identity: dict[str, str] | None = None,
) -> CellRecord:
    """Run one cell's steps (start, run suites, stop, record); returns its record.
    ``identity``: what the variant runs (patchbench.run.identity.variant_identity), recorded
    in ``cell.json`` ``variant_identity`` for the resume check.

    Never raises for a failure of the server or a suite. An interrupt (KeyboardInterrupt, or
    patchbench.run.signals.Terminated) stops the server, records the cell as interrupted and
    propagates.
    """
    c = CellRun(cfg, cell, venv, Path(run_dir), port, log, progress, nvml)
    c.record.variant_identity = identity
    try:
        c.run_suites(c.local)
        if c.remote:
            c.start()
            c.run_suites(c.remote)
    except KeyboardInterrupt as e:
        c.interrupted(e)
        raise
    except ServerError as e:
        c.failed(e)
    except ResultsWriteError as e:  # results folder unwritable or full: the run ends (exit 4)
        c._fail(str(e))
        c.say(f"FAILED - {e}")
        raise
    finally:
        failing = sys.exc_info()[1] is not None
        c.stop()
        c.finish(best_effort=failing)
    return c.record


__all__ = [
    "CellRun",
    "run_cell",
    "launch_spec",
    "cell_done",
    "cell_suites",
    "needs_correctness_cells",
    "suite_done",
    "is_cpu",
    "tail",
    "instrumentation_args",
    "check_instrumentation",
]
