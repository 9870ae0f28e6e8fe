"""Run sglang's mrope position methods outside sglang, and probe them for host syncs.

sglang's ``ForwardBatch`` computes ``mrope_positions`` (int64, shape ``[3, num_tokens]``) for models
with multimodal rotary embedding (docs/FACTS.md section 1). Importing the real module needs the
whole sglang package, which a lent GPU machine does not have, so this package takes the *source*
of a ``forward_batch_info.py`` (stock or patched, any release), extracts the ``ForwardBatch``
methods whose name contains ``mrope`` and runs the real method bodies against stand-ins. Modules:

- :mod:`.sources`: the stock and patched files of a release, checked against the patch manifest;
- :mod:`.standins`, :mod:`.methods`: the stand-ins, and the extracted methods
  (:class:`MropeMethods`);
- :mod:`.cases`: one call's inputs (:class:`MropeCase`) and random decode / extend batches;
- :mod:`.probe`: the CPU probes (:class:`SyncProbeMode`: device-to-host reads and host-to-device
  copies, ``seq_lens`` on the ``meta`` device);
- :mod:`.cuda`: the same measured on a real GPU (sync warnings, host time behind a kernel);
- :mod:`.rows`: one table row per variant and batch size (:func:`measure_row`), shared by the
  tests, the sync_probe suite and ``scripts/gpu_probe.py``.

This module is the package's public interface: the names below are what the suite, the scripts
and the tests import. Standard library and torch only at import time: ``scripts/gpu_probe.py``
loads this folder by path on a machine with only python3 and torch.
"""

from __future__ import annotations

from .cases import MropeCase, decode_case, extend_case
from .cuda import calibrate_sleep_cycles, cuda_host_blocked_ms, cuda_sync_warnings
from .methods import MropeMethods, compile_methods, extract_mrope_nodes, run_outcome
from .probe import CopyEvent, ProbeRecord, SyncProbeMode, probe_call, probe_decode
from .rows import measure_row, probe_case
from .sources import (
    DEFAULT_CACHE,
    DEFAULT_PATCH,
    FBI_REL,
    MropeSourceError,
    patch_manifest,
    patched_source,
    release_sources,
    sha256_file,
    stock_source,
)
from .standins import StandInMode, StandInMultimodalInputs

__all__ = [
    "DEFAULT_CACHE",
    "DEFAULT_PATCH",
    "FBI_REL",
    "CopyEvent",
    "MropeCase",
    "MropeMethods",
    "MropeSourceError",
    "ProbeRecord",
    "StandInMode",
    "StandInMultimodalInputs",
    "SyncProbeMode",
    "calibrate_sleep_cycles",
    "compile_methods",
    "cuda_host_blocked_ms",
    "cuda_sync_warnings",
    "decode_case",
    "extend_case",
    "extract_mrope_nodes",
    "measure_row",
    "patch_manifest",
    "patched_source",
    "probe_call",
    "probe_case",
    "probe_decode",
    "release_sources",
    "run_outcome",
    "sha256_file",
    "stock_source",
]
