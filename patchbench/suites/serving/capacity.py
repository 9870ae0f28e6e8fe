"""The capacity search of one cell against its server (docs/serving.md, "Capacity at the SLO"):
each probe is one bench_serving call in ``<suite>/probes/c<N>/``, a cell's probes in one client
process (:class:`.session.ClientSession`; a process each with ``clients`` > 1), judged by
:mod:`.attainment`, steered by :func:`.capsearch.search`; its metrics and the report's capacity
lines."""

from __future__ import annotations

import hashlib
import json
import math
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from patchbench.records import write_json
from patchbench.suite import (
    MetricInfo,
    SuiteContext,
    SuiteError,
    SuiteResult,
    comparison_get,
    read_or,
    suite_rows,
)

from .attainment import attainment
from .capsearch import Answer, Capacity
from .params import Params
from .parse import MARGIN_PCT
from .point import run_point
from .session import ClientSession
from .sweep import STARTUP_S, point_seconds

#: the capacity: the highest concurrency meeting the SLO (interpolated in a smooth bracket)
CAPACITY = "capacity_at_slo_count"
#: descriptive: the bracket's ends, the probes run, 1 when the bracket is a cliff
MET, FAILED, PROBES, CLIFF = (
    "capacity_met_count",
    "capacity_failed_count",
    "capacity_probes_count",
    "capacity_cliff_count",
)


#: probes a cell costs in the dry run's estimate: the calibration's 3.9 (smooth) and 3.6 (cliff)
#: at the PR config's shape (docs/calibration.md, "Capacity"), rounded up
PROBES_PER_CELL = 4


def cost_lines(
    cap: Capacity, output_len: int, cells_per_round: int, cpu: bool = False
) -> list[str]:
    """The dry run's lines of a capacity search: its range and SLO, and (not on the CPU) the
    estimated H200 minutes of a cell and of a round: start-up plus :data:`PROBES_PER_CELL` probes
    costed at twice ``start`` (the capacity is unknown before the run) by the sweep's cost model
    (:func:`.sweep.point_seconds`)."""
    per_cell = min(PROBES_PER_CELL, cap.max_probes or PROBES_PER_CELL)
    head = (
        f"capacity search: concurrency {cap.start} first, within [{cap.min}, {cap.max}], "
        f"bisected to {cap.precision:.0%}; ~{per_cell} probes a cell"
        + (f" (at most {cap.max_probes})" if cap.max_probes else "")
    )
    if cpu:
        return [head + " (no time estimate on the CPU engine)"]
    c = min(cap.max, 2 * cap.start)
    probe = point_seconds(c, cap.num_prompts(c), output_len)
    cell = STARTUP_S + per_cell * probe
    rnd = cell * cells_per_round / 60
    return [
        head,
        f"estimated H200 GPU minutes: ~{cell / 60:.1f} a cell ({per_cell} probes of "
        f"~{probe:.0f} s at concurrency {c:g}, server start-up {STARTUP_S:.0f} s), ~{rnd:.1f} a "
        f"repeat of the {cells_per_round} variants; the sweep's cost model "
        "(patchbench/suites/serving/sweep.py): an estimate, not a measurement",
    ]


def declarations(cap: Capacity) -> dict[str, MetricInfo]:
    """The metrics of a capacity run: the capacity (primary when ``cap.primary``; paired t on log
    ratios across rounds like every run-level metric), the bracket's ends, probes and cliffs."""

    def shown(label: str) -> MetricInfo:
        return MetricInfo("none", "count", label, kind="descriptive")

    return {
        CAPACITY: MetricInfo(
            "higher",
            "count",
            "Load carried at the SLO (concurrency)",
            cap.primary,
            "run",
            MARGIN_PCT,
        ),
        MET: shown("Highest concurrency probed meeting the SLO"),
        FAILED: shown("Lowest concurrency probed failing the SLO"),
        PROBES: shown("Probes of the capacity search"),
        CLIFF: shown("Capacity bracket is a cliff (1) or smooth (0)"),
    }


