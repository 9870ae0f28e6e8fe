"""Overall progress of ``bench``: cells done of total, the current cell and suite, elapsed time
and an ETA (a rich bar on a terminal, one plain line per cell otherwise, e.g. in CI logs).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def stamped(msg: str) -> str:
    """``msg`` as one line of ``bench``'s log: ``[patchbench HH:MM:SS] msg`` (local time)."""
    return f"[patchbench {time.strftime('%H:%M:%S')}] {msg}"


def say(msg: str) -> None:
    """Print ``msg`` as one :func:`stamped` line on stdout (flushed)."""
    print(stamped(msg), flush=True)


def eta_by_suite(
    finished: list[tuple[float, dict[str, float]]],
    remaining: list[list[str]],
    in_current_s: float = 0.0,
) -> float | None:
    """Seconds left for the cells ``remaining`` (each its suite names; the first running for
    ``in_current_s``) from ``finished`` cells' (duration s, timings_s): per cell the median
    fixed part plus the median time of each of its suites (at least the median cell when a
    suite has not run yet). None before any cell finished; 0.0 when nothing remains."""
    if not remaining:
        return 0.0
    if not finished:
        return None
    per_suite: dict[str, list[float]] = {}
    fixed = []
    for took, timings in finished:
        suite_s = {k[len("suite:") :]: v for k, v in timings.items() if k.startswith("suite:")}
        for name, v in suite_s.items():
            if v is not None:
                per_suite.setdefault(name, []).append(float(v))
        fixed.append(max(0.0, took - sum(v for v in suite_s.values() if v is not None)))
    base = statistics.median(fixed)
    whole = statistics.median([took for took, _ in finished])
    total = 0.0
    for i, suites in enumerate(remaining):
        known = base + sum(statistics.median(per_suite[n]) for n in suites if n in per_suite)
        t = known if all(n in per_suite for n in suites) else max(known, whole)
        total += max(0.0, t - in_current_s) if i == 0 else t
    return total


def fmt_duration(s: float | None) -> str:
    """``"1h02m"``, ``"3m05s"``, ``"42s"``; ``"?"`` for None."""
    if s is None:
        return "?"
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class BenchProgress:
    """Progress of one ``bench`` invocation over ``total`` cells (``live``: a bar, default on a
    terminal; ``plan``: {cell label: its suites} for :func:`eta_by_suite`)."""

    def __init__(
        self,
        total: int,
        *,
        console: Console | None = None,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        plan: dict[str, list[str]] | None = None,
    ):
        self.total = total
        self.done = 0
        self.plan = plan
        #: (duration s, timings_s) of every cell finished in this invocation
        self._finished: list[tuple[float, dict[str, float]]] = []
        self._seen: set[str] = set()
        self.console = console or Console()
        self.clock = clock
        self.t0 = clock()
        self.current = ""
        self.suite = ""
        self._t_cell = self.t0
        self.live = self.console.is_terminal if live is None else live
        self._progress: Progress | None = None
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("cells"),
                TimeElapsedColumn(),
                TextColumn("ETA {task.fields[eta]}"),
                console=self.console,
                transient=False,
            )
            self._task = self._progress.add_task("starting", total=total, eta="?")
            self._progress.start()

    # ------------------------------------------------------------------ events
    def cell_started(self, label: str) -> None:
        self.current, self.suite = label, ""
        self._seen.add(label)
        self._t_cell = self.clock()
        self._refresh()

    def suite_started(self, suite: str) -> None:
        self.suite = suite
        self._refresh()

    def cell_skipped(self, label: str | None = None) -> None:
        self.done += 1
        if label is not None:
            self._seen.add(label)
        self._refresh()

    def cell_finished(self, status: str, timings_s: dict[str, float] | None = None) -> None:
        """A cell ended; ``suite:<name>`` keys of ``timings_s`` feed the ETA."""
        took = self.clock() - self._t_cell
        self._finished.append((took, dict(timings_s or {})))
        self.done += 1
        self.current, self.suite = "", ""
        self._refresh()
        if not self.live:
            self.console.print(self.line(), highlight=False)

    def set_total(self, total: int) -> None:
        """Change the number of cells (a sequential run that stops before its maximum)."""
        self.total = max(total, self.done)
        if self._progress is not None:
            self._progress.update(self._task, total=self.total)
        self._refresh()

    def log(self, msg: str) -> None:
        """Print ``msg`` above the bar (one unwrapped line in a log)."""
        self.console.print(msg, highlight=False, markup=False, soft_wrap=not self.live)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # ------------------------------------------------------------------ text
    def eta(self) -> float | None:
        left = max(0, self.total - self.done)
        if self.plan is None:
            return eta_by_suite([(took, {}) for took, _ in self._finished], [[]] * left)
        now = [self.plan.get(self.current, [])] if self.current else []
        rest = [v for k, v in self.plan.items() if k not in self._seen]
        in_cell = self.clock() - self._t_cell if self.current else 0.0
        return eta_by_suite(self._finished, (now + rest)[:left], in_cell)

    def line(self) -> str:
        """e.g. ``progress: 3/8 cells, elapsed 2m10s, ETA 3m20s``."""
        return (
            f"progress: {self.done}/{self.total} cells, elapsed "
            f"{fmt_duration(self.clock() - self.t0)}, ETA {fmt_duration(self.eta())}"
        )

    def _refresh(self) -> None:
        if self._progress is None:
            return
        desc = (
            self.current + (f" · {self.suite}" if self.suite else "")
            if self.current
            else "between cells"
        )
        self._progress.update(
            self._task, completed=self.done, description=desc, eta=fmt_duration(self.eta())
        )
