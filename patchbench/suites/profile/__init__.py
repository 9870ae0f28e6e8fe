"""Profile suite: host syncs per decode step, host step time and GPU idle gaps, read from the live
server's own torch-profiler trace (docs/profile.md): :mod:`.load` keeps the requests decoding,
:mod:`.trace` analyses the trace."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path
from statistics import median
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from patchbench.records import read_jsonl, write_json, write_jsonl
from patchbench.suite import (
    Instrumentation,
    MetricInfo,
    Suite,
    SuiteContext,
    SuiteError,
    SuiteResult,
    comparison_get,
    read_or,
    register,
    suite_pairs,
    suite_refusals,
)
from patchbench.suites import folded

from . import trace as T

#: the in-server hook (Instrumentation.hooks) that names the decode-step and mrope ranges
HOOK = Path(__file__).resolve().parent / "instr" / "patchbench_profile_instr.py"

_ALL_LEVELS = " (over the steps of every concurrency level)"
METRICS: dict[str, MetricInfo] = {
    "mrope_syncs_per_decode_step": MetricInfo(
        "lower",
        "count",
        "median host syncs inside the mrope computation per decode step" + _ALL_LEVELS,
        True,
        "deterministic",
    ),
    "syncs_per_decode_step": MetricInfo(
        "lower", "count", "median host syncs per decode step" + _ALL_LEVELS, kind="deterministic"
    ),
    "gpu_idle_gap_us_median": MetricInfo(
        "lower", "us", "GPU idle time between consecutive decode steps (median)", kind="run"
    ),
    "launch_lead_us_median": MetricInfo(
        "higher", "us", "end of a step's GPU work minus the next step's first launch (median)"
    ),
    "host_step_ms_median": MetricInfo(
        "lower", "ms", "host time per decode step, start to next start (median)", kind="run"
    ),
    "host_step_range_ms_median": MetricInfo(
        "none", "ms", "duration of the decode-step range (median)", kind="descriptive"
    ),
    "decode_steps_count": MetricInfo(
        "none", "count", "decode steps in the traces", kind="descriptive"
    ),
    "profiler_step_overhead_share": MetricInfo(
        "none",
        "share",
        "profiled step time / unprofiled inter-token latency - 1",
        kind="descriptive",
    ),
}


class Params(BaseModel):
    """concurrency: one trace per level (its decode batch size); num_steps: forward passes per trace;
    warmup_tokens: tokens every request streams before profiling; unprofiled_window_s: the
    unprofiled inter-token latency's window; activities "auto": CPU, plus GPU on a GPU; image_size:
    each prompt's seeded random image; timeline_steps: steps in the timeline figure."""

    model_config = ConfigDict(extra="forbid")

    concurrency: list[int] = Field(default_factory=lambda: [1, 4])
    num_steps: int = Field(20, ge=2, le=1000)
    max_new_tokens: int = Field(1024, ge=8)
    warmup_tokens: int = Field(4, ge=1)
    unprofiled_window_s: float = Field(2.0, ge=0.2)
    activities: Literal["auto", "CPU", "CPU+GPU"] = "auto"
    image_size: str = Field("112x112", pattern=r"^\d+x\d+$")
    seed: int = 1
    trace_timeout_s: float = Field(180.0, gt=0)
    timeline_steps: int = Field(4, ge=1, le=20)


def profile_request(params: Params, device: str, output_dir: Path) -> dict:
    """The JSON body of ``POST /start_profile`` (fields 0.5.1.post3's ``ProfileReqInput`` and
    0.5.23's ``ProfileReq`` both declare)."""
    auto = ["CPU", "GPU"] if device == "cuda" else ["CPU"]
    return {
        "output_dir": str(output_dir),
        "num_steps": params.num_steps,
        "activities": auto if params.activities == "auto" else params.activities.split("+"),
        "with_stack": False,
        "record_shapes": False,
    }


def _complete_trace(d: Path) -> Path | None:
    """The scheduler's trace file in ``d`` once complete (the profiler creates it before writing)."""
    for p in sorted(d.glob("*.trace.json.gz")):
        with contextlib.suppress(T.TraceError):
            T.load_events(p)
            return p
    return None


#: what a stall during the export is called, and the setting that bounds it
EXPORT_WHAT = "the profiler's trace export (sglang writes it inside the scheduler's loop)"
EXPORT_SETTING = "profile.trace_timeout_s"


