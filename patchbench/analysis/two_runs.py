"""``patchbench compare RUN_A RUN_B``: one run's variant against another run's baseline, by an
unpaired Welch interval on the per-run log values (the repeats of two runs do not pair)."""

from __future__ import annotations

from pathlib import Path

from patchbench.analysis.build import guess_metric_info, read_run, suite_declarations
from patchbench.runfolder import RunFolderError

UNPAIRED_NOTE = (
    "unpaired: the two runs were not interleaved, so machine drift between them is "
    "not cancelled; Welch interval on per-run log values"
)


def protocol_differences(a: dict, b: dict) -> list[str]:
    """Differences between two manifests' effective configs that make numbers incomparable
    (sglang, model, server, suite parameters, GPU); "what: A=..., B=..." lines."""
    diffs = []
    ca, cb = a.get("config") or {}, b.get("config") or {}
    for key in ("sglang", "model", "server"):
        if ca.get(key) != cb.get(key):
            diffs.append(f"{key}: A={ca.get(key)!r}, B={cb.get(key)!r}")
    sa, sb = ca.get("suites") or {}, cb.get("suites") or {}
    for s in sorted(set(sa) & set(sb)):
        for k in sorted(set(sa[s] or {}) | set(sb[s] or {})):
            if (sa[s] or {}).get(k) != (sb[s] or {}).get(k):
                diffs.append(
                    f"suites.{s}.{k}: A={(sa[s] or {}).get(k)!r}, B={(sb[s] or {}).get(k)!r}"
                )
    if (a.get("gpu") or None) != (b.get("gpu") or None):
        diffs.append(f"GPU: A={a.get('gpu')!r}, B={b.get('gpu')!r}")
    return diffs


def compare_runs(run_a: Path, run_b: Path, variant: str | None = None, alpha: float = 0.05) -> dict:
    """{"a", "b", "variant", "method", "differences", "rows": [{"suite", "metric", "kind", "n_a",
    "n_b", "change_pct", "low_pct", "high_pct", "p", "note"}]}: A's baseline vs B's ``variant``
    (default: B's first), percent (None: not compared, ``note`` says why). Raises RunFolderError
    / SchemaTooNew (exit 2)."""
    from patchbench.analysis.verdicts import welch_log

    da, db = read_run(run_a), read_run(run_b)
    v = variant or next(iter(db.variants[1:]), db.baseline)
    if v not in db.variants:
        raise RunFolderError(f"{run_b}: no variant '{v}'; variants: {', '.join(db.variants)}")
    rows = []
    for suite in [s for s in da.suites if s in db.suites]:
        _, declared = suite_declarations(suite, [])
        names = sorted(
            {m for (_v, _k, s), sm in da.summaries.items() if s == suite and sm for m in sm.metrics}
        )
        for m in names:
            info = declared.get(m) or guess_metric_info(m)
            xa = [
                x
                for k in range(da.repeats)
                if (x := da.value(da.baseline, k, suite, m)) is not None
            ]
            xb = [x for k in range(db.repeats) if (x := db.value(v, k, suite, m)) is not None]
            row = {
                "suite": suite,
                "metric": m,
                "kind": info.kind,
                "n_a": len(xa),
                "n_b": len(xb),
                "change_pct": None,
                "low_pct": None,
                "high_pct": None,
                "p": None,
                "note": "",
            }
            if info.kind == "run" and xa and xb and min(xa + xb) > 0:
                try:
                    ch, lo, hi, p = welch_log(xa, xb, alpha)
                    row.update(change_pct=100 * ch, low_pct=100 * lo, high_pct=100 * hi, p=p)
                except ValueError as e:
                    row["note"] = str(e)
            else:
                row["note"] = (
                    "not a run-level metric with positive values: not compared across runs"
                )
            rows.append(row)
    return {
        "a": str(run_a),
        "b": str(run_b),
        "variant": v,
        "method": UNPAIRED_NOTE,
        "differences": protocol_differences(
            da.manifest.model_dump(mode="json", by_alias=True),
            db.manifest.model_dump(mode="json", by_alias=True),
        ),
        "rows": rows,
    }


def format_result(res: dict) -> str:
    """The console text of :func:`compare_runs`'s result."""
    lines = [res["method"]]
    lines += [f"protocol differs: {d}" for d in res["differences"]]
    for r in res["rows"]:
        if r["change_pct"] is not None:
            lines.append(
                f"{r['suite']}/{r['metric']}: {r['change_pct']:+.1f}% "
                f"[{r['low_pct']:+.1f}%, {r['high_pct']:+.1f}%] (n={r['n_a']}/{r['n_b']})"
            )
    return "\n".join(lines)
