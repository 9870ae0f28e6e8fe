"""Judging a night's tests together: the check of tonight's noise against the learned (or
prior) noise, Holm across the night, the repeats the targets need, and each test's status
(patchbench/nightly/gates/__init__.py explains the rules; the outlier set-aside happens in the checks,
patchbench/nightly/gates/same_run.py and patchbench/nightly/gates/history_gate.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from patchbench import stats
from patchbench.nightly.gates.checks import (
    TestStat,
    _Check,
    _cv,
    _log_threshold,
    beyond,
    shown_not_worse,
)
from patchbench.nightly.gates.results import GateResult
from patchbench.nightly.gates.settings import Gate, NightlySettings
from patchbench.nightly.history import Key
from patchbench.nightly.noise import Noise
from patchbench.nightly.robust import noise_bound, noise_excess, repeats_needed


@dataclass
class _Pending:
    """A test waiting for the night's noise check and Holm adjustment."""

    result: GateResult
    check: _Check
    gate: Gate
    key: Key
    noise: Noise | None = None
    sigma: float = math.nan  # the noise the check compares tonight's spread with
    se_of_n: Any = None  # repeats -> standard error of one night's estimate
    # earlier nights' checks of the same gate, newest first (for consecutive_nights)
    earlier: list[_Check | None] = field(default_factory=list)
    test: TestStat | None = None
    noisy: bool = False


def _judge(pending: list[_Pending], settings: NightlySettings) -> None:
    """The noise check (Bonferroni at ``noise_alpha`` across the night's tests), then Holm across
    the night's tests, then fail / warn / pass / quiet / inconclusive / underpowered per test."""
    alpha = settings.family_alpha
    n_checked = _check_noise(pending, settings)
    _pick_tests(pending, settings)
    level_b = alpha / max(len(pending), 1)
    for p, (rejected, level) in zip(
        pending, stats.holm([x.test.p for x in pending], alpha), strict=False
    ):
        assert p.test is not None
        p.result.level = level
        short = _short_of_repeats(p, settings, level_b)
        if rejected and beyond(p.test, p.gate.threshold_pct):
            _fail_or_warn(p, level, len(pending))
        else:
            _not_shown_worse(p, settings, rejected, short, n_checked)


def _check_noise(pending: list[_Pending], settings: NightlySettings) -> int:
    """Tonight's spread against the learned (or prior) noise of every test that has one and at
    least 2 kept runs (``noise_p``, ``tonight_cv_pct``; ``noisy`` at the Bonferroni level of
    ``noise_alpha`` across them); returns how many were checked."""
    checked = [p for p in pending if p.noise is not None and p.check.kept.size >= 2]
    for p in checked:
        ratio, pn = noise_excess(p.check.kept, p.sigma)
        p.result.noise_p = pn
        p.result.tonight_cv_pct = 100.0 * math.expm1(ratio * p.sigma)
        p.noisy = pn < settings.noise_alpha / len(checked)
    return len(checked)


def _pick_tests(pending: list[_Pending], settings: NightlySettings) -> None:
    """Each test's statistic (the robust one on a noisy night) and what the result shows of it:
    the test's name, p-value, change and the ``pass_alpha`` bound (in %)."""
    for p in pending:
        r = p.result
        p.test = p.check.pick(p.noisy)
        assert p.test is not None
        if p.noise is not None:
            r.noise_cv_pct = 100.0 * math.expm1(p.sigma)
        r.test = p.test.name
        r.p_value = p.test.p
        r.change_pct = 100.0 * math.expm1(p.test.mean)
        r.bound_pct = 100.0 * math.expm1(p.test.bound(settings.pass_alpha))


def _short_of_repeats(p: _Pending, settings: NightlySettings, level_b: float) -> bool:
    """Sets ``repeats_needed`` (at the Bonferroni level ``level_b``); True when tonight's repeats
    are short of what even the noise's lower 90 % bound needs (False without a learned noise)."""
    r, t, g = p.result, p.test, p.gate
    assert t is not None
    if p.se_of_n is None or p.noise is None:
        return False
    need = [
        repeats_needed(
            lambda m, f=f, se=p.se_of_n: se(m, f),
            abs(_log_threshold(g.step_pct, t.bad)),
            abs(_log_threshold(g.threshold_pct, t.bad)),
            level_b,
            settings.detect_nights,
            settings.detect_power,
        )
        for f in (1.0, noise_bound(p.noise.df, 0.1))
    ]
    r.repeats_needed = need[0]
    # short of repeats only when even the noise's lower 90 % bound needs more
    return need[1] is None or r.n < need[1]


