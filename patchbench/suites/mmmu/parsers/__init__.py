"""Answer extraction for MMMU responses: our deterministic ``strict`` multiple-choice parser
(:mod:`.strict`, docs/cases.md M1-M3), the ``official`` one with its seeded random fallback, and
the official normalisation of open questions, under either parser (:mod:`.official`).
"""

from __future__ import annotations

from .official import (
    eval_mc,
    eval_open,
    extract_numbers,
    is_open,
    normalize_str,
    official_mc_candidates,
    parse_official_mc,
    parse_open,
)
from .strict import (
    AMBIGUOUS,
    NO_ANSWER,
    UNPARSED_KINDS,
    parse_strict_detail,
)

__all__ = [
    "parse_official_mc",
    "official_mc_candidates",
    "parse_strict_detail",
    "NO_ANSWER",
    "AMBIGUOUS",
    "UNPARSED_KINDS",
    "parse_open",
    "eval_open",
    "eval_mc",
    "normalize_str",
    "extract_numbers",
    "is_open",
]
