"""Patches as data: manifests, diffs (stored or derived from two upstream wheels), and applying them.

A patch is a folder ``patches/<name>/`` holding ``manifest.yaml`` and, unless it is derived, one
unified diff per supported sglang release. Paths in the diffs are relative to site-packages
(``a/sglang/srt/...``, ``b/sglang/srt/...``), so a diff applies with ``git apply -p1`` in the
folder that holds the ``sglang/`` package. Manifest shape::

    name: mrope-sync-free                  # must equal the folder name
    description: |                         # what it changes and why
      ...
    upstream: {pr: 9460, url: https://github.com/sgl-project/sglang/pull/9460}   # optional
    releases:                              # sglang release -> its diff and the files it touches
      0.5.1.post3:
        diff: 0.5.1.post3.diff             # relative to the patch folder
        files:                             # every file the diff touches, sha256 hex of the whole file
          sglang/srt/model_executor/forward_batch_info.py: {before: <sha256>, after: <sha256>}

or, for a patch derived at run time from two upstream wheels (no upstream code in this repo)::

    name: pr9460-upstream
    derive: {from: "sglang==0.5.2rc1", to: "sglang==0.5.2rc2",
             files: [sglang/srt/model_executor/forward_batch_info.py]}
    releases:
      0.5.1.post3: {files: {sglang/srt/model_executor/forward_batch_info.py: {before: ..., after: ...}}}

Cache layout (``cache_dir``, by default the repo's git-ignored ``.cache/``)::

    wheels/<name>-<version>/*.whl          pip download --no-deps <name>==<version>
    patches/<from>__<to>.diff              derived diffs, keyed by the two specs

Errors: :class:`PatchError` and its subclasses :class:`ManifestError` (a manifest or diff file that
cannot be used), :class:`UnsupportedRelease` (no diff for that sglang release), :class:`FetchError`
(a wheel that could not be downloaded). Every message names the patch, and where it applies, the
file, the key or the failing hunk and what was expected.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Collection

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from patchbench import EXIT_ENV, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE
from patchbench import config as _config
from patchbench.records import write_text

#: default cache folder (git-ignored): wheels, derived diffs
DEFAULT_CACHE_DIR = _config.REPO_ROOT / ".cache"
#: the file every patch of this project is about, and whose hash the overlay verifies in the server
FORWARD_BATCH_INFO = "sglang/srt/model_executor/forward_batch_info.py"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class PatchError(Exception):
    """A patch that cannot be used or applied; the message names the patch, file and hunk."""


class ManifestError(PatchError):
    """A manifest (or a diff file it names) that is missing or invalid: names file, key, value."""


class UnsupportedRelease(PatchError):
    """The manifest has no entry for the requested sglang release; lists the supported ones."""


class FetchError(PatchError):
    """An upstream wheel could not be downloaded (no network, unknown version)."""


# --------------------------------------------------------------------------- manifest schema
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class FileHashes(_Strict):
    """sha256 (64 lowercase hex) of one whole file before and after the patch."""

    before: str
    after: str

    @field_validator("before", "after")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = str(v).strip().lower()
        if not _SHA256.match(v):
            raise ValueError("must be a sha256 as 64 hex digits (sha256sum of the file)")
        return v


def _rel_path(v: str) -> str:
    p = str(v).strip()
    if not p.startswith("sglang/") or p.startswith("/") or ".." in Path(p).parts:
        raise ValueError(f"'{p}': must be a path relative to site-packages starting with 'sglang/', "
                         "e.g. sglang/srt/model_executor/forward_batch_info.py")
    return p


class ReleaseSpec(_Strict):
    """One supported sglang release: the diff file (absent for derived patches) and file hashes."""

    diff: str | None = Field(None, description="diff file, relative to the patch folder")
    files: dict[str, FileHashes]

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, FileHashes]) -> dict[str, FileHashes]:
        if not v:
            raise ValueError("list every file the diff touches with its before/after sha256")
        for k in v:
            _rel_path(k)
        return v


class Upstream(_Strict):
    """Where the change comes from upstream (informational)."""

    pr: int | None = None
    url: str | None = None


class Derive(_Strict):
    """Derive the diff from the difference of ``files`` between two wheels (pip requirement specs
    pinned with ``==``, e.g. ``sglang==0.5.2rc1``)."""

    from_: str = Field(alias="from")
    to: str
    files: list[str]

    @field_validator("from_", "to")
    @classmethod
    def _spec(cls, v: str) -> str:
        pin_of(v)
        return v

    @field_validator("files")
    @classmethod
    def _files(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("name at least one file, e.g. sglang/srt/model_executor/forward_batch_info.py")
        return [_rel_path(x) for x in v]


class PatchManifest(_Strict):
    """A validated ``patches/<name>/manifest.yaml`` (see the module docstring for the shape).

    ``folder`` (not in the YAML) is the patch folder the manifest was read from.
    """

    name: str
    description: str = ""
    upstream: Upstream | None = None
    derive: Derive | None = None
    releases: dict[str, ReleaseSpec]
    folder: Path | None = Field(None, exclude=True)

    @field_validator("releases", mode="before")
    @classmethod
    def _keys_as_str(cls, v):
        # YAML reads a key like 0.5 as a float; releases are strings.
        if isinstance(v, dict):
            return {str(k): val for k, val in v.items()}
        return v

    @field_validator("releases")
    @classmethod
    def _releases(cls, v: dict[str, ReleaseSpec]) -> dict[str, ReleaseSpec]:
        if not v:
            raise ValueError("at least one sglang release is needed, e.g. {0.5.1.post3: {...}}")
        for k in v:
            try:
                Version(k)
            except InvalidVersion:
                raise ValueError(f"'{k}' is not an sglang release version (e.g. 0.5.1.post3)") from None
        return v

    @model_validator(mode="after")
    def _diff_or_derive(self) -> "PatchManifest":
        for ver, rel in self.releases.items():
            if self.derive is None and rel.diff is None:
                raise ValueError(f"releases.{ver}: no 'diff' (and no top-level 'derive'); add "
                                 f"'diff: {ver}.diff' naming the unified diff in the patch folder")
            if self.derive is not None and rel.diff is not None:
                raise ValueError(f"releases.{ver}: 'diff' and top-level 'derive' exclude each other")
            if self.derive is not None and set(rel.files) != set(self.derive.files):
                raise ValueError(f"releases.{ver}.files must list exactly derive.files "
                                 f"({', '.join(self.derive.files)}); got {', '.join(rel.files)}")
        return self

    def release(self, version: str) -> ReleaseSpec:
        """The entry for ``version``; raises :class:`UnsupportedRelease` listing the supported ones."""
        if version not in self.releases:
            raise UnsupportedRelease(
                f"patch '{self.name}' has no diff for sglang {version}; it supports "
                f"{', '.join(self.releases)} (add releases.{version} to "
                f"{self.folder / 'manifest.yaml' if self.folder else 'its manifest'})")
        return self.releases[version]


def pin_of(spec: str) -> tuple[str, str]:
    """``"sglang==0.5.2rc1"`` -> ``("sglang", "0.5.2rc1")``; ValueError unless pinned with ``==``."""
    try:
        req = Requirement(spec)
    except InvalidRequirement as e:
        raise ValueError(f"'{spec}' is not a pip requirement ({e}); write e.g. sglang==0.5.2rc1") from None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise ValueError(f"'{spec}' must pin one exact version with '==', e.g. sglang==0.5.2rc1")
    return req.name, specs[0].version


def available_patches(patches_dir: Path | None = None) -> list[str]:
    """Names of the folders under the patches dir that hold a ``manifest.yaml``, sorted."""
    d = Path(patches_dir or _config.PATCHES_DIR)
    return sorted(p.name for p in d.iterdir() if (p / "manifest.yaml").is_file()) if d.is_dir() else []


def load_manifest(name: str, *, patches_dir: Path | None = None) -> PatchManifest:
    """Load and validate ``<patches_dir>/<name>/manifest.yaml`` (default ``config.PATCHES_DIR``).

    Also checks that the name matches the folder and that every diff file named exists.
    Raises :class:`ManifestError` naming the file, the key (with its YAML line) and what is allowed.
    """
    d = Path(patches_dir or _config.PATCHES_DIR)
    path = d / name / "manifest.yaml"
    if not path.is_file():
        have = available_patches(d)
        raise ManifestError(f"patch '{name}' not found: no {path}; available: {', '.join(have) or 'none'}")
    text, raw = _config.read_yaml_mapping(path, ManifestError,
                                          "name, description, upstream, derive, releases")
    try:
        m = PatchManifest.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = tuple("from" if x == "from_" else x for x in err["loc"])
            key = ".".join(str(x) for x in loc) or "(top level)"
            line = _config._line_of(text, loc)
            at = f"{path}:{line}" if line else str(path)
            if err["type"] == "extra_forbidden":
                lines.append(f"{at}: unknown key '{key}'")
            elif err["type"] == "missing":
                lines.append(f"{at}: missing required key '{key}'")
            else:
                got = err.get("input")
                got_s = "a mapping" if isinstance(got, dict) else repr(got)[:80]
                lines.append(f"{at}: key '{key}': {err['msg']} (got {got_s})")
        raise ManifestError("\n".join(lines)) from None
    if m.name != name:
        raise ManifestError(f"{path}: key 'name' is '{m.name}' but the folder is '{name}'; they must match")
    m.folder = path.parent
    for ver, rel in m.releases.items():
        if rel.diff is not None and not (m.folder / rel.diff).is_file():
            raise ManifestError(f"{path}: releases.{ver}.diff names '{rel.diff}', but "
                                f"{m.folder / rel.diff} does not exist")
    return m


# --------------------------------------------------------------------------- diffs
def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """sha256 hex digest of a file's bytes."""
    return _sha256_bytes(Path(path).read_bytes())


