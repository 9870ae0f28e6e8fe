#!/usr/bin/env python
"""Calibrate the comparison: how often do its verdicts mislead, on synthetic runs with known truth.

A benchmark of the verdict rules, not a unit test (the code: :mod:`tools.calibration`; its
module docstrings describe the noise model, the trials and the designs). Every trial is one
synthetic run (a baseline, an A/A variant, ``patch-a`` and ``patch-b``) judged by the comparison
code; printed, each rate with its 95 % Wilson interval over the trials:

- per row (run CV, repeats): a patch with no effect shown improved / regressed on any primary
  (target <= 5 %; counted per null patch), the same over the whole report (both null patches and
  the A/A variant), +10 % output throughput of ``patch-a`` called improved (target >= 90 %),
  one-repeat reports with a run-level improved / regressed verdict (target 0); the real-0
  primaries of the null patches called equivalent, the A/A check, and the realised CV;
- the repeat search at ``--target-cv`` when the config's repeats miss the power target;
- a design table at ``--target-cv`` (printed last, for the README): fixed and ``--sequential``
  designs, error rates, repeats used, primaries decided per report and per H200 hour.
  ``--design-only`` runs just this table;
- ``--mmmu-only``: the MMMU accuracy interval's width, coverage and false calls at 1, 2, 3 and 5
  repeats per arm under a cell-level shift (tools.calibration.mmmu);
- ``--order-only``: false calls of the interleaved and the randomized order under a periodic
  disturbance, one row per ``--periods`` (tools.calibration.order), at ``--target-cv`` and
  the first ``--repeats`` (8).

docs/calibration.md holds the rates of the retired verdict rule next to the comparison's.

Usage::

    .venv/bin/python tools/calibrate.py                  # default rows, 400 trials each
    .venv/bin/python tools/calibrate.py --trials 1000 --cvs 0.03 --repeats 5 6 7
    .venv/bin/python tools/calibrate.py --trials 20 --via-folders   # the on-disk path
    .venv/bin/python tools/calibrate.py --design-only --design-repeats 8 --small-effect 0.05 \\
        --sequential 4:12:2:pocock:0:aa 4:12:2:pocock 4:8:2:pocock   # the design table only
    .venv/bin/python tools/calibrate.py --design-only --mmmu-rounds first   # MMMU in round 1
    .venv/bin/python tools/calibrate.py --sweep 4 --repeats 8 --cvs 0.03   # a load sweep's family
    .venv/bin/python tools/calibrate.py --design-only --noise t:3 --sequential   # other noise
    .venv/bin/python tools/calibrate.py --order-only --repeats 12   # the order table
    .venv/bin/python tools/calibrate.py --sweep 4 --repeats 4 8 --cvs 0.03 \\
        --config configs/pr9460-sweep-h200.yaml   # ... and the config's sequential schedule

``--sweep POINTS`` runs only the load-sweep model (:mod:`tools.calibration.sweep`): a
single point and a POINTS-point sweep, each at every ``--cvs`` and ``--repeats``, and, when
``--config`` has a serving sweep and a sequential schedule, a single point and that sweep under
the config's schedule (the runner's stopping rule replayed): false calls with no effect, +10 %
output throughput at one point called improved, and the rounds the reports ran.

Exit status 0 when the targets hold at ``--target-cv`` with the config's schedule (fixed or
sequential), 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's patchbench

from tools.calibration.designs import cv_rows, design_rows, load  # noqa: E402
from tools.calibration.model import Model, parse_noise  # noqa: E402
from tools.calibration.stopping import parse_seq  # noqa: E402
from tools.calibration.tables import print_report  # noqa: E402


def _row_options(ap: argparse.ArgumentParser) -> None:
    """The CV rows, the targets and the repeat search."""
    ap.add_argument("--trials", type=int, default=400, help="seeded trials a row and scenario")
    ap.add_argument(
        "--cvs",
        type=float,
        nargs="+",
        default=[0.015, 0.03, 0.06, 0.12],
        help="run-level CVs (fractions), one row each (0.015 0.03 0.06 0.12)",
    )
    ap.add_argument(
        "--repeats", type=int, nargs="+", help="repeats of those rows (default: the config's)"
    )
    ap.add_argument(
        "--config",
        type=Path,
        default=REPO / "configs" / "pr9460-h200.yaml",
        help="config whose repeats and compare settings are used and checked",
    )
    ap.add_argument(
        "--target-cv",
        type=float,
        default=0.03,
        help="CV at which the targets are checked and more repeats searched (0.03)",
    )
    ap.add_argument(
        "--search-max", type=int, default=12, help="largest repeat count searched (0: no search)"
    )
    ap.add_argument(
        "--screen-trials",
        type=int,
        default=100,
        help="+10%% trials that screen each searched repeat count before its full row (0: none)",
    )
    ap.add_argument("--power-target", type=float, default=0.90)
    ap.add_argument("--fp-target", type=float, default=0.05)
    ap.add_argument("--no-one-repeat", action="store_true", help="skip the one-repeat row")
    ap.add_argument(
        "--secondaries",
        action="store_true",
        help="give the comparison every simulated serving metric, not only the primaries "
        "(about 3x slower; only the 'any row' column changes)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--via-folders", action="store_true", help="run folders through compare_run (slow)"
    )


def _design_options(ap: argparse.ArgumentParser) -> None:
    """The design table and its H200 cost columns."""
    ap.add_argument(
        "--design-only",
        action="store_true",
        help="only the design table at --target-cv: no CV rows, no search, no one-repeat row",
    )
    ap.add_argument(
        "--mmmu-only",
        action="store_true",
        help="only the MMMU interval table (tools.calibration.mmmu): width, coverage and "
        "false calls at 1, 2, 3 and 5 repeats per arm, --trials a row",
    )
    ap.add_argument(
        "--order-only",
        action="store_true",
        help="only the order table (tools.calibration.order): interleaved vs randomized under a "
        "periodic disturbance, --trials a row",
    )
    ap.add_argument(
        "--periods",
        type=int,
        nargs="+",
        default=[0, 2, 3, 4, 8],
        help="order table: periods of the disturbance in cells, 0: none (0 2 3 4 8)",
    )
    ap.add_argument(
        "--period-slow",
        type=float,
        default=0.10,
        help="order table: how much slower a disturbed cell is (0.10)",
    )
    ap.add_argument(
        "--mmmu-flip",
        type=float,
        default=0.03,
        help="MMMU table: share of questions whose correctness changes between two runs (0.03)",
    )
    ap.add_argument(
        "--mmmu-cell-sd",
        type=float,
        default=0.005,
        help="MMMU table: sd of a cell's accuracy shift, a proportion (0.005: half a point)",
    )
    ap.add_argument(
        "--design-repeats",
        type=int,
        nargs="*",
        default=[8, 12, 16],
        help="fixed repeat counts in the design table (8 12 16; the config's and 5 always)",
    )
    ap.add_argument(
        "--sequential",
        type=parse_seq,
        nargs="*",
        default=[parse_seq(x) for x in ("4:12:2:pocock", "4:12:2:obrien-fleming", "4:8:2:pocock")],
        help="sequential designs MIN:MAX:STEP[:BOUNDARY[:FUTILITY[:aa]]] in the design table "
        "(4:12:2:pocock 4:12:2:obrien-fleming 4:8:2:pocock; the config's own always)",
    )
    ap.add_argument(
        "--small-effect",
        type=float,
        help="also count how often patch-a's output throughput at this speed-up (e.g. 0.05) is "
        "called improved (one more scenario a design row)",
    )
    ap.add_argument(
        "--mmmu-rounds",
        help="MMMU schedule of every design row but the reference: all, first or N (the first "
        "N rounds) (default: the config's)",
    )
    ap.add_argument(
        "--startup-s",
        type=float,
        default=60.0,
        help="server start-up per H200 cell (60 s: an assumption, not measured here)",
    )
    ap.add_argument("--serving-s", type=float, default=79.0, help="serving phase per cell (79 s)")
    ap.add_argument("--mmmu-s", type=float, default=76.0, help="MMMU phase per cell (76 s)")
    ap.add_argument(
        "--correctness-s",
        type=float,
        default=30.0,
        help="one untimed correctness cell beyond its start-up (30 s: an assumption)",
    )


def _model_options(ap: argparse.ArgumentParser) -> None:
    """The noise model's request level and MMMU."""
    ap.add_argument("--req-cv", type=float, default=Model.req_cv, help="request-level CV (0.20)")
    ap.add_argument(
        "--step-share",
        type=float,
        default=Model.step_share,
        help="share of the request-level log variance common to a decode wave (0.5)",
    )
    ap.add_argument(
        "--fragile",
        type=float,
        default=Model.fragile,
        help="share of MMMU questions right with probability 1/2 in each cell (0.05)",
    )
    ap.add_argument("--questions", type=int, default=Model.questions)
    ap.add_argument(
        "--noise",
        nargs="+",
        default=[],
        metavar="NAME[:VALUE]",
        help="run-level noise beyond the Gaussian (they combine; tools.calibration.model): "
        "t[:DF] Student t shocks scaled to the run CV (3), outlier[:P] one cell 10-20%% slow in "
        "a share P of the runs (0.2), drift[:RATE] a slow-down per round shared by the arms "
        "(0.005), unequal[:FACTOR] patch-a's run CV times FACTOR (2); gauss: none (default)",
    )


