"""Group-sequential repeats: decide after each step of paired repeats whether to stop.

A run with ``schedule.repeats: {min: 4, max: 12, step: 2}`` looks at its primary metrics after
4, 6, 8, 10 and 12 paired repeats (whole interleaved rounds). At each look every primary of every
variant gets one of four decisions:

- ``improved`` / ``regressed``: the paired t-test on the log ratios (variant / baseline, one per
  repeat) rejects "no change" at the look's nominal level, which comes from a group-sequential
  boundary so that the chance of any false improved/regressed over ALL looks stays at ``alpha``
  (two-sided). Across the primaries of one variant the levels are Holm step-down levels: the
  boundary computed for ``alpha / (m - r - i)`` (m primaries, r already rejected at earlier
  looks, i-th smallest p-value of the rest), the group-sequential Holm procedure of Ye, Li, Jiang
  and Wang, "A group sequential Holm procedure with multiple primary endpoints", Statistics in
  Medicine 32 (2013) 1112-1124. A decision, once made, is kept at later looks.
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

The run stops when every primary of every variant but the ``controls`` (A/A variants: health
checks, not questions; they are decided like the others and recorded, and the final comparison
analyses them as always) is decided or futile, or at the last look.

Boundaries (:func:`boundary`): the look statistics ``Z_k`` of a mean of independent increments
have ``corr(Z_j, Z_k) = sqrt(n_j / n_k)`` (j <= k). The constant is the root of
``P(|Z_k| < b_k for all k) = 1 - alpha``, with ``b_k = c`` (Pocock 1977) or
``b_k = c * sqrt(n_K / n_k)`` (O'Brien and Fleming 1979), the probability computed by the recursive
numerical integration of Armitage, McPherson and Rowe (1969) as described in Jennison and Turnbull,
"Group Sequential Methods with Applications to Clinical Trials" (2000), chapter 19. For K equally
spaced looks and two-sided alpha = 0.05 this gives their Table 2.1 (Pocock: 2.178, 2.289, 2.361,
2.413 for K = 2..5) and Table 2.3 (O'Brien-Fleming: 1.977, 2.004, 2.024, 2.040); tests/test_sequential.py
checks both and an independent computation with ``scipy.stats.multivariate_normal``.
The variance is estimated, so a look with n repeats compares the t-statistic's p-value (n - 1
degrees of freedom) with the nominal level ``2 * (1 - Phi(b_k))`` (the "significance level"
approach, Jennison and Turnbull section 3.3); scripts/calibrate_nightly.py measures the resulting
error rates by simulation.

Everything here is pure (no files, no server). The runner calls :func:`decide` after each step,
or :func:`replay` on the repeats that exist (a resumed run continues where it stopped).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
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
#: (``schedule.repeats.futility``, patchbench.config.SequentialRepeats). scripts/calibrate.py
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
    report, the boundary shape, and how alpha is split: ``split_variants`` True gives each of the
    V compared variants ``alpha / V`` (Bonferroni: at most ``alpha`` chance of any false
    improved/regressed primary in a report), Holm across each variant's primaries within that;
    equivalence ("none": TOST at the look's nominal level for the variant's alpha;
    "bonferroni": for that divided by its m primaries). ``futility``: conditional-power
    threshold in [0, 1) below which an undecided metric is ``futile`` and no longer holds the run
    open (0: no futility stop, every primary must be decided; see the module docstring)."""

    looks: tuple[int, ...]
    alpha: float = 0.05
    kind: Boundary = "pocock"
    equivalence_split: Literal["none", "bonferroni"] = "none"
    split_variants: bool = True
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


