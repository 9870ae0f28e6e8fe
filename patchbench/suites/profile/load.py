"""A steady decode load for profiling: ``concurrency`` workers each keep one streamed ``POST
/generate`` request in flight (one image per prompt, long outputs, ``ignore_eos``) until
:meth:`DecodeLoad.stop`, recording every chunk's arrival (``time.monotonic``, s) per request."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
from dataclasses import dataclass, field

import aiohttp

#: Qwen2.5-VL's chat layout with one image placeholder (what the chat template renders)
PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "<|vision_start|><|image_pad|><|vision_end|>Describe this picture in detail.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def image_data_url(seed: int, width: int, height: int) -> str:
    """A seeded random RGB PNG as a ``data:image/png;base64,...`` URL (same bytes for a seed)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@dataclass
class DecodeLoad:
    """The load against ``base_url``; ``arrivals[i][j]``: chunk arrival times (s) of worker i's
    j-th request; ``errors``: failed requests (text)."""

    base_url: str
    concurrency: int
    max_new_tokens: int
    image_urls: list[str]
    arrivals: list[list[list[float]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: asyncio.Event | None = None
    _tasks: list[asyncio.Task] = field(default_factory=list)

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Start the workers (returns at once)."""
        self._stop = asyncio.Event()
        self.arrivals = [[] for _ in range(self.concurrency)]
        self._tasks = [
            asyncio.create_task(self._worker(session, i)) for i in range(self.concurrency)
        ]

    async def _worker(self, session: aiohttp.ClientSession, i: int) -> None:
        url = self.base_url.rstrip("/") + "/generate"
        sampling = {"temperature": 0.0, "max_new_tokens": self.max_new_tokens, "ignore_eos": True}
        image = self.image_urls[i % len(self.image_urls)]
        body = {"text": PROMPT, "image_data": image, "stream": True, "sampling_params": sampling}
        while not self._stop.is_set():
            try:
                async with session.post(url, json=body) as r:
                    if r.status != 200:
                        self.errors.append(f"HTTP {r.status}: {(await r.text())[:300]}")
                        await asyncio.sleep(0.5)
                        continue
                    times: list[float] = []
                    self.arrivals[i].append(times)
                    async for line in r.content:
                        if not line.startswith(b"data:"):
                            continue
                        if line.strip() == b"data: [DONE]":
                            break
                        times.append(time.monotonic())
                        if self._stop.is_set():
                            return
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                await asyncio.sleep(0.5)

    def min_tokens(self) -> int:
        """The fewest chunks any worker has received so far (over all its requests)."""
        return min((sum(len(r) for r in a) for a in self.arrivals), default=0)

    async def stop(self) -> None:
        """Stop the workers (closing their streams aborts the requests in the server)."""
        if self._stop is not None:
            self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []


def itl_from_arrivals(arrivals: list[list[list[float]]], t0: float, t1: float) -> float | None:
    """Mean gap (ms) between consecutive chunks of one request arriving in [t0, t1]
    (``arrivals[worker][request] = [chunk times (s)]``): the summed span first to last chunk over
    the summed gaps (not a median of gaps: chunks read together share a timestamp;
    docs/profile.md); None without a request with two chunks in the window."""
    span = 0.0
    gaps = 0
    for worker in arrivals:
        for times in worker:
            inside = [t for t in times if t0 <= t <= t1]
            if len(inside) >= 2:
                span += inside[-1] - inside[0]
                gaps += len(inside) - 1
    return 1000.0 * span / gaps if gaps else None
