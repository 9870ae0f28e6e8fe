"""Lifecycle of one sglang server: launch, readiness, cache flush, stop (docs/cases.md L1-L3).

- Launch: ``python -m sglang.launch_server --model-path M --host H --port P <args>`` in its own
  process group (``start_new_session``), stdout and stderr to ``server.log``. Refused when
  anything already answers on the port (never benchmark a stale server).
- Ready: ``GET /health`` answers 200 AND one tiny generation (``POST /generate``, 1 token)
  succeeds; ``/v1/models`` answering early proves nothing (sglang 0.5.23 answers it while /health
  still says 503). If the process exits while we wait, fail at once with the log's tail.
- Ours: once ready, the port must be held by a process of the group we launched (psutil: the
  listening socket's owner); a foreign process that bound the port between the check and the
  launch answers readiness as well as ours would, so it is named (:class:`PortTaken`, "another
  process took port P between the check and the launch: pid N ..."), also when our server then
  exits with "address already in use" before it is ready.
- Heartbeat (:meth:`SglangServer.heartbeat`): one scheduler round trip, ``GET /server_info``
  (``/get_server_info`` on releases without it): the front end asks the scheduler for its
  internal state and waits for the reply; no generation. patchbench.run.liveness calls it while
  suites run.
- Flush: ``POST /flush_cache``; sglang answers 400 while requests are in flight, so retry with a
  pause, log every answer, and fail after the retry budget; all tries together get at most
  ``stall_timeout_s``, and a flush that gets no answer at all is not retried (the server stopped
  answering).
- Stop (``stop_mode="fast"``, the default; called only after every suite wrote its files): SIGTERM
  to the process group, ``fast_grace_s`` (0.05 s) for it to exit, then SIGKILL to the group and to
  every descendant seen (psutil); wait until every process is gone, the port refuses connections
  and, on a GPU, NVML lists none of the server's processes. The grace is short because a longer
  one buys nothing: the scheduler and detokenizer keep the default SIGTERM action and are gone at
  once, while the front end answers SIGTERM only through a watchdog that polls every 5 s
  (tokenizer_manager.sigterm_watchdog; 3.6-3.9 s measured, docs/FACTS.md section 4), so a 1 s
  grace ended in SIGKILL anyway, 1 s per cell later. Nothing is lost: the results are on disk
  before the stop, and the port and GPU memory are checked free before the next server.
  ``stop_mode="graceful"`` waits ``stop_grace_s`` for the SIGTERM instead. A survivor, an
  open port or GPU memory still held is an error. ``stop_breakdown_s`` says where the time went.
- Markers: the cell sets ``PATCHBENCH_RUN_DIR``, ``PATCHBENCH_CELL``, ``PATCHBENCH_RUNNER_PID`` and
  ``PATCHBENCH_RUNNER_START`` (the runner's start time, so a reused pid is not taken for it) in
  the server's environment, so a server left behind by a killed runner can be recognised
  wherever its run folder is (:mod:`patchbench.run.ports`, :mod:`patchbench.run.stale`).

Endpoints as in docs/FACTS.md section 4 (sglang 0.5.1.post3 .. 0.5.23).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psutil

from patchbench.errors import RunFailed
from patchbench.run.ports import describe_port_holder, port_answers, port_holder, port_taken_by


class ServerError(RunFailed):
    """Base class of server lifecycle failures (exit 4 if one ends a command); ``log_tail`` holds
    the end of server.log."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message + (f"\n--- server.log (tail) ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


class PortInUse(ServerError):
    """Something already answers on the port before launch."""


class PortTaken(ServerError):
    """Another process took the port between the check and the launch (a lost race): what
    answers there is not the server we launched."""


class ServerDied(ServerError):
    """The server process exited (before ready, or during a suite)."""


class ReadyTimeout(ServerError):
    """Not ready within the configured timeout."""


class FlushFailed(ServerError):
    """/flush_cache refused for the whole retry budget, or not answered within the stall limit
    (``stalled`` True)."""

    stalled: bool = False


class StopFailed(ServerError):
    """Processes of the server survived SIGKILL, or the port stayed open."""


