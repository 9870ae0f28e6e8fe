"""The ``forward_batch_info.py`` files the sync probe's tests and ``scripts/gpu_probe.py prepare``
run: a release's stock file (the installed package, or the release wheel
``patchbench.patches.wheels.fetch_wheel`` caches) and the patched one
(``patches/<patch>/<release>.diff`` applied by ``git apply``), both checked against the patch
manifest's sha256."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

import yaml

from patchbench.errors import PatchError
from patchbench.inputs import REPO_ROOT as REPO
from patchbench.inputs import sha256_file
from patchbench.patches.wheels import fetch_wheel
from patchbench.suites.sync_probe.mrope import MropeSourceError

#: the target file, relative to site-packages (and to the ``sglang`` folder's parent)
FBI_REL = "sglang/srt/model_executor/forward_batch_info.py"
DEFAULT_PATCH = "mrope-sync-free"
DEFAULT_CACHE = REPO / ".cache" / "mrope-sources"


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
    """Path of the stock ``forward_batch_info.py`` of sglang ``version``: the installed one when it
    is that version, else unpacked from its wheel into ``cache_dir/<version>/stock/``;
    MropeSourceError when its bytes differ from ``expected_sha256``."""
    installed = _installed_sglang()
    if installed and installed[0] == version:
        path = installed[1]
    else:
        path = Path(cache_dir) / version / "stock" / FBI_REL
        if not path.is_file():
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
    return yaml.safe_load((REPO / "patches" / patch / "manifest.yaml").read_text())


def patched_source(
    version: str,
    patch: str = DEFAULT_PATCH,
    cache_dir: Path = DEFAULT_CACHE,
    stock: Path | None = None,
) -> Path:
    """Path of sglang ``version``'s ``forward_batch_info.py`` with ``patches/<patch>/<diff>`` applied
    (cached in ``cache_dir/<version>/<patch>/``); MropeSourceError when the release has no diff, it
    does not apply, or a hash differs from the manifest's."""
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
