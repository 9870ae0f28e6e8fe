"""How many rounds a sequential config runs, with and without ``schedule.repeats.decide_on``
(issue 33 item 3): a seeded simulation of the config's run-level primaries, decided by the
shipped rule (``patchbench.analysis.sequential.replay``, the design the runner builds,
``Design.of``), printing mean rounds, false calls per report and power, and the H200 minutes
the deciding primaries save.

Noise model (an assumption, the calibration's of tools/calibration/model.py reduced to the run
level): each cell has a decode shock ``s ~ N(0, cv)`` and a prefill shock ``u ~ N(0, cv)``;
log output throughput ``-s``, log median ITL and E2E ``s``, log median TTFT
``0.5 s + sqrt(0.75) u``, each plus its own ``N(0, 0.01)`` measurement noise. "+10 %": every
non-A/A variant's decode is 10 % faster (throughput x 1.1, ITL and E2E / 1.1, TTFT unchanged).
An accuracy primary in the family (MMMU) is a one-look member with a uniform p-value (no
effect). H200 minutes of a round: one cell per variant, each 60 s server start-up + 79 s
serving (docs/calibration.md's cost model, the PR's own H200 phase times; not measured here).

    PYTHONPATH=. .venv/bin/python tools/stop_early.py [--trials 200] [--seed 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ("configs/presets/pr-h200.yaml", "configs/pr9460-h200.yaml")
#: H200 seconds of one timed cell (docs/calibration.md: 60 s start-up + 79 s serving)
CELL_S = 60.0 + 79.0
MEASURE_SD = 0.01


def setup(path: str):
    """(design with decide_on, design without, primaries [(key, better, log margin)],
    variants, A/A variants, accuracy members per variant) of a config."""
    from patchbench.analysis.sequential import Design
    from patchbench.config.load import load_config, sequential_primaries

    cfg = load_config(ROOT / path, check_files=False)
    d = Design.of(cfg.schedule.sequential, cfg.compare.confidence)
    prim = [
        (f"{s}.{m}", info.better, math.log1p(pct / 100.0))
        for s, m, info, pct in sequential_primaries(cfg)
    ]
    # the preset's "my-change: []" equals stock until a user fills it: A/A only by its name
    aa = [v for v in cfg.variants if cfg.is_aa(v) and "aa" in v.split("-")]
    variants = [v for v in cfg.variants if v != cfg.baseline]
    acc = [s for s in cfg.suites if s == "mmmu"]
    return d, dataclasses.replace(d, decide_on=()), prim, variants, aa, acc


def draw(rng, prim, variants, rounds: int, effect: float, aa, cv: float):
    """{variant: {key: log ratios}} of one simulated run."""

    def cell():
        s, u = rng.normal(0, cv, rounds), rng.normal(0, cv, rounds)
        return s, u

    sb, ub = cell()
    out = {}
    for v in variants:
        sv, uv = cell()
        ds, du = sv - sb, uv - ub
        eff = 0.0 if v in aa else effect
        per = {}
        for key, _, _ in prim:
            m = key.split(".", 1)[1]
            if m.startswith("output_throughput"):
                x = -ds + math.log1p(eff)
            elif m.startswith("ttft"):
                x = 0.5 * ds + math.sqrt(0.75) * du
            else:
                x = ds - math.log1p(eff)
            per[key] = x + rng.normal(0, MEASURE_SD * math.sqrt(2), rounds)
        out[v] = per
    return out


def simulate(path: str, trials: int, seed: int, cv: float) -> list[str]:
    """The printed lines of one config."""
    from patchbench.analysis.sequential import FixedTest, replay

    after, before, prim, variants, aa, acc = setup(path)
    margins = {k: lm for k, _, lm in prim}
    better = {k: b for k, b, _ in prim}
    most = after.looks[-1]
    minutes = len([*variants, "baseline"]) * CELL_S / 60.0
    lines = [
        f"{path}: looks {list(after.looks)} ({after.kind}), {len(variants)} compared variants "
        f"(A/A {aa}), primaries {[k for k, _, _ in prim]}, decide_on {list(after.decide_on)}; "
        f"run CV {100 * cv:g} %, {trials} trials; a round {minutes:.2f} H200 minutes"
    ]
    for effect in (0.10, 0.0):
        rows = {}
        for name, design in (("before", before), ("after", after)):
            rounds, false, power = [], 0, 0
            for t in range(trials):
                rng = np.random.default_rng([seed, t, int(effect * 100)])
                ratios = draw(rng, prim, variants, most, effect, aa, cv)
                fixed = {
                    v: {f"{s}.mmmu_overall_acc": FixedTest(float(rng.uniform()), 0.0, 900)}
                    for v in variants
                    if v not in aa
                    for s in acc
                }
                dec = replay(
                    ratios, margins, design=design, better=better, controls=aa, fixed=fixed
                )
                rounds.append(dec.n_repeats)
                calls = {
                    k: d.decision
                    for k, d in dec.metrics.items()
                    if k[0] not in aa and d.decision in ("improved", "regressed")
                }
                wrong = [
                    k for k, x in calls.items() if effect == 0 or "ttft" in k[1] or "acc" in k[1]
                ]
                wrong += [
                    k for k, x in calls.items() if effect and x == "regressed" and k not in wrong
                ]
                false += bool(wrong)
                thr = [
                    dec.metrics[(v, k)].decision == "improved"
                    for v in variants
                    if v not in aa
                    for k, _, _ in prim
                    if "throughput" in k
                ]
                power += all(thr)
            rows[name] = (float(np.mean(rounds)), false / trials, power / trials)
        b, a = rows["before"], rows["after"]
        saved = (b[0] - a[0]) * minutes
        label = "+10 %" if effect else "no effect"
        lines.append(
            f"  {label}: mean rounds {b[0]:.2f} -> {a[0]:.2f} of {most}; false calls per report "
            f"{100 * b[1]:.1f} % -> {100 * a[1]:.1f} %; throughput improved in every patch "
            f"{100 * b[2]:.1f} % -> {100 * a[2]:.1f} %; H200 minutes saved per run "
            f"{saved:.1f} ({b[0] * minutes:.0f} -> {a[0] * minutes:.0f})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--cv", type=float, default=0.03, help="run-to-run CV (0.03 = 3 %%)")
    ap.add_argument("configs", nargs="*", default=list(CONFIGS))
    a = ap.parse_args(argv)
    for path in a.configs:
        print("\n".join(simulate(path, a.trials, a.seed, a.cv)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
