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

Errors: :class:`patchbench.errors.PatchError` and its subclasses here: :class:`ManifestError` (a
manifest or diff file that cannot be used), :class:`UnsupportedRelease` (no diff for that sglang
release), :class:`FetchError` (a wheel that could not be downloaded; exit 3). Every message names
the patch, and where it applies, the file, the key or the failing hunk and what was expected.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.metadata
import importlib.util
import os
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from patchbench import errors, inputs
from patchbench.errors import PatchError
from patchbench.inputs import FOLDER_NAME, line_of, read_text_file, read_yaml_mapping, sha256_file
from patchbench.records import write_text

#: default cache folder (git-ignored): wheels, derived diffs
DEFAULT_CACHE_DIR = inputs.CACHE_DIR
#: the file every patch of this project is about, and whose hash the overlay verifies in the server
FORWARD_BATCH_INFO = "sglang/srt/model_executor/forward_batch_info.py"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(PatchError):
    """A manifest (or a diff file it names) that is missing or invalid: names file, key, value."""


class UnsupportedRelease(PatchError):
    """The manifest has no entry for the requested sglang release; lists the supported ones."""


class FetchError(PatchError, errors.EnvironmentNotReady):
    """An upstream wheel could not be downloaded (no network, unknown version) (exit 3)."""

    exit_code = errors.EXIT_ENV
    kind = errors.EnvironmentNotReady.kind


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
        raise ValueError(
            f"'{p}': must be a path relative to site-packages starting with 'sglang/', "
            "e.g. sglang/srt/model_executor/forward_batch_info.py"
        )
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
            raise ValueError(
                "name at least one file, e.g. sglang/srt/model_executor/forward_batch_info.py"
            )
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
    origin: dict[str, str] | None = Field(
        None,
        description=(
            "where the change came from (informational; written by new-patch): kind diff|git, "
            "source, range, commits"
        ),
    )
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
                raise ValueError(
                    f"'{k}' is not an sglang release version (e.g. 0.5.1.post3)"
                ) from None
        return v

    @model_validator(mode="after")
    def _diff_or_derive(self) -> PatchManifest:
        for ver, rel in self.releases.items():
            if self.derive is None and rel.diff is None:
                raise ValueError(
                    f"releases.{ver}: no 'diff' (and no top-level 'derive'); add "
                    f"'diff: {ver}.diff' naming the unified diff in the patch folder"
                )
            if self.derive is not None and rel.diff is not None:
                raise ValueError(
                    f"releases.{ver}: 'diff' and top-level 'derive' exclude each other"
                )
            if self.derive is not None and set(rel.files) != set(self.derive.files):
                raise ValueError(
                    f"releases.{ver}.files must list exactly derive.files "
                    f"({', '.join(self.derive.files)}); got {', '.join(rel.files)}"
                )
        return self

    def release(self, version: str) -> ReleaseSpec:
        """The entry for ``version``; raises :class:`UnsupportedRelease` listing the supported ones."""
        if version not in self.releases:
            raise UnsupportedRelease(
                f"patch '{self.name}' has no diff for sglang {version}; it supports "
                f"{', '.join(self.releases)} (add releases.{version} to "
                f"{self.folder / 'manifest.yaml' if self.folder else 'its manifest'})"
            )
        return self.releases[version]


