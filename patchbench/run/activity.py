"""What :class:`patchbench.run.liveness.ServerWatch` reads to tell a slow server from a stalled
one: a suite's :class:`ProgressMeter`, a silent client's :class:`ClientActivity`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

#: CPU seconds per second a watched client must use for its computing alone to count as progress
#: (an idle asyncio client waiting on sockets uses well under 1 %)
CLIENT_BUSY_CPU_SHARE = 0.05
#: voluntary context switches per second (wake-ups: a received chunk wakes the client) that count
#: as progress of a watched client; one timer firing once a second is not
CLIENT_WAKEUPS_PER_S = 2.0
#: seconds between two samples of a watched client's activity
CLIENT_SAMPLE_S = 1.0


@dataclass
class ClientActivity:
    """What a watched client (``pid`` and its descendants) has done, sampled about once a second
    (what counts as progress: docs/faults.md). ``outputs``: the files its stdout and stderr go to;
    ``idle_s``: its longest expected wait."""

    pid: int
    name: str
    outputs: list[Path]
    idle_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    last_sample: float | None = None
    io_bytes: int | None = None
    wakeups: int = 0
    cpu_s: float = 0.0
    sizes: tuple = ()
    last_line: str = ""

    def _processes(self) -> list[psutil.Process]:
        try:
            p = psutil.Process(self.pid)
            return [p] + p.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def sample(self, now: float | None = None) -> bool:
        """Read the client's counters; True when it made progress since the last sample."""
        now = time.monotonic() if now is None else now
        io, cpu, io_known, wake = 0, 0.0, False, 0
        for p in self._processes():
            wake += _wakeups(p)
            try:
                c = p.cpu_times()
                cpu += c.user + c.system
                i = p.io_counters()
                io += int(getattr(i, "read_chars", i.read_bytes)) + int(
                    getattr(i, "write_chars", i.write_bytes)
                )
                io_known = True
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        sizes = tuple(_size(f) for f in self.outputs)
        first = self.last_sample is None
        dt = 0.0 if first else now - self.last_sample
        moved = (
            (io_known and io != self.io_bytes)
            or sizes != self.sizes
            or (not first and cpu - self.cpu_s >= CLIENT_BUSY_CPU_SHARE * dt)
            or (not first and wake - self.wakeups >= CLIENT_WAKEUPS_PER_S * dt)
        )
        if sizes != self.sizes:
            self.last_line = _last_line(self.outputs) or self.last_line
        self.io_bytes = io if io_known else self.io_bytes
        self.cpu_s, self.sizes, self.last_sample, self.wakeups = cpu, sizes, now, wake
        if moved:
            self.last_progress = now
        return moved

    def last_seen(self) -> str:
        """When the client last made progress and its last printed line, in words."""
        line = self.last_line[-200:] if self.last_line else "(nothing printed)"
        return (
            f"last progress {self.last_progress - self.started:.1f} s after it started; "
            f"its last printed line: {line!r}"
        )


def _wakeups(p: psutil.Process) -> int:
    """Voluntary context switches of every thread of ``p`` (psutil counts the main thread's)."""
    total, seen = 0, False
    try:
        tasks = os.listdir(f"/proc/{p.pid}/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            with open(f"/proc/{p.pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
                        seen = True
                        break
        except (OSError, ValueError):
            continue
    if seen:
        return total
    try:
        return int(p.num_ctx_switches().voluntary)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _last_line(paths: list[Path]) -> str:
    """The last non-empty line (a tqdm bar's last ``\\r`` update) of the newest of ``paths``."""
    best, when = "", -1.0
    for path in paths:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                text = f.read().decode("utf-8", "replace")
            mtime = path.stat().st_mtime
        except OSError:
            continue
        parts = [x.strip() for x in text.replace("\r", "\n").split("\n") if x.strip()]
        if parts and mtime >= when:
            best, when = parts[-1], mtime
    return best


class ProgressMeter:
    """Work a suite has outstanding on the server and when it last saw progress (thread-safe):
    :meth:`expect` before sending, :meth:`done` per reply, :meth:`idle` when it stops waiting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outstanding = 0
        self.last = time.monotonic()
        self.what = "replies"
        self.client: ClientActivity | None = None
        self.quiet_window: tuple[float, str, str] | None = None
        #: the last window that closed and when: a silence begun inside it is named after it
        self.last_quiet: tuple[float, str, str, float] | None = None

    def expect(self, n: int, what: str = "replies") -> None:
        """``n`` more requests are outstanding (the clock starts now when none were)."""
        with self._lock:
            if self.outstanding <= 0:
                self.last = time.monotonic()
            self.outstanding += max(0, int(n))
            self.what = what

    def done(self, n: int = 1) -> None:
        """``n`` replies arrived: progress now."""
        with self._lock:
            self.outstanding = max(0, self.outstanding - int(n))
            self.last = time.monotonic()

    def idle(self) -> None:
        """Nothing is outstanding any more (the suite stopped waiting)."""
        with self._lock:
            self.outstanding = 0
            self.last = time.monotonic()

    def silent_for(self) -> tuple[int, float]:
        """(requests outstanding, seconds since the last progress)."""
        with self._lock:
            return self.outstanding, time.monotonic() - self.last

    # ------------------------------------------------------------------ a watched client
    def watch_client(
        self, pid: int, name: str, outputs: list[Path] | tuple = (), idle_s: float = 0.0
    ) -> None:
        """Watch client ``pid`` (e.g. "bench_serving"), replacing any watched before."""
        with self._lock:
            self.client = ClientActivity(pid, name, [Path(p) for p in outputs], idle_s=idle_s)

    def unwatch_client(self) -> None:
        """The watched client ended (or the suite stopped waiting for it)."""
        with self._lock:
            self.client = None

    # ------------------------------------------------------------------ an announced silence
    @contextmanager
    def quiet(self, limit_s: float, what: str, setting: str) -> Iterator[None]:
        """Inside, the heartbeat may stay unanswered for up to ``limit_s`` seconds because of
        ``what``; ``setting`` (e.g. "profile.trace_timeout_s") is named in a stall's message."""
        with self._lock:
            self.quiet_window = (float(limit_s), what, setting)
        try:
            yield
        finally:
            with self._lock:
                self.quiet_window = None
                self.last_quiet = (float(limit_s), what, setting, time.monotonic())
