"""patchbench/suites/sync_probe/instr/patchbench_mrope_instr.py on stand-in ForwardBatch classes.

The module's wrapper runs around the real mrope method bodies (patched or stock file, compiled
with the sync_probe suite's stand-ins); the import-hook test runs a child Python as the server's
processes run (the site hook on PYTHONPATH, this file named in PATCHBENCH_SERVER_HOOKS) on a fake
``sglang`` package.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from patchbench.shims import HOOKS_ENV, SITE_DIR
from patchbench.suites.sync_probe.mrope import (
    MropeCase,
    MropeMethods,
    StandInMode,
    StandInMultimodalInputs,
)
from tools.mrope_sources import release_sources

HOOK = (
    Path(__file__).resolve().parents[2]
    / "patchbench/suites/sync_probe/instr/patchbench_mrope_instr.py"
)
sys.path.insert(0, str(HOOK.parent))
import patchbench_mrope_instr as instr  # noqa: E402

from tests.patches.test_import_hooks import child, fake_sglang  # noqa: E402


def _module(path: Path | str, source: str | None = None) -> types.ModuleType:
    """A module object holding ForwardBatch = the file's mrope methods over stand-in globals."""
    methods = MropeMethods(source if source is not None else Path(path), str(path))
    mod = types.ModuleType("fake_forward_batch_info")
    mod.__dict__.update(next(iter(methods.methods.values())).__globals__)
    mod.__file__ = str(path)
    mod.ForwardBatch = type("ForwardBatch", (), dict(methods.methods))
    mod.methods = methods
    return mod


def _call(mod, case: MropeCase):
    fb = mod.ForwardBatch()
    fb.forward_mode, fb.seq_lens, fb.seq_lens_cpu = (
        StandInMode(case.mode),
        case.seq_lens,
        case.seq_lens_cpu,
    )
    fb.mrope_positions = None
    fb._compute_mrope_positions(case.model_runner(), case.batch())
    return fb.mrope_positions


