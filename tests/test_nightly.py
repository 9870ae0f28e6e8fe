"""The nightly job (patchbench/nightly.py): gates on hand-made histories, outputs, exit codes.

Everything but the last test runs on synthetic nights (Night objects, or run folders from
tests/helpers_runs.py); the e2e test drives the real runner (patchbench.bench.run_bench).
"""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import types
from pathlib import Path

import pytest
import yaml

import patchbench
from patchbench import records
from patchbench.config import ConfigError, load_config
from patchbench.history import Comparison, History, Night
from patchbench.nightly import (DEFAULT_HISTORY, HISTORY_ENV, Gate, NightlySettings, cli, evaluate,
                                history_path, night_from_compare, nightly_on_run, plot_trend)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers_runs import make_run  # noqa: E402

TPUT = "output_throughput_tok_s"
ITL = "itl_p99_ms"
KEY_B = ("baseline", "serving", TPUT)
KEY_V = ("patched", "serving", TPUT)


# ---------------------------------------------------------------------------------------------
# hand-made nights


def night(i: int, values: dict | None = None, comparisons: dict | None = None,
          run_id: str | None = None) -> Night:
    """Night number i (2026-01-<i>), config "c"; values {key: repeats}."""
    return Night(run_id=run_id or f"n{i:02d}", night_utc=f"2026-01-{i:02d}T03:00:00Z",
                 config_name="c", baseline="baseline", values=dict(values or {}),
                 comparisons=dict(comparisons or {}),
                 units={("serving", TPUT): "tok/s", ("serving", ITL): "ms"},
                 better={("serving", TPUT): "higher", ("serving", ITL): "lower"})


def series(per_night: list[list[float]], key=KEY_B) -> list[Night]:
    return [night(i + 1, {key: vals}) for i, vals in enumerate(per_night)]


def tonight(vals: list[float], key=KEY_B, **kw) -> Night:
    return night(28, {key: vals}, run_id="tonight", **kw)


def hist_settings(**gate_kw) -> NightlySettings:
    gate = dict(metric=f"serving.{TPUT}", threshold_pct=5, against="history") | gate_kw
    return NightlySettings(window_nights=5, min_history_nights=2, gates=[Gate(**gate)])


def only(results, **match):
    out = [r for r in results if all(getattr(r, k) == v for k, v in match.items())]
    assert len(out) == 1, out
    return out[0]


# ---------------------------------------------------------------------------------------------
# settings


def test_settings_defaults_and_validation():
    s = NightlySettings()
    assert s.history_path == DEFAULT_HISTORY == "~/.cache/patchbench/history.sqlite"
    assert (s.window_nights, s.min_history_nights, s.gates) == (7, 2, [])
    g = Gate(metric="serving.itl_p99_ms", threshold_pct=3)
    assert (g.suite, g.metric_name, g.against, g.consecutive_nights, g.require_ci_excludes_zero) \
        == ("serving", "itl_p99_ms", "both", 1, True)
    assert Gate(metric="itl_p99_ms", threshold_pct=3).suite is None
    with pytest.raises(ValueError, match="extra"):
        NightlySettings(gates=[{"metric": "x_ms", "threshold_pct": 1, "treshold": 2}])
    with pytest.raises(ValueError):
        Gate(metric="x_ms", threshold_pct=0)
    with pytest.raises(ValueError):
        Gate(metric="x_ms", threshold_pct=5, against="yesterday")
    with pytest.raises(ValueError, match="min_history_nights"):
        NightlySettings(window_nights=2, min_history_nights=3)


def _write_config(tmp_path: Path, nightly: dict, name: str = "nightly-test") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "sglang": "0.5.1.post3", "model": {"path": "/nonexistent", "tiny": True},
        "variants": {"baseline": [], "patched": []}, "suites": {}, "nightly": nightly}))
    return path


