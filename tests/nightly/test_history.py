"""The nightly history (patchbench/nightly/history.py): schema, one-transaction appends, locks, corruption.

Run folders are synthetic (tests.synthetic); nothing starts a server.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from patchbench import records
from patchbench.analysis.comparison import Comparison, Row, read_comparison, write_comparison
from patchbench.nightly.history import (
    SCHEMA_VERSION,
    History,
    HistoryCorrupt,
    HistoryError,
    HistoryLocked,
    HistorySchemaError,
    Night,
    SameRunEffect,
    night_from_run,
)
from patchbench.runfolder import read_manifest, write_manifest
from patchbench.runfolder.models import MachineInfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.synthetic import make_run

TPUT = "output_throughput_tok_s"


def _run(tmp_path: Path, run_id: str = "20260101T000000Z-nightly-test", **kw) -> Path:
    kw.setdefault(
        "metrics",
        {
            "serving": {
                TPUT: {"baseline": [100.0, 104.0, 98.0], "patched": [90.0, 92.0, 91.0]},
                "ttft_median_ms": {"baseline": [10.0, 12.0, 11.0], "patched": [10.0, 10.0, 13.0]},
            }
        },
    )
    run = make_run(tmp_path, run_id=run_id, name="nightly-test", **kw)
    write_comparison(
        run,
        Comparison(
            run_id=run_id,
            baseline="baseline",
            variants=["baseline", "patched"],
            rows=[
                Row(
                    suite="serving",
                    metric=TPUT,
                    unit="tok/s",
                    better="higher",
                    variant="patched",
                    baseline_value=100.0,
                    variant_value=91.0,
                    baseline_repeats=[100.0, 104.0, 98.0],
                    variant_repeats=[90.0, 92.0, 91.0],
                    change=-9.0,
                    low=-12.0,
                    high=-6.0,
                    change_unit="%",
                    method="t on log ratio (n=3)",
                    verdict="regressed",
                )
            ],
        ),
    )
    return run


def test_new_file_gets_versioned_schema(tmp_path):
    path = tmp_path / "sub" / "history.sqlite"
    with History(path) as h:
        assert h.schema_version == SCHEMA_VERSION == 4
        assert h.count_nights() == 0
    con = sqlite3.connect(path)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"meta", "nights", "metric_values", "repeat_values", "comparisons"} <= tables
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == ("4",)
    con.close()


def test_night_from_run_reads_summaries_compare_and_manifest(tmp_path):
    night = night_from_run(_run(tmp_path))
    assert night.run_id == "20260101T000000Z-nightly-test"
    assert night.config_name == "nightly-test"
    assert night.night_utc == "2026-01-01T00:00:00Z"  # manifest started_at
    assert night.git_sha == "deadbeef" * 5
    assert night.baseline == "baseline"
    assert night.status == "ok" and night.problems == []
    assert night.values[("baseline", "serving", TPUT)] == [100.0, 104.0, 98.0]
    assert night.median(("baseline", "serving", TPUT)) == 100.0  # median of 98, 100, 104
    assert night.median(("patched", "serving", "ttft_median_ms")) == 10.0
    c = night.comparisons[("patched", "serving", TPUT)]
    assert (c.change_pct, c.ci_low_pct, c.ci_high_pct) == (-9.0, -12.0, -6.0)
    assert (c.ci_method, c.verdict, c.baseline) == ("t on log ratio (n=3)", "regressed", "baseline")
    assert night.units[("serving", TPUT)] == "tok/s"
    assert night.better[("serving", TPUT)] == "higher"
    assert night.variants == ["baseline", "patched"]


def test_failed_cell_is_left_out_and_makes_night_partial(tmp_path):
    run = _run(tmp_path, cell_status={("patched", 1): "failed"})
    night = night_from_run(run)
    assert night.status == "partial"
    assert any("patched/rep1" in p for p in night.problems)
    # rep1 (92) left out; the list stays indexed by repeat so variants pair by index
    assert night.values[("patched", "serving", TPUT)] == [90.0, None, 91.0]
    assert night.values[("baseline", "serving", TPUT)] == [100.0, 104.0, 98.0]
    assert night.median(("patched", "serving", TPUT)) == 90.5


def test_record_and_read_back_round_trip(tmp_path):
    night = night_from_run(_run(tmp_path))
    with History(tmp_path / "h.sqlite") as h:
        assert h.record(night) is True
        assert h.record(night) is False  # same run_id: nothing changes
        assert h.count_nights("nightly-test") == 1
        [back] = h.nights("nightly-test")
    assert back.run_id == night.run_id and back.night_utc == night.night_utc
    assert back.values == night.values
    assert back.comparisons == night.comparisons
    assert back.median(("baseline", "serving", TPUT)) == 100.0
    con = sqlite3.connect(tmp_path / "h.sqlite")
    assert con.execute(
        "SELECT median, n_repeats FROM metric_values WHERE variant='patched' AND metric=?", (TPUT,)
    ).fetchone() == (91.0, 3)
    assert con.execute("SELECT COUNT(*) FROM repeat_values").fetchone() == (12,)  # 2 x 2 x 3
    con.close()


def _night(run_id: str, utc: str, config: str = "c", value: float = 1.0) -> Night:
    return Night(
        run_id=run_id,
        night_utc=utc,
        config_name=config,
        baseline="b",
        values={("b", "s", "x_ms"): [value]},
    )


def test_nights_order_filters_and_limit(tmp_path):
    with History(tmp_path / "h.sqlite") as h:
        for day in [3, 1, 2, 4]:
            h.record(_night(f"r{day}", f"2026-01-0{day}T00:00:00Z", value=float(day)))
        h.record(_night("other", "2026-01-02T00:00:00Z", config="d"))
        assert [n.run_id for n in h.nights("c")] == ["r1", "r2", "r3", "r4"]
        assert [n.run_id for n in h.nights("c", before_utc="2026-01-04T00:00:00Z")] == [
            "r1",
            "r2",
            "r3",
        ]
        assert [n.run_id for n in h.nights("c", exclude_run_id="r2", limit=2)] == ["r3", "r4"]
        assert h.count_nights() == 5


def test_a_failing_append_leaves_nothing(tmp_path):
    bad = _night("r1", "2026-01-01T00:00:00Z")
    bad.comparisons[("v", "s", "x_ms")] = SameRunEffect("b", object(), None, None)  # cannot bind
    with History(tmp_path / "h.sqlite") as h:
        with pytest.raises(HistoryError, match="h.sqlite"):
            h.record(bad)
        assert h.count_nights() == 0
        con = sqlite3.connect(tmp_path / "h.sqlite")
        assert con.execute("SELECT COUNT(*) FROM metric_values").fetchone() == (0,)
        con.close()
        assert h.record(_night("r1", "2026-01-01T00:00:00Z")) is True  # usable afterwards


def test_locked_database_names_path_and_loses_nothing(tmp_path):
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        h.record(_night("r1", "2026-01-01T00:00:00Z"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(HistoryLocked) as e:
            History(path, timeout_s=0.2)
        assert str(path) in str(e.value) and "locked" in str(e.value)
        assert e.value.path == path
    finally:
        holder.execute("ROLLBACK")
    # opened first, then locked by someone else while appending
    h = History(path, timeout_s=0.2)
    holder.execute("BEGIN EXCLUSIVE")
    with pytest.raises(HistoryLocked, match=str(path)):
        h.record(_night("r2", "2026-01-02T00:00:00Z"))
    holder.execute("ROLLBACK")
    holder.close()
    assert h.record(_night("r2", "2026-01-02T00:00:00Z")) is True  # the retry appends it
    assert [n.run_id for n in h.nights("c")] == ["r1", "r2"]
    h.close()


def test_corrupted_file_is_reported_and_left_untouched(tmp_path):
    path = tmp_path / "h.sqlite"
    junk = b"this is not an sqlite database\n" * 200
    path.write_bytes(junk)
    with pytest.raises(HistoryCorrupt) as e:
        History(path)
    assert str(path) in str(e.value) and "backup" in str(e.value)
    assert path.read_bytes() == junk


def test_truncated_database_is_corrupt(tmp_path):
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        for i in range(1, 9):
            h.record(_night(f"r{i}", f"2026-01-0{i}T00:00:00Z"))
    data = path.read_bytes()
    path.write_bytes(data[:100] + b"\xff" * 200 + data[300:])  # scribble over the header page
    before = path.read_bytes()
    with pytest.raises(HistoryCorrupt, match=str(path)):
        with History(path) as h:
            h.nights("c")
    assert path.read_bytes() == before


def test_schema_version_from_the_future_is_refused(tmp_path):
    path = tmp_path / "h.sqlite"
    History(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(HistorySchemaError, match=r"schema version 99.*reads version 4.*newer"):
        History(path)


def test_foreign_sqlite_file_is_refused(tmp_path):
    path = tmp_path / "h.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    with pytest.raises(HistorySchemaError, match="not a patchbench history"):
        History(path)


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(HistoryError, match="is a folder"):
        History(tmp_path)


def test_backup_copies_everything(tmp_path):
    with History(tmp_path / "h.sqlite") as h:
        h.record(_night("r1", "2026-01-01T00:00:00Z", value=7.0))
        h.backup(tmp_path / "bak" / "h.sqlite")
    with History(tmp_path / "bak" / "h.sqlite") as b:
        [n] = b.nights("c")
        assert n.values[("b", "s", "x_ms")] == [7.0]


def test_failed_repeat_round_trips_as_none(tmp_path):
    night = night_from_run(_run(tmp_path, cell_status={("patched", 1): "failed"}))
    with History(tmp_path / "h.sqlite") as h:
        h.record(night)
        [back] = h.nights("nightly-test")
    assert back.values[("patched", "serving", TPUT)] == [90.0, None, 91.0]
    con = sqlite3.connect(tmp_path / "h.sqlite")
    assert con.execute(
        "SELECT n_repeats FROM metric_values WHERE variant='patched' AND metric=?", (TPUT,)
    ).fetchone() == (2,)
    con.close()


def test_version_1_file_is_migrated_on_open(tmp_path):
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        h.record(_night("r1", "2026-01-01T00:00:00Z", value=3.0))
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='1' WHERE key='schema_version'")
    con.commit()
    con.close()
    with History(path) as h:
        assert h.schema_version == 4
        [n] = h.nights("c")
        assert n.values[("b", "s", "x_ms")] == [3.0]
    con = sqlite3.connect(path)
    keys = {k for (k,) in con.execute("SELECT key FROM meta")}
    con.close()
    assert "migrated_from_1_utc" in keys


def test_night_time_comes_from_the_typed_manifest(tmp_path):
    run = _run(tmp_path, run_id="20260105T000000Z-nightly-test")
    m = records.read_json(run / "manifest.json")
    m["started_at"] = "2026-01-05T04:30:00+01:00"  # any offset, stored as UTC
    records.write_json(run / "manifest.json", m)
    assert night_from_run(run).night_utc == "2026-01-05T03:30:00Z"
    # a guessed spelling is not read: without started_at the folder's stamp is the time
    del m["started_at"]
    m["start_time"] = "2030-01-01T00:00:00Z"
    records.write_json(run / "manifest.json", m)
    assert night_from_run(run).night_utc == "2026-01-05T00:00:00Z"
    m["started_at"] = "yesterday"
    records.write_json(run / "manifest.json", m)
    with pytest.raises(ValueError, match="started_at.*yesterday"):
        night_from_run(run)


def test_older_manifest_schema_is_migrated_and_newer_refused(tmp_path):
    from patchbench.runfolder import SchemaTooNew

    run = _run(tmp_path)
    m = records.read_json(run / "manifest.json")
    m["schema"] = 1  # version-1 spelling of the version
    records.write_json(run / "manifest.json", m)
    assert night_from_run(run).night_utc == "2026-01-01T00:00:00Z"
    m.pop("schema")
    m["schema_version"] = 99
    records.write_json(run / "manifest.json", m)
    with pytest.raises(SchemaTooNew, match="manifest.json"):
        night_from_run(run)


def test_instrumented_correctness_cells_feed_no_values(tmp_path):
    run = _run(tmp_path)
    c = records.read_json(run / "patched/rep1/cell.json")
    c["cell_kind"] = "correctness"
    records.write_json(run / "patched/rep1/cell.json", c)
    assert night_from_run(run).values[("patched", "serving", TPUT)] == [90.0, None, 91.0]


def test_effects_in_points_keep_their_verdict_but_no_percent(tmp_path):
    """A row whose change is not in % (accuracy points) records its method and verdict; its
    numbers would not be percent, so change_pct and the interval stay empty."""
    run = _run(tmp_path)
    cmp = read_comparison(run)
    cmp.rows[0].change_unit = "pt"
    write_comparison(run, cmp)
    c = night_from_run(run).comparisons[("patched", "serving", TPUT)]
    assert (c.change_pct, c.ci_low_pct, c.ci_high_pct, c.verdict) == (None, None, None, "regressed")


def test_compare_json_of_the_old_untyped_schema_is_refused_naming_the_file(tmp_path):
    run = _run(tmp_path)
    records.write_json(run / "compare.json", {"schema": 1, "metrics": []})
    with pytest.raises(ValueError, match=r"compare\.json: schema version 1"):
        night_from_run(run)


def test_the_machine_goes_from_the_manifest_to_the_history_and_a_version_3_file_migrates(
    tmp_path,
):
    """A manifest's machine (schema 6) is the night's; an older manifest's night has none
    (unknown). A version-3 history gains nights.machine, its nights unknown (NULL)."""
    run = _run(tmp_path)
    assert night_from_run(run).machine is None  # make_run writes no machine: unknown
    m = read_manifest(run)
    m.machine = MachineInfo(model="NVIDIA H200", gpu_uuids=["GPU-a1", "GPU-b2"], driver="550.1")
    write_manifest(run, m)
    assert records.read_json(run / "manifest.json")["schema_version"] == 7
    tonight = night_from_run(run)
    assert tonight.machine == "NVIDIA H200 [GPU-a1, GPU-b2]"  # the driver is not the machine
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        h.record(_night("r1", "2026-01-01T00:00:00Z"))
    con = sqlite3.connect(path)
    con.executescript(
        "ALTER TABLE nights DROP COLUMN machine; UPDATE meta SET value = '3' WHERE key = "
        "'schema_version';"
    )
    con.close()
    with History(path) as h:
        assert h.schema_version == 4
        h.record(tonight)
        old, new = h.nights("c") + h.nights("nightly-test")
    assert (old.machine, new.machine) == (None, "NVIDIA H200 [GPU-a1, GPU-b2]")