def fetch_wheel(spec: str, *, cache_dir: Path | None = None) -> Path:
    """The wheel of a pinned requirement (``sglang==X``), downloaded once into
    ``<cache_dir>/wheels/<name>-<version>/`` with ``pip download --no-deps --only-binary :all:``.

    Raises :class:`FetchError` with pip's output tail when the download fails.
    """
    name, version = pin_of(spec)
    folder = Path(cache_dir or DEFAULT_CACHE_DIR) / "wheels" / f"{canonicalize_name(name)}-{version}"
    found = _find_wheel(folder, name, version)
    if found:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "--progress-bar", "off", "-d", str(folder), f"{name}=={version}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    found = _find_wheel(folder, name, version)
    if r.returncode != 0 or not found:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])
        raise FetchError(f"could not download {spec} (`{' '.join(cmd[2:])}` exited {r.returncode}); "
                         f"is PyPI reachable? A wheel placed in {folder} is used instead.\n{tail}")
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


def unified_diff(rel: str, old: bytes, new: bytes) -> str:
    """A ``git apply``-compatible unified diff (3 lines of context) of one file, paths ``a/rel``,
    ``b/rel``; empty when the contents are equal. Handles a missing final newline."""
    a = old.decode("utf-8").splitlines(keepends=True)
    b = new.decode("utf-8").splitlines(keepends=True)
    out = []
    for line in difflib.unified_diff(a, b, fromfile=f"a/{rel}", tofile=f"b/{rel}"):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    if not out:
        return ""
    return f"diff --git a/{rel} b/{rel}\n" + "".join(out)


