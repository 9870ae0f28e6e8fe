"""The per-variant overlay: a patched copy of the installed ``sglang`` package.

sglang spawns its scheduler and workers, so a monkeypatch in the launching process never reaches
them; a patched copy of the package placed first on ``PYTHONPATH`` does. :func:`build_overlay`
makes that copy once per (sglang version, installed package, patches and their diff hashes) and
caches it::

    <cache_root>/<version>-<key16>/sglang/...       the patched package (no __pycache__ copied)
    <cache_root>/<version>-<key16>/overlay.json     what it holds (Overlay.to_json)

It is built in a temporary folder next to it and renamed into place, so a crash never leaves half
an overlay. The installed package is only read. A variant without patches gets an Overlay that
points at the installed package itself (``root`` None: nothing to add to PYTHONPATH).

:func:`verify_in_env` checks, in the environment the server will get, that every file the
variant's patches touch resolves (as the import system would find it) to the overlay's copy with the
expected sha256, and that the ``sglang`` package itself is the overlay's, without importing sglang
(its import pulls torch, triton, ...). A stock variant checks that ``sglang`` is the installed
package and that ``forward_batch_info`` has the stock hash.

Errors: :class:`OverlayError` (and :class:`patchbench.errors.PatchError` or a subclass from
applying a patch), naming the variant's patches, the paths and expected vs found hashes.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
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
    """A variant's sglang package.

    version: sglang release; root: folder to put first on PYTHONPATH (holds ``sglang/``), None for
    the stock package; sglang_dir: the ``sglang`` package folder the server will import;
    patches: patch names in the order applied (a patch given as a folder: the folder's name);
    patch_hashes: {patch name: sha256 of its diff};
    files: {path relative to site-packages: sha256} of every file the patches changed (empty for
    stock); fbi_sha256: sha256 of ``sglang/srt/model_executor/forward_batch_info.py`` expected in
    the server; key: cache key (None for stock); reused: True when taken from the cache.
    """

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


def _installed_fingerprint(stock_site_dir: Path, version: str) -> str:
    """sha256 of the installed distribution's RECORD (names + hashes of all its files), checking
    that the distribution in ``stock_site_dir`` is sglang ``version``."""
    dists = [
        d
        for d in importlib.metadata.distributions(path=[str(stock_site_dir)])
        if (d.metadata["Name"] or "").lower() == "sglang"
    ]
    if not dists:
        # a bare package folder (e.g. a test copy) without dist-info: identify it by its version file
        vf = stock_site_dir / "sglang" / "version.py"
        return sha256_file(vf) if vf.is_file() else ""
    found = dists[0].version
    if found != version:
        raise OverlayError(
            f"{stock_site_dir} holds sglang {found}, not {version}; build overlays "
            f"in the environment whose sglang is the config's pin"
        )
    record = dists[0].read_text("RECORD") or ""
    return hashlib.sha256(record.encode()).hexdigest()


def _ignore_pycache(_dir: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo"))]


def _patch_ref(p: str | os.PathLike) -> tuple[str, Path | None]:
    """A patch entry -> (name, patches folder or None for the default ``patches/``).

    A name (str) is a folder of ``patches/``; a path (``Path``) is a patch folder anywhere, e.g.
    one :func:`patchbench.patches.author.patch_from_diff_file` made.
    """
    if isinstance(p, os.PathLike):
        q = Path(p)
        return q.name, q.parent
    return str(p), None


def build_overlay(
    version: str,
    patches: list[str | os.PathLike],
    *,
    stock_site_dir: Path,
    cache_root: Path,
    patch_cache_dir: Path | None = None,
) -> Overlay:
    """The overlay of sglang ``version`` with ``patches`` applied in order.

    patches: patch names (folders of ``patches/``) or patch folders (``Path``); stock_site_dir:
    the folder holding the installed ``sglang/`` (site-packages); cache_root: where overlays live
    (e.g. ``.cache/overlays``); patch_cache_dir: wheels and derived diffs (default ``.cache``).
    An empty ``patches`` returns the stock package (no copy). A cached overlay is reused when its
    key matches and its patched files still have their recorded hashes; otherwise it is rebuilt.
    Raises :class:`OverlayError` (no sglang there, other version, a patch named twice) or
    :class:`~patchbench.errors.PatchError` or a subclass (a patch that does not apply: nothing is
    left behind).
    """
    stock_site_dir = Path(stock_site_dir).resolve()
    stock = stock_site_dir / "sglang"
    if not (stock / "__init__.py").is_file():
        raise OverlayError(
            f"no sglang package at {stock} (expected the site-packages folder of the "
            f"environment holding sglang {version})"
        )
    fingerprint = _installed_fingerprint(stock_site_dir, version)
    if not patches:
        fbi = stock_site_dir / FORWARD_BATCH_INFO
        return Overlay(
            version=version,
            root=None,
            sglang_dir=stock,
            fbi_sha256=sha256_file(fbi) if fbi.is_file() else "",
        )
    refs = [_patch_ref(p) for p in patches]
    names = [n for n, _ in refs]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise OverlayError(
            f"patch list {names} names {', '.join(twice)} twice; a patch applies once"
        )
    pcache = Path(patch_cache_dir or CACHE_DIR)
    hashes = {n: patch_sha256(n, version, pcache, patches_dir=d) for n, d in refs}
    key = hashlib.sha256(
        json.dumps(
            {
                "schema": OVERLAY_SCHEMA,
                "version": version,
                "installed": fingerprint,
                "patches": [[n, hashes[n]] for n in names],
            }
        ).encode()
    ).hexdigest()
    cache_root = Path(cache_root).resolve()
    dest = cache_root / f"{version}-{key[:16]}"
    cached = _load_cached(dest, key)
    if cached is not None:
        return cached
    return _build(stock, dest, key, version, refs, hashes, pcache)


def build_source_overlay(
    version: str,
    tree: Path,
    *,
    label: str,
    source_id: str,
    stock_site_dir: Path,
    cache_root: Path,
) -> Overlay:
    """The overlay that makes the installed sglang ``version`` (in ``stock_site_dir``) the
    ``sglang/`` package of ``tree`` (a checkout's ``python/sglang`` or a wheel's, extracted by
    :mod:`patchbench.envs.builds`): a copy of the installed package where every file that differs
    from ``tree``'s is replaced, files only ``tree`` has are added and files it lacks are
    removed. ``files`` holds the replaced and added files (what :func:`verify_in_env` checks);
    ``patches`` is ``[label]`` and ``patch_hashes`` ``{label: source_id}`` (a commit or the
    wheel's sha256, part of the cache key). Raises :class:`OverlayError` when ``tree`` or the
    installed package is not an sglang package.
    """
    stock_site_dir = Path(stock_site_dir).resolve()
    stock, src = stock_site_dir / "sglang", Path(tree) / "sglang"
    for d in (stock, src):
        if not (d / "__init__.py").is_file():
            raise OverlayError(f"no sglang package at {d}")
    fingerprint = _installed_fingerprint(stock_site_dir, version)
    key = hashlib.sha256(
        json.dumps(
            {"schema": OVERLAY_SCHEMA, "version": version, "installed": fingerprint,
             "source": [label, source_id]}
        ).encode()
    ).hexdigest()  # fmt: skip
    dest = Path(cache_root).resolve() / f"{version}-src-{key[:16]}"
    cached = _load_cached(dest, key)
    if cached is not None:
        return cached
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{version}-src-", dir=dest.parent))
    try:
        shutil.copytree(stock, tmp / "sglang", ignore=_ignore_pycache)
        theirs = _tree_files(src)
        files: dict[str, str] = {}
        for rel in sorted(theirs):
            mine = tmp / "sglang" / rel
            sha = sha256_file(src / rel)
            if not mine.is_file() or sha256_file(mine) != sha:
                mine.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / rel, mine)
                files[f"sglang/{rel}"] = sha
        for rel in _tree_files(tmp / "sglang") - theirs:
            (tmp / "sglang" / rel).unlink()
        fbi = tmp / FORWARD_BATCH_INFO
        ov = Overlay(
            version=version,
            root=dest,
            sglang_dir=dest / "sglang",
            patches=[label],
            patch_hashes={label: source_id},
            files=files,
            fbi_sha256=sha256_file(fbi) if fbi.is_file() else "",
            key=key,
        )
        return _publish(tmp, dest, key, ov)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _tree_files(root: Path) -> set[str]:
    """Paths (POSIX, relative to ``root``) of the regular files under ``root``, without
    ``__pycache__`` and compiled bytecode."""
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo"))
    }


def _build(
    stock: Path,
    dest: Path,
    key: str,
    version: str,
    refs: list[tuple[str, Path | None]],
    hashes: dict[str, str],
    pcache: Path,
) -> Overlay:
    """Copy the ``stock`` package into a temporary folder next to ``dest``, apply ``refs`` in
    order, write overlay.json and rename it to ``dest`` (an overlay another process finished
    first is taken instead). Nothing is left behind when a patch does not apply."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".build-{version}-{key[:16]}-", dir=dest.parent))
    try:
        shutil.copytree(stock, tmp / "sglang", ignore=_ignore_pycache)
        files: dict[str, str] = {}
        for n, d in refs:
            files.update(
                apply_to_tree(tmp, n, version, cache_dir=pcache, stacked=set(files), patches_dir=d)
            )
        ov = Overlay(
            version=version,
            root=dest,
            sglang_dir=dest / "sglang",
            patches=[n for n, _ in refs],
            patch_hashes=hashes,
            files=files,
            fbi_sha256=sha256_file(tmp / FORWARD_BATCH_INFO),
            key=key,
        )
        return _publish(tmp, dest, key, ov)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, dest: Path, key: str, ov: Overlay) -> Overlay:
    """Write ``ov``'s overlay.json into the finished build folder ``tmp`` and rename it to
    ``dest`` (a stale or broken ``dest`` is replaced); when another process finished the same
    overlay first, take its copy and drop ``tmp``. Raises OSError when neither happened."""
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


def _load_cached(dest: Path, key: str) -> Overlay | None:
    meta = dest / "overlay.json"
    if not meta.is_file():
        return None
    try:
        d = read_json(meta)
    except (OSError, ValueError):
        return None
    if d.get("schema") != OVERLAY_SCHEMA or d.get("key") != key:
        return None
    for rel, sha in d["files"].items():
        f = dest / rel
        if not f.is_file() or sha256_file(f) != sha:
            return None
    return Overlay(
        version=d["version"],
        root=dest,
        sglang_dir=dest / "sglang",
        patches=d["patches"],
        patch_hashes=d["patch_hashes"],
        files=d["files"],
        fbi_sha256=d["fbi_sha256"],
        key=key,
        reused=True,
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


def expected_files(overlay: Overlay) -> dict[str, str]:
    """{path relative to site-packages: sha256} the server must import for ``overlay``: every file
    its patches touch (for stock: ``forward_batch_info.py`` with its stock hash, when it exists)."""
    if overlay.files:
        return dict(overlay.files)
    return {FORWARD_BATCH_INFO: overlay.fbi_sha256} if overlay.fbi_sha256 else {}


def verify_in_env(
    overlay: Overlay, python: str, env: dict[str, str], *, timeout_s: float = 60
) -> dict:
    """Check in a subprocess ``python -c`` with ``env`` (the server's environment, same
    PYTHONPATH) that the ``sglang`` package is ``overlay.sglang_dir`` and that every file of
    :func:`expected_files` resolves inside it with its expected sha256. Modules are located with
    ``importlib`` finders (packages and module in turn), nothing is imported or executed.

    Returns {"executable", "sys_path_head", "sglang_dir", "files": {rel: {"path", "sha256"}}} and,
    when forward_batch_info.py is among the files, "forward_batch_info" (its path) and "sha256".
    Raises :class:`OverlayError` naming every file that resolves elsewhere, is missing or has
    another hash (expected vs found path and hash), or the subprocess's error output.
    """
    # The CPU stand-ins (PATCHBENCH_CPU_STAND_INS) only import torch and add op handles; they do
    # not touch sys.path or any sglang module, so the probe leaves them out: resolution is the
    # same, and the probe takes 0.05 s instead of 2 s (a torch import) per variant.
    env = {k: v for k, v in env.items() if k != "PATCHBENCH_CPU_STAND_INS"}
    want = expected_files(overlay)
    got = _probe(python, env, sorted(want), timeout_s)
    what = f"variant with patches {overlay.patches}" if overlay.patches else "stock variant"
    pp = env.get("PYTHONPATH", "")
    if "error" in got:
        raise OverlayError(f"{what}: {got['error']} (PYTHONPATH={pp!r})")
    problems = _resolution_problems(overlay, want, got)
    if problems:
        raise OverlayError(
            f"{what}: "
            + "; ".join(problems)
            + f" (PYTHONPATH={pp!r}, sys.path starts {got['sys_path_head']})"
        )
    fbi = got["files"].get(FORWARD_BATCH_INFO)
    if fbi:
        got["forward_batch_info"], got["sha256"] = fbi["path"], fbi["sha256"]
    return got


def _probe(python: str, env: dict[str, str], rels: list[str], timeout_s: float) -> dict:
    """What :data:`_PROBE` finds for ``rels`` in ``python`` with ``env``; raises OverlayError
    when the subprocess cannot run or prints no result."""
    try:
        r = subprocess.run(
            [python, "-c", _PROBE, json.dumps(rels)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OverlayError(f"could not run {python} to check the overlay: {e}") from None
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PATCHBENCH-PROBE ")), None)
    if r.returncode != 0 or line is None:
        raise OverlayError(
            f"{python} failed while locating sglang (exit {r.returncode}):\n"
            f"{(r.stderr or r.stdout)[-2000:]}"
        )
    return json.loads(line.split(" ", 1)[1])


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
