"""Reading bench_serving's ``--output-file`` line (with ``--output-details``) for both releases.

The file's keys: docs/FACTS.md section 2. 0.5.1.post3 writes no total_throughput, no p90/p95
(but p95 ITL) and no max_itl_ms; 0.5.23 adds total_throughput, p90/p95, total_input_text_tokens /
total_input_vision_tokens, max_output_tokens_per_s, max_concurrent_requests (still no max_itl_ms),
and its ``input_lens`` is the SERVER's ``meta_info.prompt_tokens`` (``_record_server_prompt_len``)
where 0.5.1.post3's is the client's text-token count.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from patchbench.suite import MetricInfo

#: the release's latency key prefix -> our metric prefix
_LATENCIES = {"e2e_latency": "e2e_latency", "ttft": "ttft", "tpot": "tpot", "itl": "itl"}
_STATS = ("mean", "median", "std", "p90", "p95", "p99")

#: the release's scalar key -> (our metric name). Throughputs are per second of benchmark duration.
_SCALARS = {
    "duration": "duration_s",
    "completed": "tool_completed_count",
    "total_input_tokens": "total_input_tokens_count",
    "total_input_text_tokens": "total_input_text_tokens_count",
    "total_input_vision_tokens": "total_input_vision_tokens_count",
    "total_output_tokens": "total_output_tokens_count",
    "total_output_tokens_retokenized": "total_output_tokens_retokenized_count",
    "request_throughput": "request_throughput_req_s",
    "input_throughput": "input_throughput_tok_s",
    "output_throughput": "output_throughput_tok_s",
    "total_throughput": "total_throughput_tok_s",
    "concurrency": "concurrency",
    "max_output_tokens_per_s": "peak_output_throughput_tok_s",
    "max_concurrent_requests": "peak_concurrent_requests_count",
    "accept_length": "accept_length",
}

DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")


class ResultError(ValueError):
    """The output file is missing, empty, or lacks the keys a run must have."""


def read_result_line(path: Path) -> dict[str, Any]:
    """The last JSON line of bench_serving's ``--output-file``; ResultError naming the file when
    it is missing, empty, not JSON or refused (:func:`row_problem`)."""
    path = Path(path)
    if not path.is_file():
        raise ResultError(f"{path}: bench_serving wrote no output file")
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ResultError(f"{path}: output file is empty")
    try:
        row = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ResultError(f"{path}: last line is not JSON ({e.msg})") from None
    for key in ("duration", "completed", "total_output_tokens", "mean_ttft_ms"):
        if key not in row:
            raise ResultError(f"{path}: key '{key}' missing from bench_serving's result")
    missing = [k for k in DETAIL_KEYS if k not in row]
    if missing:
        raise ResultError(
            f"{path}: no per-request details ({', '.join(missing)} missing); "
            "was --output-details passed?"
        )
    problem = row_problem(row)
    if problem:
        raise ResultError(f"{path}: {problem}; the result is refused")
    return row


#: the largest values any hardware can produce: beyond them a number is a bug, not a measurement
#: (a rate in requests or tokens per second; a latency or duration in ms / s)
MAX_RATE_PER_S = 1e8
MAX_LATENCY_MS = 1e8  # about 28 hours
#: a positive latency below this (ms) is no time a request can take (a picosecond)
MIN_POSITIVE_LATENCY_MS = 1e-9
_RATES = ("request_throughput", "input_throughput", "output_throughput", "total_throughput")
_RATES += ("max_output_tokens_per_s",)
#: summary keys that are rates, durations or counts: never negative
_NON_NEGATIVE = ("duration", "completed", "total_input_tokens", "total_output_tokens", *_RATES)


def _bad_number(v: Any, *, none_ok: bool = False) -> bool:
    """True unless ``v`` is a finite number >= 0 (or None when ``none_ok``)."""
    if v is None:
        return not none_ok
    if isinstance(v, bool) or not isinstance(v, int | float):
        return True
    return not (math.isfinite(v) and v >= 0)


def row_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with a bench_serving result row, or None: a negative or non-finite
    throughput, duration or count; a negative or infinite latency (NaN, the tool's statistic of no
    values, passes); a value no hardware can produce; details that are not
    lists of one length of numbers >= 0 (texts: strings or null)."""
    for k in _NON_NEGATIVE:
        if k in row and _bad_number(row[k], none_ok=True):
            return (
                f"bench_serving reported {k} = {row[k]!r}; a throughput, duration or count must "
                "be a finite number >= 0"
            )
    latencies = {
        k: v
        for k, v in row.items()
        if k.endswith("_ms") and isinstance(v, int | float) and not isinstance(v, bool)
    }
    for k, v in latencies.items():
        if v < 0:
            return f"bench_serving reported {k} = {v!r}; a latency cannot be negative"
    # values no hardware produces: zero duration or throughput although requests completed, a
    # rate above MAX_RATE_PER_S, a latency above MAX_LATENCY_MS or positive below the minimum
    if (_num(row.get("completed")) or 0) > 0:
        for k in ("duration", "output_throughput", "request_throughput"):
            v = _num(row.get(k))
            if v is not None and v <= 0:
                return (
                    f"bench_serving reported {k} = {v!r} with {int(_num(row['completed']))} "
                    "requests completed; only a positive value is possible"
                )
    for k in _RATES:
        v = _num(row.get(k))
        if v is not None and v > MAX_RATE_PER_S:
            return f"bench_serving reported {k} = {v!r}; no hardware reaches {MAX_RATE_PER_S:g}/s"
    for k, v in latencies.items():
        tiny = 0 < v < MIN_POSITIVE_LATENCY_MS and not k.startswith("std_")
        if math.isfinite(v) and (v > MAX_LATENCY_MS or tiny):
            return f"bench_serving reported {k} = {v!r} ms; no request takes that long or short"
        if math.isinf(v):
            return f"bench_serving reported {k} = {v!r}; a latency must be finite"
    lens = {k: len(row[k]) if isinstance(row[k], list) else None for k in DETAIL_KEYS}
    not_lists = [k for k, n in lens.items() if n is None]
    if not_lists:
        return f"per-request details {', '.join(not_lists)} are not lists"
    if len(set(lens.values())) > 1:
        return (
            "per-request details of different lengths ("
            + ", ".join(f"{k} {n}" for k, n in lens.items())
            + ")"
        )
    for k in ("ttfts", "input_lens", "output_lens"):
        for i, v in enumerate(row[k]):
            if _bad_number(v):
                return f"{k}[{i}] = {v!r}: not a number >= 0"
    for i, itl in enumerate(row["itls"]):
        if not isinstance(itl, list) or any(_bad_number(x) for x in itl):
            return f"itls[{i}]: not a list of numbers >= 0"
    for k in ("generated_texts", "errors"):
        for i, v in enumerate(row[k]):
            if v is not None and not isinstance(v, str):
                return f"{k}[{i}] = {v!r}: not a string"
    return None


