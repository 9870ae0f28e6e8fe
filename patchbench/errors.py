"""One table from exception to exit code and message kind, used by every command (README,
"Exit codes").

Every error a command can end with derives from :class:`PatchbenchError` and carries its exit
code (``exit_code``) and the word the message starts with (``kind``); ``patchbench.cli`` turns it
into one line on stderr, ``patchbench CMD: <kind> (exit N): <message>``, and that code. Anything
else escaping a command is a bug (exit 70 with the traceback, so it is reported rather than
mistaken for a regression).

| code | class | kind | meaning |
|---|---|---|---|
| 0 | - | - | done (nightly: every gate green) |
| 1 | :class:`RegressionFound` | regression found | a regression (nightly: a gate is red) |
| 2 | :class:`UsageError` | usage error | bad command-line usage or input file |
| 2 | :class:`ConfigError` | config error | a config or matrix file (names file, key, line) |
| 2 | :class:`PatchError` | patch error | a patch is malformed or does not apply |
| 3 | :class:`EnvironmentNotReady` | environment not ready | wrong sglang, missing model, no GPU |
| 4 | :class:`RunFailed` | run failed | a cell failed or a timed cell incomplete; no report; folder full |
| 4 | ``RunFolderBusy`` | run folder busy | another live run writes the run folder (run/lock.py) |
| 5 | :class:`Underpowered` | underpowered | nightly: no regression shown; night too noisy or too few repeats |
| 130 | :class:`Interrupted` | interrupted | interrupted by Ctrl-C (SIGINT) or SIGHUP |
| 143 | :class:`Interrupted` (SIGTERM) | terminated | terminated by SIGTERM (finished cells kept) |

Exit 4 in detail: a cell failed; a timed cell is incomplete (a suite's measurement is invalid:
failed requests, outputs cut short, impossible values; no verdict comes from it); the report
could not be written; the results folder is unwritable or full; another run holds the folder.

``nightly`` returns its codes 0, 1 and 5 from its gates rather than raising. Modules subclass
these classes to add data or a narrower kind (e.g. ``patchbench.runfolder.RunFolderError``,
"run folder error"); a subclass that changes ``exit_code`` sets the matching ``kind`` too.
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
    EXIT_RUN_FAILED: (
        "a run failed: a cell failed, a timed cell is incomplete, or the report could not be "
        "written (finished cells are kept)"
    ),
    EXIT_UNDERPOWERED: "nightly: no regression shown, but the night was too noisy or ran too few repeats",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGHUP; finished cells are kept)",
    EXIT_TERMINATED: "terminated by SIGTERM (finished cells are kept)",
}


class PatchbenchError(Exception):
    """Base of every error a command ends with: ``exit_code`` is its documented exit code,
    ``kind`` the words its message line starts with."""

    exit_code: int = EXIT_RUN_FAILED
    kind: str = "run failed"


class UsageError(PatchbenchError):
    """Bad command-line usage or input (exit 2)."""

    exit_code = EXIT_USAGE
    kind = "usage error"


class ConfigError(UsageError, ValueError):
    """A config (or matrix) file is invalid; the message names the file, key and line (exit 2)."""

    kind = "config error"


class PatchError(UsageError):
    """A patch is malformed or does not apply; names the patch, release, file and hunk (exit 2)."""

    kind = "patch error"


class EnvironmentNotReady(PatchbenchError):
    """The environment cannot run the request (wrong sglang, missing model, no GPU) (exit 3)."""

    exit_code = EXIT_ENV
    kind = "environment not ready"


class RunFailed(PatchbenchError):
    """A run failed; ``run_dir`` (may be None) keeps everything that finished (exit 4)."""

    exit_code = EXIT_RUN_FAILED
    kind = "run failed"

    def __init__(self, message: str, run_dir=None):
        super().__init__(message)
        self.run_dir = run_dir


class RegressionFound(PatchbenchError):
    """A gate found a regression (exit 1)."""

    exit_code = EXIT_REGRESSION
    kind = "regression found"


class Underpowered(PatchbenchError):
    """Nightly: nothing regressed, but tonight's noise was clearly worse than the learned noise, or
    the noise needs more repeats than the night ran (exit 5; docs/nightly.md)."""

    exit_code = EXIT_UNDERPOWERED
    kind = "underpowered"


class Interrupted(PatchbenchError):
    """Stopped by a signal; ``signum`` is 2 (SIGINT), 1 (SIGHUP) or 15 (SIGTERM).

    Exit 143 ("terminated") for SIGTERM, 130 ("interrupted") otherwise. ``run_dir`` (may be
    None) keeps finished cells.
    """

    def __init__(self, message: str = "interrupted", signum: int = 2, run_dir=None):
        super().__init__(message)
        self.signum = signum
        self.run_dir = run_dir
        self.exit_code = EXIT_TERMINATED if signum == 15 else EXIT_INTERRUPTED
        self.kind = "terminated" if signum == 15 else "interrupted"


def exit_code_of(exc: BaseException) -> int:
    """The documented exit code for ``exc`` (KeyboardInterrupt -> 130; unknown -> 70)."""
    if isinstance(exc, PatchbenchError):
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    return EXIT_BUG


def kind_of(exc: BaseException) -> str:
    """The words a command's error line starts with: ``exc.kind`` for a :class:`PatchbenchError`,
    "interrupted" for KeyboardInterrupt, "internal error" for anything else (a bug)."""
    if isinstance(exc, PatchbenchError):
        return str(exc.kind)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "internal error"
