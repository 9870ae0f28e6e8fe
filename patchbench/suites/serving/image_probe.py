"""Probe: does the server attach the images of bench_serving's image prompts? (run as a script)

For releases whose bench_serving does not record the server's prompt tokens (0.5.1.post3), run
after the benchmark with the STOCK package: ONE prompt built by the release's own dataset code
with the run's chat-template setting, sent to ``POST /generate`` with ``max_new_tokens=1``;
prints one JSON line (the tool's text-only ``prompt_len``, the server's
``meta_info.prompt_tokens``, the images). A prompt the server refuses (a random id decoding to a
special token) is retried with the next seed, up to ATTEMPTS times.

usage: python image_probe.py URL TOKENIZER DATASET INPUT_LEN IMAGES RESOLUTION CHAT_TEMPLATE(0|1) SEED"""

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
