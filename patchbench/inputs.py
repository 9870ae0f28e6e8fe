"""Where the repository keeps things, and reading the files a user writes (configs, matrices,
patch manifests, diffs; YAML: :func:`read_yaml_mapping`). A leaf: it imports nothing of patchbench.
"""

from __future__ import annotations

import hashlib
import os
import re
import select
import stat
import time
from pathlib import Path
from typing import Any

import yaml

#: the repository checkout (or the installed package's parent)
REPO_ROOT = Path(__file__).resolve().parent.parent
#: one folder per patch, each holding manifest.yaml and its diffs
PATCHES_DIR = REPO_ROOT / "patches"
#: git-ignored cache: wheels, derived diffs, overlays
CACHE_DIR = REPO_ROOT / ".cache"
#: default parent folder of run folders
RESULTS_DIR = REPO_ROOT / "results"

#: a name that also names a folder (a run, variant, patch or matrix): letters, digits, '.', '_',
#: '-', starting with a letter or digit
FOLDER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

#: bounds on a config (or patch manifest) file
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_ALIASES = 100
MAX_YAML_NODES = 100_000


def is_hub_id(p: str) -> bool:
    """True for a model-hub id such as ``Qwen/Qwen2.5-VL-3B-Instruct`` (``org/name``, not a path
    that starts with ``.``, ``/``, ``~`` or ``$``)."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", p))


def looks_local(p: str) -> bool:
    """A path the user wrote as a local one: absolute, ``./``, ``../``, ``~`` or ``$VAR``."""
    return p.startswith(("/", "./", "../", "~", "$")) or p in (".", "..")


def sha256_file(path: Path) -> str:
    """sha256 hex digest (64 lowercase hex characters) of a file's bytes; OSError when unreadable."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --------------------------------------------------------------------------- YAML reading
class _YamlLimit(yaml.YAMLError):
    pass


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (naming both lines) and bounds alias use."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                mark = self.peek_event().start_mark
                raise _YamlLimit(
                    f"line {mark.line + 1}: more than {MAX_YAML_ALIASES} aliases (*name); "
                    "write the values out"
                )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                try:
                    key = self.construct_object(key_node, deep=True)
                    hash(key)
                except TypeError:  # an unhashable key: the base constructor says so
                    continue
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key '{key}' at lines {seen[key]} and {line}: YAML "
                        "would silently keep only the last one; remove one of them",
                        key_node.start_mark,
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_nodes(node, memo: dict) -> int:
    """Node count of a composed YAML graph with every alias expanded (linear time, memoised)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a cycle counts once (PyYAML builds recursive objects for them)
    if isinstance(node, yaml.MappingNode):
        n = 1 + sum(_expanded_nodes(k, memo) + _expanded_nodes(v, memo) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_expanded_nodes(v, memo) for v in node.value)
    else:
        n = 1
    memo[id(node)] = n
    return n


def parse_yaml(text: str) -> Any:
    """One YAML document, with :class:`_Loader`'s checks and the node bound; yaml.YAMLError
    (naming the line) otherwise."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded_nodes(node, {})
        if n > MAX_YAML_NODES:
            raise _YamlLimit(f"{n} YAML nodes once aliases are expanded (at most {MAX_YAML_NODES})")
        return loader.construct_document(node)
    finally:
        loader.dispose()


#: how long an input that is not a regular file (a pipe such as ``<(...)``, a FIFO, a device)
#: may take to deliver its bytes and end
STREAM_WAIT_S = 30.0


class _NoEnd(Exception):
    """An input that is not a regular file did not end in time or in size."""


def _read_bounded(path: Path) -> bytes:
    """At most MAX_CONFIG_BYTES + 1 bytes of ``path``. Anything but a regular file (a pipe, a
    FIFO, a device) is opened without blocking (a FIFO without a writer reads as empty) and read
    for at most STREAM_WAIT_S seconds. Raises OSError, or :class:`_NoEnd` when the bytes keep
    coming or stop without an end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(MAX_CONFIG_BYTES + 1)
        chunks: list[bytes] = []
        got, deadline = 0, time.monotonic() + STREAM_WAIT_S
        while got <= MAX_CONFIG_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _NoEnd(
                    f"not a regular file, and it did not end within {STREAM_WAIT_S:g} s "
                    f"({got} bytes came)"
                )
            if not select.select([fd], [], [], left)[0]:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            got += len(chunk)
        raise _NoEnd(f"not a regular file, and it did not end after {got} bytes")
    finally:
        os.close(fd)


def read_text_file(path: Path, error: type[Exception], what: str = "config file") -> str:
    """The UTF-8 text of a small input file (a byte-order mark accepted). Raises ``error`` with
    one line naming the file (``what``: its kind) when it is missing, a directory, unreadable,
    larger than MAX_CONFIG_BYTES or not UTF-8 (the offset and line of the first bad byte)."""
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: is a directory, not a {what}")
    if not path.exists():
        raise error(f"{path}: no such {what}")
    too_big = f"a {what} may hold at most {MAX_CONFIG_BYTES}"
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise error(f"{path}: {size} bytes; {too_big}")
        data = _read_bounded(path)
    except _NoEnd as e:
        raise error(f"{path}: {e}; {too_big} bytes: give a {what} saved as a file") from None
    except OSError as e:
        raise error(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise error(f"{path}: more than {MAX_CONFIG_BYTES} bytes; {too_big}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise error(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
            f"{e.start}); save the file as UTF-8"
        ) from None


def read_yaml_mapping(
    path: Path, error: type[Exception], keys: str, what: str = "file"
) -> tuple[str, dict]:
    """(text, top-level mapping) of a YAML file. Raises ``error`` naming the file (and the line)
    as :func:`read_text_file` does, and for invalid YAML, a duplicate key, too many aliases or
    nodes, or a top level that is not a mapping (``keys`` lists what it should hold)."""
    text = read_text_file(path, error, what)
    try:
        raw = parse_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e)
        if isinstance(e, _YamlLimit) or (problem and "duplicate key" in problem):
            raise error(f"{where}: {problem}") from None
        raise error(f"{where}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise error(
            f"{path}: the top level must be a mapping with keys {keys} (got {type(raw).__name__})"
        )
    return text, raw


def line_of(text: str, loc: tuple) -> int | None:
    """The 1-based YAML line of a key path (``("variants", "v", 0)``) in ``text``; None when the
    text does not parse or the path is not there."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in loc:
        if node is None:
            break
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, val in node.value:
                if k.value == str(key):
                    line, nxt = k.start_mark.line + 1, val
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line
