#!/usr/bin/env python3
"""Replay stored nights through the nightly's old rule and its new one; list every night whose
colour changes, and why.

Old: the code at ``--old`` (default: the merge base of HEAD and ``main``), where the same-run gate
was the nightly's own one-sided t on learned pair noise with its own outlier rule and Holm
family; run in a subprocess on a ``git archive`` of that commit. New: this checkout, where the
same-run gate is the night's report verdict (each night's report computed in memory,
tools.calibration.nightly.with_report). Both gate each night against the nights before it.

Histories: ``demo`` (tests/nightly/demo_history.py's two configs), ``job``, ``builds`` and
``gates`` (the synthetic nights of tests/nightly/test_nightly.py, test_nightly_builds.py and
test_gates.py, with their settings), ``calibration`` (tools/calibration/nightly.py: per run CV and
scenario a few seeded histories of configs/nightly-h200.yaml's gates, the warm-up nights not
gated).

    PYTHONPATH=. .venv/bin/python tools/replay_nights.py [--old REV] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from patchbench.analysis.comparison import CompareSettings  # noqa: E402
from patchbench.config.nightly import NightlySettings  # noqa: E402
from patchbench.nightly.gates import evaluate, night_outcome  # noqa: E402
from patchbench.nightly.history import History, Night  # noqa: E402
from tools.calibration.nightly import Scenario, gate_metrics, sim_night, with_report  # noqa: E402

#: run in the old tree: read the histories (stdin), gate each night with the old code
OLD_SCRIPT = """
import json, sys
from patchbench.config.nightly import NightlySettings
from patchbench.nightly.gates import evaluate, night_outcome
from patchbench.nightly.history import Night
out = []
for h in json.load(sys.stdin):
    s = NightlySettings.model_validate(h["settings"])
    nights = [Night(**{**n, "values": {tuple(k.split("|")): v for k, v in n["values"].items()},
                       "units": {}, "better": {tuple(k.split("|")): v for k, v in n["better"].items()}})
              for n in h["nights"]]
    for i in range(h["first"], len(nights)):
        res = evaluate(nights[:i], nights[i], s)
        out.append([night_outcome(res), [[r.kind, r.variant, r.metric, r.status, r.reason] for r in res]])
