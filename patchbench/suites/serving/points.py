"""The serving suite's load sweep: run every point, merge the points' metrics, declare them
(docs/serving.md, "Load curves"). Each point keeps a single-point run's files in
``<suite>/points/<key>/``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from patchbench.records import write_json
from patchbench.suite import MetricInfo, PairingRefused, SuiteContext, SuiteError, SuiteResult

from .command import tool_info
from .curve import frontier, goodput_req_s, max_load_at_slo, per_user_tok_s, slo_ratio
from .pairing import pair_cells
from .params import Params
from .parse import MARGIN_PCT, METRICS, ResultError, read_result_line
from .point import run_point
from .session import run_points_together
from .sweep import Sweep, metric_at, order_seed, point_order

#: the single-point metrics that are primary at every point (the rest are secondary per point)
POINT_PRIMARY = ("output_throughput_tok_s", "itl_median_ms")
#: curve metric: the highest goodput over the sweep's delivered points (req/s meeting the SLO)
GOODPUT = "goodput_at_slo_req_s"
#: curve metric per axis: the highest load meeting the SLO
MAX_LOAD = {
    "max_concurrency": "max_concurrency_at_slo_count",
    "request_rate": "max_request_rate_at_slo_req_s",
}
#: how far our goodput may differ from the release's own ``--goodput`` (relative) before a warning
GOODPUT_REL_TOL = 0.05
#: per-point curve metrics: goodput, tokens/s per user, output tokens/s per GPU
POINT_CURVE = ("goodput_req_s", "output_per_user_tok_s", "output_per_gpu_tok_s")


def curve_primaries(sweep: Sweep) -> list[str]:
    """The sweep's primaries, fixed by the config before any data (docs/serving.md, "Verdicts":
    goodput at the SLO only with two points or more)."""
    curve = ([GOODPUT] if len(sweep.points) > 1 else []) + [MAX_LOAD[sweep.axis]]
    return curve + [metric_at(m, k) for m in POINT_PRIMARY for k in sweep.keys()]


def declarations(params: Params, single: dict[str, MetricInfo] = METRICS) -> dict[str, MetricInfo]:
    """The declarations of a run with ``params``: ``single`` without a sweep; with one the curve
    metrics, every single-point metric at every point, then the per-point curve metrics, primary
    exactly for :func:`curve_primaries`."""
    sw = params.sweep
    if sw is None:
        return dict(single)
    prim = set(curve_primaries(sw))

    def judged(unit: str, label: str, primary: bool = False) -> MetricInfo:
        return MetricInfo("higher", unit, label, primary, "run", MARGIN_PCT)

    load_unit = "count" if sw.axis == "max_concurrency" else "req/s"  # a concurrency: a count
    out: dict[str, MetricInfo] = {
        GOODPUT: judged("req/s", "Goodput at SLO, best point (req/s)", GOODPUT in prim),
        MAX_LOAD[sw.axis]: judged(load_unit, "Highest load meeting the SLO", True),
    }
    curve = {
        "goodput_req_s": judged("req/s", "Goodput at SLO (req/s)"),
        "output_per_user_tok_s": judged("tok/s", "Tokens/s per user"),
        "output_per_gpu_tok_s": judged("tok/s", "Output tok/s per GPU"),
    }
    for base, info in [*single.items(), *curve.items()]:
        for p, k in zip(sw.sorted_points(), sw.keys(), strict=True):
            name = metric_at(base, k)
            label = point_label(info.label or base, sw.axis, p)
            out[name] = dataclasses.replace(info, primary=name in prim, label=label)
    return out


def point_label(label: str, axis: str, point: float) -> str:
    """A single-point label with the point: "Output token throughput (tok/s):" at concurrency
    16 -> "Output token throughput at concurrency 16 (tok/s):"."""
    where = f" at {'concurrency' if axis == 'max_concurrency' else 'request rate'} {point:g}"
    head, sep, tail = label.partition(" (")
    if sep:
        return f"{head}{where}{sep}{tail}"
    return label.rstrip(":") + where + (":" if label.endswith(":") else "")


def _delivered(sweep: Sweep, point: float, m: dict[str, float]) -> tuple[bool, float | None]:
    """(whether the client delivered the load asked at ``point``, what it achieved)."""
    if sweep.axis == "max_concurrency":
        got = m.get("concurrency")
    else:
        d = m.get("duration_s") or 0.0
        got = m.get("completed_count", 0.0) / d if d > 0 else None
    if got is None:
        return True, None
    return got >= sweep.delivered_share * point, got


def merge_points(
    params: Params,
    results: dict[float, SuiteResult],
    recs: dict[float, dict],
    single: dict[str, MetricInfo],
    tool_goodput: dict[float, float | None] | None = None,
) -> SuiteResult:
    """The suite's result of a sweep from each point's result and records (undelivered points and
    the tool's own goodput, ``tool_goodput``: docs/serving.md, "Verdicts" and "Curve metrics").
    ValueError without ``params.sweep``."""
    sw = params.sweep
    if sw is None:
        raise ValueError("merge_points needs a sweep")

    out = SuiteResult(meta={"sweep": {"axis": sw.axis, "points": {}}})
    loads, ratios, goodputs, front = [], [], [], []
    for p in sw.sorted_points():
        r, k = results[p], sw.key(p)
        ok, got = _delivered(sw, p, r.metrics)
        out.errors += [f"point {k}: {e}" for e in r.errors]
        out.warnings += [f"point {k}: {w}" for w in r.warnings]
        m = dict(r.metrics)
        for n, why in (r.meta.get("not_judged") or {}).items():
            out.meta.setdefault("not_judged", {})[metric_at(n, k)] = why
        rec = recs.get(p)
        ratio = slo_ratio(rec, sw.slo) if rec else None
        if rec and m.get("duration_s"):
            m["goodput_req_s"] = goodput_req_s(rec, m["duration_s"], sw.slo)
            if (u := per_user_tok_s(rec)) is not None:
                m["output_per_user_tok_s"] = u
            if "output_throughput_tok_s" in m:
                m["output_per_gpu_tok_s"] = m["output_throughput_tok_s"] / params.gpus
        tg = (tool_goodput or {}).get(p)
        if tg is not None and "goodput_req_s" in m:
            slack = max(GOODPUT_REL_TOL * tg, 1.0 / m["duration_s"])
            if abs(m["goodput_req_s"] - tg) > slack:
                out.warnings.append(
                    f"point {k}: our goodput {m['goodput_req_s']:.4g} req/s differs from "
                    f"bench_serving's --goodput {tg:.4g} req/s"
                )
        bound = (r.meta.get("client") or {}).get("bound")
        if not ok or bound:
            if ok:  # its warning is the point's own (.point.finish_point)
                why = f"client-bound: {bound}"
            else:
                why = f"the client reached {got:.3g} of the {p:g} asked ({sw.axis}): not delivered"
                out.warnings.append(f"point {k}: {why}, never judged")
            m = {n: v for n, v in m.items() if n in single and single[n].kind == "descriptive"}
            out.meta.setdefault("not_judged", {}).update(
                {metric_at(n, k): why for n, i in single.items() if i.kind != "descriptive"}
                | {metric_at(n, k): why for n in POINT_CURVE}
            )
        else:
            loads.append(p)
            ratios.append(ratio)
            if "goodput_req_s" in m:
                goodputs.append(m["goodput_req_s"])
            if "output_per_user_tok_s" in m and "output_per_gpu_tok_s" in m:
                front.append((k, m["output_per_gpu_tok_s"], m["output_per_user_tok_s"]))
        out.metrics.update({metric_at(n, k): v for n, v in m.items()})
        out.meta["sweep"]["points"][k] = {
            "load": p,
            "status": r.status,
            "delivered": ok,
            "client_bound": bool(bound),
            "achieved": got,
            "slo_ratio": ratio,
            "tool_goodput_req_s": tg,
            "meta": r.meta,
        }
    _curve(sw, out, loads, ratios, goodputs, front)
    out.status = "incomplete" if out.errors else "ok"
    return out


def _curve(sw: Sweep, out: SuiteResult, loads, ratios, goodputs, front) -> None:
    """Add the curve metrics and ``meta.sweep`` answers to ``out`` (delivered points only)."""
    withheld = out.meta.setdefault("not_judged", {})
    if goodputs:
        out.metrics[GOODPUT] = max(goodputs)
    else:
        withheld[GOODPUT] = "no delivered point with request records"
    name = MAX_LOAD[sw.axis]
    if loads:
        ml = max_load_at_slo(loads, ratios)
        out.meta["sweep"]["max_load_at_slo"] = {"value": ml.value, "answer": ml.answer}
        if ml.value is not None:
            out.metrics[name] = ml.value
        if ml.answer == "beyond the sweep":
            out.bounds[name] = "lower"
        elif ml.answer == "not reached":
            withheld[name] = "not reached: no delivered point meets the SLO"
            out.warnings.append(
                f"no point meets the SLO (TTFT <= {sw.slo.ttft_ms:g} ms and TPOT <= "
                f"{sw.slo.tpot_ms:g} ms at p{sw.slo.percentile:g}): {name} not reached"
            )
    else:
        withheld[name] = "no delivered point"
    if not withheld:
        del out.meta["not_judged"]
    idx = frontier([(x, y) for _, x, y in front])
    out.meta["sweep"]["frontier"] = [front[i][0] for i in idx]
    out.meta["sweep"]["slo"] = sw.slo.model_dump()


def run_sweep(ctx: SuiteContext, params: Params, together: bool = True) -> SuiteResult:
    """Run every point of ``params.sweep`` in the cell's order, the cache flushed before each point
    after the first, each point's summary.json written; SuiteError naming the point. Two points or
    more run in one client process (:func:`.session.run_points_together`) unless ``together`` is
    False or ``params.clients`` > 1 (bench_serving processes of their own a point)."""
    sw = params.sweep
    assert sw is not None
    seed = order_seed(ctx.variant, ctx.repeat)
    order = point_order(sw, seed)
    slo_args = _tool_goodput_args(ctx, sw)
    plan: list[tuple[str, Path, Params]] = []
    for p in order:
        k = sw.key(p)
        pdir = Path(ctx.out_dir) / "points" / k
        pdir.mkdir(parents=True, exist_ok=True)
        pp = params.model_copy(
            update={
                "sweep": None,
                sw.axis: int(p) if sw.axis == "max_concurrency" else p,
                "num_prompts": sw.num_prompts(p, params.num_prompts),
                "extra_args": list(params.extra_args) + slo_args,
            }
        )
        plan.append((k, pdir, pp))
    if together and len(plan) > 1 and params.clients == 1:
        got = run_points_together(ctx, plan)
    else:
        got = []
        for i, (k, pdir, pp) in enumerate(plan):
            if i and ctx.server is not None:
                ctx.server.flush_cache()
            ctx.log(f"serving: sweep point {k} ({i + 1}/{len(order)})")
            try:
                r = run_point(replace(ctx, out_dir=pdir), pp)
            except SuiteError as e:
                raise SuiteError(f"sweep point {k}: {e}") from None
            write_json(pdir / "summary.json", r.to_json("serving"))
            got.append(r)
    dirs = {p: pdir for p, (_k, pdir, _pp) in zip(order, plan, strict=True)}
    recs = {p: json.loads((d / "requests.json").read_text()) for p, d in dirs.items()}
    tool_goodput = {p: _read_tool_goodput(d) if slo_args else None for p, d in dirs.items()}
    results = dict(zip(order, got, strict=True))
    out = merge_points(params, results, recs, METRICS, tool_goodput)
    out.meta["sweep"].update({"order": [sw.key(p) for p in order], "order_seed": seed})
    return out


def _tool_goodput_args(ctx: SuiteContext, sw: Sweep) -> list[str]:
    """``--goodput ttft:<ms> tpot:<ms>`` when the release's bench_serving has the flag (0.5.23;
    not 0.5.1.post3), else []."""
    try:
        opts = tool_info(Path(ctx.stock_sglang_dir)).options
    except (OSError, SyntaxError):
        return []
    if "--goodput" not in opts:
        return []
    return ["--goodput", f"ttft:{sw.slo.ttft_ms:g}", f"tpot:{sw.slo.tpot_ms:g}"]


def _read_tool_goodput(pdir: Path) -> float | None:
    """The tool's ``request_goodput`` (req/s) in the point's result.jsonl, None when absent."""
    try:
        v = read_result_line(pdir / "result.jsonl").get("request_goodput")
    except ResultError:
        return None
    return float(v) if isinstance(v, int | float) else None


def pair_points(
    baseline_dirs: list[Path], variant_dirs: list[Path], params: Params, metrics: list[str]
) -> dict[str, Any]:
    """The pair dict of a sweep: the lowest point's pairing as the single-point one, ``points``: {key:
    its request pairing and identity}, ``descriptive`` per ``<metric>@<key>``, ``slo``;
    PairingRefused when no point pairs."""
    sw = params.sweep
    assert sw is not None
    out: dict[str, Any] | None = None
    points: dict[str, Any] = {}
    desc: dict[str, Any] = {}
    refused: list[str] = []
    for k in sw.keys():
        try:
            got = pair_cells(
                [Path(d) / "points" / k for d in baseline_dirs],
                [Path(d) / "points" / k for d in variant_dirs],
                metrics,
            )
        except PairingRefused as e:
            refused.append(f"point {k}: {e}")
            continue
        points[k] = {"request_pairing": got["request_pairing"], "identity": got["identity"]}
        desc.update({metric_at(m, k): d for m, d in (got.get("descriptive") or {}).items()})
        if out is None:
            out = got
    if out is None:
        raise PairingRefused("; ".join(refused))
    out = dict(out, points=points, descriptive=desc, slo=sw.slo.model_dump())
    out["notes"] = list(out.get("notes", [])) + refused
    return out
