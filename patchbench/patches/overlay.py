"""The per-variant overlay: a patched copy of the installed ``sglang`` package, first on the
server's ``PYTHONPATH`` (sglang spawns its scheduler and workers, so a monkeypatch in the launcher
would not reach them).

Cached per (release, installed package, patches and their diff hashes) as
``<cache_root>/<version>-<key16>/`` (``sglang/`` and ``overlay.json``). Errors: :class:`OverlayError`
and PatchError, naming the patches, paths and expected vs found hashes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from patchbench import errors
from patchbench.inputs import CACHE_DIR, sha256_file
from patchbench.patches.apply import apply_to_tree, patch_sha256
from patchbench.patches.manifest import FORWARD_BATCH_INFO
from patchbench.records import read_json, write_json

#: format of overlay.json; bump when the Overlay fields change (old cached overlays are rebuilt)
OVERLAY_SCHEMA = 1


class OverlayError(errors.PatchError, RuntimeError):
    """An overlay that cannot be built or does not resolve as expected in the server environment
    (exit 2: the variant cannot run as configured)."""


@dataclass
class Overlay:
    """A variant's sglang package: ``root`` the folder to put first on PYTHONPATH (None for
    stock); ``sglang_dir`` the package the server imports; ``patches`` in the order applied;
    ``patch_hashes`` {name: sha256 of its diff}; ``files`` {path relative to site-packages:
    sha256} of the changed files; ``fbi_sha256`` forward_batch_info.py's expected sha256;
    ``key`` the cache key (None for stock); ``reused`` taken from the cache."""

    version: str
    root: Path | None
    sglang_dir: Path
    patches: list[str] = field(default_factory=list)
    patch_hashes: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    fbi_sha256: str = ""
    key: str | None = None
    reused: bool = False

    @property
    def fbi_path(self) -> Path:
        """The forward_batch_info.py file the server should import."""
        return self.sglang_dir.parent / FORWARD_BATCH_INFO

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A copy of ``base`` (default os.environ) with ``root`` first on PYTHONPATH (unchanged
        for stock)."""
        env = dict(os.environ if base is None else base)
        if self.root is not None:
            rest = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = str(self.root) + (os.pathsep + rest if rest else "")
        return env

    def to_json(self) -> dict:
        """JSON-ready dict (paths as strings) for the run manifest and overlay.json."""
        d = asdict(self)
        d["root"] = str(self.root) if self.root else None
        d["sglang_dir"] = str(self.sglang_dir)
        d["schema"] = OVERLAY_SCHEMA
        d.pop("reused")
        return d


def _cache_key(stock_site_dir: Path, version: str, what: dict) -> str:
    """sha256 of the overlay's inputs: the schema, ``version``, the installed distribution's
    RECORD (checking that ``stock_site_dir`` holds sglang ``version``) and ``what`` it adds."""
    dists = [
        d
        for d in importlib.metadata.distributions(path=[str(stock_site_dir)])
        if (d.metadata["Name"] or "").lower() == "sglang"
    ]
    if not dists:  # a bare package folder (a test copy) without dist-info: its version file
        vf = stock_site_dir / "sglang" / "version.py"
        installed = sha256_file(vf) if vf.is_file() else ""
    elif dists[0].version != version:
        raise OverlayError(
            f"{stock_site_dir} holds sglang {dists[0].version}, not {version}; build overlays "
            "in the environment whose sglang is the config's pin"
        )
    else:
        installed = hashlib.sha256((dists[0].read_text("RECORD") or "").encode()).hexdigest()
    key = {"schema": OVERLAY_SCHEMA, "version": version, "installed": installed, **what}
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def _ignore_pycache(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))]


def _stock_package(stock_site_dir: Path) -> Path:
    stock = stock_site_dir / "sglang"
    if not (stock / "__init__.py").is_file():
        raise OverlayError(f"no sglang package at {stock}")
    return stock


