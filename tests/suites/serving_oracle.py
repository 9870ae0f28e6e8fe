"""A test oracle: bench_serving's per-request bookkeeping replayed on one request's streamed
chunks (docs/cases.md S1-S3), as its client does it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Chunk:
    """One streamed chunk: arrival time t_s (seconds after the request was sent), its cumulative text
    ("" for a usage-only chunk) and cumulative ``completion_tokens`` (None if it has none)."""

    t_s: float
    text: str = ""
    completion_tokens: int | None = None


@dataclass
class RequestTiming:
    """One request as bench_serving records it. Times in seconds; ``output_len`` in tokens."""

    success: bool
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    output_len: int = 0
    tokens_in_first_chunk: int = 0
    no_token: bool = False
    error: str = ""

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (output_len - 1), as the tool computes TPOT; None for output_len <= 1."""
        if self.output_len <= 1:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_len - 1)


def request_from_chunks(
    chunks: Iterable[Chunk], *, requested_len: int, http_status: int = 200, reason: str = ""
) -> RequestTiming:
    """A non-200 response is a failure (output length 0, the reason as the error); a 200 whose
    stream carried no text is ``no_token=True``, ``success=False`` (the tool: a success of the
    requested length with TTFT 0; docs/cases.md S3)."""
    if http_status != 200:
        return RequestTiming(success=False, error=reason or f"HTTP {http_status}")
    ttft = 0.0
    itl: list[float] = []
    last_t = 0.0
    last_len = 0
    output_len = requested_len
    first_tokens = 0
    seen = False
    for c in chunks:
        if not c.text:
            continue  # usage-only / empty chunk: no token (docs/cases.md S2)
        n_total = c.completion_tokens if c.completion_tokens is not None else last_len + 1
        output_len = n_total
        if not seen:
            seen = True
            ttft = c.t_s
            first_tokens = n_total
        else:
            new = n_total - last_len
            if new == 0:
                continue
            itl.extend([(c.t_s - last_t) / new] * new)
        last_t = c.t_s
        last_len = n_total
    if not seen:
        return RequestTiming(
            success=False,
            no_token=True,
            output_len=requested_len,
            error="stream ended without any token",
        )
    return RequestTiming(
        success=True,
        ttft_s=ttft,
        itl_s=itl,
        e2e_s=ttft + sum(itl),
        output_len=output_len,
        tokens_in_first_chunk=first_tokens,
    )
