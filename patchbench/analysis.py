"""Build the typed :class:`~patchbench.comparison.Comparison` of one run folder.

Reads the run folder as :class:`~patchbench.rundata.RunData`; asks each suite (through
:func:`patchbench.suite.get_suite`) for its metric declarations (:class:`MetricInfo`: direction,
kind, primary, margin) and its ``pair`` hook; applies the rules of :mod:`patchbench.verdicts`.
Names no suite.

What a suite's ``pair`` hook may return besides its own keys (docs/CONTRACTS.md, "Pair hook"):

- ``"accuracy": {metric: {"ids": [...], "baseline": [c_i], "variant": [c_i]}}``: per-question
  correctness in [0, 1] averaged over the paired repeats, for each metric of kind "accuracy";
- ``"descriptive": {metric: {"change_pct", "low_pct", "high_pct", "method"}}``: request-level
  intervals inside one cell (shown as descriptive, never a verdict);
- ``"request_pairing": {"ok": bool, "reason": str}``: whether requests pair by index (same prompt
  at each index); descriptive intervals are dropped when it is not ok.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from patchbench import verdicts
from patchbench.comparison import (
    AANoise,
    CompareSettings,
    Comparison,
    DesignSummary,
    Drift,
    Health,
    Row,
    write_comparison,
)
from patchbench.rundata import RunData, read_run
from patchbench.runfolder import RunManifest
from patchbench.suite import MetricInfo, PairingRefused, Suite, get_suite, unit_of


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
    """The run's ``compare:`` settings (defaults where absent). Keys :class:`CompareSettings` does
    not define (e.g. ``noise_floor_from`` in a folder written by an earlier version) are dropped
    with a line in ``notes``; invalid settings give the defaults, with a line."""
    raw = dict(man.config.compare) if man.config is not None else {}
    known = set(CompareSettings.model_fields)
    dropped = sorted(k for k in raw if k not in known)
    if dropped and notes is not None:
        notes.append(f"compare settings {', '.join(dropped)} are no longer used and were ignored")
    try:
        return CompareSettings.model_validate({k: v for k, v in raw.items() if k in known})
    except ValidationError as e:
        if notes is not None:
            notes.append(
                f"compare settings of the manifest are invalid ({e.errors()[0]['msg']}); defaults used"
            )
        return CompareSettings()


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
    ``Params`` (scripts/calibrate.py's in-memory suites) or for a section that model refuses (a
    run folder written by another patchbench version)."""
    from patchbench.schedule import ROUNDS_KEY

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
    a summary holds or (kind "accuracy") that a variant's pair gave, in declaration order; then
    the undeclared metrics the summaries hold, in the order first seen, info guessed from the
    name. Reads ``cmp.pairs``: call after the pair hooks."""
    seen: list[str] = []
    for (_v, _k, x), sm in data.summaries.items():
        if x == suite and sm is not None:
            seen += [m for m in sm.metrics if m not in seen]
    out = [
        (m, i, True)
        for m, i in declared.items()
        if m in seen
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
                bad.append(f"{v}/rep{k}: {'no value' if st == 'ok' else st}")
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
    "incomplete" (except accuracy, whose questions pair across the cells that ran)."""
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
    if bad and info.kind != "accuracy":
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


def _scale(test: verdicts.Test, x: float) -> float:
    acc = test.method.startswith(("Newcombe", "paired t on per-question"))
    return 100.0 * x if test.scale == "ratio" or acc else x


#: the kinds of primary the report's alpha covers (tested with a sampling error)
FAMILY_KINDS = ("run", "accuracy")

Tested = list[tuple[Row, "verdicts.Test | None"]]


def primary_family(tested: Tested, aa_variants: list[str]) -> Tested:
    """The report's family of primaries, in row order: every primary of every variant but the
    A/A ones whose kind is tested with a sampling error (:data:`FAMILY_KINDS`). Incomplete and
    untestable members keep their place (they count in the family with p = 1 and are never
    rejected), so a missing value never gives the others a laxer level. Deterministic primaries
    are compared exactly (no sampling error to control); A/A variants are measurements
    (docs/design.md). Both designs take their family from here: Holm over it for a fixed design
    (:func:`_holm_levels`), the group-sequential Holm shares for a sequential one
    (:func:`sequential_decision`). Add a kind of primary here to put it under the report's
    alpha."""
    aa = set(aa_variants)
    return [
        (r, t) for r, t in tested if r.primary and r.variant not in aa and r.kind in FAMILY_KINDS
    ]


def _p_in_family(row: Row, test: verdicts.Test | None) -> float:
    """A member's p-value in the family: 1 for an incomplete or untestable one."""
    if row.verdict == "incomplete" or test is None or test.p is None:
        return 1.0
    return test.p


