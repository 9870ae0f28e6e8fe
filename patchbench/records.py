"""Atomic file writes and the run-folder layout.

Every file the harness writes goes through :func:`write_json` / :func:`write_text` /
:func:`write_bytes`: a temporary file in the same folder, fsync, then ``os.replace``, so a reader
(or a crash) never sees half a file. Layout of one run (docs/design.md, "The run folder")::

    results/<UTC timestamp>-<config name>/
      manifest.json
      <variant>/rep<k>/server.log
      <variant>/rep<k>/cell.json                 status of the cell (server start/stop, timings)
      <variant>/rep<k>/<suite>/summary.json      the suite's flat metrics (units in the names)
      <variant>/rep<k>/<suite>/...               the suite's per-item records
      compare.json  report.md  plots/*.png
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


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


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder + fsync + rename).

    Creates parent folders. Returns the path. Raises OSError if the folder is not writable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are for others to read
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write UTF-8 text atomically; see :func:`write_bytes`."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1) -> Path:
    """Write ``obj`` as JSON atomically. NaN and infinities become ``null``.

    Paths, pydantic models, numpy arrays and sets are converted; anything else that JSON cannot
    hold raises TypeError before the file is touched.
    """
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
