"""The typed run-folder model (patchbench/runfolder.py): migration, refusal, unreadable files."""

from __future__ import annotations

import json

import pytest

from patchbench import records, runfolder
from patchbench.runfolder import CellRecord, SchemaTooNew


def test_round_trip_cell_and_summary(tmp_path):
    rec = CellRecord(
        variant="v",
        repeat=1,
        index=3,
        status="ok",
        suites={"serving": "ok"},
        timings_s={"cell": 1.5},
        cell_kind="correctness",
        instrumented=True,
        instrumentation={"sync_probe": {"calls": 2}},
    )
    runfolder.write_cell(tmp_path, rec)
    raw = json.loads((tmp_path / "cell.json").read_text())
    assert raw["schema_version"] == runfolder.CELL_SCHEMA
    back = runfolder.read_cell(tmp_path)
    assert back == rec
    runfolder.write_summary(
        tmp_path / "serving",
        {
            "suite": "serving",
            "status": "ok",
            "metrics": {"x_ms": 1.0},
            "errors": [],
            "warnings": [],
            "meta": {"k": 1},
        },
    )
    s = runfolder.read_summary(tmp_path / "serving")
    assert s.metrics == {"x_ms": 1.0} and s.meta == {"k": 1} and s.status == "ok"


def test_old_cell_is_migrated(tmp_path):
    records.write_json(
        tmp_path / "cell.json",
        {
            "variant": "b",
            "repeat": 0,
            "status": "ok",
            "error": None,
            "timings_s": {},
            "server": {},
            "mrope_probe": {"host_reads": 4},
        },
    )
    rec = runfolder.read_cell(tmp_path)
    assert rec.migrated_from == 1 and rec.schema_version == runfolder.CELL_SCHEMA
    assert rec.instrumented is True and rec.instrumentation == {"sync_probe": {"host_reads": 4}}


def test_old_manifest_schema_key_is_migrated(tmp_path):
    records.write_json(
        tmp_path / "manifest.json",
        {
            "schema": 1,
            "run_id": "r",
            "config": {
                "variants": {"a": [], "b": ["p"]},
                "schedule": {"repeats": 3},
                "suites": {"serving": {}},
            },
            "unknown_old_key": 5,
        },
    )
    m = runfolder.read_manifest(tmp_path)
    assert m.migrated_from == 1 and m.baseline == "a" and m.repeats == 3
    assert m.variants == {"a": [], "b": ["p"]} and m.suites == ["serving"]
    assert m.model_extra["unknown_old_key"] == 5


@pytest.mark.parametrize(
    "name,reader",
    [
        ("cell.json", runfolder.read_cell),
        ("summary.json", runfolder.read_summary),
        ("manifest.json", runfolder.read_manifest),
    ],
)
def test_future_schema_refused_naming_file_and_versions(tmp_path, name, reader):
    records.write_json(tmp_path / name, {"schema_version": 99, "variant": "v"})
    with pytest.raises(SchemaTooNew) as e:
        reader(tmp_path / name)
    msg = str(e.value)
    assert str(tmp_path / name) in msg and "99" in msg and "version 2" in msg
    assert e.value.exit_code == 2


def test_unreadable_cell_and_summary_are_records_not_tracebacks(tmp_path):
    (tmp_path / "cell.json").write_text("{not json")
    rec = runfolder.read_cell(tmp_path, variant="v", repeat=2)
    assert rec.status == "unreadable" and rec.variant == "v" and rec.repeat == 2
    assert str(tmp_path / "cell.json") in rec.notes[0]
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "summary.json").write_text(
        json.dumps({"status": "ok", "metrics": {"x_ms": "fast"}})
    )
    s = runfolder.read_summary(tmp_path / "s")
    assert s.status == "unreadable" and s.suite == "s" and "metrics.x_ms" in s.notes[0]
    assert runfolder.read_cell(tmp_path / "nothing") is None


def test_unreadable_manifest_raises_config_error(tmp_path):
    (tmp_path / "manifest.json").write_text("[1, 2]")
    with pytest.raises(runfolder.RunFolderError, match="manifest.json: expected a JSON object"):
        runfolder.read_manifest(tmp_path)
    with pytest.raises(runfolder.RunFolderError, match="missing: no such folder"):
        runfolder.read_manifest(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(runfolder.RunFolderError, match="no manifest.json"):
        runfolder.read_manifest(tmp_path / "empty")