def _holm_levels(family: Tested, alpha: float) -> None:
    """Set the confidence of each tested member of the family (:func:`primary_family`) to the
    Holm-adjusted level its verdict uses: one family per report at level ``1 - alpha``."""
    _, used = verdicts.holm_alphas([_p_in_family(r, t) for r, t in family], alpha)
    for (r, t), a in zip(family, used, strict=True):
        if t is not None and t.p is not None:
            r.confidence = 1 - a


def _equivalent(row: Row, test: verdicts.Test, alpha: float) -> bool | None:
    """Whether the row's change is practically nil: exactly for a deterministic row, by TOST
    within ``row.margin`` otherwise (None: no margin, no equivalence verdict)."""
    if row.kind == "deterministic":
        return test.interval(alpha) == (0, 0)
    if row.margin is None:
        return None
    if row.kind == "run":
        both = [
            (x, y)
            for x, y in zip(row.baseline_repeats, row.variant_repeats, strict=True)
            if x is not None and y is not None
        ]
        b, w = [x for x, _ in both], [y for _, y in both]
        return verdicts.tost_log_ratio(b, w, row.margin, alpha)[1] if len(b) >= 2 else False
    if row.kind == "accuracy":
        return verdicts.tost_from_interval(test, row.margin, alpha)
    return None


def _judge(row: Row, test: verdicts.Test | None, confidence: float) -> None:
    """Set the row's p value, change, interval and verdict from its test, at its own confidence
    (Holm-adjusted for primaries) or ``confidence``. Without a test, a p value or a direction
    the row is "inconclusive"; an "incomplete" row keeps that verdict."""
    if row.confidence is None:
        row.confidence = confidence
    a = 1 - row.confidence
    if test is not None:
        row.p_value = test.p
        if test.estimate is not None:
            row.change = _scale(test, test.estimate)
    if test is None or test.p is None or row.kind == "descriptive" or row.better == "none":
        if row.verdict != "incomplete":
            row.verdict = "inconclusive"
        if test is not None and test.interval is not None and test.p is not None:
            lo, hi = test.interval(a)
            row.low, row.high = _scale(test, lo), _scale(test, hi)
        return
    det = row.kind == "deterministic"
    v_, iv, within = verdicts.verdict(
        test,
        better=row.better,
        alpha=a,
        margin=None if det else row.margin,
        equivalent=_equivalent(row, test, a),
    )
    if det:
        row.method = "exact (deterministic)"
        if not row.exact_by:
            row.method = "exact comparison of one measurement per arm"
            row.notes.append(
                "one measurement per arm: not shown deterministic (measure it in two rounds, or "
                "the suite names a test that proves it, MetricInfo.deterministic_by)"
            )
        row.confidence = None
        within = False
    elif iv is not None:
        row.low, row.high = _scale(test, iv[0]), _scale(test, iv[1])
    row.within_margin = within and v_ in ("improved", "regressed")
    if row.verdict != "incomplete":
        row.verdict = v_


# ---------------------------------------------------------------- the design that decides


def _resume_cmd(data: RunData) -> str:
    cfg = data.manifest.config_path or "CONFIG"
    return f"patchbench bench {cfg} --resume {data.run_dir}"


def _design(data: RunData, s: CompareSettings) -> tuple[DesignSummary, Any]:
    """(the design summary, the patchbench.sequential.Design of a sequential schedule or None)
    from the run's config (``schedule.repeats``: a count or ``{min, max, step}``) and the
    confidence of ``s`` (alpha per report)."""
    from patchbench.runfolder.models import SequentialSnapshot

    cfg = data.manifest.config
    rep = cfg.schedule.repeats if cfg is not None else None
    alpha = round(1.0 - s.confidence, 12)
    if isinstance(rep, SequentialSnapshot) and rep.min and rep.max:
        from patchbench.sequential import FUTILITY, Design, looks_from_schedule

        looks = looks_from_schedule(rep.min, rep.max, rep.step or 2)
        futility = FUTILITY if rep.futility is None else rep.futility
        d = Design(looks=looks, alpha=alpha, kind=rep.boundary or "pocock", futility=futility)
        summary = DesignSummary(
            kind="sequential", alpha=alpha, looks=list(looks), boundary=d.kind, planned=looks[-1]
        )
        return summary, d
    planned = rep if isinstance(rep, int) and data.manifest.cells else None
    return DesignSummary(kind="fixed", alpha=alpha, planned=planned), None


def _partial_rows(cmp: Comparison, family: Tested, why: str) -> None:
    """A partial run: every decided member of the family becomes inconclusive, with ``why``."""
    for r, _ in family:
        r.notes.append(f"partial run: {why}")
        if r.verdict in ("improved", "regressed", "equivalent"):
            r.verdict_before_health = None
            r.verdict = "inconclusive"
            r.within_margin = False


