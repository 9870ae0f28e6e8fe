"""Nightly gates: the config's ``nightly:`` section and the rules it sets (docs/nightly.md).

Each gate names a metric and a threshold and yields one :class:`GateResult` per variant and kind:

- ``same_run`` (every variant but the baseline and its A/A copies): the REPORT's verdict of
  tonight's run (compare.json: paired t on log ratios, one Holm family per report), never a test
  of its own. ``fail`` when it says ``regressed`` and the change is worse than ``threshold_pct``
  (``warn`` until it did so on ``consecutive_nights`` nights in a row); ``pass`` when it says
  ``improved`` or ``equivalent``, or its interval excludes a regression as large as the
  threshold; otherwise undecided (below). A night is never red on a same-run gate while its own
  report says inconclusive.
- ``history`` (every listed variant, stock included): tonight's runs against the levels of the
  last ``window_nights`` clean nights of the same config on the same machine
  (:func:`same_machine`; its noise learned from those nights alone), unpaired, on the noise learned from the
  history (:mod:`patchbench.nightly.noise`: run and night-to-night noise, a run beyond
  ``outlier_k`` sigmas from its night's median set aside) or, while none is known, on tonight's
  spread (``history_test``: a prediction t on the K levels, or Welch). A night that was itself
  off the nights before it, in either direction, leaves the reference. The night's history tests
  form one Holm family at ``alpha`` (default ``false_red_nights_per_month / 30``): ``fail`` when
  significant at its Holm level and worse than the threshold (``warn`` likewise), ``pass`` when
  the one-sided ``1 - pass_alpha`` bound excludes the threshold, else undecided.

An undecided test is, with a noise known and ``underpowered_on: noise``: ``underpowered`` when
tonight's spread is clearly above it (:func:`noise_excess`: a bootstrap on the learned runs'
own residuals, heavy tails included, or a chi-square on a prior; Bonferroni at ``noise_alpha``
over the night's tests) or tonight ran fewer repeats than even the noise's lower 90 % bound
needs for the targets (a ``detect_pct`` step red within ``detect_nights`` nights with chance
``detect_power``), else ``quiet`` (green); otherwise ``inconclusive``. ``ungated``: fewer than
``min_repeats`` runs (pairs); ``skipped``: the history is warming up; ``missing``: the run lacks the metric or its
direction is unknown (a config error). underpowered, inconclusive and ungated make a night exit 5.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from patchbench import stats
from patchbench.analysis.power import detectable_shift
from patchbench.config.nightly import (
    Gate,
    NightlySettings,
)
from patchbench.nightly.history import History, Key, Night, SameRunEffect
from patchbench.nightly.noise import (
    Noise,
    learn,
    logs,
    noise_bound,
    noise_excess,
    outliers,
    repeats_needed,
    usable_nights,
)

# ---------------------------------------------------------------------------------------------
# what the gates yield

Status = Literal[
    "fail",
    "warn",
    "pass",
    "quiet",
    "inconclusive",
    "underpowered",
    "ungated",
    "skipped",
    "missing",
    "learning",
]
#: statuses that make a night underpowered (exit 5)
UNDERPOWERED = ("inconclusive", "underpowered", "ungated")


@dataclass
class GateResult:
    """One gate test of one (kind, variant, suite, metric); changes in %, values in the metric's
    unit. ``value``: tonight's median of the variant; ``reference``: the baseline's median
    tonight (same_run) or the median of the window's nightly medians (history); ``change_pct``;
    ``bound_pct``: the worst change tonight allows (same_run: the report interval's worse end;
    history: the one-sided ``1 - pass_alpha`` bound); ``p_value`` / ``level``: same_run the
    report's two-sided p and Holm level, history the one-sided p and its Holm level tonight;
    ``n``: runs (pairs) tonight; ``n_history``: nights in the window. Noise: ``noise_source``
    ("learned" / "prior"), ``noise_cv_pct`` (one paired ratio for same_run, one run for
    history), ``tonight_cv_pct``, ``noise_p`` (:func:`noise_excess`), ``set_aside`` (runs the outlier
    rule left out), ``repeats_needed`` (None: more than affordable). ``mde_pct``: the smallest
    change (%, in the bad direction) the test shows with 80 % power at tonight's noise and
    repeats (:func:`minimum_detectable`); ``learning_nights``: while the noise is being learned,
    the nights it is learned from so far (status ``learning``: it would have failed)."""

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
    mde_pct: float | None = None
    learning_nights: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def night_outcome(results: Sequence[GateResult]) -> str:
    """ "red" (a gate failed), "underpowered" (else a test is in :data:`UNDERPOWERED`),
    "learning" (else a gate would have failed while the noise is learned), "green", or "no
    gates" when there is no result (nothing was checked)."""
    if not results:
        return "no gates"
    if any(r.status == "fail" for r in results):
        return "red"
    if any(r.status in UNDERPOWERED for r in results):
        return "underpowered"
    if any(r.status == "learning" for r in results):
        return "learning"
    return "green"


