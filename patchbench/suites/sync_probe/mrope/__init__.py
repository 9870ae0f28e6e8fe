"""Run sglang's mrope position methods outside sglang and probe them for host syncs: the extracted
methods and their inputs (:mod:`.methods`), the CPU probes (:mod:`.probe`) and one table row, CPU
or CUDA (:mod:`.rows`).

Standard library and torch only at import time: ``scripts/gpu_probe.py`` loads this folder by
path on a machine with only python3 and torch.
"""

from __future__ import annotations

from .methods import (
    MropeCase,
    MropeMethods,
    MropeSourceError,
    StandInMode,
    StandInMultimodalInputs,
    decode_case,
    run_outcome,
)
from .probe import ProbeRecord, probe_call, probe_decode
from .rows import calibrate_sleep_cycles, cuda_host_blocked_ms, cuda_sync_warnings, measure_row

__all__ = [
    "MropeCase",
    "MropeMethods",
    "MropeSourceError",
    "ProbeRecord",
    "StandInMode",
    "StandInMultimodalInputs",
    "calibrate_sleep_cycles",
    "cuda_host_blocked_ms",
    "cuda_sync_warnings",
    "decode_case",
    "measure_row",
    "probe_call",
    "probe_decode",
    "run_outcome",
]
