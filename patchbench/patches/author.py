"""Authoring patches: ``patchbench new-patch`` (from a diff file or a git range) and the patch
folder made from a diff a config names. Errors: PatchError naming the patch, the release and the
failing file or hunk; FetchError (exit 3)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import yaml
from packaging.version import InvalidVersion, Version

from patchbench import inputs
from patchbench.errors import PatchError
from patchbench.inputs import FOLDER_NAME, read_text_file
from patchbench.patches.apply import apply_text, compile_check
from patchbench.patches.diffs import (
    REPO_PACKAGE_PREFIX,
    inspect_diff,
    site_layout_diff,
    unified_diff,
)
from patchbench.patches.manifest import DEFAULT_CACHE_DIR, load_manifest, sha256_hex
from patchbench.patches.state import PatchState, diff_state
from patchbench.patches.wheels import FetchError, MissingFile, pristine_files


@dataclass
class NewPatch:
    """What :func:`build_patch` made: ``applies`` {version: {path: {"before", "after"}}} (sha256),
    ``fails`` {version: why it does not apply (file, hunk)}, ``states`` {version:
    :class:`~patchbench.patches.state.PatchState`} of those, ``config`` the cpu.yaml beside it
    (:func:`write_preset_config`)."""

    name: str
    folder: Path
    applies: dict[str, dict[str, dict[str, str]]]
    fails: dict[str, str]
    states: dict[str, PatchState]
    config: Path

    def summary(self) -> str:
        """One line per release (and the next step where it does not apply), then the config."""
        lines = [f"patch '{self.name}' written to {self.folder}"]
        for v, files in self.applies.items():
            lines.append(f"  sglang {v}: applies ({len(files)} file(s): {', '.join(files)})")
        for v, why in self.fails.items():
            st = self.states[v]
            if st.state == "contained":
                lines.append(f"  sglang {v}: {st.summary} (the change's reverse applies)")
            else:
                indented = why.replace("\n", "\n    ")
                lines.append(f"  sglang {v}: does NOT apply ({st.summary})\n    {indented}")
            if st.next_step:
                lines.append(f"    next: {st.next_step}")
        lines.append(
            f"config {self.config} (stock vs this patch on the CPU, from the generic preset); "
            f"run: patchbench bench {self.config}"
        )
        return "\n".join(lines)


def _apply_to_release(
    label: str, site_diff: str, paths: list[str], version: str, cache_dir: Path | None
) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """({path: pristine bytes}, {path: patched bytes}) of ``site_diff`` on sglang ``version``.
    Raises PatchError naming the file the release lacks, the failing hunk or a patched file that
    does not compile; FetchError when the release's wheel cannot be fetched."""
    with tempfile.TemporaryDirectory(prefix="patchbench-newpatch-") as tmp:
        root = Path(tmp)
        try:
            pristine_files(version, paths, root, cache_dir=cache_dir)
        except MissingFile as e:
            raise PatchError(
                f"{label} (sglang {version}): the release has no file {e.path} (the diff changes "
                "it); a patch may only change files the release has"
            ) from None
        before = {p: (root / p).read_bytes() for p in paths}
        apply_text(root, site_diff, label, version)
        compile_check(root, paths, label, version)
        return before, {p: (root / p).read_bytes() for p in paths}


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
    """Make ``<patches_dir>/<name>/`` from a diff ``text`` for the releases of ``versions`` it
    applies to (docs/patches.md). Raises :class:`PatchError` for a bad name or release, an existing
    folder (unless ``force``), a diff that cannot be a patch or applies to none of ``versions``
    (each release's failing hunk and state); FetchError (exit 3)."""
    if not FOLDER_NAME.match(name or ""):
        raise PatchError(
            f"patch name '{name}': use letters, digits, '.', '_' and '-' (it names the folder in "
            "patches/)"
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
    paths = [c.path for c in changes]
    applies: dict[str, dict[str, dict[str, str]]] = {}
    diffs: dict[str, str] = {}
    fails: dict[str, str] = {}
    for v in versions:
        try:
            before, after = _apply_to_release(label, site_diff, paths, v, cache_dir)
        except FetchError:
            raise
        except PatchError as e:
            fails[v] = str(e)
            continue
        applies[v] = {
            p: {"before": sha256_hex(before[p]), "after": sha256_hex(after[p])} for p in paths
        }
        diffs[v] = "".join(unified_diff(p, before[p], after[p]) for p in paths)
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
    manifest = {
        "name": name,
        "description": description or f"made by new-patch from {source or 'a diff'}",
        **({"origin": dict(origin)} if origin else {}),
        "releases": {v: {"diff": f"{v}.diff", "files": applies[v]} for v in applies},
    }
    _write_patch_folder(pdir, name, manifest, diffs)
    load_manifest(name, patches_dir=pdir)  # what was written validates
    config = write_preset_config(dest, name, next(iter(applies)))
    return NewPatch(name, dest, applies, fails, states, config)


#: the preset new-patch writes a ready config from (configs/presets/cpu-demo.yaml)
PRESET = inputs.REPO_ROOT / "configs" / "presets" / "cpu-demo.yaml"


def write_preset_config(folder: Path, name: str, release: str, preset: Path = PRESET) -> Path:
    """Write and return ``<folder>/cpu.yaml``: ``preset`` comparing stock sglang ``release``
    (variant ``baseline``) with patch ``name`` (variant ``NAME``), named ``NAME-cpu``."""
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


def _write_patch_folder(pdir: Path, name: str, manifest: dict, diffs: dict[str, str]) -> None:
    """Write ``pdir/name`` (manifest.yaml, ``<version>.diff``) in a temporary folder, then
    rename it into place (replacing an existing one)."""
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
    name: str, diff_file: str | os.PathLike, versions: Collection[str], **opts
) -> NewPatch:
    """``new-patch NAME --from-diff FILE --sglang V ...``: :func:`build_patch` of the file
    (``opts``: its keyword arguments); PatchError when the file is missing or not UTF-8."""
    f = Path(diff_file)
    text = read_text_file(f, PatchError, "diff file")
    origin = {"kind": "diff", "source": str(f.resolve()), "sha256": sha256_hex(text.encode())}
    return build_patch(name, text, versions, source=str(f), origin=origin, **opts)


