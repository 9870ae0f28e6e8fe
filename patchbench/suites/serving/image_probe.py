"""Probe: does the server attach the images of bench_serving's image prompts? (run as a script)

Run by the serving suite with the environment's python and the STOCK package, after the benchmark
(so it cannot touch the measured numbers), for releases whose bench_serving does not record the
server's prompt token count (0.5.1.post3). It builds ONE prompt with the release's own dataset code
(``sample_random_image_requests`` / ``sample_mmmu_requests`` of ``sglang.bench_serving``, with the
same chat-template setting as the run), sends it to ``POST /generate`` with its images and
``max_new_tokens=1``, and prints one JSON line: the tool's text-only token count of the prompt
(``prompt_len``, which excludes image tokens), the server's ``meta_info.prompt_tokens`` and the
number of images. Only stdlib and what bench_serving itself imports are used.

A random prompt can hold a special token the server refuses (sglang answers 400, e.g. "No data
iterator found for token: <|video_pad|>" when a random id decodes to a video token); the probe
then tries the next seed, up to ATTEMPTS times, and records the refusals. The sampling is seeded
(``random`` and ``numpy``, as bench_serving seeds them) so the probe's prompt is reproducible.

usage: python image_probe.py URL TOKENIZER DATASET INPUT_LEN IMAGES RESOLUTION CHAT_TEMPLATE(0|1) SEED
"""

from __future__ import annotations

import json
import random
import sys
import urllib.error
import urllib.request

ATTEMPTS = 5


def _sample(bs, tokenizer, dataset, input_len, images, resolution, chat_template, seed):
    import numpy as np  # bench_serving itself needs it

    random.seed(seed)
    np.random.seed(seed)
    if dataset == "mmmu":
        rows = bs.sample_mmmu_requests(
            num_requests=1,
            tokenizer=tokenizer,
            fixed_output_len=1,
            apply_chat_template=chat_template,
        )
    else:
        rows = bs.sample_random_image_requests(
            num_requests=1,
            num_images=int(images),
            input_len=int(input_len),
            output_len=1,
            range_ratio=1.0,
            tokenizer=tokenizer,
            apply_chat_template=chat_template,
            image_resolution=resolution,
        )
    return rows[0]


def main(argv: list[str]) -> int:
    url, tok, dataset, input_len, images, resolution, chat, seed = argv
    import sglang.bench_serving as bs  # the release's own dataset builders

    tokenizer = bs.get_tokenizer(tok)
    refused = []
    for s in range(int(seed), int(seed) + ATTEMPTS):
        row = _sample(bs, tokenizer, dataset, input_len, images, resolution, chat == "1", s)
        payload = {
            "text": row.prompt,
            "image_data": row.image_data,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
        }
        req = urllib.request.Request(
            url.rstrip("/") + "/generate",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code != 400:
                raise
            refused.append({"seed": s, "reason": e.read().decode("utf-8", "replace")[:300]})
            continue
        print(
            json.dumps(
                {
                    "text_tokens": row.prompt_len,
                    "server_prompt_tokens": out["meta_info"]["prompt_tokens"],
                    "images": len(row.image_data or []),
                    "seed": s,
                    "refused": refused,
                }
            )
        )
        return 0
    print(f"the server refused all {ATTEMPTS} probe prompts (400): {refused}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
