"""One cell, one server lifetime of one variant (:func:`run_cell`; docs/design.md step 5)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import importlib
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from patchbench import runfolder
from patchbench.config import Config
from patchbench.envs import envinfo
from patchbench.records import ResultsWriteError, make_dir
from patchbench.run import logscan, server_metrics
from patchbench.run.liveness import ServerLost, ServerWatch
from patchbench.run.lock import RunFolderGone, check_folder
from patchbench.run.plan import Cell, cell_suites, instrumentation_args, suite_done
from patchbench.run.ports import server_markers
from patchbench.run.server import LaunchSpec, ServerError, SglangServer, scan_log
from patchbench.run.signals import signum_of
from patchbench.run.variants import (
    VariantEnv,
    client_python,
    client_release,
    is_cpu,
    stock_client_env,
)
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

#: what the report imports after the last cell (about 2 s on the 2-core CPU machine)
REPORT_MODULES = (
    "patchbench.report",
    "patchbench.report.plots",
    "patchbench.analysis.build",
    "scipy.stats",
    "statsmodels.stats.contingency_tables",
    "statsmodels.stats.proportion",
)


def utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


@functools.cache
def preload(names: tuple[str, ...] = REPORT_MODULES) -> threading.Thread:
    """Import ``names`` in a daemon thread, once per process (a module that fails is left to the
    report)."""

    def run() -> None:
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the report imports it again
                continue

    t = threading.Thread(target=run, name="patchbench-preload", daemon=True)
    t.start()
    return t


def refuse_impossible(res: SuiteResult) -> list[str]:
    """Remove metric values that are not finite numbers from ``res.metrics``, naming each in
    ``res.errors`` (``ok`` becomes ``incomplete``); returns the refused names."""
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
    """How ``venv``'s server is launched into ``cdir`` (``run_bench``'s ``launch_spec`` parameter
    replaces it: tests launch the fake server)."""
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
        log_max_mb=s.log_max_mb,
    )


LaunchSpecFn = Callable[[Config, VariantEnv, Path, int], LaunchSpec]


@dataclass
class CellRun:
    """The state of one cell while its steps run; ``record``: the cell.json
    being built; ``progress`` / ``nvml``: a BenchProgress / Nvml or None."""

    cfg: Config
    cell: Cell
    venv: VariantEnv
    run_dir: Path
    port: int
    log: Callable[[str], None]
    progress: Any
    nvml: Any
    launch: LaunchSpecFn
    record: CellRecord = field(init=False)
    server: SglangServer | None = None
    watch: ServerWatch | None = None
    sampler: Any = None
    instrumentation: dict[str, Instrumentation] = field(default_factory=dict)
    #: the run folder's identity at the run's start (:func:`patchbench.run.lock.folder_identity`;
    #: None: not checked): every write of the cell checks it first
    folder_id: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.cdir = self.cell.path(self.run_dir)
        self.guard()
        make_dir(self.cdir)
        self.t0 = time.monotonic()
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
        # a resumed cell: suites an earlier launch finished keep their status and summaries
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

    def say(self, msg: str, suite: str | None = None) -> None:
        self.log(f"{self.cell.label}" + (f"/{suite}" if suite else "") + f": {msg}")

    def guard(self) -> None:
        """RunFolderGone (exit 4) when the run folder is no longer the one the run started in."""
        check_folder(self.run_dir, self.folder_id)

    def write(self) -> None:
        self.guard()
        runfolder.write_cell(self.cdir, self.record)

    def ctx(self, suite: str, server: ServerInfo | None, *, make: bool = True) -> SuiteContext:
        """The suite's context; ``make``: create its folder (not for the hook)."""
        out = self.cdir / suite
        if make:
            self.guard()
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
        """Correctness cells only: every suite's instrumentation into the server's launch."""
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
        spec = self.launch(self.cfg, self.venv, self.cdir, self.port)
        spec.env.update(server_markers(self.run_dir, self.cell.label))
        self._instrument(spec)
        self.server = SglangServer(spec)
        self.say(f"starting server on port {self.port}")
        self.server.start()
        imports = preload()  # while this process waits for the server anyway
        self.record.server = models.ServerRecord(**self.server.record())
        self.write()  # the pid is on disk before anything can hang
        t0 = time.monotonic()
        try:
            self.record.timings_s["server_start"] = round(self.server.wait_ready(), 3)
        except ServerError:
            # a start that failed is still start-up time, not the harness's overhead
            self.record.timings_s["server_start"] = round(time.monotonic() - t0, 3)
            raise
        imports.join(60.0)  # done before any suite runs
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
        if self.fingerprinted():
            try:
                self.record.server_config = server_metrics.server_config(
                    self.server.base_url, self.server.spec.log_path
                )
            except (OSError, ValueError) as e:
                self.record.server_config = {"error": f"GET /server_info: {e}"}
        if self.nvml is not None:
            from patchbench.run.gpu import GpuSampler

            self.sampler = GpuSampler(
                self.nvml, ours=_runner_and_children, visible=spec.env.get("CUDA_VISIBLE_DEVICES")
            ).start()

    # ------------------------------------------------------------------ step 2: run suites
    def run_suites(self, names: list[str]) -> None:
        """Run ``names`` in order, ``/flush_cache`` between two. Raises ServerError when the server
        died, stopped answering or refused the flush."""
        for i, name in enumerate(names):
            if self.server is not None and i > 0:
                t = time.monotonic()
                self.server.flush_cache()
                self.record.timings_s[f"flush:{name}"] = round(time.monotonic() - t, 3)
            self.run_suite(name)
            if self.watch is not None and self.watch.dead.is_set():
                raise ServerError(self.watch.lost.message(), self._log_tail())

    def fingerprinted(self) -> bool:
        """Whether this cell's server suites are fingerprinted from ``/metrics`` (timed cells,
        ``server.metrics``)."""
        return self.cell.kind == "timed" and self.cfg.server.metrics and self.server is not None

    def _scrape(self) -> server_metrics.Snapshot | str:
        """The server's ``/metrics`` now, or why not."""
        try:
            return server_metrics.scrape(self.server.base_url)
        except (OSError, ValueError) as e:
            return f"GET /metrics: {e}"

    def _fingerprint(self, name: str, before: server_metrics.Snapshot | str) -> None:
        """Suite ``name``'s fingerprint (from ``before`` to now) into ``server_metrics``."""
        after = self._scrape()
        bad = next((x for x in (before, after) if isinstance(x, str)), None)
        fp = models.ServerMetrics(error=bad) if bad else server_metrics.fingerprint(before, after)
        self.record.server_metrics = {**self.record.server_metrics, name: fp}

    def _scan_log(self, res: SuiteResult, start_offset: int | None) -> None:
        """Retractions and OOM lines of this suite into ``meta["server_log_scan"]``."""
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
        """Run one suite and write its summary; a failure is recorded, not raised."""
        if self.progress is not None:
            self.progress.suite_started(name)
        if self.record.load_avg_1m is None:  # the host's load as the cell's first suite starts
            self.record.load_avg_1m = models.LoadAverage(start=envinfo.load_avg_1m())
        before = self._scrape() if self.fingerprinted() else None
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
            raise
        except Exception as e:  # noqa: BLE001 - a suite bug must not lose the other cells
            res = SuiteResult(
                status="failed", errors=[f"{type(e).__name__}: {e}", traceback.format_exc()]
            )
        refuse_impossible(res)
        if self.server is not None:
            self._check_server_after(res)
            self._scan_log(res, log_off)
        dt = time.monotonic() - t
        if before is not None:
            self._fingerprint(name, before)
        res.meta.setdefault("duration_s", round(dt, 3))
        self.guard()
        runfolder.write_summary(self.cdir / name, res.to_json(name))
        self.record.suites[name] = res.status
        self.record.timings_s[f"suite:{name}"] = round(dt, 3)
        self.record.load_avg_1m.end = envinfo.load_avg_1m()  # the last suite's is kept
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
            live, w = self.record.liveness, self.watch
            if live is not None:
                if w.death is not None:
                    live.death = w.death
                if w.stall is not None:
                    live.stall = w.stall
                if w.lost is not None:
                    live.killed_clients = list(w.killed_clients)
        if self.server is None:
            return
        t = time.monotonic()
        try:
            self.server.stop(nvml=self.nvml)
        except ServerError as e:
            self.fail(str(e))
        self.record.timings_s["server_stop"] = round(time.monotonic() - t, 3)
        cap = self.server.log_cap
        if cap is not None and cap.note:
            self.record.notes.append(cap.note)
        self.record.server.events = self.server.events
        self.record.server.stop_breakdown_s = models.StopBreakdown(**self.server.stop_breakdown_s)
        if self.sampler is not None:
            g = self.sampler.close()
            self.record.gpu = g
            self.record.notes += g.flags

    # ------------------------------------------------------------------ step 4: record
    def finish(self, *, best_effort: bool = False) -> CellRecord:
        """Collect the instrumentation, settle the status, write cell.json (``best_effort``: a
        write error is only logged, another error is on its way out); returns the record."""
        for name, ins in self.instrumentation.items():
            if ins.collect is None or ins.out_dir is None:
                continue
            try:
                self.record.instrumentation[name] = ins.collect(Path(ins.out_dir))
            except Exception as e:  # noqa: BLE001 - one broken collector must not lose the cell
                self.record.instrumentation[name] = {"error": f"{type(e).__name__}: {e}"}
        self.record.timings_s["cell"] = round(time.monotonic() - self.t0, 3)
        if self.record.status == "running":
            st = set(self.record.suites.values())
            self.record.status = (
                "failed" if "failed" in st else "incomplete" if "incomplete" in st else "ok"
            )
        self.record.ended_at = utc_stamp()
        try:
            self.write()
        except (ResultsWriteError, RunFolderGone) as e:
            if not best_effort:
                raise
            self.say(f"cell.json not updated either: {e}")
        return self.record

    def fail(self, message: str) -> None:
        self.record.status = "failed"
        self.record.error = f"{self.record.error or ''}\n{message}".strip()

    def server_failed(self, e: ServerError) -> None:
        """The server failed (start, death, flush): the cell fails; suites not run are marked."""
        self.fail(str(e))
        for s in self.remote:
            if s not in self.record.suites:
                self.guard()
                runfolder.write_summary(
                    self.cdir / s,
                    SuiteResult(
                        status="failed", errors=[f"not run: {str(e).splitlines()[0]}"]
                    ).to_json(s),
                )
                self.record.suites[s] = "failed"
        self.say(f"FAILED - {str(e).splitlines()[0]}")


