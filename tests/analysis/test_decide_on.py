"""``schedule.repeats.decide_on``: the run stops once the deciding primaries are decided; the
others stay in the one Holm family, tested at the looks that ran. The per-report error rate is
checked by a simulation written here, independent of the code's own draws."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from patchbench.analysis import sequential as sq
from patchbench.config import load_config
from patchbench.errors import ConfigError
from patchbench.inputs import REPO_ROOT

THR, ITL, TTFT, E2E = (
    "serving.output_throughput_tok_s",
    "serving.itl_median_ms",
    "serving.ttft_median_ms",
    "serving.e2e_latency_median_ms",
)
BETTER = {THR: "higher", ITL: "lower", TTFT: "lower", E2E: "lower"}
MARGINS = {k: float(np.log1p(0.05)) for k in BETTER}


def test_deciding_matches_metric_or_suite_metric():
    d = sq.Design((4, 6), decide_on=("output_throughput_tok_s", "serving.itl_median_ms"))
    assert d.deciding(THR) and d.deciding(ITL)
    assert not d.deciding(TTFT) and not d.deciding(E2E)
    assert sq.Design((4, 6)).deciding(TTFT)  # empty: every primary decides


def test_run_stops_when_the_deciding_primaries_are_decided_and_the_rest_end_inconclusive():
    # throughput and ITL +-20 % with tiny noise: decided at the first look; TTFT and E2E are
    # pure noise around 0 with a 40 % spread: neither changed nor equivalent within 5 %
    rng = np.random.default_rng(1)
    n = 10
    ratios = {
        "v": {
            THR: 0.2 + 0.001 * rng.standard_normal(n),
            ITL: -0.2 + 0.001 * rng.standard_normal(n),
            TTFT: 0.4 * rng.standard_normal(n),
            E2E: 0.4 * rng.standard_normal(n),
        }
    }
    d = sq.Design((4, 6, 8, 10), futility=0.0)
    every = sq.replay(ratios, MARGINS, design=d, better=BETTER)
    assert every.n_repeats > 4  # without decide_on the noisy two hold the run open
    named = dataclasses.replace(d, decide_on=("output_throughput_tok_s", "itl_median_ms"))
    dec = sq.replay(ratios, MARGINS, design=named, better=BETTER)
    assert dec.stop and dec.n_repeats == 4
    assert dec.metrics[("v", THR)].decision == "improved"
    assert dec.metrics[("v", ITL)].decision == "improved"
    assert dec.metrics[("v", TTFT)].decision == "inconclusive"
    assert "every deciding primary decided after 4 repeats" in dec.reason
    assert "2 other primary metric(s) open" in dec.reason
    assert dec.family == 4  # the others stay in the one family


def _null_reports(design, trials: int, seed: int, effect: float = 0.0) -> float:
    """Share of reports with a false improved/regressed among the null primaries: two compared
    variants and an A/A control, four primaries each. Drawn here: per cell a decode shock and a
    prefill shock (run CV 3 %), throughput -s, ITL and E2E s, TTFT 0.5 s + 0.87 u, 1 %
    measurement noise; ``effect`` (log) on throughput and ITL of both variants, never on TTFT
    or E2E."""
    rng = np.random.default_rng(seed)
    n = design.looks[-1]
    bad = 0
    for _ in range(trials):
        sb, ub = rng.normal(0, 0.03, (2, n))
        ratios = {}
        for v in ("a", "b", "aa"):
            sv, uv = rng.normal(0, 0.03, (2, n))
            ds, du = sv - sb, uv - ub
            e = 0.0 if v == "aa" else effect
            noise = rng.normal(0, 0.01 * np.sqrt(2), (4, n))
            ratios[v] = {
                THR: -ds + e + noise[0],
                ITL: ds - e + noise[1],
                TTFT: 0.5 * ds + 0.8660254 * du + noise[2],
                E2E: ds + noise[3],
            }
        dec = sq.replay(ratios, MARGINS, design=design, better=BETTER, controls=("aa",))
        null = (TTFT, E2E) if effect else tuple(BETTER)
        bad += any(
            dec.metrics[(v, k)].decision in ("improved", "regressed")
            for v in ("a", "b")
            for k in null
        )
    return bad / trials


@pytest.mark.parametrize(
    ("kind", "effect", "trials"), [("pocock", 0.0, 700), ("pocock", 0.15, 700)]
)
def test_familywise_error_per_report_stays_within_alpha_with_deciding_primaries(
    kind, effect, trials
):
    # global null, and deciding primaries with a large effect (the run stops early, at the
    # first look mostly) while TTFT and E2E are null: the looks that ran test them
    d = sq.Design(
        (4, 6, 8, 10),
        0.05,
        kind,
        futility=0.2,
        decide_on=("output_throughput_tok_s", "itl_median_ms"),
    )
    rate = _null_reports(d, trials, seed=20260 + int(100 * effect))
    # binomial: with a true rate of 5 %, 700 reports exceed 6.9 % with probability < 1 %
    assert rate <= 0.069, rate


def test_the_presets_name_throughput_and_itl():
    for path in ("configs/presets/pr-h200.yaml", "configs/pr9460-h200.yaml"):
        seq = load_config(REPO_ROOT / path, check_files=False).schedule.sequential
        assert seq.decide_on == ["output_throughput_tok_s", "itl_median_ms"]


def test_an_unknown_deciding_primary_is_a_config_error_naming_the_key(tmp_path):
    text = (REPO_ROOT / "configs/presets/pr-h200.yaml").read_text()
    bad = text.replace("decide_on: [output_throughput_tok_s,", "decide_on: [tput_tok_s,")
    p = tmp_path / "c.yaml"
    p.write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_config(p, check_files=False)
    msg = str(e.value)
    assert "schedule.repeats.decide_on[0]: 'tput_tok_s'" in msg
    assert "allowed: output_throughput_tok_s" in msg and "itl_median_ms" in msg
    assert f"{p}:" in msg
