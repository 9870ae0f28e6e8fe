"""Build the typed :class:`~patchbench.analysis.comparison.Comparison` of one run folder.

Reads the run folder as :class:`~patchbench.analysis.rundata.RunData`; asks each suite (through
:func:`patchbench.suite.get_suite`) for its metric declarations (:class:`MetricInfo`: direction,
kind, primary, margin) and its ``pair`` hook; builds each suite's rows with their tests and
shown values (the outlier rule, :func:`describe_pairs`). The verdicts come from
:mod:`patchbench.analysis.family` (the report's family of primaries, the fixed or sequential design that
decides them, the rules of :mod:`patchbench.analysis.verdicts`); the run's health beside them (drift, A/A
noise, cells, schedule) from :mod:`patchbench.analysis.health`. What other modules import from here is
listed in ``__all__`` (the moved names re-exported). Names no suite.

What a suite's ``pair`` hook may return besides its own keys (docs/CONTRACTS.md, "Pair hook"):

- ``"accuracy": {metric: {"ids": [...], "baseline": [c_i], "variant": [c_i]}}``: per-question
  correctness in [0, 1] averaged over the paired repeats, for each metric of kind "accuracy";
- ``"descriptive": {metric: {"change_pct", "low_pct", "high_pct", "method"}}``: request-level
  intervals inside one cell (shown as descriptive, never a verdict);
- ``"request_pairing": {"ok": bool, "reason": str}``: whether requests pair by index (same prompt
  at each index); descriptive intervals are dropped when it is not ok.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from patchbench.analysis import verdicts
from patchbench.analysis.comparison import CompareSettings, Comparison, Row, write_comparison
from patchbench.analysis.family import (
    FAMILY_KINDS,
    Tested,
    design_of,
    fixed_finished,
    holm_levels,
    judge,
    primary_family,
    sequential_decision,
    sequential_verdicts,
)
from patchbench.analysis.health import (
    DRIFT_ALPHA,
    aa_noise,
    cell_statuses,
    check_drift,
    correctness_cells,
    schedule_of,
)
from patchbench.analysis.rundata import RunData, read_run
from patchbench.runfolder import RunManifest
from patchbench.suite import MetricInfo, PairingRefused, Suite, get_suite, unit_of

#: what other modules import from here; the family's and the health checks' names are re-exported
__all__ = [
    "DRIFT_ALPHA",
    "FAMILY_KINDS",
    "OUTLIER_RULE",
    "OUTLIER_Z",
    "build_comparison",
    "compare_run",
    "describe_pairs",
    "guess_metric_info",
    "look_decision",
    "primary_family",
    "read_run",
    "sequential_decision",
    "settings_of",
    "suite_declarations",
]


def guess_metric_info(name: str) -> MetricInfo:
    """Direction and unit from a metric's name, for metrics a suite does not declare (always
    secondary): ``*_tok_s``, ``*_req_s``, ``*_acc`` higher is better; ``*_ms``, ``*_us``, ``*_s``
    lower; anything else (counts, shares) has no direction."""
    unit = unit_of(name)
    better = (
        "higher"
        if unit in ("tok/s", "req/s", "acc")
        else ("lower" if unit in ("ms", "us", "s") else "none")
    )
    return MetricInfo(better=better, unit=unit)


def settings_of(man: RunManifest, notes: list[str] | None = None) -> CompareSettings:
    """The run's ``compare:`` settings (defaults where absent); what reading the manifest dropped
    from them (keys of an earlier version, invalid settings) is added to ``notes``."""
    if notes is not None:
        notes += man.config_notes.get("compare", [])
    return man.config.compare if man.config is not None else CompareSettings()


def suite_declarations(name: str, notes: list[str]) -> tuple[Suite | None, dict[str, MetricInfo]]:
    """(the registered suite ``name``, its metric declarations); (None, {}) with a line in
    ``notes`` when the suite is unknown or fails to import (its metrics' directions are then
    guessed from their names, :func:`guess_metric_info`)."""
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


def _run_declarations(
    data: RunData, suite: str, obj: Any, declared: dict[str, MetricInfo]
) -> dict[str, MetricInfo]:
    """The suite's declarations for this run's parameters (its ``declarations`` hook, e.g. the
    per-point metrics of a load sweep); ``declared`` for a suite object without the hook."""
    hook = getattr(obj, "declarations", None)
    if hook is None:
        return declared
    cfg = data.manifest.config
    return hook(_params(obj, (cfg.suites.get(suite) if cfg is not None else None) or {}))


def _params(obj: Any, raw: dict) -> Any:
    """The pair hook's params: the manifest's ``suites.<name>`` section (without the core's
    ``rounds`` key) validated by the suite's ``Params``; the raw dict for a suite object without
    ``Params`` (tools/calibrate.py's in-memory suites) or for a section that model refuses (a
    run folder written by another patchbench version)."""
    from patchbench.run.order import ROUNDS_KEY

    raw = {k: v for k, v in (raw or {}).items() if k != ROUNDS_KEY}
    model = getattr(obj, "Params", None)
    if model is None:
        return raw
    try:
        return model.model_validate(raw)
    except ValidationError:
        return raw


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _pair_of(cmp: Comparison, suite: str, variant: str) -> dict:
    """What ``suite``'s pair hook returned for ``variant`` ({} when nothing)."""
    return (cmp.pairs.get(suite) or {}).get(variant) or {}


