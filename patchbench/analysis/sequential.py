"""Group-sequential repeats: after each step of paired repeats, decide whether to stop.

``schedule.repeats: {min: 4, max: 12, step: 2}`` looks after 4, 6, ..., 12 paired repeats; the
rule as a whole: docs/design.md step 5 and 6. At each look a primary is:

- ``improved`` / ``regressed``: the paired t test on the log ratios rejects at the look's nominal
  level of the boundary for its Holm share ``alpha / (m - r)``, r the primaries rejected so far
  (Ye, Li, Jiang and Wang, Statistics in Medicine 32 (2013) 1112-1124). Kept at later looks.
- ``equivalent``: TOST against +-margin at the look's nominal level for ``alpha``.
- ``futile`` (``Design.futility`` > 0): conditional power of a decision by the last look below
  ``futility`` (Jennison and Turnbull 2000, section 10.2); non-binding.
- ``continue``; at the last look (or once the run stops) ``inconclusive``.

Each primary's boundaries are fixed in advance, so a stopping time that depends on other data
only removes looks (the closed-testing argument of Ye et al. 2013 holds look by look;
tests/analysis/test_sequential.py simulates the per-report error with deciding primaries).

Boundaries (:func:`boundary`): ``b_k = c`` (Pocock 1977) or ``c sqrt(n_K / n_k)`` (O'Brien and
Fleming 1979), c the root of ``P(|Z_k| < b_k for all k) = 1 - alpha`` by the recursive
integration of Armitage, McPherson and Rowe (1969) (Jennison and Turnbull, chapter 19;
tests/analysis/test_sequential.py checks their Tables 2.1 and 2.3); a look compares the t test's
p-value with the nominal level ``2 (1 - Phi(b_k))`` (section 3.3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

import numpy as np
from scipy import optimize, special
from scipy.stats import norm

from patchbench import stats

Boundary = Literal["pocock", "obrien-fleming"]
Decision = Literal["improved", "regressed", "equivalent", "futile", "continue", "inconclusive"]
DECIDED = ("improved", "regressed", "equivalent")
#: default ``schedule.repeats.futility`` (the calibration behind it: docs/calibration.md)
FUTILITY = 0.20

_GRID = 801  # points per look in the numerical integration (odd: Simpson's rule)


def looks_from_schedule(min_repeats: int, max_repeats: int, step: int) -> tuple[int, ...]:
    """The repeat counts of the looks: ``min, min+step, ..., max`` (max always last). Raises
    ValueError naming the key for min < 3, max < min or step < 1."""
    if min_repeats < 3:
        raise ValueError(
            f"schedule.repeats.min is {min_repeats}; at least 3 paired repeats are "
            f"needed for a run-level verdict"
        )
    if max_repeats < min_repeats:
        raise ValueError(
            f"schedule.repeats.max ({max_repeats}) is smaller than min ({min_repeats})"
        )
    if step < 1:
        raise ValueError(f"schedule.repeats.step is {step}; it must be at least 1")
    looks = list(range(min_repeats, max_repeats + 1, step))
    if looks[-1] != max_repeats:
        looks.append(max_repeats)
    return tuple(looks)


def _simpson_weights(a: float, b: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    z = np.linspace(a, b, m)
    h = (b - a) / (m - 1)
    w = np.ones(m)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return z, w * h / 3.0


def continuation_probability(bounds: Sequence[float], info: Sequence[float]) -> float:
    """P(|Z_k| < bounds[k] for every look k) under no effect; ``info``: the repeats at each
    look, increasing (``Z_k = S(info_k) / sqrt(info_k)``, S a Brownian motion). Recursive
    integration by Simpson's rule on :data:`_GRID` points per look (about 1e-7)."""
    if len(bounds) != len(info) or not bounds:
        raise ValueError("bounds and info need the same, non-zero length")
    t = np.asarray(info, dtype=float)
    if np.any(np.diff(t) <= 0) or t[0] <= 0:
        raise ValueError(f"information must be positive and increasing: {list(info)}")
    z, w = _simpson_weights(-bounds[0], bounds[0], _GRID)
    f = norm.pdf(z)
    for k in range(1, len(t)):
        dt = t[k] - t[k - 1]
        znew, wnew = _simpson_weights(-bounds[k], bounds[k], _GRID)
        # density of Z_k at znew: sum over u of f(u) * density of the increment
        scale = math.sqrt(t[k] / dt)
        arg = (znew[:, None] * math.sqrt(t[k]) - z[None, :] * math.sqrt(t[k - 1])) / math.sqrt(dt)
        f = (norm.pdf(arg) * scale) @ (f * w)
        z, w = znew, wnew
    return float(np.sum(f * w))


