"""The capacity search: the highest load whose SLO attainment reaches a target, found with as few
probes as a bracket allows (docs/serving.md, "Capacity at the SLO"). Pure: the load is probed
through a callable, so the rule is tested on synthetic curves without a server.

A probe at load ``c`` gives an attainment score (:mod:`.attainment`); it *meets* when the score
is >= ``target``. The search assumes attainment falls with the load (a load meeting above a
failing one is not looked for)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .attainment import AttainmentSlo

Answer = Literal["bracket", "cliff", "beyond", "never", "capped"]


class Capped(Exception):
    """The search ran its ``max_probes`` (internal to :func:`search`)."""


@dataclass(frozen=True)
class Probe:
    """One probe: the load, its attainment score (0..1) and whether it met the target."""

    load: float
    score: float
    meets: bool


@dataclass
class Search:
    """The search's answer.

    answer: "bracket" (lo meets, hi fails, hi - lo within the precision; value interpolated
    between them), "cliff" (the same bracket, but the score at hi is more than ``cliff_drop``
    below the target: no root is interpolated, value = lo), "beyond" (the maximum meets: the
    capacity is only known to be >= lo = the maximum; value None) or "never" (the minimum fails:
    hi = the minimum; value None) or "capped" (``max_probes`` ran before a bracket was found: lo
    the highest load met, hi the lowest failing, either None; value None). probes: in the order
    run."""

    answer: Answer
    lo: float | None
    hi: float | None
    value: float | None
    probes: list[Probe] = field(default_factory=list)


def search(
    attain: Callable[[float], float],
    *,
    target: float,
    start: float,
    maximum: float,
    minimum: float = 1.0,
    precision: float = 0.1,
    prior: tuple[float | None, float | None] | None = None,
    cliff_drop: float = 0.25,
    integer: bool = True,
    dither: float = 0.0,
    max_probes: int | None = None,
) -> Search:
    """Find the highest load in [minimum, maximum] whose score ``attain(load)`` is >= ``target``.

    From ``start`` the load doubles while it meets (capped at ``maximum``) or halves while it
    fails (floored at ``minimum``). With the previous round's bracket ``prior`` = (lo, hi) (either
    end None) its lo is probed first and the steps start at the bracket's width and double (a
    galloping search), so a bracket that still holds costs about two probes. The bracket is then
    bisected until hi - lo <= precision x lo (and, with ``integer`` loads such as a concurrency,
    until hi - lo <= 1). No load is probed twice.
    ``dither`` in [-1, 1] moves the first probe by dither x precision (relative): a new one each
    round keeps the bracket's grid, and so the error of the answer within it, from repeating
    across rounds (the previous bracket would otherwise pin it).
    ``max_probes``: the most probes run; reached before a bracket, the answer is "capped";
    reached while bisecting, the bracket found so far is the answer (wider than ``precision``).
    ValueError for minimum <= 0, minimum > maximum, precision <= 0 or max_probes < 1."""
    if minimum <= 0 or minimum > maximum or precision <= 0:
        raise ValueError(
            f"bad search range: minimum {minimum}, maximum {maximum}, precision {precision}"
        )
    if max_probes is not None and max_probes < 1:
        raise ValueError(f"max_probes must be >= 1, got {max_probes}")
    seen: dict[float, Probe] = {}
    order: list[Probe] = []

    def clamp(x: float) -> float:
        x = min(max(x, minimum), maximum)
        return float(math.floor(x)) if integer else float(x)

    def probe(c: float) -> Probe:
        if c not in seen and max_probes is not None and len(order) >= max_probes:
            raise Capped
        if c not in seen:
            s = float(attain(c))
            seen[c] = Probe(c, s, s >= target)
            order.append(seen[c])
        return seen[c]

    p_lo, p_hi = prior or (None, None)
    if not -1 <= dither <= 1:
        raise ValueError(f"dither must be in [-1, 1], got {dither}")
    first = clamp((p_lo if p_lo is not None else start) * (1 + dither * precision))
    # the step: the previous bracket's width, doubling after each probe (a galloping search from
    # the hint); without one the load itself, so the load doubles (or halves)
    width = max(p_hi - p_lo, 1.0) if p_lo is not None and p_hi is not None else None
    lo: float | None = None
    hi: float | None = None
    try:
        if probe(first).meets:
            lo, w = first, width or first
            while hi is None:
                step = clamp(lo + w)
                if step <= lo:  # lo is the maximum
                    return Search("beyond", lo, None, None, order)
                if probe(step).meets:
                    lo, w = step, 2 * w
                else:
                    hi = step
        else:
            hi, w = first, width or first / 2
            while lo is None:
                step = clamp(hi - w)
                if step >= hi:  # hi is the minimum
                    return Search("never", None, hi, None, order)
                if probe(step).meets:
                    lo = step
                else:
                    hi, w = step, (2 * w if width else step / 2)
        while hi - lo > precision * lo and not (integer and hi - lo <= 1):
            mid = clamp((lo + hi) / 2)
            if probe(mid).meets:
                lo = mid
            else:
                hi = mid
    except Capped:
        met = [p.load for p in order if p.meets]
        lo = max(met) if met else None
        above = [p.load for p in order if not p.meets and (lo is None or p.load > lo)]
        hi = min(above) if above else None
        if lo is None or hi is None:
            return Search("capped", lo, hi, None, order)
    s_lo, s_hi = seen[lo].score, seen[hi].score
    if s_hi < target - cliff_drop:
        return Search("cliff", lo, hi, lo, order)
    return Search("bracket", lo, hi, lo + (s_lo - target) / (s_lo - s_hi) * (hi - lo), order)


class Capacity(BaseModel):
    """``serving.capacity``: per cell, the highest ``max_concurrency`` whose probe meets ``slo``
    (:func:`search` from ``start`` within [``min``, ``max``], bisected to ``precision``, relative).
    Prompts at a probe: max(min_prompts, ceil(prompts_per_load x concurrency)). ``primary``: the
    capacity joins the report's family. ``cliff_drop``: a score this far below the target one step
    above a meeting load is a cliff. ``max_probes``: the most probes a cell runs (None: as many as
    the precision needs)."""

    model_config = ConfigDict(extra="forbid")

    slo: AttainmentSlo = Field(default_factory=AttainmentSlo)
    start: int = Field(16, ge=1)
    min: int = Field(1, ge=1)
    max: int = Field(256, ge=1)
    precision: float = Field(0.1, gt=0, le=1)
    prompts_per_load: float = Field(4.0, gt=0)
    min_prompts: int = Field(32, ge=1)
    cliff_drop: float = Field(0.25, gt=0, le=1)
    max_probes: int | None = Field(None, ge=1)
    primary: bool = True

    @model_validator(mode="after")
    def _range(self) -> Capacity:
        if not self.min <= self.start <= self.max:
            raise ValueError(
                f"capacity needs min <= start <= max, got {self.min}, {self.start}, {self.max}"
            )
        return self

    def num_prompts(self, load: float) -> int:
        """Prompts sent by the probe at ``load``."""
        return max(self.min_prompts, math.ceil(self.prompts_per_load * load))

    def search(
        self,
        attain: Callable[[float], float],
        *,
        prior: tuple[float | None, float | None] | None = None,
        dither: float = 0.0,
    ) -> Search:
        """:func:`search` with these settings (target: the SLO's)."""
        return search(
            attain,
            target=self.slo.target,
            start=self.start,
            maximum=self.max,
            minimum=self.min,
            precision=self.precision,
            prior=prior,
            cliff_drop=self.cliff_drop,
            dither=dither,
            max_probes=self.max_probes,
        )
