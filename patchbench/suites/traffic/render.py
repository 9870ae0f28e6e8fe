"""report.md's "Traffic workloads (traffic)": per variant and workload the requests sent, the
prefix-cache hit rate of each arm (the server's counters) and the changes of output throughput,
median TTFT and median ITL, rendered from the comparison's rows alone (docs/traffic.md)."""

from __future__ import annotations

from typing import Any

from patchbench.suite import comparison_get, suite_rows

#: the changes shown per workload: (metric, column title)
SHOWN = (
    ("output_throughput_tok_s", "output throughput"),
    ("ttft_median_ms", "median TTFT"),
    ("itl_median_ms", "median ITL"),
)
SUITE = "traffic"


def _rows(comparison: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["metric"], r["variant"]): r for r in suite_rows(comparison, SUITE)}


def _change(r: dict[str, Any] | None) -> str:
    if r is None or r.get("change") is None:
        return "n/a"
    verdict = r.get("verdict") or ""
    shown = f"{r['change']:+.1f}%"
    return shown if not r.get("primary") or verdict == "inconclusive" else f"{shown} {verdict}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}%"


def report_section(comparison: Any) -> list[str]:
    """The section's markdown lines; [] without traffic rows. A workload's speed rows with fewer
    paired repeats than ``compare.min_repeats`` are said to be descriptive."""
    rows = _rows(comparison)
    workloads = list(  # in the rows' order: the config's
        dict.fromkeys(
            m.partition("@")[2]
            for m, _v in rows
            if m.startswith(("prefix_cache_hit_pct@", "output_throughput_tok_s@"))
        )
    )
    variants = [v for v in comparison_get(comparison, "variants", []) or [] if v]
    if not workloads or not variants:
        return []
    need = int((comparison_get(comparison, "settings", {}) or {}).get("min_repeats", 3))
    lines = [
        "## Traffic workloads (traffic)",
        "",
        "Each workload after a cache flush, a warm-up and a prime; the hit rate from the server's "
        "own cached / prompt token counters over the measured call (docs/traffic.md).",
        "",
        "| variant | workload | requests | prefix-cache hit (baseline / variant) | "
        + " | ".join(t for _m, t in SHOWN)
        + " |",
        "|---|---|---|---|" + "---|" * len(SHOWN),
    ]
    few = False
    for v in variants:
        for w in workloads:
            hit = rows.get((f"prefix_cache_hit_pct@{w}", v)) or {}
            sent = rows.get((f"completed_count@{w}", v)) or {}
            n = sent.get("variant_value")
            changes = [_change(rows.get((f"{m}@{w}", v))) for m, _t in SHOWN]
            thr = rows.get((f"output_throughput_tok_s@{w}", v)) or {}
            few = few or int(thr.get("n_pairs") or 0) < need
            lines.append(
                f"| {v} | {w} | {'n/a' if n is None else f'{n:g}'} | "
                f"{_pct(hit.get('baseline_value'))} / {_pct(hit.get('variant_value'))} | "
                + " | ".join(changes)
                + " |"
            )
    if few:
        lines += [
            "",
            f"Fewer than {need} paired repeats of a workload: its changes are descriptive, not "
            'verdicts (report-details.md, "Secondary metrics", has every row).',
        ]
    return lines + [""]
