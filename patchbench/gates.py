"""Nightly gates: is tonight's run a regression, shown not to be one, or undecided?

The config's ``nightly:`` section is :class:`NightlySettings` (docs/nightly.md explains every key
and the error budget). Each gate names a metric and a threshold; for that metric it yields one
test per variant and kind:

- ``same_run`` (variants other than the baseline and its A/A copies): the paired log ratios
  ``log(variant / baseline)`` of tonight's repeats, paired by repeat index (interleaved rounds);
  a one-sided t-test in the metric's bad direction.
- ``history`` (every variant, the baseline included): tonight's per-run log values against the
  last ``window_nights`` recorded nights of the same config, UNPAIRED (those runs were not
  interleaved with tonight's); nights that were themselves regressions against the nights before
  them are left out of the reference. ``history_test: nights`` (default) compares tonight's mean log
  value with the K per-night means (a prediction t-test with K - 1 degrees of freedom: it counts
  night-to-night drift as noise); ``history_test: welch`` runs Welch's t-test of tonight's runs
  against every run of the K nights (more power, but night-to-night drift makes it fire;
  scripts/calibrate_nightly.py measures both).

Only run-level values count: never a request-level interval inside one cell. A test needs at
least ``min_repeats`` runs tonight (``min_repeats`` pairs for same_run); with fewer it is
``ungated`` (one run cannot separate a change from run-to-run noise).

Per night, the one-sided p-values of every test that could be judged form ONE family, Holm-
adjusted at ``alpha`` (default: ``false_red_nights_per_month / 30``): the chance that a night
with no regression turns red is at most ``alpha`` (for valid tests), the error budget. A test's
outcome:

- ``fail``: significant at its Holm level AND the estimated change is worse than
  ``threshold_pct`` (a "regressed" run-level verdict beyond the threshold), and that held on
  ``consecutive_nights`` recorded nights in a row; ``warn`` when it held tonight only;
- ``pass``: the one-sided ``1 - pass_alpha`` bound excludes a change as bad as the threshold
  (tonight is shown not to have regressed by that much);
- ``inconclusive``: neither (the night cannot tell; the job exits 5, never silently green);
- ``ungated`` (too few repeats tonight), ``skipped`` (too few nights in the history: warming
  up), ``missing`` (the run lacks the gate's metric, or its direction is unknown: a config
  error).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from patchbench import stats
from patchbench.history import History, Key, Night

DEFAULT_HISTORY = "~/.cache/patchbench/history.sqlite"
NIGHTS_PER_MONTH = 30.0


# ---------------------------------------------------------------------------------------------
# settings


class Gate(BaseModel):
    """One gate of the ``nightly.gates`` list (docs/nightly.md)."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(
        description="suite.metric (e.g. serving.itl_median_ms) or a bare metric name; a load "
        "sweep's point or curve metric by its name (serving.output_throughput_tok_s@c16, "
        "serving.goodput_at_slo_req_s)"
    )
    direction: Literal["higher", "lower"] | None = Field(
        None, description="which way is better; default: compare.json / the suite's metrics"
    )
    threshold_pct: float = Field(gt=0, le=1000, description="smallest bad change that counts, %")
    consecutive_nights: int = Field(1, ge=1, le=60)
    against: Literal["same_run", "history", "both"] = "both"
    variants: list[str] | None = Field(None, description="only these variants (default: all)")

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "require_ci_excludes_zero" in data:
            raise ValueError(
                "require_ci_excludes_zero was removed: a gate fails only on a "
                "significant run-level regression (at least min_repeats paired "
                "repeats); delete the key"
            )
        return data

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if not re.fullmatch(r"([A-Za-z0-9_-]+\.)?[A-Za-z0-9_.%/@-]+", v.strip()):
            raise ValueError(
                "write suite.metric (e.g. serving.output_throughput_tok_s) or a metric name"
            )
        return v.strip()

    @property
    def suite(self) -> str | None:
        return self.metric.split(".", 1)[0] if self._has_suite else None

    @property
    def metric_name(self) -> str:
        return self.metric.split(".", 1)[1] if self._has_suite else self.metric

    @property
    def _has_suite(self) -> bool:
        """A "." before any point ("@r2.5" is a point's key, not a suite)."""
        return "." in self.metric.split("@", 1)[0]


