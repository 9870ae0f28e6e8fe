"""How the dashboard scales with the history: ``python tools/dashboard_scale.py N [N ...]``
writes a realistic synthetic history of N nights per N and builds the site from it in a fresh
process, twice (the first build into an empty folder, then the next night's build into the same
folder with one night more), and prints per build the time, the peak resident memory of that
process (``resource.getrusage(RUSAGE_SELF).ru_maxrss``), the largest file written and the total
weight of the site (``.html`` pages; the plotly bundle; everything).

The history: one config (``scale``), three variants (the baseline ``stock``, ``patched``,
``patched-b``), 20 serving metrics (the four primaries gated), five repeats a night, a night a
day with a manual rerun every 50th night, a release change every 120 nights, a red night every
37th, and per night a run folder as the nightly job leaves it: ``nightly.json`` (outcome,
gates with their windows, failing gates), ``nightly.md``, ``report.md``, ``report-details.md``
and two small trend plots, plus the night's builds (release and patch state).

``--quick`` (for tests): no second build.
"""

from __future__ import annotations

import json
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

#: the gated primaries, then 16 more serving metrics (20 in all)
PRIMARY = ("output_throughput_tok_s", "itl_median_ms", "ttft_median_ms", "e2e_latency_median_ms")
MORE = tuple(
    f"{q}_{s}_ms" for q in ("ttft", "itl", "tpot", "e2e_latency") for s in ("mean", "p90", "p99")
) + ("request_throughput_req_s", "input_throughput_tok_s", "total_throughput_tok_s", "itl_max_ms")
METRICS = PRIMARY + MORE
VARIANTS = ("stock", "patched", "patched-b")
#: a tiny valid PNG (1x1), the stand-in of a trend plot
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
)


def _level(metric: str) -> float:
    return 100.0 if "throughput" in metric else 50.0