REQUEST_STATUSES = ("ok", "failed", "no_token", "asked_zero")
_TEXT = (lambda v: v is None or isinstance(v, str), "a string or null")
_NUMBER = (lambda v: not _bad_number(v, none_ok=True), "a number >= 0 or null")
#: requests.json lists (docs/CONTRACTS.md): (what each element may be, its description)
_REQ_FIELDS = {
    "generated_text": _TEXT,
    "error": _TEXT,
    "status": (lambda v: v in REQUEST_STATUSES, " / ".join(REQUEST_STATUSES)),
    "prompt_sha256": _TEXT,
    "ttft_ms": _NUMBER,
    "e2e_ms": _NUMBER,
    "itl_ms": (
        lambda v: v is None or (isinstance(v, list) and not any(_bad_number(x) for x in v)),
        "a list of numbers >= 0",
    ),
    "input_len": _NUMBER,
    "output_len": _NUMBER,
}


def requests_problem(data: Any) -> str | None:
    """What is wrong with the shape of a ``requests.json`` (:func:`request_records`), or None:
    a ``generated_text`` list is required; each other field present must be a list of the same
    length whose elements are of its kind in :data:`_REQ_FIELDS`."""
    if not isinstance(data, dict):
        return f"not a JSON object but {type(data).__name__}"
    if not isinstance(data.get("generated_text"), list):
        return "no generated_text list"
    n = len(data["generated_text"])
    for key, (ok, what) in _REQ_FIELDS.items():
        if key not in data:
            continue
        xs = data[key]
        if not isinstance(xs, list):
            return f"{key} is not a list"
        if len(xs) != n:
            return f"{key} holds {len(xs)} values, generated_text {n}"
        bad = next((i for i, v in enumerate(xs) if not ok(v)), None)
        if bad is not None:
            return f"{key}[{bad}] = {xs[bad]!r}: expected {what}"
    return None


