"""Nothing invalid enters the history's readers: a value a suite marked (its run
incomplete, e.g. streams a stall bunched; a metric withheld) is stored with its status and read
as no value, so gates, references, the learned noise, the trend plot and the page's error bars
are computed from the valid values only. Synthetic run folders; nothing starts a server."""

from __future__ import annotations

import math
import sqlite3

import pytest

from patchbench import records
from patchbench.config.nightly import Gate, NightlySettings
from patchbench.nightly.gates import evaluate
from patchbench.nightly.history import History, SetAside, dump_json, night_from_run, series
from patchbench.nightly.noise import learn
from patchbench.nightly.trend import plot_trend
from tests.synthetic import make_run

TPOT = "tpot_median_ms"
KEY = ("baseline", "serving", TPOT)
BUNCHED = "bunched: 20 of 20 requests got all tokens in one read (...)"


def _night(tmp_path, day: int, vals, *, incomplete=(), withheld=()):
    """Night ``day`` of Jan 2026: the baseline's median TPOT per repeat (ms); the repeats in
    ``incomplete`` are runs the suite found bunched, those in ``withheld`` left TPOT out."""
    run_id = f"202601{day:02d}T030000Z-nightly-test"
    run = make_run(
        tmp_path,
        run_id=run_id,
        name="nightly-test",
        variants={"baseline": []},
        metrics={"serving": {TPOT: {"baseline": vals}}},
        suite_status={("baseline", k, "serving"): "incomplete" for k in incomplete},
        meta={("baseline", k, "serving"): {"not_judged": {TPOT: "withheld"}} for k in withheld},
    )
    for k in incomplete:
        p = run / "baseline" / f"rep{k}" / "serving" / "summary.json"
        records.write_json(p, dict(records.read_json(p), errors=[BUNCHED]))
    m = records.read_json(run / "manifest.json")
    m["started_at"] = f"2026-01-{day:02d}T03:00:00Z"
    records.write_json(run / "manifest.json", m)
    return night_from_run(run)


@pytest.fixture
def history(tmp_path):
    """Five nights of TPOT (ms): night 3 stalled (every repeat bunched: 0.011-0.013 ms), night 2
    with one stalled repeat (0.012 ms), night 4 with one repeat withheld; all recorded."""
    nights = [
        _night(tmp_path, 1, [5.0, 5.1, 5.2]),
        _night(tmp_path, 2, [5.1, 5.2, 5.3, 0.012], incomplete=[3]),
        _night(tmp_path, 3, [0.013, 0.011, 0.012], incomplete=[0, 1, 2]),
        _night(tmp_path, 4, [5.2, 5.3, 5.4, None], withheld=[3]),
    ]
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        for n in nights:
            assert h.record(n)
    return path


def test_marked_values_are_stored_as_such_and_read_as_no_value(history):
    with History(history) as h:
        n1, n2, n3, n4 = h.nights("nightly-test")
    assert n1.values[KEY] == [5.0, 5.1, 5.2] and n1.set_aside == {}
    assert n2.values[KEY] == [5.1, 5.2, 5.3, None]
    assert n2.set_aside[KEY] == {3: SetAside("incomplete", 0.012, BUNCHED)}
    assert n2.median(KEY) == 5.2  # not 5.15, the median with 0.012
    assert n3.values[KEY] == [None, None, None] and n3.median(KEY) is None
    assert n3.set_aside[KEY][1] == SetAside("incomplete", 0.011, BUNCHED)
    assert n3.status == "partial"
    assert n4.values[KEY] == [5.2, 5.3, 5.4, None]
    assert n4.set_aside[KEY] == {3: SetAside("withheld", None, "withheld")}
    con = sqlite3.connect(history)
    rows = con.execute(
        "SELECT repeat, value, status FROM repeat_values WHERE run_id LIKE '20260103%' "
        "AND metric = ? ORDER BY repeat",
        (TPOT,),
    ).fetchall()
    medians = con.execute(
        "SELECT median, n_repeats FROM metric_values WHERE metric = ? ORDER BY run_id", (TPOT,)
    ).fetchall()
    con.close()
    assert rows == [(0, 0.013, "incomplete"), (1, 0.011, "incomplete"), (2, 0.012, "incomplete")]
    assert medians == [(5.1, 3), (5.2, 3), (None, 0), (5.3, 3)]


