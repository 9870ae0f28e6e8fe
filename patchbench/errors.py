"""One table from exception to exit code, used by every command (README, "Exit codes").

Every error a command can end with derives from :class:`PatchbenchError` and carries its exit
code; ``patchbench.cli`` turns it into one line on stderr and that code. Anything else escaping a
command is a bug (exit 70 with the traceback, so it is reported rather than mistaken for a
regression).

| code | class | meaning |
|---|---|---|
| 0 | - | done (nightly: every gate green) |
| 1 | :class:`RegressionFound` | a regression (nightly gate red, or ``compare --fail-on-regression``) |
| 2 | :class:`UsageError` and subclasses | bad usage, config or patch (names file, key, line) |
| 3 | :class:`EnvironmentNotReady` | environment not ready (wrong sglang, missing model, no GPU) |
| 4 | :class:`RunFailed` | a run failed (a cell failed, results folder unwritable or full) |
| 5 | :class:`Underpowered` | nightly: no regression shown, but primaries stayed inconclusive |
| 130 | :class:`Interrupted` | interrupted by Ctrl-C (SIGINT) or SIGHUP |
| 143 | :class:`Interrupted` (SIGTERM) | terminated by SIGTERM (finished cells kept) |
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_ENV = 3
EXIT_RUN_FAILED = 4
EXIT_UNDERPOWERED = 5
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BUG = 70

#: code -> meaning, rendered into the CLI's help and the README table
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done (nightly: no regression)",
    EXIT_REGRESSION: "regression found",
    EXIT_USAGE: "bad usage, config or patch (the message names the file, key or line)",
    EXIT_ENV: "environment not ready (wrong sglang, missing model, no GPU where one is needed)",
    EXIT_RUN_FAILED: "a run failed (finished cells are kept)",
    EXIT_UNDERPOWERED: "nightly: no regression shown, but primary metrics stayed inconclusive",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGHUP; finished cells are kept)",
    EXIT_TERMINATED: "terminated by SIGTERM (finished cells are kept)",
}


class PatchbenchError(Exception):
    """Base of every error a command ends with; ``exit_code`` is its documented exit code."""

    exit_code: int = EXIT_RUN_FAILED


class UsageError(PatchbenchError):
    """Bad command-line usage (exit 2)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError, ValueError):
    """A config (or matrix) file is invalid; the message names the file, key and line (exit 2)."""


class PatchError(UsageError):
    """A patch is malformed or does not apply; names the patch, release, file and hunk (exit 2)."""


class EnvironmentNotReady(PatchbenchError):
    """The environment cannot run the request (wrong sglang, missing model, no GPU) (exit 3)."""

    exit_code = EXIT_ENV


class RunFailed(PatchbenchError):
    """A run failed; ``run_dir`` (may be None) keeps everything that finished (exit 4)."""

    exit_code = EXIT_RUN_FAILED

    def __init__(self, message: str, run_dir=None):
        super().__init__(message)
        self.run_dir = run_dir


class RegressionFound(PatchbenchError):
    """A gate or comparison found a regression (exit 1)."""

    exit_code = EXIT_REGRESSION


class Underpowered(PatchbenchError):
    """Nightly: nothing regressed, but primaries stayed inconclusive (exit 5)."""

    exit_code = EXIT_UNDERPOWERED


class Interrupted(PatchbenchError):
    """Stopped by a signal; ``signum`` is 2 (SIGINT), 1 (SIGHUP) or 15 (SIGTERM).

    Exit 143 for SIGTERM, 130 otherwise. ``run_dir`` (may be None) keeps finished cells.
    """

    def __init__(self, message: str = "interrupted", signum: int = 2, run_dir=None):
        super().__init__(message)
        self.signum = signum
        self.run_dir = run_dir
        self.exit_code = EXIT_TERMINATED if signum == 15 else EXIT_INTERRUPTED


def exit_code_of(exc: BaseException) -> int:
    """The documented exit code for ``exc`` (KeyboardInterrupt -> 130; unknown -> 70)."""
    if isinstance(exc, PatchbenchError):
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_BUG
