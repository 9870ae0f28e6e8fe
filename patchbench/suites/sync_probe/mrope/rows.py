"""One probe row: a variant's mrope decode path at one batch size, on the CPU probes or on a real
GPU (CUDA's sync warnings, the host's time behind a kernel); the sync_probe suite and
``scripts/gpu_probe.py`` tabulate it (table.py).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .methods import MropeCase, MropeMethods, StandInMultimodalInputs, decode_case, run_outcome
from .probe import probe_call, probe_decode


def cuda_sync_warnings(fn: Callable[[], Any]) -> list[str]:
    """The synchronisation warnings ``torch.cuda.set_sync_debug_mode("warn")`` raises during
    ``fn()`` (the mode restored afterwards)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]


def calibrate_sleep_cycles(target_ms: float = 50.0) -> int:
    """GPU clock cycles for ``torch.cuda._sleep`` to keep the current stream busy ~target_ms."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    per_ms = cycles / max(start.elapsed_time(end), 1e-3)
    return int(per_ms * target_ms)


def cuda_host_blocked_ms(fn: Callable[[], Any], sleep_cycles: int, repeats: int = 5) -> dict:
    """Host wall time of ``fn()`` (ms, median of ``repeats``) on an idle GPU and behind an in-flight
    ``torch.cuda._sleep(sleep_cycles)``: ``host_blocked_ms`` = busy - idle, floored at 0 (about the
    kernel's remaining time when ``fn`` waits for the GPU); ``kernel_ms``, the kernel's duration."""

    def timed(busy: bool) -> tuple[float, float]:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if busy:
            start.record()
            torch.cuda._sleep(sleep_cycles)
            end.record()
        t0 = time.perf_counter()
        fn()
        elapsed = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        return elapsed, (start.elapsed_time(end) if busy else 0.0)

    timed(False)  # warm-up (allocator, pinned pool)
    idle = sorted(timed(False)[0] for _ in range(repeats))[repeats // 2]
    busy_runs = [timed(True) for _ in range(repeats)]
    busy = sorted(r[0] for r in busy_runs)[repeats // 2]
    kernel = sorted(r[1] for r in busy_runs)[repeats // 2]
    return {
        "host_call_idle_ms": idle,
        "host_call_busy_ms": busy,
        "host_blocked_ms": max(busy - idle, 0.0),
        "kernel_ms": kernel,
    }


def probe_case(batch_size: int, image_share: float, seed: int, device: str) -> MropeCase:
    """The decode batch the sync probes use: ``decode_case`` with at least one image request
    (so every release takes its multimodal path) and ``[1, 1]`` deltas."""
    case = decode_case(seed, batch_size, image_share=image_share, device=device)
    if all(m is None for m in case.mm_inputs):
        case.mm_inputs[0] = StandInMultimodalInputs(torch.tensor([[-100]]))
    return case


def _outcomes_equal(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "error":
        return a[1] == b[1]
    return a[1].dtype == b[1].dtype and torch.equal(a[1].cpu(), b[1].cpu())


def measure_row(
    methods: MropeMethods,
    stock: MropeMethods | None,
    batch_size: int,
    *,
    device: str = "cpu",
    image_share: float = 0.5,
    seed: int = 0,
    iterations: int = 5,
    sleep_ms: float = 50.0,
    sleep_cycles: int | None = None,
) -> dict:
    """Probe one variant at one batch size: one flat table row.

    Always ``positions_equal_stock`` (None without ``stock``) and ``images``. "cpu" (seq_lens on
    ``meta``): ``strict_error``, ``d2h_reads_per_call`` and ``blocking_h2d_copies_per_call`` of the
    counting run, ``h2d_copies_per_call``. "cuda": the same counts on real tensors,
    ``h2d_copies_pinned``, ``sync_warnings_per_call`` (mean over ``iterations``) and
    :func:`cuda_host_blocked_ms`'s numbers behind a kernel of about ``sleep_ms``."""
    case = probe_case(batch_size, image_share, seed, "cpu")
    row: dict[str, Any] = {
        "batch_size": batch_size,
        "device": device,
        "images": sum(m is not None for m in case.mm_inputs),
    }
    if device == "cpu":
        return row | _cpu_counts(methods, stock, case)
    gpu_case = case.on(device)
    mine = run_outcome(methods, gpu_case)
    if stock is not None:
        row["positions_equal_stock"] = _outcomes_equal(mine, run_outcome(stock, gpu_case))
    if mine[0] == "error":
        row["error"] = mine[1]
        return row
    return row | _cuda_counts(methods, gpu_case, iterations, sleep_ms, sleep_cycles)


def _cpu_counts(methods: MropeMethods, stock: MropeMethods | None, case: MropeCase) -> dict:
    """The CPU probes' columns of a row (see :func:`measure_row`)."""
    row: dict[str, Any] = {}
    if stock is not None:
        row["positions_equal_stock"] = _outcomes_equal(
            run_outcome(methods, case), run_outcome(stock, case)
        )
    strict = probe_decode(methods, case)
    counted = probe_decode(methods, case, placeholder_reads=True)
    # a read that cannot be answered with a placeholder (a meta tensor read inside a call
    # whose arguments hold no 0-d meta tensor to swap) ends the counting run: that read is
    # counted too, the counts are lower bounds (``counts_lower_bound``) and ``stopped_by``
    # says what stopped it
    stopped = counted.error
    row.update(
        strict_error=strict.error,
        d2h_reads_per_call=len(counted.reads) + (1 if stopped else 0),
        blocking_h2d_copies_per_call=len(counted.blocking_copies),
        h2d_copies_per_call=len(counted.copies),
        counts_lower_bound=bool(stopped),
        stopped_by=stopped,
    )
    return row


def _cuda_counts(
    methods: MropeMethods,
    gpu_case: MropeCase,
    iterations: int,
    sleep_ms: float,
    sleep_cycles: int | None,
) -> dict:
    """The CUDA columns of a row whose call ran (see :func:`measure_row`)."""
    rec = probe_call(lambda: methods.compute(gpu_case.fresh()))
    row: dict[str, Any] = dict(
        d2h_reads_per_call=len(rec.reads),
        blocking_h2d_copies_per_call=len(rec.blocking_copies),
        h2d_copies_per_call=len(rec.copies),
        h2d_copies_pinned=all(c.pinned for c in rec.copies),
        error=rec.error,
    )
    fresh = [gpu_case.fresh() for _ in range(iterations)]
    warns = 0
    for c in fresh:
        warns += len(cuda_sync_warnings(lambda c=c: methods.compute(c)))
    row["sync_warnings_per_call"] = warns / iterations
    cycles = sleep_cycles or calibrate_sleep_cycles(sleep_ms)
    row.update(cuda_host_blocked_ms(lambda: methods.compute(gpu_case.fresh()), cycles, iterations))
    return row
