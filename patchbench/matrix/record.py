"""``matrix.json``, the record of a matrix run folder (docs/scale-out.md), read and written only
here; the driver rewrites it after every unit."""

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
    """One unit of ``matrix.json``: ``labels`` ({axis or "config": value}); ``gpu_type`` (None:
    any node); ``config``: its config relative to the folder; ``status`` (failed: bench exit 4
    with a run folder); ``exit_code`` (None: bench did not end by itself); ``message``: bench's
    error line or why the unit did not run; ``timings_s`` ({step: seconds}: env, bench, pack,
    task; on Ray also get, unpack, start_delay = queued + dispatch, return_delay, wall);
    ``archive_bytes`` (the run folder's tar on Ray, 0 locally)."""

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
    """``matrix.json``: ``axes`` (["config"] for a list of units), UTC stamps (ended_at None
    while it runs), ``units`` in matrix order; written only when set: ``resumes`` (each
    ``--resume``'s stamp), ``interrupted``, ``environments`` (where each pin's python came from
    on each node)."""

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
    """``<matrix_dir>/matrix.json``; OSError when unreadable, ValueError when mis-shaped."""
    return MatrixRecord.model_validate(read_json(Path(matrix_dir) / "matrix.json"))


def write_matrix_record(matrix_dir: str | os.PathLike, record: MatrixRecord) -> Path:
    """Write ``<matrix_dir>/matrix.json`` atomically; returns its path."""
    data = record.model_dump(mode="json")
    for key in ("resumes", "interrupted", "environments"):
        if data[key] is None:
            del data[key]
    return write_json(Path(matrix_dir) / "matrix.json", data)


def done_units(matrix_dir: str | os.PathLike) -> set[str]:
    """Ids of the units that ended ok and whose run folder is there (none without matrix.json)."""
    d = Path(matrix_dir)
    try:
        rec = read_matrix_record(d)
    except (OSError, ValueError):
        return set()
    return {u.id for u in rec.units if u.status == "ok" and (d / u.id / "manifest.json").exists()}
