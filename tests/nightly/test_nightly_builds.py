"""The newest sglang every night: the release and patch state per night (history ``night_builds``),
a release change named as a step's likely cause, a patch that stops applying, and the
confirmation run's rule and verdict, on synthetic run folders (tests.synthetic). The
confirmation on the fake server: test_nightly.py's
test_newest_sglang_night_and_its_confirmation_on_the_fake_server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from patchbench import records
from patchbench.analysis.build import compare_run
from patchbench.config import load_config
from patchbench.config.nightly import ConfirmSettings, Gate, NightlySettings
from patchbench.nightly import confirm
from patchbench.nightly.builds import (
    BuildRow,
    blocked,
    likely_causes,
    release_changes,
    releases_by_night,
    rows_of_run,
    without_variants,
)
from patchbench.nightly.history import (
    History,
    Night,
    read_confirmations,
    read_night_builds,
    record_confirmation,
    record_night_builds,
)
from patchbench.nightly.job import nightly_on_run
from tests.synthetic import make_run

ITL = "itl_median_ms"
TPUT = "output_throughput_tok_s"


def make_build_night(
    root: Path,
    stamp: str,
    sglang: str,
    values: dict[str, list[float]],
    *,
    name: str = "nightly-builds",
    metric: str = ITL,
    variants: dict[str, list[str]] | None = None,
) -> Path:
    """A run folder started at ``stamp`` (``2026-11-28T03:00:00Z``) on sglang ``sglang``:
    serving ``metric`` per repeat of each variant (``values``; ``baseline`` first), with its
    report's compare.json (2 pairs decide: ``compare.min_repeats`` 2)."""
    variants = variants or {"baseline": [], "candidate": ["slow-patch"]}
    run_id = stamp.replace("-", "").replace(":", "") + f"-{name}"
    run = make_run(
        root,
        run_id=run_id,
        name=name,
        sglang=sglang,
        variants=variants,
        metrics={"serving": {metric: values}},
        compare={"min_repeats": 2},
    )
    m = records.read_json(run / "manifest.json")
    m["started_at"] = stamp
    m["ended_at"] = stamp.replace("T03:00", "T03:10")
    records.write_json(run / "manifest.json", m)
    compare_run(run)
    return run


SAME_RUN = NightlySettings(
    hold_while_learning=False,  # red in a young history: these tests judge the builds
    window_nights=7,
    min_history_nights=2,
    min_repeats=2,
    false_red_nights_per_month=6,
    pass_alpha=0.2,
    gates=[Gate(metric=f"serving.{ITL}", threshold_pct=300, against="same_run")],
)


def green_nights(root: Path, h: Path, name: str = "nightly-builds", sglang: str = "0.5.1.post3"):
    """Two quiet nights on ``sglang`` gated through the job (green: the candidate equals stock)."""
    out = []
    for day in (27, 28):
        run = make_build_night(
            root,
            f"2026-11-{day}T03:00:00Z",
            sglang,
            {"baseline": [30.0, 31.0], "candidate": [30.5, 31.2]},
            name=name,
        )
        res = nightly_on_run(run, SAME_RUN, history=h, out=io.StringIO())
        assert res.outcome == "green", res.headline
        out.append(run)
    return out


def red_night_after_green(tmp_path: Path, release: str, settings=SAME_RUN):
    """Two green nights on 0.5.1.post3 (:func:`green_nights`), then tonight on ``release``
    with the candidate ten times slower, gated with ``settings``: (history path, run folder,
    the night's outcome)."""
    h = tmp_path / "h.sqlite"
    green_nights(tmp_path / "r", h)
    run = make_build_night(
        tmp_path / "r", "2026-11-30T03:00:00Z", release,
        {"baseline": [30.0, 31.0], "candidate": [300.0, 320.0]},
    )  # fmt: skip
    return h, run, nightly_on_run(run, settings, history=h, out=io.StringIO())


def builds_config(tmp_path: Path):
    """The night series' config (a :class:`patchbench.config.Config`) as the confirmation copies
    it: `sglang: latest`, the candidate with the slow patch, serving and MMMU."""
    import yaml

    cfg = tmp_path / "nightly-builds.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "nightly-builds", "sglang": "latest", "model": {"path": str(tmp_path)},
        "variants": {"baseline": [], "candidate": ["slow-patch"]},
        "suites": {"serving": {"num_prompts": 8}, "mmmu": {}}, "nightly": {"gates": []},
    }))  # fmt: skip
    return load_config(cfg, check_files=False)


