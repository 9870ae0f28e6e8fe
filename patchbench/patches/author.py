"""Authoring patches: ``patchbench new-patch`` (a patch folder from a diff file or a git range, with the
hashes of every release it applies to) and the patch folder made from a diff a config names
directly.

Every new patch is checked (:func:`patchbench.patches.diffs.inspect_diff`) and applied to a
pristine copy of each release asked for; the manifest records the releases it applies to. Errors:
:class:`patchbench.errors.PatchError` naming the patch, the release and the failing file or hunk;
:class:`~patchbench.patches.wheels.FetchError` (exit 3) when a release's wheel cannot be fetched.
"""

from __future__ import annotations

import os
import py_compile
import re
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from patchbench import inputs
from patchbench.errors import PatchError
from patchbench.inputs import FOLDER_NAME, read_text_file
from patchbench.patches.apply import git_apply
from patchbench.patches.diffs import (
    REPO_PACKAGE_PREFIX,
    FileChange,
    hunk_failures,
    inspect_diff,
    site_layout_diff,
    unified_diff,
)
from patchbench.patches.manifest import DEFAULT_CACHE_DIR, load_manifest, sha256_hex
from patchbench.patches.state import PatchState, diff_state
from patchbench.patches.wheels import FetchError, pristine_files


@dataclass
class NewPatch:
    """What :func:`build_patch` made: the patch folder, the releases it applies to with each file's
    sha256 before and after ({version: {path: {"before", "after"}}}), the releases it does not
    apply to with the reason ({version: message naming the file and the failing hunk}) and their
    state ({version: :class:`~patchbench.patches.state.PatchState`}: already contained in the
    release, or conflicts at a file and hunk, each with its next step), and the config written
    beside the patch (:func:`write_preset_config`)."""

    name: str
    folder: Path
    applies: dict[str, dict[str, dict[str, str]]]
    fails: dict[str, str]
    states: dict[str, PatchState] = field(default_factory=dict)
    config: Path | None = None

    def summary(self) -> str:
        """Human-readable lines: one per release (and the next step where it does not apply),
        then the config written beside the patch."""
        lines = [f"patch '{self.name}' written to {self.folder}"]
        for v, files in self.applies.items():
            lines.append(f"  sglang {v}: applies ({len(files)} file(s): {', '.join(files)})")
        for v, why in self.fails.items():
            st = self.states.get(v)
            if st is not None and st.state == "contained":
                lines.append(f"  sglang {v}: {st.summary} (the change's reverse applies)")
            else:
                head = f"does NOT apply ({st.summary})" if st is not None else "does NOT apply"
                lines.append(f"  sglang {v}: {head}\n    " + why.replace("\n", "\n    "))
            if st is not None and st.next_step:
                lines.append(f"    next: {st.next_step}")
        if self.config is not None:
            lines.append(
                f"config {self.config} (stock vs this patch on the CPU, from the generic "
                f"preset); run: patchbench bench {self.config}"
            )
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
        r = git_apply(root, diff_file, check=True)
        if r.returncode == 0:
            r = git_apply(root, diff_file, check=False)
        if r.returncode != 0:
            raise PatchError(
                "\n".join(hunk_failures(label, version, site_diff, r.stdout + r.stderr, root))
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
    versions = _checked_versions(name, versions)
    pdir = Path(patches_dir or inputs.PATCHES_DIR)
    dest = pdir / name
    if dest.exists() and not force:
        raise PatchError(f"{dest} already exists; choose another name or remove it first")
    label = f"patch '{name}'"
    changes = inspect_diff(text, source=source or label)
    site_diff = site_layout_diff(text, changes)
    applies, diffs, fails = _per_release(label, site_diff, changes, versions, cache_dir)
    states = {v: diff_state(label, site_diff, v, cache_dir=cache_dir, name=name) for v in fails}
    if not applies:
        raise PatchError(
            f"{label} applies to none of sglang {', '.join(versions)}:\n"
            + "\n".join(
                f"{why}\n  ({states[v].summary}) next: {states[v].next_step}"
                if states[v].next_step
                else why
                for v, why in fails.items()
            )
        )
    manifest: dict[str, Any] = {
        "name": name,
        "description": description or f"made by new-patch from {source or 'a diff'}",
        **({"origin": dict(origin)} if origin else {}),
        "releases": {v: {"diff": f"{v}.diff", "files": applies[v]} for v in applies},
    }
    _write_patch_folder(pdir, name, manifest, diffs)
    load_manifest(name, patches_dir=pdir)  # what was written validates
    config = write_preset_config(dest, name, next(iter(applies)))
    return NewPatch(
        name=name, folder=dest, applies=applies, fails=fails, states=states, config=config
    )


#: the preset new-patch writes a ready config from (configs/presets/cpu-demo.yaml)
PRESET = inputs.REPO_ROOT / "configs" / "presets" / "cpu-demo.yaml"


def write_preset_config(folder: Path, name: str, release: str, preset: Path = PRESET) -> Path:
    """Write ``<folder>/cpu.yaml``: the generic CPU preset (``preset``) comparing stock sglang
    ``release`` with patch ``name`` (variants ``baseline: []`` and ``NAME: [NAME]``), named
    ``NAME-cpu``. Returns its path; run it with ``patchbench bench <path>``."""
    cfg = yaml.safe_load(preset.read_text(encoding="utf-8"))
    cfg.update(
        name=f"{name}-cpu",
        description=f"stock vs patch {name}, sglang {release} on the CPU, tiny model, text-only",
        sglang=release,
        variants={"baseline": [], name: [name]},
        baseline="baseline",
    )
    head = (
        f"# made by patchbench new-patch from {preset.relative_to(inputs.REPO_ROOT)} (its "
        f"comments explain each key); run: patchbench bench {folder / 'cpu.yaml'}\n"
    )
    out = folder / "cpu.yaml"
    out.write_text(head + yaml.safe_dump(cfg, sort_keys=False, width=100), encoding="utf-8")
    return out


def _per_release(
    label: str,
    site_diff: str,
    changes: list[FileChange],
    versions: list[str],
    cache_dir: Path | None,
) -> tuple[dict[str, dict[str, dict[str, str]]], dict[str, str], dict[str, str]]:
    """For each release: ({version: {path: {"before", "after"}}} it applies to, {version: the
    diff regenerated for it}, {version: why it does not apply}). FetchError propagates."""
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
            p: {"before": sha256_hex(before[p]), "after": sha256_hex(after[p])} for p in before
        }
        diffs[v] = "".join(unified_diff(p, before[p], after[p]) for p in before)
    return applies, diffs, fails


