"""The typed run-folder model (patchbench/runfolder/): migration, refusal, unreadable files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchbench import records, runfolder
from patchbench.runfolder import CellRecord, SchemaTooNew, models

#: the smallest config a manifest holds (the typed Config: name, sglang, model, variants)
CONFIG = {"name": "r", "sglang": "0.5.1.post3", "model": {"path": "m", "tiny": True}}


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
                **CONFIG,
                "variants": {"a": [], "b": ["p"]},
                "schedule": {"repeats": 3},
                "suites": {"serving": {}},
            },
            "unknown_old_key": 5,
        },
    )
    m = runfolder.read_manifest(tmp_path)
    assert m.migrated_from == 1 and m.baseline == "a" and m.repeats == 3
    assert {v: s.short() for v, s in m.config.variants.items()} == {"a": [], "b": ["p"]}
    assert m.suites == ["serving"]
    # a key no version declares is dropped by the migration, never kept on the current model
    assert "unknown_old_key" not in runfolder._dump(m) and not hasattr(m, "unknown_old_key")


@pytest.mark.parametrize(
    "name,reader,current",
    [
        ("cell.json", runfolder.read_cell, runfolder.CELL_SCHEMA),
        ("summary.json", runfolder.read_summary, runfolder.SUMMARY_SCHEMA),
        ("manifest.json", runfolder.read_manifest, runfolder.MANIFEST_SCHEMA),
    ],
)
def test_future_schema_refused_naming_file_and_versions(tmp_path, name, reader, current):
    records.write_json(tmp_path / name, {"schema_version": 99, "variant": "v"})
    with pytest.raises(SchemaTooNew) as e:
        reader(tmp_path / name)
    msg = str(e.value)
    assert str(tmp_path / name) in msg and "99" in msg and f"version {current}" in msg
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


# ------------------------------------------------------------------ every key declared
GOLDEN = Path(__file__).parent.parent / "data" / "golden"


def _configs() -> list[Path]:
    """configs/*.yaml but the matrix files (patchbench.matrix: each unit is a config)."""
    from patchbench.matrix.spec import is_matrix_file

    paths = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
    return [p for p in paths if not is_matrix_file(p)]


@pytest.mark.parametrize("config", _configs(), ids=lambda p: p.name)
def test_the_manifest_stores_the_typed_config_key_for_key(config, tmp_path):
    """A manifest written with a Config holds Config.model_dump(mode="json") key for key, in
    order, value for value, and reads back into an equal Config."""
    from patchbench.config import load_config

    cfg = load_config(config)
    runfolder.write_manifest(tmp_path, models.RunManifest(run_id="r", config=cfg))
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert json.dumps(raw["config"]) == json.dumps(cfg.model_dump(mode="json"))
    back = runfolder.read_manifest(tmp_path).config
    assert back.model_dump(mode="json") == cfg.model_dump(mode="json")
    assert back.variants == cfg.variants and back.compare == cfg.compare


@pytest.mark.parametrize("case", ["demo-cpu", "sequential"])
def test_a_manifest_the_run_wrote_reads_and_writes_back_key_for_key(case, tmp_path):
    """A schema-2 manifest (golden folders, written by the run before every key was declared)
    reads into the typed model and writes back with the same keys in the same order and the
    same values (a float field holds a whole number as 0.0 where the run wrote 0); only the
    version changes, and the config and the host gain the keys added since (with their
    defaults)."""
    raw = json.loads((GOLDEN / case / "run" / "manifest.json").read_text())
    m = runfolder.read_manifest(GOLDEN / case / "run")
    assert m.migrated_from == 2
    m.migrated_from = None
    runfolder.write_manifest(tmp_path, m)
    back = json.loads((tmp_path / "manifest.json").read_text())
    back.pop("migrated_from")
    assert back.pop("schema_version") == runfolder.MANIFEST_SCHEMA == 7
    assert "machine" not in back  # unknown in these runs (manifest 6): not written
    raw.pop("schema_version")
    # a key added to the host since (manifest 5): unknown in these runs
    assert back["host"].pop("cpu_usable") is None
    cfg, raw_cfg = back.pop("config"), raw.pop("config")
    assert back == raw and _key_order(back) == _key_order(raw)
    # keys added to the config since these runs, with their defaults
    assert cfg["server"].pop("stall_timeout_s") == 60.0
    assert cfg["server"].pop("secret_env") == []  # added later, like stall_timeout_s
    assert cfg["server"].pop("log_max_mb") == 64  # and log_max_mb
    assert cfg["server"].pop("metrics") is True  # and metrics
    assert cfg["schedule"].pop("unbalanced_reason") is None
    assert cfg["compare"].pop("assumed_cv") == {}
    # a key removed since that nothing ever read: dropped on read, without a note (no result
    # depended on it)
    assert raw_cfg["compare"].pop("retokenized_change_share") == 0.01
    assert "compare" not in m.config_notes
    assert list(cfg) == list(raw_cfg)
    assert {k: v for k, v in cfg.items() if k != "nightly"} == {
        k: v for k, v in raw_cfg.items() if k != "nightly"
    }


def _key_order(x):
    """The keys of every object in ``x``, in order, by path."""
    if isinstance(x, dict):
        return [list(x)] + [_key_order(v) for v in x.values()]
    if isinstance(x, list):
        return [_key_order(v) for v in x]
    return None


def test_undeclared_keys_are_refused_in_the_current_schema_and_dropped_from_older(tmp_path):
    cfg = {**CONFIG, "variants": {"a": []}}
    base = {"run_id": "r", "config": cfg, "cells": [{"variant": "a"}]}
    current = {**base, "schema_version": runfolder.MANIFEST_SCHEMA, "surprise": 1}
    records.write_json(tmp_path / "manifest.json", current)
    with pytest.raises(runfolder.RunFolderError, match="manifest.json: key surprise: Extra"):
        runfolder.read_manifest(tmp_path)
    old = {**base, "schema_version": 2, "surprise": 1}
    old["cells"] = [{"variant": "a", "dir": "a/rep0", "old_cell_key": True}]
    old["config"] = {**cfg, "server": {"args": [], "mrope_probe": True, "colour": "red"}}
    records.write_json(tmp_path / "manifest.json", old)
    m = runfolder.read_manifest(tmp_path)
    assert m.migrated_from == 2 and m.cells[0].dir == "a/rep0"
    dumped = runfolder._dump(m)
    assert "surprise" not in dumped and "old_cell_key" not in dumped["cells"][0]
    assert dumped["config"]["variants"] == {"a": []} and dumped["config"]["server"]["args"] == []
    assert not {"mrope_probe", "colour"} & set(dumped["config"]["server"])


def test_settings_an_older_version_wrote_are_dropped_with_a_note(tmp_path):
    """The stored config's compare / nightly keys that no longer exist are dropped, invalid
    settings become the defaults; each leaves a note (the report lists the compare ones)."""
    cfg = {**CONFIG, "variants": {"a": []}}
    cfg["compare"] = {"confidence": 0.9, "noise_floor_from": "ci_bound"}
    cfg["nightly"] = {"window_nights": -3}
    records.write_json(tmp_path / "manifest.json", {"run_id": "r", "config": cfg})
    m = runfolder.read_manifest(tmp_path)
    assert m.config.compare.confidence == 0.9 and m.config.nightly.window_nights == 7
    assert m.config_notes["compare"] == [
        "compare settings noise_floor_from are no longer used and were ignored"
    ]
    (note,) = m.config_notes["nightly"]
    assert note.startswith("nightly settings of the manifest are invalid (") and "defaults" in note
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        CellRecord(surprise=1)
    with pytest.raises(ValueError, match="no field|Object has no attribute"):
        CellRecord().surprise = 1


def test_optional_keys_are_written_only_once_set():
    """An entry of a skipped cell has ``skipped`` and no ``error``; one the run ran has
    ``error`` (null when none) and no ``skipped``; a cell without a server start has no
    liveness, gpu or server pid details."""
    ran = models.ManifestCell(variant="a", error=None).model_dump(mode="json")
    skipped = models.ManifestCell(variant="a", skipped=True).model_dump(mode="json")
    assert "error" in ran and ran["error"] is None and "skipped" not in ran
    assert skipped["skipped"] is True and "error" not in skipped
    cell = runfolder._dump(CellRecord(variant="a"))
    assert not {"liveness", "gpu", "runner_pid", "migrated_from"} & set(cell)
    assert cell["server"] == {"pid": None, "pgid": None, "events": [], "command": None}


def test_a_compare_json_with_an_undeclared_key_is_a_run_folder_error(tmp_path):
    from patchbench.analysis.comparison import Comparison, read_comparison

    d = Comparison(run_id="r").model_dump(mode="json")
    records.write_json(tmp_path / "compare.json", {**d, "surprise": 1})
    with pytest.raises(runfolder.RunFolderError, match="compare.json: key surprise"):
        read_comparison(tmp_path)


def test_resume_without_a_config_rebuilds_it_from_the_manifest(tmp_path, capsys):
    """``bench --resume RUN`` without CONFIG: the config comes from the run's manifest,
    validated as a config file is (no source: its resume command names no file); the resumed
    folder then fits it. Neither CONFIG nor --resume is a usage error (exit 2)."""
    from patchbench import cli
    from patchbench.config import load_config
    from patchbench.run.preflight import config_of_run, resume_manifest

    cfg = load_config(Path(__file__).parents[2] / "configs" / "demo-cpu.yaml")
    runfolder.write_manifest(tmp_path, models.RunManifest(run_id="r", config=cfg))
    again = config_of_run(tmp_path)
    assert again.source is None and again.model_dump(mode="json") == cfg.model_dump(mode="json")
    assert again.suite_params == cfg.suite_params and again.suite_rounds == cfg.suite_rounds
    assert resume_manifest(again, tmp_path).config.model_dump() == cfg.model_dump()
    assert cli.main(["bench", "--resume", str(tmp_path), "--dry-run"]) == 0
    assert "mrope-sync-free" in capsys.readouterr().out
    assert cli.main(["bench"]) == 2
    assert "give a CONFIG, or --resume RUN_DIR" in capsys.readouterr().err
    runfolder.write_manifest(tmp_path, models.RunManifest(run_id="r"))
    with pytest.raises(runfolder.ConfigError, match="its manifest holds no config"):
        config_of_run(tmp_path)


def test_the_host_facts_added_later_read_as_unknown_in_older_files_and_round_trip(tmp_path):
    """cell.json 4 adds ``load_avg_1m``, manifest.json 5 ``host.cpu_usable``: a version-3 cell
    and a version-4 manifest read without them; a current cell writes them and reads back."""
    records.write_json(
        tmp_path / "cell.json", {"schema_version": 3, "variant": "a", "repeat": 0, "server": {}}
    )
    old = runfolder.read_cell(tmp_path)
    assert old.migrated_from == 3 and old.load_avg_1m is None
    old.load_avg_1m = models.LoadAverage(start=1.5, end=6.25)
    runfolder.write_cell(tmp_path, old)
    raw = json.loads((tmp_path / "cell.json").read_text())
    assert raw["load_avg_1m"] == {"start": 1.5, "end": 6.25}
    assert runfolder.read_cell(tmp_path).load_avg_1m == models.LoadAverage(start=1.5, end=6.25)
    records.write_json(
        tmp_path / "manifest.json",
        {
            "schema_version": 4,
            "run_id": "r",
            "config": {**CONFIG, "variants": {"a": []}},
            "host": {"cpu_count": 8},
        },
    )
    m = runfolder.read_manifest(tmp_path)
    assert m.migrated_from == 4 and (m.host.cpu_count, m.host.cpu_usable) == (8, None)


def test_the_gpu_identity_added_later_reads_as_unknown_in_older_files(tmp_path):
    """cell.json 5 adds ``gpu.driver`` and ``gpu.devices``, manifest.json 7 ``machine.driver``:
    a version-4 cell and a version-6 manifest read with them unknown."""
    gpu = {"samples_count": 2, "gpus": [], "flags": [], "notes": []}
    records.write_json(
        tmp_path / "cell.json",
        {"schema_version": 4, "variant": "a", "repeat": 0, "server": {}, "gpu": gpu},
    )
    old = runfolder.read_cell(tmp_path)
    assert old.migrated_from == 4 and (old.gpu.driver, old.gpu.devices) == (None, [])
    machine = {"model": "NVIDIA H200", "gpu_uuids": ["GPU-aaaa-1"], "hostname": None}
    records.write_json(
        tmp_path / "manifest.json",
        {"schema_version": 6, "run_id": "r", "config": {**CONFIG, "variants": {"a": []}}}
        | {"machine": machine},
    )
    m = runfolder.read_manifest(tmp_path)
    assert m.migrated_from == 6 and m.machine.driver is None
    assert m.machine.key == "NVIDIA H200 [GPU-aaaa-1]"
