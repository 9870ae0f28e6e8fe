"""What ran and how healthy it was, beside the verdicts (drift, A/A noise, cells, schedule,
failures, the run's header), filled into a judged Comparison."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from patchbench import runfolder
from patchbench.analysis.comparison import (
    AANoise,
    Affected,
    BuildInfo,
    ChangedFiles,
    Comparison,
    Drift,
    FailedCell,
    FileNames,
    Health,
    RunInfo,
    VariantInfo,
)
from patchbench.analysis.rundata import RunData
from patchbench.config import patch_label, sglang_label
from patchbench.runfolder.models import PatchHash

#: the level of the drift test (a trend of the baseline's values across rounds)
DRIFT_ALPHA = 0.01


def check_drift(data: RunData, cmp: Comparison) -> None:
    """Test the baseline's values of every run-level primary for a trend across rounds (log
    value on the round index, at :data:`DRIFT_ALPHA`). Under ``order: sequential`` a drift found
    makes that metric's decided verdicts inconclusive (interleaving balances it)."""
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
    """The A/A variants as a measurement (:class:`AANoise` per run-level primary). An A/A row
    that came out improved or regressed is noted in ``cmp.health`` and made inconclusive."""
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
        assumed = cmp.settings.margin_for(r.suite, r.metric, None, "assumed_cv")
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


def _server_log(data: RunData, v: str, k: int) -> dict[str, dict[str, Any]]:
    """{suite: its server-log scan} of cell (v, k) where the server logged retractions or OOM."""
    from patchbench.run.logscan import scan_of

    out = {}
    for suite in data.suites:
        sm = data.summaries.get((v, k, suite)) if suite not in data.correctness_only else None
        scan = scan_of(sm.meta) if sm is not None else None
        if scan is not None and (scan.retractions_count or scan.oom_count):
            out[suite] = {
                "retractions": scan.retractions_count,
                "retracted_requests": scan.retracted_requests_count,
                "oom": scan.oom_count,
                "first": (scan.first_lines or [""])[0],
            }
    return out


def cell_statuses(data: RunData, cmp: Comparison) -> None:
    """``cmp.cells`` (variant order, then repeat) and ``cmp.cell_warnings``: each suite's
    warnings, errors and missing summaries per cell."""
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
                "gpu": list(c.gpu.flags) if c is not None and c.gpu is not None else None,
                "server_log": _server_log(data, v, k),
                "seconds": c.timings_s.get("cell") if c else None,
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


def _cells_text(labels: list[str]) -> str:
    """ "a/rep0, b/rep1" (the first three, then how many more)."""
    more = f" and {len(labels) - 3} more" if len(labels) > 3 else ""
    return ", ".join(labels[:3]) + more


def gpu_warnings(data: RunData) -> list[str]:
    """One sentence each when the timed cells ran on different GPUs (by the NVML UUIDs of the
    GPUs each used, cell.json ``gpu.devices``), and per GPU that ran with different power limits
    or application clocks in different cells; [] when they agree or no cell recorded its GPUs
    (a CPU run, a cell.json from before they were recorded)."""
    on: dict[tuple[str, ...], list[str]] = {}
    settings: dict[str, dict[str, list[str]]] = {}
    for (v, k), c in sorted(data.cells.items(), key=lambda x: (x[0][1], x[0][0])):
        devs = c.gpu.devices if c is not None and c.gpu is not None else []
        ids = tuple(d.uuid or f"GPU {d.index}" for d in devs)
        for i, d in zip(ids, devs, strict=True):
            settings.setdefault(i, {}).setdefault(d.settings(), []).append(f"{v}/rep{k}")
        if ids:
            on.setdefault(ids, []).append(f"{v}/rep{k}")
    out = []
    if len(on) > 1:
        where = "; ".join(f"{_cells_text(c)} on {', '.join(i)}" for i, c in on.items())
        out.append(
            f"the timed cells ran on different GPUs ({where}): GPUs of one model differ by "
            "several percent, so speed rows compare GPUs as much as the change; pin the run to "
            "one GPU (CUDA_VISIBLE_DEVICES)"
        )
    for i, by in settings.items():
        if len(by) > 1:
            how = "; ".join(f"{s} in {_cells_text(c)}" for s, c in by.items())
            out.append(
                f"{i} ran with different power limits or application clocks ({how}): speed "
                "rows compare the settings as much as the change; keep them fixed during a run"
            )
    return out


def correctness_cells(data: RunData) -> list[dict[str, Any]]:
    """The untimed correctness cells that ran."""
    return [
        {
            "variant": v,
            "dir": f"{v}/correctness",
            "status": c.status,
            "error": c.error,
            "suites": dict(c.suites),
            "instrumented": c.instrumented,
            "instrumentation": sorted(c.instrumentation),
            "seconds": c.timings_s.get("cell"),
        }
        for v, c in data.corr_cells.items()
        if c is not None
    ]


