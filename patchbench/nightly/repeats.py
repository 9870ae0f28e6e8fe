"""``schedule.repeats: auto``: the repeats a night runs, chosen before the run from the noise learned
from the history (:func:`plan_repeats`), and the config it runs with them, built in memory
(:func:`pick_repeats`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from patchbench.config.nightly import NightlySettings
from patchbench.nightly.history import History, HistoryError, Night
from patchbench.nightly.noise import Noise, detect_power, learn, repeats_needed


@dataclass
class RepeatsPlan:
    """The repeats chosen for tonight: ``repeats`` (what runs), ``needed`` (None: no count up to
    64 reaches the targets), ``capped`` (``needed`` above ``max_repeats`` or unreachable: the
    night may end underpowered), ``source`` of the noise ("learned", "prior" or both), ``why``
    (one line), ``metrics``: per gated (suite, metric) its source, needed repeats and
    ``night_limited`` (no count helps its history gate)."""

    repeats: int
    needed: int | None
    capped: bool
    source: str
    why: str
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _step(pct: float, bad: int) -> float:
    frac = pct / 100.0 * bad
    return abs(math.log1p(frac)) if frac > -1 else math.inf


def plan_repeats(
    settings: NightlySettings,
    prior: Sequence[Night],
    variants: Sequence[str],
    baseline: str,
    better: dict[tuple[str, str], str] | None = None,
    confidence: float = 0.95,
    noises: dict[tuple[str, str], Noise] | None = None,
    family: int = 1,
) -> RepeatsPlan:
    """The fewest repeats with which, for every gate's test, a ``detect_pct`` step turns a night
    red within ``detect_nights`` nights with chance ``detect_power``
    (:func:`patchbench.nightly.noise.repeats_needed`, one run set aside), at the noise learned
    from ``prior`` (oldest first; the prior ``run_cv_pct`` while learning). A same-run test is
    the report's paired t test (exact noncentral t), one-sided at ``(1 - confidence) / 2 /
    family`` (``family``: the report's primaries, its Holm family's first step), a history test
    a z test at the family alpha over the history tests, one run set aside. The
    largest, between ``min_repeats`` and ``max_repeats``. A history test no count can bring to
    its target (the night-to-night noise alone hides the step) does not raise the count: it is
    named in ``why``. ``better``: (suite, metric) -> "higher" / "lower" (default: the gate's
    direction, else "higher"); ``noises``: (suite, metric) -> a noise to use instead of the
    learned one (tools/calibration). Raises ValueError when no noise is known."""
    tests = [
        (g, kind)
        for g in settings.gates
        for kind in g.kinds()
        for v in variants
        if (g.variants is None or v in g.variants) and not (kind == "same_run" and v == baseline)
    ]
    n_same = sum(1 for _, k in tests if k == "same_run")
    levels = {
        "same_run": (1.0 - confidence) / 2.0 / max(family, 1),
        "history": settings.family_alpha / max(len(tests) - n_same, 1),
    }
    most: int | None = settings.min_repeats
    sources: set[str] = set()
    limited: set[str] = set()
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for g, kind in tests:
        suite, metric = g.suite or "serving", g.metric_name
        noise = (noises or {}).get((suite, metric)) or learn(
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
        bad = (
            -1
            if (g.direction or (better or {}).get((suite, metric)) or "higher") == "higher"
            else 1
        )
        se = _standard_error(kind, noise, settings.window_nights)
        args = (_step(g.step_pct, bad), _step(g.threshold_pct, bad), levels[kind])
        same = kind == "same_run"  # the report: a paired t, no outlier rule
        need = repeats_needed(
            se, *args, settings.detect_nights, settings.detect_power, 0 if same else 1,
            paired_t=same,
        )  # fmt: skip
        row = rows.setdefault(
            (suite, metric),
            {"suite": suite, "metric": metric, "source": noise.source, "needed": 0,
             "night_limited": False},
        )  # fmt: skip
        if (
            need is None
            and kind == "history"
            and detect_power(se(10**9), *args, settings.detect_nights) < settings.detect_power
        ):
            row["night_limited"] = True  # drift alone hides the step: more runs only cost time
            limited.add(f"{suite}.{metric}")
            continue
        sources.add(noise.source)
        if need is None:
            row["needed"] = most = None
        else:
            row["needed"] = None if row["needed"] is None else max(row["needed"], need)
            most = None if most is None else max(most, need)
    source = " and ".join(sorted(sources)) or "prior"
    note = (
        f"; the history gate of {', '.join(sorted(limited))} cannot show a step within "
        f"{settings.detect_nights} nights at the learned night-to-night noise whatever the "
        "repeats (it may end underpowered)"
        if limited
        else ""
    )
    cap = settings.max_repeats
    if most is None or most > cap:
        shown = "more than 64" if most is None else str(most)
        why = (
            f"repeats: the targets need {shown} at the {source} noise, capped at {cap} "
            "(nightly.max_repeats): the night may end underpowered" + note
        )
        return RepeatsPlan(cap, most, True, source, why, list(rows.values()))
    why = (
        f"repeats: {most}, what the targets need at the {source} noise (at least min_repeats "
        f"{settings.min_repeats}, at most max_repeats {cap})" + note
    )
    return RepeatsPlan(most, most, False, source, why, list(rows.values()))


def _standard_error(kind: str, noise: Noise, window_nights: int) -> Callable[[int], float]:
    """A night's standard error (log scale) at ``m`` repeats: a same-run paired mean (``sqrt 2``
    run sigmas per pair), or tonight against the mean of ``window_nights`` nights (night plus
    run noise)."""
    sr = noise.run.sigma
    if kind == "same_run":
        return lambda m: noise.pair_sigma / math.sqrt(m)
    sn2 = noise.night_sigma**2 if math.isfinite(noise.night_sigma) else 0.0
    return lambda m: math.sqrt((sn2 + sr * sr / m) * (1.0 + 1.0 / window_nights))


def report_family(cfg: Any) -> int:
    """The size of the report's Holm family for ``cfg``: its suites' primaries of a kind tested
    with a sampling error, times the variants that are neither baseline nor A/A."""
    from patchbench.analysis.family import FAMILY_KINDS
    from patchbench.suite import get_suite

    primaries = sum(
        1
        for s in cfg.suites
        for m in get_suite(s).metrics.values()
        if m.primary and m.kind in FAMILY_KINDS
    )
    variants = sum(1 for v in cfg.variants if v != cfg.baseline and not cfg.is_aa(v))
    return max(primaries * variants, 1)


def pick_repeats(cfg: Any, hpath: Path, *, out: Any = None) -> tuple[RepeatsPlan, Any]:
    """``schedule.repeats: auto`` before the run: the config's nights read from the history at
    ``hpath`` (read only; absent or unreadable: the prior decides), the plan
    (:func:`plan_repeats` with ``cfg.nightly``), printed with why, and ``cfg`` with
    ``schedule.repeats`` set to it (a copy; :class:`patchbench.config.Config`). Raises
    ValueError when no noise is known."""
    out = out or sys.stdout
    settings: NightlySettings = cfg.nightly
    prior: list[Night] = []
    if hpath.is_file():
        try:
            with History(hpath, timeout_s=settings.lock_timeout_s) as h:
                prior = h.nights(cfg.name)
        except HistoryError as e:
            print(f"nightly: repeats from the prior noise: history unreadable: {e}", file=out)
    plan = plan_repeats(
        settings,
        prior,
        list(cfg.variants),
        cfg.baseline,
        confidence=cfg.compare.confidence,
        family=report_family(cfg),
    )
    print(f"nightly: {plan.why}", file=out)
    # a fresh schedule model: a copy would keep the ``repeats: auto`` mark
    schedule = type(cfg.schedule).model_validate(
        {**cfg.schedule.model_dump(), "repeats": plan.repeats}
    )
    return plan, cfg.model_copy(update={"schedule": schedule})