# ---------------------------------------------------------------------------------------------
# metrics: unit and direction


@lru_cache(maxsize=256)
def _suite_metric_info(suite: str, metric: str) -> Any:
    """The suite's MetricInfo (a sweep point's ``<metric>@<point>`` has its metric's), or None."""
    try:
        from patchbench.suite import get_suite

        known = get_suite(suite).metrics
        return known.get(metric) or known.get(metric.split("@", 1)[0])
    except Exception:  # noqa: BLE001 (a suite that does not import must not stop the gates)
        return None


def metric_unit(suite: str, metric: str, nights: Sequence[Night] = ()) -> str:
    """Display unit: compare.json's / the history's, else the suite's, else the name's suffix."""
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
        if n.better.get((suite, metric)) in ("higher", "lower"):
            return n.better[(suite, metric)]
    b = getattr(_suite_metric_info(suite, metric), "better", None)
    return b if b in ("higher", "lower") else None


# ---------------------------------------------------------------------------------------------
# the history tests on log values


@dataclass
class TestStat:
    """A one-sided t test: ``t`` (:class:`patchbench.stats.TTest` of the log change), ``bad``
    the sign of a regression (+1 lower-is-better, -1 higher-is-better), ``p`` in that
    direction."""

    t: stats.TTest
    bad: int
    name: str
    p: float = field(init=False)

    def __post_init__(self) -> None:
        self.p = self.t.p_value("greater" if self.bad > 0 else "less")

    def bound(self, alpha: float) -> float:
        """The one-sided ``1 - alpha`` bound of the log change in the bad direction."""
        return self.t.bound(alpha, self.bad)


def _log_threshold(threshold_pct: float, bad: int) -> float:
    """The threshold on the log scale in the bad direction (negative for higher-is-better)."""
    frac = threshold_pct / 100.0
    return math.log1p(frac) if bad > 0 else (math.log1p(-frac) if frac < 1 else -math.inf)


def _beyond(log_change: float, threshold_pct: float, bad: int) -> bool:
    """A log change at least ``threshold_pct`` in the bad direction."""
    lt = _log_threshold(threshold_pct, bad)
    return log_change >= lt if bad > 0 else log_change <= lt


def _pct_beyond(change_pct: float, threshold_pct: float, bad: int) -> bool:
    return change_pct > -100 and _beyond(math.log1p(change_pct / 100.0), threshold_pct, bad)


@dataclass
class _Check:
    """One night's test of one key: ``known`` on the learned (or prior) noise, ``own`` on
    tonight's spread; ``kept``: the log values (same_run: log ratios) whose spread is checked
    against the noise, after the outlier rule set ``set_aside`` aside."""

    known: TestStat | None
    own: TestStat | None
    kept: np.ndarray
    set_aside: int = 0

    def pick(self, noisy: bool) -> TestStat | None:
        """``own`` when tonight is noisier than the noise (or nothing is known), else ``known``."""
        if self.known is None or (noisy and self.own is not None):
            return self.own
        return self.known


def _cv(sigma: float) -> str:
    return f"{100 * math.expm1(sigma):.2g} %"