@lru_cache(maxsize=512)
def _boundary_cached(looks: tuple[float, ...], alpha: float, kind: str) -> tuple[float, ...]:
    t = np.asarray(looks, dtype=float)
    shape = np.ones_like(t) if kind == "pocock" else np.sqrt(t[-1] / t)

    def excess(c: float) -> float:
        return (1.0 - continuation_probability(tuple(c * shape), tuple(t))) - alpha

    c = optimize.brentq(excess, 0.5, 8.0, xtol=1e-10)
    return tuple(float(x) for x in c * shape)


def boundary(
    looks: Sequence[float], alpha: float = 0.05, kind: Boundary = "pocock"
) -> tuple[float, ...]:
    """Two-sided critical values ``b_k`` (standard-normal scale), one per look (``looks``:
    repeat counts, increasing; ``alpha`` in (0, 1)); one look: ``Phi^-1(1 - alpha / 2)``.
    Raises ValueError for another alpha or kind."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if kind not in ("pocock", "obrien-fleming"):
        raise ValueError(f"boundary must be 'pocock' or 'obrien-fleming', got {kind!r}")
    looks = tuple(float(x) for x in looks)
    if len(looks) == 1:
        return (float(norm.ppf(1.0 - alpha / 2.0)),)
    return _boundary_cached(looks, round(float(alpha), 12), kind)


def nominal_levels(
    looks: Sequence[float], alpha: float = 0.05, kind: Boundary = "pocock"
) -> tuple[float, ...]:
    """Per-look two-sided nominal significance levels ``2 * (1 - Phi(b_k))``."""
    return _levels_cached(tuple(float(x) for x in looks), round(float(alpha), 12), kind)


@lru_cache(maxsize=512)
def _levels_cached(looks: tuple[float, ...], alpha: float, kind: str) -> tuple[float, ...]:
    return tuple(float(2.0 * norm.sf(b)) for b in boundary(looks, alpha, kind))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Design:
    """A group-sequential design: the looks (repeat counts), ``alpha`` two-sided per report, the
    boundary, the futility threshold in [0, 1) (0: none; ValueError outside) and the deciding
    primaries ``decide_on`` (``metric`` or ``suite.metric``; empty: every primary that grows
    with the looks): the run stops once these are decided or futile in every non-control
    variant (:func:`deciding`)."""

    looks: tuple[int, ...]
    alpha: float = 0.05
    kind: Boundary = "pocock"
    futility: float = 0.0
    decide_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.futility < 1.0:
            raise ValueError(f"futility must lie in [0, 1), got {self.futility}")

    @classmethod
    def from_schedule(cls, min_repeats: int, max_repeats: int, step: int, **kw) -> Design:
        """The design for ``schedule.repeats: {min, max, step}``."""
        return cls(looks_from_schedule(min_repeats, max_repeats, step), **kw)

    @classmethod
    def of(cls, seq, confidence: float) -> Design:
        """The design of a config's ``schedule.repeats`` (a SequentialRepeats), alpha
        1 - ``compare.confidence``."""
        decide_on = tuple(getattr(seq, "decide_on", ()) or ())
        return cls(seq.looks, round(1.0 - confidence, 12), seq.boundary, seq.futility, decide_on)

    def deciding(self, metric: str) -> bool:
        """Whether ``metric`` (``suite.metric``) is one of the deciding primaries: named in
        ``decide_on`` as ``suite.metric`` or ``metric``, or ``decide_on`` empty."""
        if not self.decide_on:
            return True
        return metric in self.decide_on or metric.split(".", 1)[-1] in self.decide_on

    def level(self, look_index: int, alpha: float) -> float:
        """Two-sided nominal level at look ``look_index`` (0-based) for overall ``alpha``."""
        return nominal_levels(self.looks, alpha, self.kind)[look_index]


@dataclass(frozen=True)
class FixedTest:
    """A primary on data that do not grow with the looks: two-sided ``p``, ``estimate`` in the
    test's own unit (e.g. proportions), ``n`` items, ``equivalent(level)``: TOST at that
    one-sided level (None: no margin)."""

    p: float
    estimate: float
    n: int
    equivalent: Callable[[float], bool] | None = None


@dataclass
class MetricDecision:
    """One primary of one variant at one look: ``estimate`` the mean log ratio (a
    :class:`FixedTest`'s own), ``change_pct`` ``100 (exp(estimate) - 1)`` (a FixedTest's: 100 x
    estimate), ``level`` the nominal level it met (improved / regressed), missed (open) or the
    one-sided TOST level (equivalent), ``look`` where it was decided (None: not yet), ``n`` the
    repeats (items) used."""

    decision: Decision
    n: int
    estimate: float
    change_pct: float
    p_value: float
    level: float | None
    look: int | None
    reason: str


def _decision(
    decision: Decision,
    n: int,
    est: float,
    p: float,
    level: float | None,
    look: int | None,
    reason: str,
    *,
    fixed: bool = False,
) -> MetricDecision:
    """A :class:`MetricDecision`; ``est`` a log ratio, or a FixedTest's own unit (``fixed``)."""
    pct = 100.0 * (est if fixed else math.expm1(est))
    return MetricDecision(decision, n, est, pct, p, level, look, reason)


