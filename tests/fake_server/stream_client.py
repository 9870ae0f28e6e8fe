"""A stand-in for bench_serving's client: streamed ``POST /generate`` requests one after another
against the fake server (``URL N``), read chunk by chunk until ``data: [DONE]``, with nothing printed
between the first line and the result (bench_serving with ``--disable-tqdm``). No timeout: a stream
the server stops answering blocks it for good, as an aiohttp client with bench_serving's 6 h
timeout would."""

import http.client
import json
import sys
import urllib.parse

url, n = sys.argv[1], int(sys.argv[2])
u = urllib.parse.urlparse(url)
print("Starting main benchmark run...", flush=True)
chunks = 0
for _ in range(n):
    conn = http.client.HTTPConnection(u.hostname, u.port)
    conn.request("POST", "/generate", body=json.dumps({"text": "p", "stream": True}))
    r = conn.getresponse()
    for line in r:
        if line.strip() == b"data: [DONE]":
            break
        if line.startswith(b"data:"):
            chunks += 1
    conn.close()
print(f"done: {n} requests, {chunks} chunks", flush=True)
