"""Liveness and progress of a whole sglang server while suites run, and stopping a suite at once
when the server dies or stops answering (:class:`ServerWatch`; the faults it catches:
docs/faults.md). Inside :meth:`ServerWatch.cancel_scope` a death or stall raises
:class:`ServerLost` in the main thread via ``SIGUSR2``, so a blocking wait is interrupted."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from patchbench.run.activity import CLIENT_SAMPLE_S, ProgressMeter
from patchbench.run.ports import group_members, is_live, kill_group
from patchbench.runfolder.models import ServerDeath, ServerStall

#: the signal the watcher sends to the main thread to cancel a suite (nothing else uses it)
CANCEL_SIGNAL = signal.SIGUSR2
#: seconds a process may stay stopped (state T) before it counts as a stall: longer than any
#: profiler's or debugger's pause (py-spy dump stops a process for well under a second)
STOPPED_GRACE_S = 2.0
#: psutil's names of the stopped states (SIGSTOP / SIGTSTP, and a tracer's stop)
_STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def heartbeat_interval(stall_timeout_s: float) -> float:
    """Seconds between heartbeats: a fifth of the stall limit, within 0.5..5 s."""
    return min(5.0, max(0.5, stall_timeout_s / 5.0))


def process_state(pid: int | None) -> str:
    """``"S (sleeping)"`` and the like; ``"gone"``; ``"?"`` when unreadable."""
    if pid is None:
        return "?"
    try:
        st = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"
    except (psutil.AccessDenied, OSError):
        return "?"
    letter = {
        psutil.STATUS_RUNNING: "R",
        psutil.STATUS_SLEEPING: "S",
        psutil.STATUS_DISK_SLEEP: "D",
        psutil.STATUS_STOPPED: "T",
        psutil.STATUS_TRACING_STOP: "t",
        psutil.STATUS_ZOMBIE: "Z",
        psutil.STATUS_DEAD: "X",
        psutil.STATUS_IDLE: "I",
    }.get(st, "?")
    return f"{letter} ({st})"


class ServerLost(KeyboardInterrupt):
    """The server died or stopped answering during a suite (``death``: the :class:`Death` or
    :class:`Stall`); a KeyboardInterrupt, so no ``except Exception`` swallows it."""

    def __init__(self, reason: Death | Stall):
        super().__init__(reason.message())
        self.death = reason


class Death(ServerDeath):
    """A watched server process that exited (``returncode``: the leader's only; negative: killed
    by that signal), as cell.json records it."""

    def message(self) -> str:
        how = ""
        if self.returncode is not None and self.returncode < 0:
            how = f", killed by signal {-self.returncode}"
            if -self.returncode == signal.SIGKILL:  # nothing in the process itself sends it
                how += (
                    " (SIGKILL, sent from outside: the kernel's out-of-memory killer names "
                    "its victims in `dmesg`, or someone ran kill -9)"
                )
        elif self.returncode is not None:
            how = f", exit code {self.returncode}"
        return f"{self.role} (pid {self.pid}) died{how}"


class Stall(ServerStall):
    """The server (or a client of the suite) stopped making progress, as cell.json records it
    (``pid``/``role``/``state``: the scheduler, else the front end; the stopped process or the
    client for the client kinds)."""

    def message(self) -> str:
        if self.kind == "client_stopped":
            return f"the suite's client stopped (pid {self.pid} in state {self.state}): {self.what}"
        if self.kind == "client_silent":
            return (
                f"the suite's client made no progress ({self.role}, pid {self.pid} in state "
                f"{self.state}): {self.what}"
            )
        who = self.role.removeprefix("the sglang ").removeprefix("the ")
        return (
            f"the server stopped answering ({who} pid {self.pid} in state {self.state}): "
            f"{self.what}"
        )


def _stall(kind: str, what: str, pid: int | None, role: str, silent_s: float, t0: float) -> Stall:
    """A :class:`Stall` now (seconds rounded to the millisecond, as cell.json keeps them)."""
    return Stall(
        kind=kind,
        what=what,
        pid=pid,
        role=role,
        state=process_state(pid),
        silent_s=round(silent_s, 3),
        detected_after_s=round(time.monotonic() - t0, 3),
    )


def role_of(name: str, cmdline: list[str], is_leader: bool) -> str:
    """``sglang::scheduler_TP0`` -> "the sglang scheduler", the leader -> "the sglang server (HTTP
    front end)", else "server process <name>"."""
    title = " ".join(cmdline) if cmdline else name
    for text in (title, name):  # the title first: psutil's name() is cut at 15 characters
        if text.startswith("sglang::"):
            what = text[len("sglang::") :].split()[0]
            base = what.split("_")[0] if what.startswith("scheduler") else what
            return f"the sglang {base}"
    if is_leader:
        return "the sglang server (HTTP front end)"
    return f"server process {name or '?'}"