@dataclass
class LookDecision:
    """One look: {(variant, metric): decision}, whether to stop and why, the family's size."""

    look_index: int
    n_repeats: int
    metrics: dict[tuple[str, str], MetricDecision] = field(default_factory=dict)
    stop: bool = False
    reason: str = ""
    family: int = 0

    def to_json(self) -> dict:
        """JSON-ready dict (for the manifest): decisions keyed ``variant/metric``."""
        return {
            "look_index": self.look_index,
            "n_repeats": self.n_repeats,
            "stop": self.stop,
            "reason": self.reason,
            "metrics": {f"{v}/{m}": vars(d) for (v, m), d in sorted(self.metrics.items())},
        }


def _equivalent(t: stats.TTest, margin: float, level: float) -> bool:
    """TOST at ``level`` against +-``margin`` (never without a margin)."""
    return margin > 0 and stats.equivalent_by_interval(t.interval, -margin, margin, level)


def conditional_power(
    mean: float,
    sd: float,
    n: int,
    n_final: int,
    *,
    effect_level: float,
    margin: float = 0.0,
    equivalence_level: float | None = None,
) -> tuple[float, float]:
    """(P(improved or regressed at the last look), P(equivalent there)) given the first ``n``
    log ratios (``mean``, sample ``sd``) under the current estimate (Jennison and Turnbull 2000,
    section 10.2): the last look's mean is ``N(mean, sd^2 (N - n) / N^2)``, its standard error
    ``sd / sqrt(N)`` with t quantiles on N - 1 df. ``effect_level``: the two-sided level a change
    needs there; ``margin`` (log scale, 0: none) with ``equivalence_level``, the one-sided TOST
    level. ValueError unless 2 <= n < n_final."""
    if n < 2 or n_final <= n:
        raise ValueError(f"conditional power needs 2 <= n < n_final, got n={n}, n_final={n_final}")
    se_final = sd / math.sqrt(n_final)
    tau = sd * math.sqrt(n_final - n) / n_final
    crit = float(special.stdtrit(n_final - 1, 1.0 - effect_level / 2.0)) * se_final
    half = 0.0
    if margin > 0 and equivalence_level is not None:
        half = margin - float(special.stdtrit(n_final - 1, 1.0 - equivalence_level)) * se_final
    if sd == 0.0:  # no spread: the t-test and TOST of decide, now and at the end
        return float(mean != 0.0), float(margin > 0 and abs(mean) < margin)
    p_eff = float(norm.sf((crit - mean) / tau) + norm.cdf((-crit - mean) / tau))
    p_eq = 0.0
    if half > 0:
        p_eq = float(norm.cdf((half - mean) / tau) - norm.cdf((-half - mean) / tau))
    return min(p_eff, 1.0), max(p_eq, 0.0)


