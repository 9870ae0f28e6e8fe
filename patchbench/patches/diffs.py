"""Unified diffs as text: checking a diff a user gives (:func:`inspect_diff`), rewriting its paths
to the site-packages layout, making one from two versions of a file, and naming failed hunks.
Errors: PatchError naming the diff's source and every problem."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from patchbench.errors import PatchError

#: a ``git diff`` in an sglang checkout names files ``python/sglang/...``; site-packages ``sglang/...``
REPO_PACKAGE_PREFIX = "python/sglang/"

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$")

#: what a header line of a diff block says that a patch may not do (line prefix -> reason)
_REFUSED_HEADERS = (
    (("new file mode",), "creates a new file (a patch may only change existing files)"),
    (("deleted file mode",), "deletes the file (a patch may only change existing files)"),
    (("rename from", "rename to", "similarity index"), "renames the file"),
    (("copy from", "copy to"), "copies the file"),
    (("old mode", "new mode"), "changes the file mode (the overlay keeps the release's modes)"),
    (("Binary files", "GIT binary patch"), "is a binary change"),
)
_MODE_LINES = ("index ", "new file mode", "deleted file mode", "old mode", "new mode")


def unified_diff(rel: str, old: bytes, new: bytes) -> str:
    """A ``git apply``-compatible unified diff (3 lines of context) of one file, paths ``a/rel``,
    ``b/rel``; empty when the contents are equal. Handles a missing final newline."""
    a = old.decode("utf-8").splitlines(keepends=True)
    b = new.decode("utf-8").splitlines(keepends=True)
    out = [
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in difflib.unified_diff(a, b, fromfile=f"a/{rel}", tofile=f"b/{rel}")
    ]
    return f"diff --git a/{rel} b/{rel}\n" + "".join(out) if out else ""


def split_blocks(text: str) -> list[list[str]]:
    """The lines of each file's block of a diff (git's ``diff --git`` blocks, else ``---``/``+++``
    pairs)."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith("diff --git ")] or [
        i
        for i in range(len(lines) - 1)
        if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")
    ]
    return [lines[a:b] for a, b in zip(starts, starts[1:] + [len(lines)], strict=False)]


def hunks(block: list[str]) -> tuple[list[str], list[list[str]]]:
    """(the header lines of a file's block, its hunks: each a list of lines starting with its
    ``@@`` line)."""
    first = next((i for i, ln in enumerate(block) if ln.startswith("@@")), len(block))
    out: list[list[str]] = []
    for ln in block[first:]:
        if ln.startswith("@@"):
            out.append([ln])
        else:
            out[-1].append(ln)
    return block[:first], out


@dataclass
class FileChange:
    """One file of a diff: ``path`` relative to site-packages (``sglang/...``); ``raw_old`` /
    ``raw_new`` the paths as the diff wrote them (without ``a/``/``b/``); ``hunks`` its count."""

    path: str
    raw_old: str
    raw_new: str
    hunks: int = 0


def map_to_site_path(raw: str) -> str:
    """A path from a diff -> the path relative to site-packages: ``python/sglang/srt/x.py`` (an
    sglang checkout) -> ``sglang/srt/x.py``; ``sglang/...`` stays. ValueError for an absolute
    path, a ``..``, ``.`` or empty part, a quoted or backslashed path, or one outside ``sglang``."""
    p = raw.strip()
    if p.startswith('"') or "\\" in p:
        raise ValueError(f"'{p}': quoted or escaped paths are not supported")
    if p.startswith("/"):
        raise ValueError(
            f"'{p}': an absolute path; a patch may only change files of the sglang package"
        )
    if {"..", ".", ""} & set(p.split("/")):
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


