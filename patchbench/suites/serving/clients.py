"""The client processes of one point and whether they set the pace (docs/serving.md, "Is the
client the bottleneck?"): the plan that runs bench_serving under ``clientwatch.py`` (one process,
or ``clients`` processes sharing the prompts and the concurrency), their records merged into the
point's one result, and the client-bound rule on what each process recorded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from patchbench.records import write_json, write_jsonl

from .parse import DETAIL_KEYS, read_result_line
from .validity import recompute_from_details

#: the client-side script that runs and watches bench_serving
SCRIPT = Path(__file__).with_name("clientwatch.py")
#: client-bound when the median send lag exceeds this share of the mean gap between sends ...
SEND_LAG_SHARE = 0.10
#: ... or the process used more than this share of one core (user + sys CPU over wall seconds)
CPU_SHARE = 0.90
#: the tool's keys summed over the processes (the rest of the summary is recomputed)
_SUMMED = (
    "total_output_tokens_retokenized",
    "total_input_text_tokens",
    "total_input_vision_tokens",
)


def split(total: int | None, n: int) -> list[int | None]:
    """``total`` (a concurrency; None: unlimited) shared by ``n`` processes, the first ones taking
    one more: 8 by 3 -> [3, 3, 2]."""
    if total is None:
        return [None] * n
    return [total // n + (k < total % n) for k in range(n)]


def plan(argv: list[str], out_dir: Path, n: int) -> tuple[list[str], list[Path]]:
    """Write ``out_dir``/clients.json, the plan of ``clientwatch.py`` for the bench_serving
    command ``argv`` (``python -m sglang.bench_serving ...``) run by ``n`` processes (each its
    share of ``--max-concurrency`` and its own ``--output-file`` in ``out_dir``/client<k>/ when
    ``n`` > 1); (the command that runs it, the processes' own stdout and stderr files when
    ``n`` > 1). ValueError for another command."""
    if argv[1:3] != ["-m", "sglang.bench_serving"]:
        raise ValueError(f"unexpected bench_serving command {argv[:3]}")
    args = list(argv[3:])
    out_dir = Path(out_dir)
    barrier = out_dir / "barrier"
    for f in barrier.glob("ready-*"):
        f.unlink()
    if n == 1:
        clients = [{"argv": args, "dir": str(out_dir)}]
    else:
        conc = None
        if "--max-concurrency" in args:
            conc = int(args[args.index("--max-concurrency") + 1])
        clients = []
        for k, c in enumerate(split(conc, n)):
            a, d = list(args), out_dir / f"client{k}"
            a[a.index("--output-file") + 1] = str(d / "result.jsonl")
            if c is not None:
                a[a.index("--max-concurrency") + 1] = str(c)
            d.mkdir(parents=True, exist_ok=True)
            (d / "result.jsonl").unlink(missing_ok=True)
            clients.append({"argv": a, "dir": str(d)})
    for c in clients:  # a re-run's tool may write none
        (Path(c["dir"]) / "client.json").unlink(missing_ok=True)
    path = out_dir / "clients.json"
    write_json(path, {"module": argv[2], "barrier": str(barrier), "clients": clients})
    outputs = [Path(c["dir"]) / f for c in clients for f in ("stdout.txt", "stderr.txt")]
    return [argv[0], str(SCRIPT), str(path)], outputs if n > 1 else []


def records(out_dir: Path, n: int) -> list[dict] | None:
    """Each process's client.json (``clientwatch.py``), None when one is missing (a tool that
    ran no benchmark)."""
    dirs = [Path(out_dir)] if n == 1 else [Path(out_dir) / f"client{k}" for k in range(n)]
    try:
        return [json.loads((d / "client.json").read_text()) for d in dirs]
    except (OSError, ValueError):
        return None


def send_lags(
    requests: list[list[float | None]], gaps: list[float], concurrency: int | None, rate: float
) -> list[float]:
    """Seconds each sent request (in the order made) left after it was due: due = max(its time
    in the arrival schedule, the end of the request whose slot it takes: the (i - concurrency)-th
    to end, 0-based). The schedule: at a finite rate the sum of the gaps drawn before it; at rate
    inf the time the tool made the request (0 for the release's own dataset; a wrapper that holds
    a request back, the traffic suite's multi-turn replay, makes it when its turn is due)."""
    ends = sorted(r[2] for r in requests if r[2] is not None)
    sched = [r[0] for r in requests] if math.isinf(rate) else list(np.cumsum([0.0, *gaps]))
    out = []
    for i, (_made, sent, _end) in enumerate(requests):
        if sent is None:
            continue
        due = sched[i] if i < len(sched) else sched[-1]
        if concurrency is not None and i >= concurrency and i - concurrency < len(ends):
            due = max(due, ends[i - concurrency])
        out.append(sent - due)
    return out


def process_state(rec: dict, concurrency: int | None, rate: float) -> dict[str, Any]:
    """One process's numbers (ms, the share of a core) and ``bound``: why it was client-bound
    (the module's rule; a burst, rate inf without a concurrency, has no schedule to lag: CPU
    only), or None."""
    lags = np.array(send_lags(rec["requests"], rec["gaps_s"], concurrency, rate)) * 1000
    sent = sorted(r[1] for r in rec["requests"] if r[1] is not None)
    loop = np.array(rec["loop_lag_s"] or [0.0]) * 1000
    gap = (sent[-1] - sent[0]) / (len(sent) - 1) * 1000 if len(sent) > 1 else None
    st: dict[str, Any] = {
        "requests": len(rec["requests"]),
        "send_lag_median_ms": float(np.median(lags)) if lags.size else None,
        "send_lag_p99_ms": float(np.percentile(lags, 99)) if lags.size else None,
        "send_gap_mean_ms": gap,
        "loop_lag_median_ms": float(np.median(loop)),
        "loop_lag_p99_ms": float(np.percentile(loop, 99)),
        "loop_lag_max_ms": float(loop.max()),
        "cpu_s": rec["cpu_s"],
        "wall_s": rec["wall_s"],
        "cpu_share": rec["cpu_s"] / rec["wall_s"] if rec["wall_s"] > 0 else None,
    }
    why = []
    burst = math.isinf(rate) and concurrency is None
    lag = st["send_lag_median_ms"]
    if not burst and lag is not None and gap and lag > SEND_LAG_SHARE * gap:
        why.append(
            f"median send lag {lag:.3g} ms above {SEND_LAG_SHARE:.0%} of the mean gap between "
            f"sends ({gap:.3g} ms)"
        )
    if st["cpu_share"] is not None and st["cpu_share"] > CPU_SHARE:
        why.append(f"the client process used {st['cpu_share']:.0%} of a core (> {CPU_SHARE:.0%})")
    st["bound"] = "; ".join(why) or None
    return st


def client_state(recs: list[dict], concurrency: int | None, rate: float) -> dict[str, Any]:
    """The point's client state: one process's :func:`process_state`; with several, each number
    the largest over them, ``per_process`` and ``bound`` naming each bound process
    (``concurrency``: the point's, shared as :func:`split`)."""
    per = [
        process_state(r, c, rate) for r, c in zip(recs, split(concurrency, len(recs)), strict=True)
    ]
    if len(per) == 1:
        return per[0] | {"processes": 1}
    out: dict[str, Any] = {"processes": len(per), "per_process": per}
    for key in per[0]:
        vals = [p[key] for p in per if isinstance(p[key], int | float)]
        out[key] = max(vals) if vals else None
    out["requests"] = sum(p["requests"] for p in per)
    bound = [f"client {k}: {p['bound']}" for k, p in enumerate(per) if p["bound"]]
    out["bound"] = "; ".join(bound) or None
    starts = [r["start"] for r in recs]
    out["start_skew_ms"] = (max(starts) - min(starts)) * 1000
    return out


def merge_point(out_dir: Path, n: int) -> None:
    """``out_dir``/result.jsonl merged (:func:`merge_rows`) from the ``n`` processes' files in
    ``out_dir``/client<k>/; ValueError (a :class:`.parse.ResultError` too) naming what is missing."""
    recs = records(out_dir, n)
    if recs is None:
        raise ValueError("a client process wrote no client.json")
    rows = [read_result_line(Path(out_dir) / f"client{k}" / "result.jsonl") for k in range(n)]
    write_jsonl(Path(out_dir) / "result.jsonl", [merge_rows(rows, recs)])


def merge_rows(rows: list[dict], recs: list[dict]) -> dict[str, Any]:
    """One result row from the processes' rows (``recs``: their client.json): the details in the
    one prompt list's order (``indices``), the duration the union's wall span (first start to
    last end), the summary recomputed from the details (:func:`.validity.recompute_from_details`:
    throughputs over that span, percentiles over the union) in the tool's key names."""
    n = sum(len(r["ttfts"]) for r in rows)
    merged: dict[str, Any] = {k: [None] * n for k in DETAIL_KEYS}
    for row, rec in zip(rows, recs, strict=True):
        for k in DETAIL_KEYS:
            for i, v in zip(rec["indices"], row[k], strict=True):
                merged[k][i] = v
    starts = [r["start"] for r in recs]
    span = max(r["start"] + r["wall_s"] for r in recs) - min(starts)
    merged.update({k: rows[0].get(k) for k in ("backend", "dataset_name", "request_rate")})
    conc = [r.get("max_concurrency") for r in rows]
    merged["max_concurrency"] = None if None in conc else sum(conc)
    merged["duration"] = span
    m = recompute_from_details(merged, as_tool=True)
    merged |= {
        "completed": int(m["tool_completed_count"]),
        "total_input_tokens": int(m["details_input_tokens_count"]),
        "total_output_tokens": int(m["total_output_tokens_count"]),
        "request_throughput": m["request_throughput_req_s"],
        "input_throughput": m["details_input_tokens_count"] / span,
        "output_throughput": m["output_throughput_tok_s"],
        "concurrency": m["concurrency"],
    }
    for q in ("ttft", "itl", "tpot", "e2e_latency"):
        for s in ("mean", "median", "std", "p90", "p95", "p99"):
            if f"{q}_{s}_ms" in m:
                merged[f"{s}_{q}_ms"] = m[f"{q}_{s}_ms"]
    for k in _SUMMED:
        if all(k in r for r in rows):
            merged[k] = sum(r[k] for r in rows)
    return merged
