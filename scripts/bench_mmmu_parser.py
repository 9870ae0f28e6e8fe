#!/usr/bin/env python
"""Time of the strict MMMU parser on 900 responses (goal: well under 1 s); not a timed test.

Two sets of 900 responses, each parsed ``--rounds`` times; the median round is printed with the
spread:

1. ``corpus``: the hand-labelled free-text responses of tests/data/mmmu-strict-corpus (commitments,
   revisions, sentences, echoed lists, rejections, reasoning blocks ...), cycled to 900, each with
   its own options;
2. ``llava``: the 847 multiple-choice responses of tests/data/mmmu-official/llava1.5_13b (mostly
   bare letters) followed by the first 53 again, to make 900.

Usage: ``.venv/bin/python scripts/bench_mmmu_parser.py [--rounds 5]``. Prints one line per set:
``<set>: 900 responses in <median> s (min .. max over N rounds)``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from patchbench.suites.mmmu.parsers import parse_strict_detail  # noqa: E402


def corpus_items(n: int) -> list[tuple[str, list[str], dict[str, str]]]:
    """``n`` (response, choices, index2ans) from the labelled corpus, cycled."""
    d = ROOT / "tests" / "data" / "mmmu-strict-corpus"
    options = json.loads((d / "options.json").read_text())
    rows = [json.loads(line) for line in (d / "corpus.jsonl").read_text().splitlines()]
    items = [(r["response"], list(options[r["options"]]), options[r["options"]]) for r in rows]
    return list(itertools.islice(itertools.cycle(items), n))


def llava_items(n: int) -> list[tuple[str, list[str], dict[str, str]]]:
    """``n`` multiple-choice (response, choices, index2ans) of the llava1.5_13b outputs, cycled."""
    items = []
    for f in sorted(
        (ROOT / "tests" / "data" / "mmmu-official" / "llava1.5_13b").glob("*/output.json")
    ):
        for x in json.loads(f.read_text()):
            if x.get("all_choices"):
                items.append((x["response"], x["all_choices"], x["index2ans"]))
    return list(itertools.islice(itertools.cycle(items), n))


def time_round(items) -> float:
    t0 = time.perf_counter()
    for resp, choices, opts in items:
        parse_strict_detail(resp, choices, opts)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=900, help="responses per set (default 900)")
    a = ap.parse_args(argv)
    for name, items in (("corpus", corpus_items(a.n)), ("llava", llava_items(a.n))):
        times = [time_round(items) for _ in range(a.rounds)]
        print(
            f"{name}: {len(items)} responses in {statistics.median(times):.3f} s "
            f"({min(times):.3f} .. {max(times):.3f} over {a.rounds} rounds)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
