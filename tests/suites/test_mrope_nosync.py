"""No host sync in the patched decode path, shown on the CPU.

Two observations, both from patchbench.suites.sync_probe.mrope, on the real method bodies:
- device-to-host reads: the decode path runs with ``seq_lens`` on the ``meta`` device (shape, no
  data); reading a value raises there (strict), or, in counting mode, is answered with a
  placeholder and counted;
- host-to-device copies: a TorchFunctionMode records every copy to the runner's device (``meta``
  here) with its ``non_blocking`` flag and whether the source memory is pinned.
Stock 0.5.1.post3 is caught by the reads (two ``int(seq_lens[i])`` per request) and its blocking
per-request copies; stock 0.5.23 by its one blocking ``torch.tensor(deltas, device=...)``; the
upstream change (0.5.2rc2) by the read of a text-only request in a mixed batch; the patched path by
neither.
"""

from __future__ import annotations

import pytest
import torch

from patchbench.suites.sync_probe.mrope import (
    MropeCase,
    MropeMethods,
    ProbeRecord,
    StandInMultimodalInputs,
    decode_case,
    probe_decode,
)
from tools.mrope_sources import stock_source

RELEASES = ["0.5.1.post3", "0.5.23"]
META_READ = "RuntimeError: Tensor.item() cannot be called on meta tensors"


@pytest.fixture(scope="module")
def methods(mrope_methods) -> dict[tuple[str, str], MropeMethods]:
    return mrope_methods


def _mixed(bs: int, seed: int = 5) -> MropeCase:
    """bs requests, the first an image request with delta -100, every third text-only."""
    case = decode_case(seed, bs, image_share=1.0)
    for i in range(1, bs, 3):
        case.mm_inputs[i] = None
    case.mm_inputs[0] = StandInMultimodalInputs(torch.tensor([[-100]]))
    return case


def test_probe_sees_a_read_and_a_blocking_copy():
    # the probe machinery itself: a read of a meta tensor and a blocking copy are recorded
    def fn():
        s = torch.empty(3, device="meta")
        torch.tensor([1, 2], device="meta")
        torch.ones(2).to("meta", non_blocking=True)
        int(s[0])

    from patchbench.suites.sync_probe.mrope import probe_call

    rec = probe_call(fn)
    assert rec.reads == ["Tensor.__int__ of meta"] and rec.error == META_READ
    assert [(c.api, c.blocking, c.pinned) for c in rec.copies] == [
        ("torch.tensor", True, None),
        ("Tensor.to", False, False),
    ]


@pytest.mark.parametrize("bs", [1, 8, 64])
def test_stock_0513_caught_by_the_read(methods, bs):
    case = _mixed(bs)
    strict = probe_decode(methods["0.5.1.post3", "stock"], case)
    # caught: int(self.seq_lens[i]) reads the device tensor; on meta it raises at the first one
    assert strict.error == META_READ
    assert strict.reads == ["Tensor.__int__ of meta"]
    counted = probe_decode(methods["0.5.1.post3", "stock"], case, placeholder_reads=True)
    # counted to the end: two reads per request, and one blocking copy per request
    assert counted.error is None
    assert len(counted.reads) == 2 * bs
    assert len(counted.blocking_copies) == bs


@pytest.mark.parametrize("bs", [1, 8, 64])
def test_stock_0523_caught_by_the_blocking_copy(methods, bs):
    rec = probe_decode(methods["0.5.23", "stock"], _mixed(bs))
    # caught: torch.tensor(deltas_list, device=<device>) is a blocking copy from pageable memory
    assert rec.error is None and rec.reads == []
    assert [(c.api, c.blocking) for c in rec.copies] == [("torch.tensor", True)]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("bs", [1, 2, 8, 64, 256])
def test_patched_has_no_read_and_no_blocking_copy(methods, release, bs):
    for image_share in (1.0, 0.5):
        case = _mixed(bs) if image_share == 0.5 else decode_case(bs, bs, image_share=1.0)
        for placeholder in (False, True):
            rec = probe_decode(methods[release, "patched"], case, placeholder_reads=placeholder)
            assert rec.error is None and rec.reads == [], rec.to_json()
            # one copy for the whole batch, non-blocking; not pinned because the target is not CUDA
            assert [(c.api, c.non_blocking, c.pinned) for c in rec.copies] == [
                ("Tensor.to", True, False)
            ], rec.to_json()


@pytest.mark.parametrize("release", RELEASES)
def test_text_only_batch_copies_nothing(methods, release):
    case = decode_case(1, 16, image_share=0.0)
    rec = probe_decode(methods[release, "patched"], case)
    assert (rec.reads, rec.copies, rec.error) == ([], [], None)
    if release == "0.5.23":  # stock 0.5.23's text-only branch was already sync-free
        assert probe_decode(methods[release, "stock"], case).copies == []


def test_patched_multi_value_0513_one_copy(methods):
    case = MropeCase(
        "decode",
        torch.tensor([10, 3, 8]),
        torch.tensor([10, 3, 8]),
        [
            StandInMultimodalInputs(torch.tensor([[5, -7]])),
            None,
            StandInMultimodalInputs(torch.tensor([[2]])),
        ],
    )
    rec = probe_decode(methods["0.5.1.post3", "patched"], case)
    assert rec.reads == [] and rec.error is None
    assert [(c.api, c.non_blocking) for c in rec.copies] == [("Tensor.to", True)]


def test_upstream_pr9460_read_remains_for_text_requests():
    # docs/FACTS.md section 1's inferred caveat, shown: 0.5.2rc2 (the upstream change) is read-free
    # only when every request has an image; torch.full(fill_value=<0-d device tensor>) reads
    upstream = MropeMethods(stock_source("0.5.2rc2"), "0.5.2rc2")
    all_images = probe_decode(upstream, decode_case(3, 8, image_share=1.0))
    assert all_images.error is None and all_images.reads == []
    assert len(all_images.copies) == 8  # one non-blocking copy per request
    mixed = probe_decode(upstream, _mixed(8))
    assert mixed.error == META_READ
    assert mixed.reads == ["full (reads a meta tensor's value)"]


def test_probe_record_json_roundtrip(methods):
    rec = probe_decode(methods["0.5.23", "stock"], _mixed(2))
    assert isinstance(rec, ProbeRecord)
    assert rec.to_json()["copies"][0] == {
        "api": "torch.tensor",
        "target": "meta",
        "non_blocking": False,
        "pinned": None,
        "blocking": True,
    }
