"""One unit, anywhere (:func:`execute_unit`, the body of both executors)."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from patchbench.envs.nodes import log_tail, machine_key, node_name, prepare_python
from patchbench.errors import EnvironmentNotReady
from patchbench.inputs import REPO_ROOT
from patchbench.records import write_json

#: the bench command a unit runs; {python}, {config}, {results} are filled in
DEFAULT_COMMAND = ("{python}", "-m", "patchbench", "bench", "{config}", "--results", "{results}")


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to send SIGTERM to this process when its parent (the unit's worker) dies, so a
    force-killed Ray worker still makes bench stop its server."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop_leftover_servers(run_dir: Path | None) -> list[int]:
    """Stop any server group a cell of ``run_dir`` still records as running whose runner is gone;
    returns the pgids stopped."""
    if run_dir is None or not run_dir.is_dir():
        return []
    from patchbench.run.ports import find_stale_servers, kill_stale

    found = find_stale_servers(run_dir)
    if found:
        kill_stale(found)
    return [s.pgid for s in found]


def _stop_bench(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to bench's group (bench stops its server, exits 143), SIGKILL after ``grace_s``."""
    from patchbench.run.ports import kill_group

    kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _run_folder(results: Path, resume_dir: Path | None) -> Path | None:
    if resume_dir is not None:
        return resume_dir if resume_dir.is_dir() else None
    found = sorted(d for d in results.glob("*") if d.is_dir()) if results.is_dir() else []
    return found[-1] if found else None


