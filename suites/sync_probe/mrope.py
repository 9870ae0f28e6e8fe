"""Run sglang's mrope position methods outside sglang, and probe them for host syncs.

sglang's ``ForwardBatch`` computes ``mrope_positions`` (int64, shape ``[3, num_tokens]``) for models
with multimodal rotary embedding (docs/FACTS.md section 1). Importing the real module needs the whole
sglang package (Triton kernels, runtime context), which a lent GPU machine does not have, so this
module takes the *source* of a ``forward_batch_info.py`` (stock or patched, any release), extracts
the ``ForwardBatch`` methods whose name contains ``mrope`` with :mod:`ast`, and executes them
against small stand-ins for what they reference (:func:`load_mrope_methods`). The real method
bodies run; only their surroundings are stand-ins.

It also holds the probes the tests, ``suites/sync_probe`` and ``scripts/gpu_probe.py`` share:

- :class:`SyncProbeMode` (a ``torch.overrides.TorchFunctionMode``) records device-to-host reads
  (``int()``, ``.item()``, ``.tolist()``, ... of a non-CPU tensor) and host-to-device copies
  (``torch.tensor(data, device=...)``, ``.to(device, non_blocking=...)``, ``.copy_``, ``.cuda``)
  with their ``non_blocking`` flag and whether the source memory is pinned. Run with ``seq_lens``
  on the ``meta`` device (a tensor without data) a read either raises (strict) or is answered with
  a placeholder and counted (counting mode; a call that reads a 0-d meta tensor argument, like
  ``torch.full``'s fill value, is counted and run again with a placeholder scalar).
- :func:`cuda_sync_warnings` and :func:`cuda_host_blocked_ms` measure the same on a real GPU.

Sources: :func:`release_sources` gives the stock file of a release (the installed package when its
version matches, else unpacked from the release wheel that ``patchbench.patches.wheels.fetch_wheel`` caches) and the
patched one (the stock file with ``patches/<patch>/<release>.diff`` applied by ``git apply``),
both checked against the sha256 values in the patch manifest.

Standard library and torch only at import time (PyYAML is imported inside :func:`patch_manifest`):
``scripts/gpu_probe.py`` loads this file by path on a machine with only python3 and torch.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import hashlib
import importlib.metadata
import shutil
import subprocess
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

REPO = Path(__file__).resolve().parents[2]  # suites/sync_probe/mrope.py -> the repository
#: the target file, relative to site-packages (and to the ``sglang`` folder's parent)
FBI_REL = "sglang/srt/model_executor/forward_batch_info.py"
DEFAULT_PATCH = "mrope-sync-free"
DEFAULT_CACHE = REPO / ".cache" / "mrope-sources"


class MropeSourceError(RuntimeError):
    """A forward_batch_info.py source could not be found, fetched, patched or executed."""


# --------------------------------------------------------------------------- sources


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _installed_sglang() -> tuple[str, Path] | None:
    try:
        dist = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(FBI_REL))
    return (dist.version, path) if path.is_file() else None


def stock_source(
    version: str, cache_dir: Path = DEFAULT_CACHE, expected_sha256: str | None = None
) -> Path:
    """Path of the stock ``forward_batch_info.py`` of sglang ``version``.

    The installed package's file when the installed sglang is ``version``; otherwise the file
    unpacked from the release's wheel (``patchbench.patches.wheels.fetch_wheel``: the harness's one wheel
    cache), file in ``cache_dir/<version>/stock/``. With ``expected_sha256`` a file
    with other bytes raises :class:`MropeSourceError`.
    """
    installed = _installed_sglang()
    if installed and installed[0] == version:
        path = installed[1]
    else:
        path = Path(cache_dir) / version / "stock" / FBI_REL
        if not path.is_file():
            # the one wheel cache and download helper of the harness (patchbench.patches.wheels); a
            # machine with torch alone (scripts/gpu_check.sh) gets prepared files instead
            try:
                from patchbench.errors import PatchError
                from patchbench.patches.wheels import fetch_wheel
            except ImportError as e:
                raise MropeSourceError(
                    f"no stock file for sglang {version} at {path} and no harness to download "
                    f"its wheel ({e}); run `scripts/gpu_check.sh prepare` where the harness is"
                ) from None
            try:
                wheel = fetch_wheel(f"sglang=={version}")
            except PatchError as e:
                raise MropeSourceError(f"cannot get sglang {version}: {e}") from None
            path.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheel) as zf:
                data = zf.read(FBI_REL)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
    if expected_sha256 and sha256_file(path) != expected_sha256:
        raise MropeSourceError(
            f"{path}: sha256 {sha256_file(path)} is not the expected "
            f"{expected_sha256} of stock sglang {version}"
        )
    return path


def patch_manifest(patch: str = DEFAULT_PATCH) -> dict:
    """The parsed ``patches/<patch>/manifest.yaml``."""
    import yaml  # harness dependency; imported here so the GPU probe needs no PyYAML

    return yaml.safe_load((REPO / "patches" / patch / "manifest.yaml").read_text())


def patched_source(
    version: str,
    patch: str = DEFAULT_PATCH,
    cache_dir: Path = DEFAULT_CACHE,
    stock: Path | None = None,
) -> Path:
    """Path of ``forward_batch_info.py`` of sglang ``version`` with the patch's diff applied.

    Applies ``patches/<patch>/<diff>`` with ``git apply`` to a copy of the stock file (checked
    against the manifest's ``before`` hash) and checks the result against ``after``; cached in
    ``cache_dir/<version>/<patch>/``. Raises :class:`MropeSourceError` when the release has no diff,
    the diff does not apply, or a hash differs.
    """
    manifest = patch_manifest(patch)
    rel = manifest.get("releases", {}).get(version)
    if not rel:
        raise MropeSourceError(
            f"patch {patch} has no diff for sglang {version}; it supports "
            f"{', '.join(manifest.get('releases', {}))}"
        )
    hashes = rel["files"][FBI_REL]
    stock = stock or stock_source(version, cache_dir, expected_sha256=hashes["before"])
    out = Path(cache_dir) / version / patch / FBI_REL
    if out.is_file() and sha256_file(out) == hashes["after"]:
        return out
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / FBI_REL
        target.parent.mkdir(parents=True)
        shutil.copyfile(stock, target)
        proc = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", str(REPO / "patches" / patch / rel["diff"])],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise MropeSourceError(
                f"{patch} diff does not apply to sglang {version}: {proc.stderr.strip()}"
            )
        if sha256_file(target) != hashes["after"]:
            raise MropeSourceError(
                f"{patch} on sglang {version}: result sha256 "
                f"{sha256_file(target)} is not the manifest's {hashes['after']}"
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, out.with_suffix(".tmp"))
        out.with_suffix(".tmp").replace(out)
    return out


def release_sources(
    version: str, patch: str = DEFAULT_PATCH, cache_dir: Path = DEFAULT_CACHE
) -> dict[str, Path]:
    """``{"stock": path, "patched": path}`` for sglang ``version`` (see the two functions above)."""
    manifest = patch_manifest(patch)
    before = manifest["releases"][version]["files"][FBI_REL]["before"]
    stock = stock_source(version, cache_dir, expected_sha256=before)
    return {"stock": stock, "patched": patched_source(version, patch, cache_dir, stock)}


# --------------------------------------------------------------------------- stand-ins


class StandInMode:
    """Stand-in for sglang's ``ForwardMode``: ``"decode"`` or ``"extend"``."""

    def __init__(self, name: str):
        if name not in ("decode", "extend"):
            raise ValueError(f"mode must be decode or extend, not {name!r}")
        self.name = name

    def is_decode(self) -> bool:
        return self.name == "decode"

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        return self.name == "extend"

    def __repr__(self) -> str:
        return f"ForwardMode.{self.name.upper()}"


@dataclass
class StandInMultimodalInputs:
    """The fields of sglang's ``MultimodalInputs`` that the mrope methods read.

    mrope_position_delta: CPU int64 tensor, usually ``[1, 1]`` (k values -> k decode columns on
    0.5.1.post3, an error on 0.5.23). mrope_positions: ``[3, prompt_len]`` positions of the prompt,
    or None. mrope_position_delta_repeated_cache: a cache 0.5.23 fills.
    """

    mrope_position_delta: torch.Tensor
    mrope_positions: torch.Tensor | None = None
    mrope_position_delta_repeated_cache: torch.Tensor | None = None


class _StandInMRotaryEmbedding:
    @staticmethod
    def get_next_input_positions(
        mrope_position_delta: int, context_len: int, seq_len: int
    ) -> torch.Tensor:
        """As sglang 0.5.1.post3's ``MRotaryEmbedding.get_next_input_positions`` defines it:
        int64 ``[3, seq_len - context_len]``, every row ``context_len + delta .. seq_len + delta - 1``."""
        row = torch.arange(
            context_len + mrope_position_delta, seq_len + mrope_position_delta, dtype=torch.int64
        )
        return row.unsqueeze(0).repeat(3, 1)


def _flatten_nested_list(value: Any) -> list:
    """Depth-first flattening of nested lists (sglang.srt.utils.flatten_nested_list's contract)."""
    if isinstance(value, list):
        return [leaf for item in value for leaf in _flatten_nested_list(item)]
    return [value]


#: names the extracted methods may reference, besides builtins and their own locals
def _stand_in_globals(state: SimpleNamespace) -> dict[str, Any]:
    import typing

    names: dict[str, Any] = {name: getattr(typing, name) for name in typing.__all__}
    names.update(
        torch=torch,
        MRotaryEmbedding=_StandInMRotaryEmbedding,
        flatten_nested_list=_flatten_nested_list,
        get_exec=lambda: SimpleNamespace(
            deterministic=SimpleNamespace(rl_on_policy_target=state.rl_on_policy_target)
        ),
        is_pin_memory_available=lambda: torch.cuda.is_available(),
        ForwardMode=StandInMode,
        MultimodalInputs=StandInMultimodalInputs,
    )
    return names


def _free_names(nodes: Sequence[ast.AST]) -> set[str]:
    """Global names the nodes read at run time (annotations excluded: they stay strings)."""
    import copy

    loaded, stored = set(), set()
    for node in nodes:
        node = copy.deepcopy(node)
        for sub in ast.walk(node):
            if isinstance(sub, ast.arg):
                sub.annotation = None
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sub.returns = None
            elif isinstance(sub, ast.AnnAssign):
                sub.annotation = ast.Constant(None)
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                (loaded if isinstance(sub.ctx, ast.Load) else stored).add(sub.id)
            elif isinstance(sub, ast.arg):
                stored.add(sub.arg)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stored.add(sub.name)
    return loaded - stored - set(dir(builtins))


def extract_mrope_nodes(
    source: str, filename: str = "<forward_batch_info.py>", class_name: str = "ForwardBatch"
) -> list[ast.FunctionDef]:
    """The ``FunctionDef`` nodes (decorators included) of ``class_name``'s methods whose name
    contains ``mrope``. Raises :class:`MropeSourceError` when the class or the methods are absent."""
    tree = ast.parse(source, filename=filename)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            found = [n for n in node.body if isinstance(n, ast.FunctionDef) and "mrope" in n.name]
            if not any(n.name == "_compute_mrope_positions" for n in found):
                raise MropeSourceError(f"{filename}: {class_name} has no _compute_mrope_positions")
            return found
    raise MropeSourceError(f"{filename}: no class {class_name}")


def compile_methods(
    nodes: Sequence[ast.FunctionDef], filename: str, namespace: dict[str, Any]
) -> dict[str, Callable]:
    """Execute the method nodes (with ``from __future__ import annotations``, so annotations such
    as ``ModelRunner`` are never evaluated) against ``namespace`` as their globals; returns
    ``{name: function}``. Tracebacks point at the original file's line numbers."""
    future = ast.ImportFrom(module="__future__", names=[ast.alias(name="annotations")], level=0)
    module = ast.Module(body=[future, *nodes], type_ignores=[])
    ast.fix_missing_locations(module)
    exec(compile(module, filename, "exec"), namespace)
    return {n.name: namespace[n.name] for n in nodes}


class MropeMethods:
    """The mrope methods of one ``forward_batch_info.py``, runnable with stand-ins.

    ``MropeMethods(path_or_source, label)``; :meth:`compute` runs ``_compute_mrope_positions`` on
    a stand-in ForwardBatch and returns ``mrope_positions``. ``split_decode`` is True for releases
    with ``_compute_mrope_positions_decode`` (0.5.18+, and our patched 0.5.1.post3).
    Raises :class:`MropeSourceError` when the methods reference a name no stand-in covers.
    """

    def __init__(self, source: str | Path, label: str = ""):
        if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source):
            filename = str(source)
            text = Path(source).read_text()
        else:
            filename, text = f"<{label or 'source'}>", source
        self.label = label or filename
        self.filename = filename
        self.sha256 = hashlib.sha256(text.encode()).hexdigest()
        nodes = extract_mrope_nodes(text, filename)
        self.state = SimpleNamespace(rl_on_policy_target=None)
        namespace = _stand_in_globals(self.state)
        missing = _free_names(nodes) - set(namespace)
        if missing:
            raise MropeSourceError(
                f"{filename}: the mrope methods reference {sorted(missing)}, "
                "for which the sync_probe stand-ins have none"
            )
        self.methods = compile_methods(nodes, filename, namespace)
        self.forward_batch_cls = type("ForwardBatchStandIn", (), dict(self.methods))
        self.split_decode = "_compute_mrope_positions_decode" in self.methods

    def make_forward_batch(self, case: MropeCase) -> Any:
        """A stand-in ForwardBatch holding the case's ``forward_mode``, ``seq_lens`` and
        ``seq_lens_cpu`` (mrope_positions None)."""
        fb = self.forward_batch_cls()
        fb.forward_mode = StandInMode(case.mode)
        fb.seq_lens = case.seq_lens
        fb.seq_lens_cpu = case.seq_lens_cpu
        fb.mrope_positions = None
        return fb

    def compute(self, case: MropeCase) -> torch.Tensor:
        """Run ``_compute_mrope_positions(model_runner, batch)`` for ``case``; returns the
        resulting ``mrope_positions`` (whatever the method left there). Errors propagate."""
        fb = self.make_forward_batch(case)
        self.state.rl_on_policy_target = case.rl_on_policy_target
        fb._compute_mrope_positions(case.model_runner(), case.batch())
        return fb.mrope_positions


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


