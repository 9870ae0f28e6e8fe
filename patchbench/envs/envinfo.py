"""What this machine is (:func:`collect`, recorded in every manifest and printed by ``patchbench
doctor``) and which of its Pythons hold sglang (:func:`environment_for`, the one finder of an
environment for a release or a dependency set).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from patchbench.errors import EnvironmentNotReady
from patchbench.inputs import CACHE_DIR, REPO_ROOT

#: the venv folders patchbench runs servers from, separated by os.pathsep (default: the
#: repository's ``.venv`` and ``.venv-*``); the running interpreter's environment always counts
VENVS_ENV = "PATCHBENCH_VENVS"
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")
#: where environments for other sglang builds are made (patchbench.envs.layers)
LAYERS_DIR = CACHE_DIR / "envs"
#: how to have patchbench make a missing environment (patchbench.envs.layers)
MAKE_HINT = (
    "add --make-env to make one as a layer over the closest environment (with --dry-run it "
    "says what it would install and download first)"
)
#: the file that marks a finished layer: {"sglang", "requires", "server_requirements", "base",
#: "installed", "source_build"}
STAMP = "patchbench-env.json"


def installed_version(dist: str) -> str | None:
    """Version of an installed distribution in THIS interpreter, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def stock_site_dir() -> Path | None:
    """The site-packages folder holding ``sglang``, found without importing it (seconds)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


def venv_dir(version: str, checkout: Path = REPO_ROOT) -> Path:
    """The venv ``make setup SGLANG=version`` makes in ``checkout``: ``.venv`` for the default
    pin 0.5.1.post3, ``.venv-<version>`` for any other."""
    return checkout / (".venv" if version == "0.5.1.post3" else f".venv-{version}")


def setup_command(version: str) -> str:
    """The command that makes the environment of sglang ``version``."""
    return "make setup" if version == "0.5.1.post3" else f"make setup SGLANG={version}"


@dataclass(frozen=True)
class Environment:
    """A Python environment holding an installed sglang release (``venv``: ``sys.prefix`` for
    the running one; ``requires``: the release's ``Requires-Dist`` lines; ``current``: the
    interpreter running patchbench)."""

    venv: Path
    python: str
    sglang: str
    site_dir: Path
    requires: tuple[str, ...] = field(default=(), compare=False)
    current: bool = False

    def describe(self) -> str:
        """``".venv-0.5.23 (sglang 0.5.23)"`` (relative to the repository when inside it)."""
        return f"{shown_path(self.venv)} (sglang {self.sglang})"


def shown_path(p: Path) -> str:
    """``p`` relative to the repository when inside it, else as given."""
    try:
        return str(p.relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def _sglang_dist(site: Path):
    """The sglang distribution installed in ``site`` (importlib.metadata), or None."""
    for d in importlib.metadata.distributions(path=[str(site)]):
        if (d.metadata["Name"] or "").lower() == "sglang":
            return d
    return None


def _environment_at(venv: Path, python: str, site: Path, *, current: bool) -> Environment | None:
    dist = _sglang_dist(site)
    if dist is None or not (site / "sglang" / "__init__.py").is_file():
        return None
    return Environment(
        venv=venv,
        python=python,
        sglang=dist.version,
        site_dir=site,
        requires=tuple(dist.requires or ()),
        current=current,
    )


def is_layer(venv: Path) -> bool:
    """Whether ``venv`` is a finished layer (its :data:`STAMP` exists)."""
    return (venv / STAMP).is_file()


def layer_environment(venv: Path) -> Environment | None:
    """A finished layer as an Environment: its python, the sglang of its stamp, the
    site-packages holding that sglang (its own, or for a source build's layer its base's) and
    the Requires-Dist it was made for; None when ``venv`` is no layer."""
    try:
        stamp = json.loads((venv / STAMP).read_text())
    except (OSError, ValueError):
        return None
    sites = sorted(venv.glob("lib/python*/site-packages"))
    if not sites or not isinstance(stamp, dict) or "sglang" not in stamp:
        return None
    site = Path(stamp["base_site"]) if stamp.get("source_build") else sites[0]
    return Environment(
        venv=venv,
        python=str(venv / "bin" / "python"),
        sglang=str(stamp["sglang"]),
        site_dir=site,
        requires=tuple(stamp.get("requires") or ()),
    )


def _venv_dirs() -> list[Path]:
    raw = os.environ.get(VENVS_ENV)
    if raw is not None:
        return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]
    layers = sorted(LAYERS_DIR.glob("sglang-*")) if LAYERS_DIR.is_dir() else []
    return sorted(p for p in REPO_ROOT.glob(".venv*") if p.is_dir()) + layers


def environments(venvs: Sequence[Path] | None = None, *, current: bool = True) -> list[Environment]:
    """The environments holding sglang, found without starting an interpreter: the running one
    (with ``current``), then each venv of ``venvs`` (default: :data:`VENVS_ENV`, else the
    repository's ``.venv*``), each once."""
    out: list[Environment] = []
    seen: set[Path] = set()
    site = stock_site_dir() if current else None
    if site is not None:
        env = _environment_at(Path(sys.prefix), sys.executable, site, current=True)
        if env is not None:
            out.append(env)
            seen.add(Path(sys.prefix).resolve())
    for venv in _venv_dirs() if venvs is None else venvs:
        if venv.resolve() in seen or not (venv / "bin" / "python").exists():
            continue
        if is_layer(venv):
            env = layer_environment(venv)
            if env is not None:
                out.append(env)
                seen.add(venv.resolve())
            continue
        for site in sorted(venv.glob("lib/python*/site-packages")):
            env = _environment_at(venv, str(venv / "bin" / "python"), site, current=False)
            if env is not None:
                out.append(env)
                seen.add(venv.resolve())
                break
    return out


#: extras that hold the server's own dependencies in older releases (sglang[srt]); other extras
#: ([test], [diffusion], [blackwell], ...) are never installed for a server
SERVER_EXTRAS = ("srt", "runtime-common")


def requirement_keys(reqs: Sequence[str]) -> set[tuple[str, str, str]]:
    """{(canonical name, specifier, extra or "")} of requirement strings (a pyproject's or
    ``Requires-Dist``), names and extras normalized, other markers ignored."""
    out = set()
    for raw in reqs:
        try:
            r = Requirement(raw)
        except InvalidRequirement:
            continue
        m = _EXTRA.search(str(r.marker)) if r.marker else None
        spec = ",".join(sorted(str(s) for s in r.specifier))
        out.add((canonicalize_name(r.name), spec, canonicalize_name(m.group(1)) if m else ""))
    return out


def environment_for(
    version: str | None = None,
    *,
    requires: Sequence[str] | None = None,
    venvs: Sequence[Path] | None = None,
    current: bool = True,
) -> Environment | None:
    """The first of :func:`environments` whose sglang is ``version`` or, with ``requires``, whose
    sglang declares that dependency set (``version`` first); None when none does
    (:func:`missing_environment` says why)."""
    envs = environments(venvs, current=current)
    if requires is None:
        return next((e for e in envs if e.sglang == version), None)
    want = requirement_keys(requires)
    same = [e for e in envs if requirement_keys(e.requires) == want]
    return next((e for e in same if e.sglang == version), same[0] if same else None)


def missing_environment(
    what: str, version: str | None = None, *, requires: Sequence[str] | None = None
) -> EnvironmentNotReady:
    """The error (exit 3) when :func:`environment_for` finds nothing: the ``make setup`` for
    ``version``, or how the closest environment's dependencies differ from ``requires``."""
    envs = environments()
    if requires is None:
        have = ", ".join(e.describe() for e in envs) or "none"
        return EnvironmentNotReady(
            f"{what}: no environment of this machine has it (have: {have}); run "
            f"`{setup_command(version)}` (it makes {venv_dir(version).name}), or {MAKE_HINT}"
        )
    if not envs:
        return EnvironmentNotReady(f"{what}: no environment with sglang here; run `make setup`")
    want = requirement_keys(requires)
    best = min(envs, key=lambda e: len(requirement_keys(e.requires) ^ want))
    have_keys = requirement_keys(best.requires)

    def server(keys: set) -> set[str]:
        # what a server installs: no extra or a server extra (one name whichever it is under)
        return {f"{k[0]}{k[1]}" for k in keys if k[2] in ("", *SERVER_EXTRAS)}

    def shown(names: set[str]) -> str:
        return ", ".join(sorted(names)[:8]) + (" ..." if len(names) > 8 else "")

    words = (
        ("the build declares {} and the environment does not", server(want) - server(have_keys)),
        (
            "the environment has {}, which the build does not declare",
            server(have_keys) - server(want),
        ),
    )
    diff = "; ".join(w.format(shown(keys)) for w, keys in words if shown(keys)) or (
        "they differ only in extras a server does not install"
    )
    return EnvironmentNotReady(
        f"{what}: its dependencies match no environment of this machine (closest: "
        f"{best.describe()}: {diff}); a build runs as an overlay only on an environment with "
        f"the same dependencies: {MAKE_HINT}"
    )


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


def cpu_model() -> str | None:
    """The CPU's model name: the first ``model name`` of /proc/cpuinfo (Linux), else
    ``platform.processor()``, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


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
    """True when the Hugging Face hub cache holds a snapshot of ``repo_id`` (``repo_type``:
    "model" or "dataset"; its files are not checked)."""
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
    """{"torch", "cuda_build"} from torch/version.py, without importing torch (None without)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"torch": None, "cuda_build": None}
    out = {"torch": installed_version("torch"), "cuda_build": None}
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return out
    for key, name in (("torch", "__version__"), ("cuda_build", "cuda")):
        m = re.search(rf"^{name}\s*(?::\s*\S+\s*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        if m:
            out[key] = m.group(1)
    return out


def usable_cpus() -> int | None:
    """How many logical CPUs this process may run on (its scheduler affinity,
    ``os.sched_getaffinity``; psutil where the os module lacks it); None when unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    import psutil

    try:
        return len(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error, OSError):
        return None


def load_avg_1m() -> float | None:
    """The host's 1-minute load average now: runnable (and uninterruptible) processes averaged
    over the last minute, the whole machine's, not only this run's (``psutil.getloadavg``,
    2 decimals); None when the system gives none."""
    import psutil

    try:
        return round(psutil.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def collect(*, with_torch: bool = True, with_hub: bool = False) -> dict:
    """This machine and environment as a JSON-able dict (``with_torch``: import torch to ask
    for CUDA, seconds; ``with_hub``: try huggingface.co)."""
    du = shutil.disk_usage(REPO_ROOT)
    info = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable_cpus(),
        "sglang": installed_version("sglang"),
        "transformers": installed_version("transformers"),
        "git_sha": git_sha(),
        "gpu": gpu_info(),
        "disk_free_gib": round(du.free / 2**30, 1),
        "hf_hub_offline": os.environ.get("HF_HUB_OFFLINE"),
    }
    import psutil

    info["memory_total_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    if with_torch:
        info.update(torch_info())
    else:
        info.update(torch_build_info())
    if with_hub:
        info["hub_reachable"] = hub_reachable()
    return info