# ---------------------------------------------------------------------------------------------
# the builds of a night


def test_rows_of_run_record_each_variants_release_and_verified_patches(tmp_path):
    run = make_build_night(
        tmp_path, "2026-11-27T03:00:00Z", "0.5.23", {"baseline": [1, 1], "candidate": [1, 1]}
    )
    rows = rows_of_run(run)
    assert [(r.variant, r.sglang_release, r.patch, r.state) for r in rows] == [
        ("baseline", "0.5.23", "", ""),
        ("candidate", "0.5.23", "slow-patch", "applies"),
    ]
    assert rows[1].detail.startswith("verified: applied in the run")
    assert rows[0].summary == "stock" and rows[1].summary == "slow-patch applies"


def test_night_builds_table_is_created_on_first_write_and_read_per_config(tmp_path):
    h = tmp_path / "h.sqlite"
    green_nights(tmp_path / "r", h)
    with History(h) as hh:
        assert hh.schema_version == 4
        rows = read_night_builds(hh, "nightly-builds")
        assert {r["sglang_release"] for r in rows} == {"0.5.1.post3"} and len(rows) == 4
        assert set(rows[0]) == {"run_id", "variant", "sglang_release", "patch", "state", "detail"}
        run_id = rows[0]["run_id"]
        record_night_builds(hh, run_id, [{"variant": "baseline", "sglang_release": "0.5.23"}])
        assert read_night_builds(hh, run_id=run_id) == [
            {"run_id": run_id, "variant": "baseline", "sglang_release": "0.5.23", "patch": "",
             "state": None, "detail": None}
        ]  # fmt: skip
        assert read_night_builds(hh, "another-config") == []


def test_release_change_between_nights_is_named_as_the_steps_likely_cause(tmp_path):
    """Two nights on 0.5.22, then 0.5.23 with stock 6 % slower: the change point's first night is
    the release change's, and the summary says so."""
    nights = [
        Night(f"r{d}", f"2026-11-{d}T03:00:00Z", "c", "baseline", sglang_version=rel)
        for d, rel in ((28, "0.5.22"), (29, "0.5.22"), (30, "0.5.23"))
    ]
    for n in nights:
        n.values[("baseline", "serving", TPUT)] = [100.0]
    changes = release_changes(nights, releases_by_night(nights, []))
    assert changes == [
        {"variant": "baseline", "old": "0.5.22", "new": "0.5.23", "run_id": "r30",
         "night_utc": "2026-11-30T03:00:00Z"}
    ]  # fmt: skip
    step = {"variant": "baseline", "suite": "serving", "metric": TPUT, "run_id": "r30",
            "size_pct": -6.0}  # fmt: skip
    other = {**step, "run_id": "r29"}
    assert likely_causes(changes, [step, other]) == [
        f"sglang 0.5.22 -> 0.5.23 on 2026-11-30 coincides with the -6.0 % step in serving.{TPUT} "
        "(baseline)"
    ]
    # stored rows win over the night's own version
    stored = [{"run_id": "r30", "variant": "baseline", "sglang_release": "0.5.22"}]
    assert release_changes(nights, releases_by_night(nights, stored)) == []


def test_red_night_on_a_new_release_names_it_in_the_summary(tmp_path):
    h, run, res = red_night_after_green(tmp_path, "0.5.23")
    assert res.exit_code == 1
    assert res.causes == [
        "sglang 0.5.1.post3 -> 0.5.23 on 2026-11-30 coincides with tonight's +916.0 % "
        f"regression in serving.{ITL} (candidate, same-run gate)"
    ]
    js = json.loads((run / "nightly.json").read_text())
    assert js["likely_causes"] == res.causes
    assert {b["sglang_release"] for b in js["builds"]} == {"0.5.23"}
    md = (run / "nightly.md").read_text()
    assert "## sglang builds" in md and "| candidate | 0.5.23 | slow-patch | applies |" in md
    assert "Likely cause:" in md and res.causes[0] in md


# ---------------------------------------------------------------------------------------------
# a patch that stops applying


