"""Order of the (variant, repeat) cells of a run.

Interleaved order alternates the direction of each round (ABBA for two variants: A B | B A |
A B ...; ABC CBA ABC for three), so a slow drift of the machine (thermal, background load) hits
every variant alike and cancels in paired comparisons. Sequential runs all repeats of one variant
before the next (only for debugging: drift then looks like an effect).

Correctness cells: when a suite declares in-server instrumentation or is untimed
(``Suite.timed = False``), each variant gets one untimed ``correctness`` cell before the timed
rounds (folder ``<variant>/correctness``). It runs the untimed and instrumented suites (plus the
timed server suites when those send no traffic: patchbench/run/cell.py ``cell_suites``) with every
instrumentation on; its timings feed no verdict. Timed cells never carry instrumentation and never run untimed suites.

Per-suite schedules: ``suites.<name>.rounds`` (``all``, ``first`` or a list of 0-based round
indices) says in which timed rounds a suite runs (e.g. greedy MMMU once, serving timings in every
round); :func:`parse_rounds` checks the value, :func:`resolve_rounds` turns it into indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

CellKind = Literal["timed", "correctness"]


@dataclass(frozen=True)
class Cell:
    """One server lifetime: ``variant`` at repeat ``repeat`` (0-based); ``index`` = position in
    the run order (0-based); ``kind``: "timed" (timings feed verdicts) or "correctness" (one per
    variant, instrumented and untimed suites; ``repeat`` is 0)."""

    index: int
    variant: str
    repeat: int
    kind: CellKind = "timed"

    @property
    def dirname(self) -> str:
        """``rep<k>`` for a timed cell, ``correctness`` for a correctness cell."""
        return "correctness" if self.kind == "correctness" else f"rep{self.repeat}"

    @property
    def label(self) -> str:
        """``variant/rep<k>`` or ``variant/correctness`` (log lines, progress, markers)."""
        return f"{self.variant}/{self.dirname}"

    def path(self, run_dir: str | Path) -> Path:
        """The cell's folder in ``run_dir``."""
        return Path(run_dir) / self.variant / self.dirname


def plan_cells(
    variants: list[str],
    repeats: int,
    order: Literal["interleaved", "sequential"] = "interleaved",
    *,
    correctness: bool = False,
) -> list[Cell]:
    """The run order. ``variants`` in config order (the baseline first is customary).

    interleaved: round r runs the variants forward for even r and backward for odd r.
    correctness: one correctness cell per variant (config order) before the timed cells.
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
    first = [Cell(i, v, 0, "correctness") for i, v in enumerate(variants)] if correctness else []
    return first + [Cell(len(first) + i, v, r) for i, (v, r) in enumerate(pairs)]


#: the core key of a suite's section that is not one of the suite's own parameters
ROUNDS_KEY = "rounds"


def parse_rounds(
    value: Any, max_repeats: int, where: str, *, floor: int | None = None
) -> str | list[int]:
    """Check a ``suites.<name>.rounds`` value against a run of at most ``max_repeats`` rounds.
    ``floor``: ``schedule.repeats: auto``'s ``nightly.min_repeats`` (a run may have only that
    many rounds; an index at or above it is refused with a message saying so).

    Returns "all", "first" or the sorted list of 0-based round indices. Raises ValueError naming
    ``where`` (the key) for anything else: not "all"/"first"/a list of integers, an empty list,
    an index listed twice, or an index the run never reaches (a suite in no round).
    """
    if value in ("all", "first"):
        return value
    if not isinstance(value, list) or any(
        isinstance(x, bool) or not isinstance(x, int) for x in value
    ):
        raise ValueError(
            f"{where}: {value!r} is not a round list; use all, first or a list of "
            f"round indices counted from 0 (e.g. [0, 2])"
        )
    if not value:
        raise ValueError(
            f"{where}: [] puts the suite in no round; use all, first or a "
            f"list of round indices from 0 to {max_repeats - 1}"
        )
    if len(set(value)) != len(value):
        raise ValueError(f"{where}: {value} lists a round twice")
    bad = [x for x in value if not 0 <= x < max_repeats]
    if bad and floor is not None:
        raise ValueError(
            f"{where}: round(s) {bad} with schedule.repeats: auto: a night may run only "
            f"nightly.min_repeats = {floor} round(s), indices 0 to {floor - 1}; list rounds "
            f"below {floor}, or use first or all"
        )
    if bad:
        raise ValueError(
            f"{where}: round(s) {bad} do not exist: this run has at most "
            f"{max_repeats} round(s), indices 0 to {max_repeats - 1}; a suite "
            "must run in at least one round that exists"
        )
    return sorted(value)


def resolve_rounds(value: Any, repeats: int) -> list[int]:
    """The 0-based timed rounds (``< repeats``) a suite runs in, for a ``rounds`` value as
    :func:`parse_rounds` returns it (None or a missing key: "all")."""
    if value in (None, "all"):
        return list(range(repeats))
    if value == "first":
        return [0] if repeats > 0 else []
    return [int(x) for x in value if 0 <= int(x) < repeats]
