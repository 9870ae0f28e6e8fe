"""Host syncs measured on a real GPU: CUDA's sync warnings and the host's time behind a kernel."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch


def cuda_sync_warnings(fn: Callable[[], Any]) -> list[str]:
    """Messages of the synchronisation warnings ``torch.cuda.set_sync_debug_mode("warn")`` raises
    during ``fn()`` (one per synchronising CUDA call: blocking copies, ``.item()`` ...). The debug
    mode is restored afterwards."""
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
    """Host wall time of ``fn()`` (ms, median of ``repeats``) on an idle GPU and while a long
    kernel (``torch.cuda._sleep(sleep_cycles)``) is in flight on the current stream;
    ``host_blocked_ms`` = busy - idle, floored at 0: about the kernel's remaining time when ``fn``
    waits for the GPU, about 0 when it does not. Also ``kernel_ms``, the kernel's own duration."""

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