def run_outcome(methods: MropeMethods, case: MropeCase) -> tuple[str, Any]:
    """``("ok", positions)`` or ``("error", "<ExceptionType>: <message>")`` of one call."""
    try:
        return "ok", methods.compute(case.fresh())
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return "error", f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------- CPU probes

_READ_METHODS = {
    "__int__",
    "__index__",
    "__float__",
    "__bool__",
    "__complex__",
    "item",
    "tolist",
    "numpy",
    "__array__",
    "cpu",
}
_META_READ_MARKERS = ("cannot be called on meta tensors", "Cannot copy out of meta tensor")


@dataclass
class CopyEvent:
    """One host-to-device copy: api ("torch.tensor", "Tensor.to", ...), target device,
    non_blocking flag, pinned (source memory page-locked; None when unknown or not a tensor),
    blocking (True when the host waits for the copy, i.e. ``non_blocking`` is False or the API has
    no such flag, as for ``torch.tensor(data, device=...)``)."""

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

    A read is a scalar / list / host conversion (``int``, ``float``, ``bool``, ``.item()``,
    ``.tolist()``, ``.numpy()``, ``.cpu()``, ``.to("cpu")``) of a tensor not on the CPU, or any
    call that fails with PyTorch's meta-tensor read error (e.g. a 0-d device tensor used as
    ``torch.full``'s fill value). A copy is ``torch.tensor`` / ``torch.as_tensor`` with a non-CPU
    ``device``, or ``Tensor.to`` / ``.cuda`` / ``.copy_`` from a CPU tensor to a non-CPU device.
    With ``placeholder_reads`` a read of a ``meta`` tensor returns a placeholder (0, 0.0, False,
    a list of zeros, a CPU tensor of zeros), and a call that fails on reading a 0-d meta tensor
    argument (``torch.full((3, 1), seq_lens[i] - 1)``) is counted as one read and run again with
    that argument as a placeholder scalar, so a call can be counted to its end (its result is then
    meaningless); otherwise the read raises as PyTorch makes it.
    """

    def __init__(self, record: ProbeRecord, placeholder_reads: bool = False):
        super().__init__()
        self.record = record
        self.placeholder_reads = placeholder_reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        self_t = args[0] if args and isinstance(args[0], torch.Tensor) else None

        if self_t is not None and self_t.device.type != "cpu":
            to_host = name in _READ_METHODS or (
                name == "to" and _to_target(args, kwargs)[0] == torch.device("cpu")
            )
            if to_host:
                self.record.reads.append(f"Tensor.{name} of {self_t.device.type}")
                if self.placeholder_reads and self_t.device.type == "meta":
                    return _placeholder(name, self_t)
                return func(*args, **kwargs)

        if name in ("tensor", "as_tensor") and func in (torch.tensor, torch.as_tensor):
            dev = _device_of(kwargs.get("device"))
            if dev is not None and dev.type != "cpu":
                src = args[0] if args else None
                self.record.copies.append(
                    CopyEvent(
                        f"torch.{name}",
                        str(dev),
                        False,
                        _is_pinned(src) if isinstance(src, torch.Tensor) else None,
                    )
                )
        elif self_t is not None and self_t.device.type == "cpu":
            if name == "to":
                dev, non_blocking = _to_target(args, kwargs)
                if dev is not None and dev.type != "cpu":
                    self.record.copies.append(
                        CopyEvent("Tensor.to", str(dev), non_blocking, _is_pinned(self_t))
                    )
            elif name == "cuda":
                dev = args[1] if len(args) > 1 else kwargs.get("device", "cuda")
                self.record.copies.append(
                    CopyEvent(
                        "Tensor.cuda",
                        str(dev),
                        bool(kwargs.get("non_blocking", False)),
                        _is_pinned(self_t),
                    )
                )
        if (
            name == "copy_"
            and self_t is not None
            and self_t.device.type != "cpu"
            and len(args) > 1
            and isinstance(args[1], torch.Tensor)
            and args[1].device.type == "cpu"
        ):
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            self.record.copies.append(
                CopyEvent("Tensor.copy_", str(self_t.device), bool(nb), _is_pinned(args[1]))
            )
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
    methods: MropeMethods,
    case: MropeCase,
    placeholder_reads: bool = False,
    copy_target: str = "meta",
) -> ProbeRecord:
    """Probe one decode call with ``seq_lens`` on the ``meta`` device and the runner's device
    ``copy_target`` (``meta``: every copy to it is recorded and costs nothing). Strict
    (``placeholder_reads=False``): the first read raises and ends the call (``record.error``);
    counting: every read is answered with a placeholder and counted."""
    meta_case = case.on("meta", copy_target)
    return probe_call(lambda: methods.compute(meta_case), placeholder_reads)


# --------------------------------------------------------------------------- CUDA measurements


def cuda_sync_warnings(fn: Callable[[], Any]) -> list[str]:
    """Messages of the synchronisation warnings ``torch.cuda.set_sync_debug_mode("warn")`` raises
    during ``fn()`` (one per synchronising CUDA call: blocking copies, ``.item()`` ...). The debug
    mode is restored afterwards."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]