class NotHttp(ConnectionError):
    """What came back on the server's port is not an HTTP answer (bytes of another protocol, a
    status line cut short, a body that broke off: ``http.client.HTTPException``). Raised by the
    server's own requests (readiness, ``/flush_cache``, the heartbeat) and handled where a
    dropped connection is: no answer."""


#: the access-log line of an answered liveness heartbeat (:meth:`SglangServer.heartbeat`; uvicorn
#: writes one per request into server.log), and of its one probe of ``/server_info`` on a release
#: without it (0.5.1.post3: 404)
HEARTBEAT_LINE = re.compile(
    r'"GET /(?:get_)?server_info HTTP/1\.[01]" 200\b|"GET /server_info HTTP/1\.[01]" 404\b'
)


def tail(path: str | os.PathLike, n_lines: int = 40) -> str:
    """Last ``n_lines`` lines of a text file ('' when it does not exist); a run of identical
    lines counts as one, shown once with "(repeated N times)" (a dying server often repeats one
    line, e.g. a collective's connect message, and would hide what came before).

    The access-log lines of answered liveness heartbeats (:data:`HEARTBEAT_LINE`: one every
    ``stall_timeout_s / 5`` s, 12 a minute at the default) are left out and counted in a last
    line, so the lines quoted in an error are the server's own; server.log keeps them all."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    runs: list[list] = []  # [line, times, its position]
    beat_at: list[int] = []
    for i, line in enumerate(data.splitlines()):
        if HEARTBEAT_LINE.search(line):
            beat_at.append(i)
        elif runs and runs[-1][0] == line:
            runs[-1][1] += 1
        else:
            runs.append([line, 1, i])
    shown = runs[-n_lines:]
    lines = [line if k == 1 else f"{line}  (repeated {k} times)" for line, k, _ in shown]
    beats = sum(1 for i in beat_at if not shown or i > shown[0][2])
    if beats:
        lines.append(
            f"({beats} access-log line{'s' if beats > 1 else ''} of patchbench's scheduler "
            "heartbeat (GET /server_info) left out of this tail; server.log has them)"
        )
    return "\n".join(lines)


@dataclass
class LaunchSpec:
    """Everything needed to launch one server.

    python: interpreter of the environment; env: the complete environment of the server process
    (PYTHONPATH with the overlay first); times in seconds (``stall_timeout_s``: the longest the
    server may leave a heartbeat or a flush unanswered).
    """

    python: str
    model_path: str
    host: str
    port: int
    args: list[str]
    env: dict[str, str]
    log_path: Path
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 20.0
    port_close_timeout_s: float = 30.0
    flush_retries: int = 5
    flush_pause_s: float = 1.0
    stall_timeout_s: float = 60.0
    health_path: str = "/health"
    stop_mode: Literal["fast", "graceful"] = "fast"
    fast_grace_s: float = 0.05
    gpu_release_timeout_s: float = 30.0

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.model_path,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.args,
        ]


@dataclass
class SglangServer:
    """One server process group. Use :meth:`start`, :meth:`wait_ready`, :meth:`flush_cache`,
    :meth:`stop`; or as a context manager (start + wait_ready, stop on exit).

    ``events`` records what happened, with times relative to start (seconds), for cell.json.
    """

    spec: LaunchSpec
    proc: subprocess.Popen | None = None
    events: list[dict] = field(default_factory=list)
    stop_breakdown_s: dict = field(default_factory=dict)
    _t0: float = 0.0
    _seen: dict[int, psutil.Process] = field(default_factory=dict)
    _info_path: str | None = None
    #: the sentence naming a foreign holder of the port (a lost race): stop() then does not wait
    #: for the port to close, it is not ours to close
    foreign_port: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    @property
    def pgid(self) -> int:
        """The server's process group (``start_new_session``: the leader's pid); -1 before start."""
        return self.proc.pid if self.proc else -1

    def record(self) -> dict:
        """What cell.json keeps of the running server: ``pid``, ``pgid``, ``create_time`` (epoch
        seconds, to tell a reused pid apart), ``host``, ``port``, ``command``."""
        ct = None
        if self.proc is not None:
            try:
                ct = psutil.Process(self.proc.pid).create_time()
            except psutil.NoSuchProcess:
                pass
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "create_time": ct,
            "host": self.spec.host,
            "port": self.spec.port,
            "command": self.spec.command(),
        }

    def _event(self, what: str, **kw) -> None:
        self.events.append({"t_s": round(time.monotonic() - self._t0, 3), "event": what, **kw})

    def log_tail(self, n: int = 40) -> str:
        return tail(self.spec.log_path, n)

    def alive(self) -> bool:
        """True while the launched process has not exited."""
        return self.proc is not None and self.proc.poll() is None

    # ------------------------------------------------------------------ launch
    def start(self) -> None:
        """Launch the server. Raises PortInUse when the port already answers."""
        s = self.spec
        holder = port_taken_by(s.host, s.port)
        if holder is not None:
            raise PortInUse(
                f"something already answers on {s.host}:{s.port}: "
                f"{holder}; stop it (or choose another "
                "server.port) - a stale server must never be benchmarked"
            )
        s.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        log = open(s.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                s.command(),
                env=s.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        self._event("launched", pid=self.proc.pid, command=s.command())

    def _remember_descendants(self) -> None:
        if not self.alive():
            return
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                self._seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            pass

    def _http(self, method: str, path: str, body: dict | None = None, timeout_s: float = 10.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                return r.status, r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            try:
                return e.code, e.read().decode("utf-8", "replace")
            except (http.client.HTTPException, OSError):  # the error's body broke off
                return e.code, ""
        except http.client.HTTPException as e:
            # bytes that are not HTTP, or a body cut short: no answer, like a dropped connection
            raise NotHttp(
                f"{path}: not an HTTP answer ({type(e).__name__}: {str(e).strip()[:100]!r})"
            ) from e

    def wait_ready(self) -> float:
        """Block until /health is 200 and a 1-token generation succeeds; returns seconds waited.

        Raises ServerDied at once when the process exits, ReadyTimeout after
        ``ready_timeout_s`` (the server is then left running; call :meth:`stop`).
        """
        s = self.spec
        deadline = self._t0 + s.ready_timeout_s
        healthy = False
        last = ""
        while True:
            self._remember_descendants()
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                self._event("died_before_ready", returncode=code)
                race = self._port_race()
                if race is not None:
                    self.foreign_port = race
                    raise PortTaken(
                        f"{race}; our server exited with code {code} before it was ready",
                        self.log_tail(),
                    )
                raise ServerDied(
                    f"sglang server exited with code {code} before it was ready", self.log_tail()
                )
            if time.monotonic() > deadline:
                self._event("ready_timeout", last=last)
                raise ReadyTimeout(
                    f"server not ready after {s.ready_timeout_s:.0f} s "
                    f"(server.ready_timeout_s); last answer: {last}",
                    self.log_tail(),
                )
            # no single try may outlast the deadline (a hung /generate would add 60 s)
            left = max(0.5, deadline - time.monotonic())
            path = s.health_path
            try:
                if not healthy:
                    code, text = self._http("GET", s.health_path, timeout_s=min(5.0, left))
                    last = f"{s.health_path} {code}"
                    if code == 200:
                        healthy = True
                        self._event("health_200")
                if healthy:
                    path = "/generate"
                    code, text = self._http(
                        "POST",
                        "/generate",
                        {
                            "text": "Hello",
                            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
                        },
                        timeout_s=min(60.0, left),
                    )
                    last = f"/generate {code} {text[:200]}"
                    if code == 200:
                        self._remember_descendants()
                        self.check_ours()
                        waited = time.monotonic() - self._t0
                        self._event("ready", waited_s=round(waited, 3))
                        return waited
            except NotHttp as e:
                last = str(e)
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                last = f"{path}: {type(e).__name__}: {e}"
            time.sleep(0.2)  # a refused connection costs nothing; a late poll costs the cell

    # ------------------------------------------------------------------ ours
    def our_pids(self) -> set[int]:
        """Pids of the launched process, its group and every descendant ever seen (live ones)."""
        self._remember_descendants()
        out = {pid for pid, p in self._seen.items() if _is_live(p)}
        if self.proc is not None:
            for p in psutil.process_iter(["pid"]):
                try:
                    if os.getpgid(p.pid) == self.pgid:
                        out.add(p.pid)
                except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                    continue
        return out

    def listens_here(self) -> bool:
        """True when one of our processes (:meth:`our_pids`) listens on the server's port."""
        for pid in self.our_pids():
            try:
                conns = psutil.Process(pid).net_connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
            if any(
                c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.spec.port
                for c in conns
            ):
                return True
        return False

    def _port_race(self) -> str | None:
        """The sentence naming a foreign holder of the port, or None when the port is free or
        ours. While our server lives, a holder is claimed foreign only when psutil sees it (a
        process outside our group): sockets it cannot attribute (another user's) are not taken
        for a race, so a server whose connections cannot be read is never refused; once our
        server has exited, whatever answers is foreign."""
        s = self.spec
        if not port_answers(s.host, s.port) or self.listens_here():
            return None
        if self.alive():
            h = port_holder(s.port)
            if h is None or h["pid"] in self.our_pids():
                return None
        return (
            f"another process took port {s.port} between the check and the launch: "
            f"{describe_port_holder(s.port, ours=False)}"
        )

    def check_ours(self) -> None:
        """Raise :class:`PortTaken` when what answers on the port is not a process of the server
        we launched (readiness alone cannot tell a foreign server from ours); the caller stops
        our server, and :meth:`stop` then leaves the foreign holder's port alone."""
        race = self._port_race()
        if race is None:
            return
        self._event("port_taken", holder=race)
        self.foreign_port = race
        raise PortTaken(
            f"{race}; readiness was answered by that process, not by the server we launched "
            f"(pid {self.pid})",
            self.log_tail(),
        )

    # ------------------------------------------------------------------ heartbeat
    def heartbeat(self, timeout_s: float) -> bool:
        """One scheduler round trip (``GET /server_info``; ``/get_server_info`` where the
        release answers 404 for it); True when it answered 200 within ``timeout_s`` seconds."""
        paths = [self._info_path] if self._info_path else ["/server_info", "/get_server_info"]
        for path in paths:
            try:
                code, _ = self._http("GET", path, timeout_s=timeout_s)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                return False
            if code == 404 and self._info_path is None:
                continue
            if code == 200:
                self._info_path = path
            return code == 200
        return False

    # ------------------------------------------------------------------ flush
    def flush_cache(self) -> None:
        """POST /flush_cache until 200, at most ``flush_retries`` tries, ``flush_pause_s`` apart,
        all of them within ``stall_timeout_s`` seconds.

        Every answer is recorded in ``events``. Raises FlushFailed when the budget is spent (the
        phase fails; it never silently goes on), FlushFailed with ``stalled`` set when a try gets
        no answer at all (not retried: the server stopped answering), and ServerDied when the
        process is gone.
        """
        s = self.spec
        last = ""
        deadline = time.monotonic() + s.stall_timeout_s
        for attempt in range(1, s.flush_retries + 1):
            if not self.alive():
                raise ServerDied("server exited before /flush_cache", self.log_tail())
            left = deadline - time.monotonic()
            try:
                code, text = self._http("POST", "/flush_cache", timeout_s=max(0.1, left))
                last = f"{code} {text.strip()[:200]}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
                code, last = None, f"{type(e).__name__}: {e}"
                self._event("flush_cache", attempt=attempt, answer=last)
                if time.monotonic() >= deadline - 0.05 or "timed out" in str(e):
                    err = FlushFailed(
                        f"the server stopped answering: /flush_cache got no answer within "
                        f"{s.stall_timeout_s:g} s (server.stall_timeout_s)"
                    )
                    err.stalled = True
                    raise err from None
                if not self.alive():
                    raise ServerDied("server exited during /flush_cache", self.log_tail()) from None
            else:
                self._event("flush_cache", attempt=attempt, answer=last)
            if code == 200:
                return
            if attempt < s.flush_retries:
                if time.monotonic() + s.flush_pause_s >= deadline:
                    break
                time.sleep(s.flush_pause_s)
        raise FlushFailed(
            f"/flush_cache refused {attempt} times (server.flush_retries = {s.flush_retries}, "
            f"within server.stall_timeout_s = {s.stall_timeout_s:g}); last answer: {last}"
        )

    # ------------------------------------------------------------------ stop
    def stop(self, nvml=None) -> float:
        """Stop the whole process group and wait until it is gone; returns seconds taken.

        ``stop_mode="fast"``: SIGTERM to the group, up to ``fast_grace_s`` for it to exit, then
        SIGKILL; ``"graceful"``: up to ``stop_grace_s`` before the SIGKILL. Then wait until no
        process of the group or of the descendants ever seen lives, the port refuses connections
        (``port_close_timeout_s``) and, with ``nvml`` (a :class:`patchbench.run.gpu.Nvml`), no GPU
        lists a server process (``gpu_release_timeout_s``). ``stop_breakdown_s`` holds the
        seconds of each phase: ``exit`` (signal until every process is gone), ``port``, ``gpu``.
        Raises StopFailed when a process survives, the port stays open or GPU memory stays held.
        Safe to call twice.
        """
        if self.proc is None:
            return 0.0
        t = time.monotonic()
        self._remember_descendants()
        pgid = self.pgid
        pids = sorted(set(self._seen) | {self.proc.pid})
        self._signal_group(pgid, signal.SIGTERM)
        self._event("sigterm", mode=self.spec.stop_mode)
        grace = self.spec.fast_grace_s if self.spec.stop_mode == "fast" else self.spec.stop_grace_s
        survivors = self._survivors(pgid, wait_s=grace)
        if survivors or self.alive():
            self._event("sigkill", pids=[p.pid for p in survivors])
            self._signal_group(pgid, signal.SIGKILL)
            for p in survivors:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        survivors = self._survivors(pgid, wait_s=5.0)
        t_exit = time.monotonic()
        deadline = t_exit + self.spec.port_close_timeout_s
        foreign = self.foreign_port is not None  # another process holds it: not ours to close
        while (
            not foreign
            and port_answers(self.spec.host, self.spec.port)
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        port_open = not foreign and port_answers(self.spec.host, self.spec.port)
        t_port = time.monotonic()
        gpu_held: list[int] = []
        if nvml is not None:
            gpu_held = nvml.wait_released(pids, timeout_s=self.spec.gpu_release_timeout_s)
        took = time.monotonic() - t
        self.stop_breakdown_s = {
            "exit": round(t_exit - t, 3),
            "port": round(t_port - t_exit, 3),
            "gpu": round(time.monotonic() - t_port, 3) if nvml else None,
        }
        self._event(
            "stopped",
            took_s=round(took, 3),
            survivors=[p.pid for p in survivors],
            port_open=port_open,
            gpu_held=gpu_held,
            breakdown_s=self.stop_breakdown_s,
        )
        if survivors:
            raise StopFailed(
                f"processes of the server survived SIGKILL: "
                f"{[(p.pid, _name(p)) for p in survivors]}"
            )
        if port_open:
            raise StopFailed(
                f"port {self.spec.port} still answers {self.spec.port_close_timeout_s:.0f} s "
                f"after the server was stopped"
            )
        if gpu_held:
            raise StopFailed(
                f"GPU memory still held by server process(es) {gpu_held} "
                f"{self.spec.gpu_release_timeout_s:.0f} s after they were stopped "
                "(NVML); the next server could not get its memory"
            )
        return took

    @staticmethod
    def _signal_group(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _survivors(self, pgid: int, wait_s: float) -> list[psutil.Process]:
        """Live (non-zombie) processes of the group or among the descendants ever seen."""
        deadline = time.monotonic() + wait_s
        while True:
            live = {}
            for pid, p in self._seen.items():
                if _is_live(p):
                    live[pid] = p
            for p in psutil.process_iter(["pid"]):
                try:
                    if os.getpgid(p.pid) == pgid and _is_live(p):
                        live[p.pid] = p
                except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                    continue
            if self.proc is not None:
                self.proc.poll()  # reap the leader so it does not linger as a zombie
            if not live or time.monotonic() >= deadline:
                return list(live.values())
            time.sleep(0.01)

    def __enter__(self) -> SglangServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _is_live(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return "?"


def scan_log(path: str | os.PathLike, marker: str) -> list[str]:
    """Lines of ``path`` that contain ``marker`` (e.g. a stand-in that was called)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f if marker in line]
    except FileNotFoundError:
        return []
