"""A red night's story (patchbench/nightly/story.py), the learning hold and the minimum detectable
change (patchbench/nightly/gates.py), stale configs and the index order
(patchbench/nightly/dashboard.py), on synthetic histories with hand-computed values."""

from __future__ import annotations

import math
from datetime import datetime

import pytest
from statsmodels.stats.power import TTestPower

from patchbench.nightly.dashboard import index_order, stale_text
from patchbench.nightly.gates import GateResult, evaluate
from patchbench.nightly.history import Night, NightInfo
from patchbench.nightly.story import Z_BAND, tell
from tests.nightly.test_gates import KB, KV, TPUT, night, only, settings

G = f"serving.{TPUT}"


def red(variant: str, kind: str, change: float, value: float, **kw) -> GateResult:
    """A failing throughput gate (higher is better, threshold 5 %)."""
    return GateResult(
        G, kind, variant, "serving", TPUT, "fail", "", better="higher", threshold_pct=5.0,
        change_pct=change, value=value, n=3, **kw,
    )  # fmt: skip


def nights(k: int) -> list:
    return [night(i + 1, {KB: [100.0, 101.0, 99.0]}) for i in range(k)]


def bare(i: int) -> Night:
    """Night ``i`` without values (the story reads only its run id and time)."""
    return Night(f"n{i:02d}", f"2026-01-{i:02d}T03:00:00Z", "c", "baseline")


def stored(line) -> dict:
    return line.row()


def test_a_release_step_then_a_variant_slowdown_while_red_is_new_tonight():
    prior = nights(3)  # n01 n02 n03; the release step on n02: stock's history gate red since
    step = red("baseline", "history", -20.0, 80.0)
    store: dict[str, list[dict]] = {}
    for i, n in enumerate(prior[1:], start=1):
        s = tell([step], n, prior[:i], store)
        store[n.run_id] = [stored(x) for x in s.lines]
    # n03: the same cause as yesterday, red since n02
    s3 = tell([step], prior[2], prior[:2], {"n02": store["n02"]})
    assert s3.same_as_yesterday and not s3.new and s3.lines[0].since_run_id == "n02"
    # tonight: the variant 2.5x slower (same-run -60 %) while stock stays red
    tonight = night(4, {KB: [80.0] * 3})
    slow = red("patched", "same_run", -60.0, 32.0)
    builds = [{"variant": "patched", "patch": "p", "sglang_release": "0.5.23", "state": "applies"}]
    before = [{"variant": "patched", "patch": "p", "sglang_release": "0.5.22", "state": "applies"}]
    s = tell([step, slow], tonight, prior, store, builds=builds, builds_yesterday=before)
    first, second = s.lines
    assert first.variant == "patched" and first.new and first.why == "new"
    assert first.text == (
        "new tonight: serving.output_throughput_tok_s (patched, same-run) -60.0 %, its "
        "environment changed (sglang 0.5.22 -> 0.5.23)"
    )
    assert second.variant == "baseline" and not second.new and second.nights == 3
    assert second.since_utc == "2026-01-02T03:00:00Z" and not s.same_as_yesterday
    assert s.to_json()["red"] == "new"
    assert s.summary().startswith("new tonight: serving.output_throughput_tok_s (patched")


def test_a_persisting_red_says_since_when_and_same_cause():
    prior = nights(3)
    step = red("baseline", "history", -20.0, 80.0)
    store = {"n02": [stored(tell([step], prior[1], prior[:1], {}).lines[0])]}
    store["n03"] = [stored(tell([step], prior[2], prior[:2], store).lines[0])]
    s = tell([red("baseline", "history", -20.5, 79.5)], bare(4), prior, store)
    assert s.same_as_yesterday and s.to_json()["red"] == "persisting"
    assert s.summary() == "red since 2026-01-02 (3 nights), same cause as yesterday"
    assert s.lines[0].text == (
        "serving.output_throughput_tok_s (baseline, history) -20.5 %: red since 2026-01-02 "
        "(3 nights)"
    )