def _history(
    values: Sequence[float | None],
    window: Sequence[Night],
    key: Key,
    bad: int,
    settings: NightlySettings,
    noise: Noise | None,
    cache: dict,
) -> _Check | None:
    """Tonight's log values (outliers set aside) against the window's nightly levels. ``known``:
    the learned run and night noise (:func:`_known_variance`); ``own``: ``history_test``."""
    t = np.asarray(logs(values), dtype=float)
    if t.size == 0:
        return None
    sr = noise.run.sigma if noise is not None else math.nan
    mask = outliers(t, sr, settings.outlier_k)
    tu = t[~mask]
    nights = [x for x in (_kept_logs(n, key, sr, settings, cache) for n in window) if x.size]
    levels = [float(x.mean()) for x in nights]
    k = len(levels)
    own = None
    if settings.history_test == "nights" and k >= 2:
        name = f"tonight vs {k} nightly means (prediction t, df={k - 1})"
        own = TestStat(stats.prediction_t(tu, levels), bad, name)
    elif settings.history_test == "welch" and tu.size >= 2 and sum(x.size for x in nights) >= 2:
        ref = np.concatenate(nights)
        name = f"Welch t on log values ({tu.size} runs vs {ref.size} runs of {k} nights)"
        own = TestStat(stats.welch_t(tu, ref), bad, name)
    known = None
    if (
        noise is not None
        and noise.source == "learned"
        and math.isfinite(noise.night_sigma)
        and k >= 2
    ):
        var, df = _known_variance(noise, tu.size, [x.size for x in nights])
        tt = stats.TTest(float(tu.mean()) - float(np.mean(levels)), math.sqrt(var), df, tu.size)
        name = (
            f"tonight vs {k} nightly levels, learned noise: run {_cv(sr)}, night "
            f"{_cv(noise.night_sigma)} (df={df:.0f})"
        )
        known = TestStat(tt, bad, name)
    return _Check(known, own, tu, int(mask.sum()))


def _known_variance(noise: Noise, n: int, sizes: Sequence[int]) -> tuple[float, float]:
    """(variance, df) of tonight's mean log value (n runs) minus the mean of K reference levels
    (``sizes``: their runs): ``night^2 (1 + 1/K) + run^2 / n + sum(run^2 / n_i) / K^2``.

    ``night^2`` is estimated as ``level^2 - run^2 / repeats``, so the variance is ``(1 + 1/K)
    level^2 + c run^2`` and its df Satterthwaite's (1946) for that combination (``level^2`` on
    the level's df, ``run^2`` on the run noise's): a night part that is a small share of
    ``level^2`` is as uncertain as ``level^2``. With no night part (0) the run noise alone."""
    k = len(sizes)
    f = 1.0 + 1.0 / k
    sr2 = noise.run.sigma**2
    inv = sum(1.0 / m for m in sizes) / (k * k)
    if not noise.night_sigma > 0:
        return sr2 * (1.0 / n + inv), noise.df
    level2 = f * noise.level.sigma**2
    rest = sr2 * (1.0 / n + inv - f / noise.repeats)
    var = level2 + rest
    den = level2 * level2 / max(noise.level.df, 1.0) + rest * rest / noise.df
    return var, (var * var / den if den > 0 else noise.df)


def _kept_logs(
    night: Night, key: Key, sigma: float, settings: NightlySettings, cache: dict
) -> np.ndarray:
    """A night's log values of ``key`` that the outlier rule keeps (memoised in ``cache``)."""
    ck = (night.run_id, key)
    if ck not in cache:
        x = np.asarray(logs(night.values.get(key, [])), dtype=float)
        cache[ck] = x[~outliers(x, sigma, settings.outlier_k)]
    return cache[ck]


def _clean_nights(
    nights: Sequence[Night],
    key: Key,
    bad: int,
    gate: Gate,
    settings: NightlySettings,
    noise: Noise | None,
    cache: dict,
) -> list[Night]:
    """The nights (oldest first) that may serve as reference: a night significantly beyond the
    threshold from the clean nights before it, in EITHER direction (at the family alpha), is
    left out. Symmetric, so drift does not bias the reference (a trimmed mean must trim both
    tails; Huber & Ronchetti, "Robust Statistics" (2009), 3.3); a step that persists stays red
    until ``history_since`` is moved past it."""
    kept: list[Night] = []
    a = settings.family_alpha
    for n_ in nights:
        if len(kept) >= settings.min_history_nights:
            c = _history(
                n_.values.get(key, []),
                kept[-settings.window_nights :],
                key,
                bad,
                settings,
                noise,
                cache,
            )
            t = c.pick(False) if c is not None else None
            if t is not None and any(
                TestStat(t.t, side, t.name).p <= a and _beyond(t.t.mean, gate.threshold_pct, side)
                for side in (bad, -bad)
            ):
                continue
        kept.append(n_)
    return kept


