"""The gates' entry point: :func:`evaluate` runs every gate of the settings on tonight's run
(the checks of patchbench/nightly/gates/same_run.py and patchbench/nightly/gates/history_gate.py, judged by
patchbench/nightly/gates/learned.py); :func:`metric_unit` and the metric lookups it needs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from patchbench.nightly.gates.checks import _vals
from patchbench.nightly.gates.history_gate import _clean_nights, _history
from patchbench.nightly.gates.learned import _judge, _Pending
from patchbench.nightly.gates.results import GateResult
from patchbench.nightly.gates.same_run import _same_run
from patchbench.nightly.gates.settings import Gate, NightlySettings
from patchbench.nightly.history import History, Key, Night
from patchbench.nightly.noise import Noise
from patchbench.nightly.noise import learn as learn_noise


@lru_cache(maxsize=256)
def _suite_metric_info(suite: str, metric: str) -> Any:
    """The suite's MetricInfo for a metric, or None when the suite or the metric is unknown; a
    per-point metric (``<metric>@<point>``, a load sweep's) has its single-point metric's."""
    try:
        from patchbench.suite import get_suite

        known = get_suite(suite).metrics
        return known.get(metric) or known.get(metric.split("@", 1)[0])
    except Exception:  # noqa: BLE001 (a suite that does not import must not stop the gates)
        return None


def metric_unit(suite: str, metric: str, nights: Sequence[Night] = ()) -> str:
    """Display unit: compare.json's / the history's, else the suite's metrics, else the suffix."""
    for n in nights:
        if n.units.get((suite, metric)):
            return n.units[(suite, metric)]
    info = _suite_metric_info(suite, metric)
    if info is not None and getattr(info, "unit", None):
        return info.unit
    from patchbench.suite import unit_of

    return unit_of(metric)


def _better(gate: Gate, suite: str, metric: str, nights: Sequence[Night]) -> str | None:
    if gate.direction:
        return gate.direction
    for n in nights:
        b = n.better.get((suite, metric))
        if b in ("higher", "lower"):
            return b
    b = getattr(_suite_metric_info(suite, metric), "better", None)
    return b if b in ("higher", "lower") else None


def _gate_keys(gate: Gate, tonight: Night) -> list[tuple[str, str]]:
    """(suite, metric) pairs of tonight's run that the gate names."""
    have = {(s, m) for (_v, s, m) in tonight.values}
    return sorted(
        (s, m) for s, m in have if m == gate.metric_name and (gate.suite is None or s == gate.suite)
    )


def _n_runs(vals: Sequence[float | None]) -> int:
    return sum(1 for v in vals if v is not None)


def _prior_of(
    history: History | Sequence[Night], tonight: Night, settings: NightlySettings
) -> list[Night]:
    """Every night before tonight, oldest first (the noise is learned from all of them)."""
    if isinstance(history, History):
        return history.nights(
            tonight.config_name, before_utc=tonight.night_utc, exclude_run_id=tonight.run_id
        )
    prior = [
        n
        for n in history
        if n.run_id != tonight.run_id
        and (not tonight.night_utc or not n.night_utc or n.night_utc < tonight.night_utc)
    ]
    prior.sort(key=lambda n: (n.night_utc or "", n.run_id))
    return prior


def evaluate(
    history: History | Sequence[Night], tonight: Night, settings: NightlySettings
) -> list[GateResult]:
    """Evaluate every gate of ``settings`` for tonight's run.

    history: an open :class:`History` or the previous nights of the same config (tonight itself
    and later nights are left out); tonight: a :class:`Night`
    (:func:`patchbench.nightly.history.night_from_run` reads one from a run folder). Returns one
    :class:`GateResult` per (gate, kind, variant, suite, metric), or one "missing" result per kind
    for a gate whose metric the run lacks. The noise of each gated metric is learned from every
    earlier night (:func:`patchbench.nightly.noise.learn`). Reads only; raises
    :class:`patchbench.nightly.history.HistoryError` when the history cannot be read.
    """
    prior = _prior_of(history, tonight, settings)
    nights_all = [tonight, *reversed(prior)]
    results: list[GateResult] = []
    pending: list[_Pending] = []
    learned: dict[tuple[str, str], Noise | None] = {}
    for gate in settings.gates:
        kinds = ["same_run", "history"] if gate.against == "both" else [gate.against]
        keys = _gate_keys(gate, tonight)
        if not keys:
            have = sorted({f"{s}.{m}" for (_v, s, m) in tonight.values})
            reason = (
                f"metric '{gate.metric}' is not in this run; it has: "
                f"{', '.join(have[:12]) or 'no metrics'}{' ...' if len(have) > 12 else ''}"
            )
            missing = dict(suite=gate.suite or "*", metric=gate.metric_name, reason=reason)
            results += _missing(gate, kinds, **missing, nights_needed=gate.consecutive_nights)
            continue
        for suite, metric in keys:
            unit = metric_unit(suite, metric, nights_all)
            better = _better(gate, suite, metric, nights_all)
            if better is None:
                reason = (
                    f"no direction known for {suite}.{metric} (descriptive metric?); set "
                    f"'direction: higher|lower' on the gate"
                )
                results += _missing(gate, kinds, suite, metric, reason, unit=unit)
                continue
            if (suite, metric) not in learned:
                learned[(suite, metric)] = learn_noise(
                    prior,
                    suite,
                    metric,
                    prior_cv_pct=settings.run_cv_pct,
                    min_nights=settings.learn_min_nights,
                )
            noise = learned[(suite, metric)]
            bad = -1 if better == "higher" else 1
            common = dict(
                gate=gate.metric,
                suite=suite,
                metric=metric,
                unit=unit,
                better=better,
                threshold_pct=gate.threshold_pct,
                nights_needed=gate.consecutive_nights,
            )
            variants = [v for v in tonight.variants if gate.variants is None or v in gate.variants]
            for kind in kinds:
                for v in variants:
                    if kind == "same_run" and (v == tonight.baseline or v in tonight.aa_variants):
                        continue
                    key = (v, suite, metric)
                    r, p = _one(kind, gate, tonight, prior, key, bad, settings, common, noise)
                    results.append(r)
                    if p is not None:
                        pending.append(p)
    _judge(pending, settings)
    return results


def _missing(
    gate: Gate, kinds: Sequence[str], suite: str, metric: str, reason: str, **kw: Any
) -> list[GateResult]:
    """One "missing" result per kind for a gate that cannot be evaluated (no such metric, or
    no direction known)."""
    return [
        GateResult(
            gate.metric,
            kind,  # type: ignore[arg-type]
            "*",
            suite,
            metric,
            "missing",
            reason,
            threshold_pct=gate.threshold_pct,
            **kw,
        )
        for kind in kinds
    ]


def _one(
    kind: str,
    gate: Gate,
    tonight: Night,
    prior: Sequence[Night],
    key: Key,
    bad: int,
    settings: NightlySettings,
    common: dict,
    noise: Noise | None = None,
) -> tuple[GateResult, _Pending | None]:
    vals = _vals(tonight, key)
    res = GateResult(
        kind=kind, variant=key[0], status="pass", reason="", value=tonight.median(key), **common
    )  # type: ignore[arg-type]
    if noise is not None:
        res.noise_source = noise.source
    if kind == "same_run":
        base = _vals(tonight, (tonight.baseline,) + key[1:])
        res.reference = tonight.median((tonight.baseline,) + key[1:])
        n = sum(1 for b, v in zip(base, vals, strict=False) if b is not None and v is not None)
        res.n = n
        if n < settings.min_repeats:
            res.status = "ungated"
            res.reason = (
                f"{n} paired repeat(s), {settings.min_repeats} needed: "
                f"{'one run' if n == 1 else 'so few runs'} cannot separate the patch "
                f"from run-to-run noise"
            )
            return res, None
        check = _same_run(tonight, key, bad, noise, settings)
        look_back = (
            list(prior[-(gate.consecutive_nights - 1) :]) if gate.consecutive_nights > 1 else []
        )
        earlier = [_same_run(n_, key, bad, noise, settings) for n_ in reversed(look_back)]
        sigma = noise.pair.sigma if noise is not None else math.nan
        se_of_n = (lambda m, f=1.0: f * sigma / math.sqrt(m)) if noise is not None else None
    else:
        prepared = _history_test(res, vals, gate, prior, key, bad, settings, noise)
        if prepared is None:
            return res, None
        check, earlier, sigma, se_of_n = prepared
    if check is None or check.pick(False) is None:
        res.status = "ungated"
        res.reason = "no usable values (non-positive or missing)"
        return res, None
    res.set_aside = check.set_aside
    return res, _Pending(res, check, gate, key, noise, sigma, se_of_n, earlier)


#: what a history test is judged with: (tonight's check, the earlier nights' checks newest
#: first, the noise sigma, repeats -> standard error or None)
_Prepared = tuple[Any, list, float, Any]


def _history_test(
    res: GateResult,
    vals: list,
    gate: Gate,
    prior: Sequence[Night],
    key: Key,
    bad: int,
    settings: NightlySettings,
    noise: Noise | None,
) -> _Prepared | None:
    """A history test: tonight's runs against the window of clean nights before the streak
    (None, with ``res`` skipped or ungated, while warming up or with too few runs)."""
    res.n = _n_runs(vals)
    need = gate.consecutive_nights
    having = [
        n_
        for n_ in prior
        if n_.median(key) is not None
        and (settings.history_since is None or n_.night_utc >= settings.history_since)
    ]
    streak = having[-(need - 1) :] if need > 1 else []
    cache: dict = {}
    # the reference is chosen among the last 2 K nights before the streak
    before = having[: len(having) - len(streak)][-2 * settings.window_nights :]
    base_nights = _clean_nights(before, key, bad, gate, settings, noise, cache)
    window = base_nights[-settings.window_nights :]
    res.n_history = len(window)
    res.window_run_ids = [n_.run_id for n_ in window]
    if window:
        res.reference = statistics.median([n_.median(key) for n_ in window])
    if len(window) < settings.min_history_nights:
        res.status = "skipped"
        res.reason = (
            f"warming up: {len(window)} night(s) in the history, "
            f"{settings.min_history_nights} needed"
        )
        return None
    if res.n < settings.min_repeats:
        res.status = "ungated"
        res.reason = (
            f"{res.n} run(s) tonight, {settings.min_repeats} needed: too few runs "
            f"to compare with earlier nights"
        )
        return None
    check = _history(vals, window, key, bad, settings, noise, cache)
    # each night of a streak is judged against the K nights before the streak
    earlier = [
        _history(_vals(n_, key), window, key, bad, settings, noise, cache)
        for n_ in reversed(streak)
    ]
    sigma = noise.run.sigma if noise is not None else math.nan
    se_of_n = None
    if noise is not None:
        sn2 = noise.night_sigma**2 if math.isfinite(noise.night_sigma) else 0.0
        kk = settings.window_nights

        def se_of_n(m: int, f: float = 1.0) -> float:
            return f * math.sqrt((sn2 + sigma**2 / m) * (1.0 + 1.0 / kk))

    return check, earlier, sigma, se_of_n
