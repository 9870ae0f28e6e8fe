"""CPU probes for host syncs: what a call reads back from the device and copies to it, recorded by
:class:`SyncProbeMode` with ``seq_lens`` on the ``meta`` device (a tensor without data)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .methods import MropeCase, MropeMethods

#: Tensor methods that bring a value to the host
_READ_METHODS = frozenset(
    "__int__ __index__ __float__ __bool__ __complex__ item tolist numpy __array__ cpu".split()
)
_META_READ_MARKERS = ("cannot be called on meta tensors", "Cannot copy out of meta tensor")


@dataclass
class CopyEvent:
    """One host-to-device copy: api ("torch.tensor", "Tensor.to", ...), target device,
    non_blocking, pinned (None when unknown), blocking (the host waits: ``non_blocking`` False or
    an API without the flag, as ``torch.tensor(data, device=...)``)."""

    api: str
    target: str
    non_blocking: bool
    pinned: bool | None

    @property
    def blocking(self) -> bool:
        return not self.non_blocking


@dataclass
class ProbeRecord:
    """What one probed call did: device-to-host ``reads`` ("Tensor.__int__ of meta"), host-to-device
    ``copies``, and the ``error`` ("Type: message") it raised, if any."""

    reads: list[str] = field(default_factory=list)
    copies: list[CopyEvent] = field(default_factory=list)
    error: str | None = None

    @property
    def blocking_copies(self) -> list[CopyEvent]:
        return [c for c in self.copies if c.blocking]

    def to_json(self) -> dict:
        return {
            "reads": self.reads,
            "copies": [dict(dataclasses.asdict(c), blocking=c.blocking) for c in self.copies],
            "error": self.error,
        }


def _is_pinned(t: torch.Tensor) -> bool | None:
    try:
        return bool(t.is_pinned())
    except Exception:  # noqa: BLE001 - the method's own error is the measured outcome
        return None


def _device_of(value: Any) -> torch.device | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.device
    try:
        return torch.device(value)
    except (TypeError, RuntimeError):
        return None


class SyncProbeMode(TorchFunctionMode):
    """Record device-to-host reads and host-to-device copies made under it.

    A read: ``int`` / ``float`` / ``bool`` / ``.item()`` / ``.tolist()`` / ``.numpy()`` /
    ``.cpu()`` / ``.to("cpu")`` of a non-CPU tensor, or a call failing with PyTorch's meta-tensor
    read error. A copy: ``torch.tensor`` / ``torch.as_tensor`` to a non-CPU device, ``Tensor.to`` /
    ``.cuda`` / ``.copy_`` from a CPU tensor to one. With ``placeholder_reads`` a meta read returns
    a placeholder (zeros) and a call failing on a 0-d meta argument (``torch.full((3, 1),
    seq_lens[i] - 1)``) is counted and run again with a placeholder scalar, so a call is counted to
    its end (its result meaningless); otherwise the read raises."""

    def __init__(self, record: ProbeRecord, placeholder_reads: bool = False):
        super().__init__()
        self.record = record
        self.placeholder_reads = placeholder_reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (
            self_t is not None
            and self_t.device.type != "cpu"
            and _reads_to_host(name, args, kwargs)
        ):
            self.record.reads.append(f"Tensor.{name} of {self_t.device.type}")
            if self.placeholder_reads and self_t.device.type == "meta":
                return _placeholder(name, self_t)
            return func(*args, **kwargs)
        copy = _copy_event(func, name, self_t, args, kwargs)
        if copy is not None:
            self.record.copies.append(copy)
        return self._call(func, name, args, kwargs)

    def _call(self, func, name: str, args: tuple, kwargs: dict) -> Any:
        """``func(*args, **kwargs)``; a failure on reading a meta tensor's value is a read (and,
        counting, the call runs again with its 0-d meta tensor arguments as placeholders)."""
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as exc:
            if not any(m in str(exc) for m in _META_READ_MARKERS):
                raise
            self.record.reads.append(f"{name} (reads a meta tensor's value)")
            if not self.placeholder_reads:
                raise
            # counting: a 0-d meta tensor passed as a value (torch.full's fill value) is what
            # the call read; answer it with a placeholder scalar and go on
            args2, kwargs2, swapped = _scalar_placeholders(args, kwargs)
            if not swapped:
                raise
            return func(*args2, **kwargs2)


def _reads_to_host(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether a method ``name`` called on a non-CPU tensor brings its value to the host."""
    return name in _READ_METHODS or (
        name == "to" and _to_target(args, kwargs)[0] == torch.device("cpu")
    )


