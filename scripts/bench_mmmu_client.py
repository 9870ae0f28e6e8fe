#!/usr/bin/env python
"""Benchmark of the MMMU client itself ; not a timed test.

1. Client overhead per request at concurrency 16 against a local stub aiohttp server that answers
   every chat completion at once (a separate process, so its CPU is not the client's). Reported:
   client CPU time per request (the client process's ``time.process_time()`` over the run divided
   by the request count: the overhead the client adds, goal median < 1 ms), the request latency
   median / p99 as the client sees it, and requests per second. Repeated ``--rounds`` times; the
   median round is reported with the spread.
2. Time to prepare 900 questions: synthetic MMMU-schema questions (patchbench.suites.mmmu.demo_data, 224x224
   PNGs, 1-5 images each) written as parquet, then ``bench.prepare`` cold (load with ``datasets``,
   encode every image as a PNG data URL, hash, write the run cache) and warm (read the cache), and
   building the 900 request bodies.

Usage: ``.venv/bin/python scripts/bench_mmmu_client.py [--requests 2000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from patchbench.suites.mmmu import client

ANSWER = (
    b'{"choices":[{"message":{"role":"assistant","content":"Answer: B"},'
    b'"finish_reason":"stop"}],"usage":{"prompt_tokens":300,"completion_tokens":3}}'
)


def _serve(port_q: mp.Queue) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def client_overhead(n: int, rounds: int, concurrency: int, body_kib: int) -> dict:
    q: mp.Queue = mp.Queue()
    proc = mp.Process(target=_serve, args=(q,), daemon=True)
    proc.start()
    try:
        url = f"http://127.0.0.1:{q.get(timeout=30)}"
        filler = "x" * (body_kib * 1024)
        messages = [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Question?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + filler}},
                ],
            }
        ]
        bodies = [client.request_body(messages, model="m", temperature=0, max_tokens=30)] * n
        asyncio.run(
            client.send_all(
                url, bodies[:200], concurrency=concurrency, request_timeout_s=30, retries=0
            )
        )  # warm-up
        per_round = []
        for _ in range(rounds):
            c0, w0 = time.process_time(), time.perf_counter()
            out = asyncio.run(
                client.send_all(
                    url, bodies, concurrency=concurrency, request_timeout_s=30, retries=0
                )
            )
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            lat = sorted(o.latency_s for o in out if o.latency_s is not None)
            fails = sum(o.error is not None for o in out)
            per_round.append(
                {
                    "cpu_ms_per_req": 1000 * cpu / n,
                    "req_s": n / wall,
                    "lat_median_ms": 1000 * statistics.median(lat),
                    "lat_p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
                    "failed": fails,
                }
            )
        return {"rounds": per_round, "n": n, "concurrency": concurrency, "body_kib": body_kib}
    finally:
        proc.terminate()
        proc.join(5)


def prepare_900(n: int) -> dict:
    from patchbench.suites.mmmu import Params
    from patchbench.suites.mmmu.bench import prepare
    from patchbench.suites.mmmu.data import SUBJECTS
    from patchbench.suites.mmmu.demo_data import generate

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        generate(Path(tmp) / "data", n=n, seed=0)
        gen_s = time.perf_counter() - t
        params = Params(dataset_path=str(Path(tmp) / "data"), subjects=list(SUBJECTS))
        t = time.perf_counter()
        prepared = prepare(params, Path(tmp) / "cache")
        cold_s = time.perf_counter() - t
        t = time.perf_counter()
        prepared2 = prepare(params, Path(tmp) / "cache")
        warm_s = time.perf_counter() - t
        t = time.perf_counter()
        bodies = [
            client.request_body(p["messages"], model="m", temperature=0, max_tokens=30)
            for p in prepared2
        ]
        body_s = time.perf_counter() - t
        n_img = sum(p["n_images_sent"] for p in prepared)
        return {
            "questions": len(prepared),
            "images": n_img,
            "generate_s": gen_s,
            "prepare_cold_s": cold_s,
            "prepare_warm_s": warm_s,
            "bodies_s": body_s,
            "body_mib": sum(map(len, bodies)) / 2**20,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument(
        "--body-kib", type=int, default=64, help="size of the fake image payload per request (KiB)"
    )
    ap.add_argument("--questions", type=int, default=900)
    a = ap.parse_args(argv)

    r = client_overhead(a.requests, a.rounds, a.concurrency, a.body_kib)
    cpu = [x["cpu_ms_per_req"] for x in r["rounds"]]
    lat = [x["lat_median_ms"] for x in r["rounds"]]
    print(
        f"client overhead, {r['n']} requests x {a.rounds} rounds at concurrency "
        f"{r['concurrency']}, {r['body_kib']} KiB bodies, stub server in another process:"
    )
    print(
        f"  client CPU per request: median {statistics.median(cpu):.3f} ms "
        f"(rounds {min(cpu):.3f} .. {max(cpu):.3f} ms; goal < 1 ms)"
    )
    print(
        f"  latency seen by the client: median {statistics.median(lat):.3f} ms, p99 "
        f"{statistics.median(x['lat_p99_ms'] for x in r['rounds']):.3f} ms; "
        f"{statistics.median(x['req_s'] for x in r['rounds']):.0f} req/s; failed "
        f"{sum(x['failed'] for x in r['rounds'])}"
    )
    p = prepare_900(a.questions)
    print(
        f"prepare {p['questions']} synthetic questions ({p['images']} images, 224x224 PNG): "
        f"cold {p['prepare_cold_s']:.2f} s (load + encode + hash + cache write), warm "
        f"{p['prepare_warm_s']:.2f} s (run cache), request bodies {p['bodies_s']:.2f} s "
        f"({p['body_mib']:.1f} MiB); generating them took {p['generate_s']:.2f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
