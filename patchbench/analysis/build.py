"""Build the typed :class:`~patchbench.analysis.comparison.Comparison` of one run folder: each
suite's ``pair`` hook (docs/CONTRACTS.md, "Pair hook keys") and rows with their tests; verdicts
by :mod:`patchbench.analysis.family`, health by :mod:`patchbench.analysis.health`."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from patchbench.analysis import fingerprints, health, hostload, verdicts
from patchbench.analysis.comparison import CompareSettings, Comparison, Row, write_comparison
from patchbench.analysis.family import (
    Tested,
    design_of,
    fixed_finished,
    holm_levels,
    judge,
    primary_family,
    sequential_decision,
    sequential_verdicts,
)
from patchbench.analysis.rundata import RunData, read_run
from patchbench.runfolder import RunManifest
from patchbench.suite import MetricInfo, PairingRefused, Suite, get_suite, unit_of


def guess_metric_info(name: str) -> MetricInfo:
    """Direction and unit of an undeclared metric from its name (``*_tok_s``, ``*_req_s``,
    ``*_acc`` higher; ``*_ms``, ``*_us``, ``*_s`` lower; else none)."""
    unit = unit_of(name)
    better = (
        "higher"
        if unit in ("tok/s", "req/s", "acc")
        else ("lower" if unit in ("ms", "us", "s") else "none")
    )
    return MetricInfo(better=better, unit=unit)


def settings_of(man: RunManifest, notes: list[str] | None = None) -> CompareSettings:
    """The run's ``compare:`` settings; what reading the manifest dropped goes to ``notes``."""
    if notes is not None:
        notes += man.config_notes.get("compare", [])
    return man.config.compare if man.config is not None else CompareSettings()


def suite_declarations(name: str, notes: list[str]) -> tuple[Suite | None, dict[str, MetricInfo]]:
    """(the suite ``name``, its declarations); (None, {}) with a note when it cannot be loaded."""
    try:
        obj = get_suite(name)
    except KeyError:
        notes.append(f"suite '{name}' is not a known suite; directions guessed from metric names")
        return None, {}
    except Exception as e:  # noqa: BLE001 - a suite that fails to import must not hide the others
        notes.append(
            f"suite '{name}' could not be loaded ({type(e).__name__}: {e}); "
            "directions guessed from metric names"
        )
        return None, {}
    return obj, dict(obj.metrics)


def _params(data: RunData, suite: str, obj: Any) -> Any:
    """The manifest's ``suites.<suite>`` section (without ``rounds``) as the suite's ``Params``
    (the raw dict when it has none or it does not validate)."""
    from patchbench.config.schema import ROUNDS_KEY

    cfg = data.manifest.config
    raw = (cfg.suites.get(suite) if cfg is not None else None) or {}
    raw = {k: v for k, v in raw.items() if k != ROUNDS_KEY}
    model = getattr(obj, "Params", None)
    if model is None:
        return raw
    try:
        return model.model_validate(raw)
    except ValidationError:
        return raw


def _pair_of(cmp: Comparison, suite: str, variant: str) -> dict:
    """What ``suite``'s pair hook returned for ``variant`` ({} when nothing)."""
    return (cmp.pairs.get(suite) or {}).get(variant) or {}


def _pairs_for(data: RunData, obj: Any, suite: str, variant: str, cmp: Comparison) -> None:
    """The suite's pair hook on the repeats where both arms' cells are ok, into
    ``cmp.pairs[suite][variant]``; a refusal or a failing hook into ``cmp.refusals``."""
    if obj is None or not hasattr(obj, "pair"):
        return
    ks = [
        k
        for k in data.rounds_of(suite)
        if data.suite_status(data.baseline, k, suite) == "ok"
        and data.suite_status(variant, k, suite) == "ok"
    ]
    if not ks:
        return
    try:
        res = obj.pair(
            [data.suite_dir(data.baseline, k, suite) for k in ks],
            [data.suite_dir(variant, k, suite) for k in ks],
            _params(data, suite, obj),
        )
    except PairingRefused as e:
        cmp.refusals.setdefault(suite, {})[variant] = str(e)
        return
    except Exception as e:  # noqa: BLE001 - a broken hook is shown as a refusal, never hidden
        cmp.refusals.setdefault(suite, {})[variant] = (
            f"the suite's pair hook failed: {type(e).__name__}: {e}"
        )
        return
    if res is not None:
        if hasattr(res, "model_dump"):
            res = res.model_dump(mode="json")
        cmp.pairs.setdefault(suite, {})[variant] = res


