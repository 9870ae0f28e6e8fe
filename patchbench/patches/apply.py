"""Applying a patch: its diff for one release (stored, or derived from two wheels and cached under
``<cache_dir>/patches/``) applied with every hash checked, and ``check-patch``. Errors: PatchError
naming the patch, the release, the file and the failing hunk or the expected and found hash."""

from __future__ import annotations

import os
import re
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
    load_manifest,
    sha256_hex,
)
from patchbench.patches.wheels import fetch_wheel, pristine_files, read_from_wheel
from patchbench.records import write_text


def _diff_of(m: PatchManifest, version: str, cache_dir: Path | None) -> str:
    rel = m.release(version)
    if m.derive is None:
        return (m.folder / rel.diff).read_text(encoding="utf-8")
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-") for s in (m.derive.from_, m.derive.to)]
    files_key = sha256_hex("\n".join(m.derive.files).encode())[:12]
    cache = Path(cache_dir or DEFAULT_CACHE_DIR)
    target = cache / "patches" / f"{safe[0]}__{safe[1]}-{files_key}.diff"
    if target.is_file():
        return target.read_text(encoding="utf-8")
    w_from = fetch_wheel(m.derive.from_, cache_dir=cache)
    w_to = fetch_wheel(m.derive.to, cache_dir=cache)
    parts = []
    for f in m.derive.files:
        part = unified_diff(f, read_from_wheel(w_from, f), read_from_wheel(w_to, f))
        if not part:
            raise PatchError(
                f"patch '{m.name}': {f} is identical in {m.derive.from_} and {m.derive.to}; "
                "nothing to derive"
            )
        parts.append(part)
    write_text(target, "".join(parts))
    return "".join(parts)


def diff_text(
    name: str, version: str, *, cache_dir: Path | None = None, patches_dir: Path | None = None
) -> str:
    """The unified diff (paths ``a/sglang/...``) of patch ``name`` for sglang ``version``: the
    stored one, or the one derived from two wheels. Raises the manifest's and wheels' errors."""
    return _diff_of(load_manifest(name, patches_dir=patches_dir), version, cache_dir)


def patch_sha256(
    name: str, version: str, cache_dir: Path | None = None, *, patches_dir: Path | None = None
) -> str:
    """sha256 hex of the diff text (UTF-8) of ``name`` for ``version``; identifies the patch."""
    return sha256_hex(
        diff_text(name, version, cache_dir=cache_dir, patches_dir=patches_dir).encode()
    )


def git_apply(
    root: Path, text: str, *, check: bool = False, reverse: bool = False
) -> subprocess.CompletedProcess:
    """``git apply -p1`` of the diff ``text`` in ``root`` (``--check``, ``--reverse`` when asked),
    never inside an enclosing repository (paths stay relative to ``root``); the completed
    process, output as text."""
    cmd = ["git", "apply", "-p1", "--verbose", "--whitespace=nowarn"]
    cmd += ["--check"] * check + ["--reverse"] * reverse + ["-"]
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    env["GIT_CEILING_DIRECTORIES"] = str(Path(root).resolve().parent)
    return subprocess.run(cmd, cwd=root, input=text, capture_output=True, text=True, env=env)


def apply_text(
    root: Path, text: str, label: str, version: str, before: dict[str, str] | None = None
) -> None:
    """Apply the diff ``text`` under ``root`` all or nothing: ``git apply --check``, the sha256
    of each file of ``before`` ({path: sha256 expected}), ``git apply``. Raises PatchError
    naming ``label``, the release and the failing hunk (with a note for each file of ``before``
    that is not what was expected), or the unexpected file."""
    r = git_apply(root, text, check=True)
    if r.returncode == 0:
        for path, want in (before or {}).items():
            if (got := sha256_file(root / path)) != want:
                raise PatchError(
                    f"{label} (sglang {version}): {path} before patching has sha256 {got}, "
                    f"the manifest expects {want} (stock sglang {version}); the diff applies, "
                    "but to a different file than the one it was made for"
                )
        r = git_apply(root, text)
    if r.returncode == 0:
        return
    out = r.stdout + r.stderr
    msgs = hunk_failures(label, version, text, out, root)
    for path, want in (before or {}).items():  # tells a changed file from a bad diff
        if (root / path).is_file() and (got := sha256_file(root / path)) != want:
            msgs.append(
                f"  note: {path} has sha256 {got}, the manifest expects {want} (stock sglang "
                f"{version}); the file was changed before this patch"
            )
    said = " | ".join(ln for ln in out.strip().splitlines() if ln.startswith("error"))
    raise PatchError("\n".join([*msgs, f"  git apply said: {said[:600]}"]))