def _pairs_for(data: RunData, obj: Any, suite: str, variant: str, cmp: Comparison) -> None:
    """Call ``suite``'s pair hook on the repeats where the baseline's and ``variant``'s cells are
    both ok; its result goes to ``cmp.pairs[suite][variant]``, a refusal or a failure of the hook
    to ``cmp.refusals[suite][variant]``."""
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
    cfg = data.manifest.config
    params = _params(obj, (cfg.suites.get(suite) if cfg is not None else None) or {})
    try:
        res = obj.pair(
            [data.suite_dir(data.baseline, k, suite) for k in ks],
            [data.suite_dir(variant, k, suite) for k in ks],
            params,
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
    """(metric, info, declared by the suite) for each row of ``suite``: the declared metrics that
    a summary holds or (kind "accuracy") that a variant's pair gave, and every declared primary
    when no summary holds any metric of the suite (every cell failed: the primaries stay in the
    family, incomplete), in declaration order; then the undeclared metrics the summaries hold,
    in the order first seen, info guessed from the name. Reads ``cmp.pairs``: call after the
    pair hooks."""
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


def _suite_rows(
    data: RunData,
    s: CompareSettings,
    cmp: Comparison,
    suite: str,
    obj: Any,
    declared: dict[str, MetricInfo],
) -> list[tuple[Row, verdicts.Test | None]]:
    """``suite``'s pair hook for every variant (into ``cmp.pairs`` / ``cmp.refusals``), then its
    rows before their verdicts, each with its test: per metric, one row per variant."""
    for v in data.variants[1:]:
        _pairs_for(data, obj, suite, v, cmp)
    return [
        _row(data, s, cmp, suite, m, info, dec, v)
        for m, info, dec in _metrics_of(data, cmp, suite, declared)
        for v in data.variants[1:]
    ]


def _repeat_values(
    data: RunData, row: Row
) -> tuple[list[tuple[float, float]], dict[str, set[str | None]], list[str]]:
    """Fill the row's per-repeat values of both arms. Returns (the (baseline, variant) pairs a
    test uses, {arm: the bounds of its values in those pairs}, "arm/rep<k>: why" for each missing
    value). A run-level pair from an instrumented cell feeds no test (a note says so)."""
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
                why = data.not_judged(v, k, suite, metric) or "no value"
                bad.append(f"{v}/rep{k}: {why if st == 'ok' else st}")
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
    """The cell-shift variance of an accuracy metric pooled over every arm of the run (A/A
    included): the baseline's parts once, each variant's own (the ``cells`` its suite's pair
    hook gave; patchbench.stats.pool_cell_variance). None when no arm has two repeats."""
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
    """The paired test of an accuracy row from the per-question correctness its suite's pair hook
    gave (then the row's values are the mean correctness); None with a note without it."""
    acc = _pair_of(cmp, row.suite, row.variant).get("accuracy", {}).get(row.metric)
    row.change_unit = "pt"
    if acc and acc.get("baseline") is not None:
        row.n_pairs = len(acc["baseline"])
        row.baseline_value = _mean(acc["baseline"])
        row.variant_value = _mean(acc["variant"])
        c = acc.get("cells") or {}
        reps = (int(c["repeats_baseline"]), int(c["repeats_variant"])) if c else None
        cells = _pooled_cells(cmp, row.suite, row.metric)
        test = verdicts.accuracy_test(acc["baseline"], acc["variant"], reps, cells)
        row.notes.extend(test.notes)
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
    """The test of a row by its kind (None: no interval; the row's notes say why); sets the
    row's ``change_unit`` where it is not "%" and a deterministic row's bounds."""
    b, v = [p[0] for p in pairs], [p[1] for p in pairs]
    if row.kind == "accuracy":
        return _accuracy_test(cmp, row)
    if row.kind == "deterministic":
        row.change_unit = row.unit or ""
        row.baseline_bound = _arm_bound(bounds[data.baseline])
        row.variant_bound = _arm_bound(bounds[row.variant])
        test = verdicts.deterministic_test(b, v, row.baseline_bound, row.variant_bound)
        row.notes.extend(test.notes)
        if min(len(b), len(v)) >= 2 and test.reason is None:
            row.exact_by = "repeats"
        return test
    if row.kind != "run":
        return None
    row.baseline_bound = _arm_bound(bounds[data.baseline])
    row.variant_bound = _arm_bound(bounds[row.variant])
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
    """Attach the request-level interval the pair hook gave for the row's metric (descriptive,
    never a verdict), unless the settings turn them off or the requests do not pair by index."""
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
    """The row of (suite, metric, variant) before its verdict, and its test (None: no
    interval). A metric the suite does not declare is secondary; a missing value makes the row
    "incomplete" (except accuracy, whose questions pair across the cells that ran, unless no
    question paired)."""
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


# ---------------------------------------------------------------- what a row shows


#: the rule that names an outlier repeat (descriptive; it never changes a verdict)
OUTLIER_RULE = (
    "a paired log ratio more than 3.5 robust sd (1.4826 x MAD) and more than the margin from "
    "the row's median (Iglewicz & Hoaglin 1993; 3 pairs or more)"
)
OUTLIER_Z = 3.5


def describe_pairs(row: Row, pairs: list[tuple[float, float]], margin: float | None) -> None:
    """Set the values a row shows and describe its paired repeats (never a verdict).

    ``pairs``: the (baseline, variant) values of ``row.paired_repeats``, in that order;
    ``margin``: the row's equivalence margin in percent (None: none). A run row with pairs and
    positive values shows the geometric mean of each arm over the pairs, so that variant /
    baseline = exp(mean paired log ratio) = 1 + change / 100; it gets the sample sd of the
    paired log ratios (2 pairs or more) and its outlier repeats (:data:`OUTLIER_RULE`: the
    margin keeps a tight cluster, whose MAD is tiny, from naming ordinary noise; without a
    margin nothing is named when the MAD is 0). Other rows show each arm's median over its
    repeats (accuracy rows are set again from the questions by :func:`_accuracy_test`)."""
    from scipy.stats import median_abs_deviation

    row.baseline_value = _median([x for x in row.baseline_repeats if x is not None])
    row.variant_value = _median([x for x in row.variant_repeats if x is not None])
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


def _arm_bound(seen: set[str | None]) -> str | None:
    """One arm's bound over its repeats: exact (None) as soon as one repeat is exact (the
    values are equal, or the metric is not deterministic anyway) or the repeats disagree."""
    return next(iter(seen)) if len(seen) == 1 else None


def _methods_used(rows: list[Row]) -> dict[str, str]:
    """{method: its source} for the methods the rows used, plus Holm and TOST."""
    used = {r.method.split(" (")[0] for r in rows if r.method}
    return {
        name: src
        for name, src in verdicts.METHOD_SOURCES.items()
        if any(u.startswith(name) or name in u for u in used) or name in ("Holm", "TOST")
    }


def _tested(
    data: RunData,
    s: CompareSettings,
    cmp: Comparison,
    notes: list[str],
    suites: Mapping[str, Any] | None = None,
) -> Tested:
    """Every suite's rows before their verdicts, with their tests (:func:`_suite_rows`)."""
    tested: Tested = []
    for suite in data.suites:
        if suites is not None and suite in suites:
            obj, declared = suites[suite], dict(getattr(suites[suite], "metrics", {}) or {})
        else:
            obj, declared = suite_declarations(suite, notes)
        declared = _run_declarations(data, suite, obj, declared)
        tested += _suite_rows(data, s, cmp, suite, obj, declared)
    return tested


def look_decision(run_dir: str | os.PathLike, look_index: int) -> tuple[Any, int]:
    """The sequential rule at look ``look_index`` on the run folder as it is (the runner's look:
    the same rows, family and rule as the report, :func:`sequential_decision`). Returns (the
    LookDecision or None, the complete rounds); raises ValueError for a run folder whose config
    has no sequential schedule."""
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
    """The typed comparison of ``run_dir`` (writes nothing).

    run_dir: a run folder, or a :class:`RunData` already read (or built in memory, as
    tools/calibrate.py does). settings: None -> the run's own ``compare:`` section.
    suites: {suite name: suite object} to use instead of the registered suites (their
    ``metrics`` declarations and ``pair`` hook); suites not named are looked up as usual.
    Raises RunFolderError / SchemaTooNew for an unusable manifest (exit 2)."""
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
    tested = _tested(data, s, cmp, notes, suites)
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
    check_drift(data, cmp)
    aa_noise(cmp)
    cell_statuses(data, cmp)
    cmp.correctness_cells = correctness_cells(data)
    cmp.suite_rounds = {
        x: ("correctness" if x in data.correctness_only else data.rounds_of(x)) for x in data.suites
    }
    cmp.schedule = schedule_of(data)
    cmp.methods = _methods_used(cmp.rows)
    cmp.notes = notes
    return cmp


def compare_run(run_dir: str | os.PathLike, settings: CompareSettings | None = None) -> Comparison:
    """Build the comparison of ``run_dir`` and write ``RUN/compare.json``; returns it."""
    cmp = build_comparison(run_dir, settings)
    write_comparison(run_dir, cmp)
    return cmp