def test_config_loader_validates_the_nightly_section(tmp_path):
    ok = _write_config(tmp_path, {"window_nights": 3,
                                  "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5}]})
    assert load_config(ok).nightly["window_nights"] == 3
    bad = _write_config(tmp_path, {"gates": [{"metric": "x_ms", "threshold_pct": 5, "bogus": 1}]},
                        name="bad")
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
# history gate


def test_steady_series_passes():
    prior = series([[100], [101], [99], [100], [102]])
    [r] = evaluate(prior, tonight([100.5]), hist_settings())
    assert (r.kind, r.variant, r.status) == ("history", "baseline", "pass")
    assert r.reference == 100.0                       # median of 99, 100, 100, 101, 102
    assert r.change_pct == pytest.approx(0.5)
    assert (r.band_low, r.band_high, r.n_history) == (99, 102, 5)
    assert r.unit == "tok/s" and r.better == "higher"


def test_step_regression_fails_with_numbers():
    prior = series([[100], [101], [99], [100], [102]])
    [r] = evaluate(prior, tonight([90]), hist_settings())
    assert r.status == "fail"
    assert (r.value, r.reference) == (90, 100)
    assert r.change_pct == pytest.approx(-10.0)
    assert "-10.00 %" in r.reason and "outside their band [99, 102]" in r.reason


def test_window_is_the_last_k_nights():
    # 7 nights; K = 5 keeps the last five (200 ... ) and ignores the first two (100)
    prior = series([[100], [100], [200], [201], [199], [200], [202]])
    [r] = evaluate(prior, tonight([190]), hist_settings())
    assert r.reference == 200 and r.window_run_ids == ["n03", "n04", "n05", "n06", "n07"]
    assert r.change_pct == pytest.approx(-5.0) and r.status == "fail"


def test_single_noisy_night_in_history_is_quiet():
    prior = series([[100], [101], [60], [100], [99]])       # one bad night among five
    [r] = evaluate(prior, tonight([99]), hist_settings())
    assert r.reference == 100 and r.change_pct == pytest.approx(-1.0)
    assert r.status == "pass"


def test_single_noisy_repeat_tonight_is_quiet():
    prior = series([[98, 100, 102]] * 5)
    [r] = evaluate(prior, tonight([80, 101, 99]), hist_settings())   # median 99
    assert r.value == 99 and r.change_pct == pytest.approx(-1.0) and r.status == "pass"


def test_beyond_threshold_but_inside_the_band_is_noise():
    prior = series([[90, 100, 110]] * 5)                   # band [90, 110]
    [r] = evaluate(prior, tonight([94, 94, 95]), hist_settings())
    assert r.change_pct == pytest.approx(-6.0)
    assert r.status == "pass" and "inside their band" in r.reason


def test_lower_is_better_metric():
    key = ("baseline", "serving", ITL)
    prior = series([[50], [51], [49]], key=key)
    s = hist_settings(metric=ITL)
    [r] = evaluate(prior, tonight([56], key=key), s)     # +12 % latency
    assert r.better == "lower" and r.change_pct == pytest.approx(12.0) and r.status == "fail"
    [r] = evaluate(prior, tonight([40], key=key), s)     # faster: never a regression
    assert r.status == "pass"
    # an explicit direction on the gate wins over the recorded one
    [r] = evaluate(prior, tonight([40], key=key), hist_settings(metric=ITL, direction="higher"))
    assert r.status == "fail"


def test_too_little_history_waits():
    [r] = evaluate(series([[100]]), tonight([50]), hist_settings())
    assert r.status == "skipped" and "1 night(s) in the history, 2 needed" in r.reason


def test_history_gate_covers_every_variant_and_later_nights_are_ignored():
    prior = [night(i, {KEY_B: [100], KEY_V: [100]}) for i in range(1, 4)]
    prior.append(night(29, {KEY_B: [10], KEY_V: [10]}))    # after tonight: not history
    t = night(28, {KEY_B: [100], KEY_V: [80]}, run_id="tonight")
    res = evaluate(prior, t, hist_settings())
    assert only(res, variant="baseline").status == "pass"
    assert only(res, variant="patched").status == "fail"
    res = evaluate(prior, t, hist_settings(variants=["baseline"]))
    assert [r.variant for r in res] == ["baseline"]


def test_history_consecutive_nights_judges_the_streak_against_the_nights_before_it():
    steady = [[100]] * 5
    s = hist_settings(consecutive_nights=2)
    [r] = evaluate(series(steady), tonight([90]), s)          # first bad night
    assert r.status == "warn" and r.nights_held == 1 and r.nights_needed == 2
    [r] = evaluate(series(steady + [[90]]), tonight([90]), s)  # second bad night in a row
    assert r.status == "fail" and r.nights_held == 2
    assert r.reference == 100 and (r.band_low, r.band_high) == (100, 100)
    [r] = evaluate(series(steady + [[90]] + [[100]] * 6), tonight([90]), s)  # streak broken
    assert r.status == "warn" and r.nights_held == 1
    # documented limit: the band is [min, max] of the window, so the bad night 6 (90) that is
    # still in tonight's window hides a repeat of the same step (a step detector, not a level alarm)
    [r] = evaluate(series(steady + [[90], [100]]), tonight([90]), s)
    assert r.status == "pass" and (r.band_low, r.band_high) == (90, 100)


# ---------------------------------------------------------------------------------------------
# same-run gate


def same_run_night(i: int, change: float | None, lo: float | None, hi: float | None,
                   run_id: str | None = None, verdict: str = "regressed") -> Night:
    return night(i, {KEY_B: [100.0], KEY_V: [100.0 * (1 + (change or 0) / 100)]},
                 {KEY_V: Comparison("baseline", change, lo, hi, "t on log ratio (n=3)", verdict)},
                 run_id=run_id)


def sr_settings(**gate_kw) -> NightlySettings:
    return hist_settings(**({"against": "same_run"} | gate_kw))


@pytest.mark.parametrize("change, lo, hi, status", [
    (-8.0, -12.0, -4.0, "fail"),       # beyond 5 %, interval below zero
    (-8.0, -15.0, 2.0, "pass"),        # beyond 5 %, interval includes zero: noise
    (-3.0, -4.0, -2.0, "pass"),        # significant but within the threshold
    (+8.0, 4.0, 12.0, "pass"),         # an improvement
    (-8.0, None, None, "skipped"),     # no interval (one repeat), interval required
    (None, None, None, "skipped"),     # incomplete
])
def test_same_run_gate(change, lo, hi, status):
    [r] = evaluate([], same_run_night(28, change, lo, hi, "tonight"), sr_settings())
    assert (r.kind, r.variant, r.status) == ("same_run", "patched", status)
    assert (r.change_pct, r.ci_low_pct, r.ci_high_pct) == (change, lo, hi)
    if status == "fail":
        assert r.value == pytest.approx(92.0) and r.reference == 100.0
        assert "-8.00 %" in r.reason and "[-12.00 %, -4.00 %]" in r.reason


def test_same_run_without_interval_requirement():
    t = same_run_night(28, -8.0, None, None, "tonight")
    [r] = evaluate([], t, sr_settings(require_ci_excludes_zero=False))
    assert r.status == "fail"


def test_same_run_lower_is_better():
    key = ("patched", "serving", ITL)
    t = night(28, {("baseline", "serving", ITL): [50.0], key: [55.0]},
              {key: Comparison("baseline", 10.0, 4.0, 16.0)}, run_id="tonight")
    [r] = evaluate([], t, sr_settings(metric=ITL))
    assert r.status == "fail" and r.better == "lower"


def test_same_run_consecutive_nights():
    s = sr_settings(consecutive_nights=3)
    bad = lambda i: same_run_night(i, -8.0, -12.0, -4.0)  # noqa: E731
    good = lambda i: same_run_night(i, -1.0, -3.0, 1.0)  # noqa: E731
    t = same_run_night(28, -8.0, -12.0, -4.0, "tonight")
    [r] = evaluate([good(1), bad(2), bad(3)], t, s)
    assert r.status == "fail" and r.nights_held == 3 and "on 3 nights in a row" in r.reason
    [r] = evaluate([bad(1), good(2), bad(3)], t, s)
    assert r.status == "warn" and r.nights_held == 2
    assert "held on 2 of the 3 nights" in r.reason
    [r] = evaluate([bad(3)], t, s)                         # not enough nights yet
    assert r.status == "warn" and r.nights_held == 2


def test_aa_variants_are_not_gated_against_the_baseline():
    t = same_run_night(28, -8.0, -12.0, -4.0, "tonight")
    t.aa_variants = ["patched"]
    assert evaluate([], t, sr_settings()) == []


def test_gate_on_an_absent_metric_or_unknown_direction_is_missing():
    t = same_run_night(28, -8.0, -12.0, -4.0, "tonight")
    res = evaluate([], t, hist_settings(metric="serving.nonexistent_ms", against="both"))
    assert [(r.kind, r.status) for r in res] == [("same_run", "missing"), ("history", "missing")]
    assert "output_throughput_tok_s" in res[0].reason          # lists what the run has
    t.values[("baseline", "serving", "weird")] = [1.0]
    [r] = evaluate([], t, hist_settings(metric="weird"))
    assert r.status == "missing" and "direction" in r.reason


def test_evaluate_accepts_a_compare_json_dict_and_an_open_history(tmp_path):
    cmp = {"schema": 1, "run_id": "20260128T030000Z-c", "baseline": "baseline",
           "variants": ["patched"], "aa_variants": [],
           "metrics": [{"suite": "serving", "metric": TPUT, "unit": "tok/s", "better": "higher",
                        "variant": "patched", "baseline_median": 100.0, "variant_median": 92.0,
                        "baseline_repeats": [100.0, 99.0, 101.0],
                        "variant_repeats": [92.0, 91.0, 93.0], "change_pct": -8.0,
                        "ci_low_pct": -9.5, "ci_high_pct": -6.5, "ci_method": "t",
                        "verdict": "regressed", "notes": []}]}
    t = night_from_compare(cmp)
    assert t.config_name == "c" and t.night_utc == "2026-01-28T03:00:00Z"
    assert t.values[KEY_V] == [92.0, 91.0, 93.0]
    with History(tmp_path / "h.sqlite") as h:
        for n in series([[100, 99, 101]] * 3):
            n.values[KEY_V] = [100.0]
            h.record(n)
        res = evaluate(h, cmp, NightlySettings(gates=[Gate(metric=TPUT, threshold_pct=5)]))
    assert only(res, kind="same_run").status == "fail"
    hist_b = only(res, kind="history", variant="baseline")
    assert hist_b.status == "pass" and hist_b.n_history == 3 and hist_b.change_pct == 0.0
    hist_v = only(res, kind="history", variant="patched")
    assert hist_v.status == "fail" and hist_v.change_pct == pytest.approx(-8.0)


# ---------------------------------------------------------------------------------------------
# the job on synthetic run folders


def make_night(root: Path, day: int, base: list[float], var: list[float], change: float,
               lo: float, hi: float, name: str = "nightly-test") -> Path:
    """A run folder for night `day` with hand-written compare.json (change/interval given)."""
    run_id = f"202601{day:02d}T030000Z-{name}"
    run = make_run(root, run_id=run_id, name=name,
                   metrics={"serving": {TPUT: {"baseline": base, "patched": var}}})
    m = records.read_json(run / "manifest.json")
    m["started_at"] = f"2026-01-{day:02d}T03:00:00Z"
    records.write_json(run / "manifest.json", m)
    srt = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731  (median of an odd count)
    records.write_json(run / "compare.json", {
        "schema": 1, "run_id": run_id, "baseline": "baseline", "variants": ["patched"],
        "aa_variants": [],
        "metrics": [{"suite": "serving", "metric": TPUT, "unit": "tok/s", "better": "higher",
                     "variant": "patched", "baseline_median": srt(base),
                     "variant_median": srt(var), "baseline_repeats": base,
                     "variant_repeats": var, "change_pct": change, "ci_low_pct": lo,
                     "ci_high_pct": hi, "ci_method": "t on log ratio (n=3)",
                     "noise_floor_pct": None, "verdict": "", "notes": []}]})
    return run


JOB = NightlySettings(window_nights=7, min_history_nights=2,
                      gates=[Gate(metric=f"serving.{TPUT}", threshold_pct=5)])
CLEAN = ([100.0, 101.0, 99.0], [100.0, 101.0, 100.0], 0.3, -1.0, 1.5)


def test_job_nights_clean_variant_slow_both_slow(tmp_path):
    h = tmp_path / "h.sqlite"
    for day in (1, 2):
        out = nightly_on_run(make_night(tmp_path, day, *CLEAN), JOB, history=h)
        assert out.exit_code == 0, out.problems
    # night 3: only the variant slows down -> same-run gate
    run3 = make_night(tmp_path, 3, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0], -10.0, -11.5, -8.5)
    out = nightly_on_run(run3, JOB, history=h)
    assert out.exit_code == 1
    fail = {(r.kind, r.variant) for r in out.results if r.status == "fail"}
    assert fail == {("same_run", "patched"), ("history", "patched")}
    md = (run3 / "nightly.md").read_text()
    assert md.startswith("# Nightly nightly-test: REGRESSION")
    assert f"**serving.{TPUT}** (patched, same-run): 90 tok/s vs 100 tok/s" in md
    assert "-10.00 %" in md
    js = json.loads((run3 / "nightly.json").read_text())
    assert js["exit_code"] == 1 and js["history"]["recorded"] is True
    assert js["history"]["nights_before"] == 2
    assert {(f["kind"], f["variant"]) for f in js["failing"]} == fail
    assert (run3 / f"plots/nightly-serving.{TPUT}.png").stat().st_size > 1000
    # night 4: baseline and variant both slow, same-run sees nothing -> history gate
    run4 = make_night(tmp_path, 4, [80.0, 81.0, 79.0], [80.0, 80.0, 81.0], 0.2, -1.0, 1.4)
    out = nightly_on_run(run4, JOB, history=h)
    assert out.exit_code == 1
    r = only(out.results, kind="history", variant="baseline")
    assert r.status == "fail" and r.reference == 100.0 and r.value == 80.0
    assert r.change_pct == pytest.approx(-20.0)
    assert only(out.results, kind="same_run").status == "pass"
    # night 5: clean again
    out = nightly_on_run(make_night(tmp_path, 5, *CLEAN), JOB, history=h)
    assert out.exit_code == 0, [r.reason for r in out.results if r.status != "pass"]
    assert "no regression" in (tmp_path / "20260105T030000Z-nightly-test/nightly.md").read_text()
    with History(h) as hh:
        assert hh.count_nights("nightly-test") == 5


def test_rerunning_a_night_does_not_count_it_twice(tmp_path):
    h = tmp_path / "h.sqlite"
    run = make_night(tmp_path, 1, *CLEAN)
    nightly_on_run(run, JOB, history=h)
    out = nightly_on_run(run, JOB, history=h)
    assert json.loads((run / "nightly.json").read_text())["history"]["already_recorded"] is True
    assert out.exit_code == 0
    with History(h) as hh:
        assert hh.count_nights() == 1


def test_locked_history_exits_3_keeps_the_night_and_record_only_appends_it(tmp_path, capsys):
    h = tmp_path / "h.sqlite"
    for day in (1, 2):
        nightly_on_run(make_night(tmp_path, day, *CLEAN), JOB, history=h)
    run3 = make_night(tmp_path, 3, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0], -10.0, -11.5, -8.5)
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
    assert f"runner.py nightly --record-only {run3} --history {h}" in md
    assert "and 1 regression(s)" in md                   # the same-run gate still ran
    assert only(out.results, kind="same_run").status == "fail"
    with History(h) as hh:
        assert hh.count_nights() == 2                    # nothing half-written
    rc = cli(["--record-only", str(run3), "--history", str(h)])
    assert rc == 0 and "recorded 20260103T030000Z-nightly-test" in capsys.readouterr().out
    with History(h) as hh:
        assert [n.run_id for n in hh.nights("nightly-test")][-1] == run3.name