# ---------------------------------------------------------------------------------------------
# evaluation


@dataclass
class _Pending:
    """A test not decided alone: waits for the night's noise check (and, history, Holm)."""

    result: GateResult
    check: _Check
    gate: Gate
    bad: int
    noise: Noise | None
    sigma: float  # the noise tonight's spread is checked against
    se_of_n: Callable[[int, float], float] | None  # repeats -> a night's standard error
    level: float  # the one-sided level the repeats needed are computed at
    earlier: list[_Check | None] = field(default_factory=list)  # history: the streak, newest first
    decided: bool = False  # same_run: fail, warn or pass already
    test: TestStat | None = None
    noisy: bool = False
    need: tuple[int | None, int | None] = (None, None)  # repeats needed at the noise, its bound


def _prior_of(history: History | Sequence[Night], tonight: Night) -> list[Night]:
    """Every night before tonight, oldest first."""
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
    return sorted(prior, key=lambda n: (n.night_utc or "", n.run_id))


def evaluate(
    history: History | Sequence[Night], tonight: Night, settings: NightlySettings
) -> list[GateResult]:
    """Every gate of ``settings`` on tonight's night (module docstring).

    history: an open :class:`History` or the earlier nights of the config (tonight and later
    nights are left out); tonight: a :class:`Night` whose ``comparisons`` hold its report's
    verdicts (:func:`patchbench.nightly.history.night_from_run`). Returns one result per (gate,
    kind, variant, suite, metric), or one "missing" result per kind for a gate whose metric the
    run lacks. Raises :class:`patchbench.nightly.history.HistoryError` when the history cannot
    be read."""
    prior = _prior_of(history, tonight)
    mine = same_machine(prior, tonight)
    nights_all = [tonight, *reversed(prior)]
    results: list[GateResult] = []
    pending: list[_Pending] = []
    learned: dict[tuple[bool, str, str], Noise | None] = {}
    scoped: list[tuple[GateResult, Noise | None, list[Night]]] = []
    have = sorted({(s, m) for (_v, s, m) in tonight.values})
    for gate in settings.gates:
        kinds = gate.kinds()
        keys = [(s, m) for s, m in have if m == gate.metric_name and gate.suite in (None, s)]
        if not keys:
            names = [f"{s}.{m}" for s, m in have]
            reason = (
                f"metric '{gate.metric}' is not in this run; it has: "
                f"{', '.join(names[:12]) or 'no metrics'}{' ...' if len(names) > 12 else ''}"
            )
            results += _missing(gate, kinds, gate.suite or "*", gate.metric_name, reason)
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
            for kind in kinds:
                # the history gates judge tonight against this machine's nights only
                nights = mine if kind == "history" else prior
                lk = (len(nights) < len(prior), suite, metric)
                if lk not in learned:
                    learned[lk] = learn(
                        nights,
                        suite,
                        metric,
                        prior_cv_pct=settings.run_cv_pct,
                        min_nights=settings.learn_min_nights,
                    )
                noise = learned[lk]
                for v in tonight.variants:
                    if gate.variants is not None and v not in gate.variants:
                        continue
                    if kind == "same_run" and (v == tonight.baseline or v in tonight.aa_variants):
                        continue
                    key = (v, suite, metric)
                    res = GateResult(
                        gate.metric, kind, v, suite, metric, "pass", "", unit=unit,  # type: ignore[arg-type]
                        better=better, threshold_pct=gate.threshold_pct,
                        value=tonight.median(key), nights_needed=gate.consecutive_nights,
                        noise_source=noise.source if noise is not None else None,
                    )  # fmt: skip
                    check = _same_run if kind == "same_run" else _history_gate
                    p = check(res, tonight, nights, key, bad, gate, settings, noise)
                    results.append(res)
                    scoped.append((res, noise, nights))
                    if p is not None:
                        pending.append(p)
    _judge(pending, settings)
    if settings.hold_while_learning:
        for r, noise, nights in scoped:
            if noise is None or noise.source != "learned":
                where = " on this machine" if r.kind == "history" and tonight.machine else ""
                hold_while_learning(r, usable_nights(nights, r.suite, r.metric), settings, where)
    return results