def pin_of(spec: str) -> tuple[str, str]:
    """``"sglang==0.5.2rc1"`` -> ``("sglang", "0.5.2rc1")``; ValueError unless pinned with ``==``."""
    try:
        req = Requirement(spec)
    except InvalidRequirement as e:
        raise ValueError(
            f"'{spec}' is not a pip requirement ({e}); write e.g. sglang==0.5.2rc1"
        ) from None
    specs = list(req.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
        raise ValueError(f"'{spec}' must pin one exact version with '==', e.g. sglang==0.5.2rc1")
    return req.name, specs[0].version


def available_patches(patches_dir: Path | None = None) -> list[str]:
    """Names of the folders under the patches dir that hold a ``manifest.yaml``, sorted."""
    d = Path(patches_dir or inputs.PATCHES_DIR)
    return (
        sorted(p.name for p in d.iterdir() if (p / "manifest.yaml").is_file()) if d.is_dir() else []
    )


def load_manifest(name: str, *, patches_dir: Path | None = None) -> PatchManifest:
    """Load and validate ``<patches_dir>/<name>/manifest.yaml`` (default ``patchbench.inputs.PATCHES_DIR``).

    Also checks that the name matches the folder and that every diff file named exists.
    Raises :class:`ManifestError` naming the file, the key (with its YAML line) and what is allowed.
    """
    d = Path(patches_dir or inputs.PATCHES_DIR)
    if not FOLDER_NAME.match(str(name)):
        raise ManifestError(
            f"'{name}' is not a patch name (a folder in {d}: letters, digits, '.', '_', '-')"
        )
    path = d / name / "manifest.yaml"
    if not path.is_file():
        have = available_patches(d)
        raise ManifestError(
            f"patch '{name}' not found: no {path}; available: {', '.join(have) or 'none'}"
        )
    text, raw = read_yaml_mapping(
        path, ManifestError, "name, description, upstream, derive, releases, origin"
    )
    try:
        m = PatchManifest.model_validate(raw)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = tuple("from" if x == "from_" else x for x in err["loc"])
            key = ".".join(str(x) for x in loc) or "(top level)"
            line = line_of(text, loc)
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
        raise ManifestError(
            f"{path}: key 'name' is '{m.name}' but the folder is '{name}'; they must match"
        )
    m.folder = path.parent
    for ver, rel in m.releases.items():
        if rel.diff is not None and not (m.folder / rel.diff).is_file():
            raise ManifestError(
                f"{path}: releases.{ver}.diff names '{rel.diff}', but "
                f"{m.folder / rel.diff} does not exist"
            )
    return m


# --------------------------------------------------------------------------- diffs
def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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
    return _sha256_bytes(
        diff_text(name, version, cache_dir=cache_dir, patches_dir=patches_dir).encode()
    )


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


def _explain_failure(
    name: str, version: str, text: str, output: str, root: Path, rel: ReleaseSpec
) -> str:
    msgs = _hunk_failures(f"patch '{name}'", version, text, output, root)
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
                    "but to a different file than the one it was made for"
                )
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
                f"the manifest expects {h.after}"
            )
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


def pristine_files(
    version: str, rel_paths: Collection[str], dest_root: Path, *, cache_dir: Path | None = None
) -> str:
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


# --------------------------------------------------------------------------- diffs from users
#: a ``git diff`` in an sglang checkout names files ``python/sglang/...``; site-packages ``sglang/...``
REPO_PACKAGE_PREFIX = "python/sglang/"


@dataclass
class FileChange:
    """One file of a diff, as :func:`inspect_diff` found it.

    path: the file relative to site-packages (``sglang/...``); raw_old / raw_new: the paths as the
    diff wrote them (prefix ``a/``/``b/`` removed); hunks: number of ``@@`` hunks.
    """

    path: str
    raw_old: str
    raw_new: str
    hunks: int = 0


def map_to_site_path(raw: str) -> str:
    """A path from a diff -> the path relative to site-packages.

    ``python/sglang/srt/x.py`` (an sglang checkout) -> ``sglang/srt/x.py``; ``sglang/srt/x.py``
    stays. Raises ValueError for an absolute path, a ``..`` part, a quoted or backslashed path,
    or a path outside the ``sglang`` package.
    """
    p = raw.strip()
    if p.startswith('"') or "\\" in p:
        raise ValueError(f"'{p}': quoted or escaped paths are not supported")
    if p.startswith("/"):
        raise ValueError(
            f"'{p}': an absolute path; a patch may only change files of the sglang package"
        )
    parts = p.split("/")
    if ".." in parts or "." in parts or "" in parts:
        raise ValueError(f"'{p}': '..', '.' or empty parts are not allowed")
    if p.startswith(REPO_PACKAGE_PREFIX):
        return p[len("python/") :]
    if p.startswith("sglang/"):
        return p
    raise ValueError(
        f"'{p}' is outside the sglang package (python/sglang/... in an sglang "
        "checkout, sglang/... in site-packages); a patch may only change sglang's files"
    )


def _strip_prefix(p: str) -> str:
    """A diff's path without git's ``a/``/``b/`` prefix and any trailing timestamp."""
    p = p.split("\t")[0].strip()
    return p[2:] if p[:2] in ("a/", "b/") else p


_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$")


