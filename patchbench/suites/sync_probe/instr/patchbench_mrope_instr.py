"""Count (and cross-check) sglang's mrope position computations in every server process.

The sync_probe suite's in-server hook (``server_crosscheck``), imported by the site hook in every
server process of a correctness cell. With ``PATCHBENCH_MROPE_PROBE_DIR`` set it wraps
``ForwardBatch._compute_mrope_positions`` (the entry point on every release) when
``sglang.srt.model_executor.forward_batch_info`` is executed, and counts per call: ``calls``,
``decode_calls``, ``extend_calls``, ``other_calls``, ``decode_multi_image_calls`` (batch >= 2
with an image request of non-zero ``mrope_position_delta``: what the patch must get right),
``decode_image_requests_nonzero``, ``max_decode_batch``. With
``PATCHBENCH_MROPE_CROSSCHECK_REF=<a stock forward_batch_info.py>`` that file's mrope methods also
run on a shallow copy of every batch and ``crosscheck_<mode>_equal`` / ``_mismatch`` count
whether their positions equal the live ones (dtype, shape, values; identical errors are equal);
it reads results on the host, so it is for correctness cells only.

After every call the counts go atomically to ``$PATCHBENCH_MROPE_PROBE_DIR/counts.<pid>.json``:
``{"pid", "module_file", "module_sha256", "crosscheck_ref", "crosscheck_ref_sha256", "counts",
"mismatch_samples" (up to 5), "updated_unix_s"}``. Standard library, torch and
``patchbench_import_hook`` only: the server need not import ``patchbench``."""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import tempfile
import time
import types

TARGET = "sglang.srt.model_executor.forward_batch_info"
ENTRY = "_compute_mrope_positions"
_MAX_SAMPLES = 5


def load_reference_methods(path: str, module_globals: dict) -> dict:
    """The ``ForwardBatch`` mrope methods of the file at ``path``, compiled against a copy of
    ``module_globals``; RuntimeError without ``ForwardBatch._compute_mrope_positions``."""
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source, filename=path)
    nodes = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ForwardBatch":
            nodes = [n for n in node.body if isinstance(n, ast.FunctionDef) and "mrope" in n.name]
    if not any(n.name == ENTRY for n in nodes):
        raise RuntimeError(f"{path}: no ForwardBatch.{ENTRY}")
    future = ast.ImportFrom(module="__future__", names=[ast.alias(name="annotations")], level=0)
    module = ast.fix_missing_locations(ast.Module(body=[future, *nodes], type_ignores=[]))
    namespace = dict(module_globals)
    exec(compile(module, path, "exec"), namespace)
    return {n.name: namespace[n.name] for n in nodes}


class MropeCounter:
    """The counts of one process and their file; see the module docstring."""

    def __init__(self, probe_dir: str, module_file: str, ref_path: str | None):
        self.path = os.path.join(probe_dir, f"counts.{os.getpid()}.json")
        self.probe_dir = probe_dir
        self.counts: dict[str, int] = {}
        self.samples: list[dict] = []
        self.head = {
            "pid": os.getpid(),
            "module_file": module_file,
            "module_sha256": _sha256(module_file),
            "crosscheck_ref": ref_path,
            "crosscheck_ref_sha256": _sha256(ref_path) if ref_path else None,
        }

    def add(self, key: str, n: int = 1) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def write(self) -> None:
        os.makedirs(self.probe_dir, exist_ok=True)
        data = dict(
            self.head, counts=self.counts, mismatch_samples=self.samples, updated_unix_s=time.time()
        )
        fd, tmp = tempfile.mkstemp(dir=self.probe_dir, prefix=".counts.", suffix=".tmp")
        os.fchmod(fd, 0o644)  # a result file like the others, not mkstemp's 0600
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def _sha256(path: str | None) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (OSError, TypeError):
        return None


def _mode(fb) -> str:
    mode = fb.forward_mode
    if mode.is_decode():
        return "decode"
    return "extend" if mode.is_extend() else "other"


def _nonzero_image_requests(batch) -> int:
    n = 0
    for mm in getattr(batch, "multimodal_inputs", None) or []:
        delta = getattr(mm, "mrope_position_delta", None) if mm is not None else None
        if delta is not None and bool((delta != 0).any()):  # a CPU tensor: no device read
            n += 1
    return n