def test_corrupted_history_exits_3_and_is_left_untouched(tmp_path):
    h = tmp_path / "h.sqlite"
    h.write_bytes(b"garbage" * 100)
    run = make_night(tmp_path, 1, *CLEAN)
    out = nightly_on_run(run, JOB, history=h)
    assert out.exit_code == 3
    assert h.read_bytes() == b"garbage" * 100
    md = (run / "nightly.md").read_text()
    assert "not a readable SQLite database" in md and str(h) in md
    js = json.loads((run / "nightly.json").read_text())
    assert js["history"]["recorded"] is False and js["night"]["values"]


def test_failed_cells_exit_4(tmp_path):
    run = make_night(tmp_path, 1, *CLEAN)
    records.write_json(run / "patched/rep1/cell.json", {"variant": "patched", "repeat": 1,
                                                        "status": "failed", "error": "server died"})
    out = nightly_on_run(run, JOB, history=tmp_path / "h.sqlite")
    assert out.exit_code == 4
    assert "server died" in (run / "nightly.md").read_text()


def test_gate_config_error_exits_2(tmp_path):
    run = make_night(tmp_path, 1, *CLEAN)
    s = NightlySettings(gates=[Gate(metric="serving.no_such_ms", threshold_pct=5)])
    assert nightly_on_run(run, s, history=tmp_path / "h.sqlite").exit_code == 2