def make_history(root: Path, nights: int) -> Path:
    """``nights`` synthetic nights of config ``scale`` (module docstring) under ``root``:
    ``root/h.sqlite`` and ``root/runs/<run id>/``; returns the history's path."""
    from patchbench.nightly.history import History, Night, record_night_builds

    rng = random.Random(0)
    t0 = datetime(2000, 1, 1, 3, tzinfo=timezone.utc)
    path = root / "h.sqlite"
    runs = root / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    window: list[str] = []
    with History(path) as h:
        h._db.execute("PRAGMA synchronous = OFF")  # synthetic data: no fsync per night
        for k in range(nights):
            rerun = k % 50 == 49  # a manual rerun 40 minutes after the night before it
            t = t0 + timedelta(days=k - (k + 1) // 50, minutes=40 if rerun else 0)
            run_id = f"{t:%Y%m%dT%H%M%SZ}-scale"
            release = f"0.5.{k // 120}"
            red = k % 37 == 36
            n = Night(
                run_id=run_id,
                night_utc=f"{t:%Y-%m-%dT%H:%M:%SZ}",
                config_name="scale",
                baseline="stock",
                sglang_version=release,
                run_dir=str(runs / run_id),
            )
            step = 1.0 + 0.02 * (k // 120 % 3)
            for v in VARIANTS:
                slow = 0.9 if red and v == "patched" else 1.0
                for m in METRICS:
                    lvl = _level(m) * step * (slow if "throughput" in m else 1 / slow)
                    n.values[(v, "serving", m)] = [rng.gauss(lvl, lvl * 0.01) for _ in range(5)]
            for m in METRICS:
                n.units[("serving", m)] = (
                    "tok/s" if "tok_s" in m else ("req/s" if "req_s" in m else "ms")
                )
                n.better[("serving", m)] = "higher" if "throughput" in m else "lower"
            h.record(n)
            record_night_builds(
                h,
                run_id,
                [
                    {"variant": v, "sglang_release": release, "patch": None if v == "stock" else f"p-{v}",
                     "state": "" if v == "stock" else "applies",
                     "detail": "" if v == "stock" else f"verified against sglang {release} wheel "
                     + "(sha256 " + "ab" * 16 + ")"}
                    for v in VARIANTS
                ],
            )  # fmt: skip
            _run_folder(runs / run_id, n, red, window[-14:])
            if not red:
                window.append(run_id)
    return path


def _run_folder(run: Path, n, red: bool, window: list[str]) -> None:
    """The files the nightly job leaves in a night's run folder (those the page reads)."""
    run.mkdir(parents=True, exist_ok=True)
    gates, failing = [], []
    for m in PRIMARY:
        for v in VARIANTS[1:]:
            for kind in ("same_run", "history"):
                bad = red and v == "patched" and kind == "same_run"
                g = {
                    "gate": f"serving.{m}", "kind": kind, "variant": v, "suite": "serving",
                    "metric": m, "status": "fail" if bad else "pass", "reason": "synthetic",
                    "better": n.better[("serving", m)], "threshold_pct": 5.0,
                    "change_pct": -10.0 if bad else 0.3, "reference": _level(m),
                    "window_run_ids": window if kind == "history" else [],
                }  # fmt: skip
                gates.append(g)
                if bad:
                    failing.append(g)
    doc = {
        "outcome": "red" if red else "green",
        "exit_code": 1 if red else 0,
        "headline": "red" if red else "green",
        "gates": gates,
        "failing": failing,
    }
    (run / "nightly.json").write_text(json.dumps(doc))
    rows = "\n".join(f"| serving.{m} | pass | 0.3 % |" for m in METRICS)
    (run / "nightly.md").write_text(
        f"# Nightly {n.run_id}\n\nHistory: `{run.parent.parent / 'h.sqlite'}` (run folder "
        f"`{run}`)\n\n| gate | status | change |\n|---|---|---|\n{rows}\n\n"
        "[report](report.md) · [details](report-details.md)\n\n"
        "Trend plots (in the run artifact): `plots/nightly-serving.output_throughput_tok_s.png`\n"
    )
    (run / "report.md").write_text(
        f"# A/B report {n.run_id}\n\n| metric | change |\n|---|---|\n{rows}\n"
    )
    (run / "report-details.md").write_text(f"# Details {n.run_id}\n\n" + "text line\n" * 200)
    (run / "plots").mkdir(exist_ok=True)
    for m in PRIMARY[:2]:
        (run / "plots" / f"nightly-serving.{m}.png").write_bytes(PNG)


def add_night(root: Path) -> None:
    """One night more (the next night's build): a copy of the latest night, a day later."""
    from patchbench.nightly.history import History, night_infos, open_history

    with open_history(root / "h.sqlite") as h:
        last = night_infos(h, "scale")[-1]
        night = h.nights("scale")[-1]
    t = datetime.strptime(last.night_utc, "%Y-%m-%dT%H:%M:%SZ") + timedelta(days=1)
    src = Path(str(last.run_dir))
    night.run_id = f"{t:%Y%m%dT%H%M%SZ}-scale"
    night.night_utc = f"{t:%Y-%m-%dT%H:%M:%SZ}"
    night.run_dir = str(src.parent / night.run_id)
    shutil.copytree(src, night.run_dir)
    with History(root / "h.sqlite") as h:
        h.record(night)


def build(history: str, out: str) -> dict:
    """Build the site (in this process) and measure it."""
    from patchbench.nightly.dashboard import build_site

    t = time.monotonic()
    build_site(history, out)
    took = time.monotonic() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before walking the site
    files = [p for p in Path(out).rglob("*") if p.is_file()]
    big = max(files, key=lambda p: p.stat().st_size)
    pages = [p for p in files if p.suffix == ".html"]
    js = [p for p in files if p.suffix == ".js"]
    big_page = max(pages, key=lambda p: p.stat().st_size)
    mb = 2**20
    return {
        "build_s": round(took, 1),
        "peak_rss_mb": round(peak),
        "largest_file": str(big.relative_to(out)),
        "largest_mb": round(big.stat().st_size / mb, 2),
        "largest_page": str(big_page.relative_to(out)),
        "largest_page_mb": round(big_page.stat().st_size / mb, 2),
        "pages": len(pages),
        "pages_mb": round(sum(p.stat().st_size for p in pages) / mb, 1),
        "plotly_mb": round(sum(p.stat().st_size for p in js) / mb, 2),
        "site_mb": round(sum(p.stat().st_size for p in files) / mb, 1),
    }


def _build_in_child(hist: Path, site: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--build", str(hist), str(site)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--build"]:
        print(json.dumps(build(argv[1], argv[2])))
        return 0
    quick = "--quick" in argv
    for n in [int(a) for a in argv if a != "--quick"] or [60, 365, 1000, 10000]:
        with tempfile.TemporaryDirectory() as d:
            t = time.monotonic()
            hist = make_history(Path(d), n)
            print(f"{n} nights: history made in {time.monotonic() - t:.0f} s", flush=True)
            print(f"{n} nights, first build: {json.dumps(_build_in_child(hist, Path(d) / 'site'))}")
            if not quick:
                add_night(Path(d))
                got = _build_in_child(hist, Path(d) / "site")
                print(f"{n + 1} nights, next night's build: {json.dumps(got)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
