"""Ports and the processes that hold them: whether something answers on a port
(:func:`port_answers`), a free port (:func:`free_port`), the process listening there
(:func:`port_holder`) and one sentence naming it (:func:`describe_port_holder`).

A server the harness launches carries markers in its environment (:data:`MARKER_RUN_DIR`,
:data:`MARKER_CELL`, :data:`MARKER_RUNNER_PID`, :data:`MARKER_RUNNER_START`; set by
patchbench.run.cell), so a server left behind by a killed runner can be recognised wherever its run
folder is (:func:`markers_of`, :mod:`patchbench.run.stale`). Launching, readiness and stopping a
server are :mod:`patchbench.run.server`.
"""

from __future__ import annotations

import os
import socket

import psutil

#: environment markers set on every server the harness launches (see patchbench.run.cell)
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
    """What already answers on (host, port) (:func:`describe_port_holder`), or None when
    nothing does: the check before every launch, and before a whole run."""
    return describe_port_holder(port) if port_answers(host, port) else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free now (for tests and dry runs)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def runner_start() -> float:
    """This process's start time (epoch seconds), the value of the ``PATCHBENCH_RUNNER_START``
    marker."""
    return psutil.Process(os.getpid()).create_time()


def runner_alive(pid: int | None, start: float | None = None) -> bool:
    """True when ``pid`` names a live process and, with ``start`` (epoch seconds, the marker
    ``PATCHBENCH_RUNNER_START``), one that started then (a reused pid is not the runner)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return start is None or abs(p.create_time() - start) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def markers_of(env: dict[str, str]) -> dict:
    """The harness's markers in a server process's environment: ``run_dir``, ``cell``,
    ``runner_pid``, ``runner_start`` (None where absent), ``runner_alive`` (None without a
    runner pid)."""
    out: dict = {"run_dir": env.get(MARKER_RUN_DIR), "cell": env.get(MARKER_CELL)}
    rp = env.get(MARKER_RUNNER_PID, "")
    out["runner_pid"] = int(rp) if rp.isdigit() else None
    try:
        out["runner_start"] = float(env[MARKER_RUNNER_START])
    except (KeyError, ValueError):
        out["runner_start"] = None
    out["runner_alive"] = (
        runner_alive(out["runner_pid"], out["runner_start"])
        if out["runner_pid"] is not None
        else None
    )
    return out


def own_group(pid: int, pgid: int | None) -> bool:
    """True when ``pgid`` is a process group of its own that may be killed as a whole: led by
    ``pid`` (a server starts its own session), not group 1 and not this process's group."""
    return bool(pgid) and pgid == pid and pgid > 1 and pgid != os.getpgid(0)


def port_holder(port: int) -> dict | None:
    """The process listening on TCP ``port`` on this machine, or None when none is visible.

    Returns {"pid", "pgid", "name", "cmdline": [str], "run_dir", "cell", "runner_pid",
    "runner_start", "runner_alive"}; the last five come from the markers the harness sets on its
    servers (None when the process is not a patchbench server or its environment cannot be
    read). Only processes of this user are visible without privileges.
    """
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
    out = {
        "pid": pid,
        "pgid": None,
        "name": "?",
        "cmdline": [],
        "run_dir": None,
        "cell": None,
        "runner_pid": None,
        "runner_start": None,
        "runner_alive": None,
    }
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
    """One sentence naming what holds ``port``: the pid and command, and for a patchbench server
    its run folder and cell, whether its runner still lives, and the command that stops it.

    A process-group kill is advised only for a patchbench server leading a group of its own
    (:func:`own_group`); any other holder is named with its pid alone. ``ours=False`` leaves
    out the advice (the caller names the holder as foreign)."""
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
        text += f"; not a patchbench server: stop it yourself (pid {h['pid']}) or use another port"
    return text
