#!/usr/bin/env python3
"""Calibrate the nightly gates and the sequential repeats by simulation (seeded; about 3 min CPU).

Part 1, nightly gates (tools/calibration/nightly.py drives patchbench.nightly.gates.evaluate on
simulated histories): the gate set of configs/nightly-h200.yaml (or --config) at run CV 1.5 / 3 /
6 %, with the repeats the gates compute for themselves and fixed 5 / 8, with and without one
abnormal run (15 % slow) on a fifth of the nights, and with 2 % night-to-night drift. Reported:
the share of quiet nights green and underpowered, false red nights per 30, and how often a 5 %
step of the patch (same-run gate) or of stock (history gate) turns a night red within 3 nights.

Part 3, change points (patchbench/nightly/changepoints.py): false flags per quiet quarter and the delay
until a decline of 0.3 % a night is flagged, the detector run every night.

Part 2, sequential repeats (drives patchbench.analysis.sequential.replay): the PR config's shape (stock
baseline, upstream, ours, one A/A copy of stock), the four serving primaries per variant
(independent run noise), ``{min: 4, max: 12, step: 2}``, Pocock, alpha 0.05 per variant, +-5 %
margin. Reported per report: any false improved/regressed primary with no effect; power for
ours' throughput at +5 % and +10 %; primaries decided; repeats used (mean, p90); H200 minutes
from the PR's phase times (76 s MMMU + 79 s serving per cell) plus --startup-s per cell, against a
fixed 5 repeats judged by the same rule at one look.

    .venv/bin/python tools/calibrate_nightly.py [--part 1|2|3|all] [--trials 400] [--startup-s 60]
    .venv/bin/python tools/calibrate_nightly.py --quiet-only [--histories 250]
    .venv/bin/python tools/calibrate_nightly.py --confirm-table [--changes 5 10] [--noise 2 4]
    .venv/bin/python tools/calibrate_nightly.py --noise-models [--trials 50] [--seed 7]
    .venv/bin/python tools/calibrate_nightly.py --pool [--trials 50] [--seed 7]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchbench.analysis.sequential import Design, replay  # noqa: E402
from patchbench.config.nightly import NightlySettings  # noqa: E402
from patchbench.nightly import changepoints as cp  # noqa: E402
from patchbench.nightly.noise import noise_bound  # noqa: E402
from tools.calibration.nightly import (  # noqa: E402
    auto_repeats,
    change_rates,
    computed_repeats,
    gate_rates,
    pool_rates,
)

# ---------------------------------------------------------------------------------------------
# part 1: nightly gates on simulated histories (tools/calibration/nightly.py)


def part1(config: Path, trials: int, seed: int, only_drift: bool = False) -> None:
    raw = yaml.safe_load(config.read_text())
    s = NightlySettings.model_validate(raw["nightly"])
    margin = noise_bound(40.0, 0.9)  # the learned noise's upper 90 % bound, ~14 nights of history
    rows = []
    for cv in (0.015, 0.03, 0.06):
        fixed = {0.015: 5, 0.03: 8, 0.06: 8}[cv]
        for ab in (0.0, 0.2) if cv < 0.06 else (0.0,):
            own = computed_repeats(s, cv, seed, fixed, abnormal=ab, margin=margin)
            rows.append((cv, own, "computed", ab, 0.0))
            if own != fixed:
                rows.append((cv, fixed, "fixed", ab, 0.0))
    for drift in (0.01, 0.02):
        plan = auto_repeats(s, 0.03, seed, 8, drift=drift)
        if plan.capped:
            need = "more than 64" if plan.needed is None else str(plan.needed)
            label = f"auto: needs {need}, capped at {plan.repeats}"
        else:
            blind = any(m["night_limited"] for m in plan.metrics)
            label = "auto" + (": history gates blind to the step at this drift" if blind else "")
        rows.append((0.03, plan.repeats, label, 0.0, drift))
        rows.append((0.03, 8, "fixed", 0.0, drift))
    print(
        f"## Nightly gates: {len(s.gates)} gates, family alpha {s.family_alpha:.3g} (budget "
        f"{s.false_red_nights_per_month:g}/30 nights), K = {s.window_nights}; {trials} histories "
        f"per row, each 10 quiet nights of warm-up, then 4 quiet nights gated, then a 5 % step "
        f"of the patch (same-run gate) and of stock (history gate) from the same history; "
        f"repeats 'computed': what the gates' targets need at the noise learned from 30 "
        f"simulated nights of the row's scenario at the 'fixed' repeats, times x{margin:.2f} "
        f"(its upper 90 % bound)\n"
    )
    print(
        "| run CV | repeats | abnormal runs | drift | green (quiet) | underpowered (quiet) | "
        "false red / 30 nights | patch step red within 3 nights | stock step red within 3 "
        "nights |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for cv, reps, label, ab, drift in rows:
        if only_drift and not drift:
            continue
        t0 = time.time()
        if reps is None:
            print(f"| {100 * cv:g} % | more than 64 (computed) | | | | | | | |", flush=True)
            continue
        x = gate_rates(s, reps, cv, trials, seed, abnormal=ab, drift=drift, warm=10, quiet=4)
        print(
            f"| {100 * cv:g} % | {reps} ({label}) | {'1 on 1/5 of nights' if ab else 'none'} | "
            f"{100 * drift:g} % | {x.green:.0%} | {x.underpowered:.0%} | "
            f"{x.false_red_per_30:.2f} | {x.patch_within:.0%} | {x.stock_within:.0%} |",
            flush=True,
        )
        print(f"<!-- {time.time() - t0:.1f} s -->", file=sys.stderr)


def noise_models(config: Path, trials: int, seed: int) -> None:
    """Part 1's gates at 3 % run noise under other noise models: Gaussian or Student's t (3
    degrees of freedom, the same SD), with and without 1 % night-to-night drift."""
    s = NightlySettings.model_validate(yaml.safe_load(config.read_text())["nightly"])
    print(
        f"## Nightly gates under other noise models: 3 % run noise (SD), {trials} histories "
        f"per row, seed {seed}; each 10 quiet nights of warm-up, 4 gated, then the 5 % steps\n"
    )
    print(
        "| run noise | repeats | drift | green (quiet) | underpowered (quiet) | false red / 30 "
        "nights | patch step red within 3 nights | stock step red within 3 nights |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for dist, drift in (("normal", 0.0), ("t3", 0.0), ("normal", 0.01), ("t3", 0.01)):
        for reps in (8, 11):
            t0 = time.time()
            x = gate_rates(s, reps, 0.03, trials, seed, drift=drift, warm=10, quiet=4, dist=dist)
            name = "Gaussian" if dist == "normal" else "Student t, 3 df"
            print(
                f"| {name} | {reps} | {100 * drift:g} % | {x.green:.0%} | {x.underpowered:.0%} | "
                f"{x.false_red_per_30:.2f} | {x.patch_within:.0%} | {x.stock_within:.0%} |",
                flush=True,
            )
            print(f"<!-- {time.time() - t0:.1f} s -->", file=sys.stderr)


def pool(config: Path, trials: int, seed: int) -> None:
    """Two machines, B 8 % slower, at 3 % run noise: nights told apart by machine or not."""
    s = NightlySettings.model_validate(yaml.safe_load(config.read_text())["nightly"])
    print(
        f"## A pool of two machines (B 8 % slower) at 3 % run noise: {trials} histories per "
        f"row, seed {seed}; each warmed up until each machine has {s.learn_min_nights + 1} "
        f"nights, then 10 quiet nights gated, then a 5 % stock step on every machine\n"
    )
    print(
        "| machines | nights compared | repeats | green (quiet) | underpowered (quiet) | false "
        "red / 30 nights | stock step red within 3 nights of its machine |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for reps in (8, 11):
        for pick in ("alternate", "random"):
            for identity in (False, True):
                t0 = time.time()
                x = pool_rates(s, reps, 0.03, trials, seed, pick=pick, identity=identity)
                how = "per machine" if identity else "all together (no identity)"
                print(
                    f"| {pick} | {how} | {reps} | {x.green:.0%} | {x.underpowered:.0%} | "
                    f"{x.false_red_per_30:.2f} | {x.stock_within:.0%} |",
                    flush=True,
                )
                print(f"<!-- {time.time() - t0:.1f} s -->", file=sys.stderr)


QUIET_ROWS = ((0.03, 8, 0.01), (0.03, 8, 0.02), (0.03, 12, 0.01), (0.03, 12, 0.02))


def part1_quiet(config: Path, histories: int, seed: int) -> None:
    """Part 1, quiet nights only, for the drift rows: ``histories`` histories of 10 warm-up
    and 4 gated quiet nights each (4 x histories quiet nights a row; no steps)."""
    raw = yaml.safe_load(config.read_text())
    s = NightlySettings.model_validate(raw["nightly"])
    print(
        f"## Nightly gates, quiet nights only: {histories} histories per row, each 10 quiet "
        f"nights of warm-up, then 4 quiet nights gated ({4 * histories} quiet nights a row)\n"
    )
    print(
        "| run CV | repeats | drift | quiet nights | green | underpowered | false red / 30 nights |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for cv, reps, drift in QUIET_ROWS:
        t0 = time.time()
        x = gate_rates(s, reps, cv, histories, seed, drift=drift, warm=10, quiet=4, steps=False)
        print(
            f"| {100 * cv:g} % | {reps} | {100 * drift:g} % | {x.nights} | {x.green:.0%} | "
            f"{x.underpowered:.0%} | {x.false_red_per_30:.2f} |",
            flush=True,
        )
        print(f"<!-- {time.time() - t0:.1f} s -->", file=sys.stderr)


def part3(trials: int, seed: int) -> None:
    """Change points: false flags on quiet quarters, delay on a 0.3 %-a-night decline."""
    print(
        f"\n## Change points: ruptures KernelCPD (linear kernel = PELT, l2), penalty "
        f"{cp.BETA:g} log(nights), run every night over the whole history; {trials} quiet "
        f"quarters (90 nights) and {trials} declines (-0.3 % a night from night 30) per row\n"
    )
    print(
        "| run CV | repeats | drift | flags per quiet quarter | quarters with a flag | "
        "decline flagged within 45 nights | delay median / p90 (nights) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for cv, reps, drift in ((0.015, 5, 0.0), (0.03, 8, 0.0), (0.06, 8, 0.0), (0.03, 8, 0.01)):
        t0 = time.time()
        x = change_rates(cv, reps, trials, seed, drift=drift)
        print(
            f"| {100 * cv:g} % | {reps} | {100 * drift:g} % | {x.flags_per_quarter:.2f} | "
            f"{x.any_flag:.0%} | {x.detected:.0%} | {x.delay_median:.0f} / "
            f"{x.delay_p90:.0f} |",
            flush=True,
        )
        print(f"<!-- {time.time() - t0:.1f} s -->", file=sys.stderr)


def part3_penalties(trials: int, seed: int, betas: list[float]) -> None:
    """The penalty factor's trade-off: false flags on quiet quarters against the decline's delay,
    for each factor in ``betas`` (the detector as the nightly runs it)."""
    print(
        f"\n## Change-point penalty factor: pen = factor x log(nights); {trials} quiet quarters "
        f"and {trials} declines (-0.3 % a night) per row, no drift\n"
    )
    print(
        "| factor | run CV | repeats | flags per quiet quarter | decline flagged within 45 "
        "nights | delay median / p90 (nights) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for b in betas:
        for cv, reps in ((0.015, 5), (0.03, 8)):
            t0 = time.time()
            x = change_rates(cv, reps, trials, seed, beta=b)
            print(
                f"| {b:g} | {100 * cv:g} % | {reps} | {x.flags_per_quarter:.2f} | "
                f"{x.detected:.0%} | {x.delay_median:.0f} / {x.delay_p90:.0f} |",
                flush=True,
            )
            print(f"<!-- {time.time() - t0:.1f} s -->", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# part 2: sequential repeats


SERVING = ("output_throughput_tok_s", "itl_median_ms", "ttft_median_ms", "e2e_latency_median_ms")
PR_VARIANTS = ("pr9460-upstream", "mrope-sync-free", "aa-stock")


def _sequence(rng, n: int, cv: float, effect: float) -> dict:
    """Paired log ratios per variant and primary for n interleaved rounds (shared baseline)."""
    base = rng.normal(0.0, cv, (n, len(SERVING)))
    out = {}
    for v in PR_VARIANTS:
        e = rng.normal(0.0, cv, (n, len(SERVING))) - base
        if v == "mrope-sync-free" and effect:
            e[:, 0] += math.log1p(effect)  # throughput up
            e[:, 1:] += math.log1p(-effect / (1 + effect))  # latencies down alike
        out[v] = {m: e[:, j] for j, m in enumerate(SERVING)}
    return out


def seq_rates(design: Design, cv: float, effect: float, trials: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    better = {m: ("higher" if m.endswith("_tok_s") else "lower") for m in SERVING}
    margins = {m: math.log1p(0.05) for m in SERVING}
    false_any = power = decided = 0
    used = []
    for _ in range(trials):
        seq = _sequence(rng, design.looks[-1], cv, effect)
        out = replay(seq, margins, design=design, better=better)
        used.append(out.n_repeats)
        for d in out.metrics.values():
            decided += d.decision in ("improved", "regressed", "equivalent")
        null_vs = [v for v in PR_VARIANTS if not (effect and v == "mrope-sync-free")]
        false_any += any(
            out.metrics[(v, m)].decision in ("improved", "regressed")
            for v in null_vs
            for m in SERVING
        )
        power += out.metrics[("mrope-sync-free", SERVING[0])].decision == "improved"
    u = np.asarray(used)
    return {
        "false": false_any / trials,
        "power": power / trials,
        "decided": decided / trials,
        "mean": float(u.mean()),
        "p90": float(np.percentile(u, 90)),
    }


def part2(trials: int, seed: int, startup_s: float) -> None:
    seq = Design.from_schedule(4, 12, 2, alpha=0.05, kind="pocock")
    obf = Design.from_schedule(4, 12, 2, alpha=0.05, kind="obrien-fleming")
    fixed = Design((5,), alpha=0.05)
    cell_s = startup_s + 76.0 + 79.0
    cell_no_mmmu_s = startup_s + 79.0
    cells_per_round = 1 + len(PR_VARIANTS)
    print(
        f"\n## Sequential repeats: PR shape (stock + upstream + ours + A/A), 4 serving primaries "
        f"per variant, looks {list(seq.looks)}, alpha 0.05 per report (0.05/3 per variant, Holm "
        f"across its primaries), margin "
        f"+-5 %, {trials} trials; one cell = {startup_s:g} s start-up (assumed) + 76 s MMMU + "
        f"79 s serving = {cell_s:g} s, {cells_per_round} cells per round\n"
    )
    print(
        "| design | run CV | false improved/regressed per report (no effect) | power +5 % | "
        "power +10 % | repeats mean / p90 (no effect) | primaries decided of 12 (no effect) | "
        "H200 min (MMMU every round) | decided / H200 h | H200 min (MMMU first round only) | "
        "decided / H200 h |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cv in (0.015, 0.03, 0.06):
        for name, d in (
            ("sequential Pocock 4..12 by 2", seq),
            ("sequential O'Brien-Fleming 4..12 by 2", obf),
            ("fixed 5", fixed),
        ):
            t0 = time.time()
            null = seq_rates(d, cv, 0.0, trials, seed)
            p5 = seq_rates(d, cv, 0.05, trials, seed + 1)
            p10 = seq_rates(d, cv, 0.10, trials, seed + 2)
            every = null["mean"] * cells_per_round * cell_s / 60.0
            first = cells_per_round * (cell_s + (null["mean"] - 1) * cell_no_mmmu_s) / 60.0
            dec = null["decided"]
            print(
                f"| {name} | {100 * cv:g} % | {null['false']:.1%} | {p5['power']:.0%} | "
                f"{p10['power']:.0%} | {null['mean']:.1f} / {null['p90']:.0f} | {dec:.1f} | "
                f"{every:.0f} | {dec / (every / 60.0):.1f} | {first:.0f} | "
                f"{dec / (first / 60.0):.1f} |",
                flush=True,
            )
            print(f"<!-- {time.time() - t0:.1f} s -->", file=sys.stderr)


def confirm_table(
    changes: list[float], noise: list[float], alpha: float = 0.001, power: float = 0.9
) -> str:
    """The rounds a confirmation run needs (patchbench.nightly.confirm.plan_rounds, uncapped):
    one row per paired noise (CV, %), one column per change (%), at ``alpha`` and ``power``."""
    from patchbench.analysis.power import n_needed
    from patchbench.nightly.confirm import MAX_SEARCH

    out = ["| pair noise | " + " | ".join(f"{c:g} % change" for c in changes) + " |"]
    out.append("|---" * (len(changes) + 1) + "|")
    for cv in noise:
        sigma = math.log1p(cv / 100.0)
        cells = []
        for c in changes:
            n = n_needed(abs(math.log1p(c / 100.0)), sigma, alpha, power, alternative="larger",
                         cap=MAX_SEARCH)  # fmt: skip
            cells.append(f"> {MAX_SEARCH}" if n is None else str(n))
        out.append(f"| {cv:g} % | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=REPO / "configs" / "nightly-h200.yaml")
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--seed", type=int, default=20260101)
    p.add_argument(
        "--startup-s",
        type=float,
        default=60.0,
        help="assumed sglang server start-up per cell on the H200 (s); not measured "
        "in this repository",
    )
    p.add_argument("--part", choices=("1", "2", "3", "both", "all"), default="all")
    p.add_argument("--drift-only", action="store_true", help="part 1: only the drift rows")
    p.add_argument(
        "--quiet-only",
        action="store_true",
        help="part 1: only quiet nights of the drift scenarios (3 %% run noise; 8 and 12 "
        "repeats; 1 and 2 %% drift), --histories of them a row",
    )
    p.add_argument("--histories", type=int, default=250, help="--quiet-only: histories a row")
    p.add_argument(
        "--penalties",
        type=float,
        nargs="+",
        metavar="FACTOR",
        help="part 3: the change-point penalty factors to compare (e.g. 3 4 5 6 8) instead of "
        "the shipped factor's table",
    )
    p.add_argument(
        "--confirm-table",
        action="store_true",
        help="the rounds a confirmation run needs: --changes x --noise at --alpha, --power",
    )
    p.add_argument("--changes", type=float, nargs="+", default=[5.0, 10.0], help="%% (- a drop)")
    p.add_argument("--noise", type=float, nargs="+", default=[2.0, 4.0], help="pair CV, %%")
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--power", type=float, default=0.9)
    p.add_argument("--noise-models", action="store_true", help="part 1 under t noise and drift")
    p.add_argument("--pool", action="store_true", help="part 1 on a pool of two machines")
    a = p.parse_args(argv)
    if a.noise_models or a.pool:
        (noise_models if a.noise_models else pool)(a.config, a.trials, a.seed)
        return 0
    if a.confirm_table:
        print(confirm_table(a.changes, a.noise, a.alpha, a.power))
        return 0
    if a.penalties:
        part3_penalties(a.trials, a.seed, a.penalties)
        return 0
    if a.quiet_only:
        part1_quiet(a.config, a.histories, a.seed)
        return 0
    if a.part in ("1", "both", "all"):
        part1(a.config, a.trials, a.seed, a.drift_only)
    if a.part in ("2", "both", "all"):
        part2(a.trials, a.seed, a.startup_s)
    if a.part in ("3", "all"):
        part3(a.trials, a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
