"""The MMMU client: non-streaming ``POST /v1/chat/completions``, bounded concurrency.

Every question gets an :class:`Outcome`, failures included. Retries only when no byte of an answer
arrived (a connection error before the headers, HTTP 429/500/502/503/504), after a pause of
``0.5 * 2**attempt`` s; a failure after a 200 is final. ``request_timeout_s`` is per attempt.
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
    """One question's request: ``response`` or ``error``, ``latency_s`` (the last attempt's),
    token counts from ``usage``, ``attempts``, ``finish_reason``."""

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


def answer_of(data: object, latency_s: float) -> Outcome:
    """The :class:`Outcome` of one HTTP 200 body ``data`` (parsed JSON): ``choices[0].message.content``,
    or a failed outcome naming why the body holds no answer (docs/faults.md); an empty content after
    at least one completion token is the model's own answer."""
    if not isinstance(data, dict):
        return Outcome(None, f"HTTP 200 whose body is not an object: {str(data)[:300]}", latency_s)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return Outcome(None, f"HTTP 200 without choices: {str(data)[:300]}", latency_s)
    choice = choices[0]
    msg = choice.get("message")
    content = msg.get("content") if isinstance(msg, dict) else None
    finish = choice.get("finish_reason")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    completion = usage.get("completion_tokens")
    if content is None:
        return Outcome(None, "HTTP 200 with no message content", latency_s)
    if not isinstance(content, str):
        return Outcome(
            None, f"HTTP 200 whose message content is not text: {str(content)[:300]}", latency_s
        )
    if finish == "abort":
        return Outcome(
            None,
            f"the server aborted the request (finish_reason abort) after {completion} "
            f"completion token(s): {content[:100]!r}",
            latency_s,
            finish_reason=finish,
        )
    if not content and (finish not in ("stop", "length") or not completion):
        return Outcome(
            None,
            f"HTTP 200 with an empty answer the server generated no token for "
            f"(finish_reason {finish!r}, completion_tokens {completion!r})",
            latency_s,
            finish_reason=finish,
        )
    return Outcome(content, None, latency_s, usage.get("prompt_tokens"), completion, 1, finish)


async def _attempt(
    session: aiohttp.ClientSession, url: str, body: bytes, timeout_s: float
) -> Outcome:
    t0 = time.perf_counter()
    try:
        resp = await session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        )
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as e:
        raise _Retryable(f"{type(e).__name__}: {e}") from e
    async with resp:
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
        return answer_of(data, time.perf_counter() - t0)


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
    """The outcome of every body, in order; at most ``concurrency`` in flight, ``on_done()`` after
    each."""
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
