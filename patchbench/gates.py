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

Which step each gate is for: ``same_run`` sees the PATCH getting slower relative to stock (it
cannot see the machine, the driver or sglang slowing every variant alike); ``history`` sees STOCK
(or whatever variant it lists) getting slower from night to night.

Noise (patchbench/noise.py): each gated metric's run-to-run, paired and night-to-night noise is
learned from every earlier night (MAD-type estimates: a step or a slow decline does not inflate
them); the config's ``run_cv_pct`` is the prior until ``learn_min_nights`` nights exist. With a
noise known, each test rests on it (a t test with the noise's degrees of freedom), and:

- **one abnormal run never decides a gate**: a run (a pair, for same_run) farther than
  ``outlier_k`` (3) noise sigmas from the median of its night is set aside, at most one a night
  (patchbench.robust.outliers); the reference nights' levels are taken the
  same way;
- **tonight's noise is checked**: the chi-square test of tonight's spread against the noise
  (Bonferroni at ``noise_alpha`` across the night's tests); a night clearly noisier is judged on
  its own spread instead, and is underpowered unless it fails;
- the repeats the targets need (a step of ``detect_pct`` red within ``detect_nights`` nights with
  chance ``detect_power``, patchbench.robust.repeats_needed) are computed at that noise.

Per night, the one-sided p-values of every test that could be judged form ONE family, Holm-
adjusted at ``alpha`` (default: ``false_red_nights_per_month / 30``): the chance that a night
with no regression turns red is at most ``alpha`` (for valid tests), the error budget. A test's
outcome:

- ``fail``: significant at its Holm level AND the estimated change is worse than
  ``threshold_pct`` (a "regressed" run-level verdict beyond the threshold), and that held on
  ``consecutive_nights`` recorded nights in a row; ``warn`` when it held tonight only;
- ``pass``: the one-sided ``1 - pass_alpha`` bound excludes a change as bad as the threshold
  (tonight is shown not to have regressed by that much);
- ``quiet`` (a noise is known, ``underpowered_on: noise``, the default): no regression shown,
  tonight's noise is within the known noise, and tonight's repeats meet the targets at it: the
  night is green;
- ``underpowered`` (the same): tonight was clearly noisier than the known noise, or even the
  noise's lower 90 % bound needs more repeats than tonight ran (the job exits 5);
- ``inconclusive`` (no noise known, or ``underpowered_on: bound``): neither fail nor pass (the
  job exits 5, never silently green);
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
from patchbench.noise import Noise, pair_logs
from patchbench.noise import learn as learn_noise
from patchbench.robust import noise_bound, noise_excess, outliers, repeats_needed

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
    detect_pct: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="the step the repeats target is for (%); default max(5, 5/3 threshold_pct)",
    )

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

    @property
    def step_pct(self) -> float:
        """The step (%) the repeats target is for: ``detect_pct``, else
        ``max(5, 5/3 threshold_pct)`` (a 3 % threshold is for a 5 % step)."""
        return self.detect_pct or max(5.0, self.threshold_pct * 5.0 / 3.0)


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
        description="run-to-run CV (%) from an A/A run: the prior noise, used until the history "
        "holds learn_min_nights nights (patchbench/noise.py)",
    )
    underpowered_on: Literal["noise", "bound"] = Field(
        "noise",
        description="noise: a night is underpowered only when its noise is clearly worse than "
        "the learned (or prior) noise, or that noise needs more repeats than it ran; bound: "
        "whenever a test's bound cannot exclude the threshold (also the rule while no noise "
        "is known)",
    )
    noise_alpha: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description="level of 'tonight is noisier than learned' (chi-square, Bonferroni "
        "across the night's tests)",
    )
    outlier_k: float = Field(
        3.0,
        ge=2,
        le=100,
        description="a run farther than k learned sigmas from its night's "
        "median is set aside (at most one a night)",
    )
    learn_min_nights: int = Field(
        7,
        ge=2,
        le=365,
        description="nights with 2+ runs before the learned noise replaces run_cv_pct",
    )
    detect_nights: int = Field(
        3,
        ge=1,
        le=60,
        description="target: a step of a gate's detect_pct turns a night red "
        "within this many nights ...",
    )
    detect_power: float = Field(0.9, gt=0, lt=1, description="... with this chance")
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


Status = Literal[
    "fail", "warn", "pass", "quiet", "inconclusive", "underpowered", "ungated", "skipped", "missing"
]


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

    Noise (patchbench/noise.py): noise_source "learned" / "prior" (None: unknown, the test used
    tonight's own spread); noise_cv_pct: the noise the test assumed, as a CV in % (one paired
    ratio for same_run, one run for history); tonight_cv_pct: tonight's own spread the same way;
    noise_p: the chi-square p-value of "tonight is no noisier"; set_aside: runs (pairs) the
    outlier rule left out; repeats_needed: the repeats the targets need at that noise (None: no
    affordable number does).
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
    noise_source: str | None = None
    noise_cv_pct: float | None = None
    tonight_cv_pct: float | None = None
    noise_p: float | None = None
    set_aside: int = 0
    repeats_needed: int | None = None

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


