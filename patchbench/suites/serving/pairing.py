"""Pairing two serving cells request by request (the suite's ``pair`` hook); a repeat that fails
the prompt check, or whose files cannot be read, is left out and named in a note."""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path
from typing import Any

from patchbench import stats
from patchbench.suite import PairingRefused, read_file, read_or

from .parse import requests_problem

#: at most this many ITL values per arm are kept for the ECDF (evenly spaced order statistics)
ECDF_MAX_VALUES = 2000
#: first differences listed
MAX_DIFFS = 50

#: a latency metric with a request-level interval: (quantity, statistic)
_KIND = re.compile(r"^(ttft|itl|e2e_latency)_(mean|median|p90|p95|p99)_ms$")


def read_requests(suite_dir: Path) -> tuple[dict | None, str | None]:
    """(requests.json of one cell, None) or (None, why not, naming the file); a mis-shaped file is
    never partly used."""
    p = Path(suite_dir) / "requests.json"
    data, why = read_file(p)
    if why:
        return None, why
    problem = requests_problem(data)
    if problem:
        return None, f"{p}: not a valid requests.json ({problem})"
    return data, None


def expected_requests(suite_dir: Path) -> int | None:
    """``metrics.requested_count`` of the cell's summary.json, or None when it cannot be read."""
    summary = read_or(Path(suite_dir) / "summary.json")
    v = (summary.get("metrics") or {}).get("requested_count") if isinstance(summary, dict) else None
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 0 or v != int(v):
        return None
    return int(v)


def _short_notes(k: int, side: str, suite_dir: Path, held: int) -> list[str]:
    """A note when ``suite_dir``'s requests.json holds fewer requests than its summary says."""
    want = expected_requests(suite_dir)
    if want is None or held >= want:
        return []
    return [
        f"paired repeat {k}: {Path(suite_dir) / 'requests.json'} ({side}) holds {held} requests, "
        f"its summary.json says {want} were sent: the file is short"
    ]


def request_ok(req: dict, i: int) -> bool:
    """Request i succeeded: no error and, where the file has ``status``, status "ok" (``req``: a
    checked requests.json, :func:`read_requests`)."""
    err, st = req.get("error"), req.get("status")
    return not (err and err[i]) and not (st and st[i] != "ok")


def check_prompts(rb: dict, rv: dict, n: int) -> str | None:
    """None when request i is the same prompt in both files for every i < n, else the reason."""
    bad: list[str] = []
    hb, hv = rb.get("prompt_sha256"), rv.get("prompt_sha256")
    lb, lv = rb.get("input_len"), rv.get("input_len")
    for i in range(n):
        if hb and hv and hb[i] != hv[i]:
            bad.append(f"request {i}: prompt_sha256 differs")
        elif lb and lv and lb[i] != lv[i] and request_ok(rb, i) and request_ok(rv, i):
            bad.append(f"request {i}: prompt length {lb[i]} vs {lv[i]}")
    if not bad:
        return None
    return (
        f"prompts differ at {len(bad)} of {n} indices (first: {'; '.join(bad[:3])}): "
        "requests cannot be paired by index"
    )


#: a variant output this much shorter than the baseline's counts as cut short, and this share
#: of cut-short outputs is flagged (without ignore_eos lengths may differ, not by this much)
SHORT_OUTPUT_RATIO = 0.5
SHORT_OUTPUT_SHARE = 0.1


def shorter_outputs(rb: dict, rv: dict, idx: list[int]) -> str | None:
    """The note when more than :data:`SHORT_OUTPUT_SHARE` of the paired requests ``idx`` have a
    variant output below :data:`SHORT_OUTPUT_RATIO` of the baseline's (server token counts), else
    None: a variant whose streams end early reads as a speed-up."""
    ob, ov = rb.get("output_len"), rv.get("output_len")
    if not idx or not isinstance(ob, list) or not isinstance(ov, list):
        return None
    short = [i for i in idx if (ob[i] or 0) > 0 and (ov[i] or 0) < SHORT_OUTPUT_RATIO * ob[i]]
    if len(short) <= SHORT_OUTPUT_SHARE * len(idx):
        return None
    return (
        f"{len(short)} of {len(idx)} variant outputs are less than half as long as the "
        f"baseline's (server token counts, e.g. request {short[0]}: {ov[short[0]]} vs "
        f"{ob[short[0]]}): its streams may end early, and its throughput is measured on "
        "shorter outputs"
    )