def _derived_diff(m: PatchManifest, cache_dir: Path) -> str:
    assert m.derive is not None
    key = f"{_safe(m.derive.from_)}__{_safe(m.derive.to)}"
    files_key = _sha256_bytes("\n".join(m.derive.files).encode())[:12]
    target = cache_dir / "patches" / f"{key}-{files_key}.diff"
    if target.is_file():
        return target.read_text(encoding="utf-8")
    w_from = fetch_wheel(m.derive.from_, cache_dir=cache_dir)
    w_to = fetch_wheel(m.derive.to, cache_dir=cache_dir)
    parts = []
    for rel in m.derive.files:
        part = unified_diff(rel, read_from_wheel(w_from, rel), read_from_wheel(w_to, rel))
        if not part:
            raise PatchError(f"patch '{m.name}': {rel} is identical in {m.derive.from_} and "
                             f"{m.derive.to}; nothing to derive")
        parts.append(part)
    text = "".join(parts)
    write_text(target, text)
    return text


def _safe(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-")


def diff_text(name: str, version: str, *, cache_dir: Path | None = None,
              patches_dir: Path | None = None) -> str:
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


def patch_sha256(name: str, version: str, cache_dir: Path | None = None, *,
                 patches_dir: Path | None = None) -> str:
    """sha256 hex of the diff text (UTF-8) of ``name`` for ``version``; identifies the patch."""
    return _sha256_bytes(diff_text(name, version, cache_dir=cache_dir, patches_dir=patches_dir).encode())


# --------------------------------------------------------------------------- applying
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_hunks(text: str) -> dict[str, list[tuple[int, str, list[str]]]]:
    """{target path (without ``a/``): [(old start line, header, hunk body lines), ...]} of a diff."""
    files: dict[str, list[tuple[int, str, list[str]]]] = {}
    current: list | None = None
    hunk: list[str] | None = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = line[4:].split("\t")[0].strip()
            new = lines[i + 1][4:].split("\t")[0].strip()
            path = new if new != "/dev/null" else old
            path = path[2:] if path[:2] in ("a/", "b/") else path
            current = files.setdefault(path, [])
            hunk = None
            i += 2
            continue
        mt = _HUNK.match(line)
        if mt and current is not None:
            hunk = []
            current.append((int(mt.group(1)), line, hunk))
        elif hunk is not None and line[:1] in (" ", "+", "-", "\\"):
            hunk.append(line)
        i += 1
    return files


def _git_apply(root: Path, diff_path: Path, check: bool) -> subprocess.CompletedProcess:
    cmd = ["git", "apply", "-p1", "--verbose", "--whitespace=nowarn"]
    if check:
        cmd.append("--check")
    cmd.append(str(diff_path))
    env = dict(os.environ)
    # never let git discover an enclosing repository (e.g. this repo's .cache/): paths must be
    # relative to `root`, not to a repository top level
    env["GIT_CEILING_DIRECTORIES"] = str(Path(root).resolve().parent)
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)


