"""``matrix.json``: the record of a matrix run, read and written only through :class:`MatrixRecord`.

Matrix run folder::

    results/<UTC stamp>-<name>/
      matrix.json                 MatrixRecord: the units (id, labels, gpu type, status, exit
                                  code, message, node, timings), the matrix file, executor,
                                  start/end
      configs/<unit id>.yaml      each unit's validated config as JSON (what its bench ran)
      <unit id>/                  that unit's bench run folder (manifest.json, compare.json, ...)
      report.md  plots/matrix-effect.png   (patchbench.matrix.report)

The driver (:mod:`patchbench.matrix.driver`) rewrites matrix.json after every unit; the report
and the nightly job read it through :func:`read_matrix_record`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from patchbench.envs.nodes import EnvPlan
from patchbench.records import read_json, write_json

#: version of matrix.json's shape
MATRIX_SCHEMA = 1

Status = Literal[
    "pending", "ok", "failed", "error", "lost", "cancelled", "interrupted", "unschedulable"
]


class UnitRecord(BaseModel):
    """One unit of ``matrix.json``: ``id``; ``labels`` (what distinguishes it: {axis or "config":
    value}); ``gpu_type`` (None: any node); ``sglang`` (its pin); ``config`` (its merged config,
    relative to the matrix run folder); ``config_name``; ``status`` (pending until it ends: ok,
    failed (bench exit 4 with a run folder), error, lost, cancelled, interrupted, unschedulable);
    ``exit_code`` (bench's, None when it did not end by itself); ``message`` (bench's error line,
    or why the unit did not run); ``node``; ``timings_s`` ({step: seconds}: env (finding or
    setting up its python), bench, pack, task, and on Ray get, unpack, start_delay (submission to
    the task's start) = queued (waiting for a node that could take it: another unit held it) +
    dispatch (Ray's scheduling, worker start, sending the spec), return_delay, wall);
    ``archive_bytes`` (the run folder's gzip'd tar on Ray, 0 locally)."""

    model_config = ConfigDict(extra="allow")

    id: str
    labels: dict[str, Any] = Field(default_factory=dict)
    gpu_type: str | None = None
    sglang: str | None = None
    config: str | None = None
    config_name: str | None = None
    status: Status = "pending"
    exit_code: int | None = None
    message: str = ""
    node: str | None = None
    timings_s: dict[str, float] = Field(default_factory=dict)
    archive_bytes: int = 0


class MatrixRecord(BaseModel):
    """``matrix.json``: ``name`` (the matrix's), ``matrix`` (the matrix file), ``description``,
    ``executor`` ("local" or "ray") and its ``address``, ``axes`` (["config"] for a list of
    units), ``started_at``/``ended_at`` (UTC stamps ``YYYYMMDDTHHMMSSZ``; ended_at None while it
    runs), ``units`` (:class:`UnitRecord`, in matrix order), ``resumes`` (the stamp of each
    ``--resume``, only when resumed), ``interrupted`` (only when Ctrl-C / SIGTERM stopped
    it) and ``environments`` (where each pin's python came from on each node, announced before
    anything ran: :class:`patchbench.envs.nodes.EnvPlan`; only when known)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = MATRIX_SCHEMA
    name: str = ""
    matrix: str = ""
    description: str = ""
    executor: str = ""
    address: str | None = None
    axes: list[str] = Field(default_factory=list)
    started_at: str | None = None
    ended_at: str | None = None
    units: list[UnitRecord]
    resumes: list[str] | None = None
    interrupted: bool | None = None
    environments: list[EnvPlan] | None = None

    def unit(self, unit_id: str) -> UnitRecord | None:
        """The record of ``unit_id``, or None."""
        return next((u for u in self.units if u.id == unit_id), None)


def read_matrix_record(matrix_dir: str | os.PathLike) -> MatrixRecord:
    """``<matrix_dir>/matrix.json``. Raises OSError when it is missing or unreadable, ValueError
    (pydantic's ValidationError included) when it is not JSON or has no ``units`` list."""
    return MatrixRecord.model_validate(read_json(Path(matrix_dir) / "matrix.json"))


def write_matrix_record(matrix_dir: str | os.PathLike, record: MatrixRecord) -> Path:
    """Write ``<matrix_dir>/matrix.json`` atomically (``resumes``, ``interrupted`` and
    ``environments`` only when set); returns its path."""
    data = record.model_dump(mode="json")
    for key in ("resumes", "interrupted", "environments"):
        if data[key] is None:
            del data[key]
    return write_json(Path(matrix_dir) / "matrix.json", data)


def done_units(matrix_dir: str | os.PathLike) -> set[str]:
    """Ids of the units of a matrix run folder that ended ok and whose run folder is there (none
    when matrix.json cannot be read)."""
    d = Path(matrix_dir)
    try:
        rec = read_matrix_record(d)
    except (OSError, ValueError):
        return set()
    return {u.id for u in rec.units if u.status == "ok" and (d / u.id / "manifest.json").exists()}
