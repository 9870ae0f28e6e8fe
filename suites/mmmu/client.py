"""The MMMU client: chat completions against a running sglang server, bounded concurrency.

Protocol: ``POST {base_url}/v1/chat/completions`` with a JSON body prepared once per question
(``{"model", "messages", "temperature", "max_tokens", "stream": false}``); the answer is
``choices[0].message.content``, token counts from ``usage``. Non-streaming: one response body per
question (the answer is at most ``max_tokens`` tokens, 30 by default).

Failures are recorded, never dropped: every question gets an :class:`Outcome` (``error`` set when
it failed). Retries happen only when no byte of an answer arrived: a connection error before the
response headers, or an HTTP 429/500/502/503/504 status (its body is an error, not an answer). A
failure after a 200 status (timeout while reading, bad JSON, no choices) is final. Each attempt
has ``request_timeout_s`` (aiohttp ``ClientTimeout(total=...)``); between attempts a pause of
``0.5 * 2**attempt`` s.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

RETRY_STATUSES = {429, 500, 502, 503, 504}


@dataclass
class Outcome:
    """One question's request: ``response`` (None when failed), ``error`` (None when answered),
    ``latency_s`` (wall time of the last attempt, seconds), token counts from ``usage`` (None when
    absent), ``attempts`` (1 + retries made), ``finish_reason``."""

    response: str | None
    error: str | None
    latency_s: float | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    attempts: int = 1
    finish_reason: str | None = None


def request_body(
    messages: list[dict],
    *,
    model: str,
    temperature: float,
    max_tokens: int,
    extra: dict | None = None,
) -> bytes:
    """The JSON body of one request, UTF-8 bytes (built once per question and reused)."""
    body = {
        "model": model,
        "messages": messages,
        "temperature": temperature,
        "max_tokens": max_tokens,
        "stream": False,
    }
    if extra:
        body.update(extra)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class _Retryable(Exception):
    pass


async def _attempt(
    session: aiohttp.ClientSession, url: str, body: bytes, timeout_s: float
) -> Outcome:
    t0 = time.perf_counter()
    try:
        resp_cm = session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        )
        resp = await resp_cm.__aenter__()
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as e:
        raise _Retryable(f"{type(e).__name__}: {e}") from e
    try:
        if resp.status != 200:
            text = (await resp.text(errors="replace"))[:300]
            msg = f"HTTP {resp.status}: {text}"
            if resp.status in RETRY_STATUSES:
                raise _Retryable(msg)
            return Outcome(None, msg, time.perf_counter() - t0)
        try:
            data = json.loads(await resp.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            return Outcome(
                None, f"after HTTP 200: {type(e).__name__}: {e}", time.perf_counter() - t0
            )
        latency = time.perf_counter() - t0
        choices = data.get("choices") or []
        if not choices:
            return Outcome(None, f"HTTP 200 without choices: {str(data)[:300]}", latency)
        msg = choices[0].get("message") or {}
        content = msg.get("content")
        if content is None:
            return Outcome(None, "HTTP 200 with no message content", latency)
        usage = data.get("usage") or {}
        return Outcome(
            content,
            None,
            latency,
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
            1,
            choices[0].get("finish_reason"),
        )
    finally:
        await resp_cm.__aexit__(None, None, None)


async def _one(
    session: aiohttp.ClientSession,
    sem: asyncio.Semaphore,
    url: str,
    body: bytes,
    timeout_s: float,
    retries: int,
) -> Outcome:
    async with sem:
        last = "no attempt"
        for attempt in range(retries + 1):
            t0 = time.perf_counter()
            try:
                out = await _attempt(session, url, body, timeout_s)
                out.attempts = attempt + 1
                return out
            except _Retryable as e:
                last = str(e)
                if attempt < retries:
                    await asyncio.sleep(0.5 * 2**attempt)
            except Exception as e:  # noqa: BLE001 - anything else is recorded, never dropped
                return Outcome(
                    None, f"{type(e).__name__}: {e}", time.perf_counter() - t0, attempts=attempt + 1
                )
        return Outcome(
            None, f"gave up after {retries + 1} attempts: {last}", None, attempts=retries + 1
        )


async def send_all(
    base_url: str,
    bodies: Sequence[bytes],
    *,
    concurrency: int,
    request_timeout_s: float,
    retries: int,
    on_done: Callable[[], None] | None = None,
) -> list[Outcome]:
    """Send every body; ``result[i]`` is the outcome of ``bodies[i]``. At most ``concurrency``
    requests in flight; ``on_done()`` is called after each question (progress bar)."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    sem = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def run(i: int) -> Outcome:
            out = await _one(session, sem, url, bodies[i], request_timeout_s, retries)
            if on_done:
                on_done()
            return out

        return list(await asyncio.gather(*(run(i) for i in range(len(bodies)))))


async def served_model(base_url: str, timeout_s: float = 10.0) -> str | None:
    """The first model id of ``GET /v1/models``, or None when the server does not say."""
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(
                base_url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                if r.status != 200:
                    return None
                data = await r.json()
        return (data.get("data") or [{}])[0].get("id")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
        return None
