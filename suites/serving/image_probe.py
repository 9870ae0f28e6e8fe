"""Probe: does the server attach the images of bench_serving's image prompts? (run as a script)

Run by the serving suite with the environment's python and the STOCK package, after the benchmark
(so it cannot touch the measured numbers), for releases whose bench_serving does not record the
server's prompt token count (0.5.1.post3). It builds ONE prompt with the release's own dataset code
(``sample_random_image_requests`` / ``sample_mmmu_requests`` of ``sglang.bench_serving``, with the
same chat-template setting as the run), sends it to ``POST /generate`` with its images and
``max_new_tokens=1``, and prints one JSON line: the tool's text-only token count of the prompt
(``prompt_len``, which excludes image tokens), the server's ``meta_info.prompt_tokens`` and the
number of images. Only stdlib and what bench_serving itself imports are used.

usage: python image_probe.py URL TOKENIZER DATASET INPUT_LEN IMAGES RESOLUTION CHAT_TEMPLATE(0|1)
"""
from __future__ import annotations

import json
import sys
import urllib.request


def main(argv: list[str]) -> int:
    url, tok, dataset, input_len, images, resolution, chat = argv
    import sglang.bench_serving as bs  # the release's own dataset builders

    tokenizer = bs.get_tokenizer(tok)
    chat_template = chat == "1"
    if dataset == "mmmu":
        rows = bs.sample_mmmu_requests(num_requests=1, tokenizer=tokenizer, fixed_output_len=1,
                                       apply_chat_template=chat_template)
    else:
        rows = bs.sample_random_image_requests(
            num_requests=1, num_images=int(images), input_len=int(input_len), output_len=1,
            range_ratio=1.0, tokenizer=tokenizer, apply_chat_template=chat_template,
            image_resolution=resolution)
    row = rows[0]
    payload = {"text": row.prompt, "image_data": row.image_data,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": 1}}
    req = urllib.request.Request(url.rstrip("/") + "/generate", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    print(json.dumps({"text_tokens": row.prompt_len,
                      "server_prompt_tokens": out["meta_info"]["prompt_tokens"],
                      "images": len(row.image_data or [])}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