def test_trend_plot_has_title_units_legend_and_run_id():
    prior = series([[100, 101], [99, 100], [102, 101]])
    t = tonight([90, 91])
    res = evaluate(prior, t, hist_settings())
    fig = plot_trend(prior, t, "serving", TPUT, res, hist_settings())
    ax = fig.axes[0]
    assert ax.get_title() == f"serving.{TPUT}: nightly trend (c)"
    assert ax.get_xlabel() == "night (UTC)" and ax.get_ylabel() == f"{TPUT} [tok/s]"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["baseline: nightly median", "baseline: band of last 3 nights",
                      "baseline: tonight (REGRESSION)"]
    assert any(x.get_text() == "run tonight" for x in fig.texts)
    import matplotlib.pyplot as plt
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# command line


def _fake_bench(monkeypatch, run_bench):
    fake = types.ModuleType("patchbench.bench")

    class EnvironmentNotReady(RuntimeError):
        pass

    class RunFailed(RuntimeError):
        pass

    fake.EnvironmentNotReady, fake.RunFailed = EnvironmentNotReady, RunFailed
    fake.run_bench = lambda path, **kw: run_bench(fake, path)
    monkeypatch.setitem(sys.modules, "patchbench.bench", fake)
    monkeypatch.setattr(patchbench, "bench", fake, raising=False)
    return fake