def same_machine(nights: Sequence[Night], tonight: Night) -> list[Night]:
    """The nights that ran on tonight's machine (equal :attr:`Night.machine`; an unknown
    machine matches only unknown ones): the history gates' only reference, and what their noise
    and the change points are learned from (a pool of mixed machines is then neither red on a
    slower machine nor blind from the spread between machines)."""
    return [n for n in nights if n.machine == tonight.machine]


#: the power at which :func:`minimum_detectable` states the smallest change a gate can see
MDE_POWER = 0.8


def beyond_doubt(r: GateResult, settings: NightlySettings) -> bool:
    """A change no noise explains, so a gate fails even while the noise is learned: its test's
    p (same_run: the report's two-sided p; history: the one-sided p) is at most
    ``beyond_doubt_alpha`` (0.001) AND the change is at least ``beyond_doubt_pct`` (50 %) in the
    bad direction. A CPU config's run noise of 36 % CV gives a paired ratio a sigma of about
    0.43 (log): a 50 % slowdown (log 0.69) is 1.6 such sigmas for ONE pair, and the p bound
    asks the night's own test to see it too."""
    if r.p_value is None or r.change_pct is None or r.better not in ("higher", "lower"):
        return False
    bad = -1 if r.better == "higher" else 1
    return r.p_value <= settings.beyond_doubt_alpha and _pct_beyond(
        r.change_pct, settings.beyond_doubt_pct, bad
    )


def hold_while_learning(
    r: GateResult, nights: int, settings: NightlySettings, where: str = ""
) -> None:
    """While a metric's noise is not learned yet (fewer than ``learn_min_nights`` usable nights),
    a ``fail`` or ``warn`` that is not :func:`beyond_doubt` becomes ``learning``: the night says
    "learning (k of n nights)" instead of red (its own spread and a few nights cannot tell a
    small change from noise); ``where``: " on this machine" for a history gate's (its nights are
    this machine's). Every result of such a metric records ``learning_nights``."""
    r.learning_nights = nights
    if r.status not in ("fail", "warn") or beyond_doubt(r, settings):
        return
    r.reason = (
        f"learning{where} ({nights} of {settings.learn_min_nights} nights): would have been "
        f"{r.status}: "
        f"{r.reason}; red while learning only beyond doubt (p <= "
        f"{settings.beyond_doubt_alpha:g} and at least {settings.beyond_doubt_pct:g} % worse)"
    )
    r.status = "learning"


def minimum_detectable(
    se: float, df: float, alpha: float, bad: int, alternative: str = "larger"
) -> float | None:
    """The smallest change (%, as a positive size in the bad direction) that a t test on log
    values with standard error ``se`` and ``df`` degrees of freedom shows at ``alpha`` with
    80 % power (:data:`MDE_POWER`; the exact noncentral t, Cohen 1988, ch. 2, through
    :func:`patchbench.analysis.power.detectable_shift`); None when ``se`` is unknown."""
    if not (se > 0 and math.isfinite(se) and df > 0 and 0 < alpha < 1):
        return None
    d = detectable_shift(se, df, alpha, MDE_POWER, alternative=alternative)  # type: ignore[arg-type]
    return abs(100.0 * math.expm1(bad * d))


def _missing(
    gate: Gate, kinds: Sequence[str], suite: str, metric: str, reason: str, **kw: Any
) -> list[GateResult]:
    """One "missing" result per kind for a gate that cannot be evaluated."""
    return [
        GateResult(
            gate.metric,
            kind,
            "*",
            suite,
            metric,
            "missing",
            reason,  # type: ignore[arg-type]
            threshold_pct=gate.threshold_pct,
            nights_needed=gate.consecutive_nights,
            **kw,
        )  # fmt: skip
        for kind in kinds
    ]


def _pairs(night: Night, key: Key) -> list[float]:
    """Tonight's paired log ratios ``log(variant / baseline)`` by repeat index."""
    base = night.values.get((night.baseline, *key[1:]), [])
    return [
        math.log(v / b)
        for b, v in zip(base, night.values.get(key, []), strict=False)
        if b is not None and v is not None and b > 0 and v > 0
    ]


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


