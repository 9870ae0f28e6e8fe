"""Upstream sglang releases as files: wheels downloaded once, and pristine copies of the files a
patch touches.

Cache layout (``cache_dir``, by default :data:`patchbench.patches.manifest.DEFAULT_CACHE_DIR`, the
repo's git-ignored ``.cache/``)::

    wheels/<name>-<version>/*.whl          pip download --no-deps <name>==<version>

Pristine files come from an installed copy of the release when one of this machine's
environments holds it (:func:`patchbench.envs.envinfo.environments`), else from its wheel. Inside
:func:`offline` nothing is downloaded: a wheel that is not in the cache is a :class:`FetchError`
(``bench --dry-run`` checks what it can without the network).

Errors: :class:`FetchError` (a wheel that could not be downloaded: exit 3, an environment
problem), and :class:`patchbench.errors.PatchError` for a file a release does not have.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Collection, Iterator
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from patchbench import errors
from patchbench.envs import envinfo
from patchbench.errors import PatchError
from patchbench.patches.manifest import DEFAULT_CACHE_DIR, pin_of


class FetchError(PatchError, errors.EnvironmentNotReady):
    """An upstream wheel could not be downloaded (no network, unknown version) (exit 3)."""

    exit_code = errors.EXIT_ENV
    kind = errors.EnvironmentNotReady.kind


_OFFLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("patchbench_offline", default=False)


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Within this block :func:`fetch_wheel` downloads nothing: a wheel missing from the cache
    raises :class:`FetchError` at once."""
    token = _OFFLINE.set(True)
    try:
        yield
    finally:
        _OFFLINE.reset(token)


def fetch_wheel(spec: str, *, cache_dir: Path | None = None) -> Path:
    """The wheel of a pinned requirement (``sglang==X``), downloaded once into
    ``<cache_dir>/wheels/<name>-<version>/`` with ``pip download --no-deps --only-binary :all:``.

    Raises :class:`FetchError` with pip's output tail when the download fails.
    """
    name, version = pin_of(spec)
    folder = (
        Path(cache_dir or DEFAULT_CACHE_DIR) / "wheels" / f"{canonicalize_name(name)}-{version}"
    )
    found = _find_wheel(folder, name, version)
    if found:
        return found
    if _OFFLINE.get():
        raise FetchError(f"{spec}: its wheel is not in {folder} (not downloaded: offline check)")
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "-d",
        str(folder),
        f"{name}=={version}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    found = _find_wheel(folder, name, version)
    if r.returncode != 0 or not found:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
        raise FetchError(
            f"could not download {spec} (`{' '.join(cmd[2:])}` exited {r.returncode}); "
            f"is PyPI reachable? A wheel placed in {folder} is used instead.\n{tail}"
        )
    return found


def _find_wheel(folder: Path, name: str, version: str) -> Path | None:
    if not folder.is_dir():
        return None
    for w in sorted(folder.glob("*.whl")):
        try:
            wname, wver, _, _ = parse_wheel_filename(w.name)
        except InvalidWheelFilename:
            continue
        if wname == canonicalize_name(name) and wver == Version(version):
            return w
    return None


def read_from_wheel(wheel: Path, rel: str) -> bytes:
    """The bytes of ``rel`` (a path like ``sglang/srt/...``) inside a wheel; PatchError if absent."""
    with zipfile.ZipFile(wheel) as z:
        try:
            return z.read(rel)
        except KeyError:
            raise PatchError(f"{wheel.name} holds no file {rel}") from None


def installed_sglang() -> tuple[str | None, Path | None]:
    """(version, folder holding the ``sglang/`` package) of the sglang this interpreter sees;
    (None, None) when not installed. Does not import sglang."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return version, None
    return version, Path(list(spec.submodule_search_locations)[0]).parent


def pristine_files(
    version: str, rel_paths: Collection[str], dest_root: Path, *, cache_dir: Path | None = None
) -> str:
    """Copy the stock files ``rel_paths`` of sglang ``version`` to ``dest_root/<rel>``.

    Source: the installed package when its version is ``version`` (this interpreter's, else
    another environment of this machine that holds it: :func:`patchbench.envs.envinfo.environment_for`),
    else the release's wheel (``pip download``, cached). Returns "installed <folder>" or "wheel
    <file name>". Raises :class:`FetchError` / :class:`PatchError` when a file is missing.
    """
    inst_ver, inst_root = installed_sglang()
    if inst_ver != version or inst_root is None:
        other = envinfo.environment_for(version)
        if other is not None:
            inst_ver, inst_root = other.sglang, other.site_dir
    dest_root = Path(dest_root)
    if inst_ver == version and inst_root is not None:
        for rel in rel_paths:
            src = inst_root / rel
            if not src.is_file():
                raise PatchError(f"the installed sglang {version} ({inst_root}) has no {rel}")
            (dest_root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest_root / rel)
        return f"installed {inst_root}"
    wheel = fetch_wheel(f"sglang=={version}", cache_dir=cache_dir)
    for rel in rel_paths:
        (dest_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest_root / rel).write_bytes(read_from_wheel(wheel, rel))
    return f"wheel {wheel.name}"
