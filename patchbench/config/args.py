"""Server arguments and environment variables of a config: refusing what the harness sets itself
(:data:`HARNESS_ARGS`, :data:`HARNESS_ENV`) in any spelling, and reading an argument list as
(flag, value) pairs. Errors are ValueError naming the key and item."""

from __future__ import annotations

import os
import re

#: POSIX environment variable name
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: server arguments the harness sets itself (from model.path, model.tokenizer, server.host/port)
HARNESS_ARGS = ("--model-path", "--model", "--tokenizer-path", "--host", "--port")
#: environment variables the harness sets itself (the overlay goes first on PYTHONPATH)
HARNESS_ENV = ("PYTHONPATH",)
HARNESS_ENV_PREFIX = "PATCHBENCH_"


def split_args(args: list[str]) -> list[tuple[int, str, str | None]]:
    """``server.args``-style list -> [(index of the flag item, flag, value or None)]:
    ``--flag=value`` and ``--flag value`` (the next item when it does not start with ``-`` or is a
    negative number) give (i, "--flag", "value"), a switch (i, "--flag", None), anything else
    (i, "", item)."""
    out: list[tuple[int, str, str | None]] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("-") and not _is_number(a):
            if "=" in a:
                flag, val = a.split("=", 1)
                out.append((i, flag, val))
            elif i + 1 < len(args) and (not args[i + 1].startswith("-") or _is_number(args[i + 1])):
                out.append((i, a, args[i + 1]))
                i += 1
            else:
                out.append((i, a, None))
        else:
            out.append((i, "", a))
        i += 1
    return out


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _owned_flag(flag: str) -> str | None:
    """The harness-owned argument that ``flag`` means for argparse (exact, or an unambiguous
    prefix as argparse's allow_abbrev reads it), or None."""
    if not flag.startswith("--") or len(flag) < 3:
        return None
    if flag in HARNESS_ARGS:
        return flag
    hits = [o for o in HARNESS_ARGS if o.startswith(flag)]
    return hits[0] if hits else None


#: the longest single argument or ``NAME=value`` string Linux passes to a new process
#: (``MAX_ARG_STRLEN``, 32 pages of 4 KiB, with its NUL): a longer one fails the launch (E2BIG)
MAX_ARG_BYTES = 131072


def exec_bytes(argv: list[str], env: dict[str, str]) -> int:
    """The bytes a new process's arguments and environment take of the kernel's limit
    (``os.sysconf("SC_ARG_MAX")``): each string with its NUL, plus a pointer to each and the
    two NULL pointers that end the lists."""
    strings = sum(len(a.encode("utf-8", "surrogateescape")) + 1 for a in argv)
    strings += sum(len(f"{k}={v}".encode("utf-8", "surrogateescape")) + 1 for k, v in env.items())
    return strings + 8 * (len(argv) + len(env) + 2)


def arg_max() -> int:
    """This system's limit on a new process's arguments plus environment in bytes
    (``SC_ARG_MAX``; 131072, the POSIX floor Linux never goes below, when it cannot be read)."""
    try:
        n = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        n = -1
    return n if n > 0 else 131072


def launch_size_problem(argv: list[str], env: dict[str, str]) -> str | None:
    """Why ``argv`` with ``env`` cannot start a process here (over :func:`arg_max`), or None."""
    need, limit = exec_bytes(argv, env), arg_max()
    if need <= limit:
        return None
    big = sorted(env.items(), key=lambda kv: -len(kv[1]))[:3]
    return (
        f"the server's arguments and environment take {need} bytes, over this system's "
        f"{limit} (getconf ARG_MAX; the launch would fail with E2BIG); the largest environment "
        "values: " + ", ".join(f"{k} ({len(v)} bytes)" for k, v in big)
    )


def _too_long(s: str) -> bool:
    return len(s.encode("utf-8", "surrogateescape")) + 1 > MAX_ARG_BYTES


def check_args(args: list[str], where: str) -> list[str]:
    """``args``, or ValueError naming the item (``where[i]``): a flag and its value in one item,
    a harness-owned argument in any spelling, an empty item, a NUL, one over
    :data:`MAX_ARG_BYTES`."""
    for i, a in enumerate(args):
        if not a.strip() or "\x00" in a:
            raise ValueError(f"{where}[{i}]: {a!r} is empty or holds a NUL character")
        if _too_long(a):
            raise ValueError(
                f"{where}[{i}]: {len(a)} characters; a process argument may be at most "
                f"{MAX_ARG_BYTES - 1} bytes (Linux MAX_ARG_STRLEN: the launch would fail)"
            )
        first = a.split("=", 1)[0]
        if a.startswith("-") and any(c.isspace() for c in first):
            head = first.split()[0]
            owned = _owned_flag(head)
            if owned:
                raise ValueError(
                    f"{where}[{i}]: {a!r} sets {owned}, which the harness sets "
                    f"({_owner_hint(owned)}); remove it"
                )
            raise ValueError(
                f"{where}[{i}]: {a!r} holds a flag and its value in one item, which "
                f"sglang would not recognise; write them as two items "
                f"({head!r}, '...') or as {head}=VALUE"
            )
    for i, flag, _ in split_args(args):
        owned = _owned_flag(flag)
        if owned:
            shown = f"'{args[i]}'" + (f" (argparse reads it as {owned})" if flag != owned else "")
            raise ValueError(
                f"{where}[{i}]: {shown} is set by the harness ({_owner_hint(owned)}); remove it"
            )
    return args


def _owner_hint(flag: str) -> str:
    return {
        "--host": "from server.host",
        "--port": "from server.port or bench --port",
        "--tokenizer-path": "from model.tokenizer",
    }.get(flag, "from model.path")


def check_env(env: dict[str, str], where: str) -> dict[str, str]:
    """``env``, or ValueError naming the entry: not a POSIX name, a NUL or over
    :data:`MAX_ARG_BYTES` in the value, a variable the harness sets (PYTHONPATH, PATCHBENCH_*)."""
    for k, v in env.items():
        if not ENV_NAME.match(k):
            raise ValueError(
                f"{where}: '{k}' is not an environment variable name (letters, digits "
                "and '_', not starting with a digit)"
            )
        if "\x00" in v:
            raise ValueError(f"{where}.{k}: the value holds a NUL character")
        if _too_long(f"{k}={v}"):
            raise ValueError(
                f"{where}.{k}: the value has {len(v)} characters; NAME=value may be at most "
                f"{MAX_ARG_BYTES - 1} bytes (Linux MAX_ARG_STRLEN: the launch would fail)"
            )
        if k in HARNESS_ENV or k.startswith(HARNESS_ENV_PREFIX):
            raise ValueError(
                f"{where}.{k}: set by the harness (the overlay and its checks); remove it"
            )
    return env
