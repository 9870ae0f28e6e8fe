"""The capacity search (patchbench/suites/serving/capsearch.py) on synthetic attainment curves with
brackets computed by hand, the per-request SLO attainment (attainment.py) on hand-made records,
the paired capacity verdict through the comparison (capacity.py's metrics, the calibration's
in-memory run data), the config's validation, and a 2-probe search through the real probe path
with a fake bench_serving."""

from __future__ import annotations

import json
import math

import pytest

from patchbench.config import config_from_mapping
from patchbench.errors import ConfigError
from patchbench.suites.serving import Params, run
from patchbench.suites.serving.attainment import AttainmentSlo, attainment
from patchbench.suites.serving.capacity import CAPACITY, arm_interval, report_lines, round_seed
from patchbench.suites.serving.capsearch import search
from tests.suites.test_serving_multi_point import REC, _ctx, pkg  # noqa: F401 (fixture)

# --- the search on synthetic curves -------------------------------------------------------------


def linear(c: float) -> float:
    """Score falling 1 % a unit of load: 0.95 at 5, 0.94 at 6."""
    return (100 - c) / 100


def test_smooth_curve_doubles_down_then_bisects_and_interpolates():
    s = search(linear, target=0.945, start=16, maximum=256, precision=0.1)
    # 16 (0.84) fails, 8 (0.92) fails, 4 (0.96) meets; bisect 6 (0.94) fails, 5 (0.95) meets
    assert [p.load for p in s.probes] == [16, 8, 4, 6, 5]
    assert (s.answer, s.lo, s.hi) == ("bracket", 5, 6)
    # interpolated where the score crosses 0.945 between 0.95 at 5 and 0.94 at 6
    assert s.value == pytest.approx(5.5)


def test_previous_bracket_costs_two_probes_and_a_moved_one_recovers():
    s = search(linear, target=0.945, start=16, maximum=256, prior=(5, 6))
    assert [p.load for p in s.probes] == [5, 6] and s.value == pytest.approx(5.5)
    # the previous bracket (8, 9) no longer holds: 8 fails, steps of its width 1 doubling: 7
    # fails, 5 meets; bisect 6 fails
    s = search(linear, target=0.945, start=16, maximum=256, prior=(8, 9))
    assert [p.load for p in s.probes] == [8, 7, 5, 6] and (s.lo, s.hi, s.answer) == (
        5,
        6,
        "bracket",
    )
    # from a bracket below: 3 meets, step 2 to 5 meets, step 4 to 9 fails; bisect 7, 6 fail
    s = search(linear, target=0.945, start=16, maximum=256, prior=(3, 5))
    assert [p.load for p in s.probes] == [3, 5, 9, 7, 6] and (s.lo, s.hi) == (5, 6)


def test_cliff_is_a_bracket_not_a_root():
    s = search(lambda c: 1.0 if c <= 40 else 0.1, target=0.95, start=16, maximum=256, precision=0.1)
    # 16, 32 meet, 64 fails; 48 fails, 40 meets, 44 fails; 44 - 40 = 4 <= 0.1 x 40
    assert [p.load for p in s.probes] == [16, 32, 64, 48, 40, 44]
    assert (s.answer, s.lo, s.hi, s.value) == ("cliff", 40, 44, 40)


def test_beyond_the_range_is_a_bound_and_never_met_has_no_value():
    s = search(lambda c: 1.0, target=0.95, start=16, maximum=100)
    assert [p.load for p in s.probes] == [16, 32, 64, 100]
    assert (s.answer, s.lo, s.hi, s.value) == ("beyond", 100, None, None)
    s = search(lambda c: 0.0, target=0.95, start=16, maximum=100)
    assert [p.load for p in s.probes] == [16, 8, 4, 2, 1]
    assert (s.answer, s.lo, s.hi, s.value) == ("never", None, 1, None)
    # a dither of +1 at precision 0.1 moves the first probe to floor(16 x 1.1) = 17
    s = search(lambda c: 1.0, target=0.95, start=16, maximum=100, precision=0.1, dither=1.0)
    assert [p.load for p in s.probes] == [17, 34, 68, 100]
    with pytest.raises(ValueError, match="dither"):
        search(linear, target=0.9, start=1, maximum=10, dither=2.0)
    with pytest.raises(ValueError, match="bad search range"):
        search(linear, target=0.9, start=1, maximum=0)


# --- per-request attainment ---------------------------------------------------------------------


RECS = {
    # r0 meets; r1 TTFT too slow; r2 TPOT (300 ms) too slow; r3 errored; r4 cut; r5 asked for 0
    # tokens; r6 one token (no TPOT), meets; r7 meets
    "status": ["ok", "ok", "ok", "failed", "cut", "asked_zero", "ok", "ok"],
    "ttft_ms": [100.0, 3000.0, 100.0, None, None, None, 100.0, 150.0],
    "e2e_ms": [550.0, 3090.0, 2800.0, None, None, None, 100.0, 600.0],
    "output_len": [10, 10, 10, 0, 3, 0, 1, 10],
}


def test_attainment_share_and_percentile_rules_by_hand():
    slo = AttainmentSlo(ttft_ms=2000, tpot_ms=200, rule="share", target=0.5)
    a = attainment(RECS, slo)
    # judged: 6 (cut and asked_zero left out); every bound met: r0, r6, r7; errored: r3
    assert (a.judged, a.met, a.errored, a.excluded) == (6, 3, 1, 2)
    assert a.score == pytest.approx(3 / 6) and a.meets
    # per bound: TTFT met by r0, r2, r6, r7; TPOT by r0, r1, r6, r7
    assert a.per_bound == pytest.approx({"ttft_ms": 4 / 6, "tpot_ms": 4 / 6})
    pct = attainment(RECS, slo.model_copy(update={"rule": "percentile", "target": 0.6}))
    assert pct.score == pytest.approx(4 / 6) and pct.meets
    e2e = attainment(RECS, AttainmentSlo(ttft_ms=None, tpot_ms=None, e2e_ms=600, rule="share"))
    assert e2e.score == pytest.approx(3 / 6)  # r0, r6, r7
    assert "TTFT <= 2000 ms and TPOT <= 200 ms" in slo.definition()
    with pytest.raises(ValueError, match="at least one"):
        AttainmentSlo(ttft_ms=None, tpot_ms=None)


