"""The calibration's printed tables: the CV rows, the design table and the targets' verdict.

Each rate is printed with its 95 % Wilson interval over the trials (:func:`fmt`).
"""

from __future__ import annotations

import math

import numpy as np

from patchbench.stats import wilson_interval
from tools.calibration.designs import Calibration, Cost
from tools.calibration.model import PATCHES, PRIMARIES, SHORT, SUITES, VARIANTS
from tools.calibration.trials import Counts


def fmt(k: int, n: int) -> str:
    """ "4.2% [2.7, 6.6]": the rate k / n and its 95 % Wilson interval; "n/a" when n is 0."""
    if n == 0:
        return "n/a"
    lo, hi = wilson_interval(k, n, 0.95)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def realised_cv(c: Counts, metric: str) -> str:
    """Pooled within-trial standard deviation of the log metric over every cell of a null
    trial (all cells then have the same distribution): the run-to-run CV the rows really had."""
    v = c.logvar.get(metric)
    return f"{100 * math.sqrt(float(np.mean(v))):.1f}%" if v else "n/a"


def table(rows: list[tuple[float, int, Counts]]) -> list[str]:
    """The two markdown tables (targets; equivalence, A/A check and realised noise)."""
    np_ = len(PATCHES)
    out = [
        "| run CV | repeats | trials (null / +10%) | a patch with no effect shown improved or "
        "regressed on a primary (target <= 5%) | whole no-effect report (2 null patches + A/A), "
        "any primary | +10% output throughput called improved (target >= 90%) | no-effect "
        "reports with a run-level improved/regressed (target 0 at 1 repeat) |",
        "|---|---|---|---|---|---|---|",
    ]
    for cv, n, c in rows:
        out.append(
            f"| {100 * cv:g}% | {n} | {c.null} / {c.effect} | "
            f"{fmt(c.new_fp_patch, np_ * c.null)} | {fmt(c.new_fp, c.null)} | "
            f"{fmt(c.new_power, c.effect)} | {fmt(c.new_run_any, c.null)} |"
        )
    prim = [mm for s in SUITES for mm in PRIMARIES[s]]
    out += [
        "",
        "No-effect reports: primaries of the two null patches called equivalent (margins "
        "5%, MMMU 2 pt; host syncs exact), the A/A check, and the run-to-run CV the rows "
        "really had (run and request noise together):",
        "",
        "| run CV | repeats | "
        + " | ".join(f"{SHORT[x]} equivalent" for x in prim)
        + " | A/A check failed | primary improved/regressed before the A/A check | any row "
        "improved/regressed | realised CV: thr / ITL / TTFT / E2E / MMMU acc |",
        "|---|---|" + "---|" * (len(prim) + 4),
    ]
    for cv, n, c in rows:
        if not c.null:
            continue
        eq = " | ".join(fmt(c.equiv.get(x, 0), c.equiv_n.get(x, 0)) for x in prim)
        rc = " / ".join(realised_cv(c, x) for x in PRIMARIES["serving"] + PRIMARIES["mmmu"])
        out.append(
            f"| {100 * cv:g}% | {n} | {eq} | {fmt(c.aa_failed, c.null)} | "
            f"{fmt(c.new_fp_raw, c.null)} | {fmt(c.new_any, c.null)} | {rc} |"
        )
    out += [
        "",
        "Where the false verdicts come from: primaries of the two null patches called "
        "improved or regressed before the A/A check (share of rows):",
        "",
        "| run CV | repeats | " + " | ".join(SHORT[x] for x in prim) + " |",
        "|---|---|" + "---|" * len(prim),
    ]
    for cv, n, c in rows:
        if c.null:
            out.append(
                f"| {100 * cv:g}% | {n} | "
                + " | ".join(fmt(c.raw_hit.get(x, 0), c.equiv_n.get(x, 0)) for x in prim)
                + " |"
            )
    return out