@dataclass
class _Check:
    """One night's test of one key in both forms: ``known`` rests on the learned (or prior)
    noise, ``own`` on tonight's spread; ``kept``: the values whose spread is checked against the
    noise (paired log ratios, or log values), after the outlier rule set ``set_aside`` aside."""

    known: TestStat | None
    own: TestStat | None
    kept: np.ndarray
    set_aside: int = 0

    def pick(self, noisy: bool) -> TestStat | None:
        """``own`` when tonight is noisier than the noise (or nothing is known), else ``known``."""
        if self.known is None or (noisy and self.own is not None):
            return self.own
        return self.known


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


def _cv(sigma: float) -> str:
    return f"{100 * math.expm1(sigma):.2g} %"


def _same_run(
    tonight: Night, key: Key, bad: int, noise: Noise | None, settings: NightlySettings
) -> _Check | None:
    """The same-run check: paired log ratios of tonight's rounds, pairs beyond ``outlier_k``
    pair sigmas from their median set aside; ``known``: their mean against the pair noise
    (t with the noise's df), ``own``: the paired t test."""
    d = np.asarray(pair_logs(tonight, key), dtype=float)
    if d.size < 2:
        return None
    sig = noise.pair.sigma if noise is not None else math.nan
    mask = outliers(d, sig, settings.outlier_k)
    du = d[~mask]
    own = TestStat(stats.paired_t(du), bad, f"paired t on log ratios (n={du.size})")
    known = None
    if noise is not None and math.isfinite(sig):
        t = stats.TTest(float(du.mean()), sig / math.sqrt(du.size), noise.df, int(du.size))
        known = TestStat(
            t,
            bad,
            f"paired log ratios vs the {noise.source} pair noise {_cv(sig)} "
            f"(n={du.size}, df={noise.df:.0f})",
        )
    return _Check(known, own, du, int(mask.sum()))


def _history(
    values: Sequence[float | None],
    window: Sequence[Night],
    key: Key,
    bad: int,
    settings: NightlySettings,
    noise: Noise | None = None,
    cache: dict | None = None,
) -> _Check | None:
    """The history check: tonight's log values (runs beyond ``outlier_k`` run sigmas from their
    median set aside) against the window's nightly levels (each night's runs the same way).
    ``known`` (learned noise with a night-to-night part): tonight's mean minus the mean of the K
    levels, variance ``night^2 + run^2 / n`` for tonight plus the mean of the K nights' own over
    K, Satterthwaite's df; ``own``: ``history_test`` (prediction t on the K levels, or Welch)."""
    t = np.asarray(_logs(values), dtype=float)
    if t.size == 0:
        return None
    sr = noise.run.sigma if noise is not None else math.nan
    mask = outliers(t, sr, settings.outlier_k)
    tu = t[~mask]
    nights = [x for x in (_kept_logs(n, key, sr, settings, cache) for n in window) if x.size]
    levels = [float(x.mean()) for x in nights]
    own = None
    if settings.history_test == "nights" and len(levels) >= 2:
        k = len(levels)
        own = TestStat(
            stats.prediction_t(tu, levels),
            bad,
            f"tonight vs {k} nightly means (prediction t, df={k - 1})",
        )
    elif settings.history_test == "welch" and tu.size >= 2 and sum(x.size for x in nights) >= 2:
        ref = np.concatenate(nights)
        own = TestStat(
            stats.welch_t(tu, ref),
            bad,
            f"Welch t on log values ({tu.size} runs vs {ref.size} runs of {len(nights)} nights)",
        )
    known = None
    if (
        noise is not None
        and noise.source == "learned"
        and math.isfinite(noise.night_sigma)
        and len(levels) >= 2
    ):
        k, sn2, sr2 = len(levels), noise.night_sigma**2, sr * sr
        a = sn2 * (1.0 + 1.0 / k)  # night-to-night part (df of the level estimate)
        b = sr2 / tu.size + sum(sr2 / x.size for x in nights) / (k * k)  # run part
        df_a = max(noise.level.df, 1.0)
        df = (a + b) ** 2 / ((a * a) / df_a + (b * b) / noise.df) if a + b > 0 else noise.df
        tt = stats.TTest(
            float(tu.mean()) - float(np.mean(levels)), math.sqrt(a + b), df, int(tu.size)
        )
        known = TestStat(
            tt,
            bad,
            f"tonight vs {k} nightly levels, learned noise: run {_cv(sr)}, night "
            f"{_cv(noise.night_sigma)} (df={df:.0f})",
        )
    return _Check(known, own, tu, int(mask.sum()))


def _kept_logs(
    night: Night, key: Key, sigma: float, settings: NightlySettings, cache: dict | None
) -> np.ndarray:
    """A night's log values of ``key`` that the outlier rule keeps (memoised in ``cache``)."""
    ck = (night.run_id, key)
    if cache is not None and ck in cache:
        return cache[ck]
    x = np.asarray(_logs(_vals(night, key)), dtype=float)
    x = x[~outliers(x, sigma, settings.outlier_k)]
    if cache is not None:
        cache[ck] = x
    return x