def _cli_config(tmp_path: Path) -> Path:
    return _write_config(tmp_path, {"history_path": str(tmp_path / "cfg-history.sqlite"),
                                    "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5}]})


def test_cli_runs_the_config_records_and_gates(tmp_path, monkeypatch):
    monkeypatch.delenv(HISTORY_ENV, raising=False)
    cfg = _cli_config(tmp_path)
    runs = iter([make_night(tmp_path, d, *CLEAN) for d in (1, 2)]
                + [make_night(tmp_path, 3, [100.0, 101.0, 99.0], [90.0, 91.0, 89.0],
                              -10.0, -11.5, -8.5)])
    seen = []
    _fake_bench(monkeypatch, lambda fake, path: seen.append(path) or next(runs))
    assert [cli([str(cfg)]) for _ in range(3)] == [0, 0, 1]
    assert seen == [str(cfg)] * 3
    with History(tmp_path / "cfg-history.sqlite") as h:   # the config's history_path
        assert h.count_nights("nightly-test") == 3


def test_cli_environment_and_run_failures(tmp_path, monkeypatch):
    cfg = _cli_config(tmp_path)

    def env(fake, path):
        raise fake.EnvironmentNotReady("sglang 0.5.23 installed, config pins 0.5.1.post3")
    _fake_bench(monkeypatch, env)
    assert cli([str(cfg), "--history", str(tmp_path / "h.sqlite")]) == 3

    def failed(fake, path):
        raise fake.RunFailed("every cell failed")
    _fake_bench(monkeypatch, failed)
    assert cli([str(cfg), "--history", str(tmp_path / "h.sqlite")]) == 4

    partial = make_night(tmp_path, 1, *CLEAN)

    def failed_with_folder(fake, path):
        e = fake.RunFailed("cell patched/rep1 failed")
        e.run_dir = partial
        raise e
    _fake_bench(monkeypatch, failed_with_folder)
    assert cli([str(cfg), "--history", str(tmp_path / "h.sqlite")]) == 4
    assert "cell patched/rep1 failed" in (partial / "nightly.md").read_text()
    assert not (tmp_path / "cfg-history.sqlite").exists()   # --history won over the config


def test_cli_usage_errors(tmp_path):
    assert cli([]) == 2
    assert cli([str(tmp_path / "missing.yaml")]) == 2
    assert cli(["--record-only", str(tmp_path / "nope")]) == 2
    assert cli(["--bogus"]) == 2


def test_cli_from_run_uses_settings_of_the_run_manifest(tmp_path):
    run = make_night(tmp_path, 1, *CLEAN)
    m = records.read_json(run / "manifest.json")
    m["config"]["nightly"] = {"gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5,
                                         "against": "same_run"}]}
    records.write_json(run / "manifest.json", m)
    assert cli(["--from-run", str(run), "--history", str(tmp_path / "h.sqlite")]) == 0
    js = json.loads((run / "nightly.json").read_text())
    assert [g["kind"] for g in js["gates"]] == ["same_run"]