def test_noise_gate_trend_and_page_use_only_valid_values(tmp_path, history):
    """By hand, from nights 1, 2 and 4 without their marked repeats:

    - noise: the run sigma is the median of the 9 within-night |log ratios| (3 a night: log
      5.1/5.0, 5.2/5.0, 5.2/5.1; 5.2/5.1, 5.3/5.1, 5.3/5.2; 5.3/5.2, 5.4/5.2, 5.4/5.3), the 5th
      smallest, log(5.2/5.1), over sqrt(2) Phi^-1(0.75); 3 nights learned from;
    - history gate: the window is nights 1, 2, 4; reference = median of their medians (5.1, 5.2,
      5.3) = 5.2 (5.15 with the stalled night's median 0.012);
    - trend: the nightly medians 5.1, 5.2, 5.3; the runs' band 5.0 to 5.4;
    - page: one point a valid night, (median, min, max) its error bar."""
    tonight = _night(tmp_path, 5, [5.2, 5.2, 5.2])
    with History(history) as h:
        prior = h.nights("nightly-test")
    noise = learn(prior, "serving", TPOT, min_nights=3)
    assert noise.source == "learned" and noise.nights == 3
    assert noise.run.sigma == pytest.approx(
        math.log(5.2 / 5.1) / (math.sqrt(2) * 0.6744897501960817), rel=1e-12
    )
    gate = Gate(metric=f"serving.{TPOT}", threshold_pct=5, against="history")
    s = NightlySettings(window_nights=5, min_history_nights=3, learn_min_nights=365, gates=[gate])
    (r,) = evaluate(prior, tonight, s)
    assert r.n_history == 3 and r.reference == pytest.approx(5.2)
    assert [x[:8] for x in r.window_run_ids] == ["20260101", "20260102", "20260104"]
    assert r.value == 5.2  # the median of tonight's three runs

    fig = plot_trend(prior, tonight, "serving", TPOT, [r], s)
    ax = fig.axes[0]
    assert list(ax.lines[0].get_ydata()) == pytest.approx([5.1, 5.2, 5.3])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert (band.min(), band.max()) == pytest.approx((5.0, 5.4))

    pts = [(p.run_id[:8], p.median, p.low, p.high, p.n) for p in series(prior, *KEY)]
    assert pts == [
        ("20260101", 5.1, 5.0, 5.2, 3),
        ("20260102", 5.2, 5.1, 5.3, 3),
        ("20260104", 5.3, 5.2, 5.4, 3),
    ]


def test_tonight_marked_values_are_no_value_and_named_in_nightly_json(tmp_path):
    n = _night(tmp_path, 6, [5.0, 0.012, 5.2], incomplete=[1])
    assert n.values[KEY] == [5.0, None, 5.2] and n.median(KEY) == 5.1
    js = dump_json(n)
    assert js["values"]["baseline/serving/" + TPOT]["n"] == 2
    assert js["set_aside"]["baseline/serving/" + TPOT] == {
        "1": {"status": "incomplete", "value": 0.012, "reason": BUNCHED}
    }


def test_a_version_2_file_gains_the_status_columns(tmp_path):
    """A history written before the statuses: its values stay valid, new nights store theirs."""
    path = tmp_path / "h.sqlite"
    with History(path) as h:
        h.record(_night(tmp_path, 1, [5.0, 5.1, 5.2]))
    con = sqlite3.connect(path)
    con.executescript(
        "ALTER TABLE repeat_values DROP COLUMN status; ALTER TABLE repeat_values DROP COLUMN "
        "reason; UPDATE meta SET value = '2' WHERE key = 'schema_version';"
    )
    con.close()
    with History(path) as h:
        assert h.schema_version == 4
        h.record(_night(tmp_path, 2, [5.1, 0.012], incomplete=[1]))
        n1, n2 = h.nights("nightly-test")
    assert n1.values[KEY] == [5.0, 5.1, 5.2] and n1.set_aside == {}
    assert n2.values[KEY] == [5.1, None] and n2.set_aside[KEY][1].status == "incomplete"