@dataclass
class MetricDecision:
    """One primary of one variant at one look.

    decision: improved | regressed | equivalent | continue | inconclusive (last look, undecided).
    estimate: mean log ratio (variant / baseline); change_pct: ``100 * (exp(estimate) - 1)``.
    p_value: two-sided paired t p-value against no change; level: the nominal level it was
    compared with (Holm step); look: the 0-based look at which it was decided (None: not yet);
    n: paired repeats used.
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
    """The outcome of one look: per (variant, metric) decisions, whether to stop and why."""

    look_index: int
    n_repeats: int
    metrics: dict[tuple[str, str], MetricDecision] = field(default_factory=dict)
    stop: bool = False
    reason: str = ""

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
) -> LookDecision:
    """Decide at look ``look_index`` (0-based index into ``design.looks``).

    log_ratios: variant -> primary metric -> paired log ratios ``log(variant / baseline)``, one
    per repeat, at least ``design.looks[look_index]`` of them (only that many are used);
    margins: metric -> equivalence margin on the log scale (``math.log1p(pct / 100)`` for a
    percent margin; 0 or missing: no equivalence stop for that metric); alpha: overall two-sided
    level per report, default ``design.alpha`` (split across variants when
    ``design.split_variants``, controls included); better: metric -> "higher" | "lower"
    (default "higher"); previous: the decision of the previous look (its decided metrics are
    kept); controls: variants (A/A) that are decided and recorded like the others but never hold
    the run open.
    Returns a :class:`LookDecision`; raises ValueError when a metric has fewer repeats than the
    look needs or the look index is out of range.
    """
    if not 0 <= look_index < len(design.looks):
        raise ValueError(f"look {look_index} is not one of the design's {len(design.looks)} looks")
    out = LookDecision(look_index, design.looks[look_index])
    report_alpha = design.alpha if alpha is None else alpha
    alpha = report_alpha
    if design.split_variants and log_ratios:
        alpha = report_alpha / len(log_ratios)
    for variant, per_metric in log_ratios.items():
        kept = {
            name: prev
            for name in per_metric
            if previous is not None
            and (prev := previous.metrics.get((variant, name))) is not None
            and prev.decision in DECIDED
        }
        decided = _decide_variant(
            variant, per_metric, margins, alpha, design, look_index, better or {}, kept
        )
        out.metrics.update({(variant, name): d for name, d in decided.items()})
    _stop_or_go(out, look_index == len(design.looks) - 1, controls)
    return out


def _decide_variant(
    variant: str,
    per_metric: Mapping[str, Sequence[float]],
    margins: Mapping[str, float],
    alpha: float,
    design: Design,
    look_index: int,
    better: Mapping[str, str],
    kept: dict[str, MetricDecision],
) -> dict[str, MetricDecision]:
    """One variant's primaries at one look (see :func:`decide`), in sorted order: those decided
    at earlier looks (``kept``) stay; Holm's step-down at the look's sequential levels over the
    rest decides improved / regressed; then TOST equivalence, else continue / futile /
    inconclusive."""
    n = design.looks[look_index]
    names = sorted(per_metric)
    m = len(names)
    done = dict(kept)
    tests: dict[str, stats.TTest] = {}
    for name in names:
        d = np.asarray(per_metric[name], dtype=float)
        if len(d) < n:
            raise ValueError(
                f"{variant}/{name}: {len(d)} paired repeats, look {look_index} needs {n}"
            )
        tests[name] = stats.paired_t(d[:n])
    rejected = sum(1 for x in done.values() if x.decision in ("improved", "regressed"))
    open_ = sorted((tests[x].p_value(), x) for x in names if x not in done)
    # Holm step-down over the undecided metrics, at the look's sequential levels
    for i, (p, name) in enumerate(open_):
        lvl = design.level(look_index, alpha / (m - rejected - i))
        if p > lvl:
            break
        mean = tests[name].mean
        up = mean > 0
        good = up if better.get(name, "higher") == "higher" else not up
        done[name] = MetricDecision(
            "improved" if good else "regressed",
            n,
            mean,
            100.0 * math.expm1(mean),
            p,
            lvl,
            look_index,
            f"p = {p:.3g} <= {lvl:.3g} (Holm step {i + 1 + rejected} "
            f"of {m}, {design.kind} boundary, look {look_index + 1})",
        )
    rejected_now = sum(1 for x in done.values() if x.decision in ("improved", "regressed"))
    eq_alpha = alpha / m if design.equivalence_split == "bonferroni" else alpha
    return {
        name: done[name]
        if name in done
        else _undecided(
            tests[name],
            float(margins.get(name) or 0.0),
            design,
            look_index,
            effect_alpha=alpha / (m - rejected_now),
            eq_alpha=eq_alpha,
        )
        for name in names
    }


def _undecided(
    t: stats.TTest,
    margin: float,
    design: Design,
    look_index: int,
    *,
    effect_alpha: float,
    eq_alpha: float,
) -> MetricDecision:
    """A primary that no Holm step rejected: equivalent (TOST at the look's level for
    ``eq_alpha``), else inconclusive at the last look, else continue, or futile when the
    conditional power of deciding it by the last look (its next Holm step there:
    ``effect_alpha``) is below ``design.futility``."""
    n, n_final = design.looks[look_index], design.looks[-1]
    last = look_index == len(design.looks) - 1
    mean, p = t.mean, t.p_value()
    eq_level = design.level(look_index, eq_alpha)
    if _equivalent(t, margin, eq_level):
        dec: Decision = "equivalent"
        why = (
            f"TOST at {eq_level:.3g}: the {100 * (1 - 2 * eq_level):.1f} % interval "
            f"lies inside +-{100 * math.expm1(margin):.3g} %"
        )
    elif last:
        dec, why = "inconclusive", "neither a change nor equivalence shown at the last look"
    else:
        dec, why = "continue", "neither a change nor equivalence shown"
        if design.futility > 0:
            cp_eff, cp_eq = conditional_power(
                mean,
                t.sd,
                n,
                n_final,
                effect_level=design.level(len(design.looks) - 1, effect_alpha),
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
    eq = dec == "equivalent"
    return MetricDecision(
        dec,
        n,
        mean,
        100.0 * math.expm1(mean),
        p,
        eq_level if eq else None,
        look_index if eq else None,
        why,
    )


def _stop_or_go(out: LookDecision, last: bool, controls: Collection[str]) -> None:
    """Set ``out.stop`` and ``out.reason``: stop when every primary of every variant but the
    ``controls`` is decided or futile, or at the last look; what is still open then ends
    inconclusive."""
    n = out.n_repeats
    held = [k for k, d in out.metrics.items() if k[0] not in controls and d.decision not in DECIDED]
    undecided = [k for k in held if out.metrics[k].decision != "futile"]
    futile = len(held) - len(undecided)
    open_total = sum(1 for d in out.metrics.values() if d.decision not in DECIDED)
    if not undecided:
        out.stop = True
        out.reason = f"every primary decided after {n} repeats"
        if futile:
            out.reason = (
                f"every primary decided or futile after {n} repeats; {futile} primary "
                "metric(s) inconclusive (futile: unlikely to be decided by the last look)"
            )
        if open_total > futile:
            out.reason += (
                f"; {open_total - futile} A/A primary metric(s) undecided (A/A variants do not "
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
) -> LookDecision | None:
    """Run :func:`decide` for every look whose repeats exist, stopping where the design stops.

    The same arguments as :func:`decide`; the series may be of any length (a resumed run passes
    what is on disk). Returns the last look's decision (``stop`` False: run up to the next look),
    or None when fewer repeats than the first look exist.
    """
    have = min((len(s) for per in log_ratios.values() for s in per.values()), default=0)
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
