"""The confirmation run's rounds (patchbench/nightly/confirm.py, plan_rounds): ``repeats: auto``
sizes them by the noncentral-t power of the one-sided paired t test
(patchbench.analysis.power, checked against scipy directly), the cap and the change it can still
confirm, an explicit number as it is, bad settings as config errors, the plan line and
nightly.json's keys, and tools/calibrate_nightly.py's --confirm-table. No server runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy import stats

from patchbench import errors
from patchbench.analysis.power import n_needed, power
from patchbench.config import load_config
from patchbench.config.nightly import ConfirmSettings, NightlySettings
from patchbench.errors import ConfigError
from patchbench.nightly import confirm


def rounds_needed(effect: float, sigma: float, alpha: float, target: float) -> int | None:
    """The confirmation's rounds (one-sided, exact noncentral t), as plan_rounds asks for them."""
    return n_needed(abs(effect), sigma, alpha, target, alternative="larger", cap=confirm.MAX_SEARCH)


def paired_t_power(n: int, effect: float, sigma: float, alpha: float) -> float:
    return power(n, effect, sigma, alpha, alternative="larger")


def scipy_power(n: int, change_pct: float, pair_cv_pct: float, alpha: float) -> float:
    """The one-sided paired t test's power, written out with scipy (no patchbench code)."""
    d = abs(math.log1p(change_pct / 100)) / math.log1p(pair_cv_pct / 100)
    df = n - 1
    return stats.nct.sf(stats.t.ppf(1 - alpha, df), df, d * math.sqrt(n))


def test_defaults_are_auto_with_power_and_bounds():
    cs = NightlySettings().confirm
    assert (cs.repeats, cs.power, cs.min_repeats, cs.max_repeats) == ("auto", 0.9, 3, 12)
    assert cs.alpha == 0.001


@pytest.mark.parametrize("change,cv", [(-6.1, 3.2), (-5.0, 2.0), (10.0, 4.0), (-3.0, 1.0)])
def test_rounds_needed_is_the_first_n_with_the_power(change, cv):
    alpha, power = 0.001, 0.9
    n = rounds_needed(math.log1p(change / 100), math.log1p(cv / 100), alpha, power)
    assert n is not None and n >= 3
    assert scipy_power(n, change, cv, alpha) >= power > scipy_power(n - 1, change, cv, alpha)


def test_a_known_case_by_hand():
    # -6.1 % at a pair CV of 3.2 %: d = 0.0629 / 0.0315 = 2.0; 10 pairs: nc 6.3 against t 4.30
    n = rounds_needed(math.log(0.939), math.log(1.032), 0.001, 0.9)
    assert n == 10
    assert paired_t_power(10, -math.log(0.939), math.log(1.032), 0.001) == pytest.approx(
        scipy_power(10, -6.1, 3.2, 0.001), rel=1e-12
    )
    assert rounds_needed(0.0, 0.03, 0.001, 0.9) is None
    with pytest.raises(ValueError):
        paired_t_power(1, 0.05, 0.03, 0.001)
    # the cap: a change this small at this noise needs more pairs than it searches
    assert rounds_needed(1e-6, 0.03, 0.001, 0.9) is None


def test_auto_plan_line_and_json():
    cs = ConfirmSettings()
    noise = [{"suite": "serving", "metric": "tput", "pair_cv_pct": 3.2}]
    plan = confirm.plan_rounds(cs, [("serving", "tput", -6.1)], noise)
    assert (plan.rounds, plan.needed, plan.capped, plan.noise_source) == (
        10,
        10,
        False,
        "noise row",
    )
    assert plan.text.startswith(
        "10 rounds: a -6.1 % change at a paired noise of 3.2 % is confirmed at p < 0.001 with "
        "90 % power"
    )
    # detectable at the rounds run: just reaches the power, and no larger than the change
    assert 0 < plan.detectable_pct <= 100 * (1 / 0.939 - 1)
    d = math.log1p(plan.detectable_pct / 100)
    assert paired_t_power(10, d, math.log(1.032), 0.001) == pytest.approx(0.9, abs=1e-6)
    conf = confirm.Confirmation("v", "g", "0.5.22", "0.5.23", 0.001, plan.rounds, rounds=plan)
    js = conf.to_json()
    assert (js["rounds"], js["needed"], js["capped"], js["repeats"]) == (10, 10, False, 10)
    assert js["detectable_pct"] == plan.detectable_pct
    assert plan.text in conf.plan_line() and "10 interleaved rounds" in conf.plan_line()
    assert any(ln.startswith("Rounds: 10 rounds") for ln in confirm.lines(js))


def test_the_failing_metric_that_needs_most_sizes_the_run_and_min_bounds_it():
    cs = ConfirmSettings()
    noise = [{"suite": "s", "metric": "a", "pair_cv_pct": 2.0}]
    plan = confirm.plan_rounds(cs, [("s", "a", -20.0), ("s", "a", -8.0), ("s", "b", None)], noise)
    assert plan.change_pct == -8.0 and plan.metric == "s.a"
    big = confirm.plan_rounds(ConfirmSettings(min_repeats=5), [("s", "a", -50.0)], noise)
    assert big.needed == 3 and big.rounds == 5  # min_repeats
    # no noise row: the prior run_cv_pct * sqrt(2)
    pri = confirm.plan_rounds(cs, [("s", "b", -6.0)], noise, prior_run_cv_pct=1.5)
    assert pri.noise_source == "run_cv_pct"
    assert pri.pair_cv_pct == pytest.approx(100 * math.expm1(math.sqrt(2) * math.log(1.015)))
    # nothing known: max_repeats
    none = confirm.plan_rounds(cs, [("s", "b", -6.0)], noise)
    assert none.rounds == 12 and none.needed is None and "no observed change" in none.text