def _regressed(e: SameRunEffect | None, gate: Gate, bad: int) -> bool:
    """The report's verdict is "regressed" and its change worse than the threshold (a change
    not known in %, e.g. read back from an old history, counts as worse)."""
    if e is None or e.verdict != "regressed":
        return False
    change = e.pct[0]
    return change is None or _pct_beyond(change, gate.threshold_pct, bad)


def _same_run(
    res: GateResult,
    tonight: Night,
    prior: Sequence[Night],
    key: Key,
    bad: int,
    gate: Gate,
    settings: NightlySettings,
    noise: Noise | None,
) -> _Pending | None:
    """The report's verdict on the variant tonight, mapped onto the gate (module docstring);
    a _Pending when neither fail nor pass (the noise decides quiet or underpowered)."""
    e = tonight.comparisons.get(key)
    d = _pairs(tonight, key)
    res.reference = tonight.median((tonight.baseline, *key[1:]))
    res.n = n = len(d)
    if n < settings.min_repeats:
        res.status = "ungated"
        res.reason = (
            f"{n} paired repeat(s), {settings.min_repeats} needed: "
            f"{'one run' if n == 1 else 'so few runs'} cannot separate the patch "
            f"from run-to-run noise"
        )
        return None
    if e is None or e.verdict in (None, "incomplete"):
        res.status = "ungated"
        res.reason = (
            "the report's row is incomplete (a cell it needs failed)"
            if e is not None
            else "compare.json has no verdict for it"
        )
        return None
    change, low, high = e.pct
    conf = f"{100 * e.confidence:.4g} %" if e.confidence is not None else "its"
    res.change_pct = change
    res.bound_pct = (low if bad < 0 else high) if low is not None else None
    res.p_value = e.p_value
    res.level = None if e.confidence is None else 1.0 - e.confidence
    res.test = f"the report's {e.ci_method or 'verdict'}: {e.verdict}"
    shown = f"{_pct(change)} [{_pct(low)}, {_pct(high)}] ({conf} interval)"
    within = res.bound_pct is not None and not _pct_beyond(res.bound_pct, gate.threshold_pct, bad)
    decided = True
    if _regressed(e, gate, bad):
        held = 1
        for n_ in reversed(prior[len(prior) - gate.consecutive_nights + 1 :]):
            if not _regressed(n_.comparisons.get(key), gate, bad):
                break
            held += 1
        what = f"the report says regressed: {shown} is worse than the {gate.threshold_pct:g} % threshold"
        _fail_or_warn(res, held, gate, what)
    elif e.verdict in ("improved", "equivalent") or within:
        res.status = "pass"
        res.reason = f"the report says {e.verdict}: {shown}" + (
            f" excludes a {gate.threshold_pct:g} % regression" if within else ""
        )
    else:
        decided = False
        res.reason = (
            f"the report says {e.verdict}: {shown} reaches the {gate.threshold_pct:g} % threshold"
        )
    sigma = noise.pair_sigma if noise is not None else math.nan
    return _Pending(
        res, _Check(None, None, np.asarray(d, dtype=float)), gate, bad, noise, sigma,
        (lambda m, f=1.0: f * sigma / math.sqrt(m)) if noise is not None else None,
        (1.0 - (e.confidence or 0.95)) / 2.0, decided=decided,
    )  # fmt: skip


