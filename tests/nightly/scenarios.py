"""Nightly histories of three stories, written by the real nightly job
(:func:`patchbench.nightly.job.nightly_on_run`) on synthetic run folders (tests.synthetic), for
the config page's screenshot test and the docs' screenshots (scripts/dashboard_screenshot.py).
Nothing here starts a server.

Each night has 5 repeats of stock's and the patched variant's serving throughput, 1 % lognormal
run noise around 100 tok/s (patched 3 % faster), one gate (5 %, same-run and history); the
sglang release is 0.5.1.post3, then 0.5.23 from the step's night (:data:`STEP_NIGHT`):

- ``stock-step``: from the release change on, stock and patched 8 % slower;
- ``spike``: one night (:data:`SPIKE_NIGHT`) 35 % slower, both variants, then back;
- ``new-while-red``: stock 10 % slower from the release change (the history gate red on every
  night since), and on the newest night the patched variant 2.5x slower than stock: a new red
  while the night is already red.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np

from patchbench.config.nightly import Gate, NightlySettings
from patchbench.nightly.history import History, record_night_builds
from patchbench.nightly.job import nightly_on_run
from tests.synthetic import make_throughput_night

TPUT = "output_throughput_tok_s"
CONFIG = "nightly-h200"
SCENARIOS = ("stock-step", "spike", "new-while-red")
RELEASES = ("0.5.1.post3", "0.5.23")
#: the first night (0-based) on the new release (stock-step, new-while-red)
STEP_NIGHT = 10
#: the spike's night (0-based)
SPIKE_NIGHT = 9
SETTINGS = NightlySettings(
    window_nights=7,
    min_history_nights=2,
    hold_while_learning=False,
    gates=[Gate(metric=f"serving.{TPUT}", threshold_pct=5)],
)


def levels(scenario: str, nights: int) -> tuple[np.ndarray, np.ndarray]:
    """(stock, patched) mean throughput per night (tok/s) of ``scenario`` (module docstring)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    stock = np.full(nights, 100.0)
    if scenario == "stock-step":
        stock[STEP_NIGHT:] *= 0.92
    elif scenario == "spike":
        stock[SPIKE_NIGHT] *= 0.65
    else:
        stock[STEP_NIGHT:] *= 0.90
    patched = stock * 1.03
    if scenario == "new-while-red":
        patched[-1] = stock[-1] / 2.5
    return stock, patched


def build_scenario(root: str | Path, scenario: str, nights: int = 16, seed: int = 7) -> Path:
    """Run the nightly job over ``nights`` synthetic nights of ``scenario`` under ``root/runs``
    into the history ``root/history.sqlite`` (returned). Deterministic for a ``seed``.
    ValueError for an unknown scenario."""
    root = Path(root)
    stock, patched = levels(scenario, nights)
    rng = np.random.default_rng(seed)
    path = root / "history.sqlite"
    for i in range(nights):
        day = i + 1
        run_id = f"202603{day:02d}T030000Z-{CONFIG}"
        release = RELEASES[1] if i >= STEP_NIGHT else RELEASES[0]
        base, var = (
            [round(float(m * np.exp(rng.normal(0.0, 0.01))), 2) for _ in range(5)]
            for m in (stock[i], patched[i])
        )
        run = make_throughput_night(
            root / "runs",
            run_id,
            f"2026-03-{day:02d}T03:00:00Z",
            base,
            var,
            name=CONFIG,
            sglang=release,
        )
        with History(path) as h:  # before the job, whose story compares the builds
            record_night_builds(
                h,
                run_id,
                [
                    {"variant": "baseline", "sglang_release": release, "patch": "", "state": ""},
                    {
                        "variant": "patched",
                        "sglang_release": release,
                        "patch": "mrope-sync-free",
                        "state": "applies",
                        "detail": "verified",
                    },
                ],
            )
        with contextlib.redirect_stdout(io.StringIO()):
            nightly_on_run(run, SETTINGS, history=path)
    return path


__all__ = ["CONFIG", "SCENARIOS", "SETTINGS", "build_scenario", "levels"]
