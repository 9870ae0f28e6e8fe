"""A change's state on one sglang release: it applies, the release already contains it, or it
conflicts at a named file and hunk; each with the next step (``check-patch`` prints it,
``new-patch`` says it per release, and a nightly job can record it per release).

The check runs ``git apply --check`` on a pristine copy of the files the change touches
(:func:`patchbench.patches.wheels.pristine_files`: an installed copy of the release, else its
wheel), forward and then in reverse: a change whose reverse applies is already in the release.
A change that is neither is split per file, and the first file that is neither is split per
hunk, so the message names the first hunk that really conflicts (hunks are 1-based, in diff
order).

Errors: nothing is raised for a change that does not apply (that is a state); a diff that cannot
be a patch at all raises :class:`patchbench.errors.PatchError` (:func:`inspect_diff`), and an
unknown patch or a manifest problem raises its :class:`~patchbench.patches.manifest.ManifestError`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from patchbench.errors import PatchError
from patchbench.patches.apply import diff_text, git_apply
from patchbench.patches.diffs import _split_blocks, inspect_diff, site_layout_diff
from patchbench.patches.manifest import load_manifest
from patchbench.patches.wheels import FetchError, pristine_files

State = Literal["applies", "contained", "conflicts", "unavailable"]


@dataclass
class PatchState:
    """The state of a change (``label``: ``patch 'NAME'`` or a diff's name) on sglang ``release``.

    state: ``applies``; ``contained`` (the reverse applies: the release has the change already);
    ``conflicts`` (``file`` and 1-based ``hunk`` name the first hunk that neither applies nor is
    already there; ``hunk`` None when the release lacks the file); ``unavailable`` (the
    release's files could not be had, e.g. offline: nothing was checked). ``detail``: what was
    found; ``next_step``: what to do about it (empty when nothing is needed).
    """

    label: str
    release: str
    state: State
    file: str | None = None
    hunk: int | None = None
    detail: str = ""
    next_step: str = ""

    @property
    def summary(self) -> str:
        """``applies``, ``already contained in 0.5.23``, ``conflicts at FILE hunk 2``."""
        if self.state == "contained":
            return f"already contained in {self.release}"
        if self.state == "conflicts":
            where = f" hunk {self.hunk}" if self.hunk else ""
            return f"conflicts at {self.file}{where}" if self.file else "conflicts"
        if self.state == "unavailable":
            return "not checked"
        return "applies"

    def lines(self) -> list[str]:
        """The summary, the detail and the next step, one per line (empty parts left out)."""
        out = [f"{self.label} on sglang {self.release}: {self.summary}"]
        if self.detail:
            out.append(f"  {self.detail}")
        if self.next_step:
            out.append(f"  next: {self.next_step}")
        return out

    def to_json(self) -> dict:
        """JSON-ready dict (every field)."""
        return {
            "label": self.label,
            "release": self.release,
            "state": self.state,
            "file": self.file,
            "hunk": self.hunk,
            "detail": self.detail,
            "next_step": self.next_step,
        }


def _check(root: Path, tmp: Path, text: str, *, reverse: bool) -> bool:
    f = tmp / ("rev.diff" if reverse else "fwd.diff")
    f.write_text(text, encoding="utf-8")
    return git_apply(root, f, check=True, reverse=reverse).returncode == 0


def _hunk_diffs(block: list[str]) -> list[str]:
    """One diff per hunk of a file's block (its header lines, then that hunk)."""
    first = next((i for i, ln in enumerate(block) if ln.startswith("@@")), len(block))
    header, rest = block[:first], block[first:]
    hunks: list[list[str]] = []
    for ln in rest:
        if ln.startswith("@@"):
            hunks.append([ln])
        elif hunks:
            hunks[-1].append(ln)
    return ["\n".join(header + h) + "\n" for h in hunks]


def _next_step(state: State, release: str, file: str | None, name: str | None) -> str:
    what = name or "my-change"
    if state == "contained":
        return (
            f"sglang {release} already has this change: there is nothing to patch there. To "
            f"measure it, compare releases instead (a variant with `sglang: {release}` against "
            "the older release's baseline), or run your branch as a build: `patchbench ab "
            "--git CHECKOUT --range main...my-branch`"
        )
    if state == "conflicts":
        return (
            f"port it to {release}: in your checkout `git checkout -b {what}-{release} "
            f"v{release} && git cherry-pick <your commits>`, resolve {file or 'the conflict'}, "
            f"then `patchbench new-patch {what}-{release} --from-git CHECKOUT "
            f"v{release}...{what}-{release} --sglang {release}`; or run the branch itself as a "
            "build: `patchbench ab --git CHECKOUT --range main...my-branch` (docs/patches.md)"
        )
    if state == "unavailable":
        return f"check it where sglang {release} is installed or its wheel can be downloaded"
    return ""


def diff_state(
    label: str,
    text: str,
    release: str,
    *,
    cache_dir: Path | None = None,
    name: str | None = None,
) -> PatchState:
    """The state of the unified diff ``text`` (``python/sglang/...`` or ``sglang/...`` paths) on
    a pristine copy of sglang ``release``; ``name`` (the patch's name) goes into the next step.

    Raises :class:`PatchError` when ``text`` cannot be a patch at all (:func:`inspect_diff`).
    """
    changes = inspect_diff(text, source=label)
    site = site_layout_diff(text, changes)
    paths = [c.path for c in changes]
    with tempfile.TemporaryDirectory(prefix="patchbench-state-") as tmp_s:
        tmp = Path(tmp_s)
        root = tmp / "tree"
        for p in paths:
            try:
                pristine_files(release, [p], root, cache_dir=cache_dir)
            except FetchError as e:
                return PatchState(
                    label, release, "unavailable", None, None, str(e).splitlines()[0],
                    _next_step("unavailable", release, None, name),
                )  # fmt: skip
            except PatchError:
                return PatchState(
                    label, release, "conflicts", p, None,
                    f"sglang {release} has no file {p}",
                    _next_step("conflicts", release, p, name),
                )  # fmt: skip
        if _check(root, tmp, site, reverse=False):
            return PatchState(label, release, "applies")
        if _check(root, tmp, site, reverse=True):
            return PatchState(
                label, release, "contained", detail="the change's reverse applies",
                next_step=_next_step("contained", release, None, name),
            )  # fmt: skip
        return _conflict(label, release, site, paths, root, tmp, name)


def _conflict(
    label: str,
    release: str,
    site: str,
    paths: list[str],
    root: Path,
    tmp: Path,
    name: str | None,
) -> PatchState:
    """Per file, then per hunk of the first file that neither applies nor is contained."""
    per_file: dict[str, str] = {}
    for path, block in zip(paths, _split_blocks(site), strict=True):
        text = "\n".join(block) + "\n"
        if _check(root, tmp, text, reverse=False):
            per_file[path] = "applies"
            continue
        if _check(root, tmp, text, reverse=True):
            per_file[path] = "already contained"
            continue
        for i, h in enumerate(_hunk_diffs(block), start=1):
            if not _check(root, tmp, h, reverse=False) and not _check(root, tmp, h, reverse=True):
                others = [f"{p} {s}" for p, s in per_file.items()]
                detail = f"hunk {i} of {path} matches neither the release's code nor the change"
                if others:
                    detail += "; " + ", ".join(others)
                return PatchState(
                    label, release, "conflicts", path, i, detail,
                    _next_step("conflicts", release, path, name),
                )  # fmt: skip
        per_file[path] = "conflicts as a whole (each hunk alone applies or is contained)"
    bad = next((p for p, s in per_file.items() if s != "applies"), paths[0])
    return PatchState(
        label, release, "conflicts", bad, None,
        "partly contained: " + ", ".join(f"{p} {s}" for p, s in per_file.items()),
        _next_step("conflicts", release, bad, name),
    )  # fmt: skip


def patch_state(
    name: str,
    release: str,
    *,
    cache_dir: Path | None = None,
    patches_dir: Path | None = None,
) -> PatchState:
    """The state of patch ``name`` (a folder of ``patches/``) on sglang ``release``: its diff for
    that release when the manifest has one, else the diff of its first release (derived patches:
    the derived diff). A release listed in the manifest that applies is ``applies``; one that is
    not listed and applies says so in ``next_step`` (add it with new-patch).

    Raises :class:`~patchbench.patches.manifest.ManifestError` for an unknown patch or a bad
    manifest; a wheel that cannot be fetched for a derived diff gives ``unavailable``.
    """
    m = load_manifest(name, patches_dir=patches_dir)
    base = release if release in m.releases else next(iter(m.releases))
    try:
        text = diff_text(name, base, cache_dir=cache_dir, patches_dir=patches_dir)
    except FetchError as e:
        return PatchState(
            f"patch '{name}'", release, "unavailable", detail=str(e).splitlines()[0],
            next_step=_next_step("unavailable", release, None, name),
        )  # fmt: skip
    st = diff_state(f"patch '{name}'", text, release, cache_dir=cache_dir, name=name)
    if release not in m.releases:
        note = f"the manifest has no diff for {release} (it supports {', '.join(m.releases)})"
        st.detail = f"{note}; checked with its {base} diff" + (
            f"; {st.detail}" if st.detail else ""
        )
        if st.state == "applies" and m.derive is not None:
            st.next_step = (
                f"add releases.{release} (the touched files' sha256 before and after) to "
                f"{m.folder / 'manifest.yaml'}"
            )
        elif st.state == "applies":
            st.next_step = (
                f"add {release} to the patch: `patchbench new-patch {name} --from-diff "
                f"{m.folder / str(m.releases[base].diff)} --sglang "
                f"{' '.join([*m.releases, release])} --force`"
            )
    return st


def patch_states(
    name: str,
    releases: Collection[str],
    *,
    cache_dir: Path | None = None,
    patches_dir: Path | None = None,
) -> dict[str, PatchState]:
    """{release: :func:`patch_state`} for each of ``releases`` (what a nightly job records)."""
    return {r: patch_state(name, r, cache_dir=cache_dir, patches_dir=patches_dir) for r in releases}