def _explain_failure(name: str, version: str, text: str, output: str, root: Path,
                     rel: "ReleaseSpec") -> str:
    hunks = parse_hunks(text)
    msgs = []
    for mt in re.finditer(r"error: patch failed: (\S+):(\d+)", output):
        path, line = mt.group(1), int(mt.group(2))
        shown = f"hunk at line {line}"
        for start, header, body in hunks.get(path, []):
            if start == line:
                preview = "\n    ".join(body[:6])
                shown = f"hunk {header}\n    {preview}"
                break
        msgs.append(f"patch '{name}' (sglang {version}) does not apply to {path}: {shown}")
    for mt in re.finditer(r"error: (\S+): (No such file or directory|does not exist in index)", output):
        msgs.append(f"patch '{name}' (sglang {version}): target file {mt.group(1)} is missing under {root}")
    if not msgs:
        msgs.append(f"patch '{name}' (sglang {version}) does not apply under {root}")
    # say whether the target was what the manifest expects: tells a changed file from a bad diff
    for path, h in rel.files.items():
        f = root / path
        if f.is_file():
            got = sha256_file(f)
            if got != h.before:
                msgs.append(f"  note: {path} has sha256 {got}, the manifest expects {h.before} "
                            f"(stock sglang {version}); the file was changed before this patch")
    msgs.append("  git apply said: " + " | ".join(l for l in output.strip().splitlines()
                                                    if l.startswith("error"))[:600])
    return "\n".join(msgs)


def apply_to_tree(root: Path, name: str, version: str, *, cache_dir: Path | None = None,
                  check_only: bool = False, stacked: Collection[str] = (),
                  patches_dir: Path | None = None) -> dict[str, str]:
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
    touched = set(parse_hunks(text))
    if touched != set(rel.files):
        raise ManifestError(
            f"patch '{name}' (sglang {version}): the diff touches {', '.join(sorted(touched)) or 'nothing'} "
            f"but the manifest's releases.{version}.files lists {', '.join(sorted(rel.files))}; "
            "they must be the same files")
    if check_only:
        with tempfile.TemporaryDirectory(prefix="patchbench-check-") as tmp:
            for path in rel.files:
                src = root / path
                if src.is_file():
                    (Path(tmp) / path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, Path(tmp) / path)
            return apply_to_tree(Path(tmp), name, version, cache_dir=cache_dir, stacked=stacked,
                                 patches_dir=patches_dir)
    with tempfile.TemporaryDirectory(prefix="patchbench-diff-") as tmp:
        diff_file = Path(tmp) / f"{name}-{version}.diff"
        diff_file.write_text(text, encoding="utf-8")
        r = _git_apply(root, diff_file, check=True)
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
                    "but to a different file than the one it was made for")
        r = _git_apply(root, diff_file, check=False)
        if r.returncode != 0:
            raise PatchError(_explain_failure(name, version, text, r.stdout + r.stderr, root, rel))
    after: dict[str, str] = {}
    for path, h in rel.files.items():
        got = sha256_file(root / path)
        after[path] = got
        if path not in stacked and got != h.after:
            raise PatchError(
                f"patch '{name}' (sglang {version}): {path} after patching has sha256 {got}, "
                f"the manifest expects {h.after}")
    return after