def _fail_or_warn(p: _Pending, level: float, n_tests: int) -> None:
    """A test shown worse than its threshold at Holm ``level`` (of ``n_tests``): fail when the
    gate's earlier nights showed it too for ``consecutive_nights`` in a row, else warn."""
    r, t, g = p.result, p.test, p.gate
    assert t is not None
    held = 1
    for c in p.earlier:
        e = c.pick(False) if c is not None else None
        if e is None or not (e.p <= level and beyond(e, g.threshold_pct)):
            break
        held += 1
    r.nights_held = held
    what = (
        f"{_pct(r.change_pct)} (one-sided p = {t.p:.2g} <= Holm level {level:.2g} "
        f"of {n_tests} tests; {t.name}) is worse than the "
        f"{g.threshold_pct:g} % threshold"
    )
    if held >= g.consecutive_nights:
        r.status = "fail"
        r.reason = what + (f", on {held} nights in a row" if g.consecutive_nights > 1 else "")
    else:
        r.status = "warn"
        r.reason = what + f"; held on {held} of the {g.consecutive_nights} nights in a row needed"


def _not_shown_worse(
    p: _Pending, settings: NightlySettings, rejected: bool, short: bool, n_checked: int
) -> None:
    """A test not shown worse than its threshold: underpowered (``underpowered_on: noise`` with
    a learned noise: tonight noisy, or ``short`` of repeats), pass (the bound excludes the
    threshold), quiet (the noise rule found nothing wrong) or inconclusive."""
    r, t, g = p.result, p.test, p.gate
    assert t is not None
    bound_txt = f"the {100 * (1 - settings.pass_alpha):g} % bound {_pct(r.bound_pct)}"
    shown = shown_not_worse(t, g.threshold_pct, settings.pass_alpha)
    noise_rule = settings.underpowered_on == "noise" and p.noise is not None
    src = f"{p.noise.source} noise {_cv(p.sigma)}" if noise_rule and p.noise is not None else ""
    if noise_rule and p.noisy:
        r.status = "underpowered"
        r.reason = (
            f"{_pct(r.change_pct)}, not a regression; but tonight's spread "
            f"{_pct(r.tonight_cv_pct)[1:]} CV is clearly above the {src} (chi-square "
            f"p = {r.noise_p:.2g} < {settings.noise_alpha:g}/{n_checked}): "
            f"tonight's runs could hide a regression"
        )
    elif noise_rule and short:
        need = (
            f"{r.repeats_needed} repeats"
            if r.repeats_needed is not None
            else "more repeats than affordable (64+)"
        )
        r.status = "underpowered"
        r.reason = (
            f"{_pct(r.change_pct)}, not a regression; but at the {src} a "
            f"{g.step_pct:g} % step turns a night red within {settings.detect_nights} "
            f"nights in {100 * settings.detect_power:g} % of cases only with {need} "
            f"(more than {r.n}, tonight's, even at the noise's lower 90 % bound)"
        )
    elif shown:
        r.status = "pass"
        r.reason = f"{_pct(r.change_pct)}; {bound_txt} excludes a {g.threshold_pct:g} % regression"
    elif noise_rule:
        r.status = "quiet"
        r.reason = (
            f"{_pct(r.change_pct)}: no regression shown; tonight's noise is within "
            f"the {src}, and {r.n} repeats meet the targets ({r.repeats_needed} needed)"
        )
    else:
        r.status = "inconclusive"
        sig = " significant but within the threshold," if rejected else ""
        r.reason = (
            f"{_pct(r.change_pct)},{sig} but {bound_txt} reaches the "
            f"{g.threshold_pct:g} % threshold: too few repeats or too much noise to tell"
        )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"