def _copy_event(
    func, name: str, self_t: torch.Tensor | None, args: tuple, kwargs: dict
) -> CopyEvent | None:
    """The host-to-device copy a call makes, or None."""
    if name in ("tensor", "as_tensor") and func in (torch.tensor, torch.as_tensor):
        dev = _device_of(kwargs.get("device"))
        if dev is not None and dev.type != "cpu":
            src = args[0] if args else None
            pinned = _is_pinned(src) if isinstance(src, torch.Tensor) else None
            return CopyEvent(f"torch.{name}", str(dev), False, pinned)
        return None
    if self_t is None:
        return None
    if self_t.device.type == "cpu":
        if name == "to":
            dev, non_blocking = _to_target(args, kwargs)
            if dev is not None and dev.type != "cpu":
                return CopyEvent("Tensor.to", str(dev), non_blocking, _is_pinned(self_t))
        elif name == "cuda":
            dev = args[1] if len(args) > 1 else kwargs.get("device", "cuda")
            nb = bool(kwargs.get("non_blocking", False))
            return CopyEvent("Tensor.cuda", str(dev), nb, _is_pinned(self_t))
        return None
    if name == "copy_" and len(args) > 1 and isinstance(args[1], torch.Tensor):
        if args[1].device.type == "cpu":
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            return CopyEvent("Tensor.copy_", str(self_t.device), bool(nb), _is_pinned(args[1]))
    return None


def _to_target(args, kwargs) -> tuple[torch.device | None, bool]:
    """(target device or None, non_blocking) of a ``Tensor.to`` call, parsed as PyTorch does."""
    try:
        device, _dtype, non_blocking, _fmt = torch._C._nn._parse_to(*args[1:], **kwargs)
    except Exception:  # noqa: BLE001 - the method's own error is the measured outcome
        return None, False
    return device, bool(non_blocking)


def _scalar_placeholders(args: tuple, kwargs: dict) -> tuple[tuple, dict, int]:
    """``args`` / ``kwargs`` with every 0-d ``meta`` tensor argument (top level, or inside a
    list or tuple argument) replaced by its placeholder scalar; the number replaced."""
    n = 0

    def swap(x: Any) -> Any:
        nonlocal n
        if isinstance(x, torch.Tensor) and x.device.type == "meta" and x.dim() == 0:
            n += 1
            return _placeholder("item", x)
        if isinstance(x, (list, tuple)) and not isinstance(x, torch.Size):
            return type(x)(swap(v) for v in x)
        return x

    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}, n


def _placeholder(name: str, t: torch.Tensor) -> Any:
    if name in ("__int__", "__index__"):
        return 0
    if name == "__float__":
        return 0.0
    if name == "__bool__":
        return False
    if name == "__complex__":
        return 0j
    zeros = torch.zeros(t.shape, dtype=t.dtype)
    if name == "item":
        return zeros.reshape(-1)[0].item() if zeros.numel() else 0
    if name == "tolist":
        return zeros.tolist()
    if name in ("numpy", "__array__"):
        return zeros.numpy()
    return zeros  # cpu / to("cpu")


def probe_call(fn: Callable[[], Any], placeholder_reads: bool = False) -> ProbeRecord:
    """Run ``fn()`` under :class:`SyncProbeMode`; the record keeps what it saw and the error (the
    error is caught, not raised)."""
    record = ProbeRecord()
    try:
        with SyncProbeMode(record, placeholder_reads):
            fn()
    except Exception as exc:  # noqa: BLE001 - the method's own error is the measured outcome
        record.error = f"{type(exc).__name__}: {exc}"
    return record


def probe_decode(
    methods: MropeMethods, case: MropeCase, placeholder_reads: bool = False
) -> ProbeRecord:
    """Probe one decode call with ``seq_lens`` (and the runner's device) on ``meta``. Strict
    (``placeholder_reads=False``): the first read ends the call (``record.error``); counting: every
    read answered with a placeholder and counted."""
    meta_case = case.on("meta")
    return probe_call(lambda: methods.compute(meta_case), placeholder_reads)