# ---------------------------------------------------------------------------------------------
# end to end on the CPU (needs the runner and configs/demo-cpu.yaml)

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo-cpu.yaml"
FBI = "sglang/srt/model_executor/forward_batch_info.py"
SLOW_CODE = """
# patchbench nightly e2e ({tag}): every forward batch waits 0.3 s (a deliberate slowdown)
import time as _pb_time
_pb_init_new = ForwardBatch.init_new.__func__


def _pb_slow_init_new(cls, *args, **kwargs):
    _pb_time.sleep(0.3)
    return _pb_init_new(cls, *args, **kwargs)


ForwardBatch.init_new = classmethod(_pb_slow_init_new)
"""
SLOW, SLOW2 = "nightly-slowdown", "nightly-slowdown-2"
E2E_METRIC = "itl_median_ms"


def _patches_with_slowdown(dest: Path, version: str) -> Path:
    """A copy of patches/ plus two test patches that append SLOW_CODE to forward_batch_info.py of
    the installed sglang (the same slowdown under two names, so two variants that both carry it
    are not an A/A pair); applied through the normal overlay machinery."""
    import hashlib

    import sglang

    from patchbench.patchset import unified_diff
    shutil.copytree(REPO / "patches", dest)
    old = (Path(sglang.__file__).parent.parent / FBI).read_bytes()
    for name in (SLOW, SLOW2):
        new = old + SLOW_CODE.format(tag=name).encode()
        d = dest / name
        d.mkdir()
        (d / f"{version}.diff").write_text(unified_diff(FBI, old, new))
        (d / "manifest.yaml").write_text(yaml.safe_dump({
            "name": name, "description": "test only: 0.3 s per forward batch",
            "releases": {version: {"diff": f"{version}.diff", "files": {FBI: {
                "before": hashlib.sha256(old).hexdigest(),
                "after": hashlib.sha256(new).hexdigest()}}}}}))
    return dest


