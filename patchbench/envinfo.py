"""What this environment is: recorded in every run manifest and printed by ``runner.py doctor``.

Metadata travels with the numbers (pyperf's ``_collect_metadata``), so a comparison can say why
two runs are not comparable.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from patchbench.inputs import REPO_ROOT


def installed_version(dist: str) -> str | None:
    """Version of an installed distribution in THIS interpreter, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def stock_site_dir() -> Path | None:
    """The site-packages folder holding the installed ``sglang`` package (found without importing
    it: importing sglang pulls torch and takes seconds)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def git_sha(repo: Path = REPO_ROOT) -> str | None:
    """This repo's commit, with ``-dirty`` when the work tree has uncommitted changes."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "-uno"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_info() -> dict | None:
    """NVIDIA GPUs as nvidia-smi reports them ({"gpus": [{name, memory_total_mib}], "driver"}),
    or None when there is no usable NVIDIA GPU."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    gpus, driver = [], None
    for line in out.stdout.strip().splitlines():
        name, mem, driver = [x.strip() for x in line.split(",")]
        gpus.append({"name": name, "memory_total_mib": int(float(mem))})
    return {"gpus": gpus, "driver": driver}


def torch_info() -> dict:
    """torch version and the CUDA it was built with (imports torch, about a second)."""
    try:
        import torch
    except ImportError:
        return {"torch": None, "cuda_build": None, "cuda_available": False}
    return {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
    }


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """True when huggingface.co accepts a TCP connection on 443 within the timeout."""
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def hf_cached(repo_id: str, repo_type: str = "model") -> bool:
    """True when the Hugging Face hub cache holds a snapshot of ``repo_id``.

    Looks for ``<HF_HUB_CACHE>/<repo_type>s--<org>--<name>/snapshots/*`` (the hub cache layout of
    huggingface_hub, which transformers, sglang and datasets read offline). ``repo_type`` is
    "model" or "dataset". Does not check that every file is there.
    """
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    snap = (
        Path(constants.HF_HUB_CACHE) / f"{repo_type}s--{repo_id.replace('/', '--')}" / "snapshots"
    )
    try:
        return any(snap.iterdir())
    except OSError:
        return False


def torch_build_info() -> dict:
    """torch version and CUDA build without importing torch (which takes seconds): read from
    torch/version.py, the file torch's build writes (``__version__``, ``cuda``).

    Returns {"torch": str|None, "cuda_build": str|None}; both None when torch is not installed.
    """
    import ast
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch": None, "cuda_build": None}
    out = {"torch": installed_version("torch"), "cuda_build": None}
    try:
        tree = ast.parse(
            (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
        )
    except (OSError, SyntaxError):
        return out
    for node in tree.body:
        target = (
            node.targets[0]
            if isinstance(node, ast.Assign)
            else node.target
            if isinstance(node, ast.AnnAssign)
            else None
        )
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            if target.id == "__version__":
                out["torch"] = node.value.value
            elif target.id == "cuda":
                out["cuda_build"] = node.value.value
    return out


def collect(*, with_torch: bool = True, with_hub: bool = False) -> dict:
    """Everything worth recording about this machine and environment (a JSON-able dict).

    ``with_torch`` imports torch to ask whether CUDA is available (seconds); without it the torch
    version and CUDA build still come from torch/version.py. ``with_hub`` tries huggingface.co.
    """
    du = shutil.disk_usage(REPO_ROOT)
    info = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "sglang": installed_version("sglang"),
        "transformers": installed_version("transformers"),
        "git_sha": git_sha(),
        "gpu": gpu_info(),
        "disk_free_gib": round(du.free / 2**30, 1),
        "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE"),
    }
    try:
        import psutil

        info["memory_total_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    if with_torch:
        info.update(torch_info())
    else:
        info.update(torch_build_info())
    if with_hub:
        info["hub_reachable"] = hub_reachable()
    return info
