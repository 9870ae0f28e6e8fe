"""SIGTERM and SIGHUP behave like Ctrl-C while ``bench`` runs.

:func:`terminate_like_ctrl_c` installs handlers that raise :class:`Terminated` (a
KeyboardInterrupt, so every cleanup written for Ctrl-C runs: the server group is stopped, a
client such as bench_serving is killed, the cell is marked ``interrupted``). A second signal
while that cleanup runs, or until the command has ended (:func:`restore_handlers`), is reported
and ignored (SIGKILL remains the hard stop). ``bench`` then
raises :class:`patchbench.errors.Interrupted` with the signal number (exit 143 for SIGTERM, 130
otherwise).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """A SIGTERM or SIGHUP turned into a KeyboardInterrupt; ``signum`` is the signal number."""

    def __init__(self, signum: int):
        super().__init__(f"received {signal.Signals(signum).name}")
        self.signum = signum


def signum_of(exc: BaseException) -> int:
    """The signal behind an interrupt: ``exc.signum`` for :class:`Terminated`, SIGINT otherwise."""
    return int(getattr(exc, "signum", signal.SIGINT))


@contextmanager
def terminate_like_ctrl_c(
    log: Callable[[str], None] = print,
    signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT),
) -> Iterator[None]:
    """While inside: the first of ``signals`` raises (SIGINT: KeyboardInterrupt; others:
    :class:`Terminated`); later ones only log a line. Outside the main thread: does nothing.
    The previous handlers are restored on exit, or, once a signal fired, by
    :func:`restore_handlers` when the command has ended."""
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

    old = {s: signal.signal(s, handler) for s in signals}
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
    """Put back the handlers :func:`terminate_like_ctrl_c` kept after a signal fired: until
    then a second signal (a double Ctrl-C, SIGTERM twice) is reported and ignored while the
    command unwinds (servers stopped, lock released, message printed) instead of killing it by
    the signal's default action. ``patchbench.cli.main`` calls it as the command ends; with
    ``exiting`` (a ``patchbench`` process about to exit) those signals are ignored instead: the
    interpreter's shutdown would put back their default action, and a second signal there
    would turn the command's exit code into a death by that signal."""
    while _kept:
        for s, h in _kept.pop().items():
            signal.signal(s, signal.SIG_IGN if exiting else h)
