"""``server.log``'s disk use held at ``server.log_max_mb`` MiB while the server runs
(:class:`LogCap`: ``fallocate(PUNCH_HOLE | KEEP_SIZE)`` frees the middle between the cap's first
quarter and last three quarters; sizes and offsets stay, the hole reads as NUL bytes, its first
line says what was dropped; docs/faults.md), and :func:`read_lines`, which reads such a log
without its hole."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import itertools
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

#: bytes the kept head and tail are aligned to (the usual file-system block)
BLOCK = 4096
#: seconds between two checks of the log's size while the server runs
CHECK_INTERVAL_S = 2.0
#: bytes :func:`read_lines` reads at once
CHUNK_BYTES = 1 << 20
#: ``fallocate`` modes (linux/falloc.h)
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
MIB = 1 << 20


def _fallocate():
    """libc's 64-bit ``fallocate`` (None where there is none: not Linux, no libc found)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "fallocate64", None) or getattr(libc, "fallocate", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


class PunchUnsupported(OSError):
    """This OS or file system cannot punch a hole into a file (``errno``: why)."""


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free bytes ``offset`` .. ``offset + length`` of the open file ``fd`` (they read as NUL
    bytes; the size stays). Raises :class:`PunchUnsupported` where this OS or file system cannot,
    OSError on another failure."""
    fn = _fallocate()
    if fn is None:
        raise PunchUnsupported(errno.EOPNOTSUPP, f"fallocate is not available on {sys.platform}")
    if fn(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        e = ctypes.get_errno()
        cls = PunchUnsupported if e in (errno.EOPNOTSUPP, errno.ENOSYS) else OSError
        raise cls(e, os.strerror(e))


def allocated_bytes(path: str | os.PathLike) -> int:
    """Bytes ``path`` takes on disk (``st_blocks * 512``; 0 when missing)."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def _align_down(n: int) -> int:
    return n - n % BLOCK


