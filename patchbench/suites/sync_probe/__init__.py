"""sync_probe suite: does the variant's mrope decode path make the host wait for the GPU? No
server: the variant's and stock's mrope methods run with stand-ins (:mod:`.mrope`) per batch size;
``server_crosscheck`` adds the in-server hook (:func:`merge_counts`)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from patchbench.records import read_json
from patchbench.suite import (
    Instrumentation,
    MetricInfo,
    Suite,
    SuiteContext,
    SuiteError,
    SuiteResult,
    comparison_get,
    read_or,
    register,
    suite_pairs,
    suite_refusals,
)
from patchbench.suites import folded
from patchbench.suites.sync_probe.table import format_table, markdown_table

REL = "srt/model_executor/forward_batch_info.py"
#: the in-server hook (Instrumentation.hooks) of the cross-check
HOOK = Path(__file__).resolve().parent / "instr" / "patchbench_mrope_instr.py"
#: the instrumentation's folder inside this suite's folder of a correctness cell
INSTR_OUT = "mrope_instr"

#: the test that proves the probe's counts deterministic by construction (the variant's code on
#: the same seeded batches, counted by a TorchFunctionMode): two probes in separate processes
#: give identical counts
BY_CONSTRUCTION = "tests/suites/test_sync_probe.py::test_counts_are_identical_in_two_processes"


def _count(label: str, primary: bool = False, by: str | None = BY_CONSTRUCTION) -> MetricInfo:
    return MetricInfo("lower", "count", label, primary, "deterministic", deterministic_by=by)


#: per-call sums over the configured batch sizes (counts: the same in every run of the same code,
#: compared exactly), mean over batch sizes (ms)
METRICS: dict[str, MetricInfo] = {
    "host_syncs_per_call_count": _count(
        "host syncs per call (device-to-host reads + blocking host-to-device copies), summed "
        "over batch sizes",
        primary=True,
    ),
    "sync_d2h_reads_count": _count("device-to-host reads per call, summed over batch sizes"),
    "sync_blocking_h2d_copies_count": _count(
        "blocking host-to-device copies per call, summed over batch sizes"
    ),
    "sync_warnings_count": _count(
        "CUDA sync warnings per call, summed over batch sizes (GPU only)", by=None
    ),
    "host_blocked_ms": MetricInfo(
        "lower",
        "ms",
        "host blocked in the call behind an in-flight kernel, mean over batch sizes (GPU only)",
        kind="run",
    ),
    "positions_mismatch_count": _count("batch sizes whose positions differ from stock"),
}
#: the counts a counting run stopped early (``counts_lower_bound``) can only undercount
LOWER_BOUND_WHEN_STOPPED = (
    "sync_d2h_reads_count",
    "sync_blocking_h2d_copies_count",
    "host_syncs_per_call_count",
)


class Params(BaseModel):
    """sync_probe parameters. image_share: share of image requests in each batch (at least one);
    iterations: calls per CUDA measurement; sleep_ms: the in-flight GPU kernel; force_cpu: the CPU
    probes even on a GPU; server_crosscheck: the in-server cross-check (untimed cells only)."""

    model_config = ConfigDict(extra="forbid")
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32, 128])
    image_share: float = Field(0.5, ge=0.0, le=1.0)
    iterations: int = Field(5, ge=1, le=100)
    sleep_ms: float = Field(50.0, gt=0.0)
    seed: int = 0
    force_cpu: bool = False
    server_crosscheck: bool = False


def run(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Probe the variant; SuiteError when a source file is missing or its mrope methods cannot run
    with the stand-ins."""
    import torch

    from patchbench.inputs import sha256_file
    from patchbench.records import write_json
    from patchbench.suites.sync_probe.mrope import calibrate_sleep_cycles, measure_row

    variant_file, stock_file = Path(ctx.variant_sglang_dir) / REL, Path(ctx.stock_sglang_dir) / REL
    methods, stock = _load_methods(ctx, variant_file, stock_file)
    cuda, mode, note, warnings = _measurement_mode(ctx, params)
    kw = {
        "device": "cuda" if cuda else "cpu",
        "image_share": params.image_share,
        "iterations": params.iterations,
        "sleep_ms": params.sleep_ms,
        "sleep_cycles": calibrate_sleep_cycles(params.sleep_ms) if cuda else None,
    }
    rows = [measure_row(methods, stock, b, seed=params.seed + b, **kw) for b in params.batch_sizes]
    errors = [f"batch {r['batch_size']}: {r['error']}" for r in rows if r.get("error")]
    warnings += [
        f"batch {r['batch_size']}: counts are lower bounds, the probe was stopped by a "
        f"read it could not answer ({r['stopped_by']})"
        for r in rows
        if r.get("stopped_by")
    ]
    metrics, bounds = _row_metrics(rows, cuda)
    probe: dict[str, Any] = {
        "schema": 1,
        "mode": mode,
        "note": note,
        "variant": ctx.variant,
        "sglang_version": ctx.sglang_version,
        "torch": torch.__version__,
        "variant_file": str(variant_file),
        "variant_sha256": sha256_file(variant_file),
        "stock_file": str(stock_file),
        "stock_sha256": sha256_file(stock_file),
        "params": params.model_dump(),
        "rows": rows,
    }
    write_json(Path(ctx.out_dir) / "probe.json", probe)
    return SuiteResult(
        status="incomplete" if errors else "ok",
        metrics=metrics,
        errors=errors,
        warnings=warnings,
        bounds=bounds,
        meta={
            "mode": mode,
            "note": note,
            "variant_sha256": probe["variant_sha256"],
            "batch_sizes": params.batch_sizes,
        },
    )


