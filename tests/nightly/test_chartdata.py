"""The dashboard's pure decisions (patchbench/nightly/chartdata.py), on hand-computed values."""

from __future__ import annotations

from patchbench.nightly import chartdata as cd
from patchbench.nightly.history import Point


def test_percent_change_against_the_reference_and_when_the_axis_goes_log():
    assert round(cd.pct_change(110.0, 100.0), 9) == 10.0
    assert round(cd.pct_change(135.0, 100.0), 9) == 35.0
    assert cd.pct_change(5.0, 0.0) is None and cd.pct_change(5.0, None) is None
    # ratios 0.9 .. 1.35: 1.5 wide, linear; a +150 % spike beside -10 %: 2.5 / 0.9 = 2.78, log
    assert cd.log_axis([-10.0, 35.0]) is False
    assert cd.log_axis([-10.0, 150.0]) is True
    assert cd.log_axis([-100.0, 10.0]) is False  # a ratio of 0 never goes log


def test_reference_from_the_nights_the_gate_used_red_nights_left_out():
    medians = {"a": 100.0, "b": 60.0, "c": 102.0, "d": 98.0, "e": 101.0}
    order = ["a", "b", "c", "d", "e"]
    # the gate's window (b was red, it left it out): median of 100, 102, 98 = 100
    assert cd.reference_of(medians, order, ["a", "c", "d"], set()) == (100.0, ["a", "c", "d"])
    # no history gate: the last k nights not left out: c, d, e -> 101
    assert cd.reference_of(medians, order, None, {"b"}, k=3) == (101.0, ["c", "d", "e"])
    # k=4: with b the nights b..e, median of 60, 102, 98, 101 = 99.5; without b a, c, d, e
    assert cd.reference_of(medians, order, None, set(), k=4) == (99.5, ["b", "c", "d", "e"])
    assert cd.reference_of(medians, order, None, {"b"}, k=4) == (100.5, ["a", "c", "d", "e"])
    assert cd.reference_of({}, [], None, set()) == (None, [])


def test_downsampling_keeps_the_last_nights_and_makes_weekly_medians_before():
    # 10 nights, one a day from Monday 2026-01-05; the last 3 at full resolution
    pts = [
        Point(f"r{i}", f"2026-01-{5 + i:02d}T03:00:00Z", float(i), float(i) - 1, float(i) + 1, 5)
        for i in range(10)
    ]
    index = cd.night_index([(p.run_id, p.night_utc) for p in pts])
    got = cd.downsample(pts, index, full=3)
    # week 2026-W02: nights 0..6 (Mon 5th to Sun 11th), but 7, 8, 9 are the last three
    assert [(c.x, c.median, c.low, c.high, len(c.run_ids)) for c in got] == [
        (3.0, 3.0, 0.0, 6.0, 7),
        (7, 7.0, 6.0, 8.0, 1),
        (8, 8.0, 7.0, 9.0, 1),
        (9, 9.0, 8.0, 10.0, 1),
    ]
    assert got[0].label == "week 2026-W02: median of 7 night(s)"
    assert [c.run_ids for c in cd.downsample(pts, index, full=90)] == [[p.run_id] for p in pts]


def test_night_axis_gives_a_rerun_its_own_place():
    ax = cd.night_index([("n1", "2026-01-05T03:00:00Z"), ("n1b", "2026-01-05T03:40:00Z")])
    assert ax == {"n1": 0, "n1b": 1}


def test_metric_order_primaries_first_and_words():
    ms = [("serving", "itl_p99_ms"), ("serving", "ttft_median_ms"), ("mmmu", "accuracy"),
          ("serving", "output_throughput_tok_s"), ("serving", "duration_s")]  # fmt: skip
    got = cd.metric_order(ms, gated={("serving", "ttft_median_ms")},
                          primary={("serving", "output_throughput_tok_s")})  # fmt: skip
    assert got == [
        ("gated", ("serving", "ttft_median_ms")),
        ("primary", ("serving", "output_throughput_tok_s")),
        ("other", ("mmmu", "accuracy")),
        ("other", ("serving", "duration_s")),
        ("other", ("serving", "itl_p99_ms")),
    ]
    assert cd.metric_words("serving", "ttft_median_ms") == "Median TTFT"
    assert cd.metric_words("serving", "output_throughput_tok_s") == "Output token throughput"
    assert cd.metric_words("nosuchsuite", "queue_wait_ms") == "queue wait"


def test_nights_table_paging_keeps_older_pages_stable():
    shown, pages = cd.night_pages(1234, shown=30, per_page=500)
    assert shown == range(1204, 1234)
    assert pages == [range(0, 500), range(500, 1000), range(1000, 1204)]
    # a night more: the older pages but the newest stay as they were
    shown2, pages2 = cd.night_pages(1235, shown=30, per_page=500)
    assert pages2[:2] == pages[:2] and pages2[2] == range(1000, 1205)
    assert cd.night_pages(12) == (range(0, 12), [])


def test_patch_state_short_and_paths_relative_to_the_site():
    builds = [{"variant": "stock", "state": ""},
              {"variant": "patched", "state": "applies", "detail": "verified against 0.5.23"},
              {"variant": "patched-b", "state": "applies", "detail": "x" * 80}]  # fmt: skip
    assert cd.short_patch(builds) == "patched: applies, patched-b: applies"
    assert cd.short_patch(builds, limit=20) == "patched: applies, p…"
    text = "History: `/var/lib/pb/h.sqlite` run `/srv/runs/R1/plots/a.png` other /opt/x/y.log"
    got = cd.site_text(text, {"/srv/runs/R1": ".", "/var/lib/pb/h.sqlite": "h.sqlite"})
    assert got == "History: `h.sqlite` run `./plots/a.png` other …/y.log"
    assert cd.site_text("see https://example.org/a/b", {}) == "see https://example.org/a/b"