def _fixed_finished(data: RunData, cmp: Comparison, family: Tested) -> None:
    """A fixed design is finished when every planned round's timed cells exist (a failed cell is
    finished: its rows are incomplete); else the run is partial and its family decides
    nothing."""
    d = cmp.design
    d.split = (
        f"Holm (1979) step-down over the {d.family} primaries of the non-A/A variants "
        "(one family per report)"
    )
    d.rounds = data.repeats
    if d.planned is None:
        return
    missing = [
        k
        for k in range(d.planned)
        if any(data.cell_status(v, k) == "missing" for v in data.variants)
    ]
    d.rounds = d.planned - len(missing)
    if not missing:
        return
    d.partial = (
        f"{len(missing)} of the {d.planned} planned rounds did not run "
        f"(round(s) {', '.join(str(k) for k in missing[:6])}{' ...' if len(missing) > 6 else ''})"
        "; no verdict is decisive until they have"
    )
    d.resume = _resume_cmd(data)
    _partial_rows(cmp, family, d.partial)


def _grows(data: RunData, row: Row) -> bool:
    """A run-level primary measured in every timed round: the sequential looks add to it."""
    return (
        row.kind == "run"
        and row.suite not in data.correctness_only
        and data.rounds_of(row.suite) == list(range(data.repeats))
    )


def _key(row: Row) -> tuple[str, str]:
    return row.variant, f"{row.suite}.{row.metric}"


def _series(data: RunData, tested: Tested) -> tuple[dict[tuple[str, str], list[float]], int]:
    """({key: log ratios per round} of the run-level primaries that grow with the looks, of every
    variant A/A included; the number of leading rounds in which every one of them pairs)."""
    out: dict[tuple[str, str], list[float]] = {}
    complete = data.repeats
    for r, _ in tested:
        if not (r.primary and _grows(data, r)):
            continue
        xs: list[float] = []
        for b, v in zip(r.baseline_repeats, r.variant_repeats, strict=True):
            if b is None or v is None or b <= 0 or v <= 0:
                break
            xs.append(math.log(v / b))
        out[_key(r)] = xs
        complete = min(complete, len(xs))
    return out, complete


def sequential_decision(
    data: RunData,
    tested: Tested,
    design: Any,
    upto: int | None = None,
) -> tuple[Any, dict[tuple[str, str], list[float]], int]:
    """The sequential rule (patchbench.sequential.replay) on a run's rows: the family of
    :func:`primary_family` (run-level primaries measured every round grow with the looks; the
    others, e.g. accuracy, are one-look tests of the family, an incomplete one with p = 1),
    the A/A variants' growing primaries as controls (measured, never in the family).

    upto: the last look to use (the runner's look; None: every look the complete rounds reach).
    Returns (the LookDecision, or None when the complete rounds do not reach the first look;
    {key: log ratios}; the complete rounds). Keys are (variant, "suite.metric")."""
    from patchbench.sequential import FixedTest, replay

    series, complete = _series(data, tested)
    n = complete if upto is None else min(complete, design.looks[upto])
    ratios: dict[str, dict[str, list[float]]] = {}
    for (v, m), xs in series.items():
        ratios.setdefault(v, {})[m] = xs[:n]
    margins: dict[str, float] = {}
    better: dict[str, str] = {}
    fixed: dict[str, dict[str, FixedTest]] = {}
    for r, _ in tested:
        if not r.primary:
            continue
        m = _key(r)[1]
        better[m] = r.better
        if r.kind == "run" and r.margin is not None:
            margins[m] = math.log1p(r.margin / 100.0)
    for r, t in primary_family(tested, data.aa_variants):
        if _key(r) in series:
            continue
        ok = r.verdict != "incomplete" and t is not None and t.p is not None
        eq = None
        if ok and r.margin is not None:

            def eq(level: float, _r=r, _t=t) -> bool:
                return bool(_equivalent(_r, _t, level))

        fixed.setdefault(r.variant, {})[_key(r)[1]] = FixedTest(
            p=_p_in_family(r, t),
            estimate=float(t.estimate) if ok and t.estimate is not None else 0.0,
            n=r.n_pairs,
            equivalent=eq,
        )
    if n < design.looks[0]:
        return None, series, complete
    dec = replay(
        ratios,
        margins,
        design=design,
        better=better,
        controls=data.aa_variants,
        fixed=fixed,
    )
    return dec, series, complete


