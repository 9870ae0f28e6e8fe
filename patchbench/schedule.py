"""Order of the (variant, repeat) cells of a run.

Interleaved order alternates the direction of each round (ABBA for two variants: A B | B A |
A B ...; ABC CBA ABC for three), so a slow drift of the machine (thermal, background load) hits
every variant alike and cancels in paired comparisons. Sequential runs all repeats of one variant
before the next (only for debugging: drift then looks like an effect).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Cell:
    """One server lifetime: ``variant`` at repeat ``repeat`` (0-based); ``index`` = position in
    the run order (0-based)."""

    index: int
    variant: str
    repeat: int


def plan_cells(variants: list[str], repeats: int,
               order: Literal["interleaved", "sequential"] = "interleaved") -> list[Cell]:
    """The run order. ``variants`` in config order (the baseline first is customary).

    interleaved: round r runs the variants forward for even r and backward for odd r.
    Raises ValueError for no variants, repeats < 1, or an unknown order.
    """
    if not variants:
        raise ValueError("no variants to schedule")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    pairs: list[tuple[str, int]] = []
    if order == "interleaved":
        for r in range(repeats):
            seq = variants if r % 2 == 0 else list(reversed(variants))
            pairs.extend((v, r) for v in seq)
    elif order == "sequential":
        pairs = [(v, r) for v in variants for r in range(repeats)]
    else:
        raise ValueError(f"unknown order '{order}'; allowed: interleaved, sequential")
    return [Cell(i, v, r) for i, (v, r) in enumerate(pairs)]
