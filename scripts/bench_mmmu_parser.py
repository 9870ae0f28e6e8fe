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

``--agreement`` prints agreement instead of times: per family of ``corpus.jsonl`` and of the
held-out ``heldout.jsonl`` (parse == label, ``<family>: <agree>/<n>``), and for the llava
responses the count whose strict parse equals the official parser's without its random fallback.
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
    """``n`` multiple-choice (response, choices, index2ans) of the llava1.5_13b outputs, cycled
    (``n`` = 0: each once, 847)."""
    items = []
    for f in sorted(
        (ROOT / "tests" / "data" / "mmmu-official" / "llava1.5_13b").glob("*/output.json")
    ):
        for x in json.loads(f.read_text()):
            if x.get("all_choices"):
                items.append((x["response"], x["all_choices"], x["index2ans"]))
    return list(itertools.islice(itertools.cycle(items), n)) if n else items


def labelled(name: str) -> list[tuple[str, str, list[str], dict[str, str], str]]:
    """``(family, response, choices, index2ans, label)`` of ``corpus`` or ``heldout``."""
    d = ROOT / "tests" / "data" / "mmmu-strict-corpus"
    options = json.loads(
        (d / ("options.json" if name == "corpus" else "heldout-options.json")).read_text()
    )
    rows = [json.loads(line) for line in (d / f"{name}.jsonl").read_text().splitlines()]
    return [
        (r["family"], r["response"], list(options[r["options"]]), options[r["options"]], r["label"])
        for r in rows
    ]


def print_agreement() -> None:
    """Per-family agreement of the strict parse with the labels, and llava vs official."""
    from patchbench.suites.mmmu.parsers import parse_official_mc

    for name in ("corpus", "heldout"):
        agree: dict[str, list[int]] = {}
        for fam, resp, choices, opts, label in labelled(name):
            r = parse_strict_detail(resp, choices, opts)
            agree.setdefault(fam, [0, 0])
            agree[fam][0] += (r.letter or r.status) == label
            agree[fam][1] += 1
        total = [sum(v[0] for v in agree.values()), sum(v[1] for v in agree.values())]
        print(f"{name}: {total[0]}/{total[1]}")
        for fam, (k, n) in agree.items():
            print(f"  {fam}: {k}/{n}")
    items = llava_items(0)
    same = sum(
        parse_strict_detail(resp, ch, opts).letter == parse_official_mc(resp, ch, opts, None)[0]
        for resp, ch, opts in items
    )
    print(f"llava: strict equals official (no fallback) on {same}/{len(items)}")


def time_round(items) -> float:
    t0 = time.perf_counter()
    for resp, choices, opts in items:
        parse_strict_detail(resp, choices, opts)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-n", type=int, default=900, help="responses per set (default 900)")
    ap.add_argument("--agreement", action="store_true", help="print agreement, not times")
    a = ap.parse_args(argv)
    if a.agreement:
        print_agreement()
        return 0
    for name, items in (("corpus", corpus_items(a.n)), ("llava", llava_items(a.n))):
        times = [time_round(items) for _ in range(a.rounds)]
        print(
            f"{name}: {len(items)} responses in {statistics.median(times):.3f} s "
            f"({min(times):.3f} .. {max(times):.3f} over {a.rounds} rounds)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