def _sequential(data: RunData, cmp: Comparison, tested: Tested, design: Any) -> None:
    """Set the primaries' verdicts, intervals and levels from the sequential rule
    (:func:`sequential_decision`); the run is partial when the rule had not stopped."""
    from patchbench import stats

    d = cmp.design
    family = primary_family(tested, data.aa_variants)
    d.split = (
        f"group-sequential Holm over the {d.family} primaries of the non-A/A variants (one "
        f"family per report): an open primary is tested at the {design.kind} boundary for "
        "alpha / (m - r), r the primaries rejected so far (Ye, Li, Jiang and Wang 2013); "
        "accuracy and other one-look primaries take their whole share"
    )
    dec, series, complete = sequential_decision(data, tested, design)
    d.rounds = complete
    if dec is None:
        d.partial = (
            f"{complete} complete round(s): the sequential rule looks first after "
            f"{design.looks[0]}; it has not decided"
        )
    elif not dec.stop:
        d.partial = (
            f"stopped after {complete} complete round(s), before the sequential rule decided "
            f"(look {dec.look_index + 1} of {len(design.looks)}: {dec.reason})"
        )
    else:
        d.stopped_after = dec.n_repeats
        d.stop_reason = dec.reason
    if d.partial:
        d.resume = _resume_cmd(data)
    tests = {_key(r): (r, t) for r, t in tested if r.primary}
    for key, md in dec.metrics.items() if dec is not None else []:
        r, t = tests[key]
        grows = key in series
        level = md.level
        if level is None:
            level = design.level(md.look if md.look is not None else dec.look_index, design.alpha)
        if md.decision == "equivalent":
            level = 2 * level  # TOST at ``level`` each side: the (1 - 2 level) interval
        r.confidence = 1 - level
        r.p_value = md.p_value
        if grows:
            st = stats.paired_t(series[key][: md.n])
            lo, hi = st.interval(level)
            r.change = md.change_pct
            r.low, r.high = 100.0 * math.expm1(lo), 100.0 * math.expm1(hi)
            r.n_pairs = md.n
        elif t is not None and t.interval is not None and t.p is not None:
            lo, hi = t.interval(level)
            r.low, r.high = _scale(t, lo), _scale(t, hi)
        where = f"look {md.look + 1}" if md.look is not None else f"look {dec.look_index + 1}"
        r.notes.append(f"sequential rule ({where} of {len(design.looks)}): {md.reason}")
        if r.verdict == "incomplete" or d.partial:
            continue
        v = md.decision if md.decision in ("improved", "regressed", "equivalent") else None
        r.verdict = v or "inconclusive"
        r.decided_after = design.looks[md.look] if v and md.look is not None else None
        r.within_margin = False
        if v in ("improved", "regressed") and r.margin is not None and t is not None:
            lo_b, hi_b = verdicts._margin_bounds(t, r.margin)
            r.within_margin = lo_b < r.low / 100.0 and r.high / 100.0 < hi_b
    if d.partial:
        _partial_rows(cmp, family, d.partial)


#: the level of the drift test (a trend of the baseline's values across rounds)
DRIFT_ALPHA = 0.01


def _drift(data: RunData, cmp: Comparison) -> None:
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


def _aa_check(cmp: Comparison) -> None:
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


def _cells(data: RunData, cmp: Comparison) -> None:
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


def _correctness_cells(data: RunData) -> list[dict[str, Any]]:
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


def _schedule(data: RunData) -> list[dict[str, Any]]:
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
    _, design = _design(data, s)
    if design is None:
        raise ValueError(f"{run_dir}: not a sequential schedule")
    for row, test in tested:
        _judge(row, test, s.confidence)
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
    scripts/calibrate.py does). settings: None -> the run's own ``compare:`` section.
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
    cmp.design, design = _design(data, s)
    cmp.design.family = len(family)
    if design is None:
        _holm_levels(family, cmp.design.alpha)
    for row, test in tested:
        _judge(row, test, s.confidence)
        cmp.rows.append(row)
    if design is None:
        _fixed_finished(data, cmp, family)
    else:
        _sequential(data, cmp, tested, design)
    _drift(data, cmp)
    _aa_check(cmp)
    _cells(data, cmp)
    cmp.correctness_cells = _correctness_cells(data)
    cmp.suite_rounds = {
        x: ("correctness" if x in data.correctness_only else data.rounds_of(x)) for x in data.suites
    }
    cmp.schedule = _schedule(data)
    cmp.methods = _methods_used(cmp.rows)
    cmp.notes = notes
    return cmp


def compare_run(run_dir: str | os.PathLike, settings: CompareSettings | None = None) -> Comparison:
    """Build the comparison of ``run_dir`` and write ``RUN/compare.json``; returns it."""
    cmp = build_comparison(run_dir, settings)
    write_comparison(run_dir, cmp)
    return cmp
