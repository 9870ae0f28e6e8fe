"""Sequential designs in the calibration: the report's own sequential rule on a trial.

A :class:`SeqSpec` is a ``schedule.repeats: {min, max, step, boundary}`` to simulate (the option
``--sequential MIN:MAX:STEP[:BOUNDARY[:FUTILITY]]``, :func:`parse_seq`);
:func:`sequential_plan` builds the runner's design for it from a config
(``patchbench.run.bench.sequential_design`` / ``sequential_primaries``) and
``tools.calibration.trials.sequential_stop`` runs the comparison on a trial drawn with
``max`` repeats under that schedule: the analysis replays the rule
(``patchbench.analysis.family.sequential_decision``, the runner's look too) and the trial stops where
it stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from tools.calibration.model import AA


@dataclass(frozen=True)
class SeqSpec:
    """A ``schedule.repeats: {min, max, step, boundary}`` to simulate. futility: the
    conditional-power threshold of the futility stop (None: the runner's own,
    ``patchbench.run.bench.sequential_design``; 0: none)."""

    min: int
    max: int
    step: int = 2
    boundary: str = "pocock"
    futility: float | None = None

    @property
    def label(self) -> str:
        extra = []
        if self.futility is not None:
            extra.append(f"futility {self.futility:g}" if self.futility else "no futility")
        return f"sequential {self.min}..{self.max} step {self.step} ({self.boundary})" + (
            f" [{', '.join(extra)}]" if extra else ""
        )


@dataclass
class SeqPlan:
    """What the runner uses to stop a sequential run (built by the runner's own functions,
    ``patchbench.run.bench.sequential_design`` / ``sequential_primaries``, from the config with its
    schedule replaced; ``spec.futility`` replaces the design's futility threshold when given):
    the design, [(key "suite.metric", suite, metric, better, log margin)] of the primaries that
    grow with the looks, and the A/A variants (measured controls that hold no run open)."""

    spec: SeqSpec
    design: object
    primaries: list[tuple[str, str, str, str, float]]
    controls: tuple[str, ...] = (AA,)


def sequential_plan(config: Path, spec: SeqSpec) -> SeqPlan:
    """The shipped stopping rule of ``spec`` for ``config`` (its compare settings, suites,
    margins). Raises ConfigError (patchbench.config) when the config does not load."""
    from patchbench.config import ScheduleSpec, load_config
    from patchbench.run import bench

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
    return SeqPlan(spec, design, prims, (AA,))


def schedule_of(plan: SeqPlan) -> dict:
    """The config's ``schedule.repeats`` mapping of ``plan`` (what the analysis reads)."""
    s = plan.spec
    return {
        "min": s.min,
        "max": s.max,
        "step": s.step,
        "boundary": s.boundary,
        "futility": plan.design.futility,
    }


def parse_seq(text: str) -> SeqSpec:
    """``MIN:MAX:STEP[:BOUNDARY[:FUTILITY]]`` as a :class:`SeqSpec`: e.g. ``4:12:2:pocock``
    (the runner's futility threshold), ``4:12:2:pocock:0.2`` (futility at conditional power
    0.2). Raises argparse.ArgumentTypeError (the ``type=`` of an argparse option)."""
    usage = (
        f"{text!r}: a sequential design is MIN:MAX:STEP[:BOUNDARY[:FUTILITY]], e.g. "
        "4:12:2:pocock or 4:12:2:pocock:0.1"
    )
    parts = text.split(":")
    if not 3 <= len(parts) <= 5 or not all(x.isdigit() for x in parts[:3]):
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
    return SeqSpec(*map(int, parts[:3]), *parts[3:4], futility=fut)
