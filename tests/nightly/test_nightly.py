"""The nightly job (patchbench/nightly/): outputs, exit codes, history glue and the CLI.

The gate rules themselves are tested in tests/nightly/test_gates.py. The job runs on synthetic run
folders (tests.synthetic) with a stand-in runner passed as ``run_bench``; one matrix night runs
on the fake server, and the e2e test gates a real run folder of the CPU demo.
"""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from patchbench import records
from patchbench.config import load_config
from patchbench.config.nightly import DEFAULT_HISTORY, Gate, NightlySettings
from patchbench.errors import EXIT_UNDERPOWERED, ConfigError, EnvironmentNotReady, RunFailed
from patchbench.nightly.commands import cli
from patchbench.nightly.history import History, Night
from patchbench.nightly.job import HISTORY_ENV, history_path, nightly_on_run
from patchbench.nightly.trend import plot_trend
from tests.helpers import write_nightly_config
from tests.synthetic import make_throughput_night

TPUT = "output_throughput_tok_s"


def test_settings_defaults():
    s = NightlySettings()
    assert s.history_path == DEFAULT_HISTORY == "~/.cache/patchbench/history.sqlite"
    assert (s.window_nights, s.min_history_nights, s.gates) == (7, 3, [])
    g = Gate(metric="serving.itl_p99_ms", threshold_pct=3)
    assert (g.suite, g.metric_name, g.against, g.consecutive_nights) == (
        "serving",
        "itl_p99_ms",
        "both",
        1,
    )
    with pytest.raises(ValueError, match="extra"):
        NightlySettings(gates=[{"metric": "x_ms", "threshold_pct": 1, "treshold": 2}])


def _write_config(tmp_path: Path, nightly: dict, name: str = "nightly-test") -> Path:
    return write_nightly_config(tmp_path, name, nightly)


