"""What both parsers and the scorer share: option letters and the question type."""

from __future__ import annotations


def option_letters(n: int) -> list[str]:
    """Letters of ``n`` options: ``["A", "B", ...]``. Raises ValueError beyond 26 options."""
    if not 0 <= n <= 26:
        raise ValueError(f"{n} options: at most 26 are supported")
    return [chr(ord("A") + i) for i in range(n)]


def is_open(question_type: str) -> bool:
    """True for open questions: HF MMMU says ``"open"``, the official answer key ``"short-answer"``.

    Raises ValueError for any other value than those and ``"multiple-choice"``.
    """
    if question_type in ("open", "short-answer"):
        return True
    if question_type == "multiple-choice":
        return False
    raise ValueError(
        f"question_type {question_type!r}: expected 'multiple-choice', 'open' or 'short-answer'"
    )
