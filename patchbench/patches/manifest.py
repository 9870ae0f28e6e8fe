"""A patch's manifest, ``patches/<name>/manifest.yaml`` (:class:`PatchManifest`; the layout:
docs/patches.md); diff paths are relative to site-packages (``a/sglang/...``). Errors
(:class:`ManifestError`, :class:`UnsupportedRelease`, exit 2) name the patch, file, key and line.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from patchbench import inputs
from patchbench.errors import PatchError
from patchbench.inputs import FOLDER_NAME, line_of, read_yaml_mapping

#: default cache folder (git-ignored): wheels, derived diffs
DEFAULT_CACHE_DIR = inputs.CACHE_DIR
#: the file every patch of this project is about, and whose hash the overlay verifies in the server
FORWARD_BATCH_INFO = "sglang/srt/model_executor/forward_batch_info.py"

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ManifestError(PatchError):
    """A manifest (or a diff file it names) that is missing or invalid."""


class UnsupportedRelease(PatchError):
    """The manifest has no entry for the requested release; lists the supported ones."""


def sha256_hex(data: bytes) -> str:
    """sha256 of ``data`` as 64 lowercase hex digits."""
    return hashlib.sha256(data).hexdigest()


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

    diff: str | None = None  # relative to the patch folder
    files: dict[str, FileHashes]

    @field_validator("diff")
    @classmethod
    def _diff_inside(cls, v: str | None) -> str | None:
        # A manifest is data from someone else: its diff stays in its own folder (a symlink
        # pointing out is refused by load_manifest, which knows the folder).
        if v is not None and (not str(v).strip() or Path(v).is_absolute() or ".." in Path(v).parts):
            raise ValueError(
                "must name a file inside the patch folder, relative to it (no '..', not "
                "absolute), e.g. 0.5.1.post3.diff"
            )
        return v

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
    """A validated manifest (the module docstring shows its shape); ``folder``, not in the
    YAML, is the patch folder it was read from."""

    name: str
    description: str = ""
    upstream: Upstream | None = None
    derive: Derive | None = None
    releases: dict[str, ReleaseSpec]
    #: where the change came from (written by new-patch): kind diff|git, source, range, commits
    origin: dict[str, str] | None = None
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
    inside = m.folder.resolve()
    for ver, rel in m.releases.items():
        if rel.diff is None:
            continue
        target = (m.folder / rel.diff).resolve()
        if not target.is_relative_to(inside):
            line = line_of(text, ("releases", ver, "diff"))
            raise ManifestError(
                f"{path}{f':{line}' if line else ''}: key 'releases.{ver}.diff' is '{rel.diff}', a link that "
                f"points outside the patch folder (to {target}); keep the diff itself in "
                f"{m.folder}"
            )
        if not (m.folder / rel.diff).is_file():
            raise ManifestError(
                f"{path}: releases.{ver}.diff names '{rel.diff}', but "
                f"{m.folder / rel.diff} does not exist"
            )
    return m
