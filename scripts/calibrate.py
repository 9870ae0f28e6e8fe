#!/usr/bin/env python
"""Calibrate the comparison (a benchmark, not a unit test; issue 6, "Tests" and "Measure").

Drives the very code that writes compare.json (``patchbench.compare.compare_run``) on synthetic run
folders (tests/helpers_runs.py) whose run-to-run noise is log-normal with a given coefficient of
variation (CV) per run, and counts verdicts over seeded trials:

- sensitivity: a true +10 % output-throughput change must be called "improved" in >= 95 % of the
  trials, and no change must be called significant (improved or regressed) in <= 5 %;
- at the measured A/A noise and, as a sensitivity table, 0.5x, 1x, 2x, 4x that noise;
- a power table: interleaved repeats needed to detect a 2 %, 3 %, 5 % change at 95 % confidence
  (two-sided paired t-test on log ratios, ``statsmodels.stats.power.TTestPower``) with the given
  power (80 % and 95 % by default), as markdown for the README. Cross-check: at CV 3 % and +10 %,
  TTestPower gives 55 % / 96 % power at 3 / 5 repeats; the simulated compare_run calls it improved
  in 53 % / 96.5 % of 200 trials.

Noise model: repeat k of arm a has value ``mu_a * exp(e_ak)``, ``e_ak ~ N(0, cv)`` independent
(log-normal, CV ~= cv for small cv). A drift shared by both arms of a round cancels in the paired
log ratio, which is what interleaving buys, so it is not simulated. The paired log ratio then has
standard deviation ``sqrt(2) * cv``.

The measured noise: the pooled A/A log ratios of ``output_throughput_tok_s`` in the newest
``results/*/compare.json`` with A/A variants (``CV = sd(ln(aa_k / base_k)) / sqrt(2)``); without
one, ``--cv`` or the stated default (3 %, an assumption, not a measurement).

Usage: ``.venv/bin/python scripts/calibrate.py [--cv 0.03] [--repeats 5] [--trials 200]``.
Exit status 0 when the rates meet the targets at 1x the noise, 1 otherwise.
"""
from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

import numpy as np  # noqa: E402

from helpers_runs import make_run  # noqa: E402
from patchbench import records  # noqa: E402
from patchbench.compare import CompareSettings, compare_run  # noqa: E402
from patchbench.stats import wilson_interval  # noqa: E402

DEFAULT_CV = 0.03
METRIC = "output_throughput_tok_s"


def measured_cv(results: Path = REPO / "results") -> tuple[float, str] | None:
    """(CV per run, source) from the newest compare.json with A/A variants, or None."""
    for cj in sorted(results.glob("*/compare.json"), reverse=True):
        try:
            cmp = records.read_json(cj)
        except (OSError, ValueError):
            continue
        d = []
        for r in cmp.get("metrics", []):
            if r.get("aa") and r.get("metric") == METRIC:
                for b, v in zip(r.get("baseline_repeats") or [], r.get("variant_repeats") or []):
                    if b and v and b > 0 and v > 0:
                        d.append(math.log(v / b))
        if len(d) >= 2:
            return statistics.stdev(d) / math.sqrt(2), f"{cj} ({len(d)} A/A pairs)"
    return None


def trial(root: Path, rng: np.random.Generator, cv: float, effect: float, repeats: int,
          settings: CompareSettings, i: int) -> str:
    """One synthetic run: verdict of ``output_throughput_tok_s`` for variant vs baseline."""
    b = 1000.0 * np.exp(rng.normal(0.0, cv, repeats))
    v = 1000.0 * (1.0 + effect) * np.exp(rng.normal(0.0, cv, repeats))
    run = make_run(root, run_id=f"t{i}", metrics={"serving": {METRIC: {
        "baseline": [float(x) for x in b], "patched": [float(x) for x in v]}}},
        compare=settings.model_dump())
    cmp = compare_run(run, settings)
    shutil.rmtree(run)
    row = next(r for r in cmp["metrics"] if r["metric"] == METRIC and r["variant"] == "patched")
    return row["verdict"]


def rates(root: Path, cv: float, repeats: int, trials: int, seed: int, effect: float,
          settings: CompareSettings) -> tuple[float, float]:
    """(share of +effect trials called improved, share of no-change trials called significant)."""
    hit = fp = 0
    for t in range(trials):
        rng = np.random.default_rng([seed, t, int(round(cv * 1e6)), repeats])
        hit += trial(root, rng, cv, effect, repeats, settings, 2 * t) == "improved"
        fp += trial(root, rng, cv, 0.0, repeats, settings, 2 * t + 1) in ("improved", "regressed")
    return hit / trials, fp / trials


