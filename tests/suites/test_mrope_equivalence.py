"""The patched mrope methods give exactly stock sglang's positions (or stock's error), per release.

The real method bodies of the stock and the patched ``forward_batch_info.py`` run (extracted with
``ast``; patchbench.suites.sync_probe.mrope), on randomised decode and extend batches, and both are also checked
against tests/mrope_oracle.py, an independent plain-Python statement of the semantics. Case P1
(docs/cases.md) has hand-computed numbers. Stock files: the installed package when its version
matches, else the release's wheel (pip download, cached in .cache/), so both releases run here
under the .venv torch.
"""

from __future__ import annotations

import pytest
import torch
from mrope_oracle import expected, extend_case

from patchbench.suites.sync_probe.mrope import (
    MropeCase,
    MropeMethods,
    StandInMultimodalInputs,
    decode_case,
    run_outcome,
)

RELEASES = ["0.5.1.post3", "0.5.23"]


@pytest.fixture(scope="module")
def methods(mrope_methods) -> dict[tuple[str, str], MropeMethods]:
    return mrope_methods


def _check_same(methods, release: str, case: MropeCase) -> str:
    """Stock, patched and the oracle agree on ``case``; returns "ok" or "error"."""
    want_kind, want = expected(case, release)
    kinds = {}
    for variant in ("stock", "patched"):
        kind, got = run_outcome(methods[release, variant], case)
        kinds[variant] = kind
        assert kind == want_kind, (release, variant, got, want)
        if kind == "error":
            assert got == want, (release, variant)
        else:
            assert got.dtype == torch.int64, (release, variant, got.dtype)
            assert tuple(got.shape) == (3, len(want[0])), (release, variant, got.shape)
            assert got.tolist() == want, (release, variant)
    return want_kind


def _p1(device: str = "cpu", ahead: int = 0) -> MropeCase:
    seq_cpu = torch.tensor([500, 500, 7])
    mm = [
        StandInMultimodalInputs(torch.tensor([[-100]])),
        StandInMultimodalInputs(torch.tensor([[-50]])),
        None,
    ]
    return MropeCase("decode", (seq_cpu + ahead).to(device), seq_cpu, mm, device=device)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("variant", ["stock", "patched"])
def test_p1_hand_computed(methods, release, variant):
    # P1: deltas -100 and -50 at length 500 -> 399 and 449; text-only at length 7 -> 6
    got = methods[release, variant].compute(_p1())
    assert got.dtype == torch.int64
    assert got.tolist() == [[399, 449, 6], [399, 449, 6], [399, 449, 6]]
    # overlap mode: seq_lens one step ahead of seq_lens_cpu; every release uses seq_lens here
    got = methods[release, variant].compute(_p1(ahead=1))
    assert got.tolist() == [[400, 450, 7]] * 3


def test_p1_ahead_is_not_silently_the_cpu_copy(methods):
    # the oracle itself distinguishes the two copies (guards against a test that cannot fail)
    assert expected(_p1(ahead=1), "0.5.23")[1] != expected(_p1(), "0.5.23")[1]


@pytest.mark.parametrize("release", RELEASES)
def test_decode_random_batches(methods, release):
    g = torch.Generator().manual_seed(9460)
    sizes = [1, 2, 3, 256] + torch.randint(1, 257, (40,), generator=g).tolist()
    seen = {"ok": 0, "error": 0, "ahead": 0, "multi": 0, "text_only": 0, "int32": 0}
    for n, bs in enumerate(sizes):
        ahead = n % 3 == 0
        share = [0.0, 0.3, 0.7, 1.0][n % 4]
        multi = 0.05 if n % 5 == 1 else 0.0
        dtype = torch.int32 if n % 2 else torch.int64
        case = decode_case(
            g, bs, image_share=share, multi_value_share=multi, ahead=ahead, seq_dtype=dtype
        )
        seen[_check_same(methods, release, case)] += 1
        seen["ahead"] += ahead
        seen["int32"] += dtype == torch.int32
        seen["text_only"] += all(m is None for m in case.mm_inputs)
        seen["multi"] += any(
            m is not None and m.mrope_position_delta.numel() > 1 for m in case.mm_inputs
        )
    # the randomised batches did exercise what they are meant to
    assert seen["multi"] >= 3 and seen["ahead"] >= 10 and seen["text_only"] >= 5
    if release == "0.5.23":
        assert seen["error"] >= 3  # multi-value deltas: .item() raises, in stock and patched
    else:
        assert seen["error"] == 0


