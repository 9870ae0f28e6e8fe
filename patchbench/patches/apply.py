"""Applying a patch: its diff for one release (stored, or derived from two wheels and cached), applied
to a tree of sglang files with every hash checked, and the ``check-patch`` check on a pristine copy.

Cache layout (``cache_dir``, by default :data:`patchbench.patches.manifest.DEFAULT_CACHE_DIR`)::

    patches/<from>__<to>-<files key>.diff      derived diffs, keyed by the two specs and the files

Errors: :class:`patchbench.errors.PatchError` naming the patch, the release, the file and the
failing hunk or the expected and found hash; :class:`~patchbench.patches.manifest.ManifestError`,
:class:`~patchbench.patches.manifest.UnsupportedRelease`,
:class:`~patchbench.patches.wheels.FetchError` (exit 3) from the steps before.
"""

from __future__ import annotations

import os
import py_compile
import re
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from pathlib import Path

from patchbench.errors import PatchError
from patchbench.inputs import sha256_file
from patchbench.patches.diffs import hunk_failures, inspect_diff, unified_diff
from patchbench.patches.manifest import (
    DEFAULT_CACHE_DIR,
    ManifestError,
    PatchManifest,
    ReleaseSpec,
    load_manifest,
    sha256_hex,
)
from patchbench.patches.wheels import fetch_wheel, pristine_files, read_from_wheel
from patchbench.records import write_text


def _derived_diff(m: PatchManifest, cache_dir: Path) -> str:
    assert m.derive is not None
    key = f"{_safe(m.derive.from_)}__{_safe(m.derive.to)}"
    files_key = sha256_hex("\n".join(m.derive.files).encode())[:12]
    target = cache_dir / "patches" / f"{key}-{files_key}.diff"
    if target.is_file():
        return target.read_text(encoding="utf-8")
    w_from = fetch_wheel(m.derive.from_, cache_dir=cache_dir)
    w_to = fetch_wheel(m.derive.to, cache_dir=cache_dir)
    parts = []
    for rel in m.derive.files:
        part = unified_diff(rel, read_from_wheel(w_from, rel), read_from_wheel(w_to, rel))
        if not part:
            raise PatchError(
                f"patch '{m.name}': {rel} is identical in {m.derive.from_} and "
                f"{m.derive.to}; nothing to derive"
            )
        parts.append(part)
    text = "".join(parts)
    write_text(target, text)
    return text


def _safe(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-")


def diff_text(
    name: str, version: str, *, cache_dir: Path | None = None, patches_dir: Path | None = None
) -> str:
    """The unified diff of patch ``name`` for sglang ``version`` (str, paths ``a/sglang/...``).

    Stored diffs are read from the patch folder; derived ones are built from the two wheels and
    cached under ``<cache_dir>/patches/``. Raises :class:`UnsupportedRelease`,
    :class:`ManifestError`, :class:`FetchError`.
    """
    m = load_manifest(name, patches_dir=patches_dir)
    rel = m.release(version)
    if m.derive is not None:
        return _derived_diff(m, Path(cache_dir or DEFAULT_CACHE_DIR))
    return (m.folder / rel.diff).read_text(encoding="utf-8")


def patch_sha256(
    name: str, version: str, cache_dir: Path | None = None, *, patches_dir: Path | None = None
) -> str:
    """sha256 hex of the diff text (UTF-8) of ``name`` for ``version``; identifies the patch."""
    return sha256_hex(
        diff_text(name, version, cache_dir=cache_dir, patches_dir=patches_dir).encode()
    )


def git_apply(
    root: Path, diff_path: Path, check: bool, *, reverse: bool = False
) -> subprocess.CompletedProcess:
    """``git apply -p1`` (``--check`` only when ``check``, ``--reverse`` when ``reverse``) of
    ``diff_path`` in ``root``, never inside an enclosing repository; the completed process
    (stdout/stderr as text)."""
    cmd = ["git", "apply", "-p1", "--verbose", "--whitespace=nowarn"]
    if check:
        cmd.append("--check")
    if reverse:
        cmd.append("--reverse")
    cmd.append(str(diff_path))
    env = dict(os.environ)
    # never let git discover an enclosing repository (e.g. this repo's .cache/): paths must be
    # relative to `root`, not to a repository top level
    env["GIT_CEILING_DIRECTORIES"] = str(Path(root).resolve().parent)
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)


def _explain_failure(
    name: str, version: str, text: str, output: str, root: Path, rel: ReleaseSpec
) -> str:
    msgs = hunk_failures(f"patch '{name}'", version, text, output, root)
    # say whether the target was what the manifest expects: tells a changed file from a bad diff
    for path, h in rel.files.items():
        f = root / path
        if f.is_file():
            got = sha256_file(f)
            if got != h.before:
                msgs.append(
                    f"  note: {path} has sha256 {got}, the manifest expects {h.before} "
                    f"(stock sglang {version}); the file was changed before this patch"
                )
    msgs.append(
        "  git apply said: "
        + " | ".join(ln for ln in output.strip().splitlines() if ln.startswith("error"))[:600]
    )
    return "\n".join(msgs)