def _e2e_config(folder: Path, name: str, slow: str | None) -> Path:
    """The demo config as one nightly series, serving suite only, one repeat: variants
    ``baseline`` and ``candidate``. Clean: stock vs null-comment; slow == "variant": the candidate
    carries the slowdown; slow == "both": both carry it (under two names). Gate: median ITL,
    +300 %, no interval required (one repeat). Why so coarse: on the shared 2-core CI machine,
    baseline vs null-comment cells measured output throughput -15 %, -60 %, -75 % (TTFT swings of
    seconds under load) and median ITL +43 % / -73 %; the slowdown adds 300 ms to every decode step
    (median ITL from ~20 ms to ~300 ms, +1000 % or more), far beyond that noise."""
    raw = yaml.safe_load(DEMO.read_text())
    raw["name"] = name
    raw["variants"] = {"baseline": [SLOW] if slow == "both" else [],
                       "candidate": [{None: "null-comment", "variant": SLOW, "both": SLOW2}[slow]]}
    raw["baseline"] = "baseline"
    raw["schedule"] = {"repeats": 1, "order": "interleaved"}
    raw["suites"] = {"serving": (raw.get("suites") or {}).get("serving") or {}}
    raw["nightly"] = {"window_nights": 7, "min_history_nights": 2,
                      "gates": [{"metric": f"serving.{E2E_METRIC}", "threshold_pct": 300,
                                 "require_ci_excludes_zero": False}]}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.e2e