def round_seed(seed: int | None, repeat: int) -> int:
    """bench_serving's ``--seed`` of every probe of round ``repeat``: the same for both arms and
    every concurrency of the round (common random numbers), a new one each round (a hash of the
    config's seed and the round)."""
    return int.from_bytes(hashlib.sha256(f"capacity/{seed}/{repeat}".encode()).digest()[:4], "big")


def round_dither(seed: int) -> float:
    """The round's dither of the search's first probe in [-1, 1) (:func:`.capsearch.search`),
    from its seed: the same for both arms."""
    return (seed % 10_000) / 5_000 - 1


def previous_bracket(out_dir: Path, repeat: int) -> tuple[float | None, float | None] | None:
    """The (lo, hi) bracket of this arm's latest earlier round with one (``rep<k>/<suite>/
    summary.json`` beside this cell's), None when there is none."""
    cell = Path(out_dir)
    for k in range(repeat - 1, -1, -1):
        f = cell.parent.parent / f"rep{k}" / cell.name / "summary.json"
        try:
            got = json.loads(f.read_text())["meta"]["capacity"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if got.get("lo") is not None or got.get("hi") is not None:
            return got.get("lo"), got.get("hi")
    return None


def withheld_reason(
    cap: Capacity, answer: str, lo: float | None, hi: float | None, bound_at: float | None
) -> str:
    """Why a cell's capacity has no value (``meta.not_judged``): "beyond" (``>= max``), "never",
    "capped" (``max_probes`` ran out before a bracket: the end found) or "client-bound" (the probe
    at ``bound_at`` was; the load met below it, if any). Any of ``lo``, ``hi``, ``bound_at`` may
    be None."""
    if answer == "beyond":
        return f">= {cap.max}: the SLO is met at the search's maximum (a bound, not a value)"
    if answer == "never":
        return f"never met: the SLO fails at concurrency {cap.min}"
    met = f"the SLO is met at {lo:g}" if lo is not None else None
    if answer == "capped":
        end = met or (f"the SLO fails at {hi:g}" if hi is not None else "no probe ran")
        return f"not bracketed within max_probes = {cap.max_probes}: {end} (a bound, not a value)"
    at = f"concurrency {bound_at:g}" if bound_at is not None else "the first probe"
    return (
        f"not searched past {at}: its probe was client-bound (neither meets nor fails the SLO)"
        + (f"; {met}" if met else "; no load below it was met")
    )


class ClientBound(Exception):
    """A probe was client-bound (:mod:`.clients`): the search stops at its load (``args[0]``)."""


def run_capacity(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Search this cell's capacity: probes at concurrencies the search picks, the cache flushed
    before each probe after the first, every probe with the round's seed; SuiteError naming the
    probe when bench_serving fails. The capacity is withheld (``meta.not_judged``) when it is
    beyond the range (">= max"), never met, or a probe was client-bound (answer "client-bound":
    the search stops there; ``lo`` the highest load met below it)."""
    cap = params.capacity
    assert cap is not None
    seed = round_seed(params.seed, ctx.repeat)
    prior = previous_bracket(ctx.out_dir, ctx.repeat)
    out = SuiteResult()
    probes: list[dict[str, Any]] = []

    # one client process for every probe (with clients > 1 a process group each: run_point)
    session = (
        ClientSession(ctx, Path(ctx.out_dir) / "multi_point", "capacity probe")
        if params.clients == 1
        else None
    )

    def attain(c: float) -> float:
        k = f"c{int(c)}"
        pdir = Path(ctx.out_dir) / "probes" / k
        pdir.mkdir(parents=True, exist_ok=True)
        if probes and ctx.server is not None:
            ctx.server.flush_cache()
        ctx.log(f"serving: capacity probe {k} ({len(probes) + 1})")
        update = {"capacity": None, "max_concurrency": int(c), "seed": seed}
        pp = params.model_copy(update=update | {"num_prompts": cap.num_prompts(c)})
        if session is not None:
            r = session.run(k, pdir, pp)
        else:
            try:
                r = run_point(replace(ctx, out_dir=pdir), pp)
            except SuiteError as e:
                raise SuiteError(f"capacity probe {k}: {e}") from None
            write_json(pdir / "summary.json", r.to_json("serving"))
        out.errors.extend(f"probe {k}: {e}" for e in r.errors)
        out.warnings.extend(f"probe {k}: {w}" for w in r.warnings)
        if bound := (r.meta.get("client") or {}).get("bound"):
            probes.append({"load": int(c), "score": None, "meets": None, "client_bound": bound})
            raise ClientBound(int(c))
        a = attainment(json.loads((pdir / "requests.json").read_text()), cap.slo)
        probes.append(
            {"load": int(c), "score": a.score, "meets": a.meets, "per_bound": a.per_bound}
            | {"judged": a.judged, "met": a.met, "errored": a.errored, "excluded": a.excluded}
            | {"achieved_concurrency": r.metrics.get("concurrency")}
        )
        return a.score

    bound_at = None
    try:
        with session or nullcontext():
            s = cap.search(attain, prior=prior, dither=round_dither(seed))
        answer, lo, hi, value = s.answer, s.lo, s.hi, s.value
    except ClientBound as e:  # the search stops there; the loads met below it stay
        answer, hi, value = "client-bound", None, None
        lo = max((p["load"] for p in probes if p["meets"]), default=None)
        bound_at = e.args[0]
    out.metrics[PROBES] = float(len(probes))
    out.metrics |= {n: float(v) for n, v in ((MET, lo), (FAILED, hi)) if v is not None}
    if value is not None:
        out.metrics[CAPACITY] = float(value)
        out.metrics[CLIFF] = float(answer == "cliff")
    else:
        why = withheld_reason(cap, answer, lo, hi, bound_at)
        out.meta["not_judged"] = {CAPACITY: why}
        out.warnings.append(f"capacity {why}")
    out.meta["capacity"] = {
        "answer": answer,
        "lo": lo,
        "hi": hi,
        "value": value,
        "seed": seed,
        "dither": round_dither(seed),
        "prior": list(prior) if prior else None,
        "slo": cap.slo.model_dump() | {"definition": cap.slo.definition()},
        "probes": probes,
    }
    out.status = "incomplete" if out.errors else "ok"
    return out


class ArmRound(BaseModel):
    """One arm's search in round ``repeat``: its bench_serving ``seed``, the answer ("bracket",
    "cliff", "beyond", "never", "capped", or "client-bound": the search stopped at ``client_bound``, a probe
    whose client set the pace), the bracket (lo meets, hi fails; None where the search found no
    such end) and every judged probe as [concurrency, attainment share] in the order run."""

    repeat: int
    seed: int
    answer: Answer | Literal["client-bound"]
    lo: float | None = None
    hi: float | None = None
    probes: list[tuple[float, float]]
    client_bound: float | None = None


class CapacityPair(BaseModel):
    """The capacity search's pair entry of one variant (``compare.json`` ``pairs.serving.<variant>``):
    the SLO in words and its target share, and each arm's rounds (those where both arms' cells
    are ok), what the capacity figure draws."""

    slo_definition: str
    target: float
    baseline: list[ArmRound]
    variant: list[ArmRound]


def pair_capacity(baseline_dirs: list[Path], variant_dirs: list[Path], cap: Any) -> CapacityPair:
    """:class:`CapacityPair` from each cell's ``summary.json`` ``meta.capacity`` (a cell folder
    ``<variant>/rep<k>/<suite>``; a summary without one is left out)."""

    def arm(dirs: list[Path]) -> list[ArmRound]:
        out = []
        for d in dirs:
            m = ((read_or(Path(d) / "summary.json", {}) or {}).get("meta") or {}).get("capacity")
            if m:
                k = int(Path(d).parent.name.removeprefix("rep"))
                pts = [(p["load"], p["score"]) for p in m["probes"] if p["score"] is not None]
                ends = {f: m[f] for f in ("seed", "answer", "lo", "hi")}
                bound = [p["load"] for p in m["probes"] if p.get("client_bound")]
                out.append(
                    ArmRound(repeat=k, probes=pts, client_bound=bound[0] if bound else None, **ends)
                )
        return out

    return CapacityPair(
        slo_definition=cap.slo.definition(),
        target=cap.slo.target,
        baseline=arm(baseline_dirs),
        variant=arm(variant_dirs),
    )


def arm_interval(
    values: list[float], confidence: float
) -> tuple[float, float | None, float | None]:
    """(geometric mean, low, high) of one arm's capacities over its rounds: a t interval on the
    log values (Student 1908, as :func:`patchbench.stats.paired_t`), None ends with < 2 values.
    ValueError for no value or a value <= 0."""
    from patchbench import stats

    if not values or min(values) <= 0:
        raise ValueError(f"capacities must be > 0, got {values}")
    logs = [math.log(v) for v in values]
    gm = math.exp(sum(logs) / len(logs))
    if len(logs) < 2:
        return gm, None, None
    lo, hi = stats.paired_t(logs).interval(1 - confidence)
    return gm, math.exp(lo), math.exp(hi)


def report_lines(comparison: Any, definitions: dict[str, str]) -> list[str]:
    """Markdown "Capacity at the SLO (serving)": per variant the lead ("carries +X % [lo, hi] more
    load at the SLO", the capacity row's paired change and verdict), each arm's capacity with its
    interval (:func:`arm_interval`), the rounds whose bracket is a cliff, the rounds without a
    value (a bound or never met) and the SLO's definition (``definitions``: {variant: text})."""
    from patchbench.report.text import fmt_ci

    conf = float((comparison_get(comparison, "settings", {}) or {}).get("confidence", 0.95))
    mine = {(r["metric"], r["variant"]): r for r in suite_rows(comparison, "serving")}
    lines = ["## Capacity at the SLO (serving)", ""]
    for (m, v), r in mine.items():
        if m != CAPACITY:
            continue
        if r.get("change") is not None and r.get("low") is not None:
            ci = fmt_ci(r["low"], r["high"], r.get("change_unit") or "%")
            lines.append(
                f"- {v} carries {r['change']:+.1f} % {ci} more load at the SLO ({r['verdict']})."
            )
        else:
            lines.append(
                f"- {v}: no paired interval of the load carried at the SLO ({r['verdict']})."
            )
        for arm, vals in (("baseline", r["baseline_repeats"]), (v, r["variant_repeats"])):
            got = [x for x in vals if x is not None]
            if got:
                gm, lo, hi = arm_interval(got, conf)
                ci = (
                    ""
                    if lo is None
                    else f" [{lo:.1f}, {hi:.1f}] ({conf * 100:g} % t interval on logs)"
                )
                lines.append(f"  - {arm}: capacity {gm:.1f}{ci} over {len(got)} rounds")
        cliff = mine.get((CLIFF, v)) or {}
        met, failed = mine.get((MET, v)) or {}, mine.get((FAILED, v)) or {}
        for side, key in (("baseline", "baseline_repeats"), (v, "variant_repeats")):
            for k, c in enumerate(cliff.get(key) or []):
                if c:
                    lo, hi = met[key][k], failed[key][k]
                    lines.append(
                        f"  - {side} rep{k}: a cliff between concurrency {lo:g} and {hi:g} (the bracket, no root)"
                    )
        lines += [f"  - {n}" for n in r.get("notes", []) if n.startswith("incomplete cells")]
        if v in definitions:
            lines.append(f"  - SLO: {definitions[v]}")
    return lines + [""] if len(lines) > 2 else []
