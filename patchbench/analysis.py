"""Build the typed :class:`~patchbench.comparison.Comparison` of one run folder.

Reads the run folder only through :mod:`patchbench.runfolder`; asks each suite (through
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
import re
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from patchbench import runfolder, verdicts
from patchbench.comparison import CompareSettings, Comparison, Health, Row, write_comparison
from patchbench.runfolder import CellRecord, RunManifest, SuiteSummary
from patchbench.suite import MetricInfo, PairingRefused, unit_of


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


@dataclass
class RunData:
    """A run folder as the analysis reads it: manifest, cells, summaries (all typed)."""

    run_dir: Path
    manifest: RunManifest
    baseline: str
    variants: list[str]  # baseline first
    aa_variants: list[str]
    repeats: int
    suites: list[str]
    cells: dict[tuple[str, int], CellRecord | None]
    summaries: dict[tuple[str, int, str], SuiteSummary | None]
    notes: list[str] = field(default_factory=list)
    #: suite -> the timed rounds it ran in (``suites.<name>.rounds``; absent: every round)
    rounds: dict[str, list[int]] = field(default_factory=dict)
    #: suites that run only in the untimed correctness cells (``Suite.timed`` False): their one
    #: "repeat" (k = 0) is ``<variant>/correctness``
    correctness_only: list[str] = field(default_factory=list)
    #: variant -> its correctness cell (None: none ran)
    corr_cells: dict[str, CellRecord | None] = field(default_factory=dict)

    def rounds_of(self, suite: str) -> list[int]:
        """The repeat indices that hold ``suite``'s data ([0] for a correctness-only suite)."""
        if suite in self.correctness_only:
            return [0]
        return [k for k in self.rounds.get(suite, range(self.repeats)) if k < self.repeats]

    def _cell(self, v: str, k: int, suite: str | None = None) -> CellRecord | None:
        if suite is not None and suite in self.correctness_only:
            return self.corr_cells.get(v)
        return self.cells.get((v, k))

    def cell_status(self, v: str, k: int, suite: str | None = None) -> str:
        c = self._cell(v, k, suite)
        return "missing" if c is None else c.status

    def suite_status(self, v: str, k: int, suite: str) -> str:
        cs = self.cell_status(v, k, suite)
        if cs != "ok":
            return cs
        s = self.summaries.get((v, k, suite))
        return "missing" if s is None else s.status

    def timed(self, v: str, k: int, suite: str | None = None) -> bool:
        c = self._cell(v, k, suite)
        return c is None or (c.cell_kind == "timed" and not c.instrumented)

    def value(self, v: str, k: int, suite: str, metric: str) -> float | None:
        if self.suite_status(v, k, suite) != "ok":
            return None
        x = self.summaries[(v, k, suite)].metrics.get(metric)
        return None if x is None or not math.isfinite(x) else float(x)

    def bound(self, v: str, k: int, suite: str, metric: str) -> str | None:
        """ "lower" / "upper" when the suite marked the value as only a bound of the true value
        (``SuiteSummary.bounds``), None when exact or absent."""
        s = self.summaries.get((v, k, suite))
        return None if s is None else s.bounds.get(metric)

    def suite_dir(self, v: str, k: int, suite: str) -> Path:
        if suite in self.correctness_only:
            return self.run_dir / v / "correctness" / suite
        return self.run_dir / v / f"rep{k}" / suite


def _patch_label(p: object) -> str:
    if isinstance(p, dict):
        return f"diff:{p.get('diff')}" if p.get("diff") else str(p.get("name") or p)
    return str(p)


def variant_parts(raw: object) -> tuple[list[str], list[str], dict[str, str]]:
    """A variant as written in the manifest's config (a list of patches, or a mapping with
    ``patches``, ``server_args``, ``env``) as (patch labels, server args, env)."""
    if isinstance(raw, dict):
        return (
            [_patch_label(p) for p in raw.get("patches") or []],
            [str(a) for a in raw.get("server_args") or []],
            {str(k): str(v) for k, v in (raw.get("env") or {}).items()},
        )
    return [_patch_label(p) for p in raw or []], [], {}


