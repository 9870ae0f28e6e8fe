"""Where the wall time of one ``bench`` invocation went outside the measurements: the harness
overhead share (goal < 5 %), its breakdown, and the server stops per phase. Each reads the
manifest entries of the cells this invocation handled (:class:`~patchbench.runfolder.models.ManifestCell`;
skipped, resumed cells count nothing)."""

from __future__ import annotations

from pathlib import Path

from patchbench.runfolder import read_cell
from patchbench.runfolder.models import ManifestCell, OverheadBreakdown, RunTimings, StopBreakdown


def _ran_timings(entries: list[ManifestCell]) -> list[dict[str, float | None]]:
    """``timings_s`` of the cells this invocation ran (skipped, resumed cells left out)."""
    return [e.timings_s for e in entries if not e.skipped]


def _inside_s(ran: list[dict[str, float | None]]) -> float:
    """Seconds spent in server start-up and the suites themselves, over ``ran``."""
    return sum(
        (t.get("server_start") or 0.0)
        + sum(v or 0.0 for k, v in t.items() if k.startswith("suite:"))
        for t in ran
    )


def overhead_share(entries: list[ManifestCell], timings: RunTimings) -> float | None:
    """Share of wall time (``timings.total``) outside server start-up and the suites themselves;
    None when nothing ran (a resume of a finished run)."""
    ran = _ran_timings(entries)
    if not timings.total or not ran:
        return None
    return round(max(0.0, timings.total - _inside_s(ran)) / timings.total, 4)


def overhead_breakdown(entries: list[ManifestCell], timings: RunTimings) -> OverheadBreakdown:
    """Where the harness overhead went, in seconds: ``python_start`` (the process's start-up and
    imports before the run began; 0 when ``bench`` was called in-process), ``setup`` (config,
    environment, overlays), ``server_stop`` (SIGTERM until the port closes; sglang's SIGTERM
    watchdog polls every 5 s, tokenizer_manager.sigterm_watchdog, 0.5.1.post3), ``flush``
    (/flush_cache between suites), ``report`` (compare.json, report.md, plots) and ``other``
    (the rest of the wall time outside server start-up and the suites)."""
    ran = _ran_timings(entries)
    stop = sum(t.get("server_stop") or 0.0 for t in ran)
    flush = sum(v or 0.0 for t in ran for k, v in t.items() if k.startswith("flush:"))
    setup, report = timings.setup or 0.0, timings.report or 0.0
    start = timings.python_start or 0.0
    total = timings.total or 0.0
    other = total - _inside_s(ran) - stop - flush - setup - report - start
    return OverheadBreakdown(
        python_start=round(start, 3),
        setup=round(setup, 3),
        server_stop=round(stop, 3),
        flush=round(flush, 3),
        report=round(report, 3),
        other=round(max(0.0, other), 3),
    )


def stop_breakdown(run_dir: Path, entries: list[ManifestCell]) -> StopBreakdown:
    """Seconds of the server stops of the cells this invocation ran, per phase (``exit``: signal
    until every process is gone, ``port``: until the port refused, ``gpu``: until NVML listed no
    server process), from each cell's ``cell.json``."""
    out = {"exit": 0.0, "port": 0.0, "gpu": 0.0}
    for e in entries:
        if e.skipped:
            continue
        rec = read_cell(run_dir / e.dir)
        b = rec.server.stop_breakdown_s if rec is not None else None
        if b is None:
            continue
        for k in out:
            out[k] += float(getattr(b, k) or 0.0)
    return StopBreakdown(**{k: round(v, 3) for k, v in out.items()})
