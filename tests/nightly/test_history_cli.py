"""``patchbench history`` (patchbench/nightly/commands.py): the nights, a metric's series and a night's
gates, as a table and as JSON; bad input is a usage error (exit 2), never a traceback.

The history is written directly (patchbench.nightly.history.Night, no run folders but each night's
``nightly.json``); nothing starts a server.
"""

from __future__ import annotations

import json

import pytest

from patchbench import records
from patchbench.cli import main
from patchbench.nightly.history import History, Night

TPUT = "output_throughput_tok_s"
KEY_B, KEY_P = ("baseline", "serving", TPUT), ("patched", "serving", TPUT)


@pytest.fixture
def hist(tmp_path):
    """Config ``c``: 3 nights (the last red, its run folder with nightly.json; the first one's
    folder gone); config ``d``: 1 night."""
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        for day in (1, 2, 3):
            run_id = f"2026010{day}T030000Z-c"
            run = tmp_path / "runs" / run_id
            if day > 1:
                red = day == 3
                gate = {
                    "gate": f"serving.{TPUT}",
                    "kind": "same_run",
                    "variant": "patched",
                    "suite": "serving",
                    "metric": TPUT,
                    "status": "fail" if red else "pass",
                    "reason": "slower than stock" if red else "ok",
                    "unit": "tok/s",
                    "value": 90.0 if red else 100.0,
                    "reference": 100.0,
                    "change_pct": -10.0 if red else 0.0,
                    "bound_pct": -8.0 if red else 1.0,
                    "p_value": 0.001 if red else 0.5,
                    "level": 0.025,
                }
                records.write_json(
                    run / "nightly.json",
                    {
                        "outcome": "red" if red else "green",
                        "exit_code": 1 if red else 0,
                        "headline": "REGRESSION" if red else "no regression",
                        "failing": [gate] if red else [],
                        "gates": [gate],
                    },
                )
            h.record(
                Night(
                    run_id=run_id,
                    night_utc=f"2026-01-0{day}T03:00:00Z",
                    config_name="c",
                    baseline="baseline",
                    sglang_version="0.5.23",
                    run_dir=str(run),
                    machine="NVIDIA H200 [GPU-a1]" if day == 3 else None,
                    values={KEY_B: [100.0, 102.0, 98.0], KEY_P: [100.0, 101.0, None]},
                    units={("serving", TPUT): "tok/s"},
                )
            )
        h.record(
            Night(
                run_id="20260101T040000Z-d",
                night_utc="2026-01-01T04:00:00Z",
                config_name="d",
                baseline="baseline",
                values={KEY_B: [5.0]},
            )
        )
    return path


def test_lists_nights_with_outcome_release_and_gone_folders(hist, capsys):
    assert main(["history", str(hist)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "night",
        "(UTC)",
        "config",
        "sglang",
        "machine",
        "status",
        "outcome",
        "run",
        "folder",
    ]
    assert len(out) == 2 + 4
    assert "NVIDIA H200 [GPU-a1]" in out[5] and "unknown" in out[4]
    assert "(gone)" in out[2] and "20260101T030000Z-c" in out[2]
    assert "red (1)" in out[5] and "0.5.23" in out[5] and " d " in out[3]
    assert main(["history", str(hist), "--config", "c", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [n["outcome"] for n in doc["nights"]] == [None, "green", "red"]
    assert [n["machine"] for n in doc["nights"]] == [None, None, "NVIDIA H200 [GPU-a1]"]
    assert doc["nights"][2]["failing"][0]["change_pct"] == -10.0


def test_metric_series_median_spread_n(hist, capsys):
    args = ["history", str(hist), "--config", "c", "--metric", f"serving.{TPUT}"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc["series"]) == ["baseline", "patched"]
    b = doc["series"]["baseline"][0]
    assert (b["median"], b["min"], b["max"], b["n"]) == (100.0, 98.0, 102.0, 3)
    assert b["spread_pct"] == pytest.approx(4.0)
    assert doc["series"]["patched"][0]["n"] == 2  # a missing repeat is not counted
    assert main([*args, "--variant", "patched"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith(f"c: serving.{TPUT} [patched]") and "100.5" in out and "baseline" not in out
    )


def test_night_gates_from_nightly_json(hist, capsys):
    assert main(["history", str(hist), "--night", "20260103T030000Z-c"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "20260103T030000Z-c (c, sglang 0.5.23, machine NVIDIA H200 [GPU-a1]): REGRESSION (exit 1)"
    )
    row = out.splitlines()[3].split()
    assert row[:8] == [
        f"serving.{TPUT}",
        "same_run",
        "patched",
        "fail",
        "-10.00",
        "%",
        "-8.00",
        "%",
    ]
    assert main(["history", str(hist), "--night", "20260103T030000Z-c", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outcome"] == "red" and doc["gates"][0]["p_value"] == 0.001


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metric", f"serving.{TPUT}"], "several configs, name one with --config: c, d"),
        (["--config", "zz"], "no nights of config 'zz'; configs: c, d"),
        (["--config", "c", "--metric", "serving.nope"], f"it has: serving.{TPUT}"),
        (["--config", "c", "--metric", TPUT], "SUITE.METRIC"),
        (["--config", "c", "--metric", f"serving.{TPUT}", "--variant", "x"], "no variant 'x'"),
        (["--variant", "patched"], "--variant needs --metric"),
        (["--night", "nope"], "no night 'nope'"),
        (["--night", "20260101T030000Z-c"], "nightly.json is gone or unreadable"),
    ],
)
def test_bad_input_is_a_usage_error(hist, capsys, args, message):
    assert main(["history", str(hist), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("patchbench history: usage error (exit 2): ") and message in err
    assert "Traceback" not in err


def test_missing_or_corrupt_file(tmp_path, capsys):
    assert main(["history", str(tmp_path / "none.sqlite")]) == 2
    assert "no such history file" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite").exists()  # never created
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"garbage" * 200)
    assert main(["history", str(bad)]) == 3
    assert "Traceback" not in capsys.readouterr().err