def schedule_of(data: RunData) -> list[dict[str, Any]]:
    """The timed cells in the order the manifest lists them (the order they ran)."""
    out = []
    for pos, c in enumerate(data.manifest.cells):
        if c.cell_kind == "correctness":
            continue
        key = (c.variant, c.repeat)
        status = data.cell_status(*key) if key in data.cells else c.status
        out.append({"variant": key[0], "repeat": key[1], "position": pos, "status": status})
    return out


def failures(data: RunData, cmp: Comparison, primaries: dict[str, set[str]]) -> None:
    """``cmp.failed_cells`` with their reasons; ``cmp.affected``: each primary (``primaries``:
    {suite: declared primaries}) of each variant those cells touch (all for a baseline cell)."""
    hit: dict[tuple[str, str], list[str]] = {}  # (variant, suite) -> cells
    for c in data.manifest.cells:
        if c.status not in ("failed", "incomplete", "interrupted"):
            continue
        label = f"{c.variant}/{Path(c.dir).name or c.repeat}"
        reasons = [c.error] if c.error else []
        for suite, st in c.suites.items():
            if st not in ("failed", "incomplete"):
                continue
            hit.setdefault((c.variant, suite), []).append(label)
            try:
                summ = runfolder.read_summary(data.run_dir / c.dir / suite)
            except Exception:  # noqa: BLE001 - the reason is a courtesy; the status is shown
                summ = None
            if summ is not None and summ.errors and not (c.error and c.error in summ.errors[0]):
                reasons.append(f"{suite}: {summ.errors[0].splitlines()[0]}")
        text = "; ".join(r.splitlines()[0][:300] for r in reasons) or "(no reason recorded)"
        cmp.failed_cells.append(FailedCell(cell=label, status=c.status, reason=text))
    rows = {(r.variant, r.suite, r.metric) for r in cmp.rows if r.primary}
    for (variant, suite), cells in hit.items():
        names = primaries.get(suite, set()) | {m for (_v, s, m) in rows if s == suite}
        for m in sorted(names):
            for v in cmp.variants if variant == data.baseline else [variant]:
                no_value = (v, suite, m) not in rows
                cmp.affected.append(
                    Affected(variant=v, suite=suite, metric=m, cells=cells, no_value=no_value)
                )


def _gpu_name(gpu: runfolder.models.HostGpus | None) -> str | None:
    """ "NAME", "NAME xN" for N equal GPUs, or the names; None without a GPU."""
    if gpu is None:
        return None
    names = [g.name or "?" for g in gpu.gpus]
    if not names:
        return "?"
    if len(set(names)) == 1:
        return names[0] + (f" x{len(names)}" if len(names) > 1 else "")
    return ", ".join(names)


def build_info(entry: dict[str, Any]) -> BuildInfo:
    """The :class:`BuildInfo` of a manifest's ``builds`` entry (``Build.to_json()``; keys a
    folder's entry lacks, or holds with another type, are None). Never raises."""

    def text(key: str) -> str | None:
        x = entry.get(key)
        return x if isinstance(x, str) else None

    kind = entry.get("kind") if entry.get("kind") in ("release", "git", "wheel") else "release"
    changes = entry.get("changes")
    try:
        changed = ChangedFiles.model_validate(changes) if isinstance(changes, dict) else None
    except ValidationError:
        changed = None
    edits = entry.get("uncommitted")
    try:
        uncommitted = FileNames.model_validate(edits) if isinstance(edits, dict) else None
    except ValidationError:
        uncommitted = None
    return BuildInfo(
        kind=kind,
        version=text("version") if kind != "release" else (text("release") or text("resolved")),
        release=text("release"),
        commit=text("resolved") if kind == "git" else None,
        subject=text("subject"),
        changes=changed,
        uncommitted=uncommitted,
    )


def run_info(data: RunData, run_id: str) -> RunInfo:
    """The run as the report's header shows it, from the manifest."""
    man = data.manifest
    cfg = man.config
    ref = cfg.model if cfg is not None else None
    info = RunInfo(
        name=(cfg.name if cfg is not None else "") or run_id,
        model=(ref.path if ref is not None else None) or man.model or "?",
        tiny=bool(ref is not None and ref.tiny),
        sglang=man.sglang_version or (sglang_label(cfg.sglang) if cfg is not None else "?"),
        gpu=_gpu_name(man.gpu),
        commit=(man.git_sha or "?")[:12],
        started_at=man.started_at,
        ended_at=man.ended_at,
    )
    for v in data.variants:
        spec = cfg.variants.get(v) if cfg is not None else None
        build = man.builds.get(v) or {}
        info.variants[v] = VariantInfo(
            patches=man.patches.get(v)
            or [PatchHash(name=patch_label(p)) for p in (spec.patches if spec else [])],
            server_args=list(spec.server_args) if spec else [],
            env=dict(spec.env) if spec else {},
            build=build.get("describe", "?") if v in man.builds else None,
            from_source=build.get("kind") in ("git", "wheel"),
            built=build_info(build) if v in man.builds else None,
        )
    return info