def test_patch_that_stops_applying_is_recorded_exits_2_and_stock_still_gates(tmp_path):
    """The candidate's patch conflicts on 0.5.23: the night ran stock only (the job's caller
    dropped the variant); the state with its hunk is recorded, the night exits 2 and says which
    patch, which hunk, which release; stock's history gate still judges."""
    h = tmp_path / "h.sqlite"
    settings = NightlySettings(
        hold_while_learning=False,
        window_nights=7,
        min_history_nights=2,
        min_repeats=2,
        false_red_nights_per_month=6,
        pass_alpha=0.2,
        gates=[
            Gate(
                metric=f"serving.{TPUT}", threshold_pct=5, against="history", variants=["baseline"]
            )
        ],  # fmt: skip
    )
    for day in (27, 28):
        run = make_build_night(
            tmp_path / "r", f"2026-11-{day}T03:00:00Z", "0.5.22",
            {"baseline": [100.0, 101.0], "candidate": [100.0, 101.0]}, metric=TPUT,
        )  # fmt: skip
        nightly_on_run(run, settings, history=h, out=io.StringIO())
    tonight = make_build_night(
        tmp_path / "r", "2026-11-30T03:00:00Z", "0.5.23", {"baseline": [100.5, 100.2]},
        metric=TPUT, variants={"baseline": []},
    )  # fmt: skip
    conflict = BuildRow(
        "candidate", "0.5.23", "slow-patch", "conflicts",
        "conflicts at sglang/srt/layers/rotary_embedding.py hunk 2",
    )  # fmt: skip
    out = io.StringIO()
    res = nightly_on_run(tonight, settings, history=h, out=out, blocked=blocked([conflict]))
    assert res.exit_code == 2
    assert res.headline.startswith("PATCH DOES NOT APPLY ('slow-patch' on sglang 0.5.23)")
    line = (
        "variant 'candidate' cannot run: patch 'slow-patch' no longer applies to sglang 0.5.23 "
        "(conflicts at sglang/srt/layers/rotary_embedding.py hunk 2)"
    )
    assert res.blocked == [line] and line in out.getvalue()
    [g] = [r for r in res.results if r.kind == "history"]
    assert g.status in ("pass", "quiet"), g.reason  # stock still judged
    md = (tonight / "nightly.md").read_text()
    assert "## Patch does not apply" in md and line in md
    with History(h) as hh:
        rows = read_night_builds(hh, run_id=tonight.name)
    assert ("candidate", "0.5.23", "slow-patch", "conflicts") in {
        (r["variant"], r["sglang_release"], r["patch"], r["state"]) for r in rows
    }
    assert "hunk 2" in next(r["detail"] for r in rows if r["state"] == "conflicts")


def test_without_variants_drops_the_blocked_variant_but_never_the_baseline(tmp_path):
    cfg = builds_config(tmp_path)
    out = without_variants(cfg, ["candidate"])
    assert list(out.variants) == ["baseline"] and list(cfg.variants) == ["baseline", "candidate"]
    assert out.source == cfg.source and out.baseline == "baseline"
    with pytest.raises(ValueError, match="baseline"):
        without_variants(cfg, ["baseline"])


# ---------------------------------------------------------------------------------------------
# the confirmation run: its rule and its verdict


def _rows(release: str, state: str = "applies") -> list[dict]:
    return [
        {"variant": "baseline", "sglang_release": release, "patch": "", "state": ""},
        {"variant": "candidate", "sglang_release": release, "patch": "p", "state": state},
    ]


def test_confirmation_runs_only_for_a_red_night_whose_build_differs_from_last_green():
    green = Night("g", "2026-11-28T03:00:00Z", "c", "baseline")
    old = _rows("0.5.22")
    assert confirm.should_confirm("red", _rows("0.5.23"), green, old)[0]  # release differs
    assert confirm.should_confirm("red", _rows("0.5.22", "contained"), green, old)[0]  # patch
    ok, why = confirm.should_confirm("red", _rows("0.5.22"), green, old)  # same build
    assert not ok and "same sglang release and patch state" in why
    ok, why = confirm.should_confirm("green", _rows("0.5.23"), green, old)
    assert not ok and "not red" in why
    assert not confirm.should_confirm("underpowered", _rows("0.5.23"), green, old)[0]
    assert not confirm.should_confirm("red", _rows("0.5.23"), None, [])[0]
    ok, why = confirm.should_confirm("red", _rows("0.5.23"), green, old, enabled=False)
    assert not ok and "enabled: false" in why


