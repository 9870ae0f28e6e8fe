"""The repeats a night should run (``schedule.repeats: auto``): what the gates' targets need at
the noise learned from the history (patchbench/nightly/noise.py), the prior ``run_cv_pct`` while learning,
between ``min_repeats`` and ``max_repeats`` (docs/nightly.md, "Noise learned").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from patchbench.nightly.gates.checks import _log_threshold
from patchbench.nightly.gates.settings import NightlySettings
from patchbench.nightly.history import Night
from patchbench.nightly.noise import learn
from patchbench.nightly.robust import repeats_needed


@dataclass
class RepeatsPlan:
    """The repeats chosen for tonight. ``repeats``: what the night runs; ``needed``: what the
    targets need at the noise (None: no count up to 64 reaches them); ``capped``: ``needed`` is
    above ``max_repeats`` (or unreachable), so the night may end underpowered; ``source``:
    "learned" / "prior" (or "learned and prior": the gated metrics' noises); ``why``: one line saying
    so; ``metrics``: per gated (suite, metric) its noise source and needed repeats."""

    repeats: int
    needed: int | None
    capped: bool
    source: str
    why: str
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan_repeats(
    settings: NightlySettings,
    prior: Sequence[Night],
    variants: Sequence[str],
    baseline: str,
    better: dict[tuple[str, str], str] | None = None,
) -> RepeatsPlan:
    """The repeats tonight should run: for every gate's test (same_run: each variant but the
    baseline; history: each listed variant) the fewest runs with which a ``detect_pct`` step
    turns a night red within ``detect_nights`` nights with chance ``detect_power``, at the
    Bonferroni level of the night's tests and one run set aside
    (:func:`patchbench.nightly.robust.repeats_needed`, as the Noise table computes them), the noise
    learned from ``prior`` (oldest first; :func:`patchbench.nightly.noise.learn`, the prior
    ``run_cv_pct`` while learning). The largest, at least ``min_repeats``, at most
    ``max_repeats``. A history test that no count can bring to its target (the night-to-night
    noise alone hides the step) does not raise the count: it is named in ``why`` and marked
    ``night_limited`` in ``metrics`` (it may end underpowered). ``better``: (suite, metric) ->
    "higher" / "lower" (default: the gate's direction, else "higher"; the step's size on the
    log scale barely depends on it).

    Raises ValueError when no noise is known (no ``run_cv_pct`` and too few nights)."""
    tests = _gate_tests(settings, variants, baseline)
    level = settings.family_alpha / max(len(tests), 1)
    most: int | None = settings.min_repeats
    unreachable = False
    sources: set[str] = set()
    limited: set[str] = set()
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for g, kind, _v in tests:
        suite, metric = g.suite or "serving", g.metric_name
        noise = learn(
            prior,
            suite,
            metric,
            prior_cv_pct=settings.run_cv_pct,
            min_nights=settings.learn_min_nights,
        )
        if noise is None:
            raise ValueError(
                f"no noise known for {suite}.{metric}: set nightly.run_cv_pct (the prior) for "
                "schedule.repeats: auto"
            )
        dirn = g.direction or (better or {}).get((suite, metric)) or "higher"
        bad = -1 if dirn == "higher" else 1
        se = _standard_error(kind, noise, settings.window_nights)
        need = repeats_needed(
            se,
            abs(_log_threshold(g.step_pct, bad)),
            abs(_log_threshold(g.threshold_pct, bad)),
            level,
            settings.detect_nights,
            settings.detect_power,
        )
        row = rows.setdefault(
            (suite, metric),
            {
                "suite": suite,
                "metric": metric,
                "source": noise.source,
                "needed": 0,
                "night_limited": False,
            },
        )
        if need is None and kind == "history" and _night_limited(se, g, bad, level, settings):
            # no count reaches it: the night-to-night noise alone hides the step; more repeats
            # only add GPU time (the history test stays underpowered, the others decide)
            row["night_limited"] = True
            limited.add(f"{suite}.{metric}")
            continue
        if need is None:
            unreachable = True
            row["needed"] = None
        elif row["needed"] is not None:
            row["needed"] = max(row["needed"], need)
        sources.add(noise.source)
        if need is not None and most is not None:
            most = max(most, need)
    needed = None if unreachable else most
    source = " and ".join(sorted(sources)) or "prior"
    return _plan(settings, needed, source, limited, list(rows.values()))


def _gate_tests(
    settings: NightlySettings, variants: Sequence[str], baseline: str
) -> list[tuple[Any, str, str]]:
    """Every test the night's gates run: (gate, "same_run" / "history", variant); a same_run
    test for each listed variant but the baseline, a history test for each listed variant."""
    tests: list[tuple[Any, str, str]] = []
    for g in settings.gates:
        kinds = ["same_run", "history"] if g.against == "both" else [g.against]
        listed = [v for v in variants if g.variants is None or v in g.variants]
        for kind in kinds:
            for v in listed:
                if kind == "same_run" and v == baseline:
                    continue
                tests.append((g, kind, v))
    return tests


def _standard_error(kind: str, noise: Any, window_nights: int) -> Callable[[int], float]:
    """The standard error (log scale) of a test's statistic at ``m`` repeats: a same_run test's
    paired difference (the pair noise), a history test's tonight against the mean of
    ``window_nights`` nights (the night-to-night noise plus the run noise)."""
    if kind == "same_run":
        sp = noise.pair.sigma

        def se(m: int, sp: float = sp) -> float:
            return sp / math.sqrt(m)

        return se
    sr = noise.run.sigma
    sn2 = noise.night_sigma**2 if math.isfinite(noise.night_sigma) else 0.0
    kk = window_nights

    def se_history(m: int, sr: float = sr, sn2: float = sn2, kk: int = kk) -> float:
        return math.sqrt((sn2 + sr * sr / m) * (1.0 + 1.0 / kk))

    return se_history


def _plan(
    settings: NightlySettings,
    needed: int | None,
    source: str,
    limited: set[str],
    rows: list[dict[str, Any]],
) -> RepeatsPlan:
    """The plan for ``needed`` repeats (None: unreachable), capped at ``max_repeats``, with the
    line that says why (naming the ``limited`` history gates)."""
    note = (
        f"; the history gate of {', '.join(sorted(limited))} cannot show a step within "
        f"{settings.detect_nights} nights at the learned night-to-night noise whatever the "
        "repeats (it may end underpowered)"
        if limited
        else ""
    )
    cap = settings.max_repeats
    if needed is None or needed > cap:
        shown = "more than 64" if needed is None else str(needed)
        why = (
            f"repeats: the targets need {shown} at the {source} noise, capped at {cap} "
            "(nightly.max_repeats): the night may end underpowered" + note
        )
        return RepeatsPlan(cap, needed, True, source, why, rows)
    why = (
        f"repeats: {needed}, what the targets need at the {source} noise (at least min_repeats "
        f"{settings.min_repeats}, at most max_repeats {cap})" + note
    )
    return RepeatsPlan(needed, needed, False, source, why, rows)


def _night_limited(se: Any, g: Any, bad: int, level: float, settings: NightlySettings) -> bool:
    """True when even endless repeats (the run noise gone) miss the target: the night-to-night
    noise alone makes the step undetectable within ``detect_nights`` nights."""
    from patchbench.nightly.robust import detect_power

    floor = se(10**9)
    p = detect_power(
        floor,
        abs(_log_threshold(g.step_pct, bad)),
        abs(_log_threshold(g.threshold_pct, bad)),
        level,
        settings.detect_nights,
    )
    return p < settings.detect_power


__all__ = ["RepeatsPlan", "plan_repeats"]