def _metrics_of(
    data: RunData, cmp: Comparison, suite: str, declared: dict[str, MetricInfo]
) -> list[tuple[str, MetricInfo, bool]]:
    """(metric, info, declared) per row of ``suite``: the declared metrics a summary or pair
    holds (every declared primary when none holds any), then the undeclared ones seen."""
    seen: list[str] = []
    for (_v, _k, x), sm in data.summaries.items():
        if x == suite and sm is not None:
            seen += [m for m in sm.metrics if m not in seen]
    out = [
        (m, i, True)
        for m, i in declared.items()
        if m in seen
        or (i.primary and not seen)
        or (
            i.kind == "accuracy"
            and any(m in _pair_of(cmp, suite, v).get("accuracy", {}) for v in data.variants[1:])
        )
    ]
    return out + [(m, guess_metric_info(m), False) for m in seen if m not in declared]


def _repeat_values(
    data: RunData, row: Row
) -> tuple[list[tuple[float, float]], dict[str, set[str | None]], list[str]]:
    """Fill the row's per-repeat values. Returns (the (baseline, variant) pairs a test uses,
    {arm: the bounds of its values}, "arm/rep<k>: why" per missing value)."""
    suite, metric, variant = row.suite, row.metric, row.variant
    bad, pairs = [], []
    bounds: dict[str, set[str | None]] = {data.baseline: set(), variant: set()}
    for k in data.rounds_of(suite):
        vb = data.value(data.baseline, k, suite, metric)
        vv = data.value(variant, k, suite, metric)
        row.baseline_repeats.append(vb)
        row.variant_repeats.append(vv)
        for v, x in ((data.baseline, vb), (variant, vv)):
            if x is None:
                st = data.suite_status(v, k, suite)
                why = (
                    data.not_judged(v, k, suite, metric)
                    or data.left_out.get((v, k, suite, metric))
                    or "no value"
                )
                bad.append(f"{v}/rep{k}: {why if st == 'ok' else data.why_not_ok(v, k, suite)}")
        if vb is None or vv is None:
            continue
        if row.kind == "run" and not (
            data.timed(data.baseline, k, suite) and data.timed(variant, k, suite)
        ):
            where = "correctness" if suite in data.correctness_only else f"rep{k}"
            row.notes.append(f"{where}: an instrumented cell; its timings feed no verdict")
            continue
        pairs.append((vb, vv))
        row.paired_repeats.append(k)
        for v in (data.baseline, variant):
            bounds[v].add(data.bound(v, k, suite, metric))
    return pairs, bounds, bad


def _pooled_cells(cmp: Comparison, suite: str, metric: str):
    """The cell-shift variance of an accuracy metric pooled over every arm (the baseline once)."""
    from patchbench import stats

    parts, base = [], False
    for v in cmp.variants:
        c = (_pair_of(cmp, suite, v).get("accuracy", {}).get(metric) or {}).get("cells") or {}
        if c.get("baseline") and not base:
            parts.append(stats.CellVariance(**c["baseline"]))
            base = True
        if c.get("variant"):
            parts.append(stats.CellVariance(**c["variant"]))
    return stats.pool_cell_variance(parts)


def _accuracy_test(cmp: Comparison, row: Row) -> verdicts.Test | None:
    """The paired test of an accuracy row from its pair's per-question correctness; None with a
    note without it."""
    acc = _pair_of(cmp, row.suite, row.variant).get("accuracy", {}).get(row.metric)
    row.change_unit = "pt"
    if acc and acc.get("baseline") is not None:
        row.n_pairs = len(acc["baseline"])
        row.baseline_value = sum(acc["baseline"]) / len(acc["baseline"]) if row.n_pairs else None
        row.variant_value = sum(acc["variant"]) / len(acc["variant"]) if acc["variant"] else None
        c = acc.get("cells") or {}
        reps = (int(c["repeats_baseline"]), int(c["repeats_variant"])) if c else None
        cells = _pooled_cells(cmp, row.suite, row.metric)
        alpha = 1.0 - cmp.settings.confidence
        test = verdicts.accuracy_test(
            acc["baseline"], acc["variant"], reps, cells, margin_pt=row.margin, alpha=alpha
        )
        row.notes.extend(test.notes)
        row.undecided = test.undecided
        return test
    if row.variant in cmp.refusals.get(row.suite, {}):
        row.notes.append(f"pairing refused: {cmp.refusals[row.suite][row.variant]}")
    else:
        row.notes.append("the suite's pair hook gave no per-question correctness: no interval")
    return None