def _thin(values: list[float], cap: int = ECDF_MAX_VALUES) -> list[float]:
    """``values`` sorted; above ``cap`` values, ``cap`` evenly spaced order statistics (the
    ECDF drawn from them differs from the full one by at most 1/(cap-1) in height)."""
    xs = sorted(values)
    if len(xs) <= cap:
        return xs
    return [xs[round(j * (len(xs) - 1) / (cap - 1))] for j in range(cap)]


def _ecdf_side(req: dict, idx: list[int]) -> dict[str, Any]:
    tt, it = req.get("ttft_ms"), req.get("itl_ms")
    ttft = sorted(tt[i] for i in idx if tt[i] is not None) if tt else []
    itl = [x for i in idx for x in (it[i] or [])] if it else []
    return {"ttft_ms": ttft, "itl_ms": _thin(itl), "itl_ms_n": len(itl)}


def within_cell_interval(
    kind: str, stat: str, rb: dict, rv: dict, idx: list[int], settings: Any
) -> stats.Interval:
    """Paired-request (ttft, e2e) or request-block (itl) interval of one repeat over the request
    indices ``idx`` (succeeded in both cells). Raises ValueError when there are too few values."""
    field = {"ttft": "ttft_ms", "e2e": "e2e_ms", "itl": "itl_ms"}[kind]
    xb, xv = rb.get(field) or [], rv.get(field) or []
    idx = [i for i in idx if i < len(xb) and i < len(xv)]
    kw = {"n_resamples": settings.bootstrap_resamples, "seed": settings.seed}
    if kind == "itl":
        b, v = [xb[i] or [] for i in idx], [xv[i] or [] for i in idx]
        return stats.block_bootstrap_interval(b, v, stat, settings.confidence, **kw)
    idx = [i for i in idx if xb[i] is not None and xv[i] is not None and xb[i] > 0 and xv[i] > 0]
    b, v = [xb[i] for i in idx], [xv[i] for i in idx]
    method = settings.bootstrap_method
    return stats.paired_request_interval(b, v, stat, settings.confidence, method=method, **kw)


def pair_cells(
    baseline_dirs: list[Path], variant_dirs: list[Path], metrics: list[str], settings: Any = None
) -> dict[str, Any]:
    """The serving pair dict of one variant: ``{"request_pairing": {"ok", "reason"}, "notes",
    "unreadable", "repeats": [{"repeat_index", "baseline_requests", "variant_requests",
    "baseline_expected", "variant_expected", "requests_compared", "paired", "failed_either",
    "identical", "share"}],
    "identity": {"n", "identical", "share", "share_ci" (95 % Wilson), "first_diff",
    "first_diff_char_median"} | None, "ecdf": {"repeat_index", "baseline" / "variant": {"ttft_ms",
    "itl_ms", "itl_ms_n"}}, "descriptive": {metric: {"change_pct", "low_pct", "high_pct",
    "method"}}}``.

    ``metrics``: the latency metrics given request-level intervals (one paired repeat only);
    ``settings``: a CompareSettings (None: defaults). PairingRefused when every repeat with both
    files fails the prompt check."""
    if settings is None:
        from patchbench.analysis.comparison import CompareSettings

        settings = CompareSettings()
    notes: list[str] = []
    reps: list[dict[str, Any]] = []
    refused: list[str] = []
    used: list[tuple[int, dict, dict, list[int]]] = []
    unreadable: list[str] = []
    for k, (db, dv) in enumerate(zip(baseline_dirs, variant_dirs, strict=True)):
        got = _pair_repeat(k, Path(db), Path(dv), notes, unreadable)
        if isinstance(got, str):
            refused.append(f"paired repeat {k}: {got}")
        elif got is not None:
            reps.append(got[0])
            used.append(got[1])
    if refused and not used:
        raise PairingRefused("; ".join(refused))
    notes += refused
    pairing_reason = "; ".join(refused) if used else "; ".join(notes) or "no paired repeat"
    out: dict[str, Any] = {
        "request_pairing": {"ok": bool(used), "reason": pairing_reason},
        "notes": notes,
        "unreadable": unreadable,
        "repeats": [{k: v for k, v in r.items() if k != "diffs"} for r in reps],
        "identity": _identity(reps),
    }
    if used:
        k, rb, rv, idx = used[0]
        out["ecdf"] = {
            "repeat_index": k,
            "baseline": _ecdf_side(rb, idx),
            "variant": _ecdf_side(rv, idx),
        }
    if len(used) == 1 and getattr(settings, "within_cell_intervals", True):
        out["descriptive"] = _descriptive(metrics, used[0], settings, notes)
    return out