class NightlySettings(BaseModel):
    """The config's ``nightly:`` section (docs/nightly.md has every key)."""

    model_config = ConfigDict(extra="forbid")

    history_path: str = Field(DEFAULT_HISTORY, description="SQLite file outside the checkout")
    window_nights: int = Field(7, ge=2, le=365, description="K: nights the history gate uses")
    min_history_nights: int = Field(3, ge=2, le=365)
    lock_timeout_s: float = Field(10.0, gt=0, le=3600)
    min_repeats: int = Field(
        3, ge=2, le=100, description="runs (pairs) per variant tonight before a gate judges"
    )
    false_red_nights_per_month: float = Field(
        1.0, gt=0, le=30, description="error budget: false red nights per 30 nights"
    )
    alpha: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="per-night family level (Holm across every gate test); "
        "default false_red_nights_per_month / 30",
    )
    pass_alpha: float = Field(
        0.05, gt=0, lt=0.5, description="one-sided level of the 'not regressed' claim"
    )
    history_test: Literal["nights", "welch"] = "nights"
    history_since: str | None = Field(
        None,
        description="ignore nights before this UTC time (ISO-8601, e.g. "
        "2026-03-01T00:00:00Z): accepts a new level after a known change",
    )
    run_cv_pct: float | None = Field(
        None,
        gt=0,
        le=100,
        description="run-to-run CV measured with an A/A run (documentation, calibration)",
    )
    gates: list[Gate] = Field(default_factory=list)

    @field_validator("history_since")
    @classmethod
    def _since(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from datetime import datetime, timezone

        try:
            dt = datetime.fromisoformat(str(v).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{v!r} is not an ISO-8601 time (e.g. 2026-03-01T00:00:00Z)") from None
        dt = dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)
        return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    @model_validator(mode="after")
    def _window(self) -> NightlySettings:
        if self.min_history_nights > self.window_nights:
            raise ValueError(
                f"min_history_nights ({self.min_history_nights}) is larger than "
                f"window_nights ({self.window_nights})"
            )
        return self

    @property
    def family_alpha(self) -> float:
        """Per-night Holm level: ``alpha``, else ``false_red_nights_per_month / 30``."""
        return (
            self.alpha
            if self.alpha is not None
            else self.false_red_nights_per_month / NIGHTS_PER_MONTH
        )


# ---------------------------------------------------------------------------------------------
# results


Status = Literal["fail", "warn", "pass", "inconclusive", "ungated", "skipped", "missing"]


@dataclass
class GateResult:
    """The outcome of one gate test for one (kind, variant, suite, metric).

    status: see the module docstring. value: tonight's median of the variant (metric unit);
    reference: the baseline's median tonight (same_run) or the median of the window's nightly
    medians (history). change_pct: the estimated change, percent, from the mean log value
    (``100 * (exp(mean log ratio) - 1)``). bound_pct: the one-sided ``1 - pass_alpha`` bound of
    the change in the bad direction (the worst change tonight's data allows). p_value: one-sided
    in the bad direction; level: its Holm level tonight (None when not judged); n: runs tonight
    (pairs for same_run); n_history: nights in the window.
    """

    gate: str
    kind: Literal["same_run", "history"]
    variant: str
    suite: str
    metric: str
    status: Status
    reason: str
    unit: str = ""
    better: str | None = None
    threshold_pct: float | None = None
    value: float | None = None
    reference: float | None = None
    change_pct: float | None = None
    bound_pct: float | None = None
    p_value: float | None = None
    level: float | None = None
    test: str | None = None
    n: int = 0
    n_history: int = 0
    window_run_ids: list[str] = field(default_factory=list)
    nights_held: int = 0
    nights_needed: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# the tests (pure, on log values; the methods are patchbench.stats)


@dataclass
class TestStat:
    """One one-sided test. ``bad`` is the sign of a regression on the log scale (+1 for a
    lower-is-better metric, -1 for higher-is-better); ``t``: the t test
    (:class:`patchbench.stats.TTest`: mean the estimated log change, se, df); ``p``: its
    one-sided p-value in the bad direction."""

    t: stats.TTest
    bad: int
    name: str
    p: float = field(init=False)

    def __post_init__(self) -> None:
        self.p = self.t.p_value("greater" if self.bad > 0 else "less")

    @property
    def mean(self) -> float:
        return self.t.mean

    @property
    def df(self) -> float:
        return self.t.df

    def bound(self, alpha: float) -> float:
        """The one-sided ``1 - alpha`` bound of the log change in the bad direction."""
        return self.t.bound(alpha, self.bad)


def _logs(values: Sequence[float | None]) -> list[float]:
    """Natural logs of the values that are present and > 0."""
    return [math.log(v) for v in values if v is not None and v > 0]


def paired_test(
    baseline: Sequence[float | None], variant: Sequence[float | None], bad: int
) -> TestStat | None:
    """Paired one-sided t-test on ``log(variant / baseline)`` by repeat index (None: missing;
    :func:`patchbench.stats.paired_t`).

    Returns None with fewer than 2 complete pairs or a non-positive value.
    """
    d = [
        math.log(v / b)
        for b, v in zip(baseline, variant, strict=False)
        if b is not None and v is not None and b > 0 and v > 0
    ]
    if len(d) < 2:
        return None
    return TestStat(stats.paired_t(d), bad, f"paired t on log ratios (n={len(d)})")


def nights_test(
    tonight: Sequence[float], nights: Sequence[Sequence[float]], bad: int
) -> TestStat | None:
    """Tonight's mean log value against K earlier nights' mean log values (unpaired;
    :func:`patchbench.stats.prediction_t`: K - 1 degrees of freedom, night-to-night drift counts
    as noise). Returns None with fewer than 2 nights or no run tonight.
    """
    t = _logs(tonight)
    m = [float(np.mean(logs)) for logs in map(_logs, nights) if logs]
    if not t or len(m) < 2:
        return None
    k = len(m)
    return TestStat(
        stats.prediction_t(t, m), bad, f"tonight vs {k} nightly means (prediction t, df={k - 1})"
    )


def welch_test(
    tonight: Sequence[float], nights: Sequence[Sequence[float]], bad: int
) -> TestStat | None:
    """Welch's t-test of tonight's per-run log values against every run of the K nights
    (:func:`patchbench.stats.welch_t`)."""
    a = _logs(tonight)
    b = _logs([v for n in nights for v in n])
    if len(a) < 2 or len(b) < 2:
        return None
    return TestStat(
        stats.welch_t(a, b),
        bad,
        f"Welch t on log values ({len(a)} runs vs {len(b)} runs of {len(nights)} nights)",
    )


def _log_threshold(threshold_pct: float, bad: int) -> float:
    """The threshold on the log scale in the bad direction (negative for higher-is-better)."""
    frac = threshold_pct / 100.0
    return math.log1p(frac) if bad > 0 else (math.log1p(-frac) if frac < 1 else -math.inf)


def beyond(test: TestStat, threshold_pct: float) -> bool:
    """True when the estimated change is at least ``threshold_pct`` in the bad direction."""
    lt = _log_threshold(threshold_pct, test.bad)
    return test.mean >= lt if test.bad > 0 else test.mean <= lt


def shown_not_worse(test: TestStat, threshold_pct: float, pass_alpha: float) -> bool:
    """True when the one-sided bound excludes a change as bad as the threshold."""
    lt = _log_threshold(threshold_pct, test.bad)
    b = test.bound(pass_alpha)
    return b < lt if test.bad > 0 else b > lt


# ---------------------------------------------------------------------------------------------
# evaluation


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


def _vals(night: Night, key: Key) -> list[float | None]:
    return list(night.values.get(key, []))


def _n_runs(vals: Sequence[float | None]) -> int:
    return sum(1 for v in vals if v is not None)


def _prior_of(
    history: History | Sequence[Night], tonight: Night, settings: NightlySettings
) -> list[Night]:
    longest = max([g.consecutive_nights for g in settings.gates] or [1])
    if isinstance(history, History):
        return history.nights(
            tonight.config_name,
            before_utc=tonight.night_utc,
            exclude_run_id=tonight.run_id,
            limit=settings.window_nights + longest,
        )
    prior = [
        n
        for n in history
        if n.run_id != tonight.run_id
        and (not tonight.night_utc or not n.night_utc or n.night_utc < tonight.night_utc)
    ]
    prior.sort(key=lambda n: (n.night_utc or "", n.run_id))
    return prior


@dataclass
class _Pending:
    """A test waiting for the night's Holm adjustment."""

    result: GateResult
    test: TestStat
    gate: Gate
    key: Key
    # earlier nights' tests of the same gate, newest first (for consecutive_nights)
    earlier: list[TestStat | None] = field(default_factory=list)


def _same_run(tonight: Night, key: Key, bad: int) -> TestStat | None:
    return paired_test(_vals(tonight, (tonight.baseline,) + key[1:]), _vals(tonight, key), bad)


def _history(
    values: Sequence[float | None], window: Sequence[Night], key: Key, bad: int, how: str
) -> TestStat | None:
    nights = [[v for v in n.values.get(key, []) if v is not None] for n in window]
    vals = [v for v in values if v is not None]
    return (nights_test if how == "nights" else welch_test)(vals, nights, bad)


def _clean_nights(
    nights: Sequence[Night], key: Key, bad: int, gate: Gate, settings: NightlySettings
) -> list[Night]:
    """The nights (oldest first) that may serve as reference: a night that was itself a
    regression against the clean nights before it (one-sided p <= the family alpha and worse than
    the threshold) is left out, so one bad night does not widen the reference and hide the next
    one, and a clean night after it is judged against clean nights. A step that persists stays red
    until ``history_since`` is moved past it (accepting the new level)."""
    kept: list[Night] = []
    for n_ in nights:
        if len(kept) >= settings.min_history_nights:
            t = _history(
                _vals(n_, key), kept[-settings.window_nights :], key, bad, settings.history_test
            )
            if t is not None and t.p <= settings.family_alpha and beyond(t, gate.threshold_pct):
                continue
        kept.append(n_)
    return kept


def evaluate(
    history: History | Sequence[Night], tonight: Night, settings: NightlySettings
) -> list[GateResult]:
    """Evaluate every gate of ``settings`` for tonight's run.

    history: an open :class:`History` or the previous nights of the same config (tonight itself
    and later nights are left out); tonight: a :class:`Night`
    (:func:`patchbench.history.night_from_run` reads one from a run folder). Returns one
    :class:`GateResult` per (gate, kind, variant, suite, metric), or one "missing" result per kind
    for a gate whose metric the run lacks. Reads only; raises
    :class:`patchbench.history.HistoryError` when the history cannot be read.
    """
    prior = _prior_of(history, tonight, settings)
    nights_all = [tonight, *reversed(prior)]
    results: list[GateResult] = []
    pending: list[_Pending] = []
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
                    r, p = _one(kind, gate, tonight, prior, key, bad, settings, common)
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
) -> tuple[GateResult, _Pending | None]:
    vals = _vals(tonight, key)
    res = GateResult(
        kind=kind, variant=key[0], status="pass", reason="", value=tonight.median(key), **common
    )  # type: ignore[arg-type]
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
        test = _same_run(tonight, key, bad)
        look_back = (
            list(prior[-(gate.consecutive_nights - 1) :]) if gate.consecutive_nights > 1 else []
        )
        earlier = [_same_run(n_, key, bad) for n_ in reversed(look_back)]
    else:
        res.n = _n_runs(vals)
        need = gate.consecutive_nights
        having = [
            n_
            for n_ in prior
            if n_.median(key) is not None
            and (settings.history_since is None or n_.night_utc >= settings.history_since)
        ]
        streak = having[-(need - 1) :] if need > 1 else []
        base_nights = _clean_nights(having[: len(having) - len(streak)], key, bad, gate, settings)
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
            return res, None
        if res.n < settings.min_repeats:
            res.status = "ungated"
            res.reason = (
                f"{res.n} run(s) tonight, {settings.min_repeats} needed: too few runs "
                f"to compare with earlier nights"
            )
            return res, None
        test = _history(vals, window, key, bad, settings.history_test)
        # each night of a streak is judged against the K nights before the streak
        earlier = [
            _history(_vals(n_, key), window, key, bad, settings.history_test)
            for n_ in reversed(streak)
        ]
    if test is None:
        res.status = "ungated"
        res.reason = "no usable values (non-positive or missing)"
        return res, None
    res.test = test.name
    res.p_value = test.p
    res.change_pct = 100.0 * math.expm1(test.mean)
    res.bound_pct = 100.0 * math.expm1(test.bound(settings.pass_alpha))
    return res, _Pending(res, test, gate, key, earlier)


