"""The run's health beside its verdicts: baseline drift, A/A noise, cells and schedule.

Filled into a :class:`~patchbench.analysis.comparison.Comparison` whose rows are judged already
(:func:`patchbench.analysis.build.build_comparison` calls these in order): :func:`check_drift` (a
trend of the baseline across rounds; under an unbalanced schedule it makes verdicts
inconclusive), :func:`aa_noise` (the A/A variants as a measurement of run-to-run noise),
:func:`cell_statuses`, :func:`correctness_cells` and :func:`schedule_of` (what ran, in which
order, with what warnings).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from patchbench.analysis.comparison import AANoise, Comparison, Drift, Health
from patchbench.analysis.rundata import RunData

#: the level of the drift test (a trend of the baseline's values across rounds)
DRIFT_ALPHA = 0.01


def check_drift(data: RunData, cmp: Comparison) -> None:
    """Test the baseline arm's values of every run-level primary for a linear trend across rounds
    (:func:`patchbench.stats.trend_t` of the log value on the round index, at
    :data:`DRIFT_ALPHA`) into ``cmp.drift``. Under an unbalanced schedule (``order:
    sequential``: each round runs the arms in the same order, so a drift biases the later ones)
    a drift found makes that metric's decided verdicts inconclusive; an interleaved schedule
    balances it and no verdict changes."""
    from patchbench import stats

    cfg = data.manifest.config
    cmp.order = cfg.schedule.order if cfg is not None else "interleaved"
    cmp.unbalanced_reason = cfg.schedule.unbalanced_reason if cfg is not None else None
    seen: set[tuple[str, str]] = set()
    for r in cmp.rows:
        if not (r.primary and r.kind == "run") or (r.suite, r.metric) in seen:
            continue
        seen.add((r.suite, r.metric))
        pts = [
            (k, math.log(x))
            for k, x in zip(data.rounds_of(r.suite), r.baseline_repeats, strict=False)
            if x is not None and x > 0
        ]
        if len(pts) < 3 or len({k for k, _ in pts}) < 3:
            continue
        t = stats.trend_t([y for _, y in pts], [k for k, _ in pts])
        lo, hi = t.interval(0.05)
        p = t.p_value()
        cmp.drift.append(
            Drift(
                suite=r.suite,
                metric=r.metric,
                label=r.label,
                n=len(pts),
                slope_pct=100 * math.expm1(t.mean),
                low_pct=100 * math.expm1(lo),
                high_pct=100 * math.expm1(hi),
                p=p,
                alpha=DRIFT_ALPHA,
                found=p < DRIFT_ALPHA,
            )
        )
    if cmp.order != "sequential":
        return
    for d in cmp.drift:
        if not d.found:
            continue
        for r in cmp.rows_for(suite=d.suite):
            if r.metric != d.metric or r.verdict not in ("improved", "regressed", "equivalent"):
                continue
            r.notes.append(
                f"was {r.verdict}: the baseline drifts {d.slope_pct:+.2f}%/round "
                f"(p = {d.p:.2g}) under an unbalanced schedule (order: sequential)"
            )
            r.verdict, r.within_margin = "inconclusive", False


def aa_noise(cmp: Comparison) -> None:
    """The A/A variants as a measurement: the run-to-run noise of each run-level primary (the sd
    of the paired log ratios A/A / baseline over sqrt 2, a per-run coefficient of variation, with
    its chi-square interval, :func:`patchbench.stats.sd_interval`) next to the config's
    ``compare.assumed_cv``. A/A rows are measurements, never improved or regressed (as in the
    sequential rule, where they are controls): a difference beyond an A/A interval is noted in
    ``cmp.health`` and the row says it; no other verdict is changed."""
    from patchbench import stats

    cmp.health = Health(aa_variants=cmp.aa_variants)
    for r in cmp.rows:
        if not (r.aa and r.primary and r.kind == "run"):
            continue
        d = [
            math.log(v / b)
            for b, v in zip(r.baseline_repeats, r.variant_repeats, strict=True)
            if b is not None and v is not None and b > 0 and v > 0
        ]
        assumed = next(
            (
                float(cmp.settings.assumed_cv[k])
                for k in (f"{r.suite}.{r.metric}", r.metric)
                if k in cmp.settings.assumed_cv
            ),
            None,
        )
        noise = AANoise(
            variant=r.variant,
            suite=r.suite,
            metric=r.metric,
            label=r.label,
            n=len(d),
            assumed_pct=assumed,
        )
        if len(d) >= 2:
            sd = statistics.stdev(d) / math.sqrt(2)
            lo, hi = stats.sd_interval(sd, len(d) - 1)
            noise.cv_pct, noise.low_pct, noise.high_pct = 100 * sd, 100 * lo, 100 * hi
        cmp.health.noise.append(noise)
    seen = [r for r in cmp.rows if r.aa and r.primary and r.verdict in ("improved", "regressed")]
    cmp.health.ok = not seen
    for r in seen:
        cmp.health.notes.append(
            f"{r.variant} {r.metric}: a difference of {r.change:+.1f}{r.change_unit} between two "
            f"identical arms (its {100 * (r.confidence or 0):.4g}% interval excludes 0; that "
            "happens by chance in some healthy runs); no verdict is changed by it"
        )
        r.notes.append(
            f"A/A: a measurement, never improved or regressed (its interval excludes 0: "
            f"{r.verdict} if it were a patch)"
        )
        r.verdict, r.within_margin = "inconclusive", False


def cell_statuses(data: RunData, cmp: Comparison) -> None:
    """``cmp.cells``: each timed cell's status and its suites' (variant order, then repeat), and
    ``cmp.cell_warnings``: each suite's warnings, errors and missing summaries per cell."""
    vorder = {v: i for i, v in enumerate(data.variants)}
    for (v, k), c in sorted(data.cells.items(), key=lambda x: (vorder[x[0][0]], x[0][1])):
        here = [x for x in data.suites if x not in data.correctness_only and k in data.rounds_of(x)]
        cmp.cells.append(
            {
                "variant": v,
                "repeat": k,
                "status": data.cell_status(v, k),
                "error": c.error if c else None,
                "suites": {
                    x: (data.suite_status(v, k, x) if x in here else "not scheduled")
                    for x in data.suites
                },
                "cell_kind": c.cell_kind if c else None,
                "instrumented": c.instrumented if c else False,
            }
        )
        for x in here:
            sm = data.summaries.get((v, k, x))
            lines = (list(sm.warnings) + list(sm.errors)) if sm else []
            if c is not None and c.status == "ok" and sm is None:
                lines.append("no summary.json")
            if data.cell_status(v, k) != "ok":
                lines.append(
                    f"cell {data.cell_status(v, k)}" + (f" ({c.error})" if c and c.error else "")
                )
            for line in lines:
                cmp.cell_warnings.setdefault(x, {}).setdefault(v, []).append(f"rep{k}: {line}")


def correctness_cells(data: RunData) -> list[dict[str, Any]]:
    """The untimed correctness cells that ran (instrumented and untimed suites)."""
    return [
        {
            "variant": v,
            "dir": f"{v}/correctness",
            "status": c.status,
            "error": c.error,
            "suites": dict(c.suites),
            "instrumented": c.instrumented,
            "instrumentation": sorted(c.instrumentation),
        }
        for v, c in data.corr_cells.items()
        if c is not None
    ]


def schedule_of(data: RunData) -> list[dict[str, Any]]:
    """The timed cells in the order the manifest lists them (the order they ran), with their
    status."""
    out = []
    for pos, c in enumerate(data.manifest.cells):
        if c.cell_kind == "correctness":
            continue
        key = (c.variant, c.repeat)
        out.append(
            {
                "variant": key[0],
                "repeat": key[1],
                "position": pos,
                "status": data.cell_status(*key) if key in data.cells else c.status,
            }
        )
    return out