Key = tuple[str, str]


def decide(
    look_index: int,
    log_ratios: Mapping[str, Mapping[str, Sequence[float]]],
    margins: Mapping[str, float],
    *,
    design: Design,
    better: Mapping[str, str] | None = None,
    previous: LookDecision | None = None,
    controls: Collection[str] = (),
    fixed: Mapping[str, Mapping[str, FixedTest]] | None = None,
) -> LookDecision:
    """Decide at look ``look_index`` (0-based).

    log_ratios: {variant: {metric: paired log ratios, at least the look's repeats}}; margins:
    {metric: equivalence margin, log scale (0 or absent: none)}; better: {metric: "higher" |
    "lower"} (default "higher"); previous: the previous look (its decisions are kept); controls:
    A/A variants; fixed: {variant: {metric: FixedTest}}. Raises ValueError for a look out of
    range or a series shorter than the look."""
    if not 0 <= look_index < len(design.looks):
        raise ValueError(f"look {look_index} is not one of the design's {len(design.looks)} looks")
    n = design.looks[look_index]
    out = LookDecision(look_index, n)
    better = better or {}
    fixed = fixed or {}
    tests: dict[Key, stats.TTest] = {}
    for variant, per_metric in log_ratios.items():
        for name, series in per_metric.items():
            d = np.asarray(series, dtype=float)
            if len(d) < n:
                raise ValueError(
                    f"{variant}/{name}: {len(d)} paired repeats, look {look_index} needs {n}"
                )
            tests[(variant, name)] = stats.paired_t(d[:n])
    family = [k for k in tests if k[0] not in controls]
    family += [(v, x) for v, per in fixed.items() if v not in controls for x in per]
    out.family = len(family)
    kept = {
        k: prev
        for k in family
        if previous is not None
        and (prev := previous.metrics.get(k)) is not None
        and prev.decision in DECIDED
    }
    fam = _Family(design, look_index, design.alpha, len(family), better, margins)
    out.metrics.update(fam.decide(family, tests, fixed, kept))
    for k, t in tests.items():
        if k[0] in controls:
            prev = previous.metrics.get(k) if previous is not None else None
            out.metrics[k] = (
                prev if prev is not None and prev.decision in DECIDED else (fam.control(t, k))
            )
    deciding = {k for k in tests if design.deciding(k[1])}
    _stop_or_go(
        out, look_index == len(design.looks) - 1, controls, deciding, bool(design.decide_on)
    )
    return out


