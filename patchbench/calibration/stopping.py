"""Sequential designs in the calibration: the runner's own stopping rule replayed on a trial.

A :class:`SeqSpec` is a ``schedule.repeats: {min, max, step, boundary}`` to simulate (the option
``--sequential MIN:MAX:STEP[:BOUNDARY[:FUTILITY[:aa]]]``, :func:`parse_seq`);
:func:`sequential_plan` builds the runner's stopping rule for it from a config
(``patchbench.bench.sequential_design`` / ``sequential_primaries``) and :func:`sequential_stop`
replays it on a trial drawn with ``max`` repeats (``patchbench.sequential.replay``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from patchbench.calibration.model import AA, BASELINE, Trial


@dataclass(frozen=True)
class SeqSpec:
    """A ``schedule.repeats: {min, max, step, boundary}`` to simulate. futility: the
    conditional-power threshold of the futility stop (None: the runner's own,
    ``patchbench.bench.sequential_design``; 0: none); aa_holds: the A/A variant holds the run
    open like a patch (for comparison with the runner's rule, where A/A variants are controls
    that hold no run open)."""

    min: int
    max: int
    step: int = 2
    boundary: str = "pocock"
    futility: float | None = None
    aa_holds: bool = False

    @property
    def label(self) -> str:
        extra = []
        if self.futility is not None:
            extra.append(f"futility {self.futility:g}" if self.futility else "no futility")
        if self.aa_holds:
            extra.append("A/A holds")
        return f"sequential {self.min}..{self.max} step {self.step} ({self.boundary})" + (
            f" [{', '.join(extra)}]" if extra else ""
        )


@dataclass
class SeqPlan:
    """What the runner uses to stop a sequential run (built by the runner's own functions,
    ``patchbench.bench.sequential_design`` / ``sequential_primaries``, from the config with its
    schedule replaced; ``spec.futility`` replaces the design's futility threshold when given):
    the design, [(key "suite.metric", suite, metric, better, log margin)] and the A/A variants
    that do not hold the run open (the runner's ``cfg.is_aa``; none with ``spec.aa_holds``)."""

    spec: SeqSpec
    design: object
    primaries: list[tuple[str, str, str, str, float]]
    controls: tuple[str, ...] = (AA,)


def sequential_plan(config: Path, spec: SeqSpec) -> SeqPlan:
    """The shipped stopping rule of ``spec`` for ``config`` (its compare settings, suites,
    margins). Raises ConfigError (patchbench.config) when the config does not load."""
    from patchbench import bench
    from patchbench.config import ScheduleSpec, load_config

    cfg = load_config(config)
    sched = ScheduleSpec(
        repeats={"min": spec.min, "max": spec.max, "step": spec.step, "boundary": spec.boundary},
        order="interleaved",
    )
    cfg = cfg.model_copy(update={"schedule": sched})
    prims = [
        (f"{s}.{m}", s, m, info.better, math.log1p(pct / 100.0))
        for s, m, info, pct in bench.sequential_primaries(cfg)
    ]
    design = bench.sequential_design(cfg)
    if spec.futility is not None:
        design = dataclasses.replace(design, futility=spec.futility)
    return SeqPlan(spec, design, prims, () if spec.aa_holds else (AA,))


def sequential_stop(tr: Trial, plan: SeqPlan) -> int:
    """Rounds the shipped sequential rule runs on this trial (``patchbench.sequential.replay``
    on the paired log ratios of every compared variant, A/A included, as the runner's
    ``sequential_look`` builds them; ``plan.controls`` do not hold the run open): the look at
    which it stops, or ``max``."""
    from patchbench.sequential import replay

    ratios = {
        v: {
            key: np.log(tr.values(v, s, mm) / tr.values(BASELINE, s, mm))
            for key, s, mm, _, _ in plan.primaries
        }
        for v in tr.variants[1:]
    }
    margins = {key: mg for key, _, _, _, mg in plan.primaries}
    better = {key: b for key, _, _, b, _ in plan.primaries}
    out = replay(ratios, margins, design=plan.design, better=better, controls=plan.controls)
    return out.n_repeats if out is not None and out.stop else tr.repeats


def parse_seq(text: str) -> SeqSpec:
    """``MIN:MAX:STEP[:BOUNDARY[:FUTILITY[:aa]]]`` as a :class:`SeqSpec`: e.g. ``4:12:2:pocock``
    (the runner's futility threshold), ``4:12:2:pocock:0.2`` (futility at conditional power
    0.2), ``4:12:2:pocock:0:aa`` (no futility, the A/A variant holds the run open like a patch).
    Raises argparse.ArgumentTypeError (the ``type=`` of an argparse option)."""
    usage = (
        f"{text!r}: a sequential design is MIN:MAX:STEP[:BOUNDARY[:FUTILITY[:aa]]], e.g. "
        "4:12:2:pocock or 4:12:2:pocock:0.1"
    )
    parts = text.split(":")
    if not 3 <= len(parts) <= 6 or not all(x.isdigit() for x in parts[:3]):
        raise argparse.ArgumentTypeError(usage)
    if len(parts) >= 4 and parts[3] not in ("pocock", "obrien-fleming"):
        raise argparse.ArgumentTypeError(f"{text!r}: boundary is pocock or obrien-fleming")
    fut = None
    if len(parts) >= 5:
        try:
            fut = float(parts[4])
        except ValueError:
            raise argparse.ArgumentTypeError(usage) from None
        if not 0.0 <= fut < 1.0:
            raise argparse.ArgumentTypeError(f"{text!r}: futility must lie in [0, 1)")
    if len(parts) == 6 and parts[5] != "aa":
        raise argparse.ArgumentTypeError(usage)
    return SeqSpec(*map(int, parts[:3]), *parts[3:4], futility=fut, aa_holds=len(parts) == 6)