# --------------------------------------------------------------------------- pristine releases
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


def pristine_files(version: str, rel_paths: Collection[str], dest_root: Path, *,
                   cache_dir: Path | None = None) -> str:
    """Copy the stock files ``rel_paths`` of sglang ``version`` to ``dest_root/<rel>``.

    Source: the installed package when its version is ``version``, else the release's wheel
    (``pip download``, cached). Returns "installed <folder>" or "wheel <file name>".
    Raises :class:`FetchError` / :class:`PatchError` when a file is missing.
    """
    inst_ver, inst_root = installed_sglang()
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


def check_patch(name: str, version: str, *, cache_dir: Path | None = None,
                patches_dir: Path | None = None) -> dict:
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
                py_compile.compile(str(root / p), cfile=str(Path(tmp) / "compiled.pyc"), doraise=True)
            except py_compile.PyCompileError as e:
                raise PatchError(f"patch '{name}' (sglang {version}): patched {p} does not compile: "
                                 f"{e.msg}") from None
    return {"patch": name, "version": version, "source": source,
            "patch_sha256": patch_sha256(name, version, cache_dir, patches_dir=patches_dir),
            "files": {p: {"before": before[p], "after": after[p]} for p in rel.files}}


def cli(argv: list[str]) -> int:
    """``runner.py check-patch [--sglang VERSION] [--patch NAME] [--cache-dir DIR] [--json]``.

    For each patch (or the named one) and each release in its manifest (or the given one): apply
    to a pristine copy, byte-compile, compare hashes; one verdict line per (patch, release).
    Without ``--patch``, a patch that lacks the ``--sglang`` release is reported as SKIP.
    Exit codes: 0 all OK; 2 bad usage (unknown patch, invalid manifest, a named patch without that
    release); 3 a wheel could not be fetched; 4 a diff that does not apply / hash mismatch /
    does not compile.
    """
    ap = argparse.ArgumentParser(prog="runner.py check-patch",
                                 description="Apply every patch to a pristine copy of each "
                                             "supported sglang release and check its hashes.")
    ap.add_argument("--sglang", metavar="VERSION", help="only this release (default: all in each manifest)")
    ap.add_argument("--patch", metavar="NAME", help="only this patch (a folder in patches/)")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                    help="wheels and derived diffs (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return EXIT_OK if e.code == 0 else EXIT_USAGE
    names = [args.patch] if args.patch else available_patches()
    if not names:
        print(f"check-patch: no patches found under {_config.PATCHES_DIR}", file=sys.stderr)
        return EXIT_USAGE
    worst = EXIT_OK
    results = []

    def bump(code: int) -> None:
        nonlocal worst
        order = [EXIT_OK, EXIT_ENV, EXIT_RUN_FAILED, EXIT_USAGE]
        if order.index(code) > order.index(worst):
            worst = code

    for name in names:
        try:
            m = load_manifest(name)
        except ManifestError as e:
            print(f"{name:<20} {'-':<12} FAIL  {e}")
            bump(EXIT_USAGE)
            continue
        versions = [args.sglang] if args.sglang else list(m.releases)
        for ver in versions:
            if ver not in m.releases and not args.patch:
                print(f"{name:<20} {ver:<12} SKIP  no diff for this release (supports "
                      f"{', '.join(m.releases)})")
                continue
            try:
                res = check_patch(name, ver, cache_dir=args.cache_dir)
            except (UnsupportedRelease, ManifestError) as e:
                print(f"{name:<20} {ver:<12} FAIL  {e}")
                bump(EXIT_USAGE)
                continue
            except FetchError as e:
                print(f"{name:<20} {ver:<12} FAIL  {e}")
                bump(EXIT_ENV)
                continue
            except PatchError as e:
                print(f"{name:<20} {ver:<12} FAIL  {e}")
                bump(EXIT_RUN_FAILED)
                continue
            files = "  ".join(f"{Path(p).name} {h['before'][:8]}..->{h['after'][:8]}.."
                              for p, h in res["files"].items())
            print(f"{name:<20} {ver:<12} OK    {files}  (diff {res['patch_sha256'][:8]}.., "
                  f"{res['source'].split()[0]}, compiles)")
            results.append(res)
    if args.json:
        print(json.dumps(results, indent=1))
    return worst