def _split_blocks(text: str) -> list[list[str]]:
    """The per-file blocks of a diff (git's ``diff --git`` blocks, else ``---``/``+++`` pairs)."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("diff --git ")]
    if not starts:
        starts = [
            i
            for i in range(len(lines) - 1)
            if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")
        ]
    if not starts:
        return []
    return [lines[a:b] for a, b in zip(starts, starts[1:] + [len(lines)], strict=True)]


def inspect_diff(text: str, *, source: str = "diff") -> list[FileChange]:
    """Check a unified diff and map its paths to site-packages paths.

    Accepted: changes to the contents of existing files under ``sglang/`` (``python/sglang/`` in an
    sglang checkout). Refused, each named with its file: paths outside the package, ``..`` or
    absolute paths, new files, deleted files, renames and copies, mode changes, symlinks (mode
    120000), binary changes, and a file named twice.

    Returns one :class:`FileChange` per file, in diff order. Raises :class:`PatchError` naming
    ``source`` and every problem (one line each), or when the text holds no file change.
    """
    problems: list[str] = []
    out: list[FileChange] = []
    blocks = _split_blocks(text)
    if not blocks:
        raise PatchError(
            f"{source}: holds no file change (expected a unified diff as `git diff` writes it)"
        )
    for block in blocks:
        header = block[0]
        old = new = None
        reasons = []
        hunks = 0
        m = _GIT_HEADER.match(header)
        if m:
            old, new = m.group(1), m.group(2)
        for ln in block[1:] if header.startswith("diff --git ") else block:
            if ln.startswith("@@"):
                hunks += 1
                continue
            if hunks:
                continue  # inside the hunks: contents, not headers
            if ln.startswith("--- "):
                old = ln[4:]
            elif ln.startswith("+++ "):
                new = ln[4:]
            elif ln.startswith("new file mode"):
                reasons.append("creates a new file (a patch may only change existing files)")
            elif ln.startswith("deleted file mode"):
                reasons.append("deletes the file (a patch may only change existing files)")
            elif ln.startswith(("rename from", "rename to", "similarity index")):
                if "renames the file" not in reasons:
                    reasons.append("renames the file")
            elif ln.startswith(("copy from", "copy to")):
                if "copies the file" not in reasons:
                    reasons.append("copies the file")
            elif ln.startswith(("old mode", "new mode")):
                if "changes the file mode" not in reasons:
                    reasons.append("changes the file mode (the overlay keeps the release's modes)")
            elif ln.startswith("index ") and ln.rstrip().endswith(" 120000"):
                reasons.append("is a symlink")
            elif ln.startswith(("Binary files", "GIT binary patch")):
                reasons.append("is a binary change")
        if any(
            "120000" in ln
            for ln in block[1:6]
            if ln.startswith(("new file mode", "deleted file mode", "old mode", "new mode"))
        ):
            reasons.append("is a symlink")
        old_p = _strip_prefix(old) if old else None
        new_p = _strip_prefix(new) if new else None
        shown = new_p if new_p and new_p != "/dev/null" else (old_p or header)
        if old_p == "/dev/null" and not any(r.startswith("creates") for r in reasons):
            reasons.append("creates a new file (a patch may only change existing files)")
        if new_p == "/dev/null" and not any(r.startswith("deletes") for r in reasons):
            reasons.append("deletes the file (a patch may only change existing files)")
        path = None
        for cand in {x for x in (old_p, new_p) if x and x != "/dev/null"}:
            try:
                mapped = map_to_site_path(cand)
            except ValueError as e:
                reasons.append(str(e))
                continue
            if path is not None and mapped != path and "renames the file" not in reasons:
                reasons.append(f"names two files ({old_p} and {new_p})")
            path = path or mapped
        if not reasons and not hunks:
            reasons.append("has no hunk (nothing to change)")
        if reasons:
            problems.append(f"{shown}: " + "; ".join(dict.fromkeys(reasons)))
            continue
        assert path is not None
        if any(c.path == path for c in out):
            problems.append(f"{shown}: named twice in the diff")
            continue
        out.append(FileChange(path=path, raw_old=old_p or "", raw_new=new_p or "", hunks=hunks))
    if problems:
        raise PatchError(f"{source}: cannot be used as a patch:\n  " + "\n  ".join(problems))
    return out


def site_layout_diff(text: str, changes: list[FileChange]) -> str:
    """``text`` with every file path rewritten to ``a/sglang/...`` / ``b/sglang/...`` (the layout
    :func:`apply_to_tree` applies in), ``index`` lines dropped."""
    by_raw = {}
    for c in changes:
        by_raw[c.raw_old] = c.path
        by_raw[c.raw_new] = c.path
    out = []
    for block in _split_blocks(text):
        in_hunks = False
        for ln in block:
            if ln.startswith("@@"):
                in_hunks = True
            if not in_hunks:
                if ln.startswith("diff --git "):
                    m = _GIT_HEADER.match(ln)
                    p = by_raw.get(_strip_prefix(m.group(2))) if m else None
                    ln = f"diff --git a/{p} b/{p}" if p else ln
                elif ln.startswith("--- "):
                    ln = f"--- a/{by_raw[_strip_prefix(ln[4:])]}"
                elif ln.startswith("+++ "):
                    ln = f"+++ b/{by_raw[_strip_prefix(ln[4:])]}"
                elif ln.startswith("index "):
                    continue
            out.append(ln)
    return "\n".join(out) + "\n"


def _hunk_failures(label: str, version: str, text: str, output: str, root: Path) -> list[str]:
    """One line per failing hunk (header and first lines) or missing file named by ``git apply``."""
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
        msgs.append(f"{label} (sglang {version}) does not apply to {path}: {shown}")
    for mt in re.finditer(
        r"error: (\S+): (No such file or directory|does not exist in index)", output
    ):
        msgs.append(
            f"{label} (sglang {version}): target file {mt.group(1)} is missing under {root}"
        )
    if not msgs:
        msgs.append(f"{label} (sglang {version}) does not apply under {root}")
    return msgs


@dataclass
class NewPatch:
    """What :func:`new_patch` made: the patch folder, the releases it applies to with each file's
    sha256 before and after ({version: {path: {"before", "after"}}}), and the releases it does not
    apply to with the reason ({version: message naming the file and the failing hunk})."""

    name: str
    folder: Path
    applies: dict[str, dict[str, dict[str, str]]]
    fails: dict[str, str]

    def summary(self) -> str:
        """Human-readable lines: one per release."""
        lines = [f"patch '{self.name}' written to {self.folder}"]
        for v, files in self.applies.items():
            lines.append(f"  sglang {v}: applies ({len(files)} file(s): {', '.join(files)})")
        for v, why in self.fails.items():
            lines.append(f"  sglang {v}: does NOT apply\n    " + why.replace("\n", "\n    "))
        return "\n".join(lines)


def _apply_to_release(
    label: str, site_diff: str, changes: list[FileChange], version: str, cache_dir: Path | None
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """({path: pristine bytes}, {path: patched bytes}) of ``site_diff`` on sglang ``version``.

    Raises PatchError naming the release and the file it lacks, or the failing hunk; a patched
    Python file that does not compile; FetchError when the release's wheel cannot be fetched.
    """
    paths = [c.path for c in changes]
    with tempfile.TemporaryDirectory(prefix="patchbench-newpatch-") as tmp:
        root = Path(tmp) / "tree"
        for p in paths:
            try:
                pristine_files(version, [p], root, cache_dir=cache_dir)
            except FetchError:
                raise
            except PatchError:
                raise PatchError(
                    f"{label} (sglang {version}): the release has no file {p} (the "
                    "diff changes it); a patch may only change files the release "
                    "has"
                ) from None
        before = {p: (root / p).read_bytes() for p in paths}
        diff_file = Path(tmp) / "change.diff"
        diff_file.write_text(site_diff, encoding="utf-8")
        r = _git_apply(root, diff_file, check=True)
        if r.returncode == 0:
            r = _git_apply(root, diff_file, check=False)
        if r.returncode != 0:
            raise PatchError(
                "\n".join(_hunk_failures(label, version, site_diff, r.stdout + r.stderr, root))
            )
        after = {p: (root / p).read_bytes() for p in paths}
        for p in paths:
            if p.endswith(".py"):
                try:
                    py_compile.compile(str(root / p), cfile=str(Path(tmp) / "c.pyc"), doraise=True)
                except py_compile.PyCompileError as e:
                    raise PatchError(
                        f"{label} (sglang {version}): patched {p} does not compile: {e.msg}"
                    ) from None
    return before, after


def build_patch(
    name: str,
    text: str,
    versions: Collection[str],
    *,
    patches_dir: Path | None = None,
    description: str = "",
    origin: dict[str, str] | None = None,
    cache_dir: Path | None = None,
    force: bool = False,
    source: str | None = None,
) -> NewPatch:
    """Make ``<patches_dir>/<name>/`` (manifest.yaml and one diff per release) from a diff ``text``
    (repository layout ``python/sglang/...`` or site-packages layout ``sglang/...``).

    The diff is checked (:func:`inspect_diff`), then applied to a pristine copy of every release
    in ``versions`` (the installed package when it is that release, else its wheel); each patched
    Python file must compile. The manifest lists the releases it applies to, with the sha256 of
    every touched file before and after, and one diff per release regenerated from the pristine
    and patched files (so it applies to that release without offsets). The folder is written in a
    temporary folder and renamed into place.

    Returns :class:`NewPatch`. Raises :class:`PatchError` for a bad name, an existing folder
    (unless ``force``), a diff that cannot be a patch, or when it applies to none of ``versions``
    (naming each release's failing file or hunk); FetchError (exit 3) when a release's wheel
    cannot be fetched.
    """
    if not FOLDER_NAME.match(name or ""):
        raise PatchError(
            f"patch name '{name}': use letters, digits, '.', '_' and '-' (it names "
            "the folder in patches/)"
        )
    versions = list(dict.fromkeys(versions))
    if not versions:
        raise PatchError(f"patch '{name}': name at least one sglang release (--sglang VERSION)")
    for v in versions:
        try:
            Version(v)
        except InvalidVersion:
            raise PatchError(f"'{v}' is not an sglang release version (e.g. 0.5.1.post3)") from None
    pdir = Path(patches_dir or inputs.PATCHES_DIR)
    dest = pdir / name
    if dest.exists() and not force:
        raise PatchError(f"{dest} already exists; choose another name or remove it first")
    label = f"patch '{name}'"
    changes = inspect_diff(text, source=source or label)
    site_diff = site_layout_diff(text, changes)
    applies: dict[str, dict[str, dict[str, str]]] = {}
    diffs: dict[str, str] = {}
    fails: dict[str, str] = {}
    for v in versions:
        try:
            before, after = _apply_to_release(label, site_diff, changes, v, cache_dir)
        except FetchError:
            raise
        except PatchError as e:
            fails[v] = str(e)
            continue
        applies[v] = {
            p: {"before": _sha256_bytes(before[p]), "after": _sha256_bytes(after[p])}
            for p in before
        }
        diffs[v] = "".join(unified_diff(p, before[p], after[p]) for p in before)
    if not applies:
        raise PatchError(
            f"{label} applies to none of sglang {', '.join(versions)}:\n"
            + "\n".join(fails.values())
        )
    manifest: dict[str, Any] = {
        "name": name,
        "description": description or f"made by new-patch from {source or 'a diff'}",
    }
    if origin:
        manifest["origin"] = dict(origin)
    manifest["releases"] = {v: {"diff": f"{v}.diff", "files": applies[v]} for v in applies}
    pdir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".new-{name}-", dir=pdir))
    try:
        for v, body in diffs.items():
            (tmp / f"{v}.diff").write_text(body, encoding="utf-8")
        head = (
            "# made by patchbench new-patch; sha256 of every touched file of each release "
            "before and after the change\n"
        )
        (tmp / "manifest.yaml").write_text(
            head + yaml.safe_dump(manifest, sort_keys=False, width=100), encoding="utf-8"
        )
        if dest.exists():
            shutil.rmtree(dest)
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    load_manifest(name, patches_dir=pdir)  # what was written validates
    return NewPatch(name=name, folder=dest, applies=applies, fails=fails)


def new_patch_from_diff(
    name: str,
    diff_file: str | os.PathLike,
    versions: Collection[str],
    *,
    patches_dir: Path | None = None,
    cache_dir: Path | None = None,
    description: str = "",
    force: bool = False,
) -> NewPatch:
    """``patchbench new-patch NAME --from-diff FILE --sglang V [--sglang V2 ...]``: see
    :func:`build_patch`. Raises PatchError when the file is missing or not UTF-8."""
    f = Path(diff_file)
    text = read_text_file(f, PatchError, "diff file")
    return build_patch(
        name,
        text,
        versions,
        patches_dir=patches_dir,
        cache_dir=cache_dir,
        description=description,
        force=force,
        source=str(f),
        origin={"kind": "diff", "source": str(f.resolve()), "sha256": _sha256_bytes(text.encode())},
    )


def _git(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    return subprocess.run(
        ["git", "-C", str(checkout), "-c", "core.quotepath=off", *args],
        capture_output=True,
        text=True,
        env=env,
    )


def new_patch_from_git(
    name: str,
    checkout: str | os.PathLike,
    rev_range: str,
    versions: Collection[str],
    *,
    patches_dir: Path | None = None,
    cache_dir: Path | None = None,
    description: str = "",
    force: bool = False,
) -> NewPatch:
    """``patchbench new-patch NAME --from-git SGLANG_CHECKOUT REV_RANGE --sglang V ...``.

    ``rev_range`` is what ``git diff`` takes: ``main...my-branch`` (the branch's own commits since
    it left main), ``A..B``, or one commit (its changes against the work tree are NOT taken: only
    committed changes count when a range is given). Every changed file must be under
    ``python/sglang/``; see :func:`build_patch` for the rest.

    Raises PatchError when ``checkout`` is not a git work tree, the range is unknown, the range
    changes nothing or changes files outside ``python/sglang/`` (named, with the command that
    writes a diff of the package only).
    """
    co = Path(checkout)
    if not co.is_dir():
        raise PatchError(f"{co}: no such folder (give the sglang checkout holding python/sglang)")
    r = _git(co, "rev-parse", "--show-toplevel")
    if r.returncode != 0:
        raise PatchError(f"{co}: not a git checkout ({r.stderr.strip()[:200]})")
    if rev_range.startswith("-"):
        raise PatchError(f"'{rev_range}' is not a revision range (e.g. main...my-branch)")
    base = [
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "-M",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        rev_range,
        "--",
    ]
    names = _git(co, *base[:-1], "--name-only", "--")
    if names.returncode != 0:
        raise PatchError(f"{co}: git cannot diff '{rev_range}': {names.stderr.strip()[:300]}")
    files = [ln for ln in names.stdout.splitlines() if ln.strip()]
    if not files:
        raise PatchError(f"{co}: '{rev_range}' changes no file")
    outside = [f for f in files if not f.startswith(REPO_PACKAGE_PREFIX)]
    if outside:
        shown = ", ".join(outside[:8]) + (
            f" and {len(outside) - 8} more" if len(outside) > 8 else ""
        )
        raise PatchError(
            f"{co}: '{rev_range}' changes files outside python/sglang/ ({shown}); a patch may only "
            f"change the installed package. Write a diff of the package alone and use --from-diff:\n"
            f"  git -C {co} diff {rev_range} -- python/sglang > change.diff"
        )
    d = _git(co, *base)
    if d.returncode != 0:
        raise PatchError(f"{co}: git diff '{rev_range}' failed: {d.stderr.strip()[:300]}")
    commits = _git(co, "rev-parse", rev_range)
    origin = {
        "kind": "git",
        "source": str(Path(r.stdout.strip()).resolve()),
        "range": rev_range,
        "commits": " ".join(ln.lstrip("^") for ln in commits.stdout.split())
        if commits.returncode == 0
        else "",
    }
    return build_patch(
        name,
        d.stdout,
        versions,
        patches_dir=patches_dir,
        cache_dir=cache_dir,
        description=description,
        force=force,
        source=f"git diff {rev_range} in {co}",
        origin=origin,
    )


def patch_from_diff_file(
    diff_file: str | os.PathLike, version: str, *, cache_dir: Path | None = None
) -> Path:
    """The patch folder made from a diff named directly in a config, for sglang ``version``:
    ``<cache_dir>/diff-patches/<file stem>-<sha256 of the file, 12>/`` (made once, reused while
    the file's contents are the same). Pass the folder to
    :func:`patchbench.overlay.build_overlay`, which applies and verifies it like any patch.

    Raises the PatchError family (see :func:`build_patch`) naming the file.
    """
    f = Path(diff_file)
    text = read_text_file(f, PatchError, "diff file")
    digest = _sha256_bytes(text.encode())
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f.stem).strip("-._") or "diff"
    name = f"{stem}-{digest[:12]}"
    pdir = Path(cache_dir or DEFAULT_CACHE_DIR) / "diff-patches"
    folder = pdir / name
    if (folder / "manifest.yaml").is_file():
        try:
            m = load_manifest(name, patches_dir=pdir)
            if version in m.releases:
                return folder
        except PatchError:
            pass
    res = build_patch(
        name,
        text,
        [version],
        patches_dir=pdir,
        cache_dir=cache_dir,
        force=True,
        source=str(f),
        origin={"kind": "diff", "source": str(f.resolve()), "sha256": digest},
    )
    if version not in res.applies:
        raise PatchError(res.fails.get(version, f"{f}: does not apply to sglang {version}"))
    return folder