def apply_to_tree(
    root: Path,
    name: str,
    version: str,
    *,
    cache_dir: Path | None = None,
    check_only: bool = False,
    stacked: Collection[str] = (),
    patches_dir: Path | None = None,
) -> dict[str, str]:
    """Apply patch ``name`` (its diff for sglang ``version``) to the files under ``root``.

    ``root`` is the folder that holds the ``sglang/`` package folder (a site-packages-like tree,
    possibly only holding the files the patch touches). Steps: the diff must touch exactly the
    files the manifest lists; ``git apply --check``; the files' sha256 before must equal the
    manifest's ``before``; ``git apply`` (all or nothing); the sha256 after must equal ``after``.
    ``stacked``: files already changed by an earlier patch in the same tree; their before/after
    hashes are not checked (they cannot equal the stock ones).
    ``check_only``: do all of it on a temporary copy of the touched files; ``root`` is not changed.

    Returns {relative file path: sha256 hex after}. Raises :class:`UnsupportedRelease`,
    :class:`ManifestError`, :class:`FetchError`, or :class:`PatchError` naming the patch, the file
    and the failing hunk (header + first lines) or expected vs found hash. After a failed hash
    check following a successful apply, ``root`` holds the applied (unexpected) result.
    """
    root = Path(root)
    m = load_manifest(name, patches_dir=patches_dir)
    rel = m.release(version)
    text = diff_text(name, version, cache_dir=cache_dir, patches_dir=patches_dir)
    # renames, new or deleted files, mode changes, symlinks, binary parts: refused before any apply
    touched = {c.path for c in inspect_diff(text, source=f"patch '{name}' (sglang {version})")}
    if touched != set(rel.files):
        raise ManifestError(
            f"patch '{name}' (sglang {version}): the diff touches {', '.join(sorted(touched)) or 'nothing'} "
            f"but the manifest's releases.{version}.files lists {', '.join(sorted(rel.files))}; "
            "they must be the same files"
        )
    if check_only:
        with tempfile.TemporaryDirectory(prefix="patchbench-check-") as tmp:
            for path in rel.files:
                src = root / path
                if src.is_file():
                    (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, Path(tmp) / path)
            return apply_to_tree(
                Path(tmp),
                name,
                version,
                cache_dir=cache_dir,
                stacked=stacked,
                patches_dir=patches_dir,
            )
    _apply_checked(root, name, version, text, rel, stacked)
    return _hashes_after(root, name, version, rel, stacked)


def _apply_checked(
    root: Path, name: str, version: str, text: str, rel: ReleaseSpec, stacked: Collection[str]
) -> None:
    """``git apply --check``, the before hashes (except ``stacked`` files), ``git apply``; raises
    PatchError naming the failing hunk or the unexpected file."""
    with tempfile.TemporaryDirectory(prefix="patchbench-diff-") as tmp:
        diff_file = Path(tmp) / f"{name}-{version}.diff"
        diff_file.write_text(text, encoding="utf-8")
        r = git_apply(root, diff_file, check=True)
        if r.returncode != 0:
            raise PatchError(_explain_failure(name, version, text, r.stdout + r.stderr, root, rel))
        for path, h in rel.files.items():
            if path in stacked:
                continue
            got = sha256_file(root / path)
            if got != h.before:
                raise PatchError(
                    f"patch '{name}' (sglang {version}): {path} before patching has sha256 {got}, "
                    f"the manifest expects {h.before} (stock sglang {version}); the diff applies, "
                    "but to a different file than the one it was made for"
                )
        r = git_apply(root, diff_file, check=False)
        if r.returncode != 0:
            raise PatchError(_explain_failure(name, version, text, r.stdout + r.stderr, root, rel))


def _hashes_after(
    root: Path, name: str, version: str, rel: ReleaseSpec, stacked: Collection[str]
) -> dict[str, str]:
    """{path: sha256} of the patched files; PatchError when one (not ``stacked``) differs from
    the manifest's ``after``."""
    after: dict[str, str] = {}
    for path, h in rel.files.items():
        got = sha256_file(root / path)
        after[path] = got
        if path not in stacked and got != h.after:
            raise PatchError(
                f"patch '{name}' (sglang {version}): {path} after patching has sha256 {got}, "
                f"the manifest expects {h.after}"
            )
    return after


def check_patch(
    name: str, version: str, *, cache_dir: Path | None = None, patches_dir: Path | None = None
) -> dict:
    """Apply ``name`` to a pristine copy of sglang ``version``'s files, byte-compile the results
    and compare hashes. Returns {"patch", "version", "source", "files": {rel: {"before", "after"}},
    "patch_sha256"}. Raises the errors of :func:`apply_to_tree`, or PatchError when a patched file
    does not compile."""
    m = load_manifest(name, patches_dir=patches_dir)
    rel = m.release(version)
    with tempfile.TemporaryDirectory(prefix="patchbench-checkpatch-") as tmp:
        root = Path(tmp) / "tree"
        source = pristine_files(version, list(rel.files), root, cache_dir=cache_dir)
        before = {p: sha256_file(root / p) for p in rel.files}
        after = apply_to_tree(root, name, version, cache_dir=cache_dir, patches_dir=patches_dir)
        for p in rel.files:
            try:
                py_compile.compile(
                    str(root / p), cfile=str(Path(tmp) / "compiled.pyc"), doraise=True
                )
            except py_compile.PyCompileError as e:
                raise PatchError(
                    f"patch '{name}' (sglang {version}): patched {p} does not compile: {e.msg}"
                ) from None
    return {
        "patch": name,
        "version": version,
        "source": source,
        "patch_sha256": patch_sha256(name, version, cache_dir, patches_dir=patches_dir),
        "files": {p: {"before": before[p], "after": after[p]} for p in rel.files},
    }