# --- the verdict ----------------------------------------------------------------------------------


def _comparison(base, var, repeats, schedule=None):
    from patchbench.analysis import build as analysis
    from patchbench.analysis.comparison import CompareSettings
    from tools.calibration.capacity import BASE, VAR, _Serving, run_data

    values = {(BASE, k): b for k, b in enumerate(base)} | {(VAR, k): v for k, v in enumerate(var)}
    data = run_data(values, repeats, {"start": 8}, schedule or repeats)
    return analysis.build_comparison(data, CompareSettings(), suites={"serving": _Serving()})


def test_paired_capacity_ratio_by_hand():
    cmp = _comparison([10, 10, 10, 10], [11, 12, 11, 12], 4)
    r = cmp.row("serving", CAPACITY, "patched")
    assert r.primary and r.verdict == "improved"
    # log ratios ln 1.1, ln 1.2 twice: mean 0.138816, sd 0.050236, t(0.975, 3) = 3.182446
    d = [math.log(1.1), math.log(1.2)] * 2
    assert sum(d) / 4 == pytest.approx(0.138816, abs=1e-6)
    assert r.change == pytest.approx(14.891, abs=1e-3)
    assert (r.low, r.high) == (pytest.approx(6.065, abs=1e-3), pytest.approx(24.452, abs=1e-3))
    lines = report_lines(cmp, {"patched": "the SLO"})
    assert lines[2].startswith(
        "- patched carries +14.9 % [+6.1%, +24.5%] more load at the SLO (improved)"
    )
    # the baseline's capacity 10 in every round: a zero-width interval
    assert "baseline: capacity 10.0 [10.0, 10.0]" in lines[3]
    assert lines[-2] == "  - SLO: the SLO"


def test_a_bound_is_never_a_number():
    cmp = _comparison([10, 10, ">= 256: beyond", 10], [11, 12, 11, 12], 4)
    r = cmp.row("serving", CAPACITY, "patched")
    assert r.verdict == "incomplete"
    assert any("baseline/rep2: >= 256: beyond" in n for n in r.notes)


def test_arm_interval_by_hand():
    gm, lo, hi = arm_interval([8.0, 32.0], 0.95)
    # logs ln 8, ln 32: mean ln 16, sd ln 4 / sqrt 2, se ln 4 / 2; t(0.975, 1) = 12.7062
    assert gm == pytest.approx(16.0)
    assert lo == pytest.approx(16 * math.exp(-12.7062 * math.log(4) / 2), rel=1e-4)
    assert hi == pytest.approx(16 * math.exp(12.7062 * math.log(4) / 2), rel=1e-4)


# --- config -----------------------------------------------------------------------------------------


def _cfg(serving):
    return {
        "name": "cap",
        "sglang": "0.5.1.post3",
        "model": {"path": "m", "tiny": True},
        "variants": {"baseline": [], "p": []},
        "suites": {"serving": serving},
    }


def test_config_validation_names_bad_keys():
    cfg = config_from_mapping(_cfg({"capacity": {"slo": {"rule": "share", "target": 0.95}}}))
    cap = cfg.suite_params["serving"].capacity
    assert cap.slo.target == 0.95 and cap.start == 16 and cap.max == 256
    with pytest.raises(ConfigError, match="precison"):
        config_from_mapping(_cfg({"capacity": {"precison": 0.1}}))
    with pytest.raises(ConfigError, match="ttf_ms"):
        config_from_mapping(_cfg({"capacity": {"slo": {"ttf_ms": 1}}}))
    with pytest.raises(ConfigError, match="either sweep or capacity"):
        config_from_mapping(_cfg({"capacity": {}, "sweep": {"points": [1, 2]}}))
    with pytest.raises(ConfigError, match="min <= start <= max"):
        config_from_mapping(_cfg({"capacity": {"start": 512}}))


# --- two probes through the real probe path -------------------------------------------------------


def test_two_probe_search_with_a_fake_tool(tmp_path, pkg):  # noqa: F811 (fixture)
    flushes: list[float] = []
    ctx = _ctx(tmp_path, pkg, "cap", flushes)
    # the recording's 20 requests at every concurrency; an SLO every request meets
    slo = {"ttft_ms": 1e9, "tpot_ms": 1e9, "rule": "share", "target": 0.95}
    cap = {"slo": slo, "start": 2, "max": 4, "prompts_per_load": 1, "min_prompts": 20}
    res = run(ctx, Params(dataset_name="random-ids", num_prompts=20, capacity=cap))
    meta = res.meta["capacity"]
    assert [p["load"] for p in meta["probes"]] == [2, 4] and len(flushes) == 1
    assert meta["answer"] == "beyond" and CAPACITY not in res.metrics
    assert res.meta["not_judged"][CAPACITY].startswith(">= 4")
    assert all(p["score"] == 1.0 and p["judged"] == 20 for p in meta["probes"])
    # both probes with the round's seed (the same for every arm of the round)

    assert meta["seed"] == round_seed(None, ctx.repeat)
    for k in ("c2", "c4"):
        argv = json.loads((ctx.out_dir / "probes" / k / "argv.json").read_text())
        assert argv[argv.index("--seed") + 1] == str(meta["seed"])