def _own_range():
    """A ``patchbench::instrumentation`` profiler range around this hook's own host reads, so the
    profile suite can leave them out of sglang's syncs; a no-op without torch's profiler."""
    try:
        from torch.profiler import record_function
    except ImportError:  # pragma: no cover - the server always has torch
        import contextlib

        return contextlib.nullcontext()
    return record_function("patchbench::instrumentation")


def _outcome(fn):
    try:
        fn()
        return None
    except Exception as exc:  # noqa: BLE001 - any error of the reference method is compared, not raised
        return f"{type(exc).__name__}: {exc}"


def wrap_forward_batch(module, probe_dir: str, ref_path: str | None = None) -> MropeCounter:
    """Wrap ``module.ForwardBatch._compute_mrope_positions`` (once) to count and cross-check."""
    cls = module.ForwardBatch
    if getattr(cls, "_patchbench_mrope_counter", None) is not None:
        return cls._patchbench_mrope_counter
    live = cls.__dict__[ENTRY]
    ref = load_reference_methods(ref_path, vars(module)) if ref_path else None
    counter = MropeCounter(probe_dir, getattr(module, "__file__", "?"), ref_path)

    def _compute_mrope_positions(self, model_runner, batch, *args, **kwargs):
        mode = _mode(self)
        with _own_range():
            counter.add("calls")
            counter.add(f"{mode}_calls")
            if mode == "decode":
                bs = int(self.seq_lens.shape[0])
                images = _nonzero_image_requests(batch)
                counter.counts["max_decode_batch"] = max(
                    counter.counts.get("max_decode_batch", 0), bs
                )
                counter.add("decode_image_requests_nonzero", images)
                if bs >= 2 and images:
                    counter.add("decode_multi_image_calls")
        try:
            result = live(self, model_runner, batch, *args, **kwargs)
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
            with _own_range():
                counter.add(f"{mode}_live_errors")
                if ref is not None:
                    _crosscheck(counter, ref, self, model_runner, batch, mode, None, err)
                counter.write()
            raise
        with _own_range():
            if ref is not None:
                _crosscheck(
                    counter, ref, self, model_runner, batch, mode, self.mrope_positions, None
                )
            counter.write()
        return result

    _compute_mrope_positions.__wrapped__ = live
    setattr(cls, ENTRY, _compute_mrope_positions)
    cls._patchbench_mrope_counter = counter
    counter.write()
    return counter


def _crosscheck(counter, ref, fb, model_runner, batch, mode, mine, my_error) -> None:
    other = copy.copy(fb)
    other.mrope_positions = None
    for name, fn in ref.items():  # instance attributes shadow the live class's methods
        setattr(other, name, types.MethodType(fn, other))
    their_error = _outcome(lambda: other._compute_mrope_positions(model_runner, batch))
    theirs = other.mrope_positions
    if my_error is not None or their_error is not None:
        equal = my_error == their_error
    else:
        import torch

        equal = (
            mine.dtype == theirs.dtype
            and tuple(mine.shape) == tuple(theirs.shape)
            and bool(torch.equal(mine, theirs.to(mine.device)))
        )
    counter.add(f"crosscheck_{mode}_{'equal' if equal else 'mismatch'}")
    if not equal and len(counter.samples) < _MAX_SAMPLES:

        def show(t, err):
            return err or {"dtype": str(t.dtype), "shape": list(t.shape), "head": t[:, :8].tolist()}

        bs = int(fb.seq_lens.shape[0])
        live, reference = show(mine, my_error), show(theirs, their_error)
        counter.samples.append(
            {"mode": mode, "batch_size": bs, "live": live, "reference": reference}
        )


def activate(probe_dir: str, ref_path: str | None, target: str = TARGET) -> None:
    """Wrap module ``target`` now if it is imported, else when it is (``patchbench_import_hook``)."""
    from patchbench_import_hook import wrap_on_import

    wrap_on_import(target, lambda module: wrap_forward_batch(module, probe_dir, ref_path))


if os.environ.get("PATCHBENCH_MROPE_PROBE_DIR"):
    activate(
        os.environ["PATCHBENCH_MROPE_PROBE_DIR"],
        os.environ.get("PATCHBENCH_MROPE_CROSSCHECK_REF") or None,
    )