json.dump(out, sys.stdout)
"""


def _dump(n: Night) -> dict[str, Any]:
    return {
        "run_id": n.run_id,
        "night_utc": n.night_utc,
        "config_name": n.config_name,
        "baseline": n.baseline,
        "values": {"|".join(k): v for k, v in n.values.items()},
        "better": {"|".join(k): v for k, v in n.better.items()},
        "aa_variants": n.aa_variants,
    }


def _night(i: int, values: dict, better: dict | None = None, name: str = "replay") -> Night:
    return Night(
        f"n{i:03d}",
        f"2026-{1 + i // 28:02d}-{1 + i % 28:02d}T03:00:00Z",
        name,
        "baseline",
        values=values,
        better=better or {},
    )


def histories(trials: int, seed: int) -> list[dict[str, Any]]:
    """[{name, settings, compare, nights, first}]: the nights to replay (``first``: the first
    gated)."""
    from tests.nightly import test_gates, test_nightly, test_nightly_builds
    from tests.nightly.demo_history import build_demo

    out: list[dict[str, Any]] = []
    tput = ("serving", "output_throughput_tok_s")
    with tempfile.TemporaryDirectory() as tmp, History(build_demo(tmp)) as h:
        demo = {"min_history_nights": 3, "gates": [{"metric": ".".join(tput), "threshold_pct": 5}]}
        for config in ("nightly-cpu", "nightly-cpu-small"):
            out.append(dict(name=f"demo {config}", settings=demo, nights=h.nights(config), first=0))
    job = [
        test_nightly.clean(1),
        test_nightly.clean(2),
        ([100.0, 101.0, 99.0], [90.0, 91.0, 89.0]),
        ([80.0, 81.0, 79.0], [80.0, 80.5, 79.5]),
        test_nightly.clean(5),
    ]
    kb, kv = ("baseline", *tput), ("patched", *tput)
    nights = [_night(i, {kb: b, kv: v}) for i, (b, v) in enumerate(job)]
    out.append(dict(name="job", settings=test_nightly.JOB.model_dump(), nights=nights, first=0))
    itl = ("serving", "itl_median_ms")
    builds = [([30.0, 31.0], [30.5, 31.2])] * 2 + [([30.0, 31.0], [300.0, 320.0])]
    nights = [
        _night(i, {("baseline", *itl): b, ("candidate", *itl): v}, {itl: "lower"})
        for i, (b, v) in enumerate(builds)
    ]
    out.append(
        dict(name="builds", settings=test_nightly_builds.SAME_RUN.model_dump(), nights=nights,
             first=0, compare={"min_repeats": 2})
    )  # fmt: skip
    hist = [_night(i, {kb: v}) for i, v in enumerate(test_gates.HIST)]
    for tonight in ([90.0, 91.0, 89.0], [100.0, 100.5, 99.5]):
        out.append(
            dict(name=f"gates history {tonight}", nights=[*hist, _night(9, {kb: tonight})],
                 settings=test_gates.settings(against="history").model_dump(), first=5)
        )  # fmt: skip
    same = [
        {kb: [100.0, 101.0, 99.0], kv: [90.0, 91.0, 89.0]},
        {kb: [100.0, 101.0, 99.0, 100.0, 100.0], kv: [100.5, 101.0, 99.2, 100.1, 99.9]},
        {kb: [100.0, 100.0, 100.0], kv: [110.0, 90.0, 100.0]},
        {kb: [100.0, 101.0, 99.0, 100.0], kv: [98.0, 99.0, 97.0, 98.0]},
        {kb: [100.0, 100.0, 100.0], kv: [99.0, 99.0, 78.0]},
    ]
    for prior in (None, 1.5):
        s = test_gates.settings(run_cv_pct=prior).model_dump()
        for i, v in enumerate(same):
            out.append(dict(name=f"gates same-run {i} (run_cv_pct {prior})", settings=s,
                            nights=[_night(i, v)], first=0))  # fmt: skip
    raw = yaml.safe_load((REPO / "configs" / "nightly-h200.yaml").read_text())["nightly"]
    s = NightlySettings.model_validate(raw)
    metrics = gate_metrics(s)
    for cv, reps in ((0.015, 5), (0.03, 8)):
        for label, sc in (
            ("quiet", Scenario()),
            ("abnormal runs", Scenario(abnormal=0.2)),
            ("patch step 5 %", Scenario(patch=0.05)),
            ("stock step 5 %", Scenario(stock=0.05)),
        ):
            for t in range(trials):
                rng = np.random.default_rng([seed, t])
                warm = [sim_night(i, rng, metrics, reps, cv, 0.0, Scenario()) for i in range(10)]
                gated = [sim_night(10 + i, rng, metrics, reps, cv, 0.0, sc) for i in range(4)]
                out.append(dict(name=f"calibration {100 * cv:g} % {label} #{t}", settings=raw,
                                nights=warm + gated, first=10))  # fmt: skip
    return out


def old_outcomes(hs: list[dict[str, Any]], rev: str) -> list[list[Any]]:
    """Each gated night's [outcome, results] under the code at ``rev``."""
    payload = [
        {"settings": h["settings"], "nights": [_dump(n) for n in h["nights"]], "first": h["first"]}
        for h in hs
    ]
    with tempfile.TemporaryDirectory() as tmp:
        arc = subprocess.run(
            ["git", "archive", rev, "patchbench"], cwd=REPO, check=True, capture_output=True
        ).stdout
        with tempfile.TemporaryFile() as f:
            f.write(arc)
            f.seek(0)
            tarfile.open(fileobj=f).extractall(tmp, filter="data")
        p = subprocess.run(
            [sys.executable, "-c", OLD_SCRIPT],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
            cwd=tmp,  # not this checkout: "-c" puts the working folder first on the path
            check=True,
        )
    return json.loads(p.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", help="the old rule's commit (default: merge base of HEAD and main)")
    ap.add_argument("--trials", type=int, default=3, help="calibration histories per row")
    ap.add_argument("--seed", type=int, default=20260101)
    a = ap.parse_args(argv)
    rev = (
        a.old
        or subprocess.run(
            ["git", "merge-base", "HEAD", "main"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    hs = histories(a.trials, a.seed)
    old = iter(old_outcomes(hs, rev))
    counts: dict[tuple[str, str], int] = {}
    print(f"old rule: {rev[:12]}; new rule: this checkout\n")
    print("| history | night | old | new | why (new gate results that differ) |")
    print("|---|---|---|---|---|")
    for h in hs:
        s = NightlySettings.model_validate(h["settings"])
        cmp = CompareSettings.model_validate(h.get("compare") or {})
        nights = h["nights"]
        for i in range(h["first"], len(nights)):
            tonight = with_report(nights[i], cmp)
            res = evaluate(nights[:i], tonight, s)
            new = night_outcome(res)
            before, old_res = next(old)
            counts[(before, new)] = counts.get((before, new), 0) + 1
            if before == new:
                continue
            was = {(k, v, m): st for k, v, m, st, _ in old_res}
            why = "; ".join(
                f"{r.kind} {r.variant} {r.metric}: {was.get((r.kind, r.variant, r.metric))} -> "
                f"{r.status} ({r.reason})"
                for r in res
                if was.get((r.kind, r.variant, r.metric)) != r.status
            )
            print(f"| {h['name']} | {tonight.run_id} | {before} | {new} | {why} |", flush=True)
    print("\n| old -> new | nights |\n|---|---:|")
    for (o, n), c in sorted(counts.items()):
        print(f"| {o} -> {n} | {c} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
