"""The exit codes and the errors that carry them: one table (:data:`EXIT_CODES`) for every
command, ``patchbench --help`` and the docs. ``patchbench.cli`` prints ``patchbench CMD: <kind>
(exit N): <message>`` for a :class:`PatchbenchError`; anything else is a bug (exit 70).

``python -m patchbench.errors [FILE ...]`` prints :data:`EXIT_CODES` as a markdown table, or
rewrites the table between ``<!-- exit-codes -->`` and ``<!-- /exit-codes -->`` in each FILE
(tests/cli/test_errors.py fails while docs/design.md's copy differs).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2
EXIT_ENV = 3
EXIT_RUN_FAILED = 4
EXIT_UNDERPOWERED = 5
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
EXIT_BUG = 70

#: code -> meaning, in the order the help and the docs list them
EXIT_CODES: dict[int, str] = {
    EXIT_OK: "done (nightly: no regression)",
    EXIT_REGRESSION: "regression found",
    EXIT_USAGE: (
        "bad usage, config or patch (the message names the file, key or line; a patch that "
        "does not apply, in bench and check-patch alike)"
    ),
    EXIT_ENV: (
        "environment not ready (wrong sglang for the pin, missing model, no GPU where one is "
        "needed, history unusable)"
    ),
    EXIT_RUN_FAILED: (
        "a run failed: a cell failed, a timed cell is incomplete, the report could not be "
        "written, the results folder is unwritable or full, or another run holds the run folder "
        "(finished cells are kept)"
    ),
    EXIT_UNDERPOWERED: "nightly: no regression shown, but the night was too noisy or ran too few repeats",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGHUP; finished cells are kept)",
    EXIT_TERMINATED: "terminated by SIGTERM (finished cells are kept)",
    EXIT_BUG: "internal error (a bug: the traceback is printed)",
}

MARKERS = ("<!-- exit-codes -->", "<!-- /exit-codes -->")


def exit_code_table(markdown: bool = False) -> str:
    """:data:`EXIT_CODES` as the help's ``exit codes:`` lines, or as a markdown table."""
    if markdown:
        rows = [f"| {code} | {text} |" for code, text in EXIT_CODES.items()]
        return "\n".join(["| code | meaning |", "|---|---|", *rows])
    return "exit codes:\n" + "\n".join(f"  {c:>3}  {t}" for c, t in EXIT_CODES.items())


def with_table(text: str, where: str = "text") -> str:
    """``text`` with the lines between :data:`MARKERS` replaced by the markdown table; ValueError
    naming ``where`` when the markers are missing."""
    pattern = re.compile(rf"({re.escape(MARKERS[0])}\n).*?(\n{re.escape(MARKERS[1])})", re.S)
    if not pattern.search(text):
        raise ValueError(f"{where}: no {MARKERS[0]} ... {MARKERS[1]} block")
    return pattern.sub(lambda m: m[1] + exit_code_table(markdown=True) + m[2], text, count=1)


class PatchbenchError(Exception):
    """Base of every error a command ends with: ``exit_code`` and the ``kind`` its message
    line starts with."""

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

    def __init__(self, message: str, run_dir=None):
        super().__init__(message)
        self.run_dir = run_dir


class Interrupted(PatchbenchError):
    """Stopped by signal ``signum`` (2 SIGINT, 1 SIGHUP: exit 130 "interrupted"; 15 SIGTERM:
    exit 143 "terminated"); ``run_dir`` (may be None) keeps finished cells."""

    def __init__(self, message: str = "interrupted", signum: int = 2, run_dir=None):
        super().__init__(message)
        self.signum = signum
        self.run_dir = run_dir
        self.exit_code = EXIT_TERMINATED if signum == 15 else EXIT_INTERRUPTED
        self.kind = "terminated" if signum == 15 else "interrupted"


def exit_code_of(exc: BaseException) -> int:
    """The documented exit code of ``exc``: its ``exit_code``; KeyboardInterrupt 130; SystemExit
    its code (0 for None, 2 for a message); anything else 70 (a bug)."""
    if isinstance(exc, PatchbenchError):
        return int(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, SystemExit):
        return (
            exc.code if isinstance(exc.code, int) else EXIT_OK if exc.code is None else EXIT_USAGE
        )
    return EXIT_BUG


def kind_of(exc: BaseException) -> str:
    """The words a command's error line starts with: ``exc.kind``, "interrupted" for
    KeyboardInterrupt, "internal error" for anything else (a bug)."""
    if isinstance(exc, PatchbenchError):
        return str(exc.kind)
    return "interrupted" if isinstance(exc, KeyboardInterrupt) else "internal error"


def main(argv: list[str] | None = None) -> int:
    """``python -m patchbench.errors [FILE ...]``: print the markdown table, or rewrite it in
    each FILE between :data:`MARKERS`. Exit 2 naming a file without them."""
    files = sys.argv[1:] if argv is None else argv
    if not files:
        print(exit_code_table(markdown=True))
    for f in map(Path, files):
        try:
            f.write_text(with_table(f.read_text(encoding="utf-8"), str(f)), encoding="utf-8")
        except (OSError, ValueError) as e:
            print(e, file=sys.stderr)
            return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
