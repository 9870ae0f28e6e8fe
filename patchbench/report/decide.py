"""How many paired repeats (accuracy: questions) would likely decide an inconclusive primary:
the estimate the answer, the primaries table and the Methods section state."""

from __future__ import annotations

import math
from dataclasses import dataclass

from patchbench.analysis.comparison import Row
from patchbench.report.fmt import _margin_txt, fmt_change

#: the chance of a decision that the repeats-to-decide estimate aims at
DECIDE_POWER = 0.8
#: paired repeats beyond which the estimate says only "more than"
DECIDE_CAP = 50
#: questions beyond this multiple of the row's questions: only "more than"
DECIDE_QUESTIONS_CAP = 20


@dataclass
class Decide:
    """How much data would likely decide an inconclusive row: ``n`` paired repeats (``unit``
    "repeats") or questions ("questions"), None when more than ``cap``; ``what`` the decision
    that needs the fewest ("the observed -8.8%" or "equivalence within ±5%"); ``sd`` the noise
    used, as text; ``pairs`` the data it was measured on, as text."""

    n: int | None
    cap: int
    unit: str
    what: str
    sd: str
    pairs: str


def _n_needed(
    sd: float,
    effect: float,
    margin: float | None,
    alpha: float,
    *,
    t_df: bool,
    floor: int,
    cap: int,
) -> tuple[int | None, str] | None:
    """The smallest n (``floor`` <= n <= ``cap``) that gives :data:`DECIDE_POWER` to one of two
    decisions, and which: showing ``effect`` (two-sided, level ``alpha``: n >= ((q(1 - alpha/2)
    + q(power)) sd / |effect|)^2) or, when |effect| < ``margin``, equivalence by TOST at
    ``alpha`` assuming the true change is ``effect`` (n >= ((q(1 - alpha) + q(1 - (1 -
    power)/2)) sd / (margin - |effect|))^2). q: Student's t with n - 1 degrees of freedom when
    ``t_df``, else the normal. Returns (None, what) when more than ``cap``; None when neither
    decision can happen (no change seen and no margin)."""
    from scipy import stats as sps

    goals = []
    if effect != 0:
        goals.append(("effect", abs(effect), 1 - alpha / 2, DECIDE_POWER))
    if margin is not None and abs(effect) < margin:
        goals.append(("equivalence", margin - abs(effect), 1 - alpha, 1 - (1 - DECIDE_POWER) / 2))
    best: tuple[int | None, str] | None = None
    for what, gap, pa, pb in goals:
        z = (sps.norm.ppf(pa) + sps.norm.ppf(pb)) * sd / gap
        n = max(floor, math.ceil(z * z))
        while t_df and n <= cap:
            q = sps.t.ppf(pa, n - 1) + sps.t.ppf(pb, n - 1)
            if n * gap * gap >= (q * sd) ** 2:
                break
            n += 1
        got = n if n <= cap else None
        if best is None or (got is not None and (best[0] is None or got < best[0])):
            best = (got, what)
    return best


def repeats_to_decide(r: Row, min_repeats: int) -> Decide | None:
    """How many paired repeats (accuracy: questions) would likely decide an inconclusive
    primary at the noise this run saw and the level its verdict used (:func:`_n_needed`).

    Run rows: the observed sd of the paired log ratios (2 pairs or more), t quantiles, at least
    ``min_repeats``. Accuracy rows: the per-question sd the shown interval implies (half-width
    x sqrt(questions) / z), normal quantiles, in questions (repeats of a greedy run are near
    copies; the question is the unit). None for other rows and where the noise is unknown."""
    if r.verdict != "inconclusive" or not r.primary or r.change is None or r.confidence is None:
        return None
    alpha = 1 - r.confidence
    if r.kind == "run" and r.change_unit == "%" and r.log_ratio_sd is not None:
        effect = math.log1p(r.change / 100)
        margin = math.log1p(r.margin / 100) if r.margin is not None else None
        got = _n_needed(
            r.log_ratio_sd, effect, margin, alpha, t_df=True, floor=min_repeats, cap=DECIDE_CAP
        )
        cap, unit, pairs = DECIDE_CAP, "repeats", f"{r.n_pairs} pairs"
        sd = f"sd of paired log ratios {100 * r.log_ratio_sd:.1f}%"
    elif r.kind == "accuracy" and r.low is not None and r.high is not None and r.n_pairs:
        from scipy import stats as sps

        half = (r.high - r.low) / 2
        sd_q = half * math.sqrt(r.n_pairs) / sps.norm.ppf(1 - alpha / 2)
        cap = DECIDE_QUESTIONS_CAP * r.n_pairs
        got = _n_needed(sd_q, r.change, r.margin, alpha, t_df=False, floor=r.n_pairs, cap=cap)
        unit, sd, pairs = "questions", f"interval ±{half:.1f} pt", f"{r.n_pairs} questions"
    else:
        return None
    if got is None:
        return None
    n, what = got
    what = (
        f"equivalence within {_margin_txt(r)}"
        if what == "equivalence"
        else f"the observed {fmt_change(r.change, r.change_unit)}"
    )
    return Decide(n, cap, unit, what, sd, pairs)


def decide_text(d: Decide, *, short: bool = False) -> str:
    """ "about 9 repeats to decide" (``short``, for the answer), or with what and the noise:
    "about 9 paired repeats would likely decide (80% power to show equivalence within ±5%; sd of
    paired log ratios 4.3% over 2 pairs)"; "more than 50 ..." past the cap."""
    if short:
        return f"{'about' if d.n is not None else 'more than'} {d.n or d.cap} {d.unit} to decide"
    unit = "paired repeats" if d.unit == "repeats" else d.unit
    head = (
        f"about {d.n} {unit} would likely decide"
        if d.n is not None
        else f"more than {d.cap} {unit} would be needed to decide"
    )
    return f"{head} ({100 * DECIDE_POWER:g}% power to show {d.what}; {d.sd} over {d.pairs})"


def decide_note(r: Row, min_repeats: int, *, short: bool = False) -> str | None:
    """What an inconclusive primary needs to be decided (:func:`decide_text` of
    :func:`repeats_to_decide`), or why no estimate is given (a run row with fewer than 2 paired
    repeats has no observed noise); None for a row that is decided or not primary."""
    d = repeats_to_decide(r, min_repeats)
    if d is not None:
        return decide_text(d, short=short)
    if r.verdict == "inconclusive" and r.primary and r.kind == "run" and r.log_ratio_sd is None:
        return (
            "noise unknown"
            if short
            else "repeats to decide: not estimated (the noise needs at least 2 paired repeats)"
        )
    return None