def _runner_and_children() -> set[int]:
    """This process and its descendants (the GPU sampler's "ours")."""
    pids = {os.getpid()}
    try:
        pids |= {p.pid for p in psutil.Process(os.getpid()).children(recursive=True)}
    except psutil.NoSuchProcess:
        pass
    return pids


def run_cell(
    cfg: Config,
    cell: Cell,
    venv: VariantEnv,
    run_dir: Path,
    *,
    port: int,
    log: Callable[[str], None],
    progress: Any,
    nvml: Any,
    launch: LaunchSpecFn,
    folder_id: tuple[int, int] | None = None,
) -> CellRecord:
    """Run one cell; returns its record. Never raises for a failure of the server or a suite; an
    interrupt (KeyboardInterrupt, Terminated) or a ResultsWriteError stops the server, is recorded
    and propagates; ``folder_id``: the run folder's identity at the run's start, checked before
    every write (RunFolderGone, exit 4, when it was deleted: the server is stopped, nothing
    recreated)."""
    c = CellRun(
        cfg, cell, venv, Path(run_dir), port, log, progress, nvml, launch, folder_id=folder_id
    )
    c.record.variant_identity = venv.identity or None
    try:
        c.run_suites(c.local)
        if c.remote:
            c.start()
            c.run_suites(c.remote)
    except KeyboardInterrupt as e:
        c.record.status = "interrupted"
        c.record.error = f"interrupted by {signal.Signals(signum_of(e)).name}"
        raise
    except ServerError as e:
        c.server_failed(e)
    except ResultsWriteError as e:  # results folder unwritable or full: the run ends (exit 4)
        c.fail(str(e))
        c.say(f"FAILED - {e}")
        raise
    finally:
        failing = sys.exc_info()[1] is not None
        c.stop()
        c.finish(best_effort=failing)
    return c.record
