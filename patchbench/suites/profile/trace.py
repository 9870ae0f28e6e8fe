"""Decode-step analysis of a torch-profiler Chrome trace (pure: no server, no torch).

Decode steps are the ``patchbench::decode_step bs=N`` ranges of this suite's in-server hook, else
sglang 0.5.23's own ``step[DECODE bs=N ...]`` annotations (which miss the mrope work); what is
counted: docs/profile.md, "What is counted"."""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median, median_high
from typing import Any

STEP_PREFIX = "patchbench::decode_step"
MROPE_PREFIX = "patchbench::mrope"
#: the harness's own in-server instrumentation (the sync probe's cross-check): syncs inside it are
#: ours, not sglang's, and are never counted
INSTR_PREFIX = "patchbench::instrumentation"
_BS_RE = re.compile(r"\bbs=(\d+)")
_SGL_STEP_RE = re.compile(r"^step\[DECODE bs=(\d+)")

_SYNC_CALLS = {"cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize"}
#: host events that are a sync by name (the name is the kind)
SYNC_NAMES = {"aten::item", "aten::_local_scalar_dense", "cudaMemcpy", *_SYNC_CALLS}
DTOH_PAGEABLE = "Memcpy DtoH (Device -> Pageable)"
HTOD_PAGEABLE = "Memcpy HtoD (Pageable -> Device)"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
_COPY_KINDS = {"memcpy_dtoh_pageable", "h2d_blocking", "cudaMemcpy"}


class TraceError(ValueError):
    """The file is not a Chrome trace this module can read (message names the file and why)."""


@dataclass
class Step:
    """One decode step (times in microseconds unless the name says otherwise).

    batch_size: from the range name (None when absent); ts_us / host_us: the host range; syncs:
    sync points; by_kind: sync events per kind; mrope_*: the same inside mrope ranges;
    gpu_start_us / gpu_end_us: the step's GPU work (None on a CPU trace); first_launch_us: its
    first runtime call with GPU work; gpu_idle_gap_us / launch_lead_us / interval_us: towards the
    NEXT step (None for the last)."""

    index: int
    batch_size: int | None
    ts_us: float
    host_us: float
    pid: Any
    tid: Any
    syncs: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    mrope_syncs: int = 0
    mrope_by_kind: dict[str, int] = field(default_factory=dict)
    mrope_ranges: int = 0
    sync_ts_us: list[float] = field(default_factory=list)
    gpu_start_us: float | None = None
    gpu_end_us: float | None = None
    first_launch_us: float | None = None
    gpu_idle_gap_us: float | None = None
    launch_lead_us: float | None = None
    interval_us: float | None = None

    def record(self) -> dict:
        """The JSON record written to steps.jsonl (times in the units their names carry)."""
        d = asdict(self)
        d["host_ms"] = self.host_us / 1000.0
        d["interval_ms"] = None if self.interval_us is None else self.interval_us / 1000.0
        return d


@dataclass
class Analysis:
    """All decode steps of one trace; source: "patchbench" (this suite's ranges), "sglang" (0.5.23's
    step annotations) or "none"."""

    steps: list[Step]
    source: str
    has_gpu: bool
    events: int

    def summary(self) -> dict[str, float]:
        """Medians over the steps (syncs, mrope syncs, host step time: start to next start, the range's
        duration for a one-step trace; on a GPU the idle gap and launch lead), the step count and the
        per-batch-size counts; {} without steps. The sync counts take the upper median, a count some
        step had (11 steps of 2 and 11 of 6 give 6, never the 4 no step had)."""
        if not self.steps:
            return {}
        out: dict[str, float] = {
            "decode_steps_count": float(len(self.steps)),
            "syncs_per_decode_step": float(median_high(s.syncs for s in self.steps)),
            "mrope_syncs_per_decode_step": float(median_high(s.mrope_syncs for s in self.steps)),
            "host_step_range_ms_median": median(s.host_us for s in self.steps) / 1000.0,
        }
        intervals = [s.interval_us for s in self.steps if s.interval_us is not None]
        out["host_step_ms_median"] = (
            median(intervals) if intervals else median(s.host_us for s in self.steps)
        ) / 1000.0
        gaps = [s.gpu_idle_gap_us for s in self.steps if s.gpu_idle_gap_us is not None]
        leads = [s.launch_lead_us for s in self.steps if s.launch_lead_us is not None]
        if gaps:
            out["gpu_idle_gap_us_median"] = float(median(gaps))
        if leads:
            out["launch_lead_us_median"] = float(median(leads))
        return out

    def by_batch_size(self) -> dict[int, dict[str, Any]]:
        """:func:`per_batch_size` of the steps."""
        return per_batch_size(s.record() for s in self.steps)


