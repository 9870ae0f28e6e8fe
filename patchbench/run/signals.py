"""How a command ends: SIGTERM and SIGHUP behave like Ctrl-C (:func:`terminate_like_ctrl_c`;
exit 143 for SIGTERM, 130 otherwise); a closed stdout or stderr is no error
(:func:`tolerate_closed_output`)."""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO


class Terminated(KeyboardInterrupt):
    """A SIGTERM or SIGHUP turned into a KeyboardInterrupt; ``signum`` is the signal number."""

    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def signum_of(exc: BaseException) -> int:
    """The signal behind an interrupt: ``exc.signum`` for :class:`Terminated`, SIGINT otherwise."""
    return int(getattr(exc, "signum", signal.SIGINT))


@contextmanager
def terminate_like_ctrl_c(log: Callable[[str], None] = print) -> Iterator[None]:
    """Inside: the first SIGTERM, SIGHUP or SIGINT raises (SIGINT: KeyboardInterrupt, others
    :class:`Terminated`), later ones only log a line; nothing outside the main thread. The old
    handlers come back on exit, or once a signal fired, by :func:`restore_handlers`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = {"fired": False}

    def handler(signum, frame):
        if state["fired"]:
            log(
                f"received {signal.Signals(signum).name} again; still stopping the server "
                "(SIGKILL stops the runner at once, but may leave the server running)"
            )
            return
        state["fired"] = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        if state["fired"]:  # the command is stopping: a later signal must not cut that short
            _kept.append(old)
        else:
            for s, h in old.items():
                signal.signal(s, h)


#: handlers :func:`terminate_like_ctrl_c` did not put back because a signal had fired
_kept: list[dict] = []


def restore_handlers(*, exiting: bool = False) -> None:
    """Put back the handlers :func:`terminate_like_ctrl_c` kept after a signal fired (``exiting``:
    ignore those signals instead, so one during shutdown cannot change the exit code)."""
    while _kept:
        for s, h in _kept.pop().items():
            signal.signal(s, signal.SIG_IGN if exiting else h)


# ------------------------------------------------------------------ a closed output


def _closed_pipe(e: OSError) -> bool:
    return isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE


class _Tolerant:
    """A stream pointed at /dev/null once its reader has gone."""

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
    """Wrap ``sys_module.stdout`` and ``sys_module.stderr`` (unless already wrapped or None) so
    that once their reader closes them they go to ``/dev/null`` and the command keeps its exit
    code. Call once per process, before the command writes anything."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys_module, name)
        if stream is not None and not isinstance(stream, _Tolerant):
            setattr(sys_module, name, _Tolerant(stream))
