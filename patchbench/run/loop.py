"""One ``bench`` invocation from its run folder on: :class:`BenchRun` runs the planned cells
look by look, rewrites the manifest after each cell and look, and records how the run ended
(finished, stopped by an unwritable results folder, interrupted by a signal).

Every manifest write goes through :meth:`BenchRun.save` (patchbench.runfolder.write_manifest,
atomic), every cell through patchbench.run.cell.run_cell.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.config import Config
from patchbench.errors import Interrupted
from patchbench.records import ResultsWriteError
from patchbench.run import overhead
from patchbench.run.cell import cell_done, run_cell, utc_stamp
from patchbench.run.identity import variant_identity
from patchbench.run.looks import sequential_design, sequential_look, sequential_record
from patchbench.run.manifest import cell_entry
from patchbench.run.order import Cell
from patchbench.run.progress import BenchProgress, stamped
from patchbench.run.signals import signum_of
from patchbench.run.variants import VariantEnv
from patchbench.runfolder import read_cell, write_manifest
from patchbench.runfolder.models import ManifestCell, RunManifest, RunTimings

#: how to run patchbench again from this environment (the venv's console script need not be on PATH)
PROG = f"{sys.executable} -m patchbench"


@dataclass
class BenchRun:
    """The state of one invocation of ``bench CONFIG``.

    ``say``: the console log before the progress bar exists (and for the end-of-run lines);
    ``log``: a caller's log for everything (None: lines go above the progress bar). The fields
    after ``log`` are set as the run gets to them (:func:`patchbench.run.bench.run_bench`).
    ``entries``: this invocation's cell entries (also ``manifest.cells``).
    """

    config_path: str
    say: Callable[[str], None]
    log: Callable[[str], None] | None = None
    cfg: Config | None = None
    run_dir: Path | None = None
    manifest: RunManifest | None = None
    progress: BenchProgress | None = None
    variants: dict[str, VariantEnv] = field(default_factory=dict)
    port: int = 0
    nvml: Any = None
    resumed: bool = False
    failed: int = 0
    #: timed cells (run now or earlier) whose record says incomplete: a suite's measurement is
    #: invalid, so no verdict comes from it (the run exits 4)
    incomplete: list[str] = field(default_factory=list)
    processed: set[int] = field(default_factory=set)
    restart_variants: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ helpers
    @property
    def entries(self) -> list[ManifestCell]:
        return self.manifest.cells if self.manifest is not None else []

    @property
    def timings(self) -> RunTimings:
        """This invocation's timings (a resumed run's are its last ``resumes`` entry)."""
        m = self.manifest
        return m.resumes[-1].timings_s if self.resumed else m.timings_s

    def cell_log(self, msg: str) -> None:
        """A line about a cell: to the caller's log, else above the progress bar."""
        if self.log is not None:
            self.log(msg)
        else:
            self.progress.log(stamped(msg))

    def console(self, msg: str) -> None:
        """A line while the run is set up or stopping: above the progress bar when there is one."""
        (self.progress.log if self.progress is not None else self.say)(msg)

    def save(self) -> None:
        """Write the manifest (atomically); raises ResultsWriteError when it cannot be written."""
        write_manifest(self.run_dir, self.manifest)

    # ------------------------------------------------------------------ the cells
    def run_cells(self, cells: list[Cell]) -> None:
        """Run ``cells`` (those done already are skipped), look by look for a sequential
        schedule (it stops at the look that decides), then close the progress bar."""
        cfg = self.cfg
        design = sequential_design(cfg)
        looks = list(design.looks) if design else [cfg.schedule.max_repeats]
        decision = None
        for li, n_rounds in enumerate(looks):
            for cell in cells:
                if cell.index in self.processed or (
                    cell.kind == "timed" and cell.repeat >= n_rounds
                ):
                    continue
                self.processed.add(cell.index)
                self.run_or_skip(cell)
            if design is None:
                continue
            decision = self.look(design, li, n_rounds, decision)
            if decision is None or decision.stop:
                break
        self.progress.set_total(len(self.processed))
        self.progress.close()

    def _count_incomplete(self, cell: Cell, rec) -> None:
        if cell.kind == "timed" and rec is not None and rec.status == "incomplete":
            self.incomplete.append(cell.label)

    def problems(self) -> list[str]:
        """What makes this run exit 4 after the report: failed cells, incomplete timed cells, a
        report that could not be written ([] when none)."""
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

    def run_or_skip(self, cell: Cell) -> None:
        """Run ``cell`` and record it (the manifest is rewritten), or record it as skipped when
        an earlier invocation finished it."""
        if cell_done(self.run_dir, cell, self.cfg):
            rec = read_cell(cell.path(self.run_dir))
            self.cell_log(f"{cell.label}: done already, skipped")
            self._count_incomplete(cell, rec)
            self.entries.append(cell_entry(cell, self.run_dir, rec, skipped=True))
            self.progress.cell_skipped(cell.label)
            return
        self.progress.cell_started(cell.label)
        rec = run_cell(
            self.cfg,
            cell,
            self.variants[cell.variant],
            self.run_dir,
            port=self.port,
            log=self.cell_log,
            progress=self.progress,
            nvml=self.nvml,
            identity=variant_identity(self.cfg, self.variants[cell.variant]),
        )
        self.progress.cell_finished(rec.status, rec.timings_s)
        self.failed += rec.status == "failed"
        self._count_incomplete(cell, rec)
        self.entries.append(cell_entry(cell, self.run_dir, rec, skipped=False))
        self.save()

    def look(self, design, look_index: int, n_rounds: int, previous):
        """The sequential look after ``n_rounds`` rounds, recorded in the manifest; returns its
        LookDecision (None: a pair is missing, the run stops)."""
        decision, why = sequential_look(self.cfg, self.run_dir, design, look_index, previous)
        self.manifest.sequential = sequential_record(
            self.cfg, design, self.manifest.sequential, look_index, n_rounds, decision, why
        )
        self.save()
        self.cell_log(
            f"sequential look {look_index + 1} of {len(design.looks)} after {n_rounds} rounds: "
            + self.manifest.sequential.reason
        )
        return decision

    # ------------------------------------------------------------------ how it ends
    def stopped(self, e: ResultsWriteError) -> None:
        """The results folder cannot be written: note the error in the manifest (if it can
        still be written) and say how to resume."""
        if self.progress is not None:
            self.progress.close()
        if self.manifest is not None:
            self.manifest.ended_at = utc_stamp()
            self.manifest.error = str(e)
            try:
                self.save()
            except ResultsWriteError:
                pass
        if self.run_dir is not None:
            e.run_dir = self.run_dir
            self.say(
                f"stopped: {e}; finished cells are kept in {self.run_dir}; once it is writable, "
                f"resume with: {PROG} bench {self.config_path} --resume {self.run_dir}"
            )

    def interrupted(self, e: BaseException) -> Interrupted:
        """A signal stopped the run (the cell's server is stopped already): mark the manifest
        interrupted and say how to resume; returns the error to raise (exit 130, 143)."""
        if self.progress is not None:
            self.progress.close()
        if self.run_dir is None:
            return Interrupted("interrupted before any cell ran", signum=signum_of(e))
        if self.manifest is not None:
            self.manifest.ended_at = utc_stamp()
            self.manifest.interrupted = True
            self.save()
        cmd = f"{PROG} bench {self.config_path} --resume {self.run_dir}"
        self.say(f"interrupted; finished cells are kept in {self.run_dir}; resume with: {cmd}")
        return Interrupted(
            f"interrupted by signal {signum_of(e)}; finished cells are kept in "
            f"{self.run_dir}; resume with `{cmd}`",
            signum=signum_of(e),
            run_dir=self.run_dir,
        )

    def interrupted_in_report(self, e: BaseException) -> Interrupted:
        """A signal stopped the report after every cell was measured: the manifest records it as
        the report's error (the run itself is not interrupted: nothing is left to run); returns
        the error to raise (exit 130, 143), naming the command that writes the report."""
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

    def finish(self, report: Callable[[Path], str | None], t_run: float) -> None:
        """The measurements are done: record the end, run ``report`` (returns an error text or
        None), then the timings of this invocation and its overhead."""
        self.manifest.ended_at = utc_stamp()  # the measurements end here; the report reads it
        self.save()
        t_report = time.monotonic()
        report_error = report(self.run_dir)
        t = self.timings
        t.report = round(time.monotonic() - t_report, 3)
        t.total = round(time.monotonic() - t_run, 3)
        t.harness_overhead_share = overhead.overhead_share(self.entries, t)
        t.overhead_breakdown_s = overhead.overhead_breakdown(self.entries, t)
        t.server_stop_breakdown_s = overhead.stop_breakdown(self.run_dir, self.entries)
        if report_error:
            self.manifest.report_error = report_error
        self.save()

    def summary_lines(self, verbose: bool) -> list[str]:
        """The end-of-run lines: total time and overhead share (and with ``verbose`` the
        breakdown)."""
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