def _rate(p: float, trials: int) -> str:
    """"96.5% [93.0, 98.3]": the rate and its 95 % Wilson interval over the trials."""
    lo, hi = wilson_interval(round(p * trials), trials)
    return f"{p * 100:.1f}% [{lo * 100:.1f}, {hi * 100:.1f}]"


def repeats_needed(cv: float, change: float, power: float, alpha: float = 0.05) -> int:
    """Paired repeats for a two-sided paired t-test on log ratios to detect ``change`` with
    ``power`` (statsmodels TTestPower; effect size ln(1+change) / (sqrt(2) cv)), at least 2."""
    from statsmodels.stats.power import TTestPower
    es = math.log1p(change) / (math.sqrt(2) * cv)
    tp = TTestPower()
    n = 2       # smallest n with the power; a plain search (solve_power fails to converge below ~3)
    while tp.power(effect_size=es, nobs=n, alpha=alpha, alternative="two-sided") < power:
        n += 1
        if n > 100_000:
            return n
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cv", type=float, help="run-to-run CV of throughput (fraction); default: "
                    "measured from results/, else 0.03")
    ap.add_argument("--repeats", type=int, nargs="+", default=[5],
                    help="interleaved repeats per variant (one table row each; default 5)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--effect", type=float, default=0.10, help="true change to detect (0.10)")
    ap.add_argument("--multipliers", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    ap.add_argument("--power", type=float, nargs="+", default=[0.80, 0.95],
                    help="power(s) for the power table (0.80 0.95)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bootstrap-from", type=int, help="CompareSettings.min_repeats_for_bootstrap "
                    "(default: the setting's default)")
    ap.add_argument("--workdir", type=Path, help="scratch folder (default: a temp dir, /dev/shm "
                    "when present)")
    a = ap.parse_args(argv)

    if a.cv is not None:
        cv0, source = a.cv, "--cv"
    else:
        m = measured_cv()
        cv0, source = m if m else (DEFAULT_CV, f"stated default {DEFAULT_CV:.0%} (no A/A run in results/)")
    settings = CompareSettings(seed=a.seed, **({"min_repeats_for_bootstrap": a.bootstrap_from}
                                                if a.bootstrap_from else {}))
    base = a.workdir or (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    root = Path(tempfile.mkdtemp(prefix="pb-calibrate-", dir=base))
    print(f"noise: CV {cv0 * 100:.2f}% per run, from {source}")
    print(f"trials: {a.trials} per cell, seed {a.seed}, true change +{a.effect:.0%}, "
          f"confidence {settings.confidence:.0%}, bootstrap from "
          f"{settings.min_repeats_for_bootstrap} repeats, compare_run on synthetic run folders\n")
    ok_at_1x = True
    lines = [f"| noise (CV per run) | repeats | +{a.effect:.0%} called improved [95% CI] | no change "
             "called significant [95% CI] | targets (>= 95% / <= 5%) |", "|---|---|---|---|---|"]
    t0 = time.time()
    try:
        for mult in a.multipliers:
            cv = cv0 * mult
            for n in a.repeats:
                hit, fp = rates(root, cv, n, a.trials, a.seed, a.effect, settings)
                good = hit >= 0.95 and fp <= 0.05
                if mult == 1.0 and not good:
                    ok_at_1x = False
                lines.append(f"| {cv * 100:.2f}% ({mult:g}x) | {n} | {_rate(hit, a.trials)} | "
                             f"{_rate(fp, a.trials)} | {'met' if good else 'NOT met'} |")
                print(lines[-1], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n({time.time() - t0:.0f} s)\n")
    print("\n".join(lines))
    print(f"\n(bracketed: 95% Wilson interval of the rate over {a.trials} trials; a method whose "
          "true false-positive rate is exactly 5% exceeds 5.0% in about half of such samples)")
    for pw in a.power:
        print(f"\nRepeats needed (paired, interleaved) to detect a change at 95% confidence with "
              f"{pw:.0%} power, by run-to-run noise (two-sided paired t-test on log ratios, "
              "statsmodels TTestPower):\n")
        print("| noise (CV per run) | 2% change | 3% change | 5% change |")
        print("|---|---|---|---|")
        for mult in a.multipliers:
            cv = cv0 * mult
            cells = [str(repeats_needed(cv, c, pw)) for c in (0.02, 0.03, 0.05)]
            print(f"| {cv * 100:.2f}% ({mult:g}x) | " + " | ".join(cells) + " |")
    print("\nWith A/A variants in the run, an effect must also exceed the A/A noise floor; the "
          "table does not include that.")
    return 0 if ok_at_1x else 1


if __name__ == "__main__":
    sys.exit(main())
