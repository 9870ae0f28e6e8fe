"""Request retractions and out-of-memory events in a cell's ``server.log`` (or one suite's part
of it), as the pinned releases log them: a KV-cache allocation failure is logged and raised, so
its traceback's echo is not counted again; a bare "out of memory" is not counted (0.5.23's
deep_gemm warns "... to avoid out of memory"). A log capped by :class:`patchbench.run.logcap.LogCap`
is read without its hole.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from patchbench.run.logcap import read_lines

#: a retraction event; group 1: the number of requests it retracted
RETRACT_RE = re.compile(
    r"(?:KV cache pool is full\. Retract requests\.|Testing retraction\.)"
    r"(?:\s*#retracted_reqs:\s*(\d+))?"
)
#: sglang's own KV-cache allocation failure; group 1: the phase
KV_OOM_RE = re.compile(r"(Prefill|Decode) out of memory\. Try to lower your batch size")
#: CUDA out of memory (torch's allocator or the CUDA runtime)
CUDA_OOM_RE = re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError")
#: the exception line that repeats an already logged KV out-of-memory message
_ECHO_RE = re.compile(r"^\s*(?:\S*Error|Exception): (Prefill|Decode) out of memory\.")

#: every line any pattern above matches contains one of these bytes
_KEYWORDS = (b"etract", b"out of memory", b"OutOfMemoryError")

#: matching lines quoted in ``first_lines`` (each cut to LINE_CHARS characters)
MAX_FIRST_LINES = 5
LINE_CHARS = 300


def scan_server_log(
    path: str | os.PathLike, start_offset: int = 0, end_offset: int | None = None
) -> dict:
    """Retractions and out-of-memory events in ``path`` between byte offsets (a line belongs to
    the part it starts in). Returns {"retractions_count", "retracted_requests_count",
    "oom_count", "first_lines", "start_offset", "end_offset" (the next part's start)}. Raises
    OSError, or ValueError for a negative ``start_offset``."""
    if start_offset < 0:
        raise ValueError(f"start_offset must be >= 0, got {start_offset}")
    retractions = retracted = oom = 0
    first: list[str] = []
    echo_pending: dict[str, int] = {}  # phase -> logged events whose traceback is still due
    with open(Path(path), "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        start = min(start_offset, size)
        pos = start
        # a line that began before the offset belongs to the part before (a NUL byte before
        # it: the offset is in a hole of a capped log, and what follows it is a line's rest)
        skip = start > 0 and os.pread(fd, 1, start - 1) != b"\n"
        for at, raw, after in read_lines(fd, start, size):
            if skip:
                pos, skip = after, False
                continue
            if end_offset is not None and at >= end_offset:
                break
            pos = after
            if not any(k in raw for k in _KEYWORDS):
                continue  # most lines: a byte search instead of three regular expressions
            line = raw.decode("utf-8", "replace")
            hit = False
            m = RETRACT_RE.search(line)
            if m:
                retractions += 1
                retracted += int(m.group(1) or 0)
                hit = True
            echo = _ECHO_RE.search(line)
            if echo and echo_pending.get(echo.group(1)):
                echo_pending[echo.group(1)] -= 1  # the traceback of an event already counted
            else:
                k = KV_OOM_RE.search(line)
                if k:
                    oom += 1
                    echo_pending[k.group(1)] = echo_pending.get(k.group(1), 0) + 1
                    hit = True
                elif CUDA_OOM_RE.search(line):
                    oom += 1
                    hit = True
            if hit and len(first) < MAX_FIRST_LINES:
                first.append(line.strip()[:LINE_CHARS])
    return {
        "retractions_count": retractions,
        "retracted_requests_count": retracted,
        "oom_count": oom,
        "first_lines": first,
        "start_offset": start,
        "end_offset": pos,
    }


class LogScan(BaseModel):
    """``meta["server_log_scan"]``: a scan's dict, or ``{"error": why}``."""

    model_config = ConfigDict(extra="forbid")

    retractions_count: int = 0
    retracted_requests_count: int = 0
    oom_count: int = 0
    first_lines: list[str] = Field(default_factory=list)
    start_offset: int | None = None
    end_offset: int | None = None
    error: str | None = None


def scan_of(meta: dict[str, Any]) -> LogScan | None:
    """The :class:`LogScan` in a suite summary's ``meta``; None when absent or malformed."""
    raw = meta.get("server_log_scan")
    if not isinstance(raw, dict):
        return None
    try:
        return LogScan.model_validate(raw)
    except ValidationError:
        return None


def log_size(path: str | os.PathLike) -> int:
    """The size of ``path`` in bytes (0 when missing): the offset from which to scan what comes."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def taint_warning(scan: dict, what: str = "the throughput and latency metrics") -> str | None:
    """A warning line for a scan with retractions or out-of-memory events, else None."""
    r, o = scan.get("retractions_count") or 0, scan.get("oom_count") or 0
    if not r and not o:
        return None
    parts = []
    if r:
        parts.append(
            f"{r} retraction(s) of {scan.get('retracted_requests_count', 0)} request(s) "
            "(KV cache pool full: retracted requests are recomputed later)"
        )
    if o:
        parts.append(f"{o} out-of-memory event(s)")
    first = scan.get("first_lines") or []
    return f"the server logged {' and '.join(parts)} during this suite; they change {what}" + (
        f" (first: {first[0]})" if first else ""
    )