def _load_methods(ctx: SuiteContext, variant_file: Path, stock_file: Path) -> tuple[Any, Any]:
    """The variant's and stock's ``MropeMethods``; SuiteError when a file is missing or its methods
    cannot run with the stand-ins."""
    from patchbench.suites.sync_probe.mrope import MropeMethods, MropeSourceError

    for f in (variant_file, stock_file):
        if not f.is_file():
            raise SuiteError(f"sync_probe: no {f}")
    try:
        return MropeMethods(variant_file, ctx.variant), MropeMethods(stock_file, "stock")
    except MropeSourceError as exc:
        raise SuiteError(f"sync_probe: {exc}") from exc


def _measurement_mode(ctx: SuiteContext, params: Params) -> tuple[bool, str, str, list[str]]:
    """(measure on CUDA, the mode "cuda" | "cpu-probes", the note saying why, the warnings: the note
    when a GPU run falls back to the CPU probes)."""
    import torch

    warnings: list[str] = []
    cuda = ctx.device == "cuda" and torch.cuda.is_available() and not params.force_cpu
    if cuda:
        mode, note = "cuda", f"CUDA on {torch.cuda.get_device_name()}"
    else:
        mode = "cpu-probes"
        why = "the run is on the CPU"
        if params.force_cpu or ctx.device == "cuda":
            why = "force_cpu" if params.force_cpu else "no GPU visible to torch"
        note = (
            f"no GPU measurement ({why}): ran the CPU probes instead (seq_lens on the meta "
            "device, reads counted; copies to the device recorded with non_blocking); "
            "sync warnings and host-blocked time need a GPU"
        )
        if ctx.device == "cuda":
            warnings.append(note)
    # one short line per cell on the console; the full note is in probe.json and the report
    ctx.log(note if cuda else f"CPU probes ({why})")
    return cuda, mode, note, warnings


def _row_metrics(
    rows: list[dict], cuda: bool
) -> tuple[dict[str, float], dict[str, Literal["lower", "upper"]]]:
    """(:data:`METRICS` summed or averaged over the batch-size rows, the counts' bounds when a
    counting run was stopped)."""
    metrics: dict[str, float] = {
        "sync_d2h_reads_count": float(sum(r.get("d2h_reads_per_call", 0) for r in rows)),
        "sync_blocking_h2d_copies_count": float(
            sum(r.get("blocking_h2d_copies_per_call", 0) for r in rows)
        ),
        "positions_mismatch_count": float(sum(not r.get("positions_equal_stock") for r in rows)),
    }
    metrics["host_syncs_per_call_count"] = (
        metrics["sync_d2h_reads_count"] + metrics["sync_blocking_h2d_copies_count"]
    )
    # a counting run stopped by an unanswerable read counted only what came before it: the
    # sums are lower bounds, and the comparison concludes only what a bound allows
    bounds: dict[str, Literal["lower", "upper"]] = {}
    if any(r.get("counts_lower_bound") for r in rows):
        bounds = dict.fromkeys(LOWER_BOUND_WHEN_STOPPED, "lower")
    if cuda:
        metrics["sync_warnings_count"] = float(
            sum(r["sync_warnings_per_call"] for r in rows if "sync_warnings_per_call" in r)
        )
        blocked = [r["host_blocked_ms"] for r in rows if "host_blocked_ms" in r]
        if blocked:
            metrics["host_blocked_ms"] = statistics.fmean(blocked)
    return metrics, bounds


def report_block(summary_dir: Path) -> str:
    """The cell's probe table from ``probe.json`` in ``summary_dir``."""
    path = Path(summary_dir) / "probe.json"
    if not path.is_file():
        return f"sync_probe: no probe.json in {summary_dir}"
    probe = read_json(path)
    head = (
        f"sync_probe ({probe['mode']}; variant {probe['variant']}, "
        f"forward_batch_info.py {probe['variant_sha256'][:12]})"
    )
    return f"{head}\n{format_table(probe['rows'])}\n{probe['note']}"


