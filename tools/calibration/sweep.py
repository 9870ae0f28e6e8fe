"""The calibration's load-sweep model: false calls and power of a sweep's curve family.

A trial is one baseline and one variant over ``repeats`` interleaved rounds of a serving sweep
(``points`` concurrencies): every primary of the sweep (:func:`patchbench.suites.serving.points.
curve_primaries`: goodput at the SLO, the highest load meeting it, output throughput and median
ITL at each point) drawn per cell as ``value x exp(N(0, cv))``, independently across metrics,
points and cells (an assumption: in a real sweep the points of one cell share a server and may
move together, which helps the paired test). The effect scenario multiplies the output
throughput at ONE point (the lowest load) by ``1 + effect`` and changes nothing else. The run is
judged by the comparison code itself (:func:`patchbench.analysis.build.build_comparison` on in-memory
run data, the serving suite's real declarations: one Holm family over the variant's primaries).

:func:`sweep_row` counts, per scenario: false calls (any primary improved or regressed with no
effect), and the power (the changed point's throughput called improved); ``points=1`` is the
single-point reference with the suite's four single-point primaries. With a sequential
``schedule`` (a config's ``schedule.repeats`` mapping, :func:`config_schedule`) each trial is
drawn with ``max`` repeats and the comparison replays the runner's stopping rule on it
(``patchbench.analysis.family.sequential_decision``, as the report of such a run does): the verdicts are
the rule's at the look where it stops, and the row counts the rounds it ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from patchbench.analysis import build as analysis
from patchbench.analysis.comparison import CompareSettings
from patchbench.analysis.rundata import RunData
from patchbench.runfolder import CellRecord, RunManifest, SuiteSummary

BASE, VAR = "baseline", "patched"
#: a typical value per primary (the ratio test is scale-free; these only keep values positive)
_TYPICAL = {"tok_s": 1000.0, "ms": 10.0, "req_s": 2.0, "count": 20.0}


def _typical(metric: str) -> float:
    name = metric.split("@", 1)[0]
    return next(v for suf, v in _TYPICAL.items() if name.endswith(suf))


class _Serving:
    """The serving suite's declarations (with ``Params``, so a sweep's declarations are used)
    and no pair hook (no per-request files in memory)."""

    def __init__(self):
        from patchbench.suite import get_suite

        real = get_suite("serving")
        self.name, self.Params, self.metrics = "serving", real.Params, dict(real.metrics)
        self.declarations = real.declarations

    def pair(self, baseline_dirs, variant_dirs, params):
        return None


def _params(points: int) -> dict:
    if points <= 1:
        return {}
    return {"sweep": {"points": [4**i for i in range(points)]}}


def primaries(points: int) -> list[str]:
    """The primaries of a ``points``-point sweep (1: the single-point suite's)."""
    s = _Serving()
    params = s.Params.model_validate(_params(points))
    return [m for m, i in s.declarations(params).items() if i.primary]


def serving_run_data(name: str, serving: dict, repeats: int, schedule, cell) -> RunData:
    """In-memory run data of a two-arm serving run: config ``calibration-<name>`` with
    ``suites.serving`` = ``serving`` and ``schedule.repeats`` = ``schedule``; ``repeats``
    interleaved rounds (baseline first in even rounds), each cell's serving summary from
    ``cell(variant, round)`` -> (metrics, meta), called in that order."""
    cfg = {
        "name": f"calibration-{name}",
        "sglang": "0.5.1.post3",
        "model": {"path": "calibration", "tiny": True},
        "variants": {BASE: [], VAR: ["p"]},
        "baseline": BASE,
        "schedule": {"repeats": schedule, "order": "interleaved"},
        "suites": {"serving": serving},
        "compare": {},
    }
    cells_meta, cells, sums = [], {}, {}
    for k in range(repeats):
        for v in (BASE, VAR) if k % 2 == 0 else (VAR, BASE):
            cells_meta.append({"variant": v, "repeat": k, "status": "ok"})
            cells[(v, k)] = CellRecord(variant=v, repeat=k, status="ok", suites={"serving": "ok"})
            metrics, meta = cell(v, k)
            sums[(v, k, "serving")] = SuiteSummary(
                suite="serving", status="ok", metrics=metrics, meta=meta
            )
    man = RunManifest(run_id=f"{name}-trial", config=cfg, cells=cells_meta)
    return RunData(
        Path(f"/nonexistent-calibration/{name}-trial"),
        man,
        BASE,
        [BASE, VAR],
        [],
        repeats,
        ["serving"],
        cells,
        sums,
    )


def run_data(
    points: int, repeats: int, cv: float, effect: float, rng, schedule: dict | None = None
) -> RunData:
    """One trial as in-memory run data (see the module docstring): ``repeats`` interleaved
    rounds; the config's ``schedule.repeats`` is ``schedule`` (a sequential mapping, whose
    ``max`` should be ``repeats``) or ``repeats`` (None)."""
    prim = primaries(points)
    changed = prim[2] if points > 1 else "output_throughput_tok_s"

    def cell(v: str, _k: int) -> tuple[dict, dict]:
        vals = {}
        for m in prim:
            x = _typical(m) * float(np.exp(rng.normal(0.0, cv)))
            if v == VAR and m == changed:
                x *= 1 + effect
            vals[m] = x
        return vals, {}

    return serving_run_data("sweep", _params(points), repeats, schedule or repeats, cell)


def config_schedule(path: Path) -> tuple[int, dict | int]:
    """(points of the config's serving sweep, its ``schedule.repeats``: a fixed count, or the
    sequential mapping ``{min, max, step, boundary, futility}`` with the runner's defaults
    filled in) of a config, read as the runner reads it (patchbench.config.load_config).
    Raises ConfigError (patchbench.errors) when the config does not load, ValueError when it
    has no serving sweep."""
    from patchbench.config import load_config

    cfg = load_config(path)
    params = cfg.suite_params.get("serving")
    if params is None or params.sweep is None:
        raise ValueError(f"{path}: no serving.sweep")
    seq = cfg.schedule.sequential
    if seq is None:
        return len(params.sweep.points), cfg.schedule.max_repeats
    return len(params.sweep.points), seq.model_dump()


@dataclass
class SweepRow:
    """One row: the design (``schedule``: fixed repeats, or a sequential ``schedule.repeats``
    mapping), the trials, false calls (no effect) and the changed point's throughput called
    improved (effect), as counts, and the rounds each scenario's reports ran (summed over
    the trials)."""

    points: int
    repeats: int
    cv: float
    trials: int
    false_calls: int
    improved: int
    schedule: dict | None = None
    rounds_null: int = 0
    rounds_effect: int = 0

    @property
    def design(self) -> str:
        """``fixed 8`` / ``sequential 4..8 step 2 (pocock)``."""
        s = self.schedule
        if s is None:
            return f"fixed {self.repeats}"
        return f"sequential {s['min']}..{s['max']} step {s['step']} ({s['boundary']})"


def sweep_row(
    points: int,
    repeats: int,
    cv: float,
    effect: float,
    trials: int,
    seed: int,
    schedule: dict | None = None,
) -> SweepRow:
    """Run ``trials`` seeded trials of each scenario (no effect, ``effect`` at one point) with
    ``repeats`` fixed rounds, or under the sequential ``schedule`` (its ``max`` rounds drawn,
    the rule replayed; ``repeats`` is ignored). Raises ValueError for a schedule whose looks
    are invalid (patchbench.analysis.sequential.looks_from_schedule)."""
    from patchbench.analysis import sequential

    if schedule is not None:
        repeats = int(schedule["max"])
        sequential.looks_from_schedule(schedule["min"], schedule["max"], schedule["step"])
    rng = np.random.default_rng(seed)
    settings = CompareSettings()
    suites = {"serving": _Serving()}
    changed = primaries(points)[2] if points > 1 else "output_throughput_tok_s"
    out = SweepRow(points, repeats, cv, trials, 0, 0, schedule)
    for _ in range(trials):
        cmp = analysis.build_comparison(
            run_data(points, repeats, cv, 0.0, rng, schedule), settings, suites=suites
        )
        out.false_calls += any(
            r.primary and r.verdict in ("improved", "regressed") for r in cmp.rows
        )
        out.rounds_null += cmp.design.stopped_after or repeats
        cmp = analysis.build_comparison(
            run_data(points, repeats, cv, effect, rng, schedule), settings, suites=suites
        )
        row = cmp.row("serving", changed, VAR)
        out.improved += row is not None and row.verdict == "improved"
        out.rounds_effect += cmp.design.stopped_after or repeats
    return out


def sweep_table(rows: list[SweepRow], effect: float) -> list[str]:
    """Markdown rows of :func:`sweep_row` results (rounds: the mean rounds a report ran, no
    effect / effect)."""
    out = [
        f"| points | primaries | design | run CV | trials | false calls (no effect) | "
        f"+{effect * 100:g}% throughput at one point called improved | rounds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r.points} | {len(primaries(r.points))} | {r.design} | {r.cv * 100:g}% | "
            f"{r.trials} | {r.false_calls / r.trials * 100:.1f}% ({r.false_calls}) | "
            f"{r.improved / r.trials * 100:.1f}% ({r.improved}) | "
            f"{r.rounds_null / r.trials:.1f} / {r.rounds_effect / r.trials:.1f} |"
        )
    return out
