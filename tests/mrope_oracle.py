"""An independent statement of what sglang's mrope methods return, for the tests to check against.

Written from the semantics in docs/FACTS.md section 1 and the releases' code as read (not from their
code): plain Python over the case's numbers, no tensor arithmetic shared with the methods.
Returns ("ok", list of 3 equal-length rows) or ("error", "<Type>: <message>"). Also the random
extend (prefill) batches the tests check it on (:func:`extend_case`).
"""

from __future__ import annotations

import torch

from patchbench.suites.sync_probe.mrope import MropeCase, StandInMultimodalInputs


def _flat(t) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def expected(case: MropeCase, release: str) -> tuple[str, object]:
    """What stock sglang ``release`` ("0.5.1.post3" | "0.5.23") gives for ``case``."""
    seq = [int(v) for v in case.seq_lens.tolist()]
    seq_cpu = [int(v) for v in case.seq_lens_cpu.tolist()]
    mm = case.mm_inputs
    cols: list[list[int]] = []  # each column: [t, h, w]
    if case.mode == "extend":
        for i, m in enumerate(mm):
            pre, ext = case.extend_prefix_lens[i], case.extend_seq_lens[i]
            text = m is None or (release == "0.5.23" and case.rl_on_policy_target is not None)
            for p in range(pre, pre + ext):
                cols.append([p] * 3 if text else [int(m.mrope_positions[r, p]) for r in range(3)])
        return "ok", [[c[r] for c in cols] for r in range(3)]

    if release == "0.5.1.post3":
        # one column per delta value: seq_lens[i] - 1 + delta (delta 0 for text-only)
        for i, m in enumerate(mm):
            for d in [0] if m is None else _flat(m.mrope_position_delta):
                cols.append([seq[i] - 1 + d] * 3)
    elif release == "0.5.23":
        if case.rl_on_policy_target is not None or all(m is None for m in mm):
            cols = [[s - 1] * 3 for s in seq]
        elif any(
            m is not None
            and m.mrope_positions is not None
            and m.mrope_positions.shape[1] >= seq_cpu[i]
            for i, m in enumerate(mm)
        ):
            # per-request fallback, from the host copy seq_lens_cpu
            for i, m in enumerate(mm):
                s = seq_cpu[i]
                if m is None:
                    cols.append([s - 1] * 3)
                elif m.mrope_positions is not None and m.mrope_positions.shape[1] >= s:
                    cols.append([int(m.mrope_positions[r, s - 1]) for r in range(3)])
                else:
                    cols.extend([[d - 1 + s] * 3 for d in _flat(m.mrope_position_delta)])
        else:
            for i, m in enumerate(mm):
                d = [0] if m is None else _flat(m.mrope_position_delta)
                if len(d) != 1:
                    return "error", (
                        f"RuntimeError: a Tensor with {len(d)} elements cannot be "
                        "converted to Scalar"
                    )
                cols.append([seq[i] - 1 + d[0]] * 3)
    else:
        raise ValueError(release)
    return "ok", [[c[r] for c in cols] for r in range(3)]


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