def build_overlay(
    version: str,
    patches: list[str | os.PathLike],
    *,
    stock_site_dir: Path,
    cache_root: Path,
    patch_cache_dir: Path | None = None,
) -> Overlay:
    """The overlay of sglang ``version`` (installed in ``stock_site_dir``) with ``patches``
    (names in ``patches/`` or patch folders as ``Path``) applied in order, cached under
    ``cache_root``; no patches: the stock package itself. Raises :class:`OverlayError` (no
    sglang there, another version, a patch named twice) or a patch's PatchError."""
    stock_site_dir = Path(stock_site_dir).resolve()
    stock = _stock_package(stock_site_dir)
    if not patches:
        _cache_key(stock_site_dir, version, {})  # checks the version
        fbi = stock_site_dir / FORWARD_BATCH_INFO
        return Overlay(version, None, stock, fbi_sha256=sha256_file(fbi) if fbi.is_file() else "")
    # a name is a folder of patches/; a path is a patch folder anywhere (author.patch_from_diff_file)
    refs = [(Path(p).name, Path(p).parent) if isinstance(p, os.PathLike) else (str(p), None)
            for p in patches]  # fmt: skip
    names = [n for n, _ in refs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise OverlayError(
            f"patch list {names} names {', '.join(twice)} twice; a patch applies once"
        )
    pcache = Path(patch_cache_dir or CACHE_DIR)
    hashes = {n: patch_sha256(n, version, pcache, patches_dir=d) for n, d in refs}
    key = _cache_key(stock_site_dir, version, {"patches": [[n, hashes[n]] for n in names]})
    dest = Path(cache_root).resolve() / f"{version}-{key[:16]}"

    def fill(tmp: Path) -> Overlay:
        shutil.copytree(stock, tmp / "sglang", ignore=_ignore_pycache)
        files: dict[str, str] = {}
        for n, d in refs:
            files.update(
                apply_to_tree(tmp, n, version, cache_dir=pcache, stacked=set(files), patches_dir=d)
            )
        fbi = sha256_file(tmp / FORWARD_BATCH_INFO)
        return Overlay(version, dest, dest / "sglang", names, hashes, files, fbi, key)

    return _cached_or_built(dest, key, fill)


def build_source_overlay(
    version: str,
    tree: Path,
    *,
    label: str,
    source_id: str,
    stock_site_dir: Path,
    cache_root: Path,
) -> Overlay:
    """The overlay that makes the installed sglang ``version`` the ``sglang/`` package of
    ``tree`` (a checkout's ``python/`` or an extracted wheel): files that differ replaced, new
    ones added (``files``: both), missing ones removed; ``patches`` ``[label]``,
    ``patch_hashes`` ``{label: source_id}`` (a commit or the wheel's sha256). Raises
    :class:`OverlayError` when either is not an sglang package."""
    stock_site_dir = Path(stock_site_dir).resolve()
    stock, src = _stock_package(stock_site_dir), _stock_package(Path(tree))
    key = _cache_key(stock_site_dir, version, {"source": [label, source_id]})
    dest = Path(cache_root).resolve() / f"{version}-src-{key[:16]}"

    def fill(tmp: Path) -> Overlay:
        shutil.copytree(stock, tmp / "sglang", ignore=_ignore_pycache)
        theirs = _tree_files(src)
        files: dict[str, str] = {}
        for rel in sorted(theirs):
            mine, sha = tmp / "sglang" / rel, sha256_file(src / rel)
            if not mine.is_file() or sha256_file(mine) != sha:
                mine.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / rel, mine)
                files[f"sglang/{rel}"] = sha
        for rel in _tree_files(tmp / "sglang") - theirs:
            (tmp / "sglang" / rel).unlink()
        fbi = tmp / FORWARD_BATCH_INFO
        fbi_sha = sha256_file(fbi) if fbi.is_file() else ""
        return Overlay(
            version, dest, dest / "sglang", [label], {label: source_id}, files, fbi_sha, key
        )

    return _cached_or_built(dest, key, fill)


def _tree_files(root: Path) -> set[str]:
    """Paths (POSIX, relative to ``root``) of the regular files under ``root``, without
    ``__pycache__`` and compiled bytecode."""
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo"))
    }


def _cached_or_built(dest: Path, key: str, fill: Callable[[Path], Overlay]) -> Overlay:
    """The overlay cached at ``dest`` (same key, files intact), else ``fill(tmp)`` in a temporary
    folder renamed to ``dest`` (another process's finished copy wins); nothing is left behind
    when ``fill`` raises."""
    cached = _load_cached(dest, key)
    if cached is not None:
        return cached
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{dest.name}-", dir=dest.parent))
    try:
        ov = fill(tmp)
        write_json(tmp / "overlay.json", ov.to_json())
        if dest.exists():
            shutil.rmtree(dest)
        try:
            os.rename(tmp, dest)
        except OSError:
            theirs = _load_cached(dest, key)
            if theirs is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
            return theirs
        return ov
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_cached(dest: Path, key: str) -> Overlay | None:
    try:
        d = read_json(dest / "overlay.json")
    except (OSError, ValueError):
        return None
    if d.get("schema") != OVERLAY_SCHEMA or d.get("key") != key:
        return None
    for rel, sha in d["files"].items():
        if not (dest / rel).is_file() or sha256_file(dest / rel) != sha:
            return None
    fields = ("patches", "patch_hashes", "files", "fbi_sha256")
    return Overlay(
        d["version"], dest, dest / "sglang", **{k: d[k] for k in fields}, key=key, reused=True
    )