def _clean_nights(
    nights: Sequence[Night],
    key: Key,
    bad: int,
    gate: Gate,
    settings: NightlySettings,
    noise: Noise | None = None,
    cache: dict | None = None,
) -> list[Night]:
    """The nights (oldest first) that may serve as reference: a night that was itself a
    regression against the clean nights before it (one-sided p <= the family alpha and worse than
    the threshold) is left out, so one bad night does not widen the reference and hide the next
    one, and a clean night after it is judged against clean nights. A step that persists stays red
    until ``history_since`` is moved past it (accepting the new level)."""
    kept: list[Night] = []
    for n_ in nights:
        if len(kept) >= settings.min_history_nights:
            c = _history(_vals(n_, key), kept[-settings.window_nights :], key, bad, settings, noise)
            t = c.pick(False) if c is not None else None
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
    for a gate whose metric the run lacks. The noise of each gated metric is learned from every
    earlier night (:func:`patchbench.noise.learn`). Reads only; raises
    :class:`patchbench.history.HistoryError` when the history cannot be read.
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
            return res, None
        if res.n < settings.min_repeats:
            res.status = "ungated"
            res.reason = (
                f"{res.n} run(s) tonight, {settings.min_repeats} needed: too few runs "
                f"to compare with earlier nights"
            )
            return res, None
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

    if check is None or check.pick(False) is None:
        res.status = "ungated"
        res.reason = "no usable values (non-positive or missing)"
        return res, None
    res.set_aside = check.set_aside
    return res, _Pending(res, check, gate, key, noise, sigma, se_of_n, earlier)


def _judge(pending: list[_Pending], settings: NightlySettings) -> None:
    """The noise check (Bonferroni at ``noise_alpha`` across the night's tests), then Holm across
    the night's tests, then fail / warn / pass / quiet / inconclusive / underpowered per test."""
    alpha = settings.family_alpha
    checked = [p for p in pending if p.noise is not None and p.check.kept.size >= 2]
    for p in checked:
        ratio, pn = noise_excess(p.check.kept, p.sigma)
        p.result.noise_p = pn
        p.result.tonight_cv_pct = 100.0 * math.expm1(ratio * p.sigma)
        p.noisy = pn < settings.noise_alpha / len(checked)
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
    level_b = alpha / max(len(pending), 1)
    for p, (rejected, level) in zip(
        pending, stats.holm([x.test.p for x in pending], alpha), strict=False
    ):
        r, t, g = p.result, p.test, p.gate
        assert t is not None
        r.level = level
        short = False
        if p.se_of_n is not None and p.noise is not None:
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
            short = need[1] is None or r.n < need[1]
        worse = beyond(t, g.threshold_pct)
        if rejected and worse:
            held = 1
            for c in p.earlier:
                e = c.pick(False) if c is not None else None
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
            continue
        bound_txt = f"the {100 * (1 - settings.pass_alpha):g} % bound {_pct(r.bound_pct)}"
        shown = shown_not_worse(t, g.threshold_pct, settings.pass_alpha)
        if settings.underpowered_on == "noise" and p.noise is not None:
            src = f"{p.noise.source} noise {_cv(p.sigma)}"
            if p.noisy:
                r.status = "underpowered"
                r.reason = (
                    f"{_pct(r.change_pct)}, not a regression; but tonight's spread "
                    f"{_pct(r.tonight_cv_pct)[1:]} CV is clearly above the {src} (chi-square "
                    f"p = {r.noise_p:.2g} < {settings.noise_alpha:g}/{len(checked)}): "
                    f"tonight's runs could hide a regression"
                )
            elif short:
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
                r.reason = (
                    f"{_pct(r.change_pct)}; {bound_txt} excludes a {g.threshold_pct:g} % regression"
                )
            else:
                r.status = "quiet"
                r.reason = (
                    f"{_pct(r.change_pct)}: no regression shown; tonight's noise is within "
                    f"the {src}, and {r.n} repeats meet the targets ({r.repeats_needed} needed)"
                )
        elif shown:
            r.status = "pass"
            r.reason = (
                f"{_pct(r.change_pct)}; {bound_txt} excludes a {g.threshold_pct:g} % regression"
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


#: statuses that make a night underpowered (exit 5)
UNDERPOWERED = ("inconclusive", "underpowered", "ungated")

#: night outcomes, worst first (the exit code follows the first that applies)
OUTCOMES = ("red", "underpowered", "green")


def night_outcome(results: Sequence[GateResult]) -> str:
    """ "red" (a gate failed), "underpowered" (nothing failed but a test is inconclusive,
    underpowered or ungated: the night could not show that nothing regressed), or "green"."""
    if any(r.status == "fail" for r in results):
        return "red"
    if any(r.status in UNDERPOWERED for r in results):
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
    "UNDERPOWERED",
    "DEFAULT_HISTORY",
    "NIGHTS_PER_MONTH",
]