def test_the_cap_and_the_change_it_can_still_confirm():
    cs = ConfirmSettings()
    noise = [{"suite": "s", "metric": "m", "pair_cv_pct": 4.0}]
    plan = confirm.plan_rounds(cs, [("s", "m", -3.0)], noise)
    assert plan.capped and plan.rounds == 12 and plan.needed is not None and plan.needed > 12
    assert (
        scipy_power(plan.needed, -3.0, 4.0, 0.001)
        >= 0.9
        > scipy_power(plan.needed - 1, -3.0, 4.0, 0.001)
    )
    x = plan.detectable_pct
    assert scipy_power(12, x * 1.001, 4.0, 0.001) >= 0.9 > scipy_power(12, x * 0.999, 4.0, 0.001)
    assert plan.text.startswith(
        f"needs {plan.needed}, capped at 12: a change smaller than {x:.1f} % cannot be "
        "confirmed at this level"
    )
    zero = confirm.plan_rounds(cs, [("s", "m", 0.0)], noise)
    assert zero.capped and zero.needed is None and zero.rounds == 12


def test_explicit_repeats_are_run_as_they_are():
    cs = ConfirmSettings(repeats=5)
    noise = [{"suite": "s", "metric": "m", "pair_cv_pct": 4.0}]
    plan = confirm.plan_rounds(cs, [("s", "m", -3.0)], noise)
    assert (plan.rounds, plan.auto, plan.needed, plan.capped) == (5, False, None, False)
    conf = confirm.Confirmation("v", "g", "a", "b", 0.001, 5, rounds=plan)
    assert conf.plan_line().endswith("5 interleaved rounds, 0 cells, about n/a machine (GPU) "
                                     "minutes; confirmed at p < 0.001")  # fmt: skip
    assert ConfirmSettings.model_validate({"repeats": 2}).repeats == 2


CONFIG = """\
name: t
sglang: 0.5.1.post3
model: {path: .cache/models/tiny-qwen25vl-tf4, tiny: true}
variants:
  baseline: []
suites:
  serving: {}
nightly:
  confirm: CONFIRM
"""


@pytest.mark.parametrize(
    "confirm_yaml,key",
    [
        ("{power: 1.0}", "power"),
        ("{power: 0}", "power"),
        ("{min_repeats: 8, max_repeats: 4}", "max_repeats (4) is smaller than min_repeats (8)"),
        ("{repeats: 1}", "repeats"),
        ("{repeats: many}", "repeats"),
    ],
)
def test_bad_values_are_config_errors(tmp_path, confirm_yaml, key):
    p = tmp_path / "c.yaml"
    p.write_text(CONFIG.replace("CONFIRM", confirm_yaml))
    with pytest.raises(ConfigError) as e:
        load_config(p, check_files=False)
    assert errors.exit_code_of(e.value) == 2
    assert "nightly.confirm" in str(e.value) and key in str(e.value)


def test_good_values_load(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(CONFIG.replace("CONFIRM", "{repeats: auto, power: 0.8, max_repeats: 20}"))
    cs = load_config(p, check_files=False).nightly.confirm
    assert (cs.repeats, cs.power, cs.max_repeats) == ("auto", 0.8, 20)


def test_table_command(capsys):
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "tools" / "calibrate_nightly.py"
    spec = importlib.util.spec_from_file_location("calibrate_nightly", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--confirm-table"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| pair noise | 5 % change | 10 % change |"
    rows = {ln.split(" | ")[0]: ln for ln in out[2:]}
    for cv in (2.0, 4.0):
        cells = rows[f"| {cv:g} %"].strip("| ").split(" | ")[1:]
        for change, cell in zip((5.0, 10.0), cells, strict=True):
            n = int(cell)
            assert scipy_power(n, change, cv, 0.001) >= 0.9 > scipy_power(n - 1, change, cv, 0.001)


def test_maybe_confirm_sizes_the_run_from_the_nights_change_and_noise(tmp_path):
    """A red night (a ~10x slower candidate) gated with a prior noise: the default ``auto`` runs
    min_repeats rounds (so large a change needs few), says why in the plan line, gives that many
    rounds to the confirmation's config and records them in its json."""
    import io

    from tests.nightly.test_nightly_builds import SAME_RUN, builds_config, red_night_after_green

    settings = SAME_RUN.model_copy(update={"run_cv_pct": 2.0})
    _h, _run, res = red_night_after_green(tmp_path, "0.5.23", settings)
    assert res.outcome == "red" and res.noise
    cfg = builds_config(tmp_path)
    seen = {}

    def fake_bench(c):
        seen["config"] = c
        raise ConfigError("not run here")

    out = io.StringIO()
    conf = confirm.maybe_confirm(cfg, res, fake_bench, out)
    assert conf is not None and conf.rounds is not None and conf.rounds.auto
    assert seen["config"].schedule.repeats == conf.repeats == 3  # built in memory
    assert seen["config"].name == "nightly-builds-confirm" and conf.error.startswith("ConfigError")
    assert conf.rounds.needed is not None and conf.rounds.needed <= 3
    assert conf.rounds.noise_source == "noise row" and conf.rounds.change_pct > 800
    text = out.getvalue()
    assert "3 interleaved rounds" in text and "3 rounds: a +" in text and "90 % power" in text
    js = conf.to_json()
    assert (js["rounds"], js["capped"], js["rounds_auto"]) == (3, False, True)