def test_config_loader_validates_the_nightly_section(tmp_path):
    ok = _write_config(
        tmp_path, {"window_nights": 3, "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5}]}
    )
    assert load_config(ok).nightly.window_nights == 3  # typed: NightlySettings
    bad = _write_config(
        tmp_path, {"gates": [{"metric": "x_ms", "threshold_pct": 5, "bogus": 1}]}, name="bad"
    )
    with pytest.raises(ConfigError, match=r"nightly\.gates\.0\.bogus"):
        load_config(bad)


def test_history_path_precedence(tmp_path, monkeypatch):
    s = NightlySettings(history_path=str(tmp_path / "from-config.sqlite"))
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    assert history_path(s) == tmp_path / "from-config.sqlite"
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "from-env.sqlite"))
    assert history_path(s) == tmp_path / "from-env.sqlite"
    assert history_path(s, str(tmp_path / "cli.sqlite")) == tmp_path / "cli.sqlite"
    monkeypatch.delenv(HISTORY_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert history_path(NightlySettings()) == tmp_path / ".cache/patchbench/history.sqlite"


# ---------------------------------------------------------------------------------------------
# the job on synthetic run folders


def make_night(
    root: Path, day: int, base: list[float], var: list[float], name: str = "nightly-test"
) -> Path:
    """A run folder for night ``day``: serving throughput per repeat for both variants."""
    return make_throughput_night(
        root, f"202601{day:02d}T030000Z-{name}", f"2026-01-{day:02d}T03:00:00Z", base, var,
        name=name,
    )  # fmt: skip


JOB = NightlySettings(
    window_nights=7,
    min_history_nights=2,
    hold_while_learning=False,  # red in a young history: these tests judge the pipeline
    gates=[Gate(metric=f"serving.{TPUT}", threshold_pct=5)],
)


def clean(day: int) -> tuple[list[float], list[float]]:
    """A quiet night with no change (a small night-to-night wobble)."""
    d = (day % 3 - 1) * 0.5
    return [100.0 + d, 101.0 + d, 99.0 + d], [100.0 + d, 101.0 + d, 99.5 + d]


def test_job_green_red_red_and_recovery(tmp_path):
    h = tmp_path / "h.sqlite"
    for day in (1, 2):
        out = nightly_on_run(make_night(tmp_path, day, *clean(day)), JOB, history=h)
        assert out.exit_code == 0 and out.outcome == "green", out.problems
    # night 3: only the variant slows down -> the same-run gate
    run3 = make_night(tmp_path, 3, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    out = nightly_on_run(run3, JOB, history=h)
    assert out.exit_code == 1 and out.outcome == "red"
    fail = {(r.kind, r.variant) for r in out.results if r.status == "fail"}
    assert ("same_run", "patched") in fail and ("history", "baseline") not in fail
    md = (run3 / "nightly.md").read_text()
    assert md.startswith("# Nightly nightly-test: REGRESSION")
    assert f"**serving.{TPUT}** (patched, same-run): 90 tok/s vs 100 tok/s" in md
    assert "-10.00 %" in md and "Error budget: 1 false red night(s) per 30 nights" in md
    js = json.loads((run3 / "nightly.json").read_text())
    assert js["exit_code"] == 1 and js["outcome"] == "red" and js["history"]["recorded"] is True
    assert js["history"]["nights_before"] == 2 and js["schema"] == 2
    assert {(f["kind"], f["variant"]) for f in js["failing"]} == fail
    assert (run3 / f"plots/nightly-serving.{TPUT}.png").stat().st_size > 1000
    # night 4: baseline and variant both slow; same-run sees nothing -> the history gate
    run4 = make_night(tmp_path, 4, [80.0, 81.0, 79.0], [80.0, 80.5, 79.5])
    out = nightly_on_run(run4, JOB, history=h)
    assert out.exit_code == 1
    r = next(r for r in out.results if r.kind == "history" and r.variant == "baseline")
    assert r.status == "fail" and r.value == 80.0 and r.n_history == 3
    assert next(r for r in out.results if r.kind == "same_run").status == "pass"
    # night 5: clean again; night 4 does not count as reference
    out = nightly_on_run(make_night(tmp_path, 5, *clean(5)), JOB, history=h)
    assert out.exit_code == 0, [(r.kind, r.variant, r.status, r.reason) for r in out.results]
    r = next(r for r in out.results if r.kind == "history" and r.variant == "baseline")
    assert "20260104T030000Z-nightly-test" not in r.window_run_ids
    assert "no regression" in (tmp_path / "20260105T030000Z-nightly-test/nightly.md").read_text()
    with History(h) as hh:
        assert hh.count_nights("nightly-test") == 5


def test_one_repeat_night_is_not_gated_and_exits_5(tmp_path):
    run = make_night(tmp_path, 1, [100.0], [50.0])  # a huge change, one repeat
    out = nightly_on_run(run, JOB, history=tmp_path / "h.sqlite")
    assert out.exit_code == EXIT_UNDERPOWERED == 5 and out.outcome == "underpowered"
    [r] = [r for r in out.results if r.kind == "same_run"]
    assert r.status == "ungated"
    md = (run / "nightly.md").read_text()
    assert "UNDERPOWERED" in md and "## Underpowered" in md and "1 paired repeat(s)" in md


def test_noisy_night_is_underpowered_not_green(tmp_path):
    run = make_night(tmp_path, 1, [100.0, 100.0, 100.0], [110.0, 90.0, 100.0])
    out = nightly_on_run(run, JOB, history=tmp_path / "h.sqlite")
    assert out.exit_code == 5
    assert [r.status for r in out.results if r.kind == "same_run"] == ["inconclusive"]


def test_a_night_is_never_red_while_its_report_says_inconclusive(tmp_path):
    """Ratios -1 %, -1 %, -22 % (mean -8 %, beyond the 5 % threshold): the report (compare.json
    of the run folder) says inconclusive, so the same-run gate does not fail, whatever the
    nightly's own noise would have said (a 1 % prior: the night is underpowered, not red)."""
    from patchbench.analysis.comparison import read_comparison

    run = make_night(tmp_path, 1, [100.0, 100.0, 100.0], [99.0, 99.0, 78.0])
    assert read_comparison(run).row("serving", TPUT, "patched").verdict == "inconclusive"
    noisy_prior = JOB.model_copy(update={"run_cv_pct": 1.0})
    out = nightly_on_run(run, noisy_prior, history=tmp_path / "h.sqlite")
    [r] = [r for r in out.results if r.kind == "same_run"]
    assert out.outcome == "underpowered" and out.exit_code == 5 and r.status == "underpowered"
    assert r.reason.startswith("the report says inconclusive")


def test_rerunning_a_night_does_not_count_it_twice(tmp_path):
    h = tmp_path / "h.sqlite"
    run = make_night(tmp_path, 1, *clean(1))
    nightly_on_run(run, JOB, history=h)
    out = nightly_on_run(run, JOB, history=h)
    assert json.loads((run / "nightly.json").read_text())["history"]["already_recorded"] is True
    assert out.exit_code == 0
    with History(h) as hh:
        assert hh.count_nights() == 1


def test_locked_history_exits_3_keeps_the_night_and_record_only_appends_it(tmp_path, capsys):
    h = tmp_path / "h.sqlite"
    for day in (1, 2):
        nightly_on_run(make_night(tmp_path, day, *clean(day)), JOB, history=h)
    run3 = make_night(tmp_path, 3, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    holder = sqlite3.connect(h, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    settings = JOB.model_copy(update={"lock_timeout_s": 0.2})
    try:
        out = nightly_on_run(run3, settings, history=h)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert out.exit_code == 3
    md = (run3 / "nightly.md").read_text()
    assert "HISTORY UNAVAILABLE" in md and str(h) in md and "locked" in md
    assert f"patchbench nightly --record-only {run3} --history {h}" in md
    assert "and 1 regression(s)" in md  # the same-run gate still ran
    assert next(r for r in out.results if r.kind == "same_run").status == "fail"
    with History(h) as hh:
        assert hh.count_nights() == 2  # nothing half-written
    rc = cli(["--record-only", str(run3), "--history", str(h)])
    assert rc == 0 and "recorded 20260103T030000Z-nightly-test" in capsys.readouterr().out
    with History(h) as hh:
        assert [n.run_id for n in hh.nights("nightly-test")][-1] == run3.name


def test_corrupted_history_exits_3_and_is_left_untouched(tmp_path):
    h = tmp_path / "h.sqlite"
    h.write_bytes(b"garbage" * 100)
    run = make_night(tmp_path, 1, *clean(1))
    out = nightly_on_run(run, JOB, history=h)
    assert out.exit_code == 3
    assert h.read_bytes() == b"garbage" * 100
    md = (run / "nightly.md").read_text()
    assert "not a readable SQLite database" in md and str(h) in md
    js = json.loads((run / "nightly.json").read_text())
    assert js["history"]["recorded"] is False and js["night"]["values"]


def test_failed_cells_exit_4(tmp_path):
    run = make_night(tmp_path, 1, *clean(1))
    records.write_json(
        run / "patched/rep1/cell.json",
        {"variant": "patched", "repeat": 1, "status": "failed", "error": "server died"},
    )
    out = nightly_on_run(run, JOB, history=tmp_path / "h.sqlite")
    assert out.exit_code == 4
    assert "server died" in (run / "nightly.md").read_text()


def test_gate_config_error_exits_2(tmp_path):
    run = make_night(tmp_path, 1, *clean(1))
    s = NightlySettings(gates=[Gate(metric="serving.no_such_ms", threshold_pct=5)])
    assert nightly_on_run(run, s, history=tmp_path / "h.sqlite").exit_code == 2


def test_trend_plot_has_title_units_legend_and_run_id():
    from patchbench.nightly.gates import evaluate
    from patchbench.nightly.history import Night

    key = ("baseline", "serving", TPUT)

    def n(i, vals, rid=None):
        return Night(
            run_id=rid or f"n{i:02d}",
            night_utc=f"2026-01-{i:02d}T03:00:00Z",
            config_name="c",
            baseline="baseline",
            values={key: vals},
            units={("serving", TPUT): "tok/s"},
            better={("serving", TPUT): "higher"},
        )

    prior = [n(1, [100.0, 101.0, 99.0]), n(2, [99.0, 100.0, 98.0]), n(3, [102.0, 101.0, 100.0])]
    t = n(28, [90.0, 91.0, 89.0], "tonight")
    s = NightlySettings(
        window_nights=3,
        min_history_nights=3,
        hold_while_learning=False,
        gates=[Gate(metric=TPUT, threshold_pct=5, against="history")],
    )
    res = evaluate(prior, t, s)
    assert [r.status for r in res] == ["fail"]
    fig = plot_trend(prior, t, "serving", TPUT, res, s)
    ax = fig.axes[0]
    assert ax.get_title() == f"serving.{TPUT}: nightly trend (c)"
    assert ax.get_xlabel() == "night (UTC)" and ax.get_ylabel() == f"{TPUT} [tok/s]"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "baseline: nightly median",
        "baseline: runs of the 3 nights the gate used",
        "baseline: tonight (REGRESSION)",
    ]
    assert any(x.get_text() == "run tonight" for x in fig.texts)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_trend_band_is_made_of_the_nights_the_gate_used():
    """A red night the gate left out of its window is not in the trend plot's band."""
    from patchbench.nightly.gates import GateResult
    from patchbench.nightly.trend import band_nights, gate_window

    key = ("baseline", "serving", TPUT)

    def n(day: int, v: float) -> Night:
        return Night(f"r{day}", f"2026-01-0{day}T03:00:00Z", "c", "baseline", values={key: [v]})

    prior = [n(1, 100.0), n(2, 60.0), n(3, 101.0), n(4, 99.0)]
    hist = GateResult("g", "history", "baseline", "serving", TPUT, "pass", "",
                      window_run_ids=["r1", "r3", "r4"])  # fmt: skip
    used = gate_window([hist], key)
    assert used == ["r1", "r3", "r4"]
    assert [x.run_id for x in band_nights(prior, key, used, 3)] == ["r1", "r3", "r4"]
    # no history gate on the key: the last K nights, as before
    assert gate_window([hist], ("patched", "serving", TPUT)) is None
    assert [x.run_id for x in band_nights(prior, key, None, 3)] == ["r2", "r3", "r4"]


# ---------------------------------------------------------------------------------------------
# command line


def _cli_config(tmp_path: Path) -> Path:
    return _write_config(
        tmp_path,
        {
            "history_path": str(tmp_path / "cfg-history.sqlite"),
            "hold_while_learning": False,
            "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5}],
        },
    )


def test_cli_puts_a_single_configs_run_into_results_dir(tmp_path, monkeypatch):
    """``nightly CONFIG --results DIR`` (once refused: "only for a matrix file") runs the
    config's bench into DIR; --on stays a matrix's."""
    import patchbench.run.bench

    monkeypatch.delenv(HISTORY_ENV, raising=False)
    cfg = _cli_config(tmp_path)
    night = make_night(tmp_path, 1, *clean(1))
    roots = []

    def fake_bench(c, *, results_root=None, **kw):
        roots.append(Path(results_root))
        return night

    monkeypatch.setattr(patchbench.run.bench, "run_bench", fake_bench)
    assert cli([str(cfg), "--results", str(tmp_path / "nightly-runs")]) == 0
    assert roots == [tmp_path / "nightly-runs"]
    assert cli([str(cfg), "--on", "local"]) == 2


def test_cli_runs_the_config_records_and_gates(tmp_path, monkeypatch):
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    cfg = _cli_config(tmp_path)
    runs = iter(
        [make_night(tmp_path, d, *clean(d)) for d in (1, 2)]
        + [make_night(tmp_path, 3, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0])]
    )
    seen = []

    def run_bench(c):
        seen.append(c)
        return next(runs)

    assert [cli([str(cfg)], run_bench=run_bench) for _ in range(3)] == [0, 0, 1]
    assert [(c.name, Path(c.source)) for c in seen] == [("nightly-test", cfg)] * 3
    with History(tmp_path / "cfg-history.sqlite") as h:  # the config's history_path
        assert h.count_nights("nightly-test") == 3


def test_cli_environment_and_run_failures(tmp_path):
    cfg = _cli_config(tmp_path)
    args = [str(cfg), "--history", str(tmp_path / "h.sqlite")]

    def env(c):
        raise EnvironmentNotReady("sglang 0.5.23 installed, config pins 0.5.1.post3")

    assert cli(args, run_bench=env) == 3

    def failed(c):
        raise RunFailed("every cell failed")

    assert cli(args, run_bench=failed) == 4

    partial = make_night(tmp_path, 1, *clean(1))

    def failed_with_folder(c):
        raise RunFailed("cell patched/rep1 failed", run_dir=partial)

    assert cli(args, run_bench=failed_with_folder) == 4
    assert "cell patched/rep1 failed" in (partial / "nightly.md").read_text()
    assert not (tmp_path / "cfg-history.sqlite").exists()  # --history won over the config


def test_cli_usage_errors(tmp_path):
    assert cli([]) == 2
    assert cli([str(tmp_path / "missing.yaml")]) == 2
    assert cli(["--record-only", str(tmp_path / "nope")]) == 2
    assert cli(["--bogus"]) == 2


def test_cli_from_run_uses_settings_of_the_run_manifest(tmp_path):
    run = make_night(tmp_path, 1, *clean(1))
    m = records.read_json(run / "manifest.json")
    m["config"]["nightly"] = {
        "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5, "against": "same_run"}]
    }
    records.write_json(run / "manifest.json", m)
    assert cli(["--from-run", str(run), "--history", str(tmp_path / "h.sqlite")]) == 0
    js = json.loads((run / "nightly.json").read_text())
    assert [g["kind"] for g in js["gates"]] == ["same_run"]


# ---------------------------------------------------------------------------------------------
# nightly over a matrix (patchbench.matrix run folders)


def test_worst_exit_order():
    from patchbench.nightly.render import EXIT_ORDER, worst_exit

    assert EXIT_ORDER == (1, 4, 3, 2, 5, 0)
    assert worst_exit([0, 5, 3, 4]) == 4
    assert worst_exit([4, 1, 3]) == 1  # one unit's regression is not hidden by another's failure
    assert worst_exit([5, 2, 0]) == 2 and worst_exit([5, 0]) == 5 and worst_exit([]) == 0
    assert worst_exit([70, 5]) == 4  # an unknown code counts as a run failure


MX_NIGHTLY = {
    "min_history_nights": 2,
    "hold_while_learning": False,
    "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5}],
}


def make_matrix_night(root: Path, day: int, units: dict[str, dict]) -> Path:
    """A matrix run folder of night ``day`` as patchbench.matrix leaves it: matrix.json,
    configs/<unit>.yaml (config "mxcfg" with :data:`MX_NIGHTLY`) and one run folder per unit
    given ``vals`` (baseline and patched throughputs). Every unit's run id is the same
    ``<stamp>-mxcfg`` (two units of one config started in the same second)."""
    mdir = root / f"202601{day:02d}T020000Z-mx"
    entries = []
    for uid, spec in units.items():
        if spec.get("vals") is not None:
            run = make_night(mdir / "_tmp", day, *spec["vals"], name="mxcfg")
            run.rename(mdir / uid)
        records.write_text(
            mdir / "configs" / f"{uid}.yaml",
            yaml.safe_dump({"name": "mxcfg", "nightly": spec.get("nightly", MX_NIGHTLY)}),
        )
        entries.append(
            {
                "id": uid,
                "labels": {"gain": uid},
                "gpu_type": None,
                "config_name": "mxcfg",
                "status": spec.get("status", "ok"),
                "exit_code": spec.get("exit_code", 0),
                "message": spec.get("message", ""),
            }
        )
    shutil.rmtree(mdir / "_tmp", ignore_errors=True)
    records.write_json(mdir / "matrix.json", {"name": "mx", "units": entries})
    return mdir


RED = ([100.0, 101.0, 99.0], [90.0, 91.0, 89.0])  # the same-run gate fails (night 1 too)


def test_matrix_night_lists_every_unit_and_a_regression_beats_a_lost_unit(tmp_path, capsys):
    h = tmp_path / "h.sqlite"
    mdir = make_matrix_night(
        tmp_path,
        1,
        {
            "green-1": {"vals": clean(1)},
            "red-2": {"vals": RED},
            "lost-3": {"status": "lost", "exit_code": None, "message": "node died"},
        },
    )
    assert cli(["--from-run", str(mdir), "--history", str(h)]) == 1
    js = json.loads((mdir / "nightly.json").read_text())
    assert (js["kind"], js["exit_code"], js["outcome"]) == ("matrix", 1, "red")
    got = {u["id"]: (u["outcome"], u["exit_code"], u["key"]) for u in js["units"]}
    assert got == {
        "green-1": ("green", 0, "mxcfg@green-1"),
        "red-2": ("red", 1, "mxcfg@red-2"),
        "lost-3": ("run failed", 4, "mxcfg@lost-3"),
    }
    [fail] = next(u for u in js["units"] if u["id"] == "red-2")["failing"]
    # the geometric mean of 90/100, 91/101, 89/99: -10.0007 %
    assert (fail["kind"], fail["variant"]) == ("same_run", "patched")
    logs = [math.log(v / b) for b, v in zip(*RED, strict=True)]
    assert fail["change_pct"] == pytest.approx(100 * math.expm1(sum(logs) / 3), abs=1e-9)
    assert fail["change_pct"] == pytest.approx(-10.0007, abs=1e-4)
    md = (mdir / "nightly.md").read_text()
    assert md.startswith("# Nightly matrix mx: REGRESSION in 1 of 3 unit(s)")
    assert "| [red-2](red-2/nightly.md) | red-2 | any | ok | ❌ red | 1 | `mxcfg@red-2` |" in md
    assert "| `lost-3` | lost-3 | any | lost | 💥 run failed | 4 | `mxcfg@lost-3` |" in md
    assert "- `lost-3`: the unit's run ended lost: node died" in md
    assert f"- `red-2`: **serving.{TPUT}** (patched, same-run): 90 tok/s vs 100 tok/s" in md
    # each unit's own summary is keyed as the unit
    assert (mdir / "red-2/nightly.md").read_text().startswith("# Nightly mxcfg@red-2: REGRESSION")
    with History(h) as hh:  # same run id in both units: still two nights, one per key
        assert hh.count_nights("mxcfg@green-1") == hh.count_nights("mxcfg@red-2") == 1
        assert hh.count_nights("mxcfg") == 0 and hh.count_nights() == 2
    # night 2 without the regression: the lost unit now decides (4), never dropped
    mdir2 = make_matrix_night(
        tmp_path,
        2,
        {
            "green-1": {"vals": clean(2)},
            "red-2": {"vals": clean(2)},
            "lost-3": {"status": "error", "exit_code": 3, "message": "sglang 0.5.23 missing"},
        },
    )
    assert cli(["--from-run", str(mdir2), "--history", str(h)]) == 3
    js = json.loads((mdir2 / "nightly.json").read_text())
    assert [u["outcome"] for u in js["units"]] == ["green", "green", "environment not ready"]
    with History(h) as hh:  # each unit's series continues under its key
        assert [n.run_id for n in hh.nights("mxcfg@red-2")] == [
            "20260101T030000Z-mxcfg@red-2",
            "20260102T030000Z-mxcfg@red-2",
        ]


def test_matrix_unit_folders_are_keyed_in_record_only_and_from_run(tmp_path, capsys):
    h = tmp_path / "h.sqlite"
    mdir = make_matrix_night(
        tmp_path,
        1,
        {"a-1": {"vals": clean(1)}, "b-2": {"vals": clean(1)}, "c-3": {"status": "lost"}},
    )
    # one unit folder alone: found to be a unit by its parent's matrix.json
    assert cli(["--record-only", str(mdir / "a-1"), "--history", str(h)]) == 0
    # the whole matrix folder: a-1 already there, b-2 added, c-3 has no folder (4)
    assert cli(["--record-only", str(mdir), "--history", str(h)]) == 4
    assert "unit c-3: no run folder to record (lost)" in capsys.readouterr().err
    with History(h) as hh:
        assert (hh.count_nights("mxcfg@a-1"), hh.count_nights("mxcfg@b-2")) == (1, 1)
        assert hh.count_nights() == 2
    # a folder outside a matrix keeps its plain key
    run = make_night(tmp_path / "plain", 1, *clean(1), name="mxcfg")
    assert cli(["--record-only", str(run), "--history", str(h)]) == 0
    with History(h) as hh:
        assert hh.count_nights("mxcfg") == 1


def test_matrix_unit_with_a_bad_nightly_section_is_a_config_error(tmp_path):
    mdir = make_matrix_night(
        tmp_path,
        1,
        {
            "ok-1": {"vals": clean(1)},
            "bad-2": {"vals": clean(1), "nightly": {"min_repeats": 1}},
        },
    )
    assert cli(["--from-run", str(mdir), "--history", str(tmp_path / "h.sqlite")]) == 2
    js = json.loads((mdir / "nightly.json").read_text())
    bad = js["units"][1]
    assert (bad["outcome"], bad["exit_code"]) == ("config error", 2)
    assert "configs/bad-2.yaml: key nightly.min_repeats:" in bad["message"]


def test_matrix_cli_usage_errors(tmp_path):
    cfg = _cli_config(tmp_path)
    assert cli([str(cfg), "--on", "ray"]) == 2  # matrix options with a plain config
    mdir = make_matrix_night(tmp_path, 1, {"a-1": {"vals": clean(1)}})
    assert cli([str(cfg), "--from-run", str(mdir)]) == 2  # a config with a matrix run folder
    assert cli(["--from-run", str(mdir), "--on", "local"]) == 2


@pytest.mark.needs_sglang  # loads a release environment
def test_nightly_over_a_matrix_on_the_fake_server(tmp_path, monkeypatch, capsys):
    """``patchbench nightly MATRIX.yaml``: two units run on the fake server (tests/matrix/test_matrix.py's
    mx_fake suite), one red night and one the report cannot decide -> exit 1, both listed, two
    history keys."""
    import scipy.stats

    from patchbench.matrix import execute
    from patchbench.matrix.spec import load_matrix
    from tests.matrix import test_matrix

    monkeypatch.delenv(HISTORY_ENV, raising=False)
    monkeypatch.setattr(execute, "DEFAULT_COMMAND", tuple(test_matrix.FAKE_COMMAND))
    base = test_matrix.write_base(tmp_path)
    m = test_matrix.write_matrix(
        tmp_path,
        f"""\
        name: nightly-mx
        base: {base}
        axes:
          suites.mx_fake.gains.patched: [1.0, 0.8]
        set:
          nightly.min_repeats: 2
          nightly.hold_while_learning: false
          nightly.gates: [{{metric: mx_fake.tput_tok_s, threshold_pct: 5}}]
        """,
    )
    mx = load_matrix(m)
    h = tmp_path / "h.sqlite"
    rc = cli([str(m), "--on", "local", "--results", str(tmp_path / "res"), "--history", str(h)])
    [mdir] = (tmp_path / "res").iterdir()
    js = json.loads((mdir / "nightly.json").read_text())
    assert rc == 1 and js["exit_code"] == 1, capsys.readouterr()
    keys = [f"mxbase@{u.id}" for u in mx.units]
    assert [(u["id"], u["key"], u["outcome"]) for u in js["units"]] == [
        (mx.units[0].id, keys[0], "underpowered"),
        (mx.units[1].id, keys[1], "red"),
    ]
    # by hand: the patched/baseline ratio of repeat k is gain + 0.01 k (2 repeats); the report's
    # paired t-test on the log ratios (two-sided), its change the geometric mean. At 1.0 its
    # 95 % interval (+-6 % with 1 df) reaches the 5 % threshold: inconclusive, no noise known
    for u, gain in zip(js["units"], (1.0, 0.8), strict=True):
        logs = [math.log(gain + 0.01 * k) for k in range(2)]
        gates = json.loads((mdir / u["id"] / "nightly.json").read_text())["gates"]
        [g] = [g for g in gates if g["kind"] == "same_run"]
        assert g["change_pct"] == pytest.approx(100 * math.expm1(sum(logs) / 2), abs=1e-6)
        p = scipy.stats.ttest_1samp(logs, 0.0).pvalue
        assert g["p_value"] == pytest.approx(p, rel=1e-6)
        assert g["status"] == ("inconclusive" if gain == 1.0 else "fail")  # p 0.018, -19.5 %
    md = (mdir / "nightly.md").read_text()
    assert md.startswith("# Nightly matrix nightly-mx: REGRESSION in 1 of 2 unit(s)")
    for u in mx.units:
        assert f"[{u.id}]({u.id}/nightly.md)" in md
    with History(h) as hh:
        assert [hh.count_nights(k) for k in keys] == [1, 1] and hh.count_nights() == 2


# ---------------------------------------------------------------------------------------------
# the newest sglang and the confirmation run on the fake server; a real run folder end to end

REPO = Path(__file__).resolve().parents[2]
#: a recorded answer of the package index (newest sglang: 0.5.23): `sglang: latest` offline
INDEX = REPO / "tests" / "data" / "pypi-index"
FAKE_SERVER = REPO / "tests" / "fake_server"
FAKE_METRIC = "tput_tok_s"


def _fake_green_night(root: Path, day: int, settings: NightlySettings, h: Path) -> None:
    """A green night of the ``nightly-fake`` series on 0.5.1.post3 (synthetic run folder: the
    mx_fake throughput of both variants equal, its report, gated with ``settings``)."""
    from patchbench.analysis.build import compare_run
    from tests.synthetic import make_run

    vals = [100.0, 102.0, 104.0]
    run = make_run(
        root, run_id=f"202611{day:02d}T030000Z-nightly-fake", name="nightly-fake",
        variants={"baseline": [], "patched": ["null-comment"]},
        metrics={"mx_fake": {FAKE_METRIC: {"baseline": vals, "patched": [v + 0.1 for v in vals]}}},
    )  # fmt: skip
    m = records.read_json(run / "manifest.json")
    m["started_at"] = f"2026-11-{day:02d}T03:00:00Z"
    records.write_json(run / "manifest.json", m)
    compare_run(run)
    assert nightly_on_run(run, settings, history=h).outcome == "green"


@pytest.mark.needs_sglang  # the fake server runs in each release's environment
def test_newest_sglang_night_and_its_confirmation_on_the_fake_server(tmp_path, monkeypatch):
    """`sglang: latest` resolves to 0.5.23 through the recorded index; tonight's servers (the
    fake server, in 0.5.23's environment) give the patched variant 20 % less throughput: the
    report says regressed, the night is red (exit 1), the release change since the two green
    nights on 0.5.1.post3 is named as its likely cause, and the confirmation runs last green's
    build (0.5.1.post3) against tonight's (0.5.23) in one interleaved run and confirms it."""
    from patchbench.envs.builds import INDEX_URL_ENV
    from patchbench.nightly.history import read_confirmations, read_night_builds
    from patchbench.run import bench, cell
    from patchbench.run.ports import free_port
    from tests.matrix import test_matrix  # registers the mx_fake suite

    monkeypatch.setenv(INDEX_URL_ENV, INDEX.as_uri())
    real = cell.launch_spec

    def fake_server(cfg, venv, cdir, port):
        spec = real(cfg, venv, cdir, port)
        spec.env["PYTHONPATH"] = str(FAKE_SERVER) + ":" + spec.env["PYTHONPATH"]
        return spec

    monkeypatch.setattr(cell, "launch_spec", fake_server)
    h = tmp_path / "h.sqlite"
    path = test_matrix.write_base(tmp_path, name="nightly-fake")
    raw = yaml.safe_load(path.read_text())
    raw["sglang"] = "latest"
    raw["schedule"] = {"repeats": 3}
    raw["suites"] = {"mx_fake": {"gains": {"patched": 0.8, "tonight": 0.8}}}
    raw["nightly"] = {
        "min_history_nights": 2,
        "hold_while_learning": False,
        "gates": [{"metric": f"mx_fake.{FAKE_METRIC}", "threshold_pct": 5, "against": "same_run"}],
        "confirm": {"alpha": 0.1, "repeats": 2},
    }
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    for day in (27, 28):
        _fake_green_night(tmp_path / "earlier", day, cfg.nightly, h)
    ran = []

    def run_bench(c):
        ran.append(c)
        return bench.run_bench(c, results_root=tmp_path / "results", port=free_port())

    assert cli([str(path), "--history", str(h)], run_bench=run_bench) == 1
    night_cfg, confirm_cfg = ran
    assert {v: night_cfg.release_of(v) for v in night_cfg.variants} == {
        "baseline": "0.5.23",
        "patched": "0.5.23",
    }
    assert list(confirm_cfg.variants) == ["tonight", "last-green"]
    with History(h) as hh:
        tonight = hh.nights("nightly-fake")[-1]
        builds = read_night_builds(hh, run_id=tonight.run_id)
        confirmations = read_confirmations(hh, "nightly-fake", tonight.run_id)
    js = json.loads((Path(tonight.run_dir) / "nightly.json").read_text())
    [fail] = js["failing"]
    assert (fail["kind"], fail["variant"], fail["metric"]) == ("same_run", "patched", FAKE_METRIC)
    logs = [math.log(0.8 + 0.01 * k) for k in range(3)]  # mx_fake: the ratio of round k
    assert fail["change_pct"] == pytest.approx(100 * math.expm1(sum(logs) / 3), abs=1e-6)
    assert {(b["variant"], b["sglang_release"], b["patch"], b["state"]) for b in builds} == {
        ("baseline", "0.5.23", "", ""),
        ("patched", "0.5.23", "null-comment", "applies"),
    }
    [cause] = js["likely_causes"]
    assert cause.startswith("sglang 0.5.1.post3 -> 0.5.23 on ") and cause.endswith(
        f"coincides with tonight's {fail['change_pct']:+.1f} % regression in "
        f"mx_fake.{FAKE_METRIC} (patched, same-run gate)"
    )
    conf = js["confirmation"]
    assert conf["skipped"] is None and conf["error"] is None, conf
    assert (conf["variant"], conf["old_release"], conf["new_release"]) == (
        "patched",
        "0.5.1.post3",
        "0.5.23",
    )
    man = json.loads((Path(conf["run_dir"]) / "manifest.json").read_text())
    assert {v: b["release"] for v, b in man["builds"].items()} == {
        "last-green": "0.5.1.post3",
        "tonight": "0.5.23",
    }
    [r] = conf["results"]
    d = [math.log(0.8 + 0.01 * k) for k in range(2)]  # tonight / last green, by round
    assert r["verdict"] == "confirmed" and r["change_pct"] == pytest.approx(
        100 * math.expm1(sum(d) / 2), abs=1e-6
    )
    assert "## Confirmation run" in (Path(tonight.run_dir) / "nightly.md").read_text()
    assert [c["verdict"] for c in confirmations] == ["confirmed"]


@pytest.mark.e2e
def test_e2e_nightly_from_a_real_run(demo_0523, tmp_path):
    """The job on a real run folder: the CPU demo's sglang 0.5.23 run (made once per session by
    the demo_0523 fixture, tests/conftest.py; real servers), gated with `--from-run` on its
    serving output throughput (a sweep point's run-level row, output_throughput_tok_s@c8).
    One repeat gates nothing (exit 5: the same-run gate ungated, the history gate warming up);
    the night is recorded with every real metric, its builds read from the real manifest, its
    plot drawn."""
    from patchbench.analysis.comparison import read_comparison

    run = tmp_path / demo_0523.name
    shutil.copytree(demo_0523, run)
    runs = [
        r.metric
        for r in read_comparison(run).rows
        if r.suite == "serving" and r.kind == "run" and r.better in ("higher", "lower")
    ]
    metric = min(runs, key=lambda m: (not m.startswith("output_throughput_tok_s"), m))
    raw = yaml.safe_load((REPO / "configs" / "demo-cpu-0.5.23.yaml").read_text())
    raw["nightly"] = {"gates": [{"metric": f"serving.{metric}", "threshold_pct": 50}]}
    cfg = tmp_path / "night.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    h = tmp_path / "h.sqlite"
    assert cli(["--from-run", str(run), str(cfg), "--history", str(h)]) == EXIT_UNDERPOWERED
    js = json.loads((run / "nightly.json").read_text())
    assert {(g["kind"], g["status"]) for g in js["gates"]} == {
        ("same_run", "ungated"),
        ("history", "skipped"),
    }, js["gates"]
    assert {(b["variant"], b["sglang_release"], b["state"]) for b in js["builds"]} == {
        ("baseline", "0.5.23", ""),
        ("mrope-sync-free", "0.5.23", "applies"),
    }
    with History(h) as hh:
        [night] = hh.nights("demo-cpu-0.5.23")
    assert night.sglang_version == "0.5.23"
    assert night.values[("baseline", "serving", metric)][0] > 0
    assert (run / f"plots/nightly-serving.{metric}.png").stat().st_size > 1000


# ---------------------------------------------------------------------------------------------
# schedule.repeats: auto (patchbench.nightly.repeats)


def _auto_settings(**kw) -> NightlySettings:
    return NightlySettings(
        run_cv_pct=kw.pop("run_cv_pct", 1.5),
        gates=[Gate(metric=f"serving.{TPUT}", threshold_pct=3, against="both")],
        **kw,
    )


def _sim_history(cv: float, nights: int = 12, repeats: int = 5, drift: float = 0.0):
    import numpy as np

    from tools.calibration.nightly import Scenario, sim_night

    rng = np.random.default_rng(5)
    return [
        sim_night(i, rng, [("serving", TPUT)], repeats, cv, drift, Scenario())
        for i in range(nights)
    ]


def _by_hand(cv_pct: float, level: float, history: bool, k: int = 7) -> int:
    """The fewest runs n with which a 5 % step is red within 3 nights in 90 %: per night the
    smaller of P(estimate beyond 3 %) and P(significant at the one-sided ``level``), the
    estimate ~ N(step, se^2). Same-run: the report's paired t on n pairs (noncentral t); history:
    a z test on n - 1 runs (one set aside), se from the run noise alone. scipy, no patchbench."""
    from scipy.stats import nct, norm, t

    s, step, thr = math.log1p(cv_pct / 100), -math.log(0.95), -math.log(0.97)
    for n in range(3, 65):
        if history:
            se = s * math.sqrt((1 + 1 / k) / (n - 1))
            sig = norm.sf(norm.isf(level) - step / se)
        else:
            se = math.sqrt(2) * s / math.sqrt(n)
            sig = nct.sf(t.isf(level, n - 1), n - 1, step / se)
        if 1 - (1 - min(sig, norm.cdf((step - thr) / se))) ** 3 >= 0.9:
            return n
    raise AssertionError("unreachable")


def test_auto_repeats_follow_the_learned_noise_and_the_prior_while_learning():
    from patchbench.nightly.repeats import plan_repeats

    s = _auto_settings()
    quiet = plan_repeats(s, _sim_history(0.01), ["baseline", "patched"], "baseline")
    noisy = plan_repeats(s, _sim_history(0.04), ["baseline", "patched"], "baseline")
    assert quiet.source == noisy.source == "learned" and not quiet.capped and not noisy.capped
    assert s.min_repeats <= quiet.repeats < noisy.repeats <= s.max_repeats
    assert "learned noise" in noisy.why and noisy.metrics[0]["needed"] == noisy.repeats
    # no nights yet: the prior run_cv_pct decides; the same-run test is the report's at 0.05
    # two-sided, the history test at the family alpha (1/30), each alone in its family
    prior = plan_repeats(s, [], ["baseline", "patched"], "baseline")
    want = max(_by_hand(1.5, 0.025, history=False), _by_hand(1.5, 1 / 30, history=True))
    assert prior.source == "prior" and prior.repeats == max(want, s.min_repeats)


def test_auto_repeats_are_capped_and_say_the_night_may_end_underpowered():
    from patchbench.nightly.repeats import plan_repeats

    s = _auto_settings(max_repeats=6)
    p = plan_repeats(s, _sim_history(0.05), ["baseline", "patched"], "baseline")
    assert p.capped and p.repeats == 6 and (p.needed is None or p.needed > 6)
    assert "capped at 6" in p.why and "may end underpowered" in p.why
    # drift alone hides the step from the history gate: more repeats would not help it, so it
    # does not raise the count (the same-run gate decides) and the plan says so
    h = _sim_history(0.01, 20, drift=0.06)
    d = plan_repeats(_auto_settings(), h, ["baseline", "patched"], "baseline")
    assert not d.capped and d.repeats < 12 and d.metrics[0]["night_limited"]
    assert f"history gate of serving.{TPUT} cannot show a step" in d.why


def test_auto_repeats_config_errors_exit_2_naming_the_key(tmp_path):
    def cfg(nightly: dict, name: str) -> Path:
        p = _write_config(tmp_path, nightly, name)
        raw = yaml.safe_load(p.read_text())
        raw["schedule"] = {"repeats": "auto"}
        p.write_text(yaml.safe_dump(raw))
        return p

    gates = [{"metric": f"serving.{TPUT}", "threshold_pct": 5}]
    no_prior = cfg({"gates": gates}, "no-prior")
    with pytest.raises(ConfigError, match="schedule.repeats: auto needs nightly.run_cv_pct"):
        load_config(no_prior)

    def never(c):
        pytest.fail("must not run")

    assert cli([str(no_prior)], run_bench=never) == 2
    for bad, key in (({"max_repeats": 1}, "max_repeats"), ({"max_repeats": "x"}, "max_repeats")):
        p = cfg({"run_cv_pct": 2, "gates": gates, **bad}, f"bad-{key}-{len(str(bad))}")
        with pytest.raises(ConfigError, match=key):
            load_config(p)
        assert cli([str(p)], run_bench=never) == 2
    p = cfg({"run_cv_pct": 2, "gates": gates, "min_repeats": 5, "max_repeats": 4}, "low-cap")
    with pytest.raises(ConfigError, match=r"max_repeats \(4\) is smaller than min_repeats"):
        load_config(p)
    ok = load_config(cfg({"run_cv_pct": 2, "gates": gates}, "ok"))
    assert ok.schedule.auto and ok.schedule.repeats == 3  # a plain bench runs min_repeats


def test_cli_auto_repeats_runs_the_computed_count_and_records_it(tmp_path, monkeypatch, capsys):
    """The night runs a copy of the config (in memory) with the repeats chosen; the config file
    and its loaded model stay as they were; nightly.json records the choice."""
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    cfg = _cli_config(tmp_path)
    raw = yaml.safe_load(cfg.read_text())
    raw["schedule"] = {"repeats": "auto"}
    raw["nightly"]["run_cv_pct"] = 1.5
    cfg.write_text(yaml.safe_dump(raw))
    before = cfg.read_text()
    seen = []

    def run(c):
        seen.append(c)
        return make_night(tmp_path, 1, *clean(1))

    assert cli([str(cfg)], run_bench=run) in (0, 5)
    [ran] = seen
    assert not ran.schedule.auto and ran.schedule.repeats >= 3 and Path(ran.source) == cfg
    assert cfg.read_text() == before and not list(tmp_path.glob("**/nightly-configs"))
    out = capsys.readouterr().out
    doc = json.loads(next(tmp_path.glob("*/nightly.json")).read_text())
    assert doc["repeats"]["repeats"] == ran.schedule.repeats and doc["repeats"]["source"] == "prior"
    assert f"repeats: {ran.schedule.repeats}, what the targets need at the prior noise" in out


def test_job_compares_a_night_with_its_own_machines_nights(tmp_path):
    """Nights 1-3 on machine A, night 4 on B (10 % slower), night 5 on A: B's first night is
    warming up on its machine, not red, and says so; A's next night is judged on A's nights
    alone, with the noise learned from them (3 nights); the machine is named in nightly.md."""
    from patchbench.runfolder import read_manifest, write_manifest
    from patchbench.runfolder.models import MachineInfo

    job = NightlySettings(
        window_nights=3, min_history_nights=2, learn_min_nights=2,
        gates=[Gate(metric=f"serving.{TPUT}", threshold_pct=3, against="history",
                    variants=["baseline"])],
    )  # fmt: skip
    h, outs = tmp_path / "h.sqlite", {}
    for day, m in ((1, "a"), (2, "a"), (3, "a"), (4, "b"), (5, "a")):
        base, var = clean(day)
        if m == "b":
            base, var = [x * 0.9 for x in base], [x * 0.9 for x in var]
        run = make_night(tmp_path, day, base, var)
        man = read_manifest(run)
        man.machine = MachineInfo(model="NVIDIA H200", gpu_uuids=[f"GPU-{m}"])
        write_manifest(run, man)
        outs[day] = nightly_on_run(run, job, history=h)
    b, a = outs[4], outs[5]
    [r] = b.results
    assert (b.outcome, r.status, b.exit_code) == ("green", "skipped", 0)
    assert r.reason == "warming up: 0 night(s) in the history on this machine, 2 needed"
    js = json.loads((tmp_path / "20260104T030000Z-nightly-test/nightly.json").read_text())
    assert js["night"]["machine"] == js["story"]["machine"] == "NVIDIA H200 [GPU-b]"
    assert js["story"]["summary"] == "learning on this machine (0 of 2 nights)"
    assert js["noise"] == [] and js["change_points"] == []  # B has no nights of its own yet
    md = (tmp_path / "20260104T030000Z-nightly-test/nightly.md").read_text()
    assert "· machine NVIDIA H200 [GPU-b] ·" in md
    [r] = a.results
    assert (a.outcome, r.status, r.noise_source, r.reference) == (
        "green",
        "quiet",
        "learned",
        100.0,
    )
    assert r.window_run_ids == [f"2026010{d}T030000Z-nightly-test" for d in (1, 2, 3)]
    assert [(x["metric"], x["nights"]) for x in a.noise] == [(TPUT, 3)]


def test_a_night_whose_cells_ran_on_different_gpus_says_so(tmp_path):
    """The report's GPU warning (patchbench.analysis.health.gpu_warnings) is a problem of the
    night: listed in nightly.md and nightly.json; the gates' outcome is unchanged."""
    from patchbench import records

    run = make_night(tmp_path, 1, *clean(1))
    for (v, k), uuid in {("baseline", 0): "GPU-a", ("patched", 0): "GPU-b"}.items():
        p = records.cell_dir(run, v, k) / "cell.json"
        rec = records.read_json(p)
        rec["gpu"] = {"devices": [{"index": 0, "uuid": uuid, "power_limit_w": 700.0}]}
        records.write_json(p, rec)
    (run / "compare.json").unlink(missing_ok=True)
    out = nightly_on_run(run, JOB, history=tmp_path / "h.sqlite")
    said = (
        "GPU: the timed cells ran on different GPUs (baseline/rep0 on GPU-a; patched/rep0 on "
        "GPU-b): GPUs of one model differ"
    )
    assert [p for p in out.problems if p.startswith("GPU: ")][0].startswith(said)
    assert out.exit_code == 0 and out.outcome == "green"
    assert said in (run / "nightly.md").read_text()
    assert any(
        p.startswith(said) for p in json.loads((run / "nightly.json").read_text())["problems"]
    )