def _counts(probe_dir: Path) -> dict:
    files = list(probe_dir.glob("counts.*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def _p1() -> MropeCase:
    seq = torch.tensor([500, 500, 7])
    return MropeCase(
        "decode",
        seq,
        seq,
        [
            StandInMultimodalInputs(torch.tensor([[-100]])),
            StandInMultimodalInputs(torch.tensor([[-50]])),
            None,
        ],
    )


@pytest.mark.parametrize("release", ["0.5.1.post3", "0.5.23"])
def test_counts_and_crosscheck_equal(tmp_path, release):
    src = release_sources(release)
    mod = _module(src["patched"])
    instr.wrap_forward_batch(mod, str(tmp_path), str(src["stock"]))
    assert _call(mod, _p1()).tolist() == [[399, 449, 6]] * 3  # the live (patched) result is kept
    one = MropeCase(
        "decode",
        torch.tensor([9]),
        torch.tensor([9]),
        [StandInMultimodalInputs(torch.tensor([[-3]]))],
    )
    _call(mod, one)  # batch of one: not a multi-request image batch
    text = MropeCase("decode", torch.tensor([4, 5]), torch.tensor([4, 5]), [None, None])
    _call(mod, text)  # no image
    zero = MropeCase(
        "decode",
        torch.tensor([4, 5]),
        torch.tensor([4, 5]),
        [StandInMultimodalInputs(torch.tensor([[0]])), None],
    )
    _call(mod, zero)  # image with delta 0: not counted as non-zero
    ext = MropeCase(
        "extend",
        torch.tensor([3]),
        torch.tensor([3]),
        [StandInMultimodalInputs(torch.tensor([[0]]), torch.tensor([[0, 1, 2]] * 3))],
        extend_seq_lens=[3],
        extend_prefix_lens=[0],
    )
    _call(mod, ext)
    data = _counts(tmp_path)
    assert data["crosscheck_ref"] == str(src["stock"]) and data["mismatch_samples"] == []
    assert data["counts"] == {
        "calls": 5,
        "decode_calls": 4,
        "extend_calls": 1,
        "max_decode_batch": 3,
        "decode_image_requests_nonzero": 3,
        "decode_multi_image_calls": 1,
        "crosscheck_decode_equal": 4,
        "crosscheck_extend_equal": 1,
    }


def test_crosscheck_catches_a_mismatch(tmp_path):
    src = release_sources("0.5.23")
    text = Path(src["patched"]).read_text()
    wrong = text.replace(
        "positions_1d = (deltas - 1) + seq_lens_int64", "positions_1d = deltas + seq_lens_int64"
    )
    assert wrong != text
    mod = _module(tmp_path / "wrong.py", wrong)
    instr.wrap_forward_batch(mod, str(tmp_path / "probe"), str(src["stock"]))
    assert _call(mod, _p1()).tolist() == [[400, 450, 7]] * 3  # off by one, as written
    data = _counts(tmp_path / "probe")
    assert data["counts"]["crosscheck_decode_mismatch"] == 1
    assert "crosscheck_decode_equal" not in data["counts"]
    sample = data["mismatch_samples"][0]
    assert sample["live"]["head"][0] == [400, 450, 7]
    assert sample["reference"]["head"][0] == [399, 449, 6]


def test_same_error_counts_as_equal_and_is_reraised(tmp_path):
    src = release_sources("0.5.23")
    mod = _module(src["patched"])
    instr.wrap_forward_batch(mod, str(tmp_path), str(src["stock"]))
    case = MropeCase(
        "decode",
        torch.tensor([10, 3]),
        torch.tensor([10, 3]),
        [StandInMultimodalInputs(torch.tensor([[5, -7]])), None],
    )
    with pytest.raises(RuntimeError, match="2 elements cannot be converted"):
        _call(mod, case)
    counts = _counts(tmp_path)["counts"]
    assert counts["decode_live_errors"] == 1 and counts["crosscheck_decode_equal"] == 1


def test_import_hook_through_the_site_hook(tmp_path):
    pkg = fake_sglang(tmp_path / "pkg")
    probe = tmp_path / "probe"
    code = (
        "import types\n"
        "from sglang.srt.model_executor import forward_batch_info as m\n"
        "fb = m.ForwardBatch()\n"
        "fb.forward_mode = types.SimpleNamespace(is_decode=lambda: True, is_extend=lambda: False)\n"
        "fb.seq_lens = types.SimpleNamespace(shape=(2,))\n"
        "fb._compute_mrope_positions(None, types.SimpleNamespace(multimodal_inputs=[None, None]))\n"
        "print(fb.mrope_positions, m.ForwardBatch._compute_mrope_positions.__wrapped__.__name__)\n"
    )
    env = {HOOKS_ENV: str(HOOK), "PATCHBENCH_MROPE_PROBE_DIR": str(probe)}
    proc = child(code, env, [SITE_DIR, pkg])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["live", "_compute_mrope_positions"]
    data = _counts(probe)
    assert data["module_file"].endswith("sglang/srt/model_executor/forward_batch_info.py")
    assert data["counts"] == {
        "calls": 1,
        "decode_calls": 1,
        "max_decode_batch": 2,
        "decode_image_requests_nonzero": 0,
    }


def _write_counts(d: Path, pid: int, counts: dict, **extra) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / f"counts.{pid}.json").write_text(json.dumps(dict({"pid": pid, "counts": counts}, **extra)))


def test_merge_counts_sums_events_and_takes_the_max_of_maxima(tmp_path):
    from patchbench.suites.sync_probe import merge_counts

    _write_counts(
        tmp_path,
        1,
        {"calls": 3, "decode_calls": 2, "max_decode_batch": 4, "crosscheck_decode_equal": 2},
        module_sha256="aa",
    )
    _write_counts(
        tmp_path,
        2,
        {
            "calls": 5,
            "decode_calls": 1,
            "max_decode_batch": 7,
            "crosscheck_decode_equal": 1,
            "crosscheck_decode_mismatch": 1,
        },
        module_sha256="aa",
        mismatch_samples=[{"mode": "decode"}],
    )
    (tmp_path / "counts.3.json").write_text("{not json")
    m = merge_counts(tmp_path)
    assert m["processes"] == 2 and m["replicated"] is False
    assert m["counts"] == {
        "calls": 8,
        "decode_calls": 3,
        "max_decode_batch": 7,
        "crosscheck_decode_equal": 3,
        "crosscheck_decode_mismatch": 1,
    }
    assert m["module_sha256"] == ["aa"] and m["mismatch_samples"] == [{"mode": "decode"}]
    assert len(m["unreadable"]) == 1 and m["unreadable"][0].startswith("counts.3.json")


def test_merge_counts_of_replicated_ranks_counts_each_batch_once(tmp_path):
    from patchbench.suites.sync_probe import merge_counts

    c = {
        "calls": 4,
        "decode_calls": 3,
        "extend_calls": 1,
        "max_decode_batch": 2,
        "crosscheck_decode_equal": 3,
    }
    _write_counts(tmp_path, 10, c)
    _write_counts(tmp_path, 11, c)
    m = merge_counts(tmp_path)
    assert m["replicated"] is True and m["counts"] == c
    assert merge_counts(tmp_path / "none")["processes"] == 0


def test_instrumentation_hook_env_path_and_switch(tmp_path):
    from patchbench.suite import get_suite

    suite = get_suite("sync_probe")
    ctx = types.SimpleNamespace(
        out_dir=tmp_path / "sync_probe", stock_sglang_dir=tmp_path / "sglang"
    )
    assert suite.instrumentation(ctx, suite.Params()) is None
    ins = suite.instrumentation(ctx, suite.Params(server_crosscheck=True))
    assert ins.hooks == [HOOK] and ins.perturbs_timing is True
    assert ins.out_dir == tmp_path / "sync_probe" / "mrope_instr"
    assert ins.env == {
        "PATCHBENCH_MROPE_PROBE_DIR": str(ins.out_dir),
        "PATCHBENCH_MROPE_CROSSCHECK_REF": str(
            tmp_path / "sglang" / "srt" / "model_executor" / "forward_batch_info.py"
        ),
    }
    _write_counts(ins.out_dir, 5, {"calls": 1})
    assert ins.collect(ins.out_dir)["counts"] == {"calls": 1}
