"""Lifecycle of one sglang server: launch in its own process group (output to ``server.log``),
ready (``/health`` and a 1-token ``/generate``, the port held by our group), heartbeat, flush,
stop (SIGTERM, 0.05 s, SIGKILL). Cases: docs/cases.md L1-L3; endpoints: docs/FACTS.md section 4.
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

from patchbench.config.args import launch_size_problem
from patchbench.errors import RunFailed
from patchbench.run.logcap import LogCap, read_lines
from patchbench.run.ports import (
    describe_port_holder,
    group_members,
    is_live,
    kill_group,
    port_answers,
    port_holder,
    port_taken_by,
)


class ServerError(RunFailed):
    """A server lifecycle failure (exit 4 if one ends a command); ``log_tail``: server.log's end."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message + (f"\n--- server.log (tail) ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


class LaunchRefused(ServerError):
    """The server cannot be started at all: its arguments and environment are over the
    system's limit (E2BIG), or the interpreter cannot be executed (exit 4 in a cell; ``bench``
    refuses the first case before any launch, exit 2)."""


class PortInUse(ServerError):
    """Something already answers on the port before launch."""


class PortTaken(ServerError):
    """Another process took the port between the check and the launch."""


class ServerDied(ServerError):
    """The server process exited (before ready, or during a suite)."""


class ReadyTimeout(ServerError):
    """Not ready within the configured timeout."""


class FlushFailed(ServerError):
    """/flush_cache refused for the whole retry budget, or unanswered (``stalled``)."""

    stalled: bool = False


class StopFailed(ServerError):
    """Processes of the server survived SIGKILL, or the port stayed open."""


class NotHttp(ConnectionError):
    """Not an HTTP answer on the server's port: handled as no answer."""


#: a whole access-log line of an answered heartbeat (uvicorn's ``[time] INFO:  host:port -
#: "GET /get_server_info HTTP/1.1" 200 OK``), or of its one 404 probe on 0.5.1.post3; a line
#: where another process's output ran into the record is not one (it is kept in the tail)
HEARTBEAT_LINE = re.compile(
    r"(?:\[[^\]]*\]\s*)?(?:[A-Za-z]+:\s+)?(?:\S+\s+-\s+)?"
    r'"GET /(?:(?:get_)?server_info HTTP/1\.[01]" 200|server_info HTTP/1\.[01]" 404)'
    r"(?: [A-Za-z ]+| -)?\s*"
)


