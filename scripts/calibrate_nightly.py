#!/usr/bin/env python3
"""Calibrate the nightly gates and the sequential repeats by simulation (seeded; about 3 min CPU).

Part 1, nightly (drives patchbench.gates.evaluate on synthetic nights): the gate set of
configs/nightly-h200.yaml (or --config), at run CV 1.5 / 3 / 6 %, and some alternatives.
Model: per night, variant, metric and run, ``log value = log 100 + drift_night + e``, e ~ N(0, CV),
drift_night ~ N(0, --drift) shared by every variant of the night (machine, driver). Every gated
metric gets independent noise (the worst case for Holm). Reported: false red nights per 30
nights and the share of underpowered nights with no regression; the chance that a 5 % throughput
regression of the patched variant turns a night red within 3 nights, and the mean nights to the
first red night.

Part 2, sequential repeats (drives patchbench.sequential.replay): the PR config's shape (stock
baseline, upstream, ours, one A/A copy of stock), the four serving primaries per variant
(independent run noise), ``{min: 4, max: 12, step: 2}``, Pocock, alpha 0.05 per variant, +-5 %
margin. Reported per report: any false improved/regressed primary with no effect; power for
ours' throughput at +5 % and +10 %; primaries decided; repeats used (mean, p90); H200 minutes
from the PR's phase times (76 s MMMU + 79 s serving per cell) plus --startup-s per cell, against a
fixed 5 repeats judged by the same rule at one look.

    .venv/bin/python scripts/calibrate_nightly.py [--trials 400] [--startup-s 60]
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

from patchbench.gates import Gate, NightlySettings, evaluate, night_outcome  # noqa: E402
from patchbench.history import Night  # noqa: E402
from patchbench.sequential import Design, replay  # noqa: E402

BETTER = {"output_throughput_tok_s": "higher", "mmmu_overall_acc": "higher"}
TPUT = ("serving", "output_throughput_tok_s")
VARIANT = "patched"


# ---------------------------------------------------------------------------------------------
# part 1: nightly


def _gate_metrics(settings: NightlySettings) -> list[tuple[str, str]]:
    return [(g.suite or "serving", g.metric_name) for g in settings.gates]


def _night(
    i: int, rng: np.random.Generator, metrics, repeats: int, cv: float, drift: float, slow: float
) -> Night:
    d = rng.normal(0.0, drift, len(metrics)) if drift > 0 else np.zeros(len(metrics))
    vals, better = {}, {}
    for v in ("baseline", VARIANT):
        for j, (s, m) in enumerate(metrics):
            e = rng.normal(0.0, cv, repeats) + d[j]
            if v == VARIANT and (s, m) == TPUT:
                e = e + math.log1p(-slow)
            vals[(v, s, m)] = [float(x) for x in 100.0 * np.exp(e)]
            better[(s, m)] = BETTER.get(m, "lower")
    day = f"2026-{1 + i // 28:02d}-{1 + i % 28:02d}T03:00:00Z"
    return Night(
        run_id=f"n{i:03d}",
        night_utc=day,
        config_name="sim",
        baseline="baseline",
        values=vals,
        better=better,
    )


def nightly_rates(
    settings: NightlySettings,
    repeats: int,
    cv: float,
    trials: int,
    seed: int,
    drift: float = 0.0,
    null_nights: int = 3,
    horizon: int = 3,
) -> dict:
    """False red nights per 30, underpowered share (null), P(red within ``horizon`` nights of a
    5 % throughput regression of the patched variant), mean nights to red (capped at horizon+1)."""
    rng = np.random.default_rng(seed)
    metrics = _gate_metrics(settings)
    warm = settings.window_nights + max(g.consecutive_nights for g in settings.gates)
    red = under = nights = 0
    detected, to_red = 0, []
    for _ in range(trials):
        hist = [_night(i, rng, metrics, repeats, cv, drift, 0.0) for i in range(warm)]
        for i in range(warm, warm + null_nights):
            t = _night(i, rng, metrics, repeats, cv, drift, 0.0)
            out = night_outcome(evaluate(hist, t, settings))
            red += out == "red"
            under += out == "underpowered"
            nights += 1
            hist.append(t)
        # a 5 % regression of the patched variant's throughput from the next night on
        hist = hist[-warm:]
        first = None
        for k in range(horizon):
            t = _night(warm + null_nights + k, rng, metrics, repeats, cv, drift, 0.05)
            if night_outcome(evaluate(hist, t, settings)) == "red":
                first = k + 1
                break
            hist.append(t)
        detected += first is not None
        to_red.append(first or horizon + 1)
    return {
        "false_red_per_30": 30.0 * red / nights,
        "underpowered_null": under / nights,
        "detect_within": detected / trials,
        "mean_nights": float(np.mean(to_red)),
    }


def part1(config: Path, trials: int, seed: int) -> None:
    raw = yaml.safe_load(config.read_text())
    shipped = NightlySettings.model_validate(raw["nightly"])
    reps = raw["schedule"]["repeats"]
    reps = reps if isinstance(reps, int) else reps.get("max", 3)

    c2 = [Gate(**(g.model_dump() | {"consecutive_nights": 2})) for g in shipped.gates]
    rows = [
        (f"shipped ({config.name})", shipped, r, cv, 0.0)
        for cv in (0.015, 0.03, 0.06)
        for r in sorted({3, reps, 8})
    ]
    rows.append((f"shipped ({config.name})", shipped, reps, 0.03, 0.02))
    rows.append(("consecutive_nights 2", shipped.model_copy(update={"gates": c2}), reps, 0.03, 0.0))
    rows.append(
        (
            "history_test welch",
            shipped.model_copy(update={"history_test": "welch"}),
            reps,
            0.03,
            0.0,
        )
    )
    print(
        f"## Nightly gates: {len(shipped.gates)} gates, family alpha {shipped.family_alpha:.3g} "
        f"(budget {shipped.false_red_nights_per_month:g}/30 nights), K = "
        f"{shipped.window_nights}, {trials} trials x 3 null nights; detection: 5 % throughput "
        f"regression of the patched variant\n"
    )
    print(
        "| setting | repeats | run CV | drift | false red / 30 nights | underpowered share "
        "(null) | red within 3 nights | mean nights to red (4 = not in 3) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, s, r, cv, drift in rows:
        t0 = time.time()
        x = nightly_rates(s, r, cv, trials, seed, drift)
        print(
            f"| {name} | {r} | {100 * cv:g} % | {100 * drift:g} % | "
            f"{x['false_red_per_30']:.2f} | {x['underpowered_null']:.0%} | "
            f"{x['detect_within']:.0%} | {x['mean_nights']:.2f} |",
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
    p.add_argument("--part", choices=("1", "2", "both"), default="both")
    a = p.parse_args(argv)
    if a.part in ("1", "both"):
        part1(a.config, a.trials, a.seed)
    if a.part in ("2", "both"):
        part2(a.trials, a.seed, a.startup_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
