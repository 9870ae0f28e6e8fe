"""Count what the server did that changes a measurement: request retractions and out-of-memory
events, read from a cell's ``server.log`` (or the part of it written after a byte offset, so one
suite's share of the log can be attributed to that suite).

The message texts are those the pinned releases log (read in their installed sources):

- retraction, both releases, ``sglang/srt/managers/scheduler.py``: ``"KV cache pool is full.
  Retract requests. #retracted_reqs: N, ..."`` (0.5.1.post3: ``logger.info`` in
  ``update_running_batch``; 0.5.23: ``logger.warning``, and ``"Testing retraction. #retracted_reqs:
  N, ..."`` when retraction is forced for a test, which retracts requests all the same);
- sglang's KV-cache allocation failure, ``"Prefill out of memory. Try to lower your batch size."``
  and ``"Decode out of memory. Try to lower your batch size."`` (0.5.1.post3:
  ``srt/managers/schedule_batch.py``; 0.5.23: ``srt/mem_cache/allocation.py``). The message is
  logged with ``logger.error`` and then raised as ``RuntimeError``, so the same event appears a
  second time in the scheduler's traceback as ``RuntimeError: Decode out of memory. ...``; that
  echo is not counted again;
- CUDA's allocator: ``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate ...`` (or
  ``torch.cuda.OutOfMemoryError``) and the CUDA runtime's ``CUDA error: out of memory``.

A bare "out of memory" is not counted: 0.5.23 logs warnings such as deep_gemm's "... reducing
max_m to ... to avoid out of memory" that are not an out-of-memory event.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    """Retractions and out-of-memory events in ``path`` from byte ``start_offset`` on.

    The file is streamed line by line (constant memory). When ``start_offset`` falls inside a line,
    that line is skipped: it began before the offset and belongs to the earlier part of the log.
    ``end_offset`` (bytes, optional): stop there (lines that start before it are read whole).

    Returns ``{"retractions_count": int (retraction events), "retracted_requests_count": int (sum
    of their #retracted_reqs), "oom_count": int (out-of-memory events, KV cache and CUDA),
    "first_lines": [str] (the first MAX_FIRST_LINES matching lines, stripped, at most LINE_CHARS
    characters each), "start_offset": int, "end_offset": int (bytes read up to; the next slice's
    start)}``.

    Raises OSError (FileNotFoundError, PermissionError, ...) when the file cannot be read and
    ValueError for a negative ``start_offset``.
    """
    if start_offset < 0:
        raise ValueError(f"start_offset must be >= 0, got {start_offset}")
    retractions = retracted = oom = 0
    first: list[str] = []
    echo_pending: dict[str, int] = {}  # phase -> logged events whose traceback is still due
    with open(Path(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        start = min(start_offset, size)
        pos = start
        f.seek(start)
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                pos += len(f.readline())  # the rest of a line that began before the offset
        for raw in f:
            if end_offset is not None and pos >= end_offset:
                break
            pos += len(raw)
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
    """A scan as a suite keeps it in its summary's ``meta["server_log_scan"]``: the dict
    :func:`scan_server_log` returns, or ``{"error": why}`` when the log could not be read."""

    model_config = ConfigDict(extra="forbid")

    retractions_count: int = 0
    retracted_requests_count: int = 0
    oom_count: int = 0
    first_lines: list[str] = Field(default_factory=list)
    start_offset: int | None = None
    end_offset: int | None = None
    error: str | None = None


def scan_of(meta: dict[str, Any]) -> LogScan | None:
    """The server-log scan in a suite summary's ``meta`` (``meta["server_log_scan"]``); None
    when the suite kept none or it does not have the shape of :class:`LogScan`."""
    raw = meta.get("server_log_scan")
    if not isinstance(raw, dict):
        return None
    try:
        return LogScan.model_validate(raw)
    except ValidationError:
        return None


def log_size(path: str | os.PathLike) -> int:
    """The current size of ``path`` in bytes (0 when it does not exist yet): the offset to pass to
    :func:`scan_server_log` to count only what is written from now on."""
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
