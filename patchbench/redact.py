"""One redaction of secrets for everything patchbench writes or prints (never for the server's
own environment): the value of a variable whose name holds one of :data:`SECRET_WORDS`
(case-insensitive) or is listed in ``server.secret_env`` is shown as ``<redacted sha256:1a2b3c4d>``
(the first 8 hex digits of the value's sha256)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

#: substrings of a variable's name that make its value a secret (compared case-insensitively)
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "HF_TOKEN")
#: how a redacted value starts
REDACTED_PREFIX = "<redacted sha256:"


def is_secret(name: str, extra: Iterable[str] = ()) -> bool:
    """True when ``name`` looks like a secret's, or is one of ``extra`` (case-insensitively)."""
    up = name.upper()
    return any(w in up for w in SECRET_WORDS) or up in {e.upper() for e in extra}


def redacted(value: str) -> str:
    """``<redacted sha256:XXXXXXXX>``: the first 8 hex digits of ``value``'s sha256; a value
    already redacted stays as it is."""
    if value.startswith(REDACTED_PREFIX) and value.endswith(">"):
        return value
    return f"{REDACTED_PREFIX}{hashlib.sha256(value.encode()).hexdigest()[:8]}>"


def redact_env(env: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """``env`` with the value of every secret-looking name (:func:`is_secret`) redacted."""
    extra = list(extra)
    return {k: redacted(v) if is_secret(k, extra) else v for k, v in env.items()}


def has_redacted(env: Mapping[str, str]) -> list[str]:
    """The names in ``env`` whose value is a redacted one (a config read back from a run
    folder: those values are gone)."""
    return [k for k, v in env.items() if v.startswith(REDACTED_PREFIX)]