def _judge(pending: list[_Pending], settings: NightlySettings) -> None:
    """Holm across the night's tests, then fail / warn / pass / inconclusive per test."""
    alpha = settings.family_alpha
    for p, (rejected, level) in zip(
        pending, stats.holm([x.test.p for x in pending], alpha), strict=False
    ):
        r, t, g = p.result, p.test, p.gate
        r.level = level
        worse = beyond(t, g.threshold_pct)
        if rejected and worse:
            held = 1
            for e in p.earlier:
                if e is None or not (e.p <= level and beyond(e, g.threshold_pct)):
                    break
                held += 1
            r.nights_held = held
            what = (
                f"{_pct(r.change_pct)} (one-sided p = {t.p:.2g} <= Holm level {level:.2g} "
                f"of {len(pending)} tests; {t.name}) is worse than the "
                f"{g.threshold_pct:g} % threshold"
            )
            if held >= g.consecutive_nights:
                r.status = "fail"
                r.reason = what + (
                    f", on {held} nights in a row" if g.consecutive_nights > 1 else ""
                )
            else:
                r.status = "warn"
                r.reason = (
                    what + f"; held on {held} of the {g.consecutive_nights} nights in a row needed"
                )
        elif shown_not_worse(t, g.threshold_pct, settings.pass_alpha):
            r.status = "pass"
            r.reason = (
                f"{_pct(r.change_pct)}; the {100 * (1 - settings.pass_alpha):g} % bound "
                f"{_pct(r.bound_pct)} excludes a {g.threshold_pct:g} % regression"
            )
        else:
            r.status = "inconclusive"
            sig = " significant but within the threshold," if rejected else ""
            r.reason = (
                f"{_pct(r.change_pct)},{sig} but the {100 * (1 - settings.pass_alpha):g} % "
                f"bound {_pct(r.bound_pct)} reaches the {g.threshold_pct:g} % threshold: "
                f"too few repeats or too much noise to tell"
            )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


#: night outcomes, worst first (the exit code follows the first that applies)
OUTCOMES = ("red", "underpowered", "green")


def night_outcome(results: Sequence[GateResult]) -> str:
    """ "red" (a gate failed), "underpowered" (nothing failed but a test is inconclusive or
    ungated: the night could not show that nothing regressed), or "green"."""
    if any(r.status == "fail" for r in results):
        return "red"
    if any(r.status in ("inconclusive", "ungated") for r in results):
        return "underpowered"
    return "green"


__all__ = [
    "Gate",
    "NightlySettings",
    "GateResult",
    "TestStat",
    "evaluate",
    "paired_test",
    "nights_test",
    "welch_test",
    "beyond",
    "shown_not_worse",
    "night_outcome",
    "metric_unit",
    "DEFAULT_HISTORY",
    "NIGHTS_PER_MONTH",
]
