"""The site hook, loaded by every Python process of the sglang server (this folder is on its
PYTHONPATH after the overlay); the only patchbench code in the server. Standard library only
until a switch needs torch; runs once per process; nothing happens without its switches:

- PATCHBENCH_CPU_STAND_INS=1: torch compatibility for the CPU engine and handles for the
  ``torch.ops.sgl_kernel.*_cpu`` ops sglang takes at import time (0.5.23), each raising with the
  PATCHBENCH-STAND-IN-CALLED marker when called;
- PATCHBENCH_STABLE_VOCAB_ORDER=1: tokenizers return their vocabulary in id order;
- PATCHBENCH_STREAM_ERRORS=1 (bench_serving, the client): an ``{"error": ...}`` chunk that a
  server streams inside a 200 answer fails that request with the server's text (the tool skipped
  such a chunk as one without text and counted the request a success);
- PATCHBENCH_SERVER_HOOKS: ``os.pathsep``-separated hook files (the suites'
  ``Instrumentation.hooks``), each imported by path as a top-level module named after its stem;
  one that fails prints its traceback to stderr (the server log) and the rest still load.

Then the next sitecustomize.py on ``sys.path`` runs, as Python would have run it without us.
"""

import os
import sys
import types

_MARKER = "PATCHBENCH-STAND-IN-CALLED"
#: set on ``sys`` by the first execution of this file in a process
_RAN = "_patchbench_site_hook_ran"


def _cpu_stand_ins() -> None:
    # sglang 0.5.6-0.5.x refuse to start when torch's cuDNN has a known conv3d bug: a GPU check
    # that a CPU server must skip (inherited by the scheduler processes)
    os.environ.setdefault("SGLANG_DISABLE_CUDNN_CHECK", "1")
    import torch

    # torch >= 2.9 dropped this; sglang 0.5.1.post3's utils.cpu_has_amx_support() calls it.
    if not hasattr(torch._C._cpu, "_is_amx_tile_supported"):
        torch._C._cpu._is_amx_tile_supported = lambda: False
    # A CPU build of torch with PyPI's (CUDA-built) torchvision: its C ops cannot load and
    # torchvision/_meta_registrations.py raises at import; sglang uses only pure-python transforms.
    if "+cpu" in torch.__version__:
        sys.modules.setdefault(
            "torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations")
        )

    import torch._ops

    # op handles grabbed at import time by sglang 0.5.23 CPU-engine modules (not AMX-gated);
    # anything else stays missing so hasattr() probes keep answering False.
    import_time_ops = {
        "fused_sigmoid_mul_cpu",
        "fused_qk_gemma_rmsnorm_cpu",
        "fused_qk_gemma_rmsnorm_with_gate_cpu",
        "fused_qkvzba_split_reshape_cat_contiguous_cpu",
        "fused_moe_router_cpu",
        "rmsnorm_cpu",
        "fused_dual_residual_rmsnorm_cpu",
        "fused_gdn_gating_cpu",
        "fused_sigmoid_gating_delta_rule_update_cpu",
    } | (set(os.environ.get("PATCHBENCH_SGL_KERNEL_OPS", "").split(",")) - {""})

    class _StandInOps(torch._ops._OpNamespace):
        def __getattr__(self, op_name):
            if op_name.startswith("__"):
                raise AttributeError(op_name)
            try:
                return super().__getattr__(op_name)
            except (AttributeError, RuntimeError):
                pass
            if op_name not in import_time_ops:
                raise AttributeError(f"sgl_kernel CPU stand-in has no op {op_name}")

            def stand_in(*args, _name=op_name, **kwargs):
                msg = f"{_MARKER}: torch.ops.sgl_kernel.{_name} (CPU stand-in; not implemented)"
                print(msg, file=sys.stderr, flush=True)
                raise NotImplementedError(msg)

            object.__setattr__(self, op_name, stand_in)
            return stand_in

    torch.ops.__dict__["sgl_kernel"] = _StandInOps("sgl_kernel")


def _stable_vocab_order() -> None:
    # bench_serving's random datasets draw prompt tokens from tokenizer.get_vocab(), whose order
    # (a Rust HashMap's) differs from process to process: in id order the seeded draw is the same
    try:
        import transformers as tf
    except ImportError:
        return

    def stable(get_vocab):
        def get_vocab_in_id_order(self):
            return dict(sorted(get_vocab(self).items(), key=lambda kv: kv[1]))

        get_vocab_in_id_order._patchbench_stable = True
        return get_vocab_in_id_order

    for name in ("PreTrainedTokenizerFast", "PreTrainedTokenizer", "TokenizersBackend"):
        cls = getattr(tf, name, None)
        fn = getattr(cls, "get_vocab", None) if cls is not None else None
        if fn is not None and not getattr(fn, "_patchbench_stable", False):
            cls.get_vocab = stable(fn)


def _import_hooks(paths: str) -> None:
    """Import each file of ``paths`` (os.pathsep-separated) as a top-level module named after it."""
    import importlib.util
    import traceback

    for path in (p for p in paths.split(os.pathsep) if p):
        name = os.path.splitext(os.path.basename(path))[0]
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None:
                raise ImportError(f"not a Python file: {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - one broken hook must not stop the server's start
            sys.modules.pop(name, None)
            print(f"patchbench site hook: importing {path} failed:", file=sys.stderr)
            traceback.print_exc()


def _chain() -> None:
    """Run the first sitecustomize.py on sys.path *after* this file's folder, as Python would have
    without us."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(e) if e else "" for e in sys.path]
    if here not in entries:
        return
    for entry in entries[entries.index(here) + 1 :]:
        if not entry or entry == here:
            continue
        cand = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_patchbench_next_sitecustomize", cand)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return


def _stream_errors() -> None:
    # bench_serving's async_request_* parse each streamed chunk with json.loads (0.5.1.post3) or
    # orjson.loads (0.5.23) and skip a chunk without "text": called from there, an error chunk
    # raises instead, so the tool fails the request with its text; other callers are untouched.
    import json

    def wrap(loads):
        def checked(*args, **kwargs):
            data = loads(*args, **kwargs)
            if isinstance(data, dict) and data.get("error") and not data.get("text"):
                caller = sys._getframe(1).f_code.co_name
                if caller.startswith("async_request_"):
                    raise ValueError(f"the server streamed an error: {data['error']}")
            return data

        return checked

    json.loads = wrap(json.loads)
    try:
        import orjson
    except ImportError:
        return
    try:
        orjson.loads = wrap(orjson.loads)
    except (AttributeError, TypeError):  # a read-only extension module: 0.5.23's chunks pass
        pass


if not getattr(sys, _RAN, False):
    setattr(sys, _RAN, True)
    if os.environ.get("PATCHBENCH_CPU_STAND_INS") == "1":
        _cpu_stand_ins()
    if os.environ.get("PATCHBENCH_STABLE_VOCAB_ORDER") == "1":
        _stable_vocab_order()
    if os.environ.get("PATCHBENCH_STREAM_ERRORS") == "1":
        _stream_errors()
    if os.environ.get("PATCHBENCH_SERVER_HOOKS"):
        _import_hooks(os.environ["PATCHBENCH_SERVER_HOOKS"])
    _chain()