def test_last_green_is_the_newest_night_whose_nightly_json_says_green(tmp_path):
    nights = []
    for i, outcome in enumerate(("green", "green", "red", None)):
        d = tmp_path / f"n{i}"
        d.mkdir()
        if outcome:
            (d / "nightly.json").write_text(json.dumps({"outcome": outcome}))
        nights.append(Night(f"n{i}", f"2026-11-2{i}T03:00:00Z", "c", "b", run_dir=str(d)))
    assert confirm.last_green(nights).run_id == "n1"
    assert confirm.last_green(nights[2:]) is None


def _confirm_night(old: list[float], new: list[float]) -> Night:
    n = Night("c", "2026-11-30T04:00:00Z", "c-confirm", confirm.OLD)
    n.values[(confirm.OLD, "serving", TPUT)] = old
    n.values[(confirm.NEW, "serving", TPUT)] = new
    return n


def test_confirmation_verdict_text_confirmed_and_not_confirmed():
    night = _confirm_night([100.0, 101.0, 99.0, 100.5], [93.9, 94.8, 93.0, 94.3])
    r = confirm.paired_result(night, "serving", TPUT, "higher", 0.001, "0.5.22", "0.5.23")
    assert r["verdict"] == "confirmed" and r["p_value"] < 0.001
    assert r["change_pct"] == pytest.approx(-6.1, abs=0.1)
    assert r["ci_low_pct"] < r["change_pct"] < r["ci_high_pct"] < 0
    assert r["text"].startswith(
        f"serving.{TPUT}: confirmed: tonight's 0.5.23 is -6.1% [{r['ci_low_pct']:+.1f}, "
        f"{r['ci_high_pct']:+.1f}] vs last green 0.5.22, p="
    )
    noisy = _confirm_night([100.0, 90.0], [95.0, 97.0])
    r = confirm.paired_result(noisy, "serving", TPUT, "higher", 0.001, "0.5.22", "0.5.23")
    assert r["verdict"] == "not confirmed" and "not confirmed" in r["text"]
    # a lower-is-better metric is worse when it goes up
    slow = _confirm_night([20.0, 21.0, 20.5], [300.0, 310.0, 305.0])
    r = confirm.paired_result(slow, "serving", TPUT, "lower", 0.01, "0.5.1.post3", "0.5.23")
    assert r["verdict"] == "confirmed" and r["change_pct"] > 1000
    one = _confirm_night([1.0], [2.0])
    assert confirm.paired_result(one, "serving", TPUT, "higher", 0.001, "a", "b")["verdict"] == (
        "no data"
    )


def test_confirm_config_has_the_two_builds_of_the_failing_variant(tmp_path):
    cfg = builds_config(tmp_path)
    got = confirm.confirm_config(cfg, "candidate", "0.5.1.post3", "0.5.23", {"serving"}, 2)
    assert {v: (s.patches, s.sglang) for v, s in got.variants.items()} == {
        "tonight": (["slow-patch"], "0.5.23"),
        "last-green": (["slow-patch"], "0.5.1.post3"),
    }
    assert got.baseline == "tonight" and got.sglang == "0.5.23"  # tonight's clients
    assert (got.schedule.repeats, got.schedule.order, got.schedule.auto) == (
        2,
        "interleaved",
        False,
    )
    assert list(got.suites) == list(got.suite_params) == ["serving"] and got.nightly.gates == []
    assert got.name == "nightly-builds-confirm" and got.builds == {}
    assert list(cfg.variants) == ["baseline", "candidate"]  # tonight's config is unchanged


