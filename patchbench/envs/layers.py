"""An environment for an sglang that no environment here has: a layer over the closest one.

A layer (docs/guide.md, "Any other release") is a venv holding only the packages that differ
from its base's, which it sees through a ``.pth`` line; it installs :func:`server_requirements`
(on the CPU without :data:`CPU_LEFT_OUT`; decord stays: 0.5.9's Qwen-VL processor imports it at
start) and is found again by its stamp file (:data:`STAMP`).

Errors: EnvironmentNotReady (exit 3) when pip cannot resolve or install the set, or no
environment with sglang exists to build on.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from patchbench.envs import envinfo
from patchbench.envs.envinfo import (
    LAYERS_DIR,
    SERVER_EXTRAS,
    STAMP,
    is_layer,
    layer_environment,
    shown_path,
)
from patchbench.errors import EnvironmentNotReady

#: packages a CPU server runs without (canonical names): CUDA-only kernels and libraries
#: (flashinfer, sgl-kernel / sglang-kernel, flash-attn, DeepEP/DeepGEMM, cuda-python, the nvidia-*
#: and *-kernels wheels, tilelang, TVM FFI, torch_memory_saver), torchaudio / torchcodec / av
#: (audio and video decoding, imported on use) and recipe packages; patchbench/shims'
#: stand-ins cover what the server imports from them at start
CPU_LEFT_OUT = re.compile(
    r"nvidia-.*|cuda-.*|nvshmem.*|flashinfer.*|flash-attn.*|sgl-.*|sglang-kernel|.*-kernels|"
    r"kernels|tilelang|apache-tvm-ffi|torch-memory-saver|torchaudio|torchcodec|xformers|av|"
    r"deepseek-recipe|tml-renderers"
)


def server_requirements(requires: Sequence[str], *, cpu: bool) -> list[str]:
    """The requirement lines a server of an sglang with these ``Requires-Dist`` lines needs here:
    the unconditional ones and those of :data:`SERVER_EXTRAS` whose markers hold on this
    platform, without their markers; with ``cpu`` also without :data:`CPU_LEFT_OUT`. Sorted,
    each once; unparsable lines are skipped (pip reports them where they matter)."""
    out: set[str] = set()
    for raw in requires:
        try:
            r = Requirement(raw)
        except InvalidRequirement:
            continue
        if r.marker is not None and not any(
            r.marker.evaluate({"extra": e}) for e in ("", *SERVER_EXTRAS)
        ):
            continue
        name = canonicalize_name(r.name)
        if name == "sglang" or (cpu and CPU_LEFT_OUT.fullmatch(name)):
            continue
        extras = f"[{','.join(sorted(r.extras))}]" if r.extras else ""
        out.add(f"{name}{extras}{r.url and ' @ ' + r.url or r.specifier}")
    return sorted(out)


def layer_key(reqs: Sequence[str], sglang: str | None) -> str:
    """16 hex digits of sha256 over the requirement set, the sglang release and this Python."""
    text = "\n".join([f"python {sys.version_info[0]}.{sys.version_info[1]}", f"sglang {sglang}"])
    return hashlib.sha256("\n".join([text, *sorted(reqs)]).encode()).hexdigest()[:16]


@dataclass
class LayerPlan:
    """What :func:`make_layer` would do: ``declared`` the sglang's Requires-Dist lines (what the
    layer is found by), ``server`` what of them it installs (:func:`server_requirements`),
    ``dest`` the layer's venv, ``base`` the environment it sees, ``install`` the (name,
    version) pairs pip resolved against the base (what differs), ``download_bytes`` their
    wheels' size where the index said (None: unknown)."""

    what: str
    sglang: str | None
    declared: list[str]
    server: list[str]
    base: envinfo.Environment
    dest: Path
    install: list[tuple[str, str]] = field(default_factory=list)
    download_bytes: int | None = None

    def describe(self) -> str:
        """One line: what, over which base, how many packages and about how much to download."""
        nbytes = self.download_bytes
        size = "" if nbytes is None else f", about {_bytes(nbytes)} to download"
        names = ", ".join(f"{n} {v}" for n, v in self.install[:6])
        more = f" and {len(self.install) - 6} more" if len(self.install) > 6 else ""
        return (
            f"{self.what}: an environment made over {self.base.describe()} in "
            f"{shown_path(self.dest)}: {len(self.install)} package(s) that differ{size}"
            + (f" ({names}{more})" if names else "")
        )


def _bytes(n: float) -> str:
    """``n`` bytes as "1,247 MB" or, under a megabyte, "35 kB"."""
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{max(1, round(n / 1e3))} kB"