# --------------------------------------------------------------------------- in-server counts

#: counts that are a maximum over calls (merged with max); every other count is a number of
#: events (merged with a sum over processes that saw different batches)
MAX_COUNTS = frozenset({"max_decode_batch"})


def merge_counts(out_dir: Path) -> dict[str, Any]:
    """Merge the ``counts.<pid>.json`` files of one server into one record for ``cell.json``.

    Returns ``{"processes", "replicated", "counts", "per_process": [{"pid", "counts"}],
    "module_sha256", "crosscheck_ref_sha256", "mismatch_samples" (up to 5), "unreadable"}``.
    ``counts``: :data:`MAX_COUNTS` take the maximum, the rest are summed unless every process
    reports the same call counts (``replicated``: tensor-parallel ranks run the same batches), then
    the first process's. No files: ``processes`` 0."""
    per: list[dict[str, Any]] = []
    unreadable: list[str] = []
    samples: list[dict] = []
    mods: list[str] = []
    refs: list[str] = []
    for f in sorted(Path(out_dir).glob("counts.*.json")):
        try:
            data = read_json(f)
            counts = {
                k: v
                for k, v in (data.get("counts") or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        except (OSError, ValueError, AttributeError) as e:
            unreadable.append(f"{f.name}: {e}")
            continue
        per.append({"pid": data.get("pid"), "counts": counts})
        samples += list(data.get("mismatch_samples") or [])
        for key, into in (("module_sha256", mods), ("crosscheck_ref_sha256", refs)):
            if data.get(key) and data[key] not in into:
                into.append(data[key])
    calls = [{k: v for k, v in p["counts"].items() if k.endswith("calls")} for p in per]
    replicated = len(per) > 1 and all(c == calls[0] for c in calls)
    merged: dict[str, float] = {}
    if replicated:
        merged = dict(per[0]["counts"])
    else:
        for p in per:
            for k, v in p["counts"].items():
                merged[k] = max(merged.get(k, v), v) if k in MAX_COUNTS else merged.get(k, 0) + v
    return {
        "processes": len(per),
        "replicated": replicated,
        "counts": merged,
        "per_process": per,
        "module_sha256": mods,
        "crosscheck_ref_sha256": refs,
        "mismatch_samples": samples[:5],
        "unreadable": unreadable,
    }


# --------------------------------------------------------------------------- pairing


def _crosscheck_of(suite_dirs: list[Path]) -> dict[str, Any] | None:
    """The merged in-server counts of this variant: ``cell.json``'s ``instrumentation.sync_probe``
    of the given cells, then of the variant's other cells (the correctness cell is no repeat)."""
    seen: list[Path] = []
    for d in suite_dirs:
        cell = Path(d).parent
        seen.append(cell)
        # only the variant's own cell folders (run/<variant>/{correctness,rep<k>})
        seen += sorted(
            p
            for p in cell.parent.iterdir()
            if p.is_dir() and p != cell and re.fullmatch(r"correctness|rep\d+", p.name)
        )
    for cell in dict.fromkeys(seen):
        rec = read_or(cell / "cell.json")
        got = (
            (rec.get("instrumentation") or {}).get("sync_probe") if isinstance(rec, dict) else None
        )
        if got:
            return dict(got, cell=cell.name)
    return None


def pair_cells(baseline_dirs: list[Path], variant_dirs: list[Path]) -> dict[str, Any] | None:
    """``{"baseline", "variant": {"mode", "note", "variant_sha256", "rows" (one per batch size),
    "repeat_index"} | None, "metrics": {name: {"baseline": [per repeat], "variant": [...],
    "same_in_every_repeat"}}, "server_crosscheck": {"baseline", "variant": merge_counts() record |
    None}}``; None when neither side has a probe.json."""

    def side(dirs: list[Path]) -> dict[str, Any] | None:
        for k, d in enumerate(dirs):
            probe = read_or(Path(d) / "probe.json")
            if isinstance(probe, dict):
                keep = {n: probe.get(n) for n in ("mode", "note", "variant_sha256")}
                return dict(keep, rows=probe.get("rows") or [], repeat_index=k)
        return None

    def summary_metrics(d: Path) -> dict[str, float]:
        summary = read_or(Path(d) / "summary.json")
        return dict(summary.get("metrics") or {}) if isinstance(summary, dict) else {}

    b, v = side(baseline_dirs), side(variant_dirs)
    if b is None and v is None:
        return None
    bm, vm = [summary_metrics(d) for d in baseline_dirs], [summary_metrics(d) for d in variant_dirs]
    metrics: dict[str, dict[str, Any]] = {}
    for name in METRICS:
        bv, vv = [m.get(name) for m in bm], [m.get(name) for m in vm]
        if any(x is not None for x in bv + vv):
            same = len(set(bv)) <= 1 and len(set(vv)) <= 1
            metrics[name] = {"baseline": bv, "variant": vv, "same_in_every_repeat": same}
    return {
        "baseline": b,
        "variant": v,
        "metrics": metrics,
        "server_crosscheck": {
            "baseline": _crosscheck_of(baseline_dirs),
            "variant": _crosscheck_of(variant_dirs),
        },
    }


def _crosscheck_lines(name: str, got: dict[str, Any] | None) -> str:
    if not got:
        return f"| {name} | not run | | | | | |"
    c = got.get("counts") or {}
    eq = sum(v for k, v in c.items() if k.startswith("crosscheck_") and k.endswith("_equal"))
    bad = sum(v for k, v in c.items() if k.startswith("crosscheck_") and k.endswith("_mismatch"))
    # the cross-check runs on every call, decode and extend alike: equal + mismatches = calls
    checked = f"{eq:g} of {eq + bad:g}" if eq + bad else "not run (0 calls checked)"
    return (
        f"| {name} | {got.get('processes', 0)} | {c.get('decode_calls', 0):g} / "
        f"{c.get('extend_calls', 0):g} | "
        f"{c.get('decode_multi_image_calls', 0):g} | {c.get('max_decode_batch', 0):g} | "
        f"{checked} | {bad:g}{' ⚠' if bad else ''} |"
    )


def report_section(comparison: Any) -> list[str]:
    """Markdown: the probe table of the baseline and each variant and the in-server cross-check
    counts, folded, from ``pairs["sync_probe"]`` alone."""
    pairs = suite_pairs(comparison, "sync_probe")
    refusals = suite_refusals(comparison, "sync_probe")
    if not pairs and not refusals:
        return []
    base = comparison_get(comparison, "baseline", "baseline")
    head = ["## Sync probe", ""]
    head += [f"**{v}**: not compared: {r}" for v, r in refusals.items()]
    head += [""] if refusals else []
    lines: list[str] = []
    first = next((p for p in pairs.values() if p.get("baseline")), None)
    shown: list[tuple[str, dict | None]] = [(base, first.get("baseline") if first else None)]
    shown += [(v, p.get("variant")) for v, p in pairs.items()]
    notes = {str(p.get("note") or "") for _, p in shown if p is not None}
    one_note = len(notes) == 1  # the same for every variant: said once, after the tables
    for name, probe in shown:
        if probe is None:
            lines += [f"**{name}**: no probe.json", ""]
            continue
        lines += [
            f"**{name}** ({probe.get('mode')}; forward_batch_info.py "
            f"`{(probe.get('variant_sha256') or '?')[:12]}`; per call)",
            "",
            *markdown_table(probe.get("rows") or []),
            "",
        ]
        if not one_note:
            lines += [str(probe.get("note") or ""), ""]
    if one_note and next(iter(notes)):
        lines += [next(iter(notes)), ""]
    checks = [(base, first["server_crosscheck"].get("baseline") if first else None)]
    checks += [(v, (p.get("server_crosscheck") or {}).get("variant")) for v, p in pairs.items()]
    if any(c for _, c in checks):
        lines += [
            "In-server cross-check (untimed correctness cell: the server's own mrope "
            "computations, each checked against the stock method on the same batch):",
            "",
            "| variant | processes | decode / extend calls | multi-image decode calls | max "
            "decode batch | equal to stock (calls checked, all modes) | mismatches |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [_crosscheck_lines(n, c) for n, c in checks] + [""]
    what = "host syncs per call by batch size, per variant" + (
        "; the in-server cross-check" if any(c for _, c in checks) else ""
    )
    return head + folded(what, lines)


# --------------------------------------------------------------------------- the suite


@register
class SyncProbeSuite(Suite):
    """Host syncs of the variant's mrope decode path, measured outside the server."""

    name = "sync_probe"
    Params = Params
    metrics = METRICS
    needs_server = False
    run = staticmethod(run)
    report_section = staticmethod(report_section)
    report_block = staticmethod(report_block)

    def instrumentation(self, ctx: SuiteContext, params: Params) -> Instrumentation | None:
        """With ``server_crosscheck``: :data:`HOOK` in the server, counts written to ``mrope_instr/``,
        each computation checked against the stock file; merged by :func:`merge_counts`."""
        if not params.server_crosscheck:
            return None
        out = Path(ctx.out_dir) / INSTR_OUT
        return Instrumentation(
            env={
                "PATCHBENCH_MROPE_PROBE_DIR": str(out),
                "PATCHBENCH_MROPE_CROSSCHECK_REF": str(Path(ctx.stock_sglang_dir) / REL),
            },
            hooks=[HOOK],
            out_dir=out,
            perturbs_timing=True,
            collect=merge_counts,
        )

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: Params
    ) -> dict | None:
        return pair_cells(baseline_dirs, variant_dirs)