def variant_identity(raw: object) -> tuple:
    """What makes two variants the same run (patches in order, arguments, environment): equal
    identities mean an A/A pair."""
    pats, args, env = variant_parts(raw)
    return tuple(pats), tuple(args), tuple(sorted(env.items()))


def read_run(run_dir: str | os.PathLike) -> RunData:
    """Read a run folder. Raises RunFolderError / SchemaTooNew (exit 2) for the manifest; a
    missing cell is status "missing", an unreadable one "unreadable" (the report still renders)."""
    run_dir = Path(run_dir)
    man = runfolder.read_manifest(run_dir)
    vcfg = man.variants
    variants = list(vcfg) or sorted({c.get("variant") for c in man.cells if c.get("variant")})
    if not variants:
        raise runfolder.RunFolderError(
            f"{run_dir / 'manifest.json'}: no variants in config.variants or cells"
        )
    baseline = man.baseline if man.baseline in variants else variants[0]
    variants = [baseline] + [v for v in variants if v != baseline]
    repeats = planned_repeats(man.config)
    for v in variants:
        for d in (run_dir / v).glob("rep*"):
            m = re.fullmatch(r"rep(\d+)", d.name)
            if m and d.is_dir():
                repeats = max(repeats, int(m.group(1)) + 1)
    suites = man.suites or sorted(
        {p.parent.name for v in variants for p in (run_dir / v).glob("rep*/*/summary.json")}
    )
    # A/A: what bench recorded (``variants[v].aa``), else the same patches, arguments and
    # environment in the config's variant mappings (man.variants keeps only the patches)
    raw = man.config.get("variants") if isinstance(man.config.get("variants"), dict) else {}
    recorded = (man.model_extra or {}).get("variants") or {}
    base = variant_identity(raw.get(baseline, vcfg.get(baseline)))
    aa = [
        v
        for v in variants[1:]
        if (
            recorded[v].get("aa") is True
            if isinstance(recorded.get(v), dict)
            else v in raw and variant_identity(raw[v]) == base
        )
    ]
    rounds, corr_only = suite_schedule(man, suites, repeats)
    cells, sums, notes, corr = {}, {}, [], {}
    for v in variants:
        cc = runfolder.read_cell(run_dir / v / "correctness", variant=v, repeat=0)
        corr[v] = cc
        if cc is not None:
            notes += cc.notes
        for s in corr_only:
            sm = runfolder.read_summary(run_dir / v / "correctness" / s, suite=s)
            sums[(v, 0, s)] = sm
            if sm is not None:
                notes += sm.notes
        for k in range(repeats):
            cdir = run_dir / v / f"rep{k}"
            c = runfolder.read_cell(cdir, variant=v, repeat=k)
            cells[(v, k)] = c
            if c is not None:
                notes += c.notes
            for s in suites:
                if s in corr_only or k not in rounds.get(s, range(repeats)):
                    continue
                sm = runfolder.read_summary(cdir / s, suite=s)
                sums[(v, k, s)] = sm
                if sm is not None:
                    notes += sm.notes
    return RunData(
        run_dir,
        man,
        baseline,
        variants,
        aa,
        repeats,
        suites,
        cells,
        sums,
        notes,
        rounds=rounds,
        correctness_only=corr_only,
        corr_cells=corr,
    )


def planned_repeats(config: dict) -> int:
    """The repeats a run's config plans: ``schedule.repeats`` when it is an integer, ``min``
    of a sequential schedule (``{min, max, step}``: the repeats that ran are found on disk);
    1 when absent or unreadable."""
    r = (config.get("schedule") or {}).get("repeats")
    if isinstance(r, dict):
        r = r.get("min")
    try:
        return max(1, int(r or 1))
    except (TypeError, ValueError):
        return 1