async def await_trace(ctx: SuiteContext, params: Params, raw: Path, c: int, t_end: float) -> Path:
    """Wait (after ``POST /start_profile`` answered) for the complete trace in ``raw``, the wait
    announced to the liveness watch (docs/profile.md, "How it runs"). SuiteError when none is
    there by ``t_end`` (monotonic s) or the server died."""
    progress = getattr(ctx.server, "progress", None)
    quiet = (
        progress.quiet(params.trace_timeout_s, EXPORT_WHAT, EXPORT_SETTING)
        if progress is not None
        else contextlib.nullcontext()
    )
    with quiet:
        while True:
            found = _complete_trace(raw)
            if found is not None:
                return found
            if time.monotonic() > t_end or not ctx.server.alive():
                raise SuiteError(
                    f"concurrency {c}: no complete *.trace.json.gz in {raw} "
                    f"within {params.trace_timeout_s:g} s of the load's start"
                )
            await asyncio.sleep(0.2)


async def _profile_level(ctx: SuiteContext, params: Params, c: int, images: list[str]) -> dict:
    import aiohttp

    from .load import DecodeLoad, itl_from_arrivals

    raw = Path(ctx.out_dir) / f"raw-c{c}"
    raw.mkdir(parents=True, exist_ok=True)
    load = DecodeLoad(ctx.server.base_url, c, params.max_new_tokens, images)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await load.start(session)
        try:
            t_end = time.monotonic() + params.trace_timeout_s
            while load.min_tokens() < params.warmup_tokens:
                if time.monotonic() > t_end or not ctx.server.alive():
                    raise SuiteError(
                        f"concurrency {c}: the load did not reach "
                        f"{params.warmup_tokens} tokens per request within "
                        f"{params.trace_timeout_s:g} s ({'; '.join(load.errors[:3])})"
                    )
                await asyncio.sleep(0.05)
            t0 = time.monotonic()
            await asyncio.sleep(params.unprofiled_window_s)
            t1 = time.monotonic()
            body = profile_request(params, ctx.device, raw.resolve())
            async with session.post(
                ctx.server.base_url.rstrip("/") + "/start_profile", json=body
            ) as r:
                text = await r.text()
                if r.status != 200:
                    raise SuiteError(f"POST /start_profile answered {r.status}: {text[:300]}")
            found = await await_trace(ctx, params, raw, c, t_end)
        finally:
            await load.stop()
    dest = Path(ctx.out_dir) / f"trace-c{c}.trace.json.gz"
    shutil.move(str(found), dest)
    shutil.rmtree(raw, ignore_errors=True)
    return {
        "trace": dest,
        "itl_unprofiled_ms": itl_from_arrivals(load.arrivals, t0, t1),
        "request": body,
        "errors": load.errors[:5],
    }


#: profiled step / unprofiled ITL outside this range is a measuring fault, not an overhead
#: (a step cannot be much shorter than a token's gap; a profiler that slows steps tenfold would
#: have shown as a stalled load)
PLAUSIBLE_STEP_TO_ITL = (0.5, 10.0)


def overhead_share(step_ms: float | None, itl_ms: float | None) -> tuple[float | None, str | None]:
    """(profiled step time / unprofiled inter-token latency - 1, None), or (None, why) when either is
    missing or the ratio lies outside :data:`PLAUSIBLE_STEP_TO_ITL`."""
    if not step_ms or not itl_ms:
        return None, None if not step_ms else "no unprofiled inter-token latency"
    ratio = step_ms / itl_ms
    lo, hi = PLAUSIBLE_STEP_TO_ITL
    if not lo <= ratio <= hi:
        return None, (
            f"profiled step {step_ms:.3g} ms against an unprofiled inter-token latency of "
            f"{itl_ms:.3g} ms (ratio {ratio:.3g}, outside [{lo:g}, {hi:g}]): the two do not "
            "measure the same steps"
        )
    return ratio - 1.0, None