def _num(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def summary_metrics(row: dict[str, Any]) -> dict[str, float]:
    """bench_serving's own summary as flat metrics with units in the names; keys the release
    does not write are absent, except two derived as the tool prints them:
    ``total_throughput_tok_s`` (0.5.1.post3) and ``itl_max_ms`` (max ITL of successful requests).
    """
    m: dict[str, float] = {}
    for key, name in _SCALARS.items():
        v = _num(row.get(key))
        if v is not None and math.isfinite(v):
            m[name] = v
    for q, ours in _LATENCIES.items():
        for s in _STATS:
            v = _num(row.get(f"{s}_{q}_ms"))
            if v is not None:
                m[f"{ours}_{s}_ms"] = v
    if "total_throughput_tok_s" not in m and m.get("duration_s"):
        m["total_throughput_tok_s"] = (
            m["total_input_tokens_count"] + m["total_output_tokens_count"]
        ) / m["duration_s"]
    itls = [
        x for out, itl in zip(row["output_lens"], row["itls"], strict=False) if out for x in itl
    ]
    m["itl_max_ms"] = float(np.max(itls)) * 1000 if itls else 0.0
    return m


def request_records(row: dict[str, Any]) -> dict[str, list]:
    """Per-request lists for ``requests.json`` (docs/CONTRACTS.md), request i = prompt i.

    e2e_ms is ttft + sum(itl), the time of the last token (the details hold no per-request E2E);
    status (:func:`request_status`) "ok", "failed" or "no_token"; ttft_ms / e2e_ms None unless ok.
    """
    keys = ("ttft_ms", "itl_ms", "e2e_ms", "input_len", "output_len", "generated_text", "error")
    recs: dict[str, list] = {k: [] for k in (*keys, "status")}
    for inp, out, ttft, itl, text, err in zip(*(row[k] for k in DETAIL_KEYS), strict=False):
        status = request_status(out, ttft, itl, err)
        ok = status == "ok"
        itl_ms = [x * 1000 for x in itl]
        recs["ttft_ms"].append(ttft * 1000 if ok else None)
        recs["itl_ms"].append(itl_ms)
        recs["e2e_ms"].append(ttft * 1000 + sum(itl_ms) if ok else None)
        recs["input_len"].append(inp)
        recs["output_len"].append(out)
        recs["generated_text"].append(text)
        recs["error"].append(err or "")
        recs["status"].append(status)
    return recs


def request_status(output_len: int, ttft_s: float, itl_s: list[float], error: str) -> str:
    """ "failed" (an error, or output length 0: 0.5.1.post3's error can be empty), "no_token" (a
    success whose stream carried no text: TTFT 0.0 never set, the requested length recorded; the
    tool counts it a success, we do not) or "ok"."""
    if error or not output_len:
        return "failed"
    if ttft_s <= 0.0:
        return "no_token"
    return "ok"


#: the primary metrics (Holm family of a variant; the headline) and their default margin (%)
PRIMARY = ("output_throughput_tok_s", "itl_median_ms", "ttft_median_ms", "e2e_latency_median_ms")
MARGIN_PCT = 5.0


def _metrics() -> dict[str, MetricInfo]:
    def judged(name: str, better: str, unit: str, label: str) -> None:
        m[name] = MetricInfo(better, unit, label, name in PRIMARY, "run", MARGIN_PCT)

    def shown(name: str, unit: str, label: str = "", better: str = "none") -> None:
        m[name] = MetricInfo(better, unit, label, kind="descriptive")

    m: dict[str, MetricInfo] = {}
    for name, label in (
        ("request_throughput_req_s", "Request throughput (req/s):"),
        ("input_throughput_tok_s", "Input token throughput (tok/s):"),
        ("output_throughput_tok_s", "Output token throughput (tok/s):"),
        ("total_throughput_tok_s", "Total token throughput (tok/s):"),
        ("peak_output_throughput_tok_s", "Peak output token throughput (tok/s):"),
    ):
        judged(name, "higher", name.rsplit("_", 2)[-2] + "/s", label)
    for q, lab in (
        ("e2e_latency", "E2E Latency"),
        ("ttft", "TTFT"),
        ("tpot", "TPOT"),
        ("itl", "ITL"),
    ):
        for stat in ("mean", "median", "p90", "p95", "p99"):
            word = stat.upper() if stat[0] == "p" else stat.title()
            judged(f"{q}_{stat}_ms", "lower", "ms", f"{word} {lab} (ms):")
        shown(f"{q}_std_ms", "ms")  # spread, descriptive only
    judged("itl_max_ms", "lower", "ms", "Max ITL (ms):")
    shown("concurrency", "req", "Concurrency:")
    shown("duration_s", "s", "Benchmark duration (s):")
    shown("accept_length", "tok", "Accept length:")
    shown("retokenized_output_share", "share")
    for name, label in (
        ("requested_count", ""),
        ("completed_count", ""),
        ("failed_count", ""),
        ("no_token_count", ""),
        ("asked_zero_count", ""),
        ("tool_completed_count", "Successful requests:"),
        ("total_input_tokens_count", "Total input tokens:"),
        ("total_input_text_tokens_count", "Total input text tokens:"),
        ("total_input_vision_tokens_count", "Total input vision tokens:"),
        ("total_output_tokens_count", "Total generated tokens:"),
        ("total_output_tokens_retokenized_count", "Total generated tokens (retokenized):"),
        ("peak_concurrent_requests_count", "Peak concurrent requests:"),
    ):
        shown(name, "count", label)
    # what the server logged during the suite (patchbench.run.logscan): shown, never judged
    for name in ("retractions_count", "retracted_requests_count", "oom_count"):
        shown(name, "count", better="lower")
    return m


#: every metric the suite can report, labelled as bench_serving prints it: throughputs and
#: latencies judged (kind "run", margin 5 %, :data:`PRIMARY` primary), the rest descriptive
METRICS: dict[str, MetricInfo] = _metrics()