def suite_schedule(
    man: RunManifest, suites: list[str], repeats: int
) -> tuple[dict[str, list[int]], list[str]]:
    """({suite: the timed rounds it runs in, below ``repeats``}, [suites that run only in the
    correctness cells]). Read from the manifest's ``suite_rounds`` (written by ``bench``:
    round lists, or "correctness"), else from the config's ``suites.<name>.rounds`` and the
    suite's ``timed`` flag; a suite without either runs in every round."""
    from patchbench.schedule import resolve_rounds

    recorded = (man.model_extra or {}).get("suite_rounds") or {}
    cfg_suites = man.config.get("suites") or {}
    rounds: dict[str, list[int]] = {}
    corr: list[str] = []
    for s in suites:
        got = recorded.get(s)
        if got == "correctness" or (got is None and not _suite_timed(s)):
            corr.append(s)
            continue
        if isinstance(got, list):
            rounds[s] = [int(k) for k in got if int(k) < repeats]
        else:
            spec = (
                (cfg_suites.get(s) or {}).get("rounds")
                if isinstance(cfg_suites.get(s), dict)
                else None
            )
            rounds[s] = resolve_rounds(spec, repeats)
    return rounds, corr


def _suite_timed(name: str) -> bool:
    """The registered suite's ``timed`` flag (True for a suite that cannot be loaded)."""
    from patchbench import suite as suite_mod

    try:
        return bool(getattr(suite_mod.get_suite(name), "timed", True))
    except Exception:  # noqa: BLE001 - an unknown suite is read like a timed one
        return True


def settings_of(man: RunManifest, notes: list[str] | None = None) -> CompareSettings:
    """The run's ``compare:`` settings (defaults where absent). Keys this version no longer knows
    (e.g. an old folder's ``noise_floor_from``) are dropped with a note."""
    raw = dict(man.config.get("compare") or {})
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


def _suite_decl(name: str, notes: list[str]) -> tuple[Any | None, dict[str, MetricInfo]]:
    """(suite object or None, its metric declarations). Falls back to a module's ``METRICS``
    while a suite has not become a registered class."""
    from patchbench import suite as suite_mod

    try:
        obj = suite_mod.get_suite(name)
        return obj, dict(getattr(obj, "metrics", {}) or {})
    except KeyError:
        pass
    except Exception as e:  # noqa: BLE001 - a suite that fails to import must not hide the others
        notes.append(
            f"suite '{name}' could not be loaded ({type(e).__name__}: {e}); "
            "directions guessed from metric names"
        )
        return None, {}
    try:
        mod = suite_mod.load_suite(name)
        return None, dict(getattr(mod, "METRICS", None) or {})
    except Exception:  # noqa: BLE001
        notes.append(f"suite '{name}' is not a known suite; directions guessed from metric names")
        return None, {}


