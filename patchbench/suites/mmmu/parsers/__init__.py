"""Answer extraction for MMMU responses: our ``strict`` parser and the ``official`` one.

Two parsers for multiple-choice responses, one normalisation for open (short-answer) questions:

- :func:`parse_official_mc` (:mod:`.official`) re-implements the official MMMU multiple-choice
  parser, its random fallback seeded by the caller;
- :func:`parse_strict` (:mod:`.strict`) is ours, deterministic and never random (docs/cases.md
  M1-M3); :func:`parse_strict_detail` also says why a response is unparsed;
- open questions go through :func:`parse_open` / :func:`eval_open` (:mod:`.official`) only, the
  official normalisation; they never pass through a letter parser;
- :mod:`.common`: option letters and the question type, shared by both.

This module is the package's public interface: the scorer, the MMMU command line and the tests
use the names below.
"""

from __future__ import annotations

from .common import is_open, option_letters
from .official import (
    eval_mc,
    eval_open,
    extract_numbers,
    normalize_str,
    official_mc_candidates,
    parse_official_mc,
    parse_open,
)
from .strict import (
    AMBIGUOUS,
    NO_ANSWER,
    UNPARSED_KINDS,
    StrictParse,
    clean_text,
    parse_strict,
    parse_strict_detail,
)

__all__ = [
    "parse_official_mc",
    "official_mc_candidates",
    "parse_strict",
    "parse_strict_detail",
    "StrictParse",
    "NO_ANSWER",
    "AMBIGUOUS",
    "UNPARSED_KINDS",
    "clean_text",
    "parse_open",
    "eval_open",
    "eval_mc",
    "normalize_str",
    "extract_numbers",
    "is_open",
    "option_letters",
]