def _inspect_block(block: list[str]) -> tuple[FileChange | None, str, list[str]]:
    """(the file change, the name shown for it, reasons to refuse) of one file's block, read
    from its header lines (``diff --git``, ``---``/``+++``, mode, rename, binary lines)."""
    header, hs = hunks(block)
    m = _GIT_HEADER.match(header[0])
    old, new = (m[1], m[2]) if m else (None, None)
    reasons: list[str] = []
    for ln in header[1:] if header[0].startswith("diff --git ") else header:
        if ln.startswith("--- "):
            old = ln[4:]
        elif ln.startswith("+++ "):
            new = ln[4:]
        else:
            reasons += [why for prefixes, why in _REFUSED_HEADERS if ln.startswith(prefixes)]
            if ln.startswith(_MODE_LINES) and ln.rstrip().endswith(" 120000"):
                reasons.append("is a symlink")
    old_p = _strip_prefix(old) if old else None
    new_p = _strip_prefix(new) if new else None
    shown = new_p if new_p and new_p != "/dev/null" else (old_p or block[0])
    if old_p == "/dev/null":
        reasons.append("creates a new file (a patch may only change existing files)")
    if new_p == "/dev/null":
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
    if not reasons and not hs:
        reasons.append("has no hunk (nothing to change)")
    if not reasons and path is None:
        reasons.append("names no file this diff format can read")
    if reasons or path is None:
        return None, shown, reasons
    return FileChange(path, old_p or "", new_p or "", len(hs)), shown, []


def inspect_diff(text: str, *, source: str = "diff") -> list[FileChange]:
    """Check a unified diff and map its paths to site-packages paths: one :class:`FileChange`
    per file, in diff order.

    Only changes to the contents of existing files under ``sglang/`` (``python/sglang/`` in a
    checkout) are accepted. Raises :class:`PatchError` naming ``source`` and each refused file
    with its reason (outside the package, new, deleted, renamed or copied, a mode change, a
    symlink, binary, named twice), or when the text holds no file change.
    """
    blocks = split_blocks(text)
    if not blocks:
        raise PatchError(
            f"{source}: holds no file change (expected a unified diff as `git diff` writes it)"
        )
    problems: list[str] = []
    out: list[FileChange] = []
    for block in blocks:
        change, shown, reasons = _inspect_block(block)
        if change is None:
            problems.append(f"{shown}: " + "; ".join(dict.fromkeys(reasons)))
        elif any(c.path == change.path for c in out):
            problems.append(f"{shown}: named twice in the diff")
        else:
            out.append(change)
    if problems:
        raise PatchError(f"{source}: cannot be used as a patch:\n  " + "\n  ".join(problems))
    return out


def site_layout_diff(text: str, changes: list[FileChange]) -> str:
    """``text`` with every file path rewritten to ``a/sglang/...`` / ``b/sglang/...`` (the layout
    patches apply in), ``index`` lines dropped."""
    by_raw = {c.raw_old: c.path for c in changes} | {c.raw_new: c.path for c in changes}
    out = []
    for block in split_blocks(text):
        header, hs = hunks(block)
        for ln in header:
            if ln.startswith("diff --git "):
                m = _GIT_HEADER.match(ln)
                p = by_raw.get(_strip_prefix(m[2])) if m else None
                ln = f"diff --git a/{p} b/{p}" if p else ln
            elif ln.startswith("--- "):
                ln = f"--- a/{by_raw[_strip_prefix(ln[4:])]}"
            elif ln.startswith("+++ "):
                ln = f"+++ b/{by_raw[_strip_prefix(ln[4:])]}"
            elif ln.startswith("index "):
                continue
            out.append(ln)
        out += [ln for h in hs for ln in h]
    return "\n".join(out) + "\n"


def hunk_failures(label: str, version: str, text: str, output: str, root: Path) -> list[str]:
    """One line per hunk (its header and first lines) or missing file that ``git apply``'s
    ``output`` names as failing to apply ``text`` under ``root``."""
    found: dict[tuple[str, int], list[str]] = {}
    for block in split_blocks(text):
        header, hs = hunks(block)
        plus = next((ln for ln in header if ln.startswith("+++ ")), "+++ ")
        for h in hs:
            if m := _HUNK.match(h[0]):
                found[(_strip_prefix(plus[4:]), int(m[1]))] = h
    msgs = []
    for path, line in re.findall(r"error: patch failed: (\S+):(\d+)", output):
        h = found.get((path, int(line)))
        shown = f"hunk {h[0]}\n    " + "\n    ".join(h[1:7]) if h else f"hunk at line {line}"
        msgs.append(f"{label} (sglang {version}) does not apply to {path}: {shown}")
    for path, _ in re.findall(
        r"error: (\S+): (No such file or directory|does not exist in index)", output
    ):
        msgs.append(f"{label} (sglang {version}): target file {path} is missing under {root}")
    return msgs or [f"{label} (sglang {version}) does not apply under {root}"]
