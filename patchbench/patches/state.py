"""A change's state on one sglang release (applies, contained, conflicts at a file and hunk) with
the next step, from ``git apply --check`` on pristine files, forward then in reverse; a diff that
cannot be a patch raises PatchError."""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from patchbench.patches.apply import diff_text, git_apply
from patchbench.patches.diffs import hunks, inspect_diff, site_layout_diff, split_blocks
from patchbench.patches.manifest import load_manifest
from patchbench.patches.wheels import FetchError, MissingFile, pristine_files

State = Literal["applies", "contained", "conflicts", "unavailable"]


@dataclass
class PatchState:
    """The state of a change (``label``: ``patch 'NAME'`` or a diff's name) on sglang ``release``:
    ``applies``; ``contained`` (its reverse applies); ``conflicts`` (``file`` and 1-based ``hunk``
    name the first hunk that neither applies nor is there already; ``hunk`` None when the release
    lacks the file); ``unavailable`` (the release's files could not be had: nothing checked).
    ``detail``: what was found; ``next_step``: what to do (empty when nothing is needed)."""

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
        return "not checked" if self.state == "unavailable" else "applies"

    def lines(self) -> list[str]:
        """The summary, the detail and the next step, one per line (empty parts left out)."""
        out = [f"{self.label} on sglang {self.release}: {self.summary}"]
        if self.detail:
            out.append(f"  {self.detail}")
        if self.next_step:
            out.append(f"  next: {self.next_step}")
        return out

    def to_json(self) -> dict:
        """Every field, JSON-ready."""
        return asdict(self)


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


def _state(label, release, state: State, file=None, hunk=None, detail="", name=None) -> PatchState:
    return PatchState(
        label, release, state, file, hunk, detail, _next_step(state, release, file, name)
    )


def diff_state(
    label: str, text: str, release: str, *, cache_dir: Path | None = None, name: str | None = None
) -> PatchState:
    """The state of the unified diff ``text`` (``python/sglang/...`` or ``sglang/...`` paths) on
    a pristine copy of sglang ``release``; ``name`` (the patch's) goes into the next step.
    Raises :class:`PatchError` when ``text`` cannot be a patch at all."""
    changes = inspect_diff(text, source=label)
    site = site_layout_diff(text, changes)
    paths = [c.path for c in changes]
    with tempfile.TemporaryDirectory(prefix="patchbench-state-") as tmp:
        root = Path(tmp)
        try:
            pristine_files(release, paths, root, cache_dir=cache_dir)
        except FetchError as e:
            return _state(label, release, "unavailable", detail=str(e).splitlines()[0], name=name)
        except MissingFile as e:
            detail = f"sglang {release} has no file {e.path}"
            return _state(label, release, "conflicts", e.path, detail=detail, name=name)

        def applies(diff: str, reverse: bool = False) -> bool:
            return git_apply(root, diff, check=True, reverse=reverse).returncode == 0

        if applies(site):
            return PatchState(label, release, "applies")
        if applies(site, reverse=True):
            detail = "the change's reverse applies"
            return _state(label, release, "contained", detail=detail, name=name)
        per_file: dict[str, str] = {}
        for path, block in zip(paths, split_blocks(site), strict=True):
            text = "\n".join(block) + "\n"
            if applies(text):
                per_file[path] = "applies"
                continue
            if applies(text, reverse=True):
                per_file[path] = "already contained"
                continue
            header, hs = hunks(block)
            for i, h in enumerate(hs, start=1):
                one = "\n".join(header + h) + "\n"
                if not applies(one) and not applies(one, reverse=True):
                    detail = f"hunk {i} of {path} matches neither the release's code nor the change"
                    if per_file:
                        detail += "; " + ", ".join(f"{p} {s}" for p, s in per_file.items())
                    return _state(label, release, "conflicts", path, i, detail, name)
            per_file[path] = "conflicts as a whole (each hunk alone applies or is contained)"
    bad = next((p for p, s in per_file.items() if s != "applies"), paths[0])
    detail = "partly contained: " + ", ".join(f"{p} {s}" for p, s in per_file.items())
    return _state(label, release, "conflicts", bad, None, detail, name)


def patch_state(
    name: str, release: str, *, cache_dir: Path | None = None, patches_dir: Path | None = None
) -> PatchState:
    """The state of patch ``name`` on sglang ``release``: its diff for that release, else its
    first release's diff (then ``next_step`` says how to add the release when it applies).
    Raises the manifest's errors; a wheel that cannot be fetched gives ``unavailable``."""
    m = load_manifest(name, patches_dir=patches_dir)
    base = release if release in m.releases else next(iter(m.releases))
    label = f"patch '{name}'"
    try:
        text = diff_text(name, base, cache_dir=cache_dir, patches_dir=patches_dir)
    except FetchError as e:
        return _state(label, release, "unavailable", detail=str(e).splitlines()[0], name=name)
    st = diff_state(label, text, release, cache_dir=cache_dir, name=name)
    if release in m.releases:
        return st
    note = f"the manifest has no diff for {release} (it supports {', '.join(m.releases)})"
    st.detail = f"{note}; checked with its {base} diff" + (f"; {st.detail}" if st.detail else "")
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
