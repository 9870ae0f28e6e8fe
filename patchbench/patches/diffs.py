"""Unified diffs as text: checking a diff a user gives (:func:`inspect_diff`), rewriting its paths
to the site-packages layout, making one from two versions of a file, and naming failed hunks.

A patch may only change the contents of existing files of the ``sglang`` package; its paths are
``python/sglang/...`` (a ``git diff`` in an sglang checkout) or ``sglang/...`` (site-packages).
Errors are :class:`patchbench.errors.PatchError` naming the diff's source and every problem.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from patchbench.errors import PatchError


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


#: what a header line of a diff block says that a patch may not do (line prefix -> reason)
_REFUSED_HEADERS = (
    (("new file mode",), "creates a new file (a patch may only change existing files)"),
    (("deleted file mode",), "deletes the file (a patch may only change existing files)"),
    (("rename from", "rename to", "similarity index"), "renames the file"),
    (("copy from", "copy to"), "copies the file"),
    (("old mode", "new mode"), "changes the file mode (the overlay keeps the release's modes)"),
    (("Binary files", "GIT binary patch"), "is a binary change"),
)


def _block_headers(block: list[str]) -> tuple[str | None, str | None, int, list[str]]:
    """(old path, new path, number of hunks, reasons to refuse) of one file's block of a diff,
    read from its header lines (``diff --git``, ``---``/``+++``, mode, rename, binary lines)."""
    header = block[0]
    old = new = None
    reasons: list[str] = []
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
        elif ln.startswith("index ") and ln.rstrip().endswith(" 120000"):
            reasons.append("is a symlink")
        else:
            reasons += [why for prefixes, why in _REFUSED_HEADERS if ln.startswith(prefixes)]
    if any(
        "120000" in ln
        for ln in block[1:6]
        if ln.startswith(("new file mode", "deleted file mode", "old mode", "new mode"))
    ):
        reasons.append("is a symlink")
    return old, new, hunks, reasons


def _inspect_block(block: list[str]) -> tuple[FileChange | None, str, list[str]]:
    """(the file change, the name shown for it, reasons to refuse) of one file's block."""
    old, new, hunks, reasons = _block_headers(block)
    old_p = _strip_prefix(old) if old else None
    new_p = _strip_prefix(new) if new else None
    shown = new_p if new_p and new_p != "/dev/null" else (old_p or block[0])
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
    if not reasons and path is None:
        reasons.append("names no file this diff format can read")
    if reasons or path is None:
        return None, shown, reasons
    return FileChange(path=path, raw_old=old_p or "", raw_new=new_p or "", hunks=hunks), shown, []


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


def hunk_failures(label: str, version: str, text: str, output: str, root: Path) -> list[str]:
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
