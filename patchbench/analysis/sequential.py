"""Group-sequential repeats: decide after each step of paired repeats whether to stop.

A run with ``schedule.repeats: {min: 4, max: 12, step: 2}`` looks at its primary metrics after
4, 6, 8, 10 and 12 paired repeats (whole interleaved rounds). The primaries of every compared
variant but the ``controls`` (A/A variants) form ONE family per report: m hypotheses "no change",
``alpha`` (two-sided) for the chance of any false improved/regressed among them over all looks.
At each look every primary of the family gets one of these decisions:

- ``improved`` / ``regressed``: the paired t-test on the log ratios (variant / baseline, one per
  repeat) rejects "no change" at the look's nominal level, which comes from a group-sequential
  boundary for the primary's share of alpha. The shares are Holm step-down shares over the whole
  family: with r primaries rejected so far (at earlier looks or at this one), every open primary
  is tested at the boundary for ``alpha / (m - r)``, repeated at the same look while that rejects
  more (the group-sequential Holm procedure of Ye, Li, Jiang and Wang, "A group sequential Holm
  procedure with multiple primary endpoints", Statistics in Medicine 32 (2013) 1112-1124; with
  one boundary for all it is Holm's sorted step-down). A decision, once made, is kept at later
  looks.
- ``equivalent``: the two one-sided tests (TOST) against ``+-margin`` both reject at the look's
  nominal level for ``alpha`` (``equivalence_split="bonferroni"``: for ``alpha / m``), i.e. the
  ``1 - 2 * level`` interval lies inside ``(-margin, +margin)``.
- ``futile`` (only with ``Design.futility`` > 0): neither, and even the last look is unlikely to
  decide it: the conditional power of reaching improved/regressed or equivalent at the last look,
  computed under the current estimate ("current trend"), is below ``Design.futility``
  (stochastic curtailment by conditional power: Jennison and Turnbull (2000), chapter 10,
  section 10.2). It is a non-binding futility stop: the metric no longer holds the run open, but
  it is looked at again if the run goes on for other metrics (and may still be decided then);
  the efficacy boundaries are computed without it and are not changed, so the chance of a false
  improved/regressed of the sequential rule stays at most ``alpha`` (a futility stop only
  removes chances to cross them). See :func:`conditional_power`. A run that stops with a metric
  futile reports it ``inconclusive``.
- ``continue``: none of these, and looks remain. At the last look an undecided metric is
  ``inconclusive``.

Primaries whose data do not grow with the looks (an accuracy primary whose rounds all ran before
the first look: :class:`FixedTest`) belong to the same family: such a test has one look, so its
level is its whole share ``alpha / (m - r)`` at every look (the same data tested again at a
larger share once others are rejected, as Holm does); they never hold the run open.

Controls (A/A variants) are measurements, not members of the family: each of their primaries is
``equivalent`` (TOST as above) or stays open and ends ``inconclusive``; never improved or
regressed, and they never hold the run open. The run stops when every primary of the family that
can gain from more rounds is decided or futile, or at the last look.

Boundaries (:func:`boundary`): the look statistics ``Z_k`` of a mean of independent increments
have ``corr(Z_j, Z_k) = sqrt(n_j / n_k)`` (j <= k). The constant is the root of
``P(|Z_k| < b_k for all k) = 1 - alpha``, with ``b_k = c`` (Pocock 1977) or
``b_k = c * sqrt(n_K / n_k)`` (O'Brien and Fleming 1979), the probability computed by the recursive
numerical integration of Armitage, McPherson and Rowe (1969) as described in Jennison and Turnbull,
"Group Sequential Methods with Applications to Clinical Trials" (2000), chapter 19. For K equally
spaced looks and two-sided alpha = 0.05 this gives their Table 2.1 (Pocock: 2.178, 2.289, 2.361,
2.413 for K = 2..5) and Table 2.3 (O'Brien-Fleming: 1.977, 2.004, 2.024, 2.040); tests/analysis/test_sequential.py
checks both and an independent computation with ``scipy.stats.multivariate_normal``.
The variance is estimated, so a look with n repeats compares the t-statistic's p-value (n - 1
degrees of freedom) with the nominal level ``2 * (1 - Phi(b_k))`` (the "significance level"
approach, Jennison and Turnbull section 3.3); tools/calibrate.py measures the resulting
error rates by simulation.

Everything here is pure (no files, no server). :func:`replay` runs the looks whose repeats exist
(the runner after each step, the analysis on a run folder: the same decisions).
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
#: conditional power below which a metric is futile in the runner's designs by default
#: (``schedule.repeats.futility``, patchbench.config.SequentialRepeats). tools/calibrate.py
#: --design-only at 3 % run noise, 400 trials: on 4..12 rounds 0.2 gave 2.8 % false calls and
#: 94.0 % power at +10 % in 10.1 / 10.7 rounds, 0.1 gave 3.0 % and 93.5 % in 10.6 / 10.9
FUTILITY = 0.20

_GRID = 801  # points per look in the numerical integration (odd: Simpson's rule)


# ---------------------------------------------------------------------------------------------
# boundaries


def looks_from_schedule(min_repeats: int, max_repeats: int, step: int) -> tuple[int, ...]:
    """The repeat counts at which the run looks: ``min, min+step, ..., max`` (max always last).

    Raises ValueError (naming the key) when min < 3 (a run-level verdict needs 3 paired
    repeats), max < min or step < 1.
    """
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
    """P(|Z_k| < bounds[k] for every look k) under no effect.

    info: the information (here: the repeat count) at each look, increasing; Z_k is the
    standardized mean at look k, ``Z_k = S(info_k) / sqrt(info_k)`` with S a Brownian motion.
    Computed by recursive numerical integration on a grid (Simpson's rule, 801 points per look);
    accurate to about 1e-7 for the boundaries used here.
    """
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
    """Two-sided critical values ``b_k`` (standard-normal scale), one per look.

    looks: information at each look (repeat counts, increasing); alpha: two-sided overall level in
    (0, 1); kind: "pocock" (the same constant at every look) or "obrien-fleming"
    (``c * sqrt(n_K / n_k)``: strict early, near the fixed-sample value at the end).
    With one look this is the fixed-sample ``Phi^-1(1 - alpha / 2)``.
    """
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


# ---------------------------------------------------------------------------------------------
# decisions


@dataclass(frozen=True)
class Design:
    """A group-sequential design: the looks (repeat counts), the overall two-sided ``alpha`` per
    report (one family: every primary of every compared variant but the controls, Holm shares
    over it; see the module docstring), the boundary shape, and the level of equivalence
    ("none": TOST at the look's nominal level for ``alpha``; "bonferroni": for ``alpha / m``).
    ``futility``: conditional-power threshold in [0, 1) below which an undecided metric is
    ``futile`` and no longer holds the run open (0: no futility stop, every primary must be
    decided; see the module docstring)."""

    looks: tuple[int, ...]
    alpha: float = 0.05
    kind: Boundary = "pocock"
    equivalence_split: Literal["none", "bonferroni"] = "none"
    futility: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.futility < 1.0:
            raise ValueError(f"futility must lie in [0, 1), got {self.futility}")

    @classmethod
    def from_schedule(cls, min_repeats: int, max_repeats: int, step: int, **kw) -> Design:
        """The design for ``schedule.repeats: {min, max, step}``."""
        return cls(looks_from_schedule(min_repeats, max_repeats, step), **kw)

    def level(self, look_index: int, alpha: float) -> float:
        """Two-sided nominal level at look ``look_index`` (0-based) for overall ``alpha``."""
        return nominal_levels(self.looks, alpha, self.kind)[look_index]


@dataclass(frozen=True)
class FixedTest:
    """A primary tested on data that do not grow with the looks (one look; e.g. accuracy whose
    rounds all ran before the first look): ``p`` two-sided p-value of no change, ``estimate`` the
    change (in the test's own unit, e.g. proportions), ``n`` the items it used, ``equivalent``
    level -> whether TOST shows equivalence at that one-sided level (None: no margin)."""

    p: float
    estimate: float
    n: int
    equivalent: Callable[[float], bool] | None = None


@dataclass
class MetricDecision:
    """One primary of one variant at one look.

    decision: improved | regressed | equivalent | continue | futile | inconclusive (stopped,
    undecided). estimate: mean log ratio (variant / baseline; a :class:`FixedTest`'s own
    estimate); change_pct: ``100 * (exp(estimate) - 1)`` (a FixedTest: ``100 * estimate``, points).
    p_value: two-sided p-value against no change; level: the two-sided nominal level it was
    compared with (improved / regressed: the Holm share's boundary level that it met; continue /
    futile / inconclusive: the one it missed at this look; equivalent: the one-sided TOST level);
    look: the 0-based look at which it was decided (None: not yet); n: paired repeats used (a
    FixedTest: its items).
    """

    decision: Decision
    n: int
    estimate: float
    change_pct: float
    p_value: float
    level: float | None
    look: int | None
    reason: str


@dataclass
class LookDecision:
    """The outcome of one look: per (variant, metric) decisions, whether to stop and why, the
    size of the family (``family``: the primaries the report's alpha covers)."""

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
    """TOST at ``level`` against ``+-margin`` (:func:`patchbench.stats.equivalent_by_interval`:
    the ``1 - 2 level`` interval lies inside); never with no margin."""
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
    """Chance that the last look decides a metric, given the first ``n`` paired repeats, under
    the current estimate as the true effect ("current trend"; Jennison and Turnbull (2000),
    section 10.2).

    mean, sd: mean and sample standard deviation of the ``n`` log ratios so far; n_final: the
    repeats at the last look (> n); effect_level: the two-sided nominal level improved/regressed
    needs there; margin, equivalence_level: the equivalence margin (log scale; 0: none) and the
    one-sided TOST level there. The last look's mean is ``N(mean, sd**2 (N - n) / N**2)``
    (the n repeats are fixed, the N - n to come have mean ``mean``); its standard error is taken
    as ``sd / sqrt(N)`` with t quantiles on N - 1 degrees of freedom.
    Returns (P(improved or regressed at the last look), P(equivalent there)), each in [0, 1].
    Raises ValueError when n_final <= n or n < 2.
    """
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
    alpha: float | None = None,
    *,
    design: Design,
    better: Mapping[str, str] | None = None,
    previous: LookDecision | None = None,
    controls: Collection[str] = (),
    fixed: Mapping[str, Mapping[str, FixedTest]] | None = None,
) -> LookDecision:
    """Decide at look ``look_index`` (0-based index into ``design.looks``).

    log_ratios: variant -> primary metric -> paired log ratios ``log(variant / baseline)``, one
    per repeat, at least ``design.looks[look_index]`` of them (only that many are used);
    margins: metric -> equivalence margin on the log scale (``math.log1p(pct / 100)`` for a
    percent margin; 0 or missing: no equivalence stop for that metric); alpha: overall two-sided
    level per report (the family: every primary of every variant but the controls), default
    ``design.alpha``; better: metric -> "higher" | "lower" (default "higher"); previous: the
    decision of the previous look (its decided metrics are kept); controls: variants (A/A) that
    are measured, not tested (see the module docstring); fixed: variant -> metric ->
    :class:`FixedTest`, primaries of the family whose data do not grow with the looks.
    Returns a :class:`LookDecision`; raises ValueError when a metric has fewer repeats than the
    look needs or the look index is out of range.
    """
    if not 0 <= look_index < len(design.looks):
        raise ValueError(f"look {look_index} is not one of the design's {len(design.looks)} looks")
    n = design.looks[look_index]
    out = LookDecision(look_index, n)
    alpha = design.alpha if alpha is None else alpha
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
    fam = _Family(design, look_index, alpha, len(family), better, margins)
    out.metrics.update(fam.decide(family, tests, fixed, kept))
    for k, t in tests.items():
        if k[0] in controls:
            prev = previous.metrics.get(k) if previous is not None else None
            out.metrics[k] = (
                prev if prev is not None and prev.decision in DECIDED else (fam.control(t, k))
            )
    _stop_or_go(out, look_index == len(design.looks) - 1, controls, set(tests))
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
        """The nominal level of a primary for a share ``share`` of alpha at this look: its
        boundary's, or the whole share for a one-look (fixed) test."""
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
                done[k] = MetricDecision(
                    "improved" if good else "regressed",
                    fixed[k[0]][k[1]].n if is_fixed else n,
                    est,
                    100.0 * est if is_fixed else 100.0 * math.expm1(est),
                    p_of(k),
                    lvl,
                    self.look,
                    f"p = {p_of(k):.3g} <= {lvl:.3g} (Holm share alpha/{self.m - rejected} of "
                    f"the {self.m} primaries, step {rejected + i + 1}; "
                    + ("one look" if is_fixed else f"{self.design.kind} boundary")
                    + f", look {self.look + 1})",
                )
            rejected += len(now)
        share = self.alpha / max(self.m - rejected, 1)
        eq_alpha = (
            self.alpha / self.m if self.design.equivalence_split == "bonferroni" else (self.alpha)
        )
        for k in family:
            if k in done:
                continue
            if k in tests:
                done[k] = self.undecided(tests[k], k, share, eq_alpha)
            else:
                done[k] = self.undecided_fixed(fixed[k[0]][k[1]], share, eq_alpha)
        return done

    def undecided(self, t: stats.TTest, key: Key, share: float, eq_alpha: float) -> MetricDecision:
        """A run-level primary no Holm share rejected: equivalent (TOST at the look's level for
        ``eq_alpha``), else inconclusive at the last look, else continue, or futile when the
        conditional power of deciding it by the last look (at the current share) is below
        ``design.futility``."""
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
        return MetricDecision(dec, n, mean, 100.0 * math.expm1(mean), p, missed, None, why)

    def undecided_fixed(self, t: FixedTest, share: float, eq_alpha: float) -> MetricDecision:
        """A one-look primary no Holm share rejected: equivalent (TOST at ``eq_alpha``) or open
        (``continue``; it never holds the run open and ends inconclusive)."""
        if t.equivalent is not None and t.equivalent(eq_alpha):
            return MetricDecision(
                "equivalent",
                t.n,
                t.estimate,
                100.0 * t.estimate,
                t.p,
                eq_alpha,
                self.look,
                f"TOST at {eq_alpha:.3g} (one look): the interval lies inside the margin",
            )
        return MetricDecision(
            "continue",
            t.n,
            t.estimate,
            100.0 * t.estimate,
            t.p,
            share,
            None,
            f"neither a change (p = {t.p:.3g} > {share:.3g}, one look) nor equivalence shown",
        )

    def control(self, t: stats.TTest, key: Key) -> MetricDecision:
        """An A/A primary: a measurement; equivalent by TOST at the look's level for alpha, else
        open (it never holds the run open and ends inconclusive)."""
        design, look = self.design, self.look
        n, mean, p = design.looks[look], t.mean, t.p_value()
        margin = float(self.margins.get(key[1]) or 0.0)
        eq_level = design.level(look, self.alpha)
        if _equivalent(t, margin, eq_level):
            return _equivalent_decision(n, mean, p, eq_level, look, margin, "A/A (a measurement): ")
        return MetricDecision(
            "continue",
            n,
            mean,
            100.0 * math.expm1(mean),
            p,
            None,
            None,
            "A/A (a measurement, never improved or regressed): equivalence not shown",
        )


def _equivalent_decision(
    n: int, mean: float, p: float, eq_level: float, look: int, margin: float, prefix: str = ""
) -> MetricDecision:
    """An "equivalent" decision at ``look``: the TOST at ``eq_level`` put the interval of the
    mean log ratio ``mean`` (``n`` repeats, two-sided p ``p``) inside +-``margin`` (log scale);
    ``prefix`` starts the reason."""
    return MetricDecision(
        "equivalent",
        n,
        mean,
        100.0 * math.expm1(mean),
        p,
        eq_level,
        look,
        f"{prefix}TOST at {eq_level:.3g}: the {100 * (1 - 2 * eq_level):.1f} % interval "
        f"lies inside +-{100 * math.expm1(margin):.3g} %",
    )


def _stop_or_go(
    out: LookDecision, last: bool, controls: Collection[str], grows: Collection[Key]
) -> None:
    """Set ``out.stop`` and ``out.reason``: stop when every primary of the family that gains from
    more rounds (``grows``: the run-level ones) is decided or futile, or at the last look; what
    is still open then ends inconclusive."""
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
    if not undecided:
        out.stop = True
        out.reason = f"every primary decided after {n} repeats"
        if futile:
            out.reason = (
                f"every primary decided or futile after {n} repeats; {futile} primary "
                "metric(s) inconclusive (futile: unlikely to be decided by the last look)"
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
    alpha: float | None = None,
    *,
    design: Design,
    better: Mapping[str, str] | None = None,
    controls: Collection[str] = (),
    fixed: Mapping[str, Mapping[str, FixedTest]] | None = None,
) -> LookDecision | None:
    """Run :func:`decide` for every look whose repeats exist, stopping where the design stops.

    The same arguments as :func:`decide`; the series may be of any length (a resumed run passes
    what is on disk). Returns the last look's decision (``stop`` False: run up to the next look),
    or None when fewer repeats than the first look exist.
    """
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
            alpha,
            design=design,
            better=better,
            previous=result,
            controls=controls,
            fixed=fixed,
        )
        if result.stop:
            break
    return result


def next_target(design: Design, decision: LookDecision | None) -> int | None:
    """How many repeats the run should have before the next look; None once it stopped."""
    if decision is None:
        return design.looks[0]
    if decision.stop:
        return None
    return design.looks[decision.look_index + 1]


__all__ = [
    "Design",
    "FixedTest",
    "LookDecision",
    "MetricDecision",
    "boundary",
    "nominal_levels",
    "continuation_probability",
    "conditional_power",
    "FUTILITY",
    "looks_from_schedule",
    "decide",
    "replay",
    "next_target",
    "DECIDED",
]
