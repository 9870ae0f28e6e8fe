"""A command's stdout or stderr closed by its reader (``patchbench report RUN | head -1``).

Python raises :class:`BrokenPipeError` on the first write after the reader has gone; left alone,
that write ends the command with a traceback (exit 70), wherever the print is, and a run would
stop mid-cell. :func:`tolerate_closed_output` wraps ``sys.stdout`` and ``sys.stderr`` once, in the
CLI's entry point (``patchbench.cli.main``), so that a write to a closed pipe points the stream's
file descriptor at ``/dev/null`` and the command goes on and ends with its own exit code: the
reader already has what it wanted, and what the command writes to disk (run folders, reports)
is the same as without the pipe. Only writes to these two streams are caught; a broken socket
to a server is still an error.
"""

from __future__ import annotations

import errno
import os
from typing import Any, TextIO


def _closed_pipe(e: OSError) -> bool:
    return isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE


class _Tolerant:
    """A text stream that forwards everything to ``stream`` and, on the first write or flush that
    finds the reader gone, points the stream's descriptor at ``/dev/null`` and drops the text."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.closed_by_reader = False

    def _drop(self) -> None:
        self.closed_by_reader = True
        try:
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)  # later writes, the final flush and children inherit /dev/null
            os.close(null)
        except (OSError, ValueError):
            pass
        try:  # whatever the buffer still holds was meant for the gone reader
            self._stream.flush()
        except (OSError, ValueError):
            pass

    def write(self, s: str) -> int:
        if self.closed_by_reader:
            return len(s)
        try:
            return self._stream.write(s)
        except OSError as e:
            if not _closed_pipe(e):
                raise
            self._drop()
            return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.closed_by_reader:
            return
        try:
            self._stream.flush()
        except OSError as e:
            if not _closed_pipe(e):
                raise
            self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def tolerate_closed_output(sys_module: Any) -> None:
    """Wrap ``sys_module.stdout`` and ``sys_module.stderr`` (module docstring) unless they are
    already wrapped or absent (``None`` under ``pythonw``). Call once per process, before the
    command writes anything; a test's captured streams are left alone by not calling it."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys_module, name)
        if stream is not None and not isinstance(stream, _Tolerant):
            setattr(sys_module, name, _Tolerant(stream))


__all__ = ["tolerate_closed_output"]
