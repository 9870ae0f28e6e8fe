"""sglang servers left behind by a patchbench runner that was killed (SIGKILL, OOM killer, a lost
terminal): find them and stop them.

A server runs in its own session, so it outlives a runner killed with SIGKILL and keeps its port
(and, on a GPU, its memory). Two sources find it:

- ``cell.json`` files (read and updated through patchbench.runfolder) still ``"running"`` whose
  ``server`` record (pid, pgid, create_time) names a live process with the same start time (so a
  reused pid is never taken for the server) and whose ``runner_pid`` no longer lives;
- live processes carrying the harness's environment markers (``PATCHBENCH_RUN_DIR``,
  ``PATCHBENCH_RUNNER_PID``, ``PATCHBENCH_RUNNER_START``; patchbench.run.ports) whose runner no
  longer lives (a pid now held by a process that started at another time is not the runner).
  With ``anywhere`` every such process of this user counts, whatever folder its run wrote to
  (``bench --results DIR`` elsewhere); otherwise only runs under the folder given.

``patchbench doctor`` lists them with the exact command that stops each; ``bench --kill-stale``
calls :func:`kill_stale`. A process group is signalled only when it is the server's own (led by
the server's pid, not group 1, not the caller's group: patchbench.run.ports.own_group); otherwise
only the server's pid is.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from patchbench.run.ports import markers_of, own_group
from patchbench.runfolder import SchemaTooNew, read_cell, write_cell


@dataclass
class StaleServer:
    """One orphaned server: ``pid``/``pgid`` of its launched process, ``run_dir`` and ``cell``
    (e.g. "control/rep1") it belonged to, its ``port`` (None when unknown), ``cell_json`` (the
    record still saying "running", or None), ``source`` ("cell.json" or "environment")."""

    pid: int
    pgid: int
    run_dir: str | None
    cell: str | None
    port: int | None
    cell_json: Path | None
    source: str

    @property
    def own_group(self) -> bool:
        """True when its process group is its own (patchbench.run.ports.own_group)."""
        return own_group(self.pid, self.pgid)

    @property
    def kill_command(self) -> str:
        """The shell command that stops it: its whole process group when the group is its own,
        else its pid alone."""
        return f"kill -TERM -- -{self.pgid}" if self.own_group else f"kill -TERM {self.pid}"

    def describe(self) -> str:
        return (
            f"orphaned sglang server pid {self.pid} (run {self.run_dir}, cell {self.cell}, "
            f"port {self.port}); stop it with `{self.kill_command}` or `patchbench bench "
            "--kill-stale`"
        )


def _run_dirs(results_dir: Path) -> list[Path]:
    if (results_dir / "manifest.json").exists():
        return [results_dir]
    try:
        return sorted(d for d in results_dir.iterdir() if (d / "manifest.json").exists())
    except OSError:
        return []


def _alive_same(pid: int, create_time: float | None) -> bool:
    try:
        p = psutil.Process(pid)
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(p.create_time() - float(create_time)) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, TypeError):
        return False


def _runner_gone(runner_pid) -> bool:
    """True unless ``runner_pid`` names a live process (a missing pid counts as gone)."""
    return not (isinstance(runner_pid, int) and psutil.pid_exists(runner_pid))


def find_stale_servers(
    results_dir: str | os.PathLike, *, anywhere: bool = False
) -> list[StaleServer]:
    """Orphaned servers of the runs in ``results_dir`` (a results root or one run folder); with
    ``anywhere`` also every orphaned patchbench server of this user found by its markers,
    whatever folder its run wrote to.

    Returns them sorted by pid; [] when there are none. Never raises for an unreadable cell.json
    (it is skipped).
    """
    root = Path(results_dir).resolve()
    found: dict[int, StaleServer] = {}
    for run in _run_dirs(root):
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
    """The server a cell.json (read typed) still records as running, when that process lives
    and its runner does not; else None (also for an unreadable or newer cell.json)."""
    try:
        rec = read_cell(cj)
    except SchemaTooNew:
        return None
    if rec is None or rec.status != "running":
        return None
    srv = rec.server
    pid = srv.pid
    if not isinstance(pid, int) or pid <= 0:
        return None
    if not _alive_same(pid, getattr(srv, "create_time", None)):
        return None
    if not _runner_gone(getattr(rec, "runner_pid", None)):
        return None  # its runner is still at work: not stale
    return StaleServer(
        pid,
        int(srv.pgid or pid),
        str(run),
        f"{cj.parent.parent.name}/{cj.parent.name}",
        getattr(srv, "port", None),
        cj,
        "cell.json",
    )


def _stale_of_process(p: psutil.Process, root: Path | None) -> StaleServer | None:
    """A live process-group leader carrying the harness's markers (for a run under ``root``;
    None: any run) whose runner is gone; else None."""
    try:
        if os.getpgid(p.pid) != p.pid:
            return None  # only group leaders (the launched server process)
        env = p.environ()
    except (
        psutil.NoSuchProcess,
        psutil.AccessDenied,
        psutil.ZombieProcess,
        ProcessLookupError,
        PermissionError,
        OSError,
    ):
        return None
    m = markers_of(env)
    run_dir = m["run_dir"]
    if not run_dir:
        return None
    if root is not None:
        try:
            inside = Path(run_dir).resolve() == root or root in Path(run_dir).resolve().parents
        except OSError:
            inside = False
        if not inside:
            return None
    if m["runner_alive"]:
        return None
    return StaleServer(p.pid, p.pid, run_dir, m["cell"], _port_of(p), None, "environment")


def _port_of(p: psutil.Process) -> int | None:
    try:
        for c in p.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr:
                return c.laddr.port
    except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
        return None
    return None


def kill_stale(
    servers: list[StaleServer], *, grace_s: float = 1.0, timeout_s: float = 10.0
) -> list[tuple[StaleServer, bool]]:
    """Stop each orphan's process group (its pid alone when the group is not its own: SIGTERM,
    ``grace_s``, SIGKILL) and mark its cell.json ``interrupted`` (so ``--resume`` runs the cell
    again). Returns (server, stopped) pairs;
    stopped is False when a process of the group still lives after ``timeout_s``."""
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
            if _wait_group_gone(group, s.pid, wait):
                break
        ok = _wait_group_gone(group, s.pid, 0)
        if ok and s.cell_json is not None:
            _mark_interrupted(s.cell_json)
        out.append((s, ok))
    return out


def _mark_interrupted(cell_json: Path) -> None:
    """A cell.json still "running" becomes "interrupted" (typed read and write), its error
    saying --kill-stale stopped the server; any other record is left as it is."""
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


def _wait_group_gone(pgid: int, pid: int, wait_s: float) -> bool:
    """True once no process ``pid`` nor of group ``pgid`` (-1: no group) lives (``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = False
        for p in psutil.process_iter(["pid"]):
            try:
                if (
                    p.pid == pid or (pgid > 0 and os.getpgid(p.pid) == pgid)
                ) and p.status() != psutil.STATUS_ZOMBIE:
                    alive = True
                    break
            except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
                continue
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