def closest(envs: Sequence[envinfo.Environment], reqs: Sequence[str], *, cpu: bool):
    """The environment whose server requirements differ least from ``reqs`` (symmetric
    difference of names and specifiers); EnvironmentNotReady when ``envs`` is empty."""
    if not envs:
        raise EnvironmentNotReady("no environment with sglang here to build on: run `make setup`")
    want = envinfo.requirement_keys(reqs)
    return min(
        envs,
        key=lambda e: len(
            envinfo.requirement_keys(server_requirements(e.requires, cpu=cpu)) ^ want
        ),
    )


def _pip(python: str, *args: str) -> list[str]:
    return [python, "-m", "pip", *args, "--disable-pip-version-check", "--progress-bar", "off"]


def _size(url: str) -> int | None:
    """Bytes of a wheel at ``url`` (file: its size; http: Content-Length of a HEAD), or None."""
    if url.startswith("file://"):
        p = Path(urllib.request.url2pathname(url[len("file://") :]))
        return p.stat().st_size if p.is_file() else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10) as r:
            n = r.headers.get("Content-Length")
            return int(n) if n else None
    except (OSError, ValueError):
        return None


def plan_layer(
    what: str,
    requires: Sequence[str],
    sglang: str | None,
    *,
    cpu: bool,
    envs: Sequence[envinfo.Environment] | None = None,
    root: Path = LAYERS_DIR,
) -> LayerPlan:
    """The layer for an sglang declaring ``requires`` (``sglang``: the release installed into it,
    None for a source build that runs as an overlay): its base (:func:`closest`) and what pip,
    run by the base's interpreter, resolves as missing or different there (``pip install
    --dry-run --report``; the index is asked, nothing is installed). Raises EnvironmentNotReady
    when pip cannot resolve the set (its last lines quoted)."""
    reqs = server_requirements(requires, cpu=cpu)
    envs = list(envinfo.environments() if envs is None else envs)
    base = closest([e for e in envs if not is_layer(e.venv)] or envs, reqs, cpu=cpu)
    label = sglang or "source"
    dest = root / f"sglang-{label}-{layer_key(reqs, sglang)}"
    plan = LayerPlan(what, sglang, list(requires), reqs, base, dest)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        # sglang itself without its dependencies: those are ``reqs``, filtered
        cmd = _pip(base.python, "install", "--dry-run", "--quiet", "--report", str(report))
        p = subprocess.run([*cmd, *reqs], capture_output=True, text=True)
        if p.returncode == 0 and sglang:
            report2 = Path(tmp) / "sglang.json"
            cmd = _pip(base.python, "install", "--dry-run", "--quiet", "--no-deps",
                       "--ignore-installed", "--report", str(report2), f"sglang=={sglang}")  # fmt: skip
            p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            tail = " | ".join(p.stderr.strip().splitlines()[-4:])
            raise EnvironmentNotReady(
                f"{what}: pip cannot resolve its declared dependencies over "
                f"{base.describe()}: {tail}"
            )
        items = json.loads(report.read_text())["install"]
        if sglang:
            items += json.loads((Path(tmp) / "sglang.json").read_text())["install"]
    if cpu:  # a CUDA library the base has in another version: the CPU needs only its soname
        have = {
            canonicalize_name(d.metadata["Name"] or "")
            for d in importlib.metadata.distributions(path=[str(base.site_dir)])
        }
        items = [
            i
            for i in items
            if not (
                CPU_LEFT_OUT.fullmatch(n := canonicalize_name(i["metadata"]["name"])) and n in have
            )
        ]
    plan.install = [(i["metadata"]["name"], i["metadata"]["version"]) for i in items]
    sizes = [_size(i.get("download_info", {}).get("url", "")) for i in items]
    plan.download_bytes = None if None in sizes else sum(sizes)  # type: ignore[arg-type]
    return plan


def make_layer(plan: LayerPlan, *, log: Callable[[str], None] = print) -> envinfo.Environment:
    """Make the layer ``plan`` describes (once: a finished one is reused) and return it as an
    Environment. Prints the plan before it starts and the time and disk after; pip's output
    streams through ``log``. A failed make leaves nothing behind. Raises EnvironmentNotReady
    when pip fails (its last lines quoted) or the finished layer has no readable stamp."""
    if not is_layer(plan.dest):
        log(f"making {plan.describe()}")
        shutil.rmtree(plan.dest, ignore_errors=True)
        t0 = time.monotonic()
        try:
            _build(plan, log)
        except BaseException:
            shutil.rmtree(plan.dest, ignore_errors=True)
            raise
        size = sum(
            f.stat().st_size for f in plan.dest.rglob("*") if f.is_file() and not f.is_symlink()
        )
        log(f"made {shown_path(plan.dest)} in {time.monotonic() - t0:.0f} s, {_bytes(size)}")
    env = layer_environment(plan.dest)
    if env is None:
        raise EnvironmentNotReady(f"{plan.what}: {shown_path(plan.dest)} has no usable stamp")
    return env