def test_multi_value_delta(methods):
    # request 0: delta [[5, -7]] at length 10 -> two columns 14 and 2; text-only at length 3 -> 2
    case = MropeCase(
        "decode",
        torch.tensor([10, 3]),
        torch.tensor([10, 3]),
        [StandInMultimodalInputs(torch.tensor([[5, -7]])), None],
    )
    for variant in ("stock", "patched"):
        assert methods["0.5.1.post3", variant].compute(case.fresh()).tolist() == [[14, 2, 2]] * 3
        kind, err = run_outcome(methods["0.5.23", variant], case)
        assert (kind, err) == (
            "error",
            "RuntimeError: a Tensor with 2 elements cannot be converted to Scalar",
        )


def test_zero_and_negative_deltas_and_length_one(methods):
    # delta 0 on an image request and a negative position: 1 - 1 - 3 = -3, 2 - 1 + 0 = 1
    case = MropeCase(
        "decode",
        torch.tensor([1, 2]),
        torch.tensor([1, 2]),
        [
            StandInMultimodalInputs(torch.tensor([[-3]])),
            StandInMultimodalInputs(torch.tensor([[0]])),
        ],
    )
    for release in RELEASES:
        for variant in ("stock", "patched"):
            assert methods[release, variant].compute(case.fresh()).tolist() == [[-3, 1]] * 3


def test_0523_rl_on_policy_target(methods):
    g = torch.Generator().manual_seed(7)
    for bs in (1, 5, 64):
        case = decode_case(g, bs, image_share=0.6, ahead=bool(bs % 2))
        case.rl_on_policy_target = "fsdp"
        _check_same(methods, "0.5.23", case)
    # images ignored: positions are seq_lens - 1
    case = _p1()
    case.rl_on_policy_target = "fsdp"
    assert methods["0.5.23", "patched"].compute(case).tolist() == [[499, 499, 6]] * 3


def test_0523_precomputed_positions(methods):
    g = torch.Generator().manual_seed(11)
    for n in range(12):
        case = decode_case(
            g,
            int(torch.randint(1, 65, (1,), generator=g)),
            image_share=0.7,
            precomputed_share=0.5,
            ahead=bool(n % 2),
            multi_value_share=0.2 if n % 3 == 0 else 0.0,
        )
        _check_same(methods, "0.5.23", case)
    # hand case: request 0 carries positions for the whole sequence (length 3): column 2 is used
    pos = torch.tensor([[0, 1, 2], [0, 5, 6], [0, 7, 8]])
    case = MropeCase(
        "decode",
        torch.tensor([4, 11]),
        torch.tensor([3, 10]),
        [
            StandInMultimodalInputs(torch.tensor([[0]]), pos),
            StandInMultimodalInputs(torch.tensor([[-4]])),
        ],
    )
    for variant in ("stock", "patched"):
        # fallback uses seq_lens_cpu: request 1 -> -4 - 1 + 10 = 5
        assert methods["0.5.23", variant].compute(case.fresh()).tolist() == [[2, 5], [6, 5], [8, 5]]


@pytest.mark.parametrize("release", RELEASES)
def test_extend_unchanged(methods, release):
    g = torch.Generator().manual_seed(3)
    for bs in (1, 2, 7, 33):
        _check_same(methods, release, extend_case(g, bs, image_share=0.5))
    if release == "0.5.23":
        case = extend_case(g, 9, image_share=0.8)
        case.rl_on_policy_target = "fsdp"
        _check_same(methods, release, case)
    # hand case: text-only prefix 2, extend 3 -> 2, 3, 4; image prefix 1, extend 2 -> its columns 1, 2
    pos = torch.tensor([[0, 1, 2], [0, 10, 20], [0, 100, 200]])
    case = MropeCase(
        "extend",
        torch.tensor([5, 3]),
        torch.tensor([5, 3]),
        [None, StandInMultimodalInputs(torch.tensor([[0]]), pos)],
        extend_seq_lens=[3, 2],
        extend_prefix_lens=[2, 1],
    )
    for variant in ("stock", "patched"):
        got = methods[release, variant].compute(case.fresh())
        assert got.tolist() == [[2, 3, 4, 1, 2], [2, 3, 4, 10, 20], [2, 3, 4, 100, 200]]
