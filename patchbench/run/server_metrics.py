"""The server's own Prometheus metrics (``GET /metrics``, served with ``--enable-metrics``) as a
fingerprint of a suite: counters as deltas over the suite, gauges before and after, the prefix
cache's hit share from the server's own token counters, and the server's configuration as
``/server_info`` states it (docs/serving.md, "The server's own metrics")."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from patchbench.runfolder.models import ServerMetrics

#: the counters of the hit share, named alike by sglang 0.5.1.post3 and 0.5.23 (where cached
#: tokens carry a ``cache_source`` label: the sum over it; tests/data/server_metrics/)
CACHED_TOKENS = "sglang:cached_tokens_total"
#: a suite's metric of the hit rate over one of its parts, in %, ``<name>@<part>`` (the traffic
#: suite's workloads), compared between arms like the suites' own fingerprints
HIT_PCT_METRIC = "prefix_cache_hit_pct"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
#: the ``/server_info`` keys (server arguments; on 0.5.23 also the effective limits and the
#: decode batch sizes CUDA graphs were captured for, some under ``internal_states``) that
#: change what a cell measures
CONFIG_KEYS = (
    "max_running_requests",
    "max_total_tokens",
    "max_total_num_tokens",
    "effective_max_running_requests_per_dp",
    "chunked_prefill_size",
    "schedule_policy",
    "disable_radix_cache",
    "disable_cuda_graph",
    "cuda_graph_max_bs",
    "cuda_graph_bs",
    "decode_cuda_graph_bs",
    "disable_overlap_schedule",
    "enable_deterministic_inference",
)
#: the limits the scheduler settled on, as both pins log them once at start
LOGGED_LIMITS = re.compile(
    r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
    r"max_running_requests=(\d+)"
)


@dataclass
class Snapshot:
    """One scrape: ``counters`` {sample name ending ``_total``, ``_sum`` or ``_count``: value}
    summed over label sets, ``gauges`` {name: the largest value over label sets}; sglang's own
    names only (``sglang:``); ``scrape_s``: seconds the scrape took."""

    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    scrape_s: float = 0.0


def parse(text: str) -> Snapshot:
    """Prometheus text exposition -> Snapshot; ValueError when the text is not that format.
    Only sglang's ``# TYPE`` and sample lines reach the parser, histogram buckets left out
    (unused; most of 0.5.23's text, and so of the parse time: docs/serving.md)."""
    kept = "\n".join(
        line
        for line in text.splitlines()
        if line.startswith("# TYPE sglang:")
        or (line.startswith("sglang:") and "_bucket{" not in line)
    )
    snap = Snapshot()
    for fam in text_string_to_metric_families(kept):
        for s in fam.samples:
            if not s.name.startswith("sglang:") or not math.isfinite(s.value):
                continue
            if fam.type == "gauge":
                snap.gauges[s.name] = max(snap.gauges.get(s.name, s.value), s.value)
            elif fam.type in ("counter", "histogram", "summary") and s.name.endswith(
                ("_total", "_sum", "_count")
            ):
                snap.counters[s.name] = snap.counters.get(s.name, 0.0) + s.value
    return snap


def _get(url: str, timeout_s: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read().decode("utf-8", "replace")


def scrape(base_url: str, timeout_s: float = 2.0) -> Snapshot:
    """GET ``base_url/metrics`` and parse it; OSError (unanswered, HTTP error) or ValueError."""
    t = time.monotonic()
    snap = parse(_get(base_url.rstrip("/") + "/metrics", timeout_s))
    snap.scrape_s = time.monotonic() - t
    return snap


def counter_deltas(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """{counter: after - before} for every counter of ``after`` (absent before: 0 before)."""
    return {k: v - before.counters.get(k, 0.0) for k, v in sorted(after.counters.items())}


def hit_share(deltas: dict[str, float]) -> float | None:
    """Cached prompt tokens / prompt tokens over the deltas (0-1); None without prompt tokens."""
    prompt = deltas.get(PROMPT_TOKENS, 0.0)
    return deltas.get(CACHED_TOKENS, 0.0) / prompt if prompt > 0 else None


def fingerprint(before: Snapshot, after: Snapshot) -> ServerMetrics:
    """One suite's fingerprint: counter deltas, gauges [before, after], the hit share, the
    seconds both scrapes took."""
    deltas = counter_deltas(before, after)
    names = sorted(set(before.gauges) | set(after.gauges))
    return ServerMetrics(
        cache_hit_share=hit_share(deltas),
        counters=deltas,
        gauges={g: [before.gauges.get(g), after.gauges.get(g)] for g in names},
        scrape_s=round(before.scrape_s + after.scrape_s, 4),
    )


def server_config(base_url: str, log_path: Path | None = None, timeout_s: float = 2.0) -> dict:
    """The :data:`CONFIG_KEYS` that ``/server_info`` (``/get_server_info`` on older servers) or
    its first ``internal_states`` entry states, plus ``logged_max_running_requests`` and
    ``logged_max_total_num_tokens`` from the first :data:`LOGGED_LIMITS` line of the first MiB
    of ``log_path``; OSError or ValueError when neither path answers with a JSON object."""
    err: Exception = OSError("no answer")
    for path in ("/server_info", "/get_server_info"):
        try:
            info = json.loads(_get(base_url.rstrip("/") + path, timeout_s))
        except (OSError, ValueError) as e:
            err = e
            continue
        if not isinstance(info, dict):
            continue
        states = info.get("internal_states") or [{}]
        both = {**(states[0] if isinstance(states[0], dict) else {}), **info}
        out = {k: both[k] for k in CONFIG_KEYS if k in both}
        m = _logged(log_path)
        if m:
            out["logged_max_total_num_tokens"] = int(m[1])
            out["logged_max_running_requests"] = int(m[4])
        return out
    raise err


def _logged(log_path: Path | None) -> re.Match | None:
    try:
        with open(log_path or "", "rb") as f:
            return LOGGED_LIMITS.search(f.read(1 << 20).decode("utf-8", "replace"))
    except OSError:
        return None
