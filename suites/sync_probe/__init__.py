"""sync_probe suite: does the variant's mrope decode path make the host wait for the GPU?

No server: ``run(ctx, params)`` reads the variant's ``forward_batch_info.py``
(``ctx.variant_sglang_dir / "srt/model_executor/forward_batch_info.py"``) and the stock one
(``ctx.stock_sglang_dir``), extracts the ``ForwardBatch`` mrope methods with :mod:`ast` and runs
them with stand-ins (patchbench.mrope), per batch size:

- on CUDA (``ctx.device == "cuda"`` and a GPU visible): sync warnings per call under
  ``torch.cuda.set_sync_debug_mode("warn")``, and the host's time in the call while a ~``sleep_ms``
  GPU kernel is in flight minus its time on an idle GPU (``host_blocked_ms``: stock 0.5.1.post3 and
  0.5.23 wait for the kernel, the patched path about 0); device-to-host reads and blocking copies
  recorded by a TorchFunctionMode;
- otherwise the CPU probes: ``seq_lens`` on the ``meta`` device (reads counted) and the copies to the
  device recorded with their ``non_blocking`` flag; ``meta.mode`` says "cpu-probes" and why.

Every row also checks that the variant's positions equal stock's on the same batch. Writes
``probe.json`` (docs/CONTRACTS.md) into ``ctx.out_dir``.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from patchbench.suite import MetricInfo, SuiteContext, SuiteError, SuiteResult

REL = "srt/model_executor/forward_batch_info.py"

#: per-call sums over the configured batch sizes (counts), mean over batch sizes (ms)
METRICS: dict[str, MetricInfo] = {
    "sync_d2h_reads_count": MetricInfo("lower", "count", "device-to-host reads per call, summed over batch sizes"),
    "sync_blocking_h2d_copies_count": MetricInfo("lower", "count", "blocking host-to-device copies per call, summed over batch sizes"),
    "sync_warnings_count": MetricInfo("lower", "count", "CUDA sync warnings per call, summed over batch sizes (GPU only)"),
    "host_blocked_ms": MetricInfo("lower", "ms", "host blocked in the call behind an in-flight kernel, mean over batch sizes (GPU only)"),
    "positions_mismatch_count": MetricInfo("lower", "count", "batch sizes whose positions differ from stock"),
}
NEEDS_SERVER = False


class Params(BaseModel):
    """sync_probe parameters (YAML ``suites: sync_probe: {...}``).

    batch_sizes: decode batch sizes to probe. image_share: share of image requests in each batch
    (at least one image request is always present). iterations: calls per measurement on CUDA
    (medians / means over them). sleep_ms: duration of the in-flight GPU kernel. seed: batch seed.
    force_cpu: run the CPU probes even on a GPU machine.
    """

    model_config = ConfigDict(extra="forbid")
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32, 128])
    image_share: float = Field(0.5, ge=0.0, le=1.0)
    iterations: int = Field(5, ge=1, le=100)
    sleep_ms: float = Field(50.0, gt=0.0)
    seed: int = 0
    force_cpu: bool = False


def run(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Probe the variant (see the module docstring); raises SuiteError when a source file is
    missing or its mrope methods cannot be run with patchbench's stand-ins."""
    import torch

    from patchbench.mrope import MropeMethods, MropeSourceError, measure_row, sha256_file
    from patchbench.records import write_json

    variant_file = Path(ctx.variant_sglang_dir) / REL
    stock_file = Path(ctx.stock_sglang_dir) / REL
    for f in (variant_file, stock_file):
        if not f.is_file():
            raise SuiteError(f"sync_probe: no {f}")
    try:
        methods = MropeMethods(variant_file, ctx.variant)
        stock = MropeMethods(stock_file, "stock")
    except MropeSourceError as exc:
        raise SuiteError(f"sync_probe: {exc}") from exc

    warnings: list[str] = []
    cuda = ctx.device == "cuda" and torch.cuda.is_available() and not params.force_cpu
    if cuda:
        mode, note = "cuda", f"CUDA on {torch.cuda.get_device_name()}"
    else:
        mode = "cpu-probes"
        why = ("force_cpu" if params.force_cpu else
               "no GPU visible to torch" if ctx.device == "cuda" else "the run is on the CPU")
        note = (f"no GPU measurement ({why}): ran the CPU probes instead (seq_lens on the meta "
                "device, reads counted; copies to the device recorded with non_blocking); "
                "sync warnings and host-blocked time need a GPU")
        if ctx.device == "cuda":
            warnings.append(note)
    ctx.log(f"sync_probe: {note}")

    rows = []
    sleep_cycles = None
    if cuda:
        from patchbench.mrope import calibrate_sleep_cycles
        sleep_cycles = calibrate_sleep_cycles(params.sleep_ms)
    for bs in params.batch_sizes:
        rows.append(measure_row(methods, stock, bs, device="cuda" if cuda else "cpu",
                                image_share=params.image_share, seed=params.seed + bs,
                                iterations=params.iterations, sleep_ms=params.sleep_ms,
                                sleep_cycles=sleep_cycles))
    errors = [f"batch {r['batch_size']}: {r['error']}" for r in rows if r.get("error")]
    warnings += [f"batch {r['batch_size']}: counts are lower bounds, the probe was stopped by a "
                 f"read it could not answer ({r['stopped_by']})" for r in rows if r.get("stopped_by")]

    metrics: dict[str, float] = {
        "sync_d2h_reads_count": float(sum(r.get("d2h_reads_per_call", 0) for r in rows)),
        "sync_blocking_h2d_copies_count": float(
            sum(r.get("blocking_h2d_copies_per_call", 0) for r in rows)),
        "positions_mismatch_count": float(sum(not r.get("positions_equal_stock") for r in rows)),
    }
    if cuda:
        metrics["sync_warnings_count"] = float(sum(r["sync_warnings_per_call"] for r in rows
                                                   if "sync_warnings_per_call" in r))
        blocked = [r["host_blocked_ms"] for r in rows if "host_blocked_ms" in r]
        if blocked:
            metrics["host_blocked_ms"] = statistics.fmean(blocked)
    probe: dict[str, Any] = {
        "schema": 1, "mode": mode, "note": note, "variant": ctx.variant,
        "sglang_version": ctx.sglang_version, "torch": torch.__version__,
        "variant_file": str(variant_file), "variant_sha256": sha256_file(variant_file),
        "stock_file": str(stock_file), "stock_sha256": sha256_file(stock_file),
        "params": params.model_dump(), "rows": rows,
    }
    write_json(Path(ctx.out_dir) / "probe.json", probe)
    return SuiteResult(status="incomplete" if errors else "ok", metrics=metrics, errors=errors,
                       warnings=warnings,
                       meta={"mode": mode, "note": note, "variant_sha256": probe["variant_sha256"],
                             "batch_sizes": params.batch_sizes})


def report_block(summary_dir: Path) -> str:
    """The cell's probe table (from ``probe.json`` in ``summary_dir``, the suite's folder):
    one line per batch size with reads, blocking copies and, on a GPU, sync warnings and
    host-blocked ms per call."""
    from patchbench.mrope import format_table
    from patchbench.records import read_json

    path = Path(summary_dir) / "probe.json"
    if not path.is_file():
        return f"sync_probe: no probe.json in {summary_dir}"
    probe = read_json(path)
    head = (f"sync_probe ({probe['mode']}; variant {probe['variant']}, "
            f"forward_batch_info.py {probe['variant_sha256'][:12]})")
    return f"{head}\n{format_table(probe['rows'])}\n{probe['note']}"