def _watchable(name: str, cmd: list[str]) -> bool:
    """Worth watching besides the leader: an ``sglang::`` or Python process."""
    first = (cmd[0] if cmd else "") or name
    return (
        name.startswith("sglang::")
        or first.startswith("sglang::")
        or "python" in os.path.basename(first.split()[0] if first else "")
        or "python" in name
    )


def _status(p: psutil.Process) -> str | None:
    """psutil's status of ``p``; None when it is gone; "" when it cannot be read."""
    try:
        if not p.is_running():
            return None
        return p.status()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return ""


def group_processes(pgid: int, leader: psutil.Process | None = None) -> list[psutil.Process]:
    """Live processes of group ``pgid`` and descendants of ``leader`` (first)."""
    out: dict[int, psutil.Process] = {}
    if leader is not None:
        try:
            out = {p.pid: p for p in [leader, *leader.children(recursive=True)]}
        except psutil.NoSuchProcess:
            pass
    for p in group_members(pgid):
        out.setdefault(p.pid, p)
    return [p for p in out.values() if is_live(p)]


@dataclass
class _Watched:
    proc: psutil.Process
    role: str
    name: str


@dataclass
class ServerWatch:
    """Watch the processes and the progress of one server: :meth:`start`
    after it is ready, :meth:`close` before stopping it. ``leader``: the launched Popen;
    ``on_death``: called once from the watcher thread after the kills; ``stall_timeout_s``: None
    watches deaths only; ``heartbeat(timeout_s) -> bool``: one scheduler round trip."""

    leader: object  # subprocess.Popen
    pgid: int
    interval_s: float = 0.2
    on_death: Callable[[Death | Stall], None] | None = None
    stall_timeout_s: float | None = None
    heartbeat: Callable[[float], bool] | None = None
    progress: ProgressMeter = field(default_factory=ProgressMeter)
    stopped_grace_s: float = STOPPED_GRACE_S
    dead: threading.Event = field(default_factory=threading.Event)
    death: Death | None = None
    stall: Stall | None = None
    watched: list[_Watched] = field(default_factory=list)
    killed_clients: list[int] = field(default_factory=list)
    heartbeats: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _beat_thread: threading.Thread | None = None
    _t0: float = 0.0
    _last_beat: float = 0.0
    _suite_started: float | None = None
    _before: set = field(default_factory=set)
    _armed: bool = False
    _stopped_since: dict[int, float] = field(default_factory=dict)
    _next_client_scan: float = 0.0

    # ------------------------------------------------------------------ set-up
    def start(self) -> ServerWatch:
        """Snapshot the server's processes and start polling them (daemon threads)."""
        leader = None
        try:
            leader = psutil.Process(self.leader.pid)
        except psutil.NoSuchProcess:
            pass
        for p in group_processes(self.pgid, leader):
            try:
                name, cmd = p.name(), p.cmdline()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            is_leader = p.pid == self.leader.pid
            if is_leader or _watchable(name, cmd):
                title = cmd[0] if len(cmd) == 1 else name  # setproctitle leaves one argv entry
                self.watched.append(_Watched(p, role_of(name, cmd, is_leader), title))
        self._t0 = self._last_beat = time.monotonic()
        self.progress.idle()
        self._thread = threading.Thread(
            target=self._loop, name="patchbench-server-watch", daemon=True
        )
        self._thread.start()
        if self.heartbeat is not None and self.stall_timeout_s:
            self._beat_thread = threading.Thread(
                target=self._beat_loop, name="patchbench-heartbeat", daemon=True
            )
            self._beat_thread.start()
        return self

    def describe(self) -> list[dict]:
        """The watched processes as ``[{"pid", "role", "name"}]`` (for cell.json)."""
        return [{"pid": w.proc.pid, "role": w.role, "name": w.name} for w in self.watched]

    @property
    def lost(self) -> Death | Stall | None:
        """Why the server was given up: the :class:`Death` or :class:`Stall` (None: it wasn't)."""
        return self.death or self.stall

    def close(self) -> None:
        """Stop polling (before the server is stopped on purpose). Safe to call twice."""
        self._stop.set()
        # the heartbeat thread may wait in a round trip: it is a daemon and ends on its own
        for t, wait in ((self._thread, 5.0), (self._beat_thread, 0.5)):
            if t is not None and t is not threading.current_thread():
                t.join(timeout=wait)

    # ------------------------------------------------------------------ clients
    def suite_started(self) -> None:
        """A suite starts: runner descendants new from now on are its clients."""
        self._before = set()
        try:
            self._before = {
                (p.pid, p.create_time())
                for p in psutil.Process(os.getpid()).children(recursive=True)
            }
        except psutil.NoSuchProcess:
            pass
        self.progress.idle()
        self._suite_started = time.time()

    def _client_processes(self) -> list[psutil.Process]:
        """The runner's descendants new since the suite started, not the server's."""
        if self._suite_started is None:
            return []
        try:
            kids = psutil.Process(os.getpid()).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        server_pids = {w.proc.pid for w in self.watched}
        out = []
        for k in kids:
            try:
                if k.pid in server_pids or os.getpgid(k.pid) == self.pgid:
                    continue
                if (k.pid, k.create_time()) in self._before:
                    continue
            except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                continue
            out.append(k)
        return out

    def kill_clients(self) -> list[int]:
        """SIGKILL the suite's clients (their group when not ours); pids and pgids."""
        killed: list[int] = []
        groups: set[int] = set()
        own = os.getpgid(0)
        for k in self._client_processes():
            try:
                pg = os.getpgid(k.pid)
            except (ProcessLookupError, PermissionError):
                continue
            if pg != own:
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
        """While inside, a death or a stall raises :class:`ServerLost` in the main thread at once
        (in another thread only :attr:`dead` and the killed client tell the suite)."""
        self.suite_started()
        main = threading.current_thread() is threading.main_thread()
        old = None
        if main:

            def _handler(signum, frame):
                if self._armed and self.lost is not None:
                    self._armed = False
                    raise ServerLost(self.lost)

            old = signal.signal(CANCEL_SIGNAL, _handler)
            self._armed = True
            if self.lost is not None:  # lost before the scope began
                self._armed = False
                signal.signal(CANCEL_SIGNAL, old)
                raise ServerLost(self.lost)
        try:
            yield
        finally:
            self._armed = False
            if main:
                signal.signal(CANCEL_SIGNAL, old)
            self._suite_started = None
            self.progress.idle()
            self.progress.unwatch_client()

    # ------------------------------------------------------------------ the threads
    def _beat_loop(self) -> None:
        """One scheduler round trip every :func:`heartbeat_interval` s; an answer is progress."""
        every = heartbeat_interval(float(self.stall_timeout_s))
        while not self._stop.is_set() and self.lost is None:
            t = time.monotonic()
            try:
                ok = bool(self.heartbeat(float(self.stall_timeout_s) + 1.0))
            except Exception:  # noqa: BLE001 - an error is no answer; the stall limit decides
                ok = False
            if ok:
                self._last_beat = time.monotonic()
                self.heartbeats += 1
            self._stop.wait(max(0.0, every - (time.monotonic() - t)))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            states = {}
            for w in self.watched:
                st = states[w.proc.pid] = _status(w.proc)
                if st is None or st == psutil.STATUS_ZOMBIE:
                    self._died(w)
                    return
            # a stopped scheduler is named before the other processes of a stopped group
            for w in sorted(self.watched, key=lambda w: w.role != "the sglang scheduler"):
                stall = self._stopped(w.proc.pid, states[w.proc.pid], w.role, "stopped")
                if stall is not None:
                    self._stalled(stall)
                    return
            stall = self._check_progress() or self._check_clients() or self._check_client_activity()
            if stall is not None:
                self._stalled(stall)
                return

    def _scheduler(self) -> tuple[int | None, str]:
        """(pid, role) of the first scheduler watched, else of the front end."""
        for w in self.watched:
            if w.role == "the sglang scheduler":
                return w.proc.pid, w.role
        return getattr(self.leader, "pid", None), "the sglang server (HTTP front end)"

    def _stall(self, kind: str, what: str, silent_s: float) -> Stall:
        pid, role = self._scheduler()
        return _stall(kind, what, pid, role, silent_s, self._t0)

    def _stopped(self, pid: int, st: str, role: str, kind: str) -> Stall | None:
        """A stall when ``pid`` (status ``st``) has been stopped for ``stopped_grace_s``."""
        if st not in _STOPPED:
            self._stopped_since.pop(pid, None)
            return None
        since = self._stopped_since.setdefault(pid, time.monotonic())
        held = time.monotonic() - since
        if held < self.stopped_grace_s:
            return None
        what = (
            f"{role} (pid {pid}) has been stopped (state T, SIGSTOP or a tracer) for {held:.1f} s"
        )
        return _stall(kind, what, pid, role, held, self._t0)

    def _check_progress(self) -> Stall | None:
        """A stall when the heartbeat or the suite's replies are older than the stall limit."""
        limit = self.stall_timeout_s
        if not limit:
            return None
        if self.heartbeat is not None:
            now = time.monotonic()
            silent = now - self._last_beat
            quiet = self.progress.quiet_window
            beat_limit = max(limit, quiet[0]) if quiet else limit
            named, over = quiet, silent
            last = self.progress.last_quiet
            if last is not None and self._last_beat < last[3]:
                # the silence began inside a window that has closed since: the limit in force
                # now counts from its close (the scheduler needs a beat to answer again), and a
                # stall outside any window is named after it (its export may still be running)
                over = now - last[3]
                named = quiet or last[:3]
            if over > beat_limit:
                why = (
                    f"during {named[1]} ({named[2]} = {named[0]:g})"
                    if named and named[0] > limit
                    else f"(server.stall_timeout_s = {limit:g})"
                )
                return self._stall(
                    "heartbeat",
                    f"no answer to the scheduler heartbeat for {silent:.1f} s {why}",
                    silent,
                )
        n, silent = self.progress.silent_for()
        if n > 0 and silent > limit:
            return self._stall(
                "replies",
                f"no {self.progress.what} for {silent:.1f} s with {n} request(s) outstanding "
                f"(server.stall_timeout_s = {limit:g})",
                silent,
            )
        return None

    def _check_clients(self) -> Stall | None:
        """A stall when a client of the suite is stopped (scanned once a second)."""
        now = time.monotonic()
        if self._suite_started is None or now < self._next_client_scan:
            return None
        self._next_client_scan = now + 1.0
        for p in self._client_processes():
            st = _status(p)
            if st is None:
                continue
            try:
                cmd = " ".join(p.cmdline())[:160] or p.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                cmd = "?"
            stall = self._stopped(p.pid, st, f"the client ({cmd})", "client_stopped")
            if stall is not None:
                return stall
        return None

    def _check_client_activity(self) -> Stall | None:
        """A ``client_silent`` stall when the watched client made no progress for
        ``stall_timeout_s`` while the scheduler heartbeat still answers."""
        limit = self.stall_timeout_s
        client = self.progress.client
        if not limit or client is None:
            return None
        now = time.monotonic()
        if client.last_sample is not None and now - client.last_sample < CLIENT_SAMPLE_S:
            return None
        client.sample(now)
        silent = now - client.last_progress
        own = client.idle_s > limit
        if silent <= max(limit, client.idle_s):
            return None
        beat = ""
        if self.heartbeat is not None:
            since_beat = now - self._last_beat
            if since_beat > 2 * heartbeat_interval(float(limit)) + 1.0:
                return None  # the server is silent too: the heartbeat's stall names it
            beat = (
                f" while the scheduler heartbeat answers (last {since_beat:.1f} s ago): the server "
                "accepts its requests but sends nothing back, or the client is blocked"
            )
        what = (
            f"it received, printed and computed nothing for {silent:.1f} s "
            + (
                f"(its longest expected wait, {client.idle_s:g} s, is longer than "
                f"server.stall_timeout_s = {limit:g})"
                if own
                else f"(server.stall_timeout_s = {limit:g})"
            )
            + f"{beat}; {client.last_seen()}"
        )
        return _stall("client_silent", what, client.pid, client.name, silent, self._t0)

    def _died(self, w: _Watched) -> None:
        rc = None
        if w.proc.pid == self.leader.pid:
            try:
                rc = self.leader.poll()
            except Exception:  # noqa: BLE001 - the exit code is a nicety
                rc = None
        self.death = Death(
            pid=w.proc.pid,
            role=w.role,
            name=w.name,
            returncode=rc,
            detected_after_s=round(time.monotonic() - self._t0, 3),
        )
        self._give_up(self.death)

    def _stalled(self, stall: Stall) -> None:
        self.stall = stall
        self._give_up(stall)

    def _give_up(self, reason: Death | Stall) -> None:
        """The server is lost: tell, kill the suite's clients and the server, cancel the suite."""
        self.dead.set()
        self.kill_clients()
        kill_group(self.pgid, signal.SIGKILL)
        if self._armed:
            try:
                signal.pthread_kill(threading.main_thread().ident, CANCEL_SIGNAL)
            except (ProcessLookupError, OSError):
                pass
        if self.on_death is not None:
            self.on_death(reason)
