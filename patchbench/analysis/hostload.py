"""The host a run measured on and whether its load made the speed rows unreliable
(:func:`host_load`; the rule, :func:`load_warnings`, is stated in docs/design.md, "The host in
the report")."""

from __future__ import annotations

import math
import statistics

from patchbench.analysis.comparison import CellLoad, Comparison, HostLoad, Row
from patchbench.analysis.rundata import RunData

#: busy: a timed cell's load above this many runnable processes per usable CPU
BUSY_LOAD_PER_CPU = 2.0
#: uneven: the arms' mean loads apart by more than this share of the usable CPUs
UNEVEN_LOAD_SHARE = 0.5


def host_load(data: RunData, cmp: Comparison) -> HostLoad:
    """The host of ``data`` (the manifest's ``host``), each timed cell's load in the order the
    cells ran, and the warnings of :func:`load_warnings` on the judged rows of ``cmp``."""
    h = data.manifest.host
    out = HostLoad(
        cpu_count=h.cpu_count, cpu_usable=h.cpu_usable, memory_total_gib=h.memory_total_gib
    )
    seen = set()
    for e in data.manifest.cells:
        key = (e.variant, e.repeat)
        rec = data.cells.get(key) if e.cell_kind == "timed" and key not in seen else None
        seen.add(key)
        if rec is not None and rec.load_avg_1m is not None:
            la = rec.load_avg_1m
            out.cells.append(
                CellLoad(variant=e.variant, repeat=e.repeat, start=la.start, end=la.end)
            )
    out.warnings = load_warnings(out, cmp)
    return out


def speed_rows(cmp: Comparison) -> list[Row]:
    """The run-level primaries that got an interval from their repeats (a percent change, the
    sd of their paired log ratios, at least ``compare.min_repeats`` pairs, a margin)."""
    return [
        r
        for r in cmp.rows_for(primary=True)
        if r.kind == "run"
        and r.change_unit == "%"
        and r.log_ratio_sd is not None
        and r.margin is not None
        and r.n_pairs >= cmp.settings.min_repeats
    ]


def load_warnings(host: HostLoad, cmp: Comparison) -> list[str]:
    """One sentence per condition that makes the speed rows of ``cmp`` unreliable (busy, uneven,
    noisy: docs/design.md, "The host in the report"), [] when none."""
    out = []
    cores = host.cores()
    loads = host.readings()
    if cores and loads and max(loads) > BUSY_LOAD_PER_CPU * cores:
        out.append(
            f"the host was oversubscribed during timed cells (1-minute load average up to "
            f"{max(loads):.1f} on {cores} usable CPU{'s' if cores != 1 else ''}): speed rows "
            "measure the other work as much as the change; rerun on an idle host"
        )
    base = host.readings(cmp.baseline)
    for v in cmp.variants if cores and base else []:
        mine = host.readings(v)
        if not mine:
            continue
        mb, mv = statistics.fmean(base), statistics.fmean(mine)
        if abs(mv - mb) > UNEVEN_LOAD_SHARE * cores and max(mb, mv) > cores:
            out.append(
                f"{cmp.baseline}'s timed cells ran under a load of {mb:.1f}, {v}'s under "
                f"{mv:.1f} (mean 1-minute load average, {cores} usable CPUs): speed rows "
                "compare a busy host with a quiet one; rerun on an idle host"
            )
    rows = speed_rows(cmp)
    if rows:
        cv = 100 * statistics.median(r.log_ratio_sd for r in rows) / math.sqrt(2)
        margin = statistics.median(r.margin for r in rows)
        if cv > margin:
            out.append(
                f"the speed rows' run-to-run CV ({cv:.1f}%) is above their margin "
                f"({margin:g}%): this run cannot tell a change of that size from noise; rerun "
                "on an idle host or with more repeats"
            )
    return out