def tail(path: str | os.PathLike, n_lines: int = 40) -> str:
    """Last ``n_lines`` lines of a text file ('' when missing) from its last 64 KiB, repeated
    lines shown once with "(repeated N times)", the heartbeat's access-log lines only counted,
    NUL bytes (a capped log's hole) left out."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().replace(b"\0", b"").decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    runs: list[list] = []  # [line, times, its position]
    beat_at: list[int] = []
    for i, line in enumerate(data.splitlines()):
        if HEARTBEAT_LINE.fullmatch(line):
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
    """Everything needed to launch one server (``env``: the whole environment; times in s)."""

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
    stop_mode: Literal["fast", "graceful"] = "fast"
    fast_grace_s: float = 0.05
    gpu_release_timeout_s: float = 30.0
    #: the most disk ``log_path`` may take, in MiB (0: no cap; patchbench.run.logcap)
    log_max_mb: int = 64

    def command(self) -> list[str]:
        return launch_command(self.python, self.model_path, self.host, self.port, self.args)


def launch_command(
    python: str, model_path: str, host: str, port: int, args: list[str]
) -> list[str]:
    """``python -m sglang.launch_server`` with the model, host, port and ``args``."""
    where = ["--model-path", model_path, "--host", host, "--port", str(port)]
    return [python, "-m", "sglang.launch_server", *where, *args]


@dataclass
class SglangServer:
    """One server process group: :meth:`start`, :meth:`wait_ready`, :meth:`flush_cache`,
    :meth:`stop`, or a context manager. ``events``: what happened (seconds from start)."""

    spec: LaunchSpec
    proc: subprocess.Popen | None = None
    events: list[dict] = field(default_factory=list)
    stop_breakdown_s: dict = field(default_factory=dict)
    _t0: float = 0.0
    _seen: dict[int, psutil.Process] = field(default_factory=dict)
    _info_path: str | None = None
    #: the sentence naming a foreign holder of the port: stop() leaves that port alone
    foreign_port: str | None = None
    #: what holds server.log's disk use at ``spec.log_max_mb`` (from start() on)
    log_cap: LogCap | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    pgid = pid  # start_new_session: the leader's pid is its group

    def record(self) -> dict:
        """cell.json's record of the server (create_time: epoch s)."""
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
        """Launch the server. Raises PortInUse when the port already answers, LaunchRefused
        when its arguments and environment are over the system's limit or it cannot be
        executed."""
        s = self.spec
        holder = port_taken_by(s.host, s.port)
        if holder is not None:
            raise PortInUse(
                f"something already answers on {s.host}:{s.port}: "
                f"{holder}; stop it (or choose another port: --port, or server.port) - a stale "
                "server must never be benchmarked"
            )
        too_big = launch_size_problem(s.command(), s.env)
        if too_big:
            raise LaunchRefused(f"server not started: {too_big}")
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
        except OSError as e:  # E2BIG past the estimate, ENOENT / EACCES for the interpreter
            raise LaunchRefused(
                f"server not started: {s.command()[0]}: {e.strerror or e} (errno {e.errno})"
            ) from None
        finally:
            log.close()
        self._event("launched", pid=self.proc.pid, command=s.command())
        if s.log_max_mb:
            self.log_cap = LogCap(s.log_path, s.log_max_mb).start()

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
        """Block until ready (module docstring); returns seconds waited. Raises ServerDied,
        PortTaken, or ReadyTimeout after ``ready_timeout_s`` (the server is left running)."""
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
            left = max(0.5, deadline - time.monotonic())
            path = "/health"
            try:
                if not healthy:
                    code, text = self._http("GET", path, timeout_s=min(5.0, left))
                    last = f"{path} {code}"
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
    def _live(self) -> dict[int, psutil.Process]:
        """Live processes of the group and among the descendants ever seen."""
        live = {pid: p for pid, p in self._seen.items() if is_live(p)}
        if self.proc is not None:
            live.update({p.pid: p for p in group_members(self.pgid) if is_live(p)})
        return live

    def our_pids(self) -> set[int]:
        """Pids of the live processes of the group and of every descendant ever seen."""
        self._remember_descendants()
        return set(self._live())

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
        """The sentence naming a foreign holder of the port, or None when it is free or ours
        (while ours lives, only a holder psutil sees outside our group is foreign)."""
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
        """Raise :class:`PortTaken` when what answers is not our server."""
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
        """One scheduler round trip; True when it answered 200 within ``timeout_s`` seconds."""
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
        """POST /flush_cache until 200: at most ``flush_retries`` tries, ``flush_pause_s`` apart,
        within ``stall_timeout_s``. Raises FlushFailed (``stalled``: a try got no answer) or
        ServerDied."""
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
        """Stop the whole group (module docstring) and wait until it is gone, the port refuses
        and, with ``nvml`` (patchbench.run.gpu.Nvml), no GPU lists a server process; returns
        seconds taken (per phase in ``stop_breakdown_s``). Raises StopFailed when a process
        survives, the port stays open or GPU memory stays held. Safe to call twice."""
        if self.proc is None:
            return 0.0
        t = time.monotonic()
        self._remember_descendants()
        pgid = self.pgid
        pids = sorted(set(self._seen) | {self.proc.pid})
        kill_group(pgid, signal.SIGTERM)
        self._event("sigterm", mode=self.spec.stop_mode)
        grace = self.spec.fast_grace_s if self.spec.stop_mode == "fast" else self.spec.stop_grace_s
        survivors = self._survivors(grace)
        if survivors or self.alive():
            self._event("sigkill", pids=[p.pid for p in survivors])
            kill_group(pgid, signal.SIGKILL)
            for p in survivors:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        survivors = self._survivors(5.0)
        if self.log_cap is not None:
            self.log_cap.close()  # its last check, once the server wrote all it will
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

    def _survivors(self, wait_s: float) -> list[psutil.Process]:
        """:meth:`_live` once it is empty or after ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        while True:
            live = self._live()
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


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return "?"


def scan_log(path: str | os.PathLike, marker: str) -> list[str]:
    """Lines of ``path`` that contain ``marker`` (e.g. a stand-in that was called), a capped
    log's hole skipped; a line ends at ``\\n``, ``\\r\\n`` or ``\\r``, as text mode reads it."""
    want = marker.encode()
    try:
        with open(path, "rb") as f:
            hits = [raw for _, raw, _ in read_lines(f.fileno()) if want in raw]
    except FileNotFoundError:
        return []
    out = []
    for raw in hits:
        text = raw.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        out += [piece for piece in text.split("\n") if marker in piece]
    return out