def _params(obj: Any, raw: dict) -> Any:
    from patchbench.schedule import ROUNDS_KEY

    raw = {k: v for k, v in (raw or {}).items() if k != ROUNDS_KEY}  # a core key
    model = getattr(obj, "Params", None)
    if model is None:
        return raw
    try:
        return model.model_validate(raw or {})
    except Exception:  # noqa: BLE001 - an old folder's params: the hook gets the raw dict
        return raw


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _pairs_for(data: RunData, obj: Any, suite: str, variant: str, cmp: Comparison) -> None:
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
    params = _params(obj, (data.manifest.config.get("suites") or {}).get(suite) or {})
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
        if vb is not None and vv is not None:
            if info.kind == "run" and not (
                data.timed(data.baseline, k, suite) and data.timed(variant, k, suite)
            ):
                where = "correctness" if suite in data.correctness_only else f"rep{k}"
                row.notes.append(f"{where}: an instrumented cell; its timings feed no verdict")
                continue
            pairs.append((vb, vv))
            for v in (data.baseline, variant):
                bounds[v].add(data.bound(v, k, suite, metric))
    row.baseline_value = _median([x for x in row.baseline_repeats if x is not None])
    row.variant_value = _median([x for x in row.variant_repeats if x is not None])
    row.n_pairs = len(pairs)
    b, v = [p[0] for p in pairs], [p[1] for p in pairs]
    margin = s.margin_for(suite, metric, info.margin)
    test: verdicts.Test | None = None
    if info.kind == "accuracy":
        acc = ((cmp.pairs.get(suite) or {}).get(variant) or {}).get("accuracy", {}).get(metric)
        row.change_unit = "pt"
        if acc and acc.get("baseline") is not None:
            test = verdicts.accuracy_test(acc["baseline"], acc["variant"])
            row.n_pairs = len(acc["baseline"])
            row.baseline_value = (
                sum(acc["baseline"]) / len(acc["baseline"]) if acc["baseline"] else None
            )
            row.variant_value = (
                sum(acc["variant"]) / len(acc["variant"]) if acc["variant"] else None
            )
        elif suite in cmp.refusals and variant in cmp.refusals[suite]:
            row.notes.append(f"pairing refused: {cmp.refusals[suite][variant]}")
        else:
            row.notes.append("the suite's pair hook gave no per-question correctness: no interval")
    elif info.kind == "deterministic":
        row.change_unit = info.unit or ""
        row.baseline_bound = _arm_bound(bounds[data.baseline])
        row.variant_bound = _arm_bound(bounds[variant])
        test = verdicts.deterministic_test(b, v, row.baseline_bound, row.variant_bound)
        row.notes.extend(test.notes)
    elif info.kind == "run":
        if b and (min(b) <= 0 or min(v) <= 0):
            row.change_unit = info.unit or ""
            row.notes.append("values <= 0: no log ratio; compared as differences, descriptive")
        else:
            test = verdicts.run_test(b, v, s.min_repeats)
    if test is not None:
        row.method = test.method
        if test.reason:
            row.notes.append(test.reason)
    row.margin = margin
    desc = (((cmp.pairs.get(suite) or {}).get(variant) or {}).get("descriptive") or {}).get(metric)
    rp = ((cmp.pairs.get(suite) or {}).get(variant) or {}).get("request_pairing")
    if desc is not None and s.within_cell_intervals:
        if rp is not None and not rp.get("ok", False):
            row.notes.append(
                f"requests do not pair by index ({rp.get('reason')}): no request-level interval"
            )
        else:
            row.descriptive = dict(
                desc,
                label="descriptive only: requests within one cell, not run-to-run; never a verdict",
            )
    if bad and info.kind != "accuracy":
        row.notes.append("incomplete cells: " + "; ".join(bad))
        row.verdict = "incomplete"
    return row, test


def _arm_bound(seen: set[str | None]) -> str | None:
    """One arm's bound over its repeats: exact (None) as soon as one repeat is exact (the
    values are equal, or the metric is not deterministic anyway) or the repeats disagree."""
    return next(iter(seen)) if len(seen) == 1 else None