@dataclass
class _Family:
    """The family's decisions at one look (:func:`decide`)."""

    design: Design
    look: int
    alpha: float
    m: int
    better: Mapping[str, str]
    margins: Mapping[str, float]

    def share_level(self, share: float, fixed: bool) -> float:
        """The nominal level for a ``share`` of alpha at this look (a one-look test: the share)."""
        return share if fixed else self.design.level(self.look, share)

    def decide(
        self,
        family: list[Key],
        tests: Mapping[Key, stats.TTest],
        fixed: Mapping[str, Mapping[str, FixedTest]],
        kept: dict[Key, MetricDecision],
    ) -> dict[Key, MetricDecision]:
        """Holm shares over the open primaries until no more is rejected, then the rest."""
        n = self.design.looks[self.look]
        done = dict(kept)
        rejected = sum(1 for x in done.values() if x.decision in ("improved", "regressed"))

        def p_of(k: Key) -> float:
            return tests[k].p_value() if k in tests else fixed[k[0]][k[1]].p

        while True:
            share = self.alpha / max(self.m - rejected, 1)
            open_ = [k for k in family if k not in done]
            now = [k for k in open_ if p_of(k) <= self.share_level(share, k not in tests)]
            if not now:
                break
            for i, k in enumerate(sorted(now, key=p_of)):
                lvl = self.share_level(share, k not in tests)
                est = fixed[k[0]][k[1]].estimate if k not in tests else tests[k].mean
                up = est > 0
                good = up if self.better.get(k[1], "higher") == "higher" else not up
                is_fixed = k not in tests
                why = (
                    f"p = {p_of(k):.3g} <= {lvl:.3g} (Holm share alpha/{self.m - rejected} of "
                    f"the {self.m} primaries, step {rejected + i + 1}; "
                    + ("one look" if is_fixed else f"{self.design.kind} boundary")
                    + f", look {self.look + 1})"
                )
                nk = fixed[k[0]][k[1]].n if is_fixed else n
                verdict = "improved" if good else "regressed"
                done[k] = _decision(verdict, nk, est, p_of(k), lvl, self.look, why, fixed=is_fixed)
            rejected += len(now)
        share = self.alpha / max(self.m - rejected, 1)
        for k in family:
            if k in done:
                continue
            if k in tests:
                done[k] = self.undecided(tests[k], k, share, self.alpha)
            else:
                done[k] = self.undecided_fixed(fixed[k[0]][k[1]], share, self.alpha)
        return done

    def undecided(self, t: stats.TTest, key: Key, share: float, eq_alpha: float) -> MetricDecision:
        """A run-level primary no share rejected: equivalent, else inconclusive at the last look,
        else futile (conditional power below ``design.futility``) or continue."""
        design, look = self.design, self.look
        margin = float(self.margins.get(key[1]) or 0.0)
        n, n_final = design.looks[look], design.looks[-1]
        last = look == len(design.looks) - 1
        mean, p = t.mean, t.p_value()
        eq_level = design.level(look, eq_alpha)
        missed = design.level(look, share)
        if _equivalent(t, margin, eq_level):
            return _equivalent_decision(n, mean, p, eq_level, look, margin)
        dec: Decision = "continue"
        why = f"neither a change (p = {p:.3g} > {missed:.3g}) nor equivalence shown"
        if last:
            dec, why = "inconclusive", why + " at the last look"
        elif design.futility > 0:
            cp_eff, cp_eq = conditional_power(
                mean,
                t.sd,
                n,
                n_final,
                effect_level=design.level(len(design.looks) - 1, share),
                margin=margin,
                equivalence_level=design.level(len(design.looks) - 1, eq_alpha),
            )
            if cp_eff + cp_eq < design.futility:
                dec = "futile"
                why = (
                    f"futile: conditional power at {n_final} repeats under the current "
                    f"estimate ({100 * math.expm1(mean):+.2f} %) {cp_eff:.3f} for a "
                    f"change, {cp_eq:.3f} for equivalence, below {design.futility:g}"
                )
        return _decision(dec, n, mean, p, missed, None, why)

    def undecided_fixed(self, t: FixedTest, share: float, eq_alpha: float) -> MetricDecision:
        """A one-look primary no Holm share rejected: equivalent (TOST at ``eq_alpha``) or open
        (``continue``; it never holds the run open and ends inconclusive)."""
        if t.equivalent is not None and t.equivalent(eq_alpha):
            why = f"TOST at {eq_alpha:.3g} (one look): the interval lies inside the margin"
            return _decision(
                "equivalent", t.n, t.estimate, t.p, eq_alpha, self.look, why, fixed=True
            )
        why = f"neither a change (p = {t.p:.3g} > {share:.3g}, one look) nor equivalence shown"
        return _decision("continue", t.n, t.estimate, t.p, share, None, why, fixed=True)

    def control(self, t: stats.TTest, key: Key) -> MetricDecision:
        """An A/A primary: a measurement; equivalent by TOST at the look's level for alpha, else
        open (it never holds the run open and ends inconclusive)."""
        design, look = self.design, self.look
        n, mean, p = design.looks[look], t.mean, t.p_value()
        margin = float(self.margins.get(key[1]) or 0.0)
        eq_level = design.level(look, self.alpha)
        if _equivalent(t, margin, eq_level):
            return _equivalent_decision(n, mean, p, eq_level, look, margin, "A/A (a measurement): ")
        why = "A/A (a measurement, never improved or regressed): equivalence not shown"
        return _decision("continue", n, mean, p, None, None, why)


