"""Liveness of a whole sglang server while suites run, and stopping a suite at once when it dies.

An sglang server is a process group: the HTTP front end (the launched process, which also holds
the tokenizer manager), one ``sglang::scheduler*`` process per TP rank and a
``sglang::detokenizer``. When a scheduler dies (OOM killer, a crash in a kernel, ``kill -9``) the
front end keeps answering connections, and a client waits for its own timeout: bench_serving
until the suite's ``timeout_s``, MMMU for ``request_timeout_s x (retries + 1)`` per wave.

:class:`ServerWatch` is a thread that polls every watched process of the group with psutil
(``interval_s``, 0.2 s by default; it sends nothing to the server, so timed suites are not
disturbed). When one of them exits (or turns zombie) it, in this order:

1. records a :class:`Death` (which process, its role, pid, exit code when known, seconds until it
   was seen) and sets :attr:`ServerWatch.dead` (a ``threading.Event`` suites may poll);
2. kills the client process groups of the running suite: every group registered with
   :meth:`ServerWatch.register_client` and every descendant of the runner started since the
   suite began that is not part of the server (bench_serving runs in its own session);
3. kills the server's group with SIGKILL (its results are already worthless; in-flight requests
   then fail at once instead of hanging);
4. when the main thread is inside :meth:`ServerWatch.cancel_scope`, raises :class:`ServerLost`
   there (delivered with ``SIGUSR2`` to the main thread, so a blocking ``recv`` or
   ``asyncio`` wait is interrupted as a Ctrl-C would be).

Which processes are watched: the processes of the group (and descendants of the leader) present
when the server became ready, except short-lived tools (a compiler or shell that a JIT spawned):
only the leader, Python processes and processes titled ``sglang::...`` count. Processes that
appear later are not watched (they are transient helpers).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

#: the signal the watcher sends to the main thread to cancel a suite (nothing else uses it)
CANCEL_SIGNAL = signal.SIGUSR2


class ServerLost(KeyboardInterrupt):
    """Raised in the main thread when a process of the server died while a suite ran.

    Derives from KeyboardInterrupt on purpose: every suite already cleans up for Ctrl-C (kills its
    client, re-raises) and no ``except Exception`` in a suite swallows it. ``death`` says which
    process died.
    """

    def __init__(self, death: Death):
        super().__init__(death.message())
        self.death = death


@dataclass
class Death:
    """One watched process of the server that exited.

    pid: its pid; role: e.g. "the sglang scheduler"; name: its process title (``sglang::scheduler``)
    or executable name; returncode: exit status when the watcher could read it (the leader only;
    negative = killed by that signal), else None; detected_after_s: seconds from the watch's start
    to the moment it was seen dead.
    """

    pid: int
    role: str
    name: str
    returncode: int | None
    detected_after_s: float

    def message(self) -> str:
        """``"the sglang scheduler (pid 1234) died"`` (with the exit status when known)."""
        how = ""
        if self.returncode is not None:
            how = (
                f", killed by signal {-self.returncode}"
                if self.returncode < 0
                else f", exit code {self.returncode}"
            )
        return f"{self.role} (pid {self.pid}) died{how}"

    def to_json(self) -> dict:
        return {
            "pid": self.pid,
            "role": self.role,
            "name": self.name,
            "returncode": self.returncode,
            "detected_after_s": round(self.detected_after_s, 3),
        }


def role_of(name: str, cmdline: list[str], is_leader: bool) -> str:
    """A human name for a process of an sglang server.

    ``sglang::scheduler_TP0`` -> "the sglang scheduler", ``sglang::detokenizer`` -> "the sglang
    detokenizer", the launched process -> "the sglang server (HTTP front end)", anything else ->
    "server process <name>".
    """
    title = " ".join(cmdline) if cmdline else name
    for text in (title, name):  # the title first: psutil's name() is cut at 15 characters
        if text.startswith("sglang::"):
            what = text[len("sglang::") :].split()[0]
            base = what.split("_")[0] if what.startswith("scheduler") else what
            return f"the sglang {base}"
    if is_leader:
        return "the sglang server (HTTP front end)"
    return f"server process {name or '?'}"


def _watchable(p: psutil.Process, leader_pid: int) -> bool:
    if p.pid == leader_pid:
        return True
    try:
        name = p.name()
        cmd = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    first = (cmd[0] if cmd else "") or name
    return (
        name.startswith("sglang::")
        or first.startswith("sglang::")
        or "python" in os.path.basename(first.split()[0] if first else "")
        or "python" in name
    )


def _is_dead(p: psutil.Process) -> bool:
    try:
        return (not p.is_running()) or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def group_processes(pgid: int, leader: psutil.Process | None = None) -> list[psutil.Process]:
    """Live processes whose process group is ``pgid``, plus every descendant of ``leader``
    (a child may have left the group with setsid). The leader first when it lives."""
    out: dict[int, psutil.Process] = {}
    if leader is not None:
        try:
            if not _is_dead(leader):
                out[leader.pid] = leader
            for c in leader.children(recursive=True):
                out.setdefault(c.pid, c)
        except psutil.NoSuchProcess:
            pass
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.setdefault(p.pid, p)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return [p for p in out.values() if not _is_dead(p)]


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


@dataclass
class _Watched:
    proc: psutil.Process
    role: str
    name: str


@dataclass
class ServerWatch:
    """Watch the processes of one server; see the module docstring.

    leader: the launched process (``subprocess.Popen``; its exit code is read from it);
    pgid: the server's process group; interval_s: poll period in seconds;
    on_death: called once from the watcher thread with the :class:`Death` (after the kills).
    Use :meth:`start` after the server is ready and :meth:`close` before stopping it.
    """

    leader: object  # subprocess.Popen
    pgid: int
    interval_s: float = 0.2
    on_death: Callable[[Death], None] | None = None
    dead: threading.Event = field(default_factory=threading.Event)
    death: Death | None = None
    watched: list[_Watched] = field(default_factory=list)
    killed_clients: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _t0: float = 0.0
    _clients: set[int] = field(default_factory=set)
    _suite_started: float | None = None
    _before: set = field(default_factory=set)
    _armed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ set-up
    def start(self) -> ServerWatch:
        """Snapshot the server's processes and start polling them (a daemon thread)."""
        leader = None
        try:
            leader = psutil.Process(self.leader.pid)
        except psutil.NoSuchProcess:
            pass
        for p in group_processes(self.pgid, leader):
            if not _watchable(p, self.leader.pid):
                continue
            try:
                name, cmd = p.name(), p.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            title = cmd[0] if len(cmd) == 1 else name  # setproctitle leaves one argv entry
            self.watched.append(_Watched(p, role_of(name, cmd, p.pid == self.leader.pid), title))
        self._t0 = time.monotonic()
        self._thread = threading.Thread(
            target=self._loop, name="patchbench-server-watch", daemon=True
        )
        self._thread.start()
        return self

    def describe(self) -> list[dict]:
        """The watched processes as ``[{"pid", "role", "name"}]`` (for cell.json)."""
        return [{"pid": w.proc.pid, "role": w.role, "name": w.name} for w in self.watched]

    def close(self) -> None:
        """Stop polling (before the server is stopped on purpose). Safe to call twice."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ clients
    def register_client(self, pgid: int) -> None:
        """A client process group (e.g. bench_serving, started with ``start_new_session``) to kill
        when the server dies."""
        with self._lock:
            self._clients.add(pgid)

    def suite_started(self) -> None:
        """Mark the start of a suite: runner descendants that appear from now on are its clients
        (those alive now are remembered and never killed)."""
        self._before = set()
        try:
            self._before = {
                (p.pid, p.create_time())
                for p in psutil.Process(os.getpid()).children(recursive=True)
            }
        except psutil.NoSuchProcess:
            pass
        self._suite_started = time.time()

    def kill_clients(self) -> list[int]:
        """SIGKILL every registered client group and every runner descendant that appeared since
        :meth:`suite_started` and is not a server process. Returns the pids/pgids killed."""
        killed: list[int] = []
        with self._lock:
            groups = set(self._clients)
        since = self._suite_started
        if since is not None:
            try:
                me = psutil.Process(os.getpid())
                kids = me.children(recursive=True)
            except psutil.NoSuchProcess:
                kids = []
            server_pids = {w.proc.pid for w in self.watched}
            for k in kids:
                try:
                    if k.pid in server_pids or os.getpgid(k.pid) == self.pgid:
                        continue
                    if (k.pid, k.create_time()) in self._before:
                        continue
                    pg = os.getpgid(k.pid)
                except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                    continue
                if pg != os.getpgid(0):
                    groups.add(pg)
                else:
                    try:
                        k.kill()
                        killed.append(k.pid)
                    except psutil.NoSuchProcess:
                        pass
        for g in sorted(groups):
            if kill_group(g):
                killed.append(g)
        self.killed_clients.extend(killed)
        return killed

    # ------------------------------------------------------------------ cancelling the suite
    @contextmanager
    def cancel_scope(self) -> Iterator[None]:
        """While inside, a death raises :class:`ServerLost` in the main thread at once.

        Outside the main thread (no signal handlers there) the scope only marks the suite start;
        the suite then learns of the death through :attr:`dead` and its client being killed.
        """
        self.suite_started()
        main = threading.current_thread() is threading.main_thread()
        old = None
        if main:

            def _handler(signum, frame):
                if self._armed and self.death is not None:
                    self._armed = False
                    raise ServerLost(self.death)

            old = signal.signal(CANCEL_SIGNAL, _handler)
            self._armed = True
            if self.death is not None:  # died before the scope began
                self._armed = False
                signal.signal(CANCEL_SIGNAL, old)
                raise ServerLost(self.death)
        try:
            yield
        finally:
            self._armed = False
            if main:
                signal.signal(CANCEL_SIGNAL, old)
            self._suite_started = None

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            for w in self.watched:
                if _is_dead(w.proc):
                    self._died(w)
                    return

    def _died(self, w: _Watched) -> None:
        rc = None
        if w.proc.pid == self.leader.pid:
            try:
                rc = self.leader.poll()
            except Exception:  # noqa: BLE001 - the exit code is a nicety
                rc = None
        self.death = Death(w.proc.pid, w.role, w.name, rc, time.monotonic() - self._t0)
        self.dead.set()
        self.kill_clients()
        kill_group(self.pgid, signal.SIGKILL)
        if self._armed:
            try:
                signal.pthread_kill(threading.main_thread().ident, CANCEL_SIGNAL)
            except (ProcessLookupError, OSError):
                pass
        if self.on_death is not None:
            self.on_death(self.death)