def _scale(test: verdicts.Test, x: float) -> float:
    return 100.0 * x if test.scale == "ratio" or test.method.startswith("Newcombe") else x


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
    alpha = 1 - s.confidence
    tested: list[tuple[Row, verdicts.Test | None]] = []
    for suite in data.suites:
        if suites is not None and suite in suites:
            obj = suites[suite]
            declared = dict(getattr(obj, "metrics", {}) or {})
        else:
            obj, declared = _suite_decl(suite, notes)
        seen: list[str] = []
        for (_v, _k, x), sm in data.summaries.items():
            if x == suite and sm is not None:
                seen += [m for m in sm.metrics if m not in seen]
        metrics = [(m, i, True) for m, i in declared.items() if m in seen or i.kind == "accuracy"]
        metrics += [(m, guess_metric_info(m), False) for m in seen if m not in declared]
        for v in data.variants[1:]:
            _pairs_for(data, obj, suite, v, cmp)
        for m, info, dec in metrics:
            if (
                info.kind == "accuracy"
                and m not in seen
                and not any(
                    m in ((cmp.pairs.get(suite) or {}).get(v) or {}).get("accuracy", {})
                    for v in data.variants[1:]
                )
            ):
                continue
            for v in data.variants[1:]:
                row, test = _row(data, s, cmp, suite, m, info, dec, v)
                tested.append((row, test))
    # Holm across each variant's testable primaries
    for v in data.variants[1:]:
        fam = [
            (r, t)
            for r, t in tested
            if r.variant == v
            and r.primary
            and r.verdict != "incomplete"
            and t is not None
            and t.p is not None
            and r.kind != "deterministic"
        ]
        _, used = verdicts.holm_alphas([t.p for _, t in fam], alpha)
        for (r, _), a in zip(fam, used, strict=False):
            r.confidence = 1 - a
    for row, test in tested:
        if row.confidence is None:
            row.confidence = s.confidence
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
            cmp.rows.append(row)
            continue
        equiv = None
        if row.kind == "deterministic":
            equiv = test.interval(a) == (0, 0)
        elif row.margin is not None:
            if row.kind == "run":
                both = [
                    (x, y)
                    for x, y in zip(row.baseline_repeats, row.variant_repeats, strict=True)
                    if x is not None and y is not None
                ]
                b, w = [x for x, _ in both], [y for _, y in both]
                equiv = verdicts.tost_log_ratio(b, w, row.margin, a)[1] if len(b) >= 2 else False
            elif row.kind == "accuracy":
                equiv = verdicts.tost_from_interval(test, row.margin, a)
        v_, iv, within = verdicts.verdict(
            test,
            better=row.better,
            alpha=a,
            margin=row.margin if row.kind != "deterministic" else None,
            equivalent=equiv,
        )
        if row.kind == "deterministic":
            row.method = "exact (deterministic)"
            row.confidence = None
            within = False
        if iv is not None and row.kind != "deterministic":
            row.low, row.high = _scale(test, iv[0]), _scale(test, iv[1])
        row.within_margin = within and v_ in ("improved", "regressed")
        if row.verdict != "incomplete":
            row.verdict = v_
        cmp.rows.append(row)
    # A/A health check
    bad = [r for r in cmp.rows if r.aa and r.primary and r.verdict in ("improved", "regressed")]
    cmp.health = Health(ok=not bad, aa_variants=data.aa_variants)
    if bad:
        what = ", ".join(f"{r.variant} {r.metric} {r.verdict}" for r in bad)
        cmp.health.notes.append(
            f"A/A check failed ({what}): the machine was too noisy for this "
            "run; every verdict is downgraded to inconclusive"
        )
        for r in cmp.rows:
            if r.verdict in ("improved", "regressed", "equivalent"):
                r.verdict_before_health, r.verdict = r.verdict, "inconclusive"
                r.notes.append(f"was {r.verdict_before_health} before the A/A check failed")
    # cells, warnings, schedule
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
    # correctness cells (untimed: instrumented and untimed suites) and the per-suite schedule
    cmp.correctness_cells = [
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
    cmp.suite_rounds = {
        x: ("correctness" if x in data.correctness_only else data.rounds_of(x)) for x in data.suites
    }
    for pos, c in enumerate(data.manifest.cells):
        if c.get("cell_kind") == "correctness":
            continue
        key = (c.get("variant"), int(c.get("repeat", 0) or 0))
        cmp.schedule.append(
            {
                "variant": key[0],
                "repeat": key[1],
                "position": pos,
                "status": data.cell_status(*key) if key in data.cells else c.get("status"),
            }
        )
    used = {r.method.split(" (")[0] for r in cmp.rows if r.method}
    for name, src in verdicts.METHOD_SOURCES.items():
        if any(u.startswith(name) or name in u for u in used) or name in ("Holm", "TOST"):
            cmp.methods[name] = src
    cmp.notes = notes
    return cmp


def compare_run(run_dir: str | os.PathLike, settings: CompareSettings | None = None) -> Comparison:
    """Build the comparison of ``run_dir`` and write ``RUN/compare.json``; returns it."""
    cmp = build_comparison(run_dir, settings)
    write_comparison(run_dir, cmp)
    return cmp