def _equivalent_decision(
    n: int, mean: float, p: float, eq_level: float, look: int, margin: float, prefix: str = ""
) -> MetricDecision:
    """An "equivalent" decision at ``look`` (TOST at ``eq_level`` within +-``margin``, log
    scale); ``prefix`` starts the reason."""
    why = (
        f"{prefix}TOST at {eq_level:.3g}: the {100 * (1 - 2 * eq_level):.1f} % interval "
        f"lies inside +-{100 * math.expm1(margin):.3g} %"
    )
    return _decision("equivalent", n, mean, p, eq_level, look, why)


def _stop_or_go(
    out: LookDecision,
    last: bool,
    controls: Collection[str],
    grows: Collection[Key],
    named: bool = False,
) -> None:
    """Stop when every deciding primary that gains from more rounds (``grows``: those of
    ``Design.decide_on``, ``named`` when it names them) is decided or futile, or at the last
    look; what is still open then ends inconclusive (a primary outside ``grows`` was tested at
    every look that ran: stopping only takes looks away, so its error rate stays within its
    share)."""
    n = out.n_repeats
    held = [
        k
        for k, d in out.metrics.items()
        if k[0] not in controls and k in grows and d.decision not in DECIDED
    ]
    undecided = [k for k in held if out.metrics[k].decision != "futile"]
    futile = len(held) - len(undecided)
    aa_open = sum(
        1 for k, d in out.metrics.items() if k[0] in controls and d.decision not in DECIDED
    )
    which = "every deciding primary" if named else "every primary"
    if not undecided:
        out.stop = True
        out.reason = f"{which} decided after {n} repeats"
        if futile:
            out.reason = (
                f"{which} decided or futile after {n} repeats; {futile} primary "
                "metric(s) inconclusive (futile: unlikely to be decided by the last look)"
            )
        others = [
            k
            for k, d in out.metrics.items()
            if k[0] not in controls and k not in grows and d.decision not in DECIDED
        ]
        if named and others and not last:
            out.reason += (
                f"; {len(others)} other primary metric(s) open at this look end inconclusive "
                "(schedule.repeats.decide_on names the deciding ones)"
            )
        if aa_open:
            out.reason += (
                f"; {aa_open} A/A primary metric(s) undecided (A/A variants do not "
                "hold the run open)"
            )
    elif last:
        out.stop = True
        out.reason = f"maximum of {n} repeats reached; {len(held)} primary metric(s) inconclusive"
    else:
        out.reason = f"{len(undecided)} primary metric(s) undecided after {n} repeats" + (
            f", {futile} futile" if futile else ""
        )
    if out.stop:  # what is still open ends inconclusive
        for d in out.metrics.values():
            if d.decision in ("futile", "continue"):
                d.decision = "inconclusive"
                d.reason += f"; the run stopped after {n} repeats"


def replay(
    log_ratios: Mapping[str, Mapping[str, Sequence[float]]],
    margins: Mapping[str, float],
    *,
    design: Design,
    better: Mapping[str, str] | None = None,
    controls: Collection[str] = (),
    fixed: Mapping[str, Mapping[str, FixedTest]] | None = None,
) -> LookDecision | None:
    """:func:`decide` at every look whose repeats exist (the series may be of any length),
    stopping where the design stops; the last look's decision, or None before the first look."""
    have = min((len(s) for per in log_ratios.values() for s in per.values()), default=0)
    if not log_ratios:
        have = design.looks[0]  # nothing grows: the first look decides what there is
    result = None
    for k, n in enumerate(design.looks):
        if n > have:
            break
        result = decide(
            k,
            log_ratios,
            margins,
            design=design,
            better=better,
            previous=result,
            controls=controls,
            fixed=fixed,
        )
        if result.stop:
            break
    return result