def test_the_same_metric_moving_further_is_new_and_the_red_level_moves():
    prior = nights(2)
    # history, learned run noise 2 % CV, night noise 1 % CV, 3 runs: the band of a difference
    # of two nights' levels is z sqrt(2) sqrt(log(1.01)^2 + log(1.02)^2 / 3)
    band = 100 * math.expm1(
        Z_BAND * math.sqrt(2) * math.hypot(math.log(1.01), math.log(1.02) / 3**0.5)
    )
    assert band == pytest.approx(4.2906, abs=1e-3)  # below the 5 % threshold: the threshold rules
    cv = {("serving", TPUT): 1.0}
    r1 = red("baseline", "history", -20.0, 80.0, noise_cv_pct=2.0)
    store = {"n02": [stored(tell([r1], prior[1], prior[:1], {}, night_cv_pct=cv).lines[0])]}
    # 80 -> 77: 3.75 % worse, within 5 %: the same cause
    s = tell(
        [red("baseline", "history", -23.0, 77.0, noise_cv_pct=2.0)],
        bare(3),
        prior,
        store,
        night_cv_pct=cv,
    )
    assert s.same_as_yesterday and not s.new
    store["n03"] = [stored(s.lines[0])]
    # 80 -> 75.5: 5.6 % worse than the red level (80, n02), beyond 5 %: new tonight, further
    s = tell(
        [red("baseline", "history", -24.5, 75.5, noise_cv_pct=2.0)],
        bare(4),
        [*prior, bare(3)],
        store,
        night_cv_pct=cv,
    )
    [x] = s.lines
    assert (x.new, x.why, x.since_run_id) == (True, "further", "n02")
    assert x.moved_pct == pytest.approx(100 * (75.5 / 80 - 1))
    assert x.text.startswith(
        "new tonight: serving.output_throughput_tok_s (baseline, history) -24.5 %, -5.6 % further"
    )
    # the red level is now 75.5: 74 is 2.0 % further, the same cause
    store["n04"] = [stored(x)]
    s = tell(
        [red("baseline", "history", -26.0, 74.0, noise_cv_pct=2.0)],
        bare(5),
        [*prior, bare(3), bare(4)],
        store,
        night_cv_pct=cv,
    )
    assert s.same_as_yesterday and s.lines[0].nights == 4


def _info(
    config: str, night_utc: str, outcome: str, red: str | None = None, hours=None
) -> NightInfo:
    n = NightInfo(f"r-{config}", night_utc, config, "ok", "0.5.23", None, outcome=outcome)
    n.story = {"red": red, "summary": "new tonight: x" if red == "new" else ""}
    n.schedule_hours = hours
    return n


def test_stale_config_and_the_index_lists_the_newest_new_problem_first():
    now = datetime(2026, 1, 10, 3, 0, 0)
    assert stale_text(_info("a", "2026-01-09T03:00:00Z", "green"), now) == ""
    assert stale_text(_info("a", "2026-01-08T16:00:00Z", "green"), now) == ""  # 35 h
    assert stale_text(_info("a", "2026-01-08T14:00:00Z", "green"), now) == (
        "stale: last night 37 h ago (it runs every 24 h)"
    )
    assert stale_text(_info("a", "2026-01-06T03:00:00Z", "green"), now) == (
        "stale: last night 4 days ago (it runs every 24 h)"
    )
    assert stale_text(_info("w", "2026-01-06T03:00:00Z", "green", hours=168), now) == ""
    latest = {
        "a-green": _info("a-green", "2026-01-10T02:00:00Z", "green"),
        "b-red-old": _info("b-red-old", "2026-01-10T02:00:00Z", "red", "persisting"),
        "c-new-older": _info("c-new-older", "2026-01-09T02:00:00Z", "red", "new"),
        "d-new-newest": _info("d-new-newest", "2026-01-10T01:00:00Z", "red", "new"),
    }
    assert index_order(latest) == ["d-new-newest", "c-new-older", "b-red-old", "a-green"]


# ---------------------------------------------------------------------------------------------
# learning, and what a gate can see


HIST = [[100.0, 101.0, 99.0], [99.5, 100.5, 98.5], [101.0, 102.0, 100.0], [100.0, 100.5, 99.5]]


def test_a_learning_config_holds_a_small_change_but_not_a_huge_one():
    prior = [night(i + 1, {KB: v, KV: v}) for i, v in enumerate(HIST)]
    s = settings(hold_while_learning=True, learn_min_nights=7)
    small = night(28, {KB: [100.0, 101.0, 99.0], KV: [90.0, 91.0, 89.0]}, "tonight")
    [r] = evaluate(prior, small, s)
    assert r.status == "learning" and r.learning_nights == 4
    assert r.reason.startswith("learning (4 of 7 nights): would have been fail")
    huge = night(28, {KB: [100.0, 101.0, 99.0], KV: [40.0, 40.4, 39.6]}, "tonight")
    [r] = evaluate(prior, huge, s)
    assert r.status == "fail" and r.p_value <= 0.001 and r.change_pct < -50
    assert r.learning_nights == 4
    # the story of the small night says learning, not red
    [r] = evaluate(prior, small, s)
    st = tell([r], small, prior, {})
    assert st.lines == [] and st.summary() == "learning (4 of 7 nights)"