def _test(
    data: RunData,
    s: CompareSettings,
    cmp: Comparison,
    row: Row,
    pairs: list[tuple[float, float]],
    bounds: dict[str, set[str | None]],
) -> verdicts.Test | None:
    """The test of a row by its kind (None: no interval, a note says why); sets ``change_unit``
    and the arms' bounds."""
    b, v = [p[0] for p in pairs], [p[1] for p in pairs]
    if row.kind == "accuracy":
        return _accuracy_test(cmp, row)
    if row.kind not in ("run", "deterministic"):
        return None
    # one arm's bound over its repeats: exact as soon as one repeat is exact or they disagree
    row.baseline_bound, row.variant_bound = (
        next(iter(seen)) if len(seen) == 1 else None
        for seen in (bounds[data.baseline], bounds[row.variant])
    )
    if row.kind == "deterministic":
        row.change_unit = row.unit or ""
        test = verdicts.deterministic_test(b, v, row.baseline_bound, row.variant_bound)
        row.notes.extend(test.notes)
        if min(len(b), len(v)) >= 2 and test.reason is None:
            row.exact_by = "repeats"
        return test
    if row.baseline_bound or row.variant_bound:
        row.notes.append(
            "a value is only a bound in every repeat of an arm (e.g. a load sweep's highest load "
            "meeting its SLO beyond the sweep's last point): the change may be larger"
        )
    if b and (min(b) <= 0 or min(v) <= 0):
        row.change_unit = row.unit or ""
        row.notes.append("values <= 0: no log ratio; compared as differences, descriptive")
        return None
    return verdicts.run_test(b, v, s.min_repeats)


def _descriptive(row: Row, s: CompareSettings, pair: dict) -> None:
    """Attach the pair's request-level interval of the metric (never a verdict)."""
    desc = (pair.get("descriptive") or {}).get(row.metric)
    if desc is None or not s.within_cell_intervals:
        return
    rp = pair.get("request_pairing")
    if rp is not None and not rp.get("ok", False):
        row.notes.append(
            f"requests do not pair by index ({rp.get('reason')}): no request-level interval"
        )
        return
    row.descriptive = dict(
        desc, label="descriptive only: requests within one cell, not run-to-run; never a verdict"
    )


def _row(
    data: RunData,
    s: CompareSettings,
    cmp: Comparison,
    suite: str,
    metric: str,
    info: MetricInfo,
    declared: bool,
    variant: str,
) -> tuple[Row, verdicts.Test | None]:
    """The row of (suite, metric, variant) before its verdict, and its test; a missing value
    makes it "incomplete" (accuracy only when no question paired)."""
    row = Row(
        suite=suite,
        metric=metric,
        variant=variant,
        label=info.label,
        unit=info.unit,
        better=info.better,
        kind=info.kind,
        primary=bool(info.primary and declared),
        aa=variant in data.aa_variants,
    )
    if not declared:
        row.notes.append("not declared by the suite: direction guessed from the name; secondary")
    pairs, bounds, bad = _repeat_values(data, row)
    describe_pairs(row, pairs, s.margin_for(suite, metric, info.margin))
    row.n_pairs = len(pairs)
    test = _test(data, s, cmp, row, pairs, bounds)
    if row.kind == "deterministic" and info.deterministic_by and pairs:
        row.exact_by = row.exact_by or info.deterministic_by
    if test is not None:
        row.method = test.method
        if test.reason:
            row.notes.append(test.reason)
    row.margin = s.margin_for(suite, metric, info.margin)
    _descriptive(row, s, _pair_of(cmp, suite, variant))
    no_values = row.baseline_value is None or row.variant_value is None
    if bad and (info.kind != "accuracy" or no_values):
        row.notes.append("incomplete cells: " + "; ".join(bad))
        row.verdict = "incomplete"
    return row, test


#: the rule that names an outlier repeat (descriptive; it never changes a verdict)
OUTLIER_RULE = (
    "a paired log ratio more than 3.5 robust sd (1.4826 x MAD) and more than the margin from "
    "the row's median (Iglewicz & Hoaglin 1993; 3 pairs or more)"
)
OUTLIER_Z = 3.5


def describe_pairs(row: Row, pairs: list[tuple[float, float]], margin: float | None) -> None:
    """Set the values a row shows (run rows: each arm's geometric mean over ``pairs``, else the
    median), the sd of the log ratios and the outlier repeats (:data:`OUTLIER_RULE`; ``margin``
    in percent)."""
    from scipy.stats import median_abs_deviation

    for arm in ("baseline", "variant"):
        xs = [x for x in getattr(row, f"{arm}_repeats") if x is not None]
        setattr(row, f"{arm}_value", statistics.median(xs) if xs else None)
    if row.kind != "run" or not pairs or min(min(p) for p in pairs) <= 0:
        return
    logs = np.log(np.asarray(pairs, dtype=float))
    row.baseline_value = float(np.exp(logs[:, 0].mean()))
    row.variant_value = float(np.exp(logs[:, 1].mean()))
    d = logs[:, 1] - logs[:, 0]
    if len(d) >= 2:
        row.log_ratio_sd = float(d.std(ddof=1))
    if len(d) < 3:
        return
    limit = OUTLIER_Z * median_abs_deviation(d, scale="normal")
    if margin is not None:
        limit = max(limit, float(np.log1p(margin / 100)))
    if limit > 0:
        dev = np.abs(d - np.median(d))
        row.outlier_repeats = [k for k, x in zip(row.paired_repeats, dev, strict=True) if x > limit]


