"""Named profiler ranges around sglang's decode step and mrope computation: the profile suite's
in-server hook (docs/profile.md, "How it runs"). ``forward_batch_generation``'s batch is its first
argument ``model_worker_batch`` on 0.5.1.post3, ``batch`` or a ``forward_batch`` keyword on
0.5.23. Standard library, torch and ``patchbench_import_hook`` only."""

from __future__ import annotations

import os


def _batch_info(obj) -> tuple[str, int | None]:
    """(mode, batch size) of a ScheduleBatch / ModelWorkerBatch / ForwardBatch; ("?", None) when
    it has no forward mode."""
    mode = getattr(obj, "forward_mode", None)
    if mode is None:
        return "?", None
    name = "decode" if mode.is_decode() else ("extend" if mode.is_extend() else "other")
    seq_lens = getattr(obj, "seq_lens", None)
    bs = int(seq_lens.shape[0]) if seq_lens is not None and hasattr(seq_lens, "shape") else None
    if bs is None and getattr(obj, "reqs", None) is not None:
        bs = len(obj.reqs)
    return name, bs


def wrap_tp_worker(module) -> None:
    """Wrap ``module.TpModelWorker.forward_batch_generation`` (once)."""
    import torch

    cls = getattr(module, "TpModelWorker", None)
    if cls is None or getattr(cls, "_patchbench_profile_wrapped", False):
        return
    live = cls.__dict__.get("forward_batch_generation")
    if live is None:
        return

    def forward_batch_generation(self, *args, **kwargs):
        batch = args[0] if args else kwargs.get("model_worker_batch", kwargs.get("batch"))
        if batch is None:
            batch = kwargs.get("forward_batch")
        mode, bs = _batch_info(batch)
        if mode != "decode":
            return live(self, *args, **kwargs)
        with torch.profiler.record_function(f"patchbench::decode_step bs={bs}"):
            return live(self, *args, **kwargs)

    forward_batch_generation.__wrapped__ = live
    cls.forward_batch_generation = forward_batch_generation
    cls._patchbench_profile_wrapped = True


def wrap_forward_batch(module) -> None:
    """Wrap ``module.ForwardBatch._compute_mrope_positions`` (once)."""
    import torch

    cls = getattr(module, "ForwardBatch", None)
    if cls is None or getattr(cls, "_patchbench_profile_wrapped", False):
        return
    live = getattr(cls, "_compute_mrope_positions", None)
    if live is None:
        return

    def _compute_mrope_positions(self, *args, **kwargs):
        mode, bs = _batch_info(self)
        with torch.profiler.record_function(f"patchbench::mrope {mode} bs={bs}"):
            return live(self, *args, **kwargs)

    _compute_mrope_positions.__wrapped__ = live
    cls._compute_mrope_positions = _compute_mrope_positions
    cls._patchbench_profile_wrapped = True


#: module name -> the function that wraps it
TARGETS = {
    "sglang.srt.managers.tp_worker": wrap_tp_worker,
    "sglang.srt.model_executor.forward_batch_info": wrap_forward_batch,
}


def activate() -> None:
    """Wrap each of :data:`TARGETS` now or when it is imported (``patchbench_import_hook``)."""
    from patchbench_import_hook import wrap_on_import

    for name, wrap in TARGETS.items():
        wrap_on_import(name, wrap)


if os.environ.get("PATCHBENCH_PROFILE_RANGES") == "1":
    activate()
