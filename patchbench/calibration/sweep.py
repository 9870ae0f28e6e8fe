"""The calibration's load-sweep model: false calls and power of a sweep's curve family.

A trial is one baseline and one variant over ``repeats`` interleaved rounds of a serving sweep
(``points`` concurrencies): every primary of the sweep (:func:`patchbench.suites.serving.points.
curve_primaries`: goodput at the SLO, the highest load meeting it, output throughput and median
ITL at each point) drawn per cell as ``value x exp(N(0, cv))``, independently across metrics,
points and cells (an assumption: in a real sweep the points of one cell share a server and may
move together, which helps the paired test). The effect scenario multiplies the output
throughput at ONE point (the lowest load) by ``1 + effect`` and changes nothing else. The run is
judged by the comparison code itself (:func:`patchbench.analysis.build_comparison` on in-memory
run data, the serving suite's real declarations: one Holm family over the variant's primaries).

:func:`sweep_rows` counts, per scenario: false calls (any primary improved or regressed with no
effect), and the power (the changed point's throughput called improved); ``points=1`` is the
single-point reference with the suite's four single-point primaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from patchbench import analysis
from patchbench.comparison import CompareSettings
from patchbench.rundata import RunData
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


def run_data(points: int, repeats: int, cv: float, effect: float, rng) -> RunData:
    """One trial as in-memory run data (see the module docstring)."""
    prim = primaries(points)
    changed = prim[2] if points > 1 else "output_throughput_tok_s"
    cfg = {
        "name": "calibration-sweep",
        "variants": {BASE: [], VAR: ["p"]},
        "baseline": BASE,
        "schedule": {"repeats": repeats, "order": "interleaved"},
        "suites": {"serving": _params(points)},
        "compare": {},
    }
    cells_meta, cells, sums = [], {}, {}
    for k in range(repeats):
        for v in (BASE, VAR) if k % 2 == 0 else (VAR, BASE):
            cells_meta.append({"variant": v, "repeat": k, "status": "ok"})
            cells[(v, k)] = CellRecord(variant=v, repeat=k, status="ok", suites={"serving": "ok"})
            vals = {}
            for m in prim:
                x = _typical(m) * float(np.exp(rng.normal(0.0, cv)))
                if v == VAR and m == changed:
                    x *= 1 + effect
                vals[m] = x
            sums[(v, k, "serving")] = SuiteSummary(suite="serving", status="ok", metrics=vals)
    man = RunManifest(run_id="sweep-trial", config=cfg, cells=cells_meta)
    return RunData(
        Path("/nonexistent-calibration/sweep-trial"),
        man,
        BASE,
        [BASE, VAR],
        [],
        repeats,
        ["serving"],
        cells,
        sums,
    )


@dataclass
class SweepRow:
    """One row: the design, the trials, false calls (no effect) and the changed point's
    throughput called improved (effect), as counts."""

    points: int
    repeats: int
    cv: float
    trials: int
    false_calls: int
    improved: int


def sweep_row(
    points: int, repeats: int, cv: float, effect: float, trials: int, seed: int
) -> SweepRow:
    """Run ``trials`` seeded trials of each scenario (no effect, ``effect`` at one point)."""
    rng = np.random.default_rng(seed)
    settings = CompareSettings()
    suites = {"serving": _Serving()}
    changed = primaries(points)[2] if points > 1 else "output_throughput_tok_s"
    fc = imp = 0
    for _ in range(trials):
        cmp = analysis.build_comparison(
            run_data(points, repeats, cv, 0.0, rng), settings, suites=suites
        )
        fc += any(r.primary and r.verdict in ("improved", "regressed") for r in cmp.rows)
        cmp = analysis.build_comparison(
            run_data(points, repeats, cv, effect, rng), settings, suites=suites
        )
        row = cmp.row("serving", changed, VAR)
        imp += row is not None and row.verdict == "improved"
    return SweepRow(points, repeats, cv, trials, fc, imp)


def sweep_table(rows: list[SweepRow], effect: float) -> list[str]:
    """Markdown rows of :func:`sweep_row` results."""
    out = [
        f"| points | primaries | repeats | run CV | trials | false calls (no effect) | "
        f"+{effect * 100:g}% throughput at one point called improved |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r.points} | {len(primaries(r.points))} | {r.repeats} | {r.cv * 100:g}% | {r.trials} | "
            f"{r.false_calls / r.trials * 100:.1f}% ({r.false_calls}) | "
            f"{r.improved / r.trials * 100:.1f}% ({r.improved}) |"
        )
    return out