def run(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Profile every concurrency level; SuiteError when the server refuses profiling or no trace
    appears in time."""
    from .load import image_data_url

    if ctx.server is None:
        raise SuiteError("the profile suite needs a server")
    w, h = (int(x) for x in params.image_size.split("x"))
    images = [image_data_url(params.seed + i, w, h) for i in range(max(params.concurrency))]
    rows: list[dict] = []
    levels: dict[str, Any] = {}
    all_steps: list[T.Step] = []
    warnings: list[str] = []
    overheads: list[float] = []
    for c in params.concurrency:
        ctx.log(f"profile: concurrency {c}, {params.num_steps} forward passes")
        got = asyncio.run(_profile_level(ctx, params, c, images))
        events = T.load_events(got["trace"])
        a = T.analyze(events)
        if a.source != "patchbench":
            warnings.append(
                f"concurrency {c}: no patchbench::decode_step ranges in the trace "
                f"(steps from: {a.source}); is the instrumentation on the server's "
                "PYTHONPATH?"
            )
        level_rows = [dict(s.record(), concurrency=c) for s in a.steps]
        rows += level_rows
        all_steps += a.steps
        summ = a.summary()
        itl = got["itl_unprofiled_ms"]
        share, why = overhead_share(summ.get("host_step_ms_median"), itl)
        if share is not None:
            overheads.append(share)
        elif why:
            warnings.append(f"concurrency {c}: no profiler overhead: {why}")
        tl = T.timeline_excerpt(events, a, n_steps=params.timeline_steps)
        if tl is not None:
            write_json(Path(ctx.out_dir) / f"timeline-c{c}.json", tl)
        levels[str(c)] = {
            "trace": got["trace"].name,
            "source": a.source,
            "summary": summ,
            "by_batch_size": T.per_batch_size(level_rows),
            "itl_unprofiled_ms": itl,
            "start_profile_request": got["request"],
            "client_errors": got["errors"],
        }
    write_jsonl(Path(ctx.out_dir) / "steps.jsonl", rows)
    # medians over every step of every level (intervals, gaps and leads never cross traces); the
    # host step time only from intervals
    metrics = T.Analysis(all_steps, "patchbench", False, 0).summary()
    if all(s.interval_us is None for s in all_steps):
        metrics.pop("host_step_ms_median", None)
    if overheads:
        metrics["profiler_step_overhead_share"] = median(overheads)
    return SuiteResult(
        status="ok" if all_steps else "incomplete",
        metrics=metrics,
        errors=[] if all_steps else ["no decode step found in any trace"],
        warnings=warnings,
        meta={
            "levels": levels,
            "by_batch_size": T.per_batch_size(rows),
            "params": params.model_dump(),
        },
    )


# --------------------------------------------------------------------------- comparison


def _cell(d: Path) -> dict[str, Any]:
    """A cell's steps.jsonl, summary metrics and timelines ({} / [] for what cannot be read)."""
    timelines = {p.stem.split("-c", 1)[1]: read_or(p) for p in sorted(d.glob("timeline-c*.json"))}
    return {
        "steps": read_or(d / "steps.jsonl", [], read_jsonl),
        "metrics": (read_or(d / "summary.json") or {}).get("metrics") or {},
        "timelines": {c: t for c, t in timelines.items() if t is not None},
    }


#: the per-cell medians a pair lists, in the report's order after the sync counts
VALUES = (
    "gpu_idle_gap_us_median",
    "launch_lead_us_median",
    "host_step_ms_median",
    "syncs_per_decode_step",
    "mrope_syncs_per_decode_step",
    "profiler_step_overhead_share",
)


def pair_cells(baseline_dirs: list[Path], variant_dirs: list[Path]) -> dict[str, Any] | None:
    """``{"by_batch_size": [{"batch_size", "baseline", "variant": {"syncs", "mrope_syncs" (sorted
    distinct per-step counts), "steps"} | None, "syncs_equal", "mrope_syncs_equal"}], "values":
    {metric: {"baseline", "variant": [per repeat]}}, "timeline": {"baseline", "variant":
    {concurrency: timeline_excerpt()}}}``; None when neither side has steps."""
    b = [_cell(Path(d)) for d in baseline_dirs]
    v = [_cell(Path(d)) for d in variant_dirs]
    pb = T.per_batch_size(s for c in b for s in c["steps"])
    pv = T.per_batch_size(s for c in v for s in c["steps"])
    if not any(c["steps"] for c in b + v):
        return None
    rows = []
    for bs in sorted(set(pb) | set(pv)):
        x, y = pb.get(bs), pv.get(bs)
        rows.append(
            {
                "batch_size": bs,
                "baseline": x,
                "variant": y,
                "syncs_equal": bool(x and y and x["syncs"] == y["syncs"]),
                "mrope_syncs_equal": bool(x and y and x["mrope_syncs"] == y["mrope_syncs"]),
            }
        )
    return {
        "by_batch_size": rows,
        "values": {
            n: {
                "baseline": [c["metrics"].get(n) for c in b],
                "variant": [c["metrics"].get(n) for c in v],
            }
            for n in VALUES
        },
        "timeline": {
            arm: next((c["timelines"] for c in cells if c["timelines"]), {})
            for arm, cells in (("baseline", b), ("variant", v))
        },
    }


def _fmt(xs: list | None) -> str:
    return "/".join(f"{x:g}" for x in xs) if xs else "–"


def _cell_value(name: str, x: float | None) -> str:
    """One cell's median as the table shows it: 3 significant digits, "–" for none; a profiler
    overhead below 0 (the profiled step faster than the unprofiled token gap: noise, never a
    speed-up) reads "within noise"."""
    if x is None:
        return "–"
    if name == "profiler_step_overhead_share" and x < 0:
        return "within noise"
    return f"{x:.3g}"


def report_section(comparison: Any) -> list[str]:
    """Markdown: per variant the sync counts per decode step by batch size and the step-time medians,
    folded, from ``pairs["profile"]`` only."""
    pairs = suite_pairs(comparison, "profile")
    refused = suite_refusals(comparison, "profile")
    if not pairs and not refused:
        return []
    base = comparison_get(comparison, "baseline", "baseline")
    lines = [
        "## Profile (live server, untimed correctness cell)",
        "",
        "Host syncs per decode step counted in the server's own torch-profiler trace "
        "(`patchbench::decode_step` ranges; mrope: inside `patchbench::mrope`). Profiling "
        "perturbs timing: the times below are for reading the trace, not verdicts.",
        "",
    ]
    for var, reason in refused.items():
        lines += [f"**{var}**: not compared: {reason}", ""]
    body: list[str] = []
    for var, p in pairs.items():
        body += [
            f"**{var}** vs {base}",
            "",
            "| batch size | steps (base/var) | syncs per step base → var | mrope syncs per "
            "step base → var | sync counts equal |",
            "|---|---|---|---|---|",
        ]
        for r in p.get("by_batch_size") or []:
            x, y = r.get("baseline") or {}, r.get("variant") or {}
            eq = "yes" if r.get("syncs_equal") and r.get("mrope_syncs_equal") else "no"
            body.append(
                f"| {r['batch_size']} | {x.get('steps', 0)}/{y.get('steps', 0)} | "
                f"{_fmt(x.get('syncs'))} → {_fmt(y.get('syncs'))} | "
                f"{_fmt(x.get('mrope_syncs'))} → {_fmt(y.get('mrope_syncs'))} | {eq} |"
            )
        body += ["", "| median per cell | baseline | variant |", "|---|---|---|"]
        for name in ("host_step_ms_median", *VALUES[:2], VALUES[-1]):
            d = (p.get("values") or {}).get(name) or {}
            arms = [d.get("baseline") or [], d.get("variant") or []]
            if any(x is not None for xs in arms for x in xs):
                cols = [", ".join(_cell_value(name, x) for x in xs) for xs in arms]
                body.append(f"| {name} | {cols[0]} | {cols[1]} |")
        body.append("")
    what = "syncs per decode step by batch size, and step-time medians, per variant"
    return lines + folded(what, body)


@register
class ProfileSuite(Suite):
    """Live-server profiler traces of decode steps."""

    name = "profile"
    Params = Params
    metrics = METRICS
    timed = False
    run = staticmethod(run)
    report_section = staticmethod(report_section)

    def instrumentation(self, ctx: SuiteContext, params: Params) -> Instrumentation | None:
        """The :data:`HOOK` with ``PATCHBENCH_PROFILE_RANGES=1``; nothing to collect afterwards."""
        return Instrumentation(
            env={"PATCHBENCH_PROFILE_RANGES": "1"},
            hooks=[HOOK],
            out_dir=None,
            perturbs_timing=True,
            collect=None,
            # torch's profiler records CPU ops only of the thread that
            # started it; the overlap scheduler's forward thread predates it
            server_args=["--disable-overlap-schedule"],
        )

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: Params
    ) -> dict | None:
        return pair_cells(baseline_dirs, variant_dirs)

    def plots(self, comparison: Any, out_dir: Path) -> list[Path]:
        from patchbench.report.figtext import figure_title

        from .timeline import plot_pairs

        base = comparison_get(comparison, "baseline", "baseline")
        sub = figure_title("Profiled decode steps", comparison)
        return plot_pairs(suite_pairs(comparison, "profile"), base, Path(out_dir), sub)