def _history_gate(
    res: GateResult,
    tonight: Night,
    prior: Sequence[Night],
    key: Key,
    bad: int,
    gate: Gate,
    settings: NightlySettings,
    noise: Noise | None,
) -> _Pending | None:
    """Tonight's runs against the window of clean nights before the streak (None, with ``res``
    skipped or ungated, while warming up or with too few runs)."""
    vals = tonight.values.get(key, [])
    res.n = sum(1 for v in vals if v is not None)
    need = gate.consecutive_nights
    having = [
        n_
        for n_ in prior
        if n_.median(key) is not None
        and (settings.history_since is None or n_.night_utc >= settings.history_since)
    ]
    streak = having[-(need - 1) :] if need > 1 else []
    cache: dict = {}
    before = having[: len(having) - len(streak)][-2 * settings.window_nights :]
    window = _clean_nights(before, key, bad, gate, settings, noise, cache)[
        -settings.window_nights :
    ]
    res.n_history = len(window)
    res.window_run_ids = [n_.run_id for n_ in window]
    if window:
        res.reference = statistics.median([n_.median(key) for n_ in window])
    if len(window) < settings.min_history_nights:
        res.status = "skipped"
        res.reason = (
            f"warming up: {len(window)} night(s) in the history"
            f"{' on this machine' if tonight.machine else ''}, "
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
    if check is None or check.pick(False) is None:
        res.status = "ungated"
        res.reason = "no usable values (non-positive or missing)"
        return None
    res.set_aside = check.set_aside
    # each night of a streak is judged against the K nights before the streak
    earlier = [
        _history(n_.values.get(key, []), window, key, bad, settings, noise, cache)
        for n_ in reversed(streak)
    ]
    sigma = noise.run.sigma if noise is not None else math.nan
    se_of_n = None
    if noise is not None:
        sn2 = noise.night_sigma**2 if math.isfinite(noise.night_sigma) else 0.0
        kk = settings.window_nights

        def se_of_n(m: int, f: float = 1.0) -> float:
            return f * math.sqrt((sn2 + sigma**2 / m) * (1.0 + 1.0 / kk))

    return _Pending(res, check, gate, bad, noise, sigma, se_of_n, math.nan, earlier)


def _judge(pending: list[_Pending], settings: NightlySettings) -> None:
    """The noise check (Bonferroni at ``noise_alpha`` over the night's tests), Holm over the
    history tests at the family alpha, the repeats each test needs, then each status."""
    checked = [p for p in pending if p.noise is not None and p.check.kept.size >= 2]
    for p in checked:
        shape = p.noise.shape  # type: ignore[union-attr]
        same = p.result.kind == "same_run"
        trim = None if same else (p.check.kept.size + p.check.set_aside, settings.outlier_k)
        ratio, pn = noise_excess(p.check.kept, p.sigma, shape, same, trim)
        p.result.noise_p = pn
        p.result.tonight_cv_pct = 100.0 * math.expm1(ratio * p.sigma)
        p.noisy = pn < settings.noise_alpha / len(checked)
    hist = [p for p in pending if p.result.kind == "history"]
    alpha = settings.family_alpha
    for p in hist:
        r, p.test = p.result, p.check.pick(p.noisy)
        assert p.test is not None
        p.level = alpha / len(hist)  # the repeats needed: Bonferroni over the history tests
        r.test, r.p_value = p.test.name, p.test.p
        r.change_pct = 100.0 * math.expm1(p.test.t.mean)
        r.bound_pct = 100.0 * math.expm1(p.test.bound(settings.pass_alpha))
    for p in pending:
        _repeats(p, settings)
        _mde(p)
    steps = stats.holm([p.test.p for p in hist], alpha)  # type: ignore[union-attr]
    for p, (rejected, level) in zip(hist, steps, strict=True):
        t, r, thr = p.test, p.result, p.gate.threshold_pct
        assert t is not None
        r.level = level
        bound = f"the {100 * (1 - settings.pass_alpha):g} % bound {_pct(r.bound_pct)}"
        p.decided = True
        if rejected and _beyond(t.t.mean, thr, p.bad):
            held = 1
            for c in p.earlier:
                e = c.pick(False) if c is not None else None
                if e is None or not (e.p <= level and _beyond(e.t.mean, thr, p.bad)):
                    break
                held += 1
            what = (
                f"{_pct(r.change_pct)} (one-sided p = {t.p:.2g} <= Holm level {level:.2g} of "
                f"{len(hist)} tests; {t.name}) is worse than the {thr:g} % threshold"
            )
            _fail_or_warn(r, held, p.gate, what)
        elif t.bound(settings.pass_alpha) * p.bad < _log_threshold(thr, p.bad) * p.bad:
            r.status = "pass"
            r.reason = f"{_pct(r.change_pct)}; {bound} excludes a {thr:g} % regression"
        else:
            sig = " significant but within the threshold," if rejected else ""
            r.reason = f"{_pct(r.change_pct)},{sig} but {bound} reaches the {thr:g} % threshold"
            p.decided = False
    for p in pending:
        if not p.decided:
            _undecided(p, settings, len(checked))


def _repeats(p: _Pending, settings: NightlySettings) -> None:
    """The repeats the targets need at the test's noise and at its lower 90 % bound (same_run:
    the report's paired t test, nothing set aside; history: one run set aside)."""
    if p.noise is None or p.se_of_n is None:
        return
    g, same = p.gate, p.result.kind == "same_run"
    step, thr = abs(_log_threshold(g.step_pct, p.bad)), abs(_log_threshold(g.threshold_pct, p.bad))
    p.need = tuple(  # type: ignore[assignment]
        repeats_needed(
            lambda m, f=f, se=p.se_of_n: se(m, f),
            step,
            thr,
            p.level,
            settings.detect_nights,
            settings.detect_power,
            0 if same else 1,
            paired_t=same,
        )
        for f in (1.0, noise_bound(p.noise.df, 0.1))
    )
    p.result.repeats_needed = p.need[0]
    p.result.noise_cv_pct = 100.0 * math.expm1(p.sigma)


def _mde(p: _Pending) -> None:
    """The smallest change the test can see tonight (:func:`minimum_detectable`). same_run: the
    report's paired t on tonight's ``n`` pairs (df ``n - 1``) at its two-sided level, with the
    learned (or prior) pair noise, or tonight's own spread when tonight is noisier or none is
    known; history: the test tonight used (its standard error and df) at the Bonferroni level
    ``alpha / m`` of the night's history tests."""
    r = p.result
    if r.kind == "same_run":
        n = p.check.kept.size
        if n < 2 or r.level is None:
            return
        own = float(np.std(p.check.kept, ddof=1))
        sd = own if (p.noisy or not p.sigma > 0) else p.sigma
        r.mde_pct = minimum_detectable(sd / math.sqrt(n), n - 1, r.level, p.bad, "two-sided")
    elif p.test is not None:
        r.mde_pct = minimum_detectable(p.test.t.se, p.test.t.df, p.level, p.bad)


def _fail_or_warn(r: GateResult, held: int, gate: Gate, what: str) -> None:
    """fail when the regression held on ``consecutive_nights`` nights in a row, else warn."""
    r.nights_held = held
    if held >= gate.consecutive_nights:
        r.status = "fail"
        r.reason = what + (f", on {held} nights in a row" if gate.consecutive_nights > 1 else "")
    else:
        r.status = "warn"
        r.reason = (
            what + f"; held on {held} of the {gate.consecutive_nights} nights in a row needed"
        )


def _undecided(p: _Pending, settings: NightlySettings, n_checked: int) -> None:
    """Neither fail nor pass: underpowered (tonight noisy, or short of the repeats even the
    noise's lower 90 % bound needs) or quiet on the noise rule, else inconclusive."""
    r, g = p.result, p.gate
    if settings.underpowered_on != "noise" or p.noise is None or p.se_of_n is None:
        r.status = "inconclusive"
        r.reason += ": too few repeats or too much noise to tell"
        return
    src = f"{p.noise.source} noise {_cv(p.sigma)}"
    if p.noisy:
        test = "chi-square" if p.noise.shape is None else "bootstrap"
        r.status = "underpowered"
        r.reason += (
            f"; tonight's spread {_pct(r.tonight_cv_pct)[1:]} CV is clearly above the {src} "
            f"({test} p = {r.noise_p:.2g} < {settings.noise_alpha:g}/{n_checked}): "
            "tonight's runs could hide a regression"
        )
    elif p.need[1] is None or r.n < p.need[1]:
        need = p.need[0]
        shown = f"{need} repeats" if need is not None else "more repeats than affordable (64+)"
        r.status = "underpowered"
        r.reason += (
            f"; at the {src} a {g.step_pct:g} % step turns a night red within "
            f"{settings.detect_nights} nights in {100 * settings.detect_power:g} % of cases "
            f"only with {shown} (more than {r.n}, tonight's, even at the noise's lower 90 % bound)"
        )
    else:
        r.status = "quiet"
        r.reason += (
            f"; no regression shown, tonight's noise is within the {src}, and {r.n} repeats "
            f"meet the targets ({p.need[0]} needed)"
        )
