"""One writer per run folder: ``RUN/.lock`` held with ``fcntl.flock`` (docs/faults.md): a second
run is refused (:class:`RunFolderBusy`, exit 4); a folder deleted under a run stops it
(:func:`check_folder`, :class:`RunFolderGone`, exit 4)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from patchbench.errors import RunFailed
from patchbench.records import ResultsWriteError

#: the lock file's name inside a run folder (a reserved name: patchbench.config refuses it)
LOCK_NAME = ".lock"
#: seconds ``patchbench report`` waits for another report of the same folder to finish
REPORT_WAIT_S = 30.0


class RunFolderGone(RunFailed):
    """The run folder was deleted (or replaced by another folder) while a run wrote it: the run
    stops instead of making it again (exit 4, "run folder gone")."""

    kind = "run folder gone"


def folder_identity(path: str | os.PathLike) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of folder ``path``: what :func:`check_folder` compares."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def check_folder(path: str | os.PathLike, identity: tuple[int, int] | None) -> None:
    """Raise :class:`RunFolderGone` when ``path`` is no longer the folder whose
    :func:`folder_identity` was ``identity`` (None: nothing to check)."""
    if identity is None:
        return
    try:
        now: tuple[int, int] | None = folder_identity(path)
    except OSError:
        now = None
    if now != identity:
        what = (
            ""
            if now is None
            else " (the folder there now is another one: made again by a write the cell then "
            "running had under way, or by another process; the run wrote nothing more into it)"
        )
        raise RunFolderGone(
            f"{path} was deleted while this run wrote it{what}: the run stopped here (its "
            "server was stopped); start a new run",
            Path(path),
        )


class RunFolderBusy(RunFailed):
    """Another live run holds the run folder's lock (exit 4, "run folder busy")."""

    kind = "run folder busy"


@dataclass
class RunLock:
    """The held lock of one run folder (``previous``: the holder a dead run left, or None)."""

    path: Path
    fd: int
    previous: dict | None = None

    def release(self) -> None:
        """Empty the file, drop the lock and close it; safe to call twice."""
        if self.fd >= 0:
            try:
                try:
                    os.ftruncate(self.fd, 0)
                except OSError:
                    pass  # a full or read-only disk: the holder text stays, the lock still goes
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = -1


def holder_text(h: dict | None) -> str:
    """``"pid 123 on host h since 2026-01-01T00:00:00Z (patchbench bench ...)"``."""
    if not h:
        return "an unknown process"
    when = h.get("started_at") or "?"
    cmd = " ".join(h.get("argv") or [])[:200]
    return f"pid {h.get('pid')} on host {h.get('host')} since {when}" + (f" ({cmd})" if cmd else "")


def _read(fd: int) -> dict | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 65536)
        return json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None


def _busy(run_dir: str | os.PathLike, holder: dict | None, purpose: str, waited_s: float):
    if (holder or {}).get("purpose") == "report":
        who = f"another report: {holder_text(holder)}"
        after = f" (waited {waited_s:.1f} s)" if waited_s else ""
    else:
        who = f"another run: {holder_text(holder)}"
        after = ""
    doing = {"report": "reporting", "nightly": "recording or gating"}.get(
        purpose, "running or resuming"
    )
    return RunFolderBusy(
        f"{run_dir} is being written by {who}{after}; wait for it to end (or stop it) before "
        f"{doing} this folder",
        Path(run_dir),
    )


def acquire(run_dir: str | os.PathLike, *, purpose: str = "run", wait_s: float = 0.0) -> RunLock:
    """Take ``run_dir``'s lock (``purpose``: "run" or "report"; ``wait_s``: how long to wait for
    a report holder). Raises :class:`RunFolderBusy` naming a live holder; ResultsWriteError
    (exit 4) when the file cannot be created."""
    path = Path(run_dir) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ResultsWriteError(path, e) from None
    t0 = time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = _read(fd)
            waited = time.monotonic() - t0
            if (holder or {}).get("purpose") != "report" or waited >= wait_s:
                os.close(fd)
                raise _busy(run_dir, holder, purpose, waited) from None
            time.sleep(0.1)
    previous = _read(fd)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "argv": [os.path.basename(sys.argv[0] or "python")] + sys.argv[1:],
        "purpose": purpose,
    }
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode())
    except OSError as e:
        os.close(fd)
        raise ResultsWriteError(path, e) from None
    return RunLock(path, fd, previous)
