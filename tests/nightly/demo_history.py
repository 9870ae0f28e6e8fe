"""A demo nightly history from synthetic run folders (tests.synthetic), for the dashboard's
test and its screenshot (scripts/dashboard_screenshot.py). Nothing here starts a server.

:func:`build_demo` writes two configs: ``nightly-cpu`` (12 nights; sglang 0.5.1.post3 for six,
then 0.5.23 with stock 8 % slower from that night on, a change point the detector finds; the last
night red: the patched variant 10 % slower than stock) and ``nightly-cpu-small`` (3 green nights,
the run folder of the oldest deleted). Each night has ``nightly.json``, ``nightly.md`` and
``report.md`` as the nightly job writes them (only the fields the page reads), and a
``night_builds`` row per variant (release and patch state) unless ``builds=False``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from patchbench import records
from patchbench.nightly.changepoints import detect_history
from patchbench.nightly.gates import GateResult
from patchbench.nightly.history import (
    History,
    night_from_run,
    record_change_points,
    record_night_builds,
)
from tests.synthetic import make_throughput_night

TPUT = "output_throughput_tok_s"
TTFT = "ttft_median_ms"
#: (config, nights, index of the first 0.5.23 night or None, red night indices)
DEMO = (("nightly-cpu", 12, 6, (11,)), ("nightly-cpu-small", 3, None, ()))
RELEASES = ("0.5.1.post3", "0.5.23")


def _values(rng: np.random.Generator, level: float, repeats: int = 5) -> list[float]:
    return [round(float(level * np.exp(rng.normal(0, 0.01))), 2) for _ in range(repeats)]


def _gates(base: list[float], var: list[float], red: bool) -> list[GateResult]:
    b, v = float(np.median(base)), float(np.median(var))
    chg = 100.0 * (v / b - 1)
    same = GateResult(
        gate=f"serving.{TPUT}",
        kind="same_run",
        variant="patched",
        suite="serving",
        metric=TPUT,
        status="fail" if red else "pass",
        reason=f"{chg:+.1f} % vs stock tonight" + (" (threshold -5 %)" if red else ""),
        unit="tok/s",
        better="higher",
        threshold_pct=5.0,
        value=v,
        reference=b,
        change_pct=chg,
        p_value=0.0004 if red else 0.4,
        n=len(var),
    )
    hist = GateResult(
        gate=f"serving.{TPUT}",
        kind="history",
        variant="baseline",
        suite="serving",
        metric=TPUT,
        status="pass",
        reason="within the window's noise",
        unit="tok/s",
        better="higher",
        threshold_pct=5.0,
        value=b,
        n=len(base),
    )
    return [same, hist]


def _write_night_files(run: Path, run_id: str, config: str, day: int, gates: list[GateResult]):
    red = any(g.status == "fail" for g in gates)
    outcome = "red" if red else "green"
    headline = "REGRESSION: 1 gate failed" if red else "no regression"
    failing = [g for g in gates if g.status == "fail"]
    records.write_json(
        run / "nightly.json",
        {
            "schema": 2,
            "run_id": run_id,
            "night_utc": f"2026-01-{day:02d}T03:00:00Z",
            "config_name": config,
            "exit_code": 1 if red else 0,
            "outcome": outcome,
            "headline": headline,
            "failing": [g.to_json() for g in failing],
            "gates": [g.to_json() for g in gates],
        },
    )
    rows = "\n".join(
        f"| {g.gate} | {g.kind} | {g.variant} | {g.status} | {g.change_pct or 0:+.2f} % | {g.reason} |"
        for g in gates
    )
    records.write_text(
        run / "nightly.md",
        f"# Nightly {config}: {headline}\n\nRun `{run_id}`; the full report: "
        f"[report.md](report.md).\n\n| gate | kind | variant | status | change | reason |\n"
        f"|---|---|---|---|---|---|\n{rows}\n",
    )
    records.write_text(
        run / "report.md",
        f"# Report {run_id}\n\nSynthetic demo night ({config}); back to the "
        f"[nightly summary](nightly.md).\n",
    )


def build_demo(root: str | Path, *, builds: bool = True, seed: int = 7) -> Path:
    """Write the demo's run folders under ``root/runs`` and its history ``root/history.sqlite``
    (module docstring); returns the history's path. Deterministic for a given ``seed``."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    path = root / "history.sqlite"
    with History(path) as h:
        for config, count, switch, reds in DEMO:
            nights = []
            for i in range(count):
                day = i + 1
                run_id = f"202601{day:02d}T030000Z-{config}"
                new = switch is not None and i >= switch
                stock = 100.0 * (0.92 if new else 1.0)
                patched = stock * (0.9 if i in reds else 1.03)
                base, var = _values(rng, stock), _values(rng, patched)
                run = make_throughput_night(
                    root / "runs",
                    run_id,
                    f"2026-01-{day:02d}T03:00:00Z",
                    base,
                    var,
                    name=config,
                    sglang=RELEASES[1] if new else RELEASES[0],
                    metrics={
                        "serving": {
                            TPUT: {"baseline": base, "patched": var},
                            TTFT: {"baseline": _values(rng, 50.0), "patched": _values(rng, 48.0)},
                        }
                    },
                )
                _write_night_files(run, run_id, config, day, _gates(base, var, i in reds))
                night = night_from_run(run)
                h.record(night)
                nights.append(night)
                if builds:
                    _add_builds(h, run_id, RELEASES[1] if new else RELEASES[0])
            keys = [("baseline", "serving", TPUT), ("patched", "serving", TPUT)]
            better = {("serving", TPUT): "higher"}
            points = detect_history(nights, keys, better)
            record_change_points(h, config, nights[-1].run_id, [p.to_json() for p in points])
    shutil.rmtree(root / "runs" / "20260101T030000Z-nightly-cpu-small")
    return path


def _add_builds(h: History, run_id: str, release: str) -> None:
    """One ``night_builds`` row per variant (:func:`patchbench.nightly.history.record_night_builds`):
    stock has no patch, patched's applies there and was verified in the run."""
    record_night_builds(
        h,
        run_id,
        [
            {
                "variant": "baseline",
                "sglang_release": release,
                "patch": "",
                "state": "",
                "detail": "",
            },
            {
                "variant": "patched",
                "sglang_release": release,
                "patch": "mrope-sync-free",
                "state": "applies",
                "detail": "verified",
            },
        ],
    )


__all__ = ["DEMO", "build_demo"]
