"""Upstream sglang releases as files: wheels downloaded once into ``<cache_dir>/wheels/``, and
pristine copies of the files a patch touches. Inside :func:`offline` nothing is downloaded.
Errors: :class:`FetchError` (exit 3), :class:`MissingFile` (exit 2).
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


class MissingFile(PatchError):
    """The release has no file ``path`` (a path relative to site-packages)."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


_OFFLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("patchbench_offline", default=False)


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """Within this block a wheel missing from the cache is a :class:`FetchError` at once."""
    token = _OFFLINE.set(True)
    try:
        yield
    finally:
        _OFFLINE.reset(token)


def fetch_wheel(spec: str, *, cache_dir: Path | None = None) -> Path:
    """The wheel of a pinned requirement (``sglang==X``), downloaded once with ``pip download
    --no-deps --only-binary :all:``; :class:`FetchError` with pip's output tail when it fails."""
    name, version = pin_of(spec)
    folder = (
        Path(cache_dir or DEFAULT_CACHE_DIR) / "wheels" / f"{canonicalize_name(name)}-{version}"
    )
    if found := _find_wheel(folder, name, version):
        return found
    if _OFFLINE.get():
        raise FetchError(f"{spec}: its wheel is not in {folder} (not downloaded: offline check)")
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--progress-bar", "off", "-d", str(folder),
           f"{name}=={version}"]  # fmt: skip
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
    for w in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        try:
            wname, wver, _, _ = parse_wheel_filename(w.name)
        except InvalidWheelFilename:
            continue
        if wname == canonicalize_name(name) and wver == Version(version):
            return w
    return None


def read_from_wheel(wheel: Path, rel: str) -> bytes:
    """The bytes of ``rel`` (``sglang/srt/...``) inside a wheel; :class:`MissingFile` if absent."""
    with zipfile.ZipFile(wheel) as z:
        try:
            return z.read(rel)
        except KeyError:
            raise MissingFile(f"{wheel.name} holds no file {rel}", rel) from None


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
    """Copy the stock files ``rel_paths`` of sglang ``version`` to ``dest_root/<rel>``, from an
    environment of this machine that holds it (:func:`patchbench.envs.envinfo.environment_for`)
    or else from its wheel. Returns "installed <site folder>" or "wheel <file name>". Raises
    :class:`FetchError`, or :class:`MissingFile` for the first file the release lacks."""
    env = envinfo.environment_for(version)
    wheel = None if env is not None else fetch_wheel(f"sglang=={version}", cache_dir=cache_dir)
    for rel in rel_paths:
        dest = Path(dest_root) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if wheel is not None:
            dest.write_bytes(read_from_wheel(wheel, rel))
        elif (env.site_dir / rel).is_file():
            shutil.copyfile(env.site_dir / rel, dest)
        else:
            raise MissingFile(f"the installed sglang {version} ({env.site_dir}) has no {rel}", rel)
    return f"installed {env.site_dir}" if wheel is None else f"wheel {wheel.name}"