def test_minimum_detectable_change_is_the_noncentral_t_at_the_noise_and_repeats():
    """same_run: the report's paired t of 3 pairs at its level, the prior pair noise
    sqrt(2) log(1.05): statsmodels' TTestPower solved for the standardised effect, by itself."""
    s = settings(run_cv_pct=5.0)
    t = night(28, {KB: [100.0, 101.0, 99.0], KV: [100.0, 101.0, 99.5]}, "tonight")
    r = only(evaluate([], t, s), kind="same_run")
    d = TTestPower().solve_power(nobs=3, alpha=r.level, power=0.8, alternative="two-sided")
    sd = math.sqrt(2) * math.log(1.05)
    assert r.mde_pct == pytest.approx(100 * (1 - math.exp(-d * sd)), rel=1e-6)
    assert r.mde_pct > 20  # a 5 % threshold: blind between 5 % and this
    # history, tonight's own spread (no learned noise): the prediction t's se and df
    prior = [night(i + 1, {KB: v}) for i, v in enumerate(HIST)]
    hs = settings(against="history")
    r = only(evaluate(prior, night(28, {KB: [100.0, 100.5, 99.5]}, "tonight"), hs), kind="history")
    m = [sum(math.log(x) for x in v) / 3 for v in HIST]
    mean = sum(m) / 4
    sd_l = math.sqrt(sum((x - mean) ** 2 for x in m) / 3)
    se = sd_l * math.sqrt(1 + 1 / 4)
    d = TTestPower().solve_power(nobs=4, alpha=hs.family_alpha, power=0.8, alternative="larger")
    assert r.mde_pct == pytest.approx(100 * (1 - math.exp(-d * se * 2)), rel=1e-6)


# ---------------------------------------------------------------------------------------------
# the whole night (job, history, story, index) on synthetic run folders


def test_a_variant_25x_slower_while_stock_is_red_fails_and_leads_the_index(tmp_path):
    """A release step makes stock and the variant 20 % slower (nights 6-7: stock's history gate
    red); night 8 the variant is also 2.5x slower than stock in the same run (paired ratios
    0.426, 0.4, 0.375: two-sided p 0.0016, by hand t = -log 0.4 / (0.0636 / sqrt 3) = 25.0,
    df 2). Its same-run gate fails on the learned noise (p above beyond_doubt_alpha, so no
    learning rule could have let it through), its story line comes first as new tonight, and
    the index ranks the config first, ahead of a config red on yesterday's cause only."""
    from patchbench.config.nightly import Gate, NightlySettings
    from patchbench.nightly.history import History, night_infos
    from patchbench.nightly.job import nightly_on_run
    from tests.synthetic import make_throughput_night

    job = NightlySettings(
        window_nights=5, min_history_nights=3, learn_min_nights=4, run_cv_pct=1.5,
        gates=[Gate(metric=G, threshold_pct=3, against="same_run"),
               Gate(metric=G, threshold_pct=3, against="history", variants=["baseline"])],
    )  # fmt: skip
    h = tmp_path / "h.sqlite"
    ratios = (0.42624885, 0.4, 0.37536758)
    for day in range(1, 9):
        level = 100.0 if day < 6 else 80.0
        base = [level, level + 1.0, level - 1.0]
        var = [level, level + 1.5, level - 1.5]
        if day == 8:
            var = [x * r for x, r in zip(base, ratios, strict=True)]
        run = make_throughput_night(
            tmp_path, f"202601{day:02d}T030000Z-c", f"2026-01-{day:02d}T03:00:00Z", base, var,
            name="c",
        )  # fmt: skip
        out = nightly_on_run(run, job, history=h)
        assert out.outcome == ("green" if day < 6 else "red"), (day, out.headline)
    same = only(out.results, kind="same_run")
    assert same.status == "fail" and same.noise_source == "learned"
    assert same.p_value == pytest.approx(0.0016, rel=1e-4) and same.p_value > 0.001
    assert same.change_pct == pytest.approx(-60.0, abs=1e-4)
    assert only(out.results, kind="history").status == "fail"
    assert [x["text"] for x in out.story["lines"]] == [
        "new tonight: serving.output_throughput_tok_s (patched, same-run) -60.0 %",
        "serving.output_throughput_tok_s (baseline, history) -20.0 %: red since 2026-01-06 "
        "(3 nights)",
    ]
    assert out.story["red"] == "new" and out.story["summary"] == (
        "new tonight: serving.output_throughput_tok_s (patched, same-run) -60.0 %; red since "
        "2026-01-06 (3 nights), not the same cause as yesterday"
    )
    with History(h) as hh:
        infos = night_infos(hh, "c")
    yesterday, tonight = infos[-2], infos[-1]
    assert yesterday.story["summary"] == "red since 2026-01-06 (2 nights), same cause as yesterday"
    other = _info("other", "2026-01-08T04:00:00Z", "red", "persisting")  # red, an hour newer
    assert index_order({"c": tonight, "other": other}) == ["c", "other"]
    assert index_order({"c": yesterday, "other": other}) == ["other", "c"]