class LogCap:
    """Hold the disk use of the log at ``path`` near ``max_mb`` MiB (at most the cap plus two
    blocks after each check): :meth:`start` the thread, :meth:`close` it (a last check) once the
    server has stopped, or call :meth:`check`. ``dropped``: (first byte dropped, first byte kept
    after) of the hole, None until one was punched; ``note``: a sentence for the cell's notes."""

    def __init__(self, path: str | os.PathLike, max_mb: int, interval_s: float = CHECK_INTERVAL_S):
        self.path = Path(path)
        self.max_mb = max_mb
        self.max_bytes = int(max_mb * MIB)
        self.head = _align_down(self.max_bytes // 4)
        self.tail = self.max_bytes - self.head
        self.interval_s = interval_s
        self.dropped: tuple[int, int] | None = None
        self.unsupported: str | None = None
        self.allocated_before: int | None = None  # bytes on disk before the first punch
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def note(self) -> str | None:
        """What the cap did to the log, in words (None: nothing)."""
        if self.unsupported:
            return (
                f"{self.path.name} not capped at server.log_max_mb = {self.max_mb}: "
                f"{self.unsupported}; it keeps everything the server wrote"
            )
        if self.dropped:
            a, b = self.dropped
            return (
                f"{self.path.name} capped at server.log_max_mb = {self.max_mb}: bytes {a}-{b} "
                f"({(b - a) / MIB:.1f} MiB) of the server's output dropped; the first {a} "
                f"bytes and everything from byte {b} on kept, a note line where they were"
            )
        return None

    def note_line(self, a: int, b: int) -> bytes:
        """The line written where the dropped bytes began."""
        return (
            f"[patchbench: bytes {a}-{b} of {self.path.name} dropped (server.log_max_mb = "
            f"{self.max_mb}); what follows is the log's end]\n"
        ).encode()

    def check(self) -> bool:
        """Punch the log's middle out when it takes more than the cap; True when it did.
        Raises OSError when the log cannot be opened or punched for another reason than an
        unsupported punch (that one only sets :attr:`unsupported`)."""
        with self._lock:
            if self.max_bytes <= 0 or self.unsupported:
                return False
            try:
                fd = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                return False
            try:
                st = os.fstat(fd)
                if st.st_blocks * 512 <= self.max_bytes:
                    return False
                start = self.head
                end = _align_down(st.st_size - self.tail)
                if end <= (self.dropped[1] if self.dropped else start) + BLOCK:
                    return False  # nothing new to drop past the last hole
                if self.allocated_before is None:
                    self.allocated_before = st.st_blocks * 512
                try:
                    punch_hole(fd, start, end - start)
                except PunchUnsupported as e:
                    name = (  # Linux's ENOTSUP is the same number: the man page's name
                        "EOPNOTSUPP"
                        if e.errno == errno.EOPNOTSUPP
                        else errno.errorcode.get(e.errno, e.errno)
                    )
                    self.unsupported = (
                        f"this file system cannot punch holes (fallocate: {name}, {e.strerror})"
                    )
                    return False
                before = os.pread(fd, 1, start - 1) if start else b""
                lead = b"" if before in (b"", b"\n") else b"\n"
                os.pwrite(fd, (lead + self.note_line(start, end))[: end - start], start)
                self.dropped = (start, end)
                return True
            finally:
                os.close(fd)

    # ------------------------------------------------------------------ the thread
    def start(self) -> LogCap:
        """Check every ``interval_s`` seconds in a daemon thread (nothing when the cap is 0)."""
        if self.max_bytes > 0 and self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="patchbench-log-cap", daemon=True
            )
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except OSError:
                continue  # the log went away or cannot be punched now: the next check tries

    def close(self) -> None:
        """Stop the thread and check once more (the server has stopped). Safe to call twice;
        an OSError of that check is left unsaid (the log stays as it is)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        try:
            self.check()
        except OSError:
            pass


# ---------------------------------------------------------------------- reading
def _next_data(fd: int, pos: int, size: int) -> int:
    """The first offset at or after ``pos`` that holds data (``size`` when only a hole is left;
    ``pos`` where the file system cannot tell)."""
    try:
        return os.lseek(fd, pos, os.SEEK_DATA)
    except OSError as e:
        if e.errno == errno.ENXIO:
            return size
        return pos


def read_lines(
    fd: int, start: int = 0, size: int | None = None, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[tuple[int, bytes, int]]:
    """(offset where the line starts, the line without its ``\\n`` and without NUL bytes, offset
    of the next line) for every line of the open file ``fd`` from byte ``start`` up to ``size``
    (its size now when None); the last line may have had no ``\\n``. Holes are jumped over
    (``SEEK_DATA``); reads ``chunk_bytes`` at a time plus the longest line."""
    if size is None:
        size = os.fstat(fd).st_size
    pos = line_start = start
    pending: list[bytes] = []  # the line begun in an earlier chunk, NUL bytes left out
    while pos < size:
        pos = max(pos, _next_data(fd, pos, size))
        if pos >= size:
            break
        buf = os.pread(fd, min(chunk_bytes, size - pos), pos)
        if not buf:
            break
        if b"\0" in buf:
            parts = [x.replace(b"\0", b"") for x in buf.split(b"\n")]
            ends = list(itertools.accumulate(len(x) + 1 for x in buf.split(b"\n")))
        else:
            parts = buf.split(b"\n")
            ends = None
        rest = parts.pop()
        at = pos
        for k, part in enumerate(parts):
            at = pos + ends[k] if ends is not None else at + len(part) + 1
            if k == 0 and pending:
                part = b"".join(pending) + part
                pending = []
            yield line_start, part, at
            line_start = at
        if rest:
            pending.append(rest)
        pos += len(buf)
    if pending or line_start < pos:  # a last line without its newline, or a hole at the end
        yield line_start, b"".join(pending), pos