def calibrate_sleep_cycles(target_ms: float = 50.0) -> int:
    """GPU clock cycles for ``torch.cuda._sleep`` to keep the current stream busy ~target_ms."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    per_ms = cycles / max(start.elapsed_time(end), 1e-3)
    return int(per_ms * target_ms)


def cuda_host_blocked_ms(fn: Callable[[], Any], sleep_cycles: int, repeats: int = 5) -> dict:
    """Host wall time of ``fn()`` (ms, median of ``repeats``) on an idle GPU and while a long
    kernel (``torch.cuda._sleep(sleep_cycles)``) is in flight on the current stream;
    ``host_blocked_ms`` = busy - idle, floored at 0: about the kernel's remaining time when ``fn``
    waits for the GPU, about 0 when it does not. Also ``kernel_ms``, the kernel's own duration."""

    def timed(busy: bool) -> tuple[float, float]:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if busy:
            start.record()
            torch.cuda._sleep(sleep_cycles)
            end.record()
        t0 = time.perf_counter()
        fn()
        elapsed = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        return elapsed, (start.elapsed_time(end) if busy else 0.0)

    timed(False)  # warm-up (allocator, pinned pool)
    idle = sorted(timed(False)[0] for _ in range(repeats))[repeats // 2]
    busy_runs = [timed(True) for _ in range(repeats)]
    busy = sorted(r[0] for r in busy_runs)[repeats // 2]
    kernel = sorted(r[1] for r in busy_runs)[repeats // 2]
    return {
        "host_call_idle_ms": idle,
        "host_call_busy_ms": busy,
        "host_blocked_ms": max(busy - idle, 0.0),
        "kernel_ms": kernel,
    }


# --------------------------------------------------------------------------- one probe row


def probe_case(batch_size: int, image_share: float, seed: int, device: str) -> MropeCase:
    """The decode batch the sync probes use: ``decode_case`` with at least one image request
    (so every release takes its multimodal path) and ``[1, 1]`` deltas."""
    case = decode_case(seed, batch_size, image_share=image_share, device=device)
    if all(m is None for m in case.mm_inputs):
        case.mm_inputs[0] = StandInMultimodalInputs(torch.tensor([[-100]]))
    return case


def _outcomes_equal(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "error":
        return a[1] == b[1]
    return a[1].dtype == b[1].dtype and torch.equal(a[1].cpu(), b[1].cpu())


def measure_row(
    methods: MropeMethods,
    stock: MropeMethods | None,
    batch_size: int,
    *,
    device: str = "cpu",
    image_share: float = 0.5,
    seed: int = 0,
    iterations: int = 5,
    sleep_ms: float = 50.0,
    sleep_cycles: int | None = None,
) -> dict:
    """Probe one variant at one batch size; a flat dict (one table row).

    Always: ``positions_equal_stock`` (None without ``stock``), ``images`` (image requests).
    device "cpu" (CPU probes; seq_lens on ``meta``): ``strict_error`` (the error of the strict run,
    e.g. the first meta read), ``d2h_reads_per_call`` and ``blocking_h2d_copies_per_call`` (counting
    run), ``h2d_copies_per_call``. device "cuda": the same counts from the TorchFunctionMode on real
    CUDA tensors (reads are real there), ``h2d_copies_pinned`` (all copies from pinned memory),
    ``sync_warnings_per_call`` (``set_sync_debug_mode("warn")``, mean over ``iterations`` calls)
    and :func:`cuda_host_blocked_ms`'s numbers with a kernel of about ``sleep_ms``.
    """
    case = probe_case(batch_size, image_share, seed, "cpu")
    row: dict[str, Any] = {
        "batch_size": batch_size,
        "device": device,
        "images": sum(m is not None for m in case.mm_inputs),
    }
    if device == "cpu":
        if stock is not None:
            row["positions_equal_stock"] = _outcomes_equal(
                run_outcome(methods, case), run_outcome(stock, case)
            )
        strict = probe_decode(methods, case)
        counted = probe_decode(methods, case, placeholder_reads=True)
        # a read that cannot be answered with a placeholder (a meta tensor read inside a call
        # whose arguments hold no 0-d meta tensor to swap) ends the counting run: that read is
        # counted too, the counts are lower bounds (``counts_lower_bound``) and ``stopped_by``
        # says what stopped it
        stopped = counted.error
        row.update(
            strict_error=strict.error,
            d2h_reads_per_call=len(counted.reads) + (1 if stopped else 0),
            blocking_h2d_copies_per_call=len(counted.blocking_copies),
            h2d_copies_per_call=len(counted.copies),
            counts_lower_bound=bool(stopped),
            stopped_by=stopped,
        )
        return row
    gpu_case = case.on(device)
    mine = run_outcome(methods, gpu_case)
    if stock is not None:
        row["positions_equal_stock"] = _outcomes_equal(mine, run_outcome(stock, gpu_case))
    if mine[0] == "error":
        row["error"] = mine[1]
        return row
    rec = probe_call(lambda: methods.compute(gpu_case.fresh()))
    row.update(
        d2h_reads_per_call=len(rec.reads),
        blocking_h2d_copies_per_call=len(rec.blocking_copies),
        h2d_copies_per_call=len(rec.copies),
        h2d_copies_pinned=all(c.pinned for c in rec.copies),
        error=rec.error,
    )
    fresh = [gpu_case.fresh() for _ in range(iterations)]
    warns = 0
    for c in fresh:
        warns += len(cuda_sync_warnings(lambda c=c: methods.compute(c)))
    row["sync_warnings_per_call"] = warns / iterations
    cycles = sleep_cycles or calibrate_sleep_cycles(sleep_ms)
    row.update(cuda_host_blocked_ms(lambda: methods.compute(gpu_case.fresh()), cycles, iterations))
    return row
