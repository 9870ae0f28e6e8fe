"""The order table: false calls of ``schedule.order: interleaved`` and ``randomized`` under a
periodic disturbance (``tools/calibrate.py --order-only``).

Each row is one period P of the disturbance (the model's ``period``: the cells at positions 0,
P, 2P, ... of the run are ``period_slow`` slower, :mod:`tools.calibration.model`) and both
orders, on the same seeded trials (the same draws; only the order differs, a randomized trial's
seed coming from its own seed sequence): a no-effect patch called improved or regressed on a
primary, the A/A variant called improved or regressed (what shows the disturbance), and +10 %
output throughput called improved.
"""

from __future__ import annotations

import dataclasses

from patchbench.analysis.comparison import CompareSettings
from tools.calibration.model import PATCHES, Model
from tools.calibration.tables import fmt
from tools.calibration.trials import Counts, run_row

ORDERS = ("interleaved", "randomized")


def order_rows(
    base: Model, repeats: int, periods: list[int], trials: int, seed: int, settings: CompareSettings
) -> list[tuple[int, str, Counts]]:
    """(period, order, counts) for each period and order: :func:`run_row` with both scenarios
    on ``base`` with that period and order."""
    return [
        (
            p,
            o,
            run_row(dataclasses.replace(base, period=p, order=o), repeats, trials, seed, settings),
        )
        for p in periods
        for o in ORDERS
    ]


def order_table(rows: list[tuple[int, str, Counts]], base: Model, repeats: int) -> list[str]:
    """The markdown table of :func:`order_rows`."""
    out = [
        f"Run CV {100 * base.run_cv:g}%, {repeats} repeats, every P-th cell "
        f"{100 * base.period_slow:g}% slower:",
        "",
        "| period P (cells) | order | trials | a no-effect patch shown improved or regressed "
        "on a primary | A/A variant shown improved or regressed | +10% output throughput "
        "called improved |",
        "|---|---|---|---|---|---|",
    ]
    for p, o, c in rows:
        out.append(
            f"| {p or 'none'} | {o} | {c.null} | {fmt(c.new_fp_patch, len(PATCHES) * c.null)} | "
            f"{fmt(c.aa_failed, c.null)} | {fmt(c.new_power, c.effect)} |"
        )
    return out