def test_confirmation_is_stated_up_front_run_and_reported_in_the_night(tmp_path, monkeypatch):
    """A red night on a new release: the job states the confirmation's cost, runs it (a fake
    bench writing a synthetic run folder), reports the paired result in nightly.md / nightly.json
    and the history, and links its run folder."""

    from patchbench.nightly.job import add_confirmation

    explicit = SAME_RUN.model_copy(update={"confirm": ConfirmSettings(repeats=5)})
    h, run, res = red_night_after_green(tmp_path, "0.5.23", explicit)
    assert res.outcome == "red"
    cfg = builds_config(tmp_path)
    seen = {}

    def fake_bench(c) -> Path:
        seen["config"] = c
        return make_build_night(
            tmp_path / "c", "2026-11-30T04:00:00Z", "0.5.1.post3",
            {"last-green": [30.0, 31.0, 30.5, 30.2, 30.9],
             "tonight": [300.0, 310.0, 305.0, 320.0, 301.0]},
            name="nightly-builds-confirm",
            variants={"last-green": ["slow-patch"], "tonight": ["slow-patch"]},
        )  # fmt: skip

    out = io.StringIO()
    conf = confirm.maybe_confirm(cfg, res, fake_bench, out)
    assert conf is not None and conf.skipped is None and conf.error is None
    assert seen["config"].variants["tonight"].sglang == "0.5.23"
    assert seen["config"].variants["last-green"].sglang == "0.5.1.post3"
    text = out.getvalue()
    assert text.index("confirmation run: variant 'candidate' on sglang 0.5.1.post3") < text.index(
        "confirmation: serving."
    )
    assert (
        "5 interleaved rounds, 10 cells, about 25.0 machine (GPU) minutes" in text
    )  # 10 min / 4 cells tonight
    add_confirmation(res, conf.to_json(), conf.rows())
    [r] = conf.results
    assert r["verdict"] == "confirmed" and r["change_pct"] > 800
    js = json.loads((run / "nightly.json").read_text())
    assert js["confirmation"]["results"][0]["verdict"] == "confirmed"
    md = (run / "nightly.md").read_text()
    assert "## Confirmation run" in md and f"serving.{ITL}: confirmed: tonight's 0.5.23 is" in md
    assert f"({conf.run_dir})" in md
    with History(h) as hh:
        [row] = read_confirmations(hh, "nightly-builds", run.name)
    assert row["verdict"] == "confirmed" and row["old_release"] == "0.5.1.post3"
    assert row["confirm_run_dir"] == conf.run_dir


def test_confirmation_skipped_when_tonight_ran_last_greens_build(tmp_path):
    _h, _run, res = red_night_after_green(tmp_path, "0.5.1.post3")
    assert res.outcome == "red" and res.causes == []

    def no_bench(c) -> Path:
        raise AssertionError("no confirmation is due")

    conf = confirm.maybe_confirm(builds_config(tmp_path), res, no_bench)
    assert conf is not None and "same sglang release and patch state" in (conf.skipped or "")
    assert confirm.lines(conf.to_json())[2].startswith("Not run: tonight ran the same")


def test_confirmation_rows_round_trip_through_the_history(tmp_path):
    h = tmp_path / "h.sqlite"
    with History(h) as hh:
        record_confirmation(hh, "c", "r1", [{"variant": "v", "suite": "s", "metric": "m",
                                             "verdict": "not confirmed"}])  # fmt: skip
        [row] = read_confirmations(hh, "c")
    assert row["run_id"] == "r1" and row["verdict"] == "not confirmed"


# ---------------------------------------------------------------------------------------------
# a matrix night: the patch check before it runs, a blocked unit, a red unit's confirmation

MX_UNIT = "sglang-0-5-23"
MX_SETTINGS = {
    "window_nights": 7, "min_history_nights": 2, "min_repeats": 2, "hold_while_learning": False,
    "false_red_nights_per_month": 6, "pass_alpha": 0.2, "confirm": {"repeats": 5},
    "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5, "against": "same_run"}],
}  # fmt: skip


def mx_night(root: Path, day: int, sglang: str, candidate: list[float] | None) -> Path:
    """A matrix run folder of night ``day`` with one unit (:data:`MX_UNIT`) as patchbench.matrix
    leaves it: matrix.json, configs/<unit>.yaml (stock and the candidate with slow-patch,
    serving only, :data:`MX_SETTINGS`) and the unit's run folder on ``sglang`` (throughput per
    repeat; ``candidate`` None: the candidate did not run)."""
    import yaml

    mdir = root / f"202611{day:02d}T020000Z-mx"
    vals = {"baseline": [100.0, 101.0, 100.5]}
    variants: dict[str, list[str]] = {"baseline": []}
    if candidate is not None:
        vals["candidate"], variants["candidate"] = candidate, ["slow-patch"]
    run = make_build_night(
        mdir / "_tmp", f"2026-11-{day:02d}T03:00:00Z", sglang, vals, name="mxcfg", metric=TPUT,
        variants=variants,
    )  # fmt: skip
    run.rename(mdir / MX_UNIT)
    (mdir / "_tmp").rmdir()
    records.write_text(mdir / "configs" / f"{MX_UNIT}.yaml", yaml.safe_dump({
        "name": "mxcfg", "sglang": sglang, "model": {"path": str(root)},
        "variants": {"baseline": [], "candidate": ["slow-patch"]},
        "suites": {"serving": {"num_prompts": 8}}, "nightly": MX_SETTINGS,
    }))  # fmt: skip
    records.write_json(mdir / "matrix.json", {"name": "mx", "units": [{
        "id": MX_UNIT, "labels": {"sglang": sglang}, "config_name": "mxcfg", "status": "ok",
        "exit_code": 0, "config": f"configs/{MX_UNIT}.yaml",
    }]})  # fmt: skip
    return mdir


