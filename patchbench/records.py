"""Atomic file writes (:func:`write_bytes`: a temporary file, fsync, ``os.replace``) and JSON
helpers; a file that cannot be written raises :class:`ResultsWriteError` (exit 4), the old file
untouched. The run folder's layout: docs/design.md, "The run folder"."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from patchbench.errors import RunFailed


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _clean_floats(obj: Any) -> Any:
    """Replace NaN/inf by None so the JSON stays standard (readers in other languages)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_floats(v) for v in obj]
    return obj


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once at import: os.umask can only be read by setting it


class ResultsWriteError(RunFailed, OSError):
    """A result file could not be written (exit 4; also an OSError with the replaced error's
    ``errno`` / ``strerror``): one line naming ``path``, the reason and what to do, e.g.
    ``cannot write RUN/base/rep1/cell.json: No space left on device (ENOSPC); ...``."""

    def __init__(self, path: str | os.PathLike, err: OSError, hint: str | None = None):
        code = errno.errorcode.get(err.errno or 0, "")
        why = (err.strerror or str(err) or type(err).__name__) + (f" ({code})" if code else "")
        hint = _HINTS.get(err.errno or 0, "") if hint is None else hint
        RunFailed.__init__(self, f"cannot write {path}: {why}" + (f"; {hint}" if hint else ""))
        self.path = Path(path)
        self.errno, self.strerror, self.filename = err.errno, err.strerror, str(path)

    def with_hint(self, hint: str) -> ResultsWriteError:
        """The same error with ``hint`` as its advice (the default is a ``bench`` run's)."""
        return ResultsWriteError(self.path, OSError(self.errno, self.strerror), hint)

    def __str__(self) -> str:  # OSError's str would print "[Errno N] ..." instead
        return str(self.args[0])


#: what to do about the usual reasons a result file cannot be written
_HINTS = {
    errno.ENOSPC: "free disk space (or write results elsewhere: --results DIR), then --resume",
    errno.EDQUOT: "the disk quota is full: free space or use --results DIR, then --resume",
    errno.EROFS: "the file system is read-only: use --results DIR on a writable one",
    errno.EACCES: "the folder is not writable by this user: fix its permissions or use --results DIR",
    errno.EPERM: "the folder is not writable by this user: fix its permissions or use --results DIR",
}


def make_dir(path: str | os.PathLike, *, exist_ok: bool = True) -> Path:
    """Create folder ``path`` and its parents; returns it. :class:`ResultsWriteError` when it
    cannot be created; FileExistsError when it exists and ``exist_ok`` is False."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=exist_ok)
    except OSError as e:
        if isinstance(e, FileExistsError) and not exist_ok and path.is_dir():
            raise
        raise ResultsWriteError(path, e) from None
    return path


def write_bytes(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (parents created); returns the path. Either the new
    file is whole or the old one untouched, no temporary file left; :class:`ResultsWriteError`
    when it cannot be written. ``durable`` False skips the fsync (files rebuilt from others,
    e.g. the dashboard's pages: still whole or absent, but maybe lost on a power cut)."""
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are for others to read
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError) and not isinstance(e, ResultsWriteError):
            raise ResultsWriteError(path, e) from None
        raise
    return path


#: what :func:`printable` removes: ANSI escape sequences (CSI ``ESC [ ... final``, OSC
#: ``ESC ] ... BEL/ST``, ``ESC x`` with its intermediate bytes), then any other C0 control but tab and newline, DEL
#: and the C1 controls (U+0080-U+009F, one of them is CSI on its own)
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -/]*[0-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]"
)


def printable(text: str) -> str:
    """``text`` without terminal control (:data:`_ESCAPES`; a carriage return goes too, so a line
    cannot overwrite itself); everything rendered passes here (docs/faults.md)."""
    return _ESCAPES.sub("", text)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 text atomically; see :func:`write_bytes`."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON atomically; NaN and infinities become ``null``; paths, pydantic
    models, numpy arrays and sets are converted; TypeError (file untouched) for anything else."""
    text = json.dumps(_clean_floats(obj), indent=indent, default=_json_default, sort_keys=False)
    return write_text(path, text + "\n")


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Write one JSON object per line, atomically."""
    text = "".join(json.dumps(_clean_floats(r), default=_json_default) + "\n" for r in rows)
    return write_text(path, text)


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file; raises FileNotFoundError / json.JSONDecodeError naming the path."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise json.JSONDecodeError(f"{path}: {e.msg}", e.doc, e.pos) from None


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Read a JSON-lines file (blank lines skipped)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    return rows


def cell_dir(run_dir: str | os.PathLike, variant: str, repeat: int) -> Path:
    """Folder of one (variant, repeat) cell: ``RUN/<variant>/rep<k>`` (k counts from 0)."""
    return Path(run_dir) / variant / f"rep{repeat}"


def suite_dir(run_dir: str | os.PathLike, variant: str, repeat: int, suite: str) -> Path:
    """Folder of one suite's output in one cell: ``RUN/<variant>/rep<k>/<suite>``."""
    return cell_dir(run_dir, variant, repeat) / suite