def compile_check(root: Path, paths: Collection[str], label: str, version: str) -> None:
    """PatchError naming the first Python file of ``paths`` under ``root`` that does not compile."""
    for p in (p for p in paths if p.endswith(".py")):
        try:
            compile((root / p).read_bytes(), p, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as e:
            raise PatchError(
                f"{label} (sglang {version}): patched {p} does not compile: {e}"
            ) from None


def apply_to_tree(
    root: Path,
    name: str,
    version: str,
    *,
    cache_dir: Path | None = None,
    stacked: Collection[str] = (),
    patches_dir: Path | None = None,
) -> dict[str, str]:
    """Apply patch ``name`` (its diff for sglang ``version``) to the files under ``root`` (a
    folder holding ``sglang/``, possibly only the files the patch touches): the diff must touch
    exactly the manifest's files; their sha256 before and after must be the manifest's, except
    for ``stacked`` files (already changed by an earlier patch in the same tree).

    Returns {path: sha256 after}. Raises the manifest's errors, or :class:`PatchError` naming
    the patch, the file and the failing hunk or the expected and found hash (after a wrong
    ``after`` hash, ``root`` holds the applied result).
    """
    m = load_manifest(name, patches_dir=patches_dir)
    rel = m.release(version)
    text = _diff_of(m, version, cache_dir)
    label = f"patch '{name}'"
    touched = {c.path for c in inspect_diff(text, source=f"{label} (sglang {version})")}
    if touched != set(rel.files):
        raise ManifestError(
            f"{label} (sglang {version}): the diff touches "
            f"{', '.join(sorted(touched)) or 'nothing'} but the manifest's releases.{version}.files "
            f"lists {', '.join(sorted(rel.files))}; they must be the same files"
        )
    before = {p: h.before for p, h in rel.files.items() if p not in stacked}
    apply_text(Path(root), text, label, version, before)
    after = {p: sha256_file(Path(root) / p) for p in rel.files}
    for p, h in rel.files.items():
        if p not in stacked and after[p] != h.after:
            raise PatchError(
                f"{label} (sglang {version}): {p} after patching has sha256 {after[p]}, "
                f"the manifest expects {h.after}"
            )
    return after


def check_patch(
    name: str, version: str, *, cache_dir: Path | None = None, patches_dir: Path | None = None
) -> dict:
    """Apply ``name`` to a pristine copy of sglang ``version``'s files and compile the results.
    Returns {"patch", "version", "source", "patch_sha256", "files": {path: {"before",
    "after"}}}; raises the errors of :func:`apply_to_tree`, or PatchError for a file that does
    not compile."""
    m = load_manifest(name, patches_dir=patches_dir)
    files = list(m.release(version).files)
    with tempfile.TemporaryDirectory(prefix="patchbench-checkpatch-") as tmp:
        root = Path(tmp)
        source = pristine_files(version, files, root, cache_dir=cache_dir)
        before = {p: sha256_file(root / p) for p in files}
        after = apply_to_tree(root, name, version, cache_dir=cache_dir, patches_dir=patches_dir)
        compile_check(root, files, f"patch '{name}'", version)
    return {
        "patch": name,
        "version": version,
        "source": source,
        "patch_sha256": sha256_hex(_diff_of(m, version, cache_dir).encode()),
        "files": {p: {"before": before[p], "after": after[p]} for p in files},
    }