def _unit_config(mdir: Path) -> dict:
    """{unit id: its config} of a matrix night, as ``nightly MATRIX.yaml`` passes them."""
    return {MX_UNIT: load_config(mdir / "configs" / f"{MX_UNIT}.yaml", check_files=False)}


def _mx_green_then_red(tmp_path: Path, red_release: str) -> tuple[Path, Path]:
    """Two green matrix nights on 0.5.1.post3, then night 30's matrix run folder on
    ``red_release`` with the candidate ten percent slower (not gated yet): (history, folder)."""
    from patchbench.nightly.matrix_night import nightly_on_matrix_run

    h = tmp_path / "h.sqlite"
    for day in (27, 28):
        mdir = mx_night(tmp_path, day, "0.5.1.post3", [100.2, 100.9, 100.4])
        res = nightly_on_matrix_run(mdir, history=h, out=io.StringIO())
        assert res.exit_code == 0, res.headline
    return h, mx_night(tmp_path, 30, red_release, [90.0, 91.0, 90.4])


def test_matrix_red_unit_on_a_new_build_is_confirmed_like_a_single_night(tmp_path):
    """A matrix unit red on a release its last green night did not run: the matrix night runs
    the unit's confirmation (its merged config, last green vs tonight) and reports it in the
    unit's nightly.md / nightly.json, the history and the matrix summary."""

    from patchbench.nightly.matrix_night import nightly_on_matrix_run

    h, mdir = _mx_green_then_red(tmp_path, "0.5.23")
    seen = {}

    def fake_bench(c) -> Path:
        seen["config"] = c
        return make_build_night(
            tmp_path / "c", "2026-11-30T04:00:00Z", "0.5.23",
            {"last-green": [100.0, 101.0, 100.5, 100.2, 100.8],
             "tonight": [90.0, 91.0, 90.5, 90.2, 90.8]},
            name="mxcfg-confirm", metric=TPUT,
            variants={"last-green": ["slow-patch"], "tonight": ["slow-patch"]},
        )  # fmt: skip

    out = io.StringIO()
    res = nightly_on_matrix_run(
        mdir, history=h, out=out, confirm=_unit_config(mdir), run_bench=fake_bench,
        not_here="unused",
    )  # fmt: skip
    assert res.exit_code == 1
    assert seen["config"].variants["last-green"].sglang == "0.5.1.post3"
    assert seen["config"].variants["tonight"].sglang == "0.5.23"
    assert "confirmation run: variant 'candidate' on sglang 0.5.1.post3" in out.getvalue()
    unit = json.loads((mdir / MX_UNIT / "nightly.json").read_text())
    [r] = unit["confirmation"]["results"]
    assert r["verdict"] == "confirmed" and r["change_pct"] == pytest.approx(-10.0, abs=0.2)
    js = json.loads((mdir / "nightly.json").read_text())
    assert js["units"][0]["confirmation"]["results"][0]["verdict"] == "confirmed"
    md = (mdir / "nightly.md").read_text()
    assert "## Confirmation runs" in md
    assert f"- `{MX_UNIT}`: variant `candidate`, sglang 0.5.1.post3 vs 0.5.23: " in md
    with History(h) as hh:
        [row] = read_confirmations(hh, f"mxcfg@{MX_UNIT}")
    assert row["verdict"] == "confirmed" and row["new_release"] == "0.5.23"


