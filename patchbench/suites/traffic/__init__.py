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
from patchbench.run.server_metrics import (
    CACHED_TOKENS,
    HIT_PCT_METRIC,
    PROMPT_TOKENS,
    hit_share,
    scrape,
)
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
from patchbench.suites.serving.session import run_points_together
from patchbench.suites.serving.sweep import metric_at

from .render import report_section
from .workloads import MultiTurn, Trace, Workload, check_tool, tool_params

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


#: a workload's prefix-cache hit rate over its measured call, from the server's own counters
HIT_PCT = HIT_PCT_METRIC


def measured_window(ctx: SuiteContext, workload: str, edge: Literal["before", "after"]) -> dict:
    """Called right before workload ``workload``'s measured call starts (after its flush, warm-up
    and prime) and right after it ended; returns what its ``meta["window"][edge]`` records: the
    wall clock ``unix_s`` and the server's own prompt and cached token counters
    (``prompt_tokens``, ``cached_tokens``: :mod:`patchbench.run.server_metrics`), or ``error``
    where ``/metrics`` did not answer (``server.metrics: false``)."""
    out: dict[str, Any] = {"unix_s": time.time()}
    try:
        snap = scrape(ctx.server.base_url)
    except (OSError, ValueError) as e:
        return out | {"error": f"{type(e).__name__}: {e}"}
    c = snap.counters
    return out | {
        "prompt_tokens": c.get(PROMPT_TOKENS),
        "cached_tokens": c.get(CACHED_TOKENS),
    }


def window_hit_pct(window: dict) -> float | None:
    """The prefix cache's hit rate over one measured call (%): cached over prompt tokens of the
    counters' increases between its two :func:`measured_window` records; None without both."""
    try:
        deltas = {
            PROMPT_TOKENS: window["after"]["prompt_tokens"] - window["before"]["prompt_tokens"],
            CACHED_TOKENS: window["after"]["cached_tokens"] - window["before"]["cached_tokens"],
        }
    except (KeyError, TypeError):
        return None
    share = hit_share(deltas)
    return None if share is None else 100.0 * share


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


def calls(ctx: SuiteContext, params: Params) -> list[tuple[str, str, Path, ServingParams, Any]]:
    """The client's calls in order, [(workload, "prime" | "measured", folder, point parameters,
    replay.py spec or None)]: each workload's prime (none for a trace: its requests fill the cache
    as when it was recorded, and the tool's warm-up runs in its measured call), then its measured
    call (no warm-up of its own)."""
    out = []
    for name, w in params.workloads.items():
        wdir = Path(ctx.out_dir) / name
        keys = {"path", "conversations", "turns", "think_time_s"}
        conv = w.model_dump(mode="json", include=keys) if isinstance(w, MultiTurn) else {}
        if not isinstance(w, Trace):
            spec = {"mode": "prime_groups", "per_group": getattr(w, "prompts_per_group", 1)}
            spec = dict(conv, mode="prime_conversations") if conv else spec
            pp = tool_params(w, params.seed, params.warmup_requests, prime=True)
            out.append((name, "prime", wdir / "prime", pp, spec))
        warm = params.warmup_requests if isinstance(w, Trace) else 0
        spec = dict(conv, mode="conversations") if conv else None
        out.append((name, "measured", wdir, tool_params(w, params.seed, warm), spec))
    return out


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
    """Every workload's calls (:func:`calls`) in one client process (the serving suite's
    :func:`~patchbench.suites.serving.session.run_points_together`, replay.py as the wrapper where a
    call has a spec): the cache flushed before each workload's first call, :func:`measured_window`
    around its measured call; its files in ``<suite>/<name>/`` (the prime's in ``prime/``).
    SuiteError naming the call; a prime that did not complete makes its workload incomplete."""
    if ctx.server is None:
        raise SuiteError("the traffic suite needs a running server")
    check_release(params, Path(ctx.stock_sglang_dir), ctx.sglang_version)
    todo = calls(ctx, params)
    windows: dict[str, dict] = {}
    plan, wrappers = [], {}
    for name, what, folder, pp, spec in todo:
        key = name if what == "measured" else f"{name}/{what}"
        folder.mkdir(parents=True, exist_ok=True)
        plan.append((key, folder, pp))
        if spec is not None:
            write_json(folder / "replay.json", spec)
            wrappers[key] = [str(REPLAY), str(folder / "replay.json")]

    def between(i: int) -> None:
        name, what = todo[i][:2]
        if i and todo[i - 1][1] == "measured":
            windows[todo[i - 1][0]]["after"] = measured_window(ctx, todo[i - 1][0], "after")
        if not i or todo[i - 1][0] != name:
            ctx.log(f"traffic: workload {name}: flush, warm up, prime, measure")
            ctx.server.flush_cache()
        if what == "measured":
            windows[name] = {"before": measured_window(ctx, name, "before")}

    between(0)
    c = replace(ctx, stock_env=client_env(ctx))
    results = run_points_together(c, plan, between=between, wrappers=wrappers)
    windows[todo[-1][0]]["after"] = measured_window(ctx, todo[-1][0], "after")
    out = SuiteResult(meta={"workloads": {}})
    primed: dict[str, dict] = {}
    for (name, what, _f, _pp, _spec), r in zip(todo, results, strict=True):
        w = params.workloads[name]
        if what == "prime":
            n, done = (int(r.metrics.get(f"{k}_count", 0)) for k in ("requested", "completed"))
            primed[name] = {"requests": n, "completed": done}
            primed[name]["warmup_requests"] = params.warmup_requests
            if done < n:
                r.errors.append(
                    f"the prime completed {done} of {n} requests: the cache state of the measured traffic is unknown"
                )
            out.errors += [f"workload {name}: prime: {e}" for e in r.errors]
            continue
        out.errors += [f"workload {name}: {e}" for e in r.errors]
        out.warnings += [f"workload {name}: {x}" for x in r.warnings]
        out.metrics.update({metric_at(m, name): v for m, v in r.metrics.items()})
        if (hit := window_hit_pct(windows[name])) is not None:
            out.metrics[metric_at(HIT_PCT, name)] = hit
        nj = {metric_at(m, name): why for m, why in (r.meta.get("not_judged") or {}).items()}
        out.meta.setdefault("not_judged", {}).update(nj)
        meta = {"kind": w.kind, "flushed": True, "window": windows[name]}
        meta["primed"] = primed.get(name, {"requests": 0, "what": "nothing (a trace)"})
        out.meta["workloads"][name] = dict(meta, status=r.status, meta=r.meta)
    if not out.meta.get("not_judged", True):
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
        out[metric_at(HIT_PCT, name)] = MetricInfo(
            "none", "%", f"Prefix-cache hit rate ({name}):", kind="descriptive"
        )
    return out


@register
class TrafficSuite(Suite):
    """Workloads users run, each after flush, warm-up and prime (docs/traffic.md)."""

    name = "traffic"
    Params = Params
    metrics: dict[str, MetricInfo] = {}
    run = staticmethod(run)
    report_section = staticmethod(report_section)

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
