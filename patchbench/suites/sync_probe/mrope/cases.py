"""One call's inputs to the mrope methods: :class:`MropeCase` and random decode / extend batches.

The same case runs on every release's methods (:mod:`.methods`); :meth:`MropeCase.on` moves it
to another device (``meta`` for the CPU probes).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from .standins import StandInMultimodalInputs


@dataclass
class MropeCase:
    """One call's inputs, shared by both releases' stand-ins.

    mode: "decode" | "extend". seq_lens: int tensor [B] on the target device (what the GPU holds;
    may be one step ahead of seq_lens_cpu in overlap mode). seq_lens_cpu: int64 CPU tensor [B].
    mm_inputs: B entries, None for a text-only request. extend_seq_lens / extend_prefix_lens:
    B ints (extend only). sessions: per request, a session object or None (0.5.23 extend).
    device: the model runner's device ("cpu", "cuda", "meta").
    """

    mode: str
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    mm_inputs: list
    device: str = "cpu"
    extend_seq_lens: list[int] | None = None
    extend_prefix_lens: list[int] | None = None
    sessions: list | None = None
    rl_on_policy_target: Any = None

    def model_runner(self) -> SimpleNamespace:
        return SimpleNamespace(device=self.device)

    def batch(self) -> SimpleNamespace:
        """The ScheduleBatch / ModelWorkerBatch stand-in (0.5.1.post3 and 0.5.23 field names)."""
        n = len(self.mm_inputs)
        return SimpleNamespace(
            multimodal_inputs=self.mm_inputs,
            extend_seq_lens=self.extend_seq_lens,
            extend_prefix_lens=self.extend_prefix_lens,
            extend_lens=self.extend_seq_lens,
            prefix_lens=self.extend_prefix_lens,
            reqs=[SimpleNamespace(session=s) for s in (self.sessions or [None] * n)],
            spec_info=None,
        )

    def fresh(self) -> MropeCase:
        """A copy whose multimodal inputs are new objects (0.5.23 caches into them)."""
        return dataclasses.replace(
            self,
            mm_inputs=[
                None
                if m is None
                else dataclasses.replace(m, mrope_position_delta_repeated_cache=None)
                for m in self.mm_inputs
            ],
        )

    def on(self, seq_device: str, device: str | None = None) -> MropeCase:
        """The same case with ``seq_lens`` moved to ``seq_device`` (``meta``: shape only) and the
        runner's device set to ``device`` (default ``seq_device``)."""
        seq = (
            torch.empty_like(self.seq_lens, device="meta")
            if seq_device == "meta"
            else self.seq_lens.to(seq_device)
        )
        return dataclasses.replace(self.fresh(), seq_lens=seq, device=device or seq_device)


def decode_case(
    rng: torch.Generator | int,
    batch_size: int,
    *,
    image_share: float = 0.5,
    multi_value_share: float = 0.0,
    ahead: bool = False,
    precomputed_share: float = 0.0,
    seq_dtype: torch.dtype = torch.int64,
    delta_range: tuple[int, int] = (-4000, 4000),
    device: str = "cpu",
) -> MropeCase:
    """A random decode batch (seeded). Image requests get a ``[1, 1]`` delta in ``delta_range``
    (zero included), or with probability ``multi_value_share`` a ``[1, k]`` delta (k 2..3);
    ``precomputed_share`` of image requests carry ``mrope_positions`` covering the whole sequence
    (0.5.23's precomputed branch); the rest carry prompt positions shorter than the sequence.
    seq_lens_cpu in 1..4096 (positions may come out negative: plain arithmetic for both variants).
    ``ahead``: seq_lens = seq_lens_cpu + 1 (overlap mode, where the device copy runs one step
    ahead of the host one)."""
    g = rng if isinstance(rng, torch.Generator) else torch.Generator().manual_seed(int(rng))

    def rand(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    seq_cpu = torch.randint(1, 4097, (batch_size,), generator=g, dtype=torch.int64)
    mm = []
    for i in range(batch_size):
        if float(torch.rand(1, generator=g)) >= image_share:
            mm.append(None)
            continue
        s = int(seq_cpu[i])
        k = rand(2, 3) if float(torch.rand(1, generator=g)) < multi_value_share else 1
        delta = torch.randint(delta_range[0], delta_range[1] + 1, (1, k), generator=g)
        if rand(0, 9) == 0:
            delta.zero_()
        if float(torch.rand(1, generator=g)) < precomputed_share:
            positions = torch.randint(0, 5000, (3, s + rand(0, 3)), generator=g)
        elif s > 1 and rand(0, 4):
            positions = torch.randint(0, 5000, (3, rand(1, s - 1)), generator=g)
        else:
            positions = None
        mm.append(StandInMultimodalInputs(delta, positions))
    seq = (seq_cpu + 1 if ahead else seq_cpu).to(seq_dtype).to(device)
    return MropeCase("decode", seq, seq_cpu, mm, device=device)


def extend_case(
    rng: torch.Generator | int, batch_size: int, *, image_share: float = 0.5, device: str = "cpu"
) -> MropeCase:
    """A random extend (prefill) batch: per request a prefix length and an extend length with
    prefix + extend = seq_len; image requests carry prompt positions ``[3, seq_len]``."""
    g = rng if isinstance(rng, torch.Generator) else torch.Generator().manual_seed(int(rng))
    ext = torch.randint(1, 300, (batch_size,), generator=g).tolist()
    pre = torch.randint(0, 300, (batch_size,), generator=g).tolist()
    seq_cpu = torch.tensor([a + b for a, b in zip(ext, pre, strict=True)], dtype=torch.int64)
    mm = []
    for i in range(batch_size):
        if float(torch.rand(1, generator=g)) >= image_share:
            mm.append(None)
        else:
            s = int(seq_cpu[i])
            mm.append(
                StandInMultimodalInputs(
                    torch.randint(-500, 500, (1, 1), generator=g),
                    torch.randint(0, 5000, (3, s), generator=g),
                )
            )
    return MropeCase(
        "extend",
        seq_cpu.to(device),
        seq_cpu,
        mm,
        device=device,
        extend_seq_lens=ext,
        extend_prefix_lens=pre,
    )
