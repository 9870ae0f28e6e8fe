"""The import-time stand-ins and the site hooks (patchbench/shims)."""

import os
import subprocess
import sys

import pytest

from patchbench.run.server import scan_log
from patchbench.shims import CALLED_MARKER, SITE_DIR, available_stand_ins, stand_in_path


def _py(code: str, env_extra: dict, pythonpath: list) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath), **env_extra)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_available_stand_ins_and_unknown_name():
    assert available_stand_ins() == ["sgl_kernel", "vllm"]
    with pytest.raises(KeyError, match="available: sgl_kernel, vllm"):
        stand_in_path("flashinfer")


def test_sgl_kernel_stand_in_resolves_names_and_raises_with_marker_when_called(tmp_path):
    code = (
        "import sgl_kernel\nfrom sgl_kernel.kvcacheio import transfer_kv_all_layer\n"
        "f = sgl_kernel.allreduce\nprint('resolved', f.__name__)\n"
        "try:\n    import sgl_kernel.scalar_type\nexcept ImportError:\n    print('no scalar_type')\n"
        "f(1)\n"
    )
    p = _py(code, {}, [stand_in_path("sgl_kernel")])
    assert "resolved allreduce" in p.stdout
    assert "no scalar_type" in p.stdout  # other submodules stay missing (sglang's fallbacks)
    assert p.returncode != 0 and "NotImplementedError" in p.stderr
    log = tmp_path / "server.log"
    log.write_text("INFO started\n" + p.stderr)
    hits = scan_log(log, CALLED_MARKER)
    assert hits and "sgl_kernel.allreduce" in hits[0]


@pytest.mark.needs_sglang  # loads a release environment / torch
def test_torch_ops_handles_only_for_import_time_names():
    code = (
        "import torch\nf = torch.ops.sgl_kernel.rmsnorm_cpu\nprint('handle ok')\n"
        "print(hasattr(torch.ops.sgl_kernel, 'not_an_op_cpu'))\nf()\n"
    )
    p = _py(code, {"PATCHBENCH_CPU_STAND_INS": "1"}, [SITE_DIR])
    assert "handle ok" in p.stdout and "False" in p.stdout
    assert CALLED_MARKER in p.stderr and "rmsnorm_cpu" in p.stderr


def test_nothing_happens_without_the_switches():
    p = _py("import sys; print('torch' in sys.modules)", {}, [SITE_DIR])
    assert p.returncode == 0 and p.stdout.strip() == "False"


@pytest.mark.needs_sglang  # loads a release environment / torch
def test_stable_vocab_order_makes_get_vocab_the_same_in_every_process(tmp_path):
    from patchbench.envs.tinymodel import build_tiny_qwen25vl, default_model_dir

    model = build_tiny_qwen25vl(default_model_dir())
    code = (
        "from transformers import AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({str(model)!r})\n"
        "v = list(t.get_vocab().values())\n"
        "print(v == sorted(v))\n"
    )
    # ids are unique, so id order is one order: the same in every process (no second process)
    a = _py(code, {"PATCHBENCH_STABLE_VOCAB_ORDER": "1"}, [SITE_DIR])
    assert a.returncode == 0, a.stderr[-1000:]
    assert a.stdout.split() == ["True"]
