#!/usr/bin/env python
"""Calibrate the paired capacity verdict (serving.capacity) on synthetic runs with known truth.

Every trial runs the real capacity search in every cell on a synthetic attainment curve and
judges the run with the comparison code (:mod:`tools.calibration.capacity`: the noise model).
Printed per curve (smooth, cliff) and design (fixed ``--repeats``, and the ``--config``'s
schedule when it is sequential): false calls with no effect (improved or regressed, target
<= 5 %), +``--effect`` capacity called improved (target >= 80 %), each with its 95 % Wilson
interval, the rounds a null report ran and the probes a cell ran. Exit 0 when the targets hold
for the config's own schedule (its sequential one, else the last ``--repeats``), 1 otherwise.

Usage::

    .venv/bin/python tools/calibrate_capacity.py --config configs/pr9460-capacity-h200.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patchbench import stats
from patchbench.config import load_config
from tools.calibration.capacity import Noise, capacity_row


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 0 when every row meets both targets, 1 otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/pr9460-capacity-h200.yaml"))
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--repeats", type=int, nargs="*", default=[8])
    ap.add_argument("--capacity", type=float, default=48.0, help="true baseline capacity")
    ap.add_argument("--effect", type=float, default=0.10)
    ap.add_argument("--cv", type=float, default=0.03, help="run CV of the capacity")
    ap.add_argument("--shock", type=float, default=0.3, help="per-cell logit shock sd")
    ap.add_argument("--width", type=float, default=0.1, help="curve width (log load a logit)")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    cfg = load_config(a.config)
    cap = cfg.suite_params["serving"].capacity
    seq = cfg.schedule.sequential
    designs: list = list(a.repeats) + ([seq.model_dump()] if seq is not None else [])
    print(
        f"| curve | design | trials | false calls | +{a.effect * 100:g} % called improved "
        "| rounds (null) | probes a cell |\n|---|---|---|---|---|---|---|"
    )
    ok = True
    for i, cliff in enumerate((False, True)):
        noise = Noise(cv=a.cv, shock=a.shock, width=a.width, cliff=cliff)
        for j, d in enumerate(designs):
            r = capacity_row(cap, d, a.capacity, a.effect, noise, a.trials, a.seed + 10 * i + j)
            fl, fh = stats.wilson_interval(r.false_calls, r.trials)
            pl, ph = stats.wilson_interval(r.improved, r.trials)
            if d is designs[-1]:  # the config's own schedule (sequential, else the last count)
                ok &= r.false_calls / r.trials <= 0.05 and r.improved / r.trials >= 0.80
            print(
                f"| {'cliff' if cliff else 'smooth'} | {r.design} | {r.trials} | "
                f"{r.false_calls / r.trials * 100:.1f} % [{fl * 100:.1f}, {fh * 100:.1f}] | "
                f"{r.improved / r.trials * 100:.1f} % [{pl * 100:.1f}, {ph * 100:.1f}] | "
                f"{r.rounds / r.trials:.1f} | {r.probes / r.cells:.1f} |"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