def _sweep(a: argparse.Namespace) -> int:
    """``--sweep``: the single point and the sweep at each CV and fixed repeat count, then the
    ``--config``'s own sweep under its schedule when it has a serving sweep (the same trials as
    the fixed row of its ``max`` repeats); prints a table."""
    from tools.calibration.sweep import config_schedule, sweep_row, sweep_table

    shipped: list[tuple[int, dict]] = []
    if a.config.is_file():
        try:
            pts, sched = config_schedule(a.config)
        except ValueError:
            pts, sched = 0, 0
        if isinstance(sched, dict):
            shipped = [(1, sched), (pts, sched)]
    rows = []
    for cv in a.cvs:
        rows += [
            sweep_row(points, n, cv, 0.10, a.trials, seed=1000 * points + n)
            for n in a.repeats or [8]
            for points in (1, a.sweep)
        ]
        rows += [
            sweep_row(points, s["max"], cv, 0.10, a.trials, 1000 * points + s["max"], s)
            for points, s in shipped
        ]
    print("\n".join(sweep_table(rows, 0.10)))
    return 0


def _order(a: argparse.Namespace) -> int:
    """``--order-only``: the order table on the config's compare settings; prints it."""
    import dataclasses

    from tools.calibration.order import order_rows, order_table

    cal = load(a)
    n = (a.repeats or [8])[0]
    base = dataclasses.replace(cal.model(a.target_cv), period_slow=a.period_slow)
    rows = order_rows(base, n, a.periods, a.trials, a.seed, cal.settings)
    print("\n".join(order_table(rows, base, n)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line (see the module docstring); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for add in (_row_options, _design_options, _model_options):
        add(ap)
    ap.add_argument(
        "--sweep", type=int, metavar="POINTS", help="only the load-sweep model (POINTS points)"
    )
    a = ap.parse_args(argv)
    try:
        a.noise_fields = parse_noise(a.noise)
    except ValueError as e:
        ap.error(str(e))
    if a.noise_fields and (a.mmmu_only or a.sweep):
        ap.error("--noise applies to the comparison's trials, not to --mmmu-only or --sweep")
    if a.mmmu_only:
        from tools.calibration.mmmu import MmmuModel, mmmu_table

        m = MmmuModel(flip=a.mmmu_flip, cell_sd=a.mmmu_cell_sd)
        print("\n".join(mmmu_table(m, trials=a.trials)))
        return 0
    if a.sweep:
        return _sweep(a)
    if a.order_only:
        return _order(a)
    cal = load(a)
    if cal.mmmu_first and cal.a.via_folders:
        ap.error("--via-folders simulates MMMU in every round; add --mmmu-rounds all")
    t0 = time.time()
    if not cal.a.design_only:
        cv_rows(cal)
    entries = design_rows(cal)
    if not cal.a.no_one_repeat and not cal.a.design_only:
        cal.row(cal.a.target_cv, 1, ("null",))
    return print_report(cal, argv, time.time() - t0, entries)


if __name__ == "__main__":
    sys.exit(main())
