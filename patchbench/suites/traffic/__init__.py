"""Traffic suite: the workloads users run (shared prefixes, multi-turn conversations, a trace),
each one serving point (:mod:`patchbench.suites.serving.point`: its validity checks, recomputation
and per-request records) after a cache protocol: flush, warm up, prime, measure. Metrics are the
serving suite's, named ``<metric>@<workload>``. Parameters: docs/traffic.md."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from patchbench.records import write_json
from patchbench.run.logscan import log_size
from patchbench.suite import (
    MetricInfo,
    PairingRefused,
    Suite,
    SuiteContext,
    SuiteError,
    SuiteResult,
    register,
)
from patchbench.suites.serving import METRICS
from patchbench.suites.serving import Params as ServingParams
from patchbench.suites.serving.command import tool_info
from patchbench.suites.serving.pairing import pair_cells
from patchbench.suites.serving.point import finish_point, prepare_point, run_tool
from patchbench.suites.serving.sweep import metric_at

from .workloads import MultiTurn, SharedPrefix, Trace, Workload, check_tool, read_jsonl, tool_params

#: the client driver of multi_turn workloads (any release)
REPLAY = Path(__file__).with_name("replay.py")


class Params(BaseModel):
    """``workloads``: {name: workload} run in this order, each after a cache flush (names:
    letters, digits, ``-``, ``_``: a folder and the metrics' ``@`` suffix); ``seed``: bench_serving's
    seed (the shared prefixes' prompts); ``warmup_requests``: the tool's warm-up, sent in the
    prime call (a trace's: in its measured call); ``primary``: the serving suite's primaries at
    every workload are primaries of the report (False: every workload row is a secondary)."""

    model_config = ConfigDict(extra="forbid")

    workloads: dict[str, Workload] = Field(min_length=1)
    seed: int = 1
    warmup_requests: int = Field(1, ge=0)
    primary: bool = True

    @field_validator("workloads")
    @classmethod
    def _names(cls, v: dict) -> dict:
        bad = [n for n in v if not re.fullmatch(r"[A-Za-z0-9_-]+", n)]
        if bad:
            raise ValueError(f"workload names may hold letters, digits, - and _ only: {bad}")
        return v


def measured_window(ctx: SuiteContext, workload: str, edge: Literal["before", "after"]) -> dict:
    """The one place a scrape of the server's counters belongs: called right before workload
    ``workload``'s measured call starts (after its flush, warm-up and prime) and right after it
    ended. Returns what the workload's ``meta["window"][edge]`` records: the wall clock (s)."""
    return {"unix_s": time.time()}


def client_env(ctx: SuiteContext) -> dict[str, str]:
    """The client's environment with HOME in the run's cache folder: bench_serving caches its
    generated shared-prefix prompts under ~/.cache keyed without the tokenizer (0.5.1.post3: nor
    the seed), so a file of another run could be read; HF_HOME keeps the models where they were."""
    env = dict(ctx.stock_env)
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    cache = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    env.setdefault("HF_HOME", str(cache / "huggingface"))
    env["HOME"] = str(Path(ctx.cache_dir).resolve() / "traffic-home")
    return env


def idle_s(w: Any) -> float:
    """Seconds the client may send nothing: a think time or a trace's longest gap (slowed), + 10."""
    gap = w.think_time_s if isinstance(w, MultiTurn) else 0.0
    if isinstance(w, Trace):
        ts = sorted(float(r["timestamp"]) for r in read_jsonl(w.path))
        gap = max([b - a for a, b in zip(ts, ts[1:], strict=False)] + [0.0]) / 1000 * w.slowdown
    return gap + 10.0


def send(ctx: SuiteContext, w: Any, pp: ServingParams, out: Path, prime: bool = False):
    """One bench_serving call of workload ``w`` with point parameters ``pp`` into ``out``
    (multi_turn and primes: through replay.py); the point's SuiteResult (SuiteError as a
    serving point)."""
    c = replace(ctx, out_dir=out, stock_env=client_env(ctx))
    prep = prepare_point(c, pp)
    if isinstance(w, MultiTurn) or prime:
        if isinstance(w, SharedPrefix):
            spec = {"mode": "prime_groups", "per_group": w.prompts_per_group}
        else:
            keys = {"path", "conversations", "turns", "think_time_s"}
            mode = "prime_conversations" if prime else "conversations"
            spec = dict(w.model_dump(mode="json", include=keys), mode=mode)
        write_json(out / "replay.json", spec)
        argv = [ctx.python, str(REPLAY), str(out / "replay.json"), *prep.argv[3:]]
        prep = replace(prep, argv=argv)
        write_json(out / "command.json", {"argv": argv})
    srv = ctx.server
    offset = log_size(srv.log_path) if srv.log_path is not None else 0
    rc, wall_s = run_tool(
        prep.argv,
        env=c.stock_env,
        out_dir=out,
        timeout_s=pp.timeout_s,
        server_alive=srv.alive,
        server_log=srv.log_path,
        progress=srv.progress,
        idle_s=idle_s(w),
    )
    r = finish_point(c, pp, prep, rc, wall_s, offset)
    write_json(out / "summary.json", r.to_json("traffic"))
    return r


def prime(ctx: SuiteContext, w: Any, params: Params, out: Path) -> dict[str, Any]:
    """Warm up and prime workload ``w`` (one request per prefix group, not measured); what was
    primed, for the workload's meta: requests, completed, warmup_requests, what."""
    if isinstance(w, Trace):
        return {
            "requests": 0,
            "what": "nothing: a trace's requests fill the cache as when it was recorded; the "
            "tool's warm-up runs in the measured call",
        }
    r = send(ctx, w, tool_params(w, params.seed, params.warmup_requests, prime=True), out, True)
    what = (
        f"one request per group ({w.groups}): the common prefix of the measured prompts' group"
        if isinstance(w, SharedPrefix)
        else "one request per distinct system prompt of the conversations"
    )
    return {
        "requests": int(r.metrics.get("requested_count", 0)),
        "completed": int(r.metrics.get("completed_count", 0)),
        "warmup_requests": params.warmup_requests,
        "what": what,
    }


def check_release(params: Params, stock_sglang_dir: Path, release: str) -> None:
    """ToolMismatch naming ``release`` when its bench_serving cannot send a workload."""
    try:
        info = tool_info(Path(stock_sglang_dir))
    except (OSError, SyntaxError) as e:
        raise SuiteError(f"cannot read the release's bench_serving source: {e}") from None
    for name, w in params.workloads.items():
        try:
            check_tool(w, info, release)
        except SuiteError as e:
            raise type(e)(f"suites.traffic.workloads.{name}: {e}") from None


def run(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Each workload in order: flush, warm up and prime (:func:`prime`), the measured call between
    the two :func:`measured_window` calls; its files in ``<suite>/<name>/`` (the prime's in
    ``prime/``). SuiteError naming the workload; a prime that did not complete makes it incomplete."""
    if ctx.server is None:
        raise SuiteError("the traffic suite needs a running server")
    check_release(params, Path(ctx.stock_sglang_dir), ctx.sglang_version)
    out = SuiteResult(meta={"workloads": {}})
    for name, w in params.workloads.items():
        wdir = Path(ctx.out_dir) / name
        ctx.log(f"traffic: workload {name} ({w.kind}): flush, warm up, prime, measure")
        try:
            ctx.server.flush_cache()
            primed = prime(ctx, w, params, wdir / "prime")
            window = {"before": measured_window(ctx, name, "before")}
            warm = params.warmup_requests if isinstance(w, Trace) else 0
            r = send(ctx, w, tool_params(w, params.seed, warm), wdir)
            window["after"] = measured_window(ctx, name, "after")
        except SuiteError as e:
            raise SuiteError(f"workload {name}: {e}") from None
        if primed.get("completed", 0) < primed["requests"]:
            r.errors.append(
                f"the prime completed {primed['completed']} of {primed['requests']} requests: "
                "the cache state of the measured traffic is unknown"
            )
        out.errors += [f"workload {name}: {e}" for e in r.errors]
        out.warnings += [f"workload {name}: {x}" for x in r.warnings]
        out.metrics.update({metric_at(m, name): v for m, v in r.metrics.items()})
        nj = {metric_at(m, name): why for m, why in (r.meta.get("not_judged") or {}).items()}
        out.meta.setdefault("not_judged", {}).update(nj)
        meta = {"kind": w.kind, "flushed": True, "primed": primed, "window": window}
        out.meta["workloads"][name] = dict(meta, status=r.status, meta=r.meta)
    if not out.meta["not_judged"]:
        del out.meta["not_judged"]
    out.status = "incomplete" if out.errors else "ok"
    return out


def declarations(params: Any) -> dict[str, MetricInfo]:
    """The serving suite's metrics at every workload (``<metric>@<name>``), labels naming it."""
    names = list(params.workloads) if isinstance(params, Params) else []
    out = {}
    for name in names:
        for m, info in METRICS.items():
            label = f"{(info.label or m).rstrip(':')} ({name}):"
            primary = info.primary and params.primary
            out[metric_at(m, name)] = dataclasses.replace(info, label=label, primary=primary)
    return out


@register
class TrafficSuite(Suite):
    """Workloads users run, each after flush, warm-up and prime (docs/traffic.md)."""

    name = "traffic"
    Params = Params
    metrics: dict[str, MetricInfo] = {}
    run = staticmethod(run)

    def declarations(self, params: Any) -> dict[str, MetricInfo]:
        """:func:`declarations`."""
        return declarations(params)

    def check_release(self, params: Any, stock_sglang_dir: Path, release: str) -> None:
        """:func:`check_release`, before any server starts."""
        check_release(params, stock_sglang_dir, release)

    def pair(self, baseline_dirs: list[Path], variant_dirs: list[Path], params: Params) -> dict:
        """Each workload's requests paired by index (the serving suite's
        :func:`~patchbench.suites.serving.pairing.pair_cells`): the first that pairs as the
        suite's pairing, ``points``: {workload: its pairing and identity}, ``descriptive`` per
        ``<metric>@<workload>``; PairingRefused when none pairs."""
        first: dict | None = None
        points, desc, refused = {}, {}, []
        for name in params.workloads:
            try:
                got = pair_cells(
                    [Path(d) / name for d in baseline_dirs],
                    [Path(d) / name for d in variant_dirs],
                    list(METRICS),
                )
            except PairingRefused as e:
                refused.append(f"workload {name}: {e}")
                continue
            points[name] = {"request_pairing": got["request_pairing"], "identity": got["identity"]}
            desc.update({metric_at(m, name): d for m, d in (got.get("descriptive") or {}).items()})
            first = first or got
        if first is None:
            raise PairingRefused("; ".join(refused))
        notes = list(first.get("notes", [])) + refused
        return dict(first, points=points, descriptive=desc, notes=notes)