def _tested(
    data: RunData,
    s: CompareSettings,
    cmp: Comparison,
    notes: list[str],
    suites: Mapping[str, Any] | None = None,
    primaries: dict[str, set[str]] | None = None,
) -> Tested:
    """Every suite's pair hooks, then its rows with their tests; ``primaries`` gets each suite's
    declared primaries."""
    tested: Tested = []
    for suite in data.suites:
        if suites is not None and suite in suites:
            obj, declared = suites[suite], dict(getattr(suites[suite], "metrics", {}) or {})
        else:
            obj, declared = suite_declarations(suite, notes)
        if primaries is not None:
            primaries[suite] = {m for m, i in declared.items() if i.primary}
        hook = getattr(obj, "declarations", None)  # the run's own, e.g. a load sweep's points
        if hook is not None:
            declared = hook(_params(data, suite, obj))
        for v in data.variants[1:]:
            _pairs_for(data, obj, suite, v, cmp)
        tested += [
            _row(data, s, cmp, suite, m, info, dec, v)
            for m, info, dec in _metrics_of(data, cmp, suite, declared)
            for v in data.variants[1:]
        ]
    return tested


def look_decision(run_dir: str | os.PathLike, look_index: int) -> tuple[Any, int]:
    """The report's sequential rule at look ``look_index`` on the run folder as it is: (the
    LookDecision or None, the complete rounds). ValueError without a sequential schedule."""
    data = read_run(run_dir)
    notes: list[str] = []
    s = settings_of(data.manifest, notes)
    cmp = Comparison(baseline=data.baseline, variants=data.variants[1:], settings=s)
    tested = _tested(data, s, cmp, notes)
    _, design = design_of(data, s)
    if design is None:
        raise ValueError(f"{run_dir}: not a sequential schedule")
    for row, test in tested:
        judge(row, test, s.confidence)
    dec, _, complete = sequential_decision(data, tested, design, upto=look_index)
    return dec, complete


def build_comparison(
    run_dir: str | os.PathLike | RunData,
    settings: CompareSettings | None = None,
    *,
    suites: Mapping[str, Any] | None = None,
) -> Comparison:
    """The comparison of ``run_dir`` (a folder, or a :class:`RunData`); writes nothing.
    ``settings``: None, the run's own; ``suites``: {name: suite object} instead of the
    registered ones. Raises RunFolderError / SchemaTooNew (exit 2)."""
    data = run_dir if isinstance(run_dir, RunData) else read_run(run_dir)
    notes = list(data.notes)
    s = settings or settings_of(data.manifest, notes)
    cmp = Comparison(
        run_id=data.manifest.run_id or Path(data.run_dir).name,
        baseline=data.baseline,
        variants=data.variants[1:],
        aa_variants=data.aa_variants,
        repeats=data.repeats,
        suites=data.suites,
        settings=s,
    )
    primaries: dict[str, set[str]] = {}
    tested = _tested(data, s, cmp, notes, suites, primaries)
    family = primary_family(tested, data.aa_variants)
    cmp.design, design = design_of(data, s)
    cmp.design.family = len(family)
    if design is None:
        holm_levels(family, cmp.design.alpha)
    for row, test in tested:
        judge(row, test, s.confidence)
        cmp.rows.append(row)
    if design is None:
        fixed_finished(data, cmp, family)
    else:
        sequential_verdicts(data, cmp, tested, design)
    health.check_drift(data, cmp)
    health.aa_noise(cmp)
    health.cell_statuses(data, cmp)
    health.failures(data, cmp, primaries)
    cmp.run = health.run_info(data, cmp.run_id)
    cmp.run.host = hostload.host_load(data, cmp)
    cmp.run.host.gpu_warnings = health.gpu_warnings(data)
    cmp.server = fingerprints.server_fingerprints(data, cmp)
    cmp.correctness_cells = health.correctness_cells(data)
    cmp.suite_rounds = {
        x: ("correctness" if x in data.correctness_only else data.rounds_of(x)) for x in data.suites
    }
    cmp.schedule = health.schedule_of(data)
    used = {r.method.split(" (")[0] for r in cmp.rows if r.method}
    cmp.methods = {
        name: src
        for name, src in verdicts.METHOD_SOURCES.items()
        if any(u.startswith(name) or name in u for u in used) or name in ("Holm", "TOST")
    }
    cmp.notes = notes
    return cmp


def compare_run(run_dir: str | os.PathLike, settings: CompareSettings | None = None) -> Comparison:
    """Build the comparison of ``run_dir`` and write ``RUN/compare.json``; returns it."""
    cmp = build_comparison(run_dir, settings)
    write_comparison(run_dir, cmp)
    return cmp