def design_table(entries: list[tuple[str, Counts, bool]], cv: float, cost: Cost) -> list[str]:
    """The README table: one line per design (label, counts, MMMU in the first round only) at
    run CV ``cv``: error rates, equivalence of the real-0 primaries, repeats used, primaries
    decided and what they cost in H200 time (:class:`Cost`)."""
    prim = list(PRIMARIES["serving"]) + list(PRIMARIES["mmmu"])
    n_all = len(PATCHES) * sum(len(x) for x in PRIMARIES.values())
    n_run = len(PATCHES) * len(PRIMARIES["serving"])
    small = any(c.small for _, c, _ in entries)
    named = any(c.abnormal for _, c, _ in entries)
    out = [
        f"| design (run CV {100 * cv:g}%) | trials (no effect / +10%) | repeats: mean / p90 "
        "(no effect) | repeats: mean / p90 (+10%) | a no-effect patch shown improved or "
        "regressed (target <= 5%) | a no-effect report (two patches + A/A) with any primary shown "
        "improved or regressed (target <= 5%) | +10% output throughput called improved (target "
        ">= 90%) | "
        + (
            "+5% output throughput called improved | +5% called equivalent (a true effect at "
            "the margin: target <= 5%) | "
            if small
            else ""
        )
        + " | ".join(f"real 0 called equivalent: {SHORT[x]}" for x in prim)
        + f" | primaries decided a report, all {n_all} / serving {n_run}: no effect | +10% "
        "| H200 min a report: no effect / +10% | primaries decided per H200 hour, all / "
        "serving: no effect | +10% |"
        + (
            " reports with the abnormal slow cell in their rounds (no effect and +10%): its "
            "repeat named an outlier repeat |"
            if named
            else ""
        ),
        "|---|---|---|---|---|---|---|"
        + "---|" * (len(prim) + 2 * small + named)
        + "---|---|---|---|---|",
    ]
    for label, c, mmmu_first in entries:
        mins, dec, per_h = [], [], []
        for sc, n in (("null", c.null), ("effect", c.effect)):
            if not n:
                mins.append("n/a")
                dec.append("n/a")
                per_h.append("n/a")
                continue
            h = cost.hours(float(np.mean(c.reps[sc])), mmmu_first)
            d, r = c.decided[sc] / n, c.decided_run[sc] / n
            mins.append(f"{60 * h:.0f}")
            dec.append(f"{d:.2f} / {r:.2f}")
            per_h.append(f"{d / h:.2f} / {r / h:.2f}")
        reps = [
            f"{np.mean(c.reps[sc]):.1f} / {np.percentile(c.reps[sc], 90):.0f}"
            if c.reps[sc]
            else "n/a"
            for sc in ("null", "effect")
        ]
        out.append(
            f"| {label} | {c.null} / {c.effect} | {reps[0]} | {reps[1]} | "
            f"{fmt(c.new_fp_patch, len(PATCHES) * c.null)} | "
            f"{fmt(c.new_fp, c.null)} | "
            f"{fmt(c.new_power, c.effect)} | "
            + (f"{fmt(c.small_power, c.small)} | {fmt(c.small_equiv, c.small)} | " if small else "")
            + " | ".join(fmt(c.equiv.get(x, 0), c.equiv_n.get(x, 0)) for x in prim)
            + f" | {' | '.join(dec)} | {' / '.join(mins)} | {' | '.join(per_h)} |"
            + (f" {fmt(c.abnormal_named, c.abnormal)} ({c.abnormal} reports) |" if named else "")
        )
    return out