def per_batch_size(steps: Iterable[dict]) -> dict[int, dict[str, Any]]:
    """{batch size: {"syncs", "mrope_syncs" (sorted distinct per-step counts), "steps"}} of step
    records (:meth:`Step.record`, steps.jsonl lines); a step without a batch size left out."""
    out: dict[int, dict[str, Any]] = {}
    for s in steps:
        if s.get("batch_size") is None:
            continue
        row = out.setdefault(
            int(s["batch_size"]), {"syncs": set(), "mrope_syncs": set(), "steps": 0}
        )
        row["syncs"].add(s.get("syncs"))
        row["mrope_syncs"].add(s.get("mrope_syncs"))
        row["steps"] += 1
    return {
        bs: {
            "syncs": sorted(r["syncs"]),
            "mrope_syncs": sorted(r["mrope_syncs"]),
            "steps": r["steps"],
        }
        for bs, r in sorted(out.items())
    }


def load_events(path: str | Path) -> list[dict]:
    """The complete events of a Chrome trace file (``.json`` or ``.json.gz``); TraceError naming the
    file when it cannot be read or holds no list of trace events."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except (OSError, EOFError, ValueError, gzip.BadGzipFile) as e:
        raise TraceError(f"{p}: not a readable Chrome trace ({type(e).__name__}: {e})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(
            f"{p}: no 'traceEvents' list (a Chrome trace from torch.profiler is "
            '{"traceEvents": [...]})'
        )
    return complete_events(events)


def complete_events(events: Iterable[dict]) -> list[dict]:
    """The ``ph == "X"`` events with numeric ``ts`` and ``dur`` (others dropped)."""
    out = []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X":
            ts, dur = e.get("ts"), e.get("dur", 0)
            if isinstance(ts, (int, float)) and isinstance(dur, (int, float)):
                out.append(e)
    return out


def _batch_size(name: str) -> int | None:
    m = _BS_RE.search(name)
    return int(m.group(1)) if m else None


def _thread_index(events: list[dict]) -> dict[tuple, tuple[list[float], list[dict]]]:
    """Host events per (pid, tid), sorted by start: ({key: (starts, events)})."""
    per: dict[tuple, list[dict]] = {}
    for e in events:
        if e.get("cat") in GPU_CATS:
            continue
        per.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out = {}
    for k, evs in per.items():
        evs.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        out[k] = ([e["ts"] for e in evs], evs)
    return out


def _inside(index, key, ts: float, end: float) -> list[dict]:
    starts, evs = index.get(key, ([], []))
    lo = bisect.bisect_left(starts, ts)
    hi = bisect.bisect_right(starts, end)
    return [e for e in evs[lo:hi] if e["ts"] + e.get("dur", 0) <= end + 1e-6]


def _corr(e: dict):
    args = e.get("args") or {}
    return args.get("correlation", args.get("correlation id"))


def _sync_candidates(host: list[dict], gpu_by_corr: dict) -> list[tuple[dict, str]]:
    """(event, kind) for every sync event among ``host`` (sorted by start)."""
    out = []
    for i, e in enumerate(host):
        name = e.get("name", "")
        if name in SYNC_NAMES:
            out.append((e, name))
        elif name == "cudaMemcpyAsync":
            gnames = {g.get("name") for g in gpu_by_corr.get(_corr(e), [])}
            if DTOH_PAGEABLE in gnames:
                out.append((e, "memcpy_dtoh_pageable"))
            elif HTOD_PAGEABLE in gnames:
                nxt = next((h for h in host[i + 1 :] if h.get("cat") == "cuda_runtime"), None)
                if nxt is not None and nxt.get("name") == "cudaStreamSynchronize":
                    out.append((e, "h2d_blocking"))
    return out


def _count(cands: list[tuple[dict, str]]) -> tuple[int, dict[str, int], list[float]]:
    """(sync points, events per kind, start of each point); see the module docstring."""
    by_kind: dict[str, int] = {}
    for _, k in cands:
        by_kind[k] = by_kind.get(k, 0) + 1
    points: list[float] = []
    outer_end = -float("inf")
    prev_kind = None
    for e, kind in cands:
        end = e["ts"] + e.get("dur", 0)
        if e["ts"] < outer_end - 1e-6:
            continue  # nested in the previous point
        if kind in _SYNC_CALLS and prev_kind in _COPY_KINDS:
            prev_kind = kind  # the copy's own synchronize: same point
            outer_end = max(outer_end, end)
            continue
        points.append(float(e["ts"]))
        outer_end = end
        prev_kind = kind
    return len(points), by_kind, points


def _step_ranges(events: list[dict]) -> tuple[list[tuple[dict, int | None]], str]:
    ours = _named(events, STEP_PREFIX)
    if ours:
        return [(e, _batch_size(e["name"])) for e in ours], "patchbench"
    sgl = []
    for e in events:
        m = _SGL_STEP_RE.match(str(e.get("name", "")))
        if m and e.get("cat") != "gpu_user_annotation":
            sgl.append((e, int(m.group(1))))
    return sgl, ("sglang" if sgl else "none")


def _busy_in(
    intervals: list[tuple[float, float]], starts: list[float], a: float, b: float
) -> float:
    """Time in [a, b] covered by the union of ``intervals`` (sorted by start, merged)."""
    if b <= a:
        return 0.0
    i = max(bisect.bisect_right(starts, a) - 1, 0)
    busy = 0.0
    for s, e in intervals[i:]:
        if s >= b:
            break
        busy += max(0.0, min(e, b) - max(s, a))
    return busy


def _merged(gpu: list[dict]) -> list[tuple[float, float]]:
    iv = sorted((g["ts"], g["ts"] + g.get("dur", 0)) for g in gpu)
    out: list[list[float]] = []
    for s, e in iv:
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _named(events: list[dict], prefix: str) -> list[dict]:
    return [e for e in events if str(e.get("name", "")).startswith(prefix)]


def _within(e: dict, ranges: list[dict]) -> bool:
    """``e`` lies inside one of ``ranges``."""
    return any(
        m["ts"] <= e["ts"] and e["ts"] + e.get("dur", 0) <= m["ts"] + m["dur"] for m in ranges
    )


def analyze(events: list[dict]) -> Analysis:
    """Segment and measure the decode steps of ``events`` (:func:`load_events`); odd events are
    skipped, never raised on; no steps: the trace held no decode step."""
    events = complete_events(events)
    ranges, source = _step_ranges(events)
    index = _thread_index(events)
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    gpu_by_corr: dict = {}
    for g in gpu:
        gpu_by_corr.setdefault(_corr(g), []).append(g)
    merged = _merged(gpu)
    merged_starts = [s for s, _ in merged]
    ranges.sort(key=lambda r: r[0]["ts"])
    steps: list[Step] = []
    for i, (r, bs) in enumerate(ranges):
        key = (r.get("pid"), r.get("tid"))
        ts, end = float(r["ts"]), float(r["ts"] + r.get("dur", 0))
        host = [e for e in _inside(index, key, ts, end) if e is not r]
        step = Step(
            index=i,
            batch_size=bs,
            ts_us=ts,
            host_us=float(r.get("dur", 0)),
            pid=r.get("pid"),
            tid=r.get("tid"),
        )
        ours, mropes = _named(host, INSTR_PREFIX), _named(host, MROPE_PREFIX)
        cands = [(e, k) for e, k in _sync_candidates(host, gpu_by_corr) if not _within(e, ours)]
        step.syncs, step.by_kind, step.sync_ts_us = _count(cands)
        step.mrope_ranges = len(mropes)
        step.mrope_syncs, step.mrope_by_kind, _ = _count(
            [c for c in cands if _within(c[0], mropes)]
        )
        launches = [e for e in host if e.get("cat") == "cuda_runtime" and _corr(e) in gpu_by_corr]
        work = [g for e in launches for g in gpu_by_corr[_corr(e)]]
        if work:
            step.gpu_start_us = float(min(g["ts"] for g in work))
            step.gpu_end_us = float(max(g["ts"] + g.get("dur", 0) for g in work))
            step.first_launch_us = float(min(e["ts"] for e in launches))
        steps.append(step)
    for a, b in zip(steps, steps[1:], strict=False):
        a.interval_us = b.ts_us - a.ts_us
        if a.gpu_end_us is not None and b.gpu_start_us is not None:
            window = b.gpu_start_us - a.gpu_end_us
            a.gpu_idle_gap_us = (
                (window - _busy_in(merged, merged_starts, a.gpu_end_us, b.gpu_start_us))
                if window > 0
                else 0.0
            )
            a.launch_lead_us = a.gpu_end_us - b.first_launch_us
    return Analysis(steps=steps, source=source, has_gpu=bool(gpu), events=len(events))


def timeline_excerpt(events: list[dict], analysis: Analysis, *, n_steps: int = 4) -> dict | None:
    """``n_steps`` consecutive decode steps (from the second) for the timeline figure, microseconds
    from the first one's start: ``{"steps": [{"ts", "dur", "batch_size"}], "mrope": [[ts, dur]],
    "syncs": [[ts, in_mrope]], "gpu": [[ts, dur]] (merged busy intervals)}``; None without a step."""
    if not analysis.steps:
        return None
    first_step = min(1, max(len(analysis.steps) - n_steps, 0))
    chosen = analysis.steps[first_step : first_step + n_steps]
    t0 = chosen[0].ts_us
    t1 = max(s.ts_us + s.host_us for s in chosen)
    for s in chosen:
        if s.gpu_end_us is not None:
            t1 = max(t1, s.gpu_end_us)
    index = _thread_index(complete_events(events))
    mrope, syncs = [], []
    for s in chosen:
        host = _inside(index, (s.pid, s.tid), s.ts_us, s.ts_us + s.host_us)
        ms = _named(host, MROPE_PREFIX)
        mrope += [[e["ts"] - t0, e.get("dur", 0)] for e in ms]
        for ts in s.sync_ts_us:
            in_m = any(m["ts"] <= ts <= m["ts"] + m.get("dur", 0) for m in ms)
            syncs.append([ts - t0, in_m])
    gpu = [
        [max(a, t0) - t0, min(b, t1) - max(a, t0)]
        for a, b in _merged([e for e in events if e.get("cat") in GPU_CATS])
        if b > t0 and a < t1
    ]
    return {
        "steps": [
            {"ts": s.ts_us - t0, "dur": s.host_us, "batch_size": s.batch_size} for s in chosen
        ],
        "mrope": mrope,
        "syncs": syncs,
        "gpu": gpu,
        "span_us": t1 - t0,
    }