_PROBE = r"""
import hashlib, importlib.machinery, importlib.util, json, os, sys
want = json.loads(sys.argv[1])          # paths relative to site-packages: sglang/...
out = {"executable": sys.executable, "sys_path_head": sys.path[:4], "files": {}}
spec = importlib.util.find_spec("sglang")   # top level: found, not executed
if spec is None or not spec.submodule_search_locations:
    out["error"] = "sglang not importable"
else:
    pkg = list(spec.submodule_search_locations)[0]
    out["sglang_dir"] = pkg
    for rel in want:
        parts = rel.split("/")[1:]
        if rel.endswith(".py"):
            # resolve each package and the module as the import system would, executing nothing
            locs, origin = [pkg], None
            for i, part in enumerate(parts):
                name = part[:-3] if i == len(parts) - 1 else part
                if name == "__init__" and i == len(parts) - 1:
                    origin = os.path.join(locs[0], "__init__.py")
                    break
                sub = importlib.machinery.PathFinder.find_spec(name, locs)
                if sub is None:
                    break
                if i == len(parts) - 1:
                    origin = sub.origin
                elif sub.submodule_search_locations:
                    locs = list(sub.submodule_search_locations)
                else:
                    break
        else:  # a data file: found next to the package's modules
            origin = os.path.join(pkg, *parts)
        if origin is None or not os.path.isfile(origin):
            out["files"][rel] = {"path": origin, "sha256": None}
        else:
            out["files"][rel] = {"path": origin,
                                 "sha256": hashlib.sha256(open(origin, "rb").read()).hexdigest()}
print("PATCHBENCH-PROBE " + json.dumps(out))
"""


def verify_in_env(overlay: Overlay, python: str, env: dict[str, str]) -> dict:
    """Check with ``python -c`` in ``env`` (the server's environment) that the ``sglang`` package
    is ``overlay.sglang_dir`` and that every file the patches touch (stock: forward_batch_info.py
    with its stock hash) resolves inside it with its sha256; modules are located with
    ``importlib`` finders, nothing is executed.

    Returns {"executable", "sys_path_head", "sglang_dir", "files": {rel: {"path", "sha256"}}},
    plus "forward_batch_info" (its path) and "sha256" when that file is among them. Raises
    :class:`OverlayError` naming each file that resolves elsewhere, is missing or has another
    hash, or the subprocess's error output.
    """
    # the CPU stand-ins only import torch and add op handles (no sys.path or sglang change):
    # without them the probe takes 0.05 s instead of 2 s per variant
    env = {k: v for k, v in env.items() if k != "PATCHBENCH_CPU_STAND_INS"}
    want = dict(overlay.files) or (
        {FORWARD_BATCH_INFO: overlay.fbi_sha256} if overlay.fbi_sha256 else {}
    )
    try:
        r = subprocess.run(
            [python, "-c", _PROBE, json.dumps(sorted(want))],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OverlayError(f"could not run {python} to check the overlay: {e}") from None
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PATCHBENCH-PROBE ")), None)
    if r.returncode != 0 or line is None:
        raise OverlayError(
            f"{python} failed while locating sglang (exit {r.returncode}):\n"
            f"{(r.stderr or r.stdout)[-2000:]}"
        )
    got = json.loads(line.split(" ", 1)[1])
    what = f"variant with patches {overlay.patches}" if overlay.patches else "stock variant"
    pp = env.get("PYTHONPATH", "")
    if "error" in got:
        raise OverlayError(f"{what}: {got['error']} (PYTHONPATH={pp!r})")
    problems = _resolution_problems(overlay, want, got)
    if problems:
        raise OverlayError(
            f"{what}: {'; '.join(problems)} (PYTHONPATH={pp!r}, sys.path starts "
            f"{got['sys_path_head']})"
        )
    if fbi := got["files"].get(FORWARD_BATCH_INFO):
        got["forward_batch_info"], got["sha256"] = fbi["path"], fbi["sha256"]
    return got


def _resolution_problems(overlay: Overlay, want: dict[str, str], got: dict) -> list[str]:
    """One line per file of ``want`` that resolves outside the overlay, is missing or has another
    hash, and one when the ``sglang`` package itself resolves elsewhere."""
    expected_dir = overlay.sglang_dir.resolve()
    problems = []
    for rel, sha in want.items():
        f = got["files"].get(rel) or {}
        where = overlay.sglang_dir.parent / rel
        if not f.get("path") or f.get("sha256") is None:
            problems.append(f"{rel}: not found in the server's environment (expected {where})")
            continue
        found = Path(f["path"]).resolve()
        if expected_dir not in found.parents:
            problems.append(f"{rel} resolves to {found}, expected {where} (inside {expected_dir})")
        elif f["sha256"] != sha:
            problems.append(
                f"{found} has sha256 {f['sha256']}, expected {sha}; the overlay was "
                "changed after it was built"
            )
    if Path(got["sglang_dir"]).resolve() != expected_dir:
        problems.append(
            f"the sglang package resolves to {got['sglang_dir']}, expected {expected_dir}"
        )
    return problems