def _build(plan: LayerPlan, log: Callable[[str], None]) -> None:
    plan.dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([plan.base.python, "-m", "venv", "--without-pip", str(plan.dest)], check=True)
    python = str(plan.dest / "bin" / "python")
    site = _site_of(python)
    # the base's packages come after the layer's own: what the layer installs shadows them
    (site / "zz_patchbench_base.pth").write_text(f"{plan.base.site_dir}\n")
    pins = [f"{n}=={v}" for n, v in plan.install]
    if pins:
        # the base's pip installs into the layer (--prefix), the exact set it resolved
        cmd = _pip(plan.base.python, "install", "--no-deps", "--no-compile", "--prefix",
                   str(plan.dest), "--ignore-installed")  # fmt: skip
        with subprocess.Popen(
            [*cmd, *pins], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as p:
            tail: list[str] = []
            for line in p.stdout or ():
                line = line.rstrip()
                if line and not line.startswith("WARNING: Location"):
                    log(f"  pip: {line}")
                    tail = [*tail[-3:], line]
        if p.returncode != 0:
            raise EnvironmentNotReady(f"{plan.what}: pip failed: {' | '.join(tail)}")
        subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(site)],
                       capture_output=True)  # fmt: skip
    stamp = {
        "sglang": plan.sglang or plan.base.sglang,
        "source_build": plan.sglang is None,
        "requires": plan.declared,
        "server_requirements": plan.server,
        "base": str(plan.base.venv),
        "base_site": str(plan.base.site_dir),
        "installed": pins,
    }
    tmp = plan.dest / (STAMP + ".tmp")
    tmp.write_text(json.dumps(stamp, indent=1))
    os.replace(tmp, plan.dest / STAMP)


def _site_of(python: str) -> Path:
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def release_requires(version: str, python: str) -> list[str]:
    """The ``Requires-Dist`` lines of sglang ``version``'s wheel on the package index (fetched
    without its dependencies by ``python``'s pip). Raises EnvironmentNotReady when pip cannot
    fetch it (e.g. no such release, or no index reachable)."""
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run(
            _pip(python, "download", "--no-deps", "--quiet", "--dest", tmp, f"sglang=={version}"),
            capture_output=True,
            text=True,
        )
        wheels = sorted(Path(tmp).glob("sglang-*.whl"))
        if p.returncode != 0 or not wheels:
            tail = " | ".join(p.stderr.strip().splitlines()[-3:])
            raise EnvironmentNotReady(
                f"sglang {version}: cannot fetch its wheel from the package index: {tail}"
            )
        with zipfile.ZipFile(wheels[0]) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            text = z.read(meta).decode()
    return [
        ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Requires-Dist:")
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m patchbench.envs.layers VERSION [--gpu] [--link DIR] [--dry-run]``: make the
    environment of sglang release VERSION as a layer over the closest one here (what ``make
    setup SGLANG=VERSION`` runs for a release without a CPU profile in requirements/); ``--link``
    points DIR (e.g. .venv-VERSION) at it. Exit 0 when made (or found), 3 with the reason when
    it cannot be."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m patchbench.envs.layers")
    ap.add_argument("version")
    ap.add_argument("--gpu", action="store_true", help="keep the CUDA-only packages")
    ap.add_argument("--link", type=Path, metavar="DIR", help="a symlink DIR -> the layer")
    ap.add_argument("--dry-run", action="store_true", help="say what it would install")
    a = ap.parse_args(argv)
    try:
        env = envinfo.environment_for(a.version)
        if env is None:
            reqs = release_requires(a.version, sys.executable)
            plan = plan_layer(f"sglang {a.version}", reqs, a.version, cpu=not a.gpu)
            if a.dry_run:
                print(plan.describe())
                return 0
            env = make_layer(plan)
        else:
            print(f"sglang {a.version}: {env.describe()} has it")
    except EnvironmentNotReady as e:
        print(f"error (exit 3): {e}", file=sys.stderr)
        return 3
    if a.link and env.venv.resolve() != a.link.resolve():
        if a.link.is_symlink():
            a.link.unlink()
        if not a.link.exists():
            a.link.symlink_to(env.venv.resolve(), target_is_directory=True)
            print(f"{a.link} -> {shown_path(env.venv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