def test_matrix_confirmation_not_run_here_prints_the_command(tmp_path):
    """Units that ran elsewhere (Ray): the confirmation is planned, and the summary says why it
    did not run here and what to run (the unit's config with two builds); the same build: none
    is due."""
    from patchbench.nightly.matrix_night import nightly_on_matrix_run

    h, mdir = _mx_green_then_red(tmp_path, "0.5.23")
    out = io.StringIO()
    res = nightly_on_matrix_run(
        mdir, history=h, out=out, confirm=_unit_config(mdir), run_bench=None,
        not_here="the units ran on ray",
    )  # fmt: skip
    assert res.exit_code == 1
    c = json.loads((mdir / "nightly.json").read_text())["units"][0]["confirmation"]
    assert c["skipped"].startswith("planned, not run here (the units ran on ray): run `")
    cmd = c["skipped"].split("`")[1]
    assert cmd == f"patchbench bench {mdir / 'configs' / f'{MX_UNIT}.yaml'}"
    assert (
        "variants tonight (sglang 0.5.23, the baseline) and last-green (sglang 0.5.1.post3)"
        in (c["skipped"])
    )
    assert "not run: planned, not run here" in (mdir / "nightly.md").read_text()
    # the same release as the last green night: nothing to confirm
    h2, mdir2 = _mx_green_then_red(tmp_path / "same", "0.5.1.post3")
    nightly_on_matrix_run(
        mdir2, history=h2, out=io.StringIO(), confirm=_unit_config(mdir2), run_bench=None
    )
    c2 = json.loads((mdir2 / "nightly.json").read_text())["units"][0]["confirmation"]
    assert "same sglang release and patch state" in c2["skipped"]


def test_matrix_unit_whose_patch_does_not_apply_runs_stock_and_exits_2(tmp_path, monkeypatch):
    """Before a matrix night: each unit's patches are checked on its pin and printed; on the pin
    where the candidate's patch conflicts the unit's config leaves the candidate out, the state
    is recorded with the unit's night, which exits 2 like a single night; a blocked baseline
    stops the matrix before anything runs."""

    from patchbench.errors import ConfigError
    from patchbench.matrix.spec import load_matrix
    from patchbench.nightly.matrix_night import check_matrix_patches, nightly_on_matrix_run
    from patchbench.patches import state as patch_states
    from tests.matrix import test_matrix

    def fake_state(name: str, release: str):
        if release == "0.5.23":
            return patch_states.PatchState(
                f"patch '{name}'", release, "conflicts", file="sglang/x.py", hunk=2
            )
        return patch_states.PatchState(f"patch '{name}'", release, "applies")

    monkeypatch.setattr(patch_states, "patch_state", fake_state)
    base = test_matrix.write_base(tmp_path)
    m = load_matrix(test_matrix.write_matrix(tmp_path, f"""\
        name: mx-pins
        base: {base}
        axes:
          sglang: ["0.5.1.post3", "0.5.23"]
        """))  # fmt: skip
    old, new = m.units
    old_dump = old.config.model_dump(mode="json")
    out = io.StringIO()
    found = check_matrix_patches(m, out)
    text = out.getvalue()
    assert f"nightly: unit {old.id}: sglang 0.5.1.post3: null-comment applies" in text
    assert f"nightly: unit {new.id}: variant 'patched' cannot run: patch 'null-comment' " in text
    assert list(found) == [new.id] and found[new.id][0].state == "conflicts"
    assert old.config.model_dump(mode="json") == old_dump
    assert list(old.config.variants) == ["baseline", "patched"]
    assert list(new.config.variants) == ["baseline"] and new.config.baseline == "baseline"
    # the unit's night: stock ran; the blocked state recorded, exit 2
    mdir = mx_night(tmp_path / "r", 30, "0.5.23", None)
    blocked_rows = {MX_UNIT: [BuildRow("candidate", "0.5.23", "slow-patch", "conflicts",
                                       "conflicts at sglang/x.py hunk 2", ran=False)]}  # fmt: skip
    h = tmp_path / "h.sqlite"
    res = nightly_on_matrix_run(mdir, history=h, out=io.StringIO(), blocked=blocked_rows)
    assert res.exit_code == 2
    assert res.units[0].headline.startswith("PATCH DOES NOT APPLY ('slow-patch' on sglang 0.5.23)")
    with History(h) as hh:
        rows = read_night_builds(hh, run_id=f"20261130T030000Z-mxcfg@{MX_UNIT}")
    assert ("candidate", "conflicts") in {(r["variant"], r["state"]) for r in rows}
    # a blocked baseline: nothing of that unit can run, the matrix stops before it starts
    raw = base.read_text().replace("baseline: []", "baseline: [null-comment]")
    base.write_text(raw)
    m2 = load_matrix(tmp_path / "m.yaml")
    with pytest.raises(ConfigError, match="nothing can run tonight: the baseline 'baseline'"):
        check_matrix_patches(m2, io.StringIO())