def print_report(cal: Calibration, argv: list[str], wall: float, entries) -> int:
    """Print the tables and the targets' verdict; return the exit status."""
    a, base = cal.a, cal.base
    print(f"command: .venv/bin/python tools/calibrate.py {' '.join(argv)}".rstrip())
    how = "run folders + compare_run" if a.via_folders else "in-memory RunData + build_comparison"
    print(f"wall time: {wall:.0f} s, one process ({how})")
    print(
        f"settings: {a.config.name if a.config.is_file() else 'defaults'}: confidence "
        f"{cal.settings.confidence}, min_repeats {cal.settings.min_repeats}; request CV "
        f"{100 * base.req_cv:g}% (decode-step share {base.step_share:g}), {base.requests} "
        f"requests x {base.out_len} tokens at concurrency {base.concurrency}; MMMU "
        f"{base.questions} questions, {100 * base.fragile:g}% fragile; variants: baseline, "
        f"A/A, 2 patches; seed {a.seed}"
        + ("" if base.noise_label == "Gaussian" else f"; run noise: {base.noise_label}")
        + "\n"
    )
    if cal.rows and not a.design_only:
        print("\n".join(table(sorted(cal.rows, key=lambda r: (r[0], -(r[1] == 1), r[1])))))
    if cal.screens:
        print(
            f"\nsearch at run CV {100 * a.target_cv:g}%, +10% called improved in the "
            f"{a.screen_trials}-trial screens (a count whose 95% Wilson upper bound is below "
            "the target gets no full row): "
            + "; ".join(f"{n} repeats: {fmt(k, t)}" for n, k, t in cal.screens)
        )
    cost = Cost(len(VARIANTS), a.startup_s, a.serving_s, a.mmmu_s, a.correctness_s, cal.n_corr)
    ships = cal.seq_cfg.label if cal.seq_cfg else f"fixed {cal.reps_cfg}"
    print(
        f"\nDesigns at run CV {100 * a.target_cv:g}% ({a.config.name} ships {ships}); primaries "
        f"decided: improved, regressed or equivalent after the A/A check, of the 12 primaries of "
        f"the two patches (6 each; serving: their 4 run-level ones); H200 minutes of a report: "
        f"{len(VARIANTS)} timed cells a round, one cell = {a.startup_s:g} s server start-up "
        f"(assumed, not measured here) + {a.serving_s:g} s serving (+ {a.mmmu_s:g} s MMMU in the "
        f"rounds it runs in), plus the config's {cal.n_corr} untimed correctness cells of "
        f"{a.startup_s:g} + {a.correctness_s:g} s (assumed). Sequential rows: the runner's "
        f"stopping rule as the report replays it (patchbench.analysis.build.sequential_decision: one "
        f"family per report; the A/A variant is a control that holds no run open; futility: the "
        f"conditional-power threshold, the runner's own unless the row names one) on the same "
        f"trials as the fixed row of their maximum:\n"
    )
    print("\n".join(design_table(entries, a.target_cv, cost)))
    print(
        "\n(brackets: 95% Wilson interval over the trials; a method whose true rate is exactly "
        "5% shows more than 5.0% in about half of such samples. n/a: scenario not run there.)"
    )
    return targets(cal)


def targets(cal: Calibration) -> int:
    """Print whether the shipped schedule meets the targets at --target-cv and the smallest
    fixed repeat count reaching the power target; 0 when both targets hold, else 1."""
    a = cal.a
    c = cal.shipped_sequential if cal.seq_cfg else cal.at[cal.reps_cfg]
    shipped = (
        f"sequential {cal.seq_cfg.min}..{cal.seq_cfg.max}"
        if cal.seq_cfg
        else f"fixed {cal.reps_cfg}"
    )
    fp_ok = c.new_fp_patch <= a.fp_target * len(PATCHES) * c.null
    pw_ok = c.new_power >= a.power_target * c.effect
    print(
        f"\n{a.config.name}: {shipped} repeats at run CV {100 * a.target_cv:g}%: a no-effect "
        f"patch shown improved/regressed {'<=' if fp_ok else '>'} {100 * a.fp_target:g}% "
        f"({'met' if fp_ok else 'NOT met'}); +10% called improved "
        f"{'>=' if pw_ok else '<'} {100 * a.power_target:g}% ({'met' if pw_ok else 'NOT met'})."
    )
    ok = sorted(
        k for k, x in cal.at.items() if x.effect and x.new_power >= a.power_target * x.effect
    )
    print(
        "smallest fixed repeat count reaching the power target at this CV: "
        + (str(ok[0]) if ok else f"none up to {max(cal.at)}")
    )
    return 0 if fp_ok and pw_ok else 1
