"""Which server is ours: ports and their holders, the markers every launched server carries
(:func:`server_markers`), orphans of a killed runner (:func:`find_stale_servers`); a process group
is signalled only when it is the server's own (:func:`own_group`)."""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from patchbench.runfolder import SchemaTooNew, read_cell, write_cell

#: environment markers set on every server the harness launches (:func:`server_markers`)
MARKER_RUN_DIR = "PATCHBENCH_RUN_DIR"
MARKER_CELL = "PATCHBENCH_CELL"
MARKER_RUNNER_PID = "PATCHBENCH_RUNNER_PID"
MARKER_RUNNER_START = "PATCHBENCH_RUNNER_START"


def port_answers(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when a TCP connection to (host, port) is accepted (something listens there)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def port_taken_by(host: str, port: int) -> str | None:
    """What already answers on (host, port) (:func:`describe_port_holder`), or None."""
    return describe_port_holder(port) if port_answers(host, port) else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free now (for tests and dry runs)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_markers(run_dir: Path, cell: str) -> dict[str, str]:
    """The environment markers of a server this process launches for ``cell`` of ``run_dir``."""
    return {
        MARKER_RUN_DIR: str(Path(run_dir).resolve()),
        MARKER_CELL: cell,
        MARKER_RUNNER_PID: str(os.getpid()),
        MARKER_RUNNER_START: repr(psutil.Process(os.getpid()).create_time()),
    }


def alive(pid: int | None, start: float | None = None) -> bool:
    """True when ``pid`` lives (not a zombie) and, with ``start``, started then."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return start is None or abs(p.create_time() - float(start)) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, TypeError):
        return False


def markers_of(env: dict[str, str]) -> dict:
    """The markers in a process's environment: ``run_dir``, ``cell``, ``runner_pid``,
    ``runner_start`` (None where absent), ``runner_alive`` (None without a runner pid)."""
    out: dict = {"run_dir": env.get(MARKER_RUN_DIR), "cell": env.get(MARKER_CELL)}
    rp = env.get(MARKER_RUNNER_PID, "")
    out["runner_pid"] = int(rp) if rp.isdigit() else None
    try:
        out["runner_start"] = float(env[MARKER_RUNNER_START])
    except (KeyError, ValueError):
        out["runner_start"] = None
    out["runner_alive"] = (
        alive(out["runner_pid"], out["runner_start"]) if out["runner_pid"] is not None else None
    )
    return out


def own_group(pid: int, pgid: int | None) -> bool:
    """True when ``pgid`` is led by ``pid``, not group 1 nor this process's."""
    return bool(pgid) and pgid == pid and pgid > 1 and pgid != os.getpgid(0)


def group_members(pgid: int) -> list[psutil.Process]:
    """The processes whose process group is ``pgid`` (zombies included)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return out


def is_live(p: psutil.Process) -> bool:
    """True while ``p`` runs and is not a zombie (a process it may not read counts as live)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to group ``pgid``; False when gone or not ours to kill."""
    if pgid <= 1 or pgid == os.getpgid(0):
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def port_holder(port: int) -> dict | None:
    """The process of this user listening on TCP ``port`` as {"pid", "pgid", "name", "cmdline",
    and :func:`markers_of`'s keys}; None when none is visible."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    pid = next(
        (
            c.pid
            for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
        ),
        None,
    )
    if pid is None:
        return None
    out = {"pid": pid, "pgid": None, "name": "?", "cmdline": [], **markers_of({})}
    try:
        p = psutil.Process(pid)
        out["name"], out["cmdline"] = p.name(), p.cmdline()
        out["pgid"] = os.getpgid(pid)
        env = p.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
        return out
    out.update(markers_of(env))
    return out


def describe_port_holder(port: int, *, ours: bool = True) -> str:
    """One sentence naming what holds ``port`` (for a patchbench server its run, cell, runner and
    how to stop it; ``ours=False``: no advice)."""
    h = port_holder(port)
    if h is None:
        return "no process of this user is seen listening there (another user's, or a container's)"
    cmd = " ".join(h["cmdline"])[:160] or h["name"]
    text = f"pid {h['pid']} ({cmd})"
    if h["run_dir"]:
        text += (
            f", a patchbench server of run {h['run_dir']} (cell {h['cell']}); its runner "
            f"(pid {h['runner_pid']}) is "
            + ("still running" if h["runner_alive"] else "gone, so it is an orphan")
        )
        if ours and own_group(h["pid"], h["pgid"]):
            text += f"; `kill -TERM -- -{h['pgid']}` stops its process group"
    elif ours:
        text += ", not a patchbench server"
    return text


# ------------------------------------------------------------------------------ orphans
@dataclass
class StaleServer:
    """One orphaned server (``cell_json``: the record still saying "running", or None;
    ``source``: "cell.json" or "environment")."""

    pid: int
    pgid: int
    run_dir: str | None
    cell: str | None
    port: int | None
    cell_json: Path | None
    source: str

    @property
    def own_group(self) -> bool:
        return own_group(self.pid, self.pgid)

    @property
    def kill_command(self) -> str:
        """The shell command that stops it: its group when the group is its own, else its pid."""
        return f"kill -TERM -- -{self.pgid}" if self.own_group else f"kill -TERM {self.pid}"

    def describe(self) -> str:
        return (
            f"orphaned sglang server pid {self.pid} (run {self.run_dir}, cell {self.cell}, "
            f"port {self.port}); stop it with `{self.kill_command}` or `patchbench bench "
            "--kill-stale`"
        )


def find_stale_servers(
    results_dir: str | os.PathLike, *, anywhere: bool = False
) -> list[StaleServer]:
    """Orphaned servers of the runs in ``results_dir`` (a results root or one run folder; with
    ``anywhere`` every one of this user), sorted by pid."""
    root = Path(results_dir).resolve()
    if (root / "manifest.json").exists():
        runs = [root]
    else:
        try:
            runs = sorted(d for d in root.iterdir() if (d / "manifest.json").exists())
        except OSError:
            runs = []
    found: dict[int, StaleServer] = {}
    for run in runs:
        for cj in sorted(run.glob("*/*/cell.json")):
            s = _stale_of_cell(run, cj)
            if s is not None:
                found[s.pid] = s
    for p in psutil.process_iter(["pid"]):
        if p.pid not in found:
            s = _stale_of_process(p, None if anywhere else root)
            if s is not None:
                found[p.pid] = s
    return [found[k] for k in sorted(found)]


def _stale_of_cell(run: Path, cj: Path) -> StaleServer | None:
    """The server a cell.json still records as running, when it lives and its runner does not."""
    try:
        rec = read_cell(cj)
    except SchemaTooNew:
        return None
    if rec is None or rec.status != "running":
        return None
    srv = rec.server
    if not alive(srv.pid, srv.create_time) or alive(rec.runner_pid):
        return None
    cell = f"{cj.parent.parent.name}/{cj.parent.name}"
    return StaleServer(srv.pid, int(srv.pgid or srv.pid), str(run), cell, srv.port, cj, "cell.json")


def _stale_of_process(p: psutil.Process, root: Path | None) -> StaleServer | None:
    """A group leader with a run's markers (under ``root``), its runner gone."""
    try:
        if os.getpgid(p.pid) != p.pid:
            return None  # only group leaders (the launched server process)
        env = p.environ()
    except (psutil.Error, ProcessLookupError, PermissionError, OSError):
        return None
    m = markers_of(env)
    run_dir = m["run_dir"]
    if not run_dir or m["runner_alive"]:
        return None
    if root is not None:
        try:
            there = Path(run_dir).resolve()
        except OSError:
            return None
        if there != root and root not in there.parents:
            return None
    port = None
    try:
        port = next(
            (c.laddr.port for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN),
            None,
        )
    except (psutil.Error, AttributeError):
        pass
    return StaleServer(p.pid, p.pid, run_dir, m["cell"], port, None, "environment")


def marked_for(pid: int, run_dir: str | os.PathLike) -> bool:
    """Whether process ``pid``'s environment marks it as a server of run folder ``run_dir``
    (:data:`MARKER_RUN_DIR`, compared resolved); False when it cannot be read."""
    try:
        env = psutil.Process(pid).environ()
        there = env.get(MARKER_RUN_DIR)
        return bool(there) and Path(there).resolve() == Path(run_dir).resolve()
    except (psutil.Error, OSError):
        return False


def kill_stale(
    servers: list[StaleServer], *, grace_s: float = 1.0, timeout_s: float = 10.0
) -> list[tuple[StaleServer, bool]]:
    """Stop each orphan (SIGTERM, ``grace_s``, SIGKILL) and mark its cell.json ``interrupted``;
    (server, stopped) pairs (False: a process of it lives after ``timeout_s``)."""
    out = []
    for s in servers:
        group = s.pgid if s.own_group else -1  # never a group that is not the server's own
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, timeout_s)):
            try:
                if group > 0:
                    os.killpg(group, sig)
                else:
                    os.kill(s.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            if _gone(group, s.pid, wait):
                break
        ok = _gone(group, s.pid, 0)
        if ok and s.cell_json is not None:
            _mark_interrupted(s.cell_json)
        out.append((s, ok))
    return out


def _mark_interrupted(cell_json: Path) -> None:
    """A cell.json still "running" becomes "interrupted", its error naming --kill-stale."""
    try:
        rec = read_cell(cell_json)
        if rec is not None and rec.status == "running":
            rec.status = "interrupted"
            rec.error = (
                (rec.error or "")
                + "\nthe runner was killed; its server was stopped by --kill-stale"
            ).strip()
            write_cell(cell_json.parent, rec)
    except (OSError, ValueError, SchemaTooNew):
        pass


def _gone(pgid: int, pid: int, wait_s: float) -> bool:
    """True once no process ``pid`` nor of group ``pgid`` (-1: none) lives (``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        procs = group_members(pgid) if pgid > 0 else []
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
        if not any(is_live(p) for p in procs):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