@pytest.mark.timeout(3600)
@pytest.mark.skipif(os.environ.get("PATCHBENCH_NIGHTLY_E2E") == "0",
                    reason="five real runs (10 server launches); PATCHBENCH_NIGHTLY_E2E=0 skips them")
def test_e2e_nightly_on_cpu(tmp_path, monkeypatch):
    """Two clean nights; a night where only the candidate slows down exits 1 through the same-run
    gate; a night where both slow down exits 1 through the history gate (the baseline's series);
    a clean night exits 0."""
    if not DEMO.is_file():
        pytest.skip(f"{DEMO} not there yet")
    bench = pytest.importorskip("patchbench.bench")
    import patchbench.config as pconfig
    version = yaml.safe_load(DEMO.read_text())["sglang"]
    monkeypatch.setattr(pconfig, "PATCHES_DIR", _patches_with_slowdown(tmp_path / "patches", version))
    h = tmp_path / "history.sqlite"
    monkeypatch.setenv(HISTORY_ENV, str(h))
    results = tmp_path / "results"
    real_run_bench = bench.run_bench
    from patchbench.server import free_port
    monkeypatch.setattr(bench, "run_bench", lambda path, **kw: real_run_bench(
        path, results_root=results, port=free_port(), **kw))
    name = "nightly-e2e"

    def last_nightly() -> dict:
        with History(h) as hh:
            return json.loads((Path(hh.nights(name)[-1].run_dir) / "nightly.json").read_text())

    clean = _e2e_config(tmp_path / "clean", name, None)
    assert cli([str(clean)]) == 0
    assert cli([str(clean)]) == 0
    assert cli([str(_e2e_config(tmp_path / "v", name, "variant"))]) == 1
    js = last_nightly()
    assert any(f["kind"] == "same_run" and f["variant"] == "candidate"
               and f["metric"] == E2E_METRIC for f in js["failing"]), js["gates"]
    assert cli([str(_e2e_config(tmp_path / "b", name, "both"))]) == 1
    js = last_nightly()
    assert any(f["kind"] == "history" and f["variant"] == "baseline"
               and f["metric"] == E2E_METRIC for f in js["failing"]), js["gates"]
    assert all(g["status"] != "fail" for g in js["gates"] if g["kind"] == "same_run")
    assert cli([str(clean)]) == 0, last_nightly()["gates"]
    with History(h) as hh:
        assert hh.count_nights(name) == 5