def pack_folder(folder: Path) -> bytes:
    """A gzip'd tar of ``folder``'s contents (member names relative to it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        tar.add(str(folder), arcname=".")
    return buf.getvalue()


def unpack_folder(data: bytes, dest: Path) -> None:
    """Unpack :func:`pack_folder`'s bytes into ``dest``, replaced as a whole (tarfile's "data"
    filter refuses members outside it, links and devices)."""
    dest = Path(dest)
    tmp = dest.parent / f".{dest.name}.unpack-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(tmp, filter="data")
    old = dest.parent / f".{dest.name}.old-{os.getpid()}"
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def execute_unit(spec: dict) -> dict:
    """Run one unit's bench here.

    ``spec``: {"id", "config" (JSON data), "sglang", "env_setup", "env_root", "build_envs",
    "command" (with {python}/{config}/{results}), "workdir" (:func:`unit_workdir`), "resume_dir"
    or "resume_archive" (bytes), "out_dir" (local: the run folder goes there, else it is returned
    as ``archive``), "stop_grace_s", "env"}. Returns {"exit_code", "message", "log_tail", "node",
    "archive", "archive_bytes", "has_folder", "timings_s", "started_at", "ended_at" (epoch s)}.
    Interrupted, it stops bench (SIGTERM, SIGKILL after ``stop_grace_s``) and any server group
    left, moves a local run folder into place and re-raises.
    """
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix=f"patchbench-unit-{spec['id']}-"))
    out: dict[str, Any] = {
        "node": node_name(),
        "archive": None,
        "archive_bytes": 0,
        "has_folder": False,
        "started_at": started,
        "timings_s": {},
    }
    log_path = tmp / "bench.log"
    try:
        cfg, results, resume_dir = _stage(spec, tmp)
        with open(log_path, "w") as log:
            t0 = time.monotonic()
            try:
                python = prepare_python(spec, unit_workdir(spec), log)
            except EnvironmentNotReady as e:
                out.update(exit_code=e.exit_code, message=str(e), log_tail=log_tail(log_path))
                return out
            out["timings_s"]["env"] = round(time.monotonic() - t0, 3)
            t0 = time.monotonic()
            proc = _start_bench(spec, python, cfg, results, resume_dir, log)
            _wait_bench(proc, spec, results, resume_dir)
            out["timings_s"]["bench"] = round(time.monotonic() - t0, 3)
        _finish(out, proc.returncode, spec, _run_folder(results, resume_dir), log_path)
        return out
    finally:
        out["ended_at"] = time.time()
        shutil.rmtree(tmp, ignore_errors=True)


def unit_workdir(spec: dict) -> Path:
    """Where bench runs: for "cwd" (Ray shipped this checkout), the driver's own checkout on the
    driver's machine (``spec["checkout"]``: {"path", "machine"}), else the shipped one; otherwise
    the given folder, or this checkout."""
    if spec.get("workdir") == "cwd":
        home = spec.get("checkout") or {}
        if home.get("machine") == machine_key() and Path(home.get("path", "")).is_dir():
            return Path(home["path"])
        return Path.cwd()
    return Path(spec["workdir"]) if spec.get("workdir") else REPO_ROOT


def _stage(spec: dict, tmp: Path) -> tuple[Path, Path, Path | None]:
    """(the unit's config file (JSON), the results folder, the run folder it resumes or None)
    under ``tmp``; a resume archive is unpacked there."""
    cfg = write_json(tmp / f"{spec['id']}.json", spec["config"])
    results = tmp / "results"
    results.mkdir()
    resume_dir = Path(spec["resume_dir"]) if spec.get("resume_dir") else None
    if spec.get("resume_archive"):
        resume_dir = tmp / "resume" / spec["id"]
        resume_dir.parent.mkdir()
        unpack_folder(spec["resume_archive"], resume_dir)
    return cfg, results, resume_dir


def _start_bench(
    spec: dict, python: str, cfg: Path, results: Path, resume_dir: Path | None, log: IO[str]
) -> subprocess.Popen:
    """Start the unit's bench command in its own session, output to ``log``."""
    fill = {"python": python, "config": str(cfg), "results": str(results)}
    cmd = [a.format(**fill) for a in spec.get("command") or DEFAULT_COMMAND]
    if resume_dir is not None:
        cmd += ["--resume", str(resume_dir)]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    return subprocess.Popen(
        cmd,
        cwd=str(unit_workdir(spec)),
        env={**os.environ, **(spec.get("env") or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_pdeathsig,
    )


def _wait_bench(proc: subprocess.Popen, spec: dict, results: Path, resume_dir: Path | None) -> None:
    """Wait for bench in short steps (a Ray cancellation lands between them); when interrupted,
    stop bench and any server it left, move a local run folder into place, re-raise."""
    try:
        while proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
    except BaseException:
        _stop_bench(proc, float(spec.get("stop_grace_s", 60)))
        run_dir = _run_folder(results, resume_dir)
        _stop_leftover_servers(run_dir)
        if spec.get("out_dir") and run_dir is not None:
            _move_into(run_dir, Path(spec["out_dir"]))
        raise


def _finish(
    out: dict[str, Any], code: int, spec: dict, run_dir: Path | None, log_path: Path
) -> None:
    """Fill ``out`` after bench ended: stop a server group it left, move the run folder into
    ``spec["out_dir"]`` or pack it as ``out["archive"]``."""
    _stop_leftover_servers(run_dir)
    out["exit_code"] = code
    out["log_tail"] = log_tail(log_path)
    out["message"] = _error_line(out["log_tail"]) if code else ""
    if run_dir is None or not (run_dir / "manifest.json").exists():
        return
    out["has_folder"] = True
    t0 = time.monotonic()
    if spec.get("out_dir"):
        _move_into(run_dir, Path(spec["out_dir"]))
    else:
        out["archive"] = pack_folder(run_dir)
        out["archive_bytes"] = len(out["archive"])
    out["timings_s"]["pack"] = round(time.monotonic() - t0, 3)


def _move_into(run_dir: Path, dest: Path) -> None:
    if run_dir.resolve() == dest.resolve():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.move(str(run_dir), str(dest))


def _error_line(tail: str) -> str:
    """bench's one-line error (``patchbench bench: ...``), else the last non-empty line."""
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith(("patchbench", "error")):
            return ln[:500]
    return lines[-1][:500] if lines else ""
