"""How the dashboard scales with the history: ``python tools/dashboard_scale.py N [N ...]``
writes a synthetic history of N nights (one config, two variants, two metrics, five repeats a
night; no run folders, so no night pages are copied) and builds the site from it in a fresh
process per N; prints the build time, the peak resident memory of that process
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) and the largest file written."""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path


def make_history(path: Path, nights: int) -> None:
    """``nights`` synthetic nights of config ``scale`` into the SQLite history at ``path``."""
    from patchbench.nightly.history import History, Night

    rng = random.Random(0)
    t0 = datetime(2000, 1, 1, 3, tzinfo=timezone.utc)
    with History(path) as h:
        for k in range(nights):
            t = t0 + timedelta(days=k)
            n = Night(
                run_id=f"{t:%Y%m%dT%H%M%SZ}-scale",
                night_utc=f"{t:%Y-%m-%dT%H:%M:%SZ}",
                config_name="scale",
                baseline="baseline",
                sglang_version="0.5.23",
            )
            for v in ("baseline", "patched"):
                n.values[(v, "serving", "output_throughput_tok_s")] = [
                    rng.gauss(100, 1) for _ in range(5)
                ]
                n.values[(v, "serving", "ttft_median_ms")] = [rng.gauss(50, 1) for _ in range(5)]
            n.units[("serving", "output_throughput_tok_s")] = "tok/s"
            n.units[("serving", "ttft_median_ms")] = "ms"
            h.record(n)


def build(history: str, out: str) -> dict:
    """Build the site (in this process) and measure it."""
    from patchbench.nightly.dashboard import build_site

    t = time.monotonic()
    build_site(history, out)
    took = time.monotonic() - t
    files = [p for p in Path(out).rglob("*") if p.is_file()]
    big = max(files, key=lambda p: p.stat().st_size)
    return {
        "build_s": round(took, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "largest_file": str(big.relative_to(out)),
        "largest_mb": round(big.stat().st_size / 2**20, 2),
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--build"]:
        print(json.dumps(build(argv[1], argv[2])))
        return 0
    for n in [int(a) for a in argv] or [1000, 10000]:
        with tempfile.TemporaryDirectory() as d:
            hist = Path(d) / "h.sqlite"
            make_history(hist, n)
            out = subprocess.run(
                [sys.executable, __file__, "--build", str(hist), str(Path(d) / "site")],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            print(f"{n} nights: {out.strip()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
