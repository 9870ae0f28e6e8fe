"""The arms' server fingerprints compared (:func:`server_fingerprints`): each timed suite's
prefix-cache hit share and counter increases from the server's ``/metrics``, and the server's
configuration from ``/server_info``, baseline against each variant. Differences are named, never
corrected (docs/serving.md, "The server's own metrics")."""

from __future__ import annotations

import statistics
from typing import Any

from patchbench.analysis.comparison import Comparison, ServerFingerprints
from patchbench.analysis.rundata import RunData
from patchbench.run.server_metrics import CACHED_TOKENS, HIT_PCT_METRIC

#: hit shares of two arms more than this many percentage points apart are flagged in the answer
HIT_SHARE_POINTS = 5.0
#: a counter's mean increase per suite differing by more than this share of the larger (and by
#: at least one) is named in report-details.md
COUNTER_TOLERANCE = 0.10


def _judged(counter: str) -> bool:
    """Counters compared between arms: not timings (the suites judge speed), not the cached
    tokens (the hit share judges them), not HTTP requests and responses (0.5.23's
    ``sglang:http_*``: they count the harness's own heartbeat and scrapes, which follow the
    suite's duration)."""
    return (
        "seconds" not in counter
        and counter != CACHED_TOKENS
        and not counter.startswith("sglang:http_")
    )


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def server_fingerprints(data: RunData, cmp: Comparison) -> ServerFingerprints | None:
    """The fingerprints of ``data``'s timed cells compared (None when no cell has one):
    per suite and arm the mean hit share and mean counter increases; ``warnings`` (for the
    answer) name hit shares more than :data:`HIT_SHARE_POINTS` apart and differing server
    configurations, ``differences`` (report-details.md) counters beyond
    :data:`COUNTER_TOLERANCE`."""
    recs = {
        v: [c for (cv, _), c in sorted(data.cells.items()) if cv == v and c] for v in data.variants
    }
    if not any(c.server_metrics for cs in recs.values() for c in cs):
        return None
    out = ServerFingerprints()
    for suite in data.suites:
        fps = {
            v: [c.server_metrics[suite] for c in cs if suite in c.server_metrics]
            for v, cs in recs.items()
        }
        if not any(fps.values()):
            continue
        out.hit_share[suite] = {
            v: _mean([f.cache_hit_share for f in fs if f.cache_hit_share is not None])
            for v, fs in fps.items()
        }
        out.counters[suite] = {
            v: {
                k: statistics.fmean(f.counters.get(k, 0.0) for f in fs if not f.error)
                for k in sorted({k for f in fs for k in f.counters})
            }
            for v, fs in fps.items()
            if any(not f.error for f in fs)
        }
    base = cmp.baseline
    out.config = {
        v: next((c.server_config for c in cs if c.server_config), {}) for v, cs in recs.items()
    }
    for v in cmp.variants:
        out.warnings += _config_differences(base, v, out.config[base], out.config[v])
        for suite, per in out.hit_share.items():
            hb, hv = per.get(base), per.get(v)
            if hb is not None and hv is not None and 100 * abs(hv - hb) > HIT_SHARE_POINTS:
                out.warnings.append(
                    f"{suite}: the prefix-cache hit rate was {100 * hb:.1f}% on {base} and "
                    f"{100 * hv:.1f}% on {v} (the server's cached / prompt token counters), more "
                    f"than {HIT_SHARE_POINTS:g} points apart: the speed rows compare "
                    "different cache states (the change may alter caching; nothing is corrected)"
                )
        for r in cmp.rows:  # a suite's parts (the traffic suite's workloads), each its own
            part = r.metric.partition("@")
            b, x = r.baseline_value, r.variant_value
            if r.variant == v and part[0] == HIT_PCT_METRIC and None not in (b, x):
                if abs(x - b) > HIT_SHARE_POINTS:
                    out.warnings.append(
                        f"{r.suite} {part[2]}: the prefix-cache hit rate was {b:.1f}% on {base} "
                        f"and {x:.1f}% on {v} (the server's counters over its measured calls), "
                        f"more than {HIT_SHARE_POINTS:g} points apart (nothing is corrected)"
                    )
        for suite, per in out.counters.items():
            if base in per and v in per:
                out.differences += _counter_differences(suite, base, v, per[base], per[v])
    return out


def _counter_differences(
    suite: str, base: str, v: str, cb: dict[str, float], cv: dict[str, float]
) -> list[str]:
    """One sentence per judged counter whose mean increases differ beyond the tolerance."""
    out = []
    for k in sorted(set(cb) | set(cv)):
        b, x = cb.get(k, 0.0), cv.get(k, 0.0)
        if _judged(k) and abs(x - b) >= 1 and abs(x - b) > COUNTER_TOLERANCE * max(abs(b), abs(x)):
            out.append(f"{suite}: {k} rose by {b:g} per suite on {base}, {x:g} on {v}")
    return out


def _config_differences(base: str, v: str, cb: dict[str, Any], cv: dict[str, Any]) -> list[str]:
    """One sentence per /server_info key whose value differs between the two arms."""
    if "error" in cb or "error" in cv:
        return []
    return [
        f"{v}'s server ran with {k} = {cv.get(k)!r}, {base}'s with {cb.get(k)!r} (/server_info or the log)"
        for k in sorted(set(cb) | set(cv))
        if cb.get(k) != cv.get(k)
    ]