def _pair_repeat(
    k: int, db: Path, dv: Path, notes: list[str], unreadable: list[str]
) -> tuple[dict[str, Any], tuple[int, dict, dict, list[int]]] | str | None:
    """Pair repeat ``k``'s two cells: (its ``repeats`` entry; (k, baseline requests, variant requests,
    indices that succeeded in both)), the prompt check's reason when it refuses, or None when a
    file is missing, unreadable or empty; notes appended to ``notes`` / ``unreadable``."""
    rb, why_b = read_requests(db)
    rv, why_v = read_requests(dv)
    if rb is None or rv is None:
        whys = [w for w in (why_b, why_v) if w]
        unreadable += [w for w in whys if not w.endswith(": missing")]
        notes.append(f"paired repeat {k}: not used: " + "; ".join(whys))
        return None
    nb, nv = len(rb["generated_text"]), len(rv["generated_text"])
    n = min(nb, nv)
    notes += _short_notes(k, "baseline", db, nb) + _short_notes(k, "variant", dv, nv)
    if n == 0:
        empty = [str(d / "requests.json") for d, c in ((db, nb), (dv, nv)) if c == 0]
        notes.append(f"paired repeat {k}: not used: {' and '.join(empty)} holds no requests")
        return None
    if nb != nv:
        short = db / "requests.json" if nb < nv else dv / "requests.json"
        notes.append(
            f"paired repeat {k}: {short} holds {min(nb, nv)} requests, the other cell "
            f"{max(nb, nv)}: only requests 0..{n - 1} were paired"
        )
    reason = check_prompts(rb, rv, n)
    if reason:
        return reason
    idx = [i for i in range(n) if request_ok(rb, i) and request_ok(rv, i)]
    short = shorter_outputs(rb, rv, idx)
    if short:
        notes.append(f"paired repeat {k}: {short}")
    tb, tv = rb["generated_text"], rv["generated_text"]
    same = 0
    diffs: list[dict[str, int]] = []
    for i in idx:
        a, b = tb[i] or "", tv[i] or ""
        if a == b:
            same += 1
        else:
            diffs.append({"repeat": k, "request": i, "char": len(os.path.commonprefix([a, b]))})
    rep = {
        "repeat_index": k,
        "baseline_requests": nb,
        "variant_requests": nv,
        "baseline_expected": expected_requests(db),
        "variant_expected": expected_requests(dv),
        "requests_compared": [0, n - 1],
        "paired": len(idx),
        "failed_either": n - len(idx),
        "identical": same,
        "share": same / len(idx) if idx else None,
        "diffs": diffs,
    }
    return rep, (k, rb, rv, idx)


def _identity(reps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Output identity over the paired repeats (identical share, its 95 % Wilson interval, the
    first differences); None when no request was paired."""
    n = sum(r["paired"] for r in reps)
    ident = sum(r["identical"] for r in reps)
    diffs = [d for r in reps for d in r["diffs"]]
    if not n:
        return None
    lo, hi = stats.wilson_interval(ident, n, 0.95)
    return {
        "n": n,
        "identical": ident,
        "share": ident / n,
        "share_ci": [float(lo), float(hi)],
        "first_diff": diffs[:MAX_DIFFS],
        "first_diff_char_median": (statistics.median(d["char"] for d in diffs) if diffs else None),
    }


def _descriptive(
    metrics: list[str], used: tuple[int, dict, dict, list[int]], settings: Any, notes: list[str]
) -> dict[str, dict[str, Any]]:
    """Request-level intervals of the latency ``metrics`` in the one paired repeat ``used``
    (descriptive only); a metric without one gets a note."""
    _k, rb, rv, idx = used
    desc: dict[str, dict[str, Any]] = {}
    for m in metrics:
        kind = _KIND.match(m)  # ttft_median_ms -> ("ttft", "median")
        if kind is None:
            continue
        what = "e2e" if kind.group(1) == "e2e_latency" else kind.group(1)
        try:
            iv = within_cell_interval(what, kind.group(2), rb, rv, idx, settings)
        except ValueError as e:
            notes.append(f"{m}: no request-level interval ({e})")
            continue
        if iv.ok:
            desc[m] = {
                "change_pct": 100 * iv.estimate,
                "low_pct": 100 * iv.low,
                "high_pct": 100 * iv.high,
                "method": iv.method,
            }
    return desc