def _checked_versions(name: str, versions: Collection[str]) -> list[str]:
    """``versions`` without repeats; PatchError for a bad patch name, no release, or a release
    that is not a version."""
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
    return versions


def _write_patch_folder(pdir: Path, name: str, manifest: dict, diffs: dict[str, str]) -> None:
    """Write ``pdir/name`` (manifest.yaml and ``<version>.diff`` files) in a temporary folder
    next to it, then rename it into place (replacing an existing one)."""
    dest = pdir / name
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
        origin={"kind": "diff", "source": str(f.resolve()), "sha256": sha256_hex(text.encode())},
    )


def _git(git_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``git --git-dir=GIT_DIR ARGS`` (text output): commits and trees only, never a work tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    return subprocess.run(
        ["git", f"--git-dir={git_dir}", "-c", "core.quotepath=off", *args],
        capture_output=True,
        text=True,
        env=env,
    )


def git_dir_of(checkout: str | os.PathLike) -> Path:
    """The git directory of ``checkout``: a work tree's ``.git`` (a linked worktree's own git
    directory), or ``checkout`` itself when it is a bare repository.

    Raises PatchError when the folder does not exist or is neither.
    """
    co = Path(checkout).expanduser()
    if not co.is_dir():
        raise PatchError(f"{co}: no such folder (give the sglang checkout holding python/sglang)")
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    r = subprocess.run(
        ["git", "-C", str(co), "rev-parse", "--absolute-git-dir"],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode != 0 or not r.stdout.strip():
        raise PatchError(f"{co}: not a git checkout or bare repository ({r.stderr.strip()[:200]})")
    return Path(r.stdout.strip())


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

    ``checkout`` is a work tree or a bare repository (only its commits are read, through
    ``git --git-dir``). ``rev_range`` is what ``git diff`` takes: ``main...my-branch`` (the
    branch's own commits since it left main), ``A..B``, or one commit (that commit's own change).
    Every changed file must be under ``python/sglang/``; see :func:`build_patch` for the rest.

    Raises PatchError when ``checkout`` is not a git repository, the range is unknown, the range
    changes nothing or changes files outside ``python/sglang/`` (named, with the command that
    writes a diff of the package only).
    """
    co = Path(checkout)
    text, origin = _git_range_diff(co, rev_range)
    return build_patch(
        name,
        text,
        versions,
        patches_dir=patches_dir,
        cache_dir=cache_dir,
        description=description,
        force=force,
        source=f"git diff {rev_range} in {co}",
        origin=origin,
    )


#: ``git diff`` options of a range: no colour, no external or text-conversion drivers, renames
#: found (so a rename is refused as one), git's ``a/``/``b/`` prefixes
_GIT_DIFF = (
    "diff",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "-M",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


def _commit_range(rev_range: str) -> list[str]:
    """The revisions ``git diff`` gets for ``rev_range``: ``A...B`` and ``A..B`` as they are; one
    revision R as ``R^!`` (that commit's own change: a work tree is never compared)."""
    return [rev_range] if ".." in rev_range else [f"{rev_range}^!"]


def _git_range_diff(co: Path, rev_range: str) -> tuple[str, dict[str, str]]:
    """(the diff of ``rev_range`` in checkout ``co`` (bare or not), its origin for the manifest:
    kind, source, range, commits). Raises PatchError when ``co`` is not a git repository, the
    range is unknown or changes nothing, or it changes files outside ``python/sglang/``."""
    gd = git_dir_of(co)
    if rev_range.startswith("-"):
        raise PatchError(f"'{rev_range}' is not a revision range (e.g. main...my-branch)")
    revs = _commit_range(rev_range)
    names = _git(gd, *_GIT_DIFF, *revs, "--name-only", "--")
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
    d = _git(gd, *_GIT_DIFF, *revs, "--")
    if d.returncode != 0:
        raise PatchError(f"{co}: git diff '{rev_range}' failed: {d.stderr.strip()[:300]}")
    commits = _git(gd, "rev-parse", *revs)
    origin = {
        "kind": "git",
        "source": str(co.expanduser().resolve()),
        "range": rev_range,
        "commits": " ".join(ln.lstrip("^") for ln in commits.stdout.split())
        if commits.returncode == 0
        else "",
    }
    return d.stdout, origin


def patch_from_diff_file(
    diff_file: str | os.PathLike, version: str, *, cache_dir: Path | None = None
) -> Path:
    """The patch folder made from a diff named directly in a config, for sglang ``version``:
    ``<cache_dir>/diff-patches/<file stem>-<sha256 of the file, 12>/`` (made once, reused while
    the file's contents are the same). Pass the folder to
    :func:`patchbench.patches.overlay.build_overlay`, which applies and verifies it like any patch.

    Raises the PatchError family (see :func:`build_patch`) naming the file.
    """
    f = Path(diff_file)
    text = read_text_file(f, PatchError, "diff file")
    digest = sha256_hex(text.encode())
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