def _git(*args: str) -> subprocess.CompletedProcess:
    """``git ARGS`` (text output), ignoring GIT_DIR and GIT_WORK_TREE of the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE")}
    cmd = ["git", "-c", "core.quotepath=off", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def git_dir_of(checkout: str | os.PathLike) -> Path:
    """The git directory of ``checkout`` (a work tree's, a linked worktree's own, or the bare
    repository itself); PatchError when the folder does not exist or is neither."""
    co = Path(checkout).expanduser()
    if not co.is_dir():
        raise PatchError(f"{co}: no such folder (give the sglang checkout holding python/sglang)")
    r = _git("-C", str(co), "rev-parse", "--absolute-git-dir")
    if r.returncode != 0 or not r.stdout.strip():
        raise PatchError(f"{co}: not a git checkout or bare repository ({r.stderr.strip()[:200]})")
    return Path(r.stdout.strip())


#: ``git diff`` options of a range: no colour, no external or text-conversion drivers, renames
#: found (so a rename is refused as one), git's ``a/``/``b/`` prefixes
_GIT_DIFF = "diff --no-color --no-ext-diff --no-textconv -M --src-prefix=a/ --dst-prefix=b/".split()


def new_patch_from_git(
    name: str, checkout: str | os.PathLike, rev_range: str, versions: Collection[str], **opts
) -> NewPatch:
    """``new-patch NAME --from-git CHECKOUT REV_RANGE --sglang V ...`` (docs/patches.md):
    :func:`build_patch` of the range's diff (``opts``: its keyword arguments). Raises PatchError
    when ``checkout`` is not a git repository, the range is unknown, changes nothing or changes
    files outside ``python/sglang/`` (named, with the command that diffs the package alone)."""
    co = Path(checkout)
    gd = f"--git-dir={git_dir_of(co)}"
    if rev_range.startswith("-"):
        raise PatchError(f"'{rev_range}' is not a revision range (e.g. main...my-branch)")
    revs = [rev_range] if ".." in rev_range else [f"{rev_range}^!"]
    names = _git(gd, *_GIT_DIFF, *revs, "--name-only", "--")
    if names.returncode != 0:
        raise PatchError(f"{co}: git cannot diff '{rev_range}': {names.stderr.strip()[:300]}")
    files = [ln for ln in names.stdout.splitlines() if ln.strip()]
    if not files:
        raise PatchError(f"{co}: '{rev_range}' changes no file")
    outside = [f for f in files if not f.startswith(REPO_PACKAGE_PREFIX)]
    if outside:
        more = f" and {len(outside) - 8} more" if len(outside) > 8 else ""
        raise PatchError(
            f"{co}: '{rev_range}' changes files outside python/sglang/ "
            f"({', '.join(outside[:8])}{more}); a patch may only change the installed package. "
            "Write a diff of the package alone and use --from-diff:\n"
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
        "commits": " ".join(c.lstrip("^") for c in commits.stdout.split())
        if commits.returncode == 0
        else "",
    }
    source = f"git diff {rev_range} in {co}"
    return build_patch(name, d.stdout, versions, source=source, origin=origin, **opts)


def patch_from_diff_file(
    diff_file: str | os.PathLike, version: str, *, cache_dir: Path | None = None
) -> Path:
    """The patch folder made from a diff named directly in a config, for sglang ``version``:
    ``<cache_dir>/diff-patches/<file stem>-<sha256 of the file, 12>/``, made once per content
    (:func:`build_patch`'s errors), for :func:`patchbench.patches.overlay.build_overlay`."""
    f = Path(diff_file)
    digest = sha256_hex(read_text_file(f, PatchError, "diff file").encode())
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f.stem).strip("-._") or "diff"
    name, pdir = f"{stem}-{digest[:12]}", Path(cache_dir or DEFAULT_CACHE_DIR) / "diff-patches"
    try:
        if version in load_manifest(name, patches_dir=pdir).releases:
            return pdir / name
    except PatchError:  # not made yet (or broken): made again
        pass
    new_patch_from_diff(name, f, [version], patches_dir=pdir, cache_dir=cache_dir, force=True)
    return pdir / name
