"""The report's one family of primaries and the design that decides it: each row's verdict
from its test (:func:`judge`) at a Holm-adjusted level (fixed design) or by the group-sequential
rule replayed on the run's rows (:func:`sequential_verdicts`)."""

from __future__ import annotations

import math
from typing import Any

from patchbench.analysis import verdicts
from patchbench.analysis.comparison import CompareSettings, Comparison, DesignSummary, Row
from patchbench.analysis.rundata import RunData
from patchbench.runfolder import resume_command


def _scale(test: verdicts.Test, x: float) -> float:
    """A test's estimate or bound as the row shows it: percent for ratios and accuracy."""
    acc = test.method.startswith(("Newcombe", "paired t on per-question"))
    return 100.0 * x if test.scale == "ratio" or acc else x


#: the kinds of primary the report's alpha covers (tested with a sampling error)
FAMILY_KINDS = ("run", "accuracy")

#: rows with their tests (None: untestable), in row order
Tested = list[tuple[Row, "verdicts.Test | None"]]


def primary_family(tested: Tested, aa_variants: list[str]) -> Tested:
    """The family, in row order: every primary of a :data:`FAMILY_KINDS` kind of every non-A/A
    variant (incomplete and untestable members count with p = 1), except a row whose test may
    never decide (``Test.undecided``, e.g. accuracy in one run per arm: it spends no alpha)."""
    aa = set(aa_variants)
    return [
        (r, t)
        for r, t in tested
        if r.primary
        and r.variant not in aa
        and r.kind in FAMILY_KINDS
        and not (t is not None and t.undecided)
    ]


def _p_in_family(row: Row, test: verdicts.Test | None) -> float:
    """A member's p-value in the family: 1 for an incomplete or untestable one."""
    if row.verdict == "incomplete" or test is None or test.p is None:
        return 1.0
    return test.p


def holm_levels(family: Tested, alpha: float) -> None:
    """Set each tested member's confidence to its Holm-adjusted level (family level 1 - alpha)."""
    _, used = verdicts.holm_alphas([_p_in_family(r, t) for r, t in family], alpha)
    for (r, t), a in zip(family, used, strict=True):
        if t is not None and t.p is not None:
            r.confidence = 1 - a


def _equivalent(row: Row, test: verdicts.Test, alpha: float) -> bool | None:
    """Exactly nil for a count, else TOST within ``row.margin`` (None: no margin)."""
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


def judge(row: Row, test: verdicts.Test | None, confidence: float) -> None:
    """Set the row's p, change, interval and verdict from its test at its own confidence (else
    ``confidence``); "incomplete" stays."""
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
                "have the suite name the test that proves it)"
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
    m = data.manifest
    return resume_command(data.run_dir, m.config_path, m.port)


def design_of(data: RunData, s: CompareSettings) -> tuple[DesignSummary, Any]:
    """(the design summary, the sequential Design or None) of the run's schedule at the
    confidence of ``s``."""
    cfg = data.manifest.config
    alpha = round(1.0 - s.confidence, 12)
    if cfg is not None and cfg.schedule.sequential is not None:
        from patchbench.analysis.sequential import Design

        d = Design.of(cfg.schedule.sequential, s.confidence)
        looks = list(d.looks)
        summary = DesignSummary(
            kind="sequential", alpha=alpha, looks=looks, boundary=d.kind, planned=looks[-1]
        )
        return summary, d
    rep = cfg.schedule.repeats if cfg is not None else None
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


def fixed_finished(data: RunData, cmp: Comparison, family: Tested) -> None:
    """A fixed design is partial (decides nothing) until every planned round's cells exist."""
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


def withheld(data: RunData, row: Row) -> bool:
    """Whether the suite left a value of the row out on purpose (:meth:`RunData.not_judged`)."""
    arms = ((data.baseline, row.baseline_repeats), (row.variant, row.variant_repeats))
    return any(
        x is None and data.not_judged(v, k, row.suite, row.metric)
        for v, xs in arms
        for k, x in zip(data.rounds_of(row.suite), xs, strict=False)
    )


def _key(row: Row) -> tuple[str, str]:
    return row.variant, f"{row.suite}.{row.metric}"


def _series(data: RunData, tested: Tested) -> tuple[dict[tuple[str, str], list[float]], int]:
    """({key: log ratios per round} of the primaries that grow with the looks, A/A included;
    the leading rounds in which all of them pair)."""
    out: dict[tuple[str, str], list[float]] = {}
    complete = data.repeats
    for r, _ in tested:
        if not (r.primary and _grows(data, r)) or withheld(data, r):
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
    data: RunData, tested: Tested, design: Any, upto: int | None = None
) -> tuple[Any, dict[tuple[str, str], list[float]], int]:
    """:func:`patchbench.analysis.sequential.replay` on the run's rows up to look ``upto``
    (None: all the complete rounds reach). Returns (the LookDecision or None before the first
    look, {(variant, "suite.metric"): log ratios}, the complete rounds)."""
    from patchbench.analysis.sequential import FixedTest, replay

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
        ratios, margins, design=design, better=better, controls=data.aa_variants, fixed=fixed
    )
    return dec, series, complete


def sequential_verdicts(data: RunData, cmp: Comparison, tested: Tested, design: Any) -> None:
    """The primaries' verdicts, intervals and levels from :func:`sequential_decision`; the run
    is partial when the rule had not stopped."""
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
    d.decide_on = sorted({k[1] for k in series if design.decide_on and design.deciding(k[1])})
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
            lo_b, hi_b = verdicts.margin_bounds(t, r.margin)
            r.within_margin = lo_b < r.low / 100.0 and r.high / 100.0 < hi_b
    if d.partial:
        _partial_rows(cmp, family, d.partial)
