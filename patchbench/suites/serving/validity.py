"""Is a bench_serving run a valid measurement? (docs/cases.md S3.) Each check returns error /
warning lines; an error makes the cell "incomplete" (no verdict)."""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import numpy as np

from .parse import DETAIL_KEYS, request_status


def asked_zero(
    statuses: list[str], output_lens: list[int], errors: list[str], asked: list[int] | None
) -> list[int]:
    """The requests that asked for no output token and got none, without an error: the release's
    random draw at ``random_range_ratio`` 0 can ask 0 (``asked``: :func:`asked_output_lens`),
    the tool counts them successes and a server from 0.5.6 on answers them with no token. Their
    status (``"failed"`` by :func:`.parse.request_status`, which cannot know what was asked) is
    theirs to correct to ``"asked_zero"``: not a failure, and no latency to time."""
    if asked is None:
        return []
    return [
        i
        for i, (s, n, e) in enumerate(zip(statuses, output_lens, errors, strict=False))
        if s == "failed" and i < len(asked) and asked[i] == 0 and not n and not (e or "").strip()
    ]


def request_checks(
    statuses: list[str], errors: list[str], *, num_prompts: int, tool_completed: int
) -> tuple[list[str], list[str]]:
    """Errors and warnings about requests sent short, failed, or that streamed no token.

    statuses: per request "ok" | "failed" | "no_token" (:func:`.parse.request_status`) |
    "asked_zero" (:func:`asked_zero`: neither a failure nor a measurement);
    num_prompts: requests asked for; tool_completed: the tool's "completed" count."""
    errs: list[str] = []
    warns: list[str] = []
    sent = len(statuses)
    if sent < num_prompts:
        warns.append(
            f"bench_serving sent {sent} requests, {num_prompts} were asked for "
            "(its dataset produced fewer prompts); every variant gets the same ones"
        )
    failed = [e for s, e in zip(statuses, errors, strict=False) if s == "failed"]
    if failed:
        common = Counter(
            (e or "(no error text)").strip().splitlines()[-1][:200] for e in failed
        ).most_common(3)
        errs.append(
            f"{len(failed)} of {sent} requests failed: "
            + "; ".join(f"{n}x {msg}" for msg, n in common)
        )
    no_tok = statuses.count("no_token")
    if no_tok:
        errs.append(
            f"{no_tok} of {sent} responses streamed no token (TTFT 0 with tokens > 0): "
            f"bench_serving counts them as successes (its completed={tool_completed}, its "
            "token totals include their requested lengths); we count them as failed"
        )
    if sent and not any(s == "ok" for s in statuses):
        errs.append("no request produced a valid measurement")
    return errs, warns


#: the line both pinned releases print after drawing the lengths (0.5.1.post3
#: ``sample_random_requests`` / ``sample_image_requests``, 0.5.23 ``benchmark/datasets/random.py``
#: / ``image.py``): the sum of the asked output lengths
_ASKED_SUM = re.compile(r"^#Output tokens: (\d+)\s*$", re.MULTILINE)


def asked_output_lens(
    tool_stdout: str,
    *,
    output_len: int,
    input_len: int,
    range_ratio: float,
    num_prompts: int,
    seed: int | None,
) -> list[int] | None:
    """Each request's asked output length (request i = prompt i), the release's seeded draw
    replayed (docs/cases.md S4; numpy's legacy generator is stable across versions, NEP 19), or
    None when the replay's sum is not the ``#Output tokens: N`` the release printed."""
    sums = _ASKED_SUM.findall(tool_stdout)
    if seed is None or len(sums) != 1:
        return None
    printed = int(sums[0])
    lows = dict.fromkeys((int(output_len * range_ratio), max(int(output_len * range_ratio), 1)))
    for lo in lows:
        rng = np.random.RandomState(seed)
        rng.randint(max(int(input_len * range_ratio), 1), input_len + 1, size=num_prompts)
        lens = [int(x) for x in rng.randint(lo, output_len + 1, size=num_prompts)]
        if sum(lens) == printed:
            return lens
    return None


def output_length_checks(
    output_lens: list[int],
    statuses: list[str],
    *,
    output_len: int,
    range_ratio: float,
    fixed: bool,
    ignore_eos: bool,
    asked: list[int] | None = None,
) -> list[str]:
    """Errors for successful requests whose server token count (bench_serving's ``output_lens``) is
    below what ``ignore_eos`` guarantees or above the requested maximum (docs/cases.md S4); []
    without ``ignore_eos``. ``asked``: :func:`asked_output_lens` (None: only the floor of
    ``[int(output_len * range_ratio), output_len]`` is known)."""
    if not ignore_eos:
        return []
    ok = [(i, n) for i, (n, s) in enumerate(zip(output_lens, statuses, strict=False)) if s == "ok"]
    if asked is not None and len(asked) >= len(output_lens):
        # 0.5.1.post3 may draw 0; the server generates one token for it (recorded:
        # tests/data/serving/v0513_random_image)
        asked = [max(a, 1) for a in asked]
        short = [(i, n) for i, n in ok if n < asked[i]]
        long = [(i, n) for i, n in ok if n > asked[i]]
        errs = []
        if short:
            i, n = min(short, key=lambda t: t[1] - asked[t[0]])
            errs.append(
                f"{len(short)} of {len(ok)} successful outputs are shorter than the length each "
                f"asked with ignore_eos (the server's token counts against each request's asked "
                f"length; request {i} asked {asked[i]}, got {n}): streams ended early, the "
                "measurement is invalid"
            )
        if long:
            i, n = max(long, key=lambda t: t[1] - asked[t[0]])
            errs.append(
                f"{len(long)} of {len(ok)} outputs are longer than the length each asked "
                f"(request {i} asked {asked[i]}, got {n}): the server's counts cannot be trusted"
            )
        return errs
    floor = output_len if fixed else int(output_len * range_ratio)
    short = [(i, n) for i, n in ok if n < floor or n < 1]
    long = [(i, n) for i, n in ok if n > output_len]
    errs = []
    if short:
        i, n = min(short, key=lambda t: t[1])
        want = f"{output_len}" if fixed else f"at least {floor} (of at most {output_len})"
        errs.append(
            f"{len(short)} of {len(ok)} successful outputs are shorter than ignore_eos "
            f"guarantees (the server's token counts; expected {want}, shortest {n} at request "
            f"{i}): streams ended early, the measurement is invalid"
        )
    if long:
        i, n = max(long, key=lambda t: t[1])
        errs.append(
            f"{len(long)} of {len(ok)} outputs are longer than the requested {output_len} tokens "
            f"(longest {n} at request {i}): the server's counts cannot be trusted"
        )
    return errs


def images_check(
    *,
    server_prompt_tokens: float | None,
    text_prompt_tokens: float | None,
    images_sent: int,
    min_extra_tokens_per_image: int,
    min_ratio: float | None,
    source: str,
) -> tuple[list[str], dict[str, Any]]:
    """Errors ("images dropped": the server's prompt tokens exceed the text-only count by fewer than
    ``min_extra_tokens_per_image`` per image sent, or stay under ``min_ratio``) and the numbers
    behind them; ``source`` (where the server's count came from) is shown in the error."""
    info = {
        "images_server_prompt_tokens_count": server_prompt_tokens,
        "images_text_prompt_tokens_count": text_prompt_tokens,
        "images_sent_count": images_sent,
        "images_check_source": source,
    }
    if server_prompt_tokens is None or text_prompt_tokens is None or images_sent <= 0:
        return [f"images check could not run ({source}): no server-side prompt token count"], info
    extra = server_prompt_tokens - text_prompt_tokens
    info["images_extra_tokens_per_image"] = extra / images_sent
    errs = []
    if extra < min_extra_tokens_per_image * images_sent:
        errs.append(
            f"images dropped: the server counted {server_prompt_tokens:.0f} prompt tokens "
            f"for {images_sent} image(s) and {text_prompt_tokens:.0f} text tokens "
            f"({extra / images_sent:.1f} extra tokens per image, at least "
            f"{min_extra_tokens_per_image} expected; {source}). On sglang < 0.5.6 image "
            "prompts need --apply-chat-template (Params.apply_chat_template)"
        )
    elif (
        min_ratio is not None
        and text_prompt_tokens > 0
        and server_prompt_tokens / text_prompt_tokens < min_ratio
    ):
        errs.append(
            f"images dropped?: server/text prompt tokens "
            f"{server_prompt_tokens / text_prompt_tokens:.2f} < {min_ratio} ({source})"
        )
    return errs, info


#: the smallest median ITL / median TPOT a measured ITL can have: a decode step's gap is on
#: average the TPOT, so a median gap below a tenth of it is streamed chunks read together
ITL_TPOT_FLOOR = 0.1


def coalesced_itl(metrics: dict[str, float]) -> str | None:
    """Why the ITL metrics of one run time nothing, or None: a median ITL under
    :data:`ITL_TPOT_FLOOR` x the median TPOT means the client read the streamed tokens in bunches."""
    itl, tpot = metrics.get("itl_median_ms"), metrics.get("tpot_median_ms")
    if itl is None or tpot is None or tpot <= 0 or itl >= ITL_TPOT_FLOOR * tpot:
        return None
    return (
        f"median ITL {itl:.3g} ms is under a tenth of median TPOT {tpot:.3g} ms: the client read "
        "the streamed tokens in bunches, so the gaps time its reads, not decode steps; ITL "
        "metrics withheld"
    )


#: (E2E - TTFT) / (tokens - 1) in ms below which a request's tokens were read together, and the
#: share of such requests that withholds a run's TPOT and ITL (docs/serving.md, "Streams read in
#: bunches")
BUNCHED_TPOT_MS = 0.05
BUNCHED_SHARE = 0.5


def bunched_check(
    ttft_ms: list[float | None],
    e2e_ms: list[float | None],
    output_lens: list[int],
    statuses: list[str],
) -> list[str]:
    """The line of a run whose streams came in bunches (docs/serving.md, "Streams read in
    bunches"), [] otherwise. Per request: ``ttft_ms`` and ``e2e_ms`` (ms, the time of the last
    token: :func:`.parse.request_records`), ``output_lens`` (tokens), ``statuses``."""
    per_token = [
        (e2e - ttft) / (n - 1)
        for ttft, e2e, n, s in zip(ttft_ms, e2e_ms, output_lens, statuses, strict=False)
        if s == "ok" and ttft is not None and e2e is not None and n >= 2
    ]
    bunched = [x for x in per_token if x < BUNCHED_TPOT_MS]
    if not per_token or len(bunched) < BUNCHED_SHARE * len(per_token):
        return []
    return [
        f"bunched: {len(bunched)} of {len(per_token)} requests got all tokens in one read "
        f"(after the first token, under {BUNCHED_TPOT_MS:g} ms a token, {1000 / BUNCHED_TPOT_MS:,.0f} tokens/s: no "
        "server streams that fast: it stalled or lagged, then flushed each stream; median TPOT "
        f"{float(np.median(per_token)):.3g} ms): TPOT and ITL time the client's reads, not "
        "decode steps; TPOT and ITL metrics withheld"
    ]


def _stats(values: list[float], prefix: str, pcts: tuple[int, ...]) -> dict[str, float]:
    # the tool's convention: np.mean(xs or 0) etc. (0 when there are no values), times 1000
    xs = values or 0
    out = {
        f"{prefix}_mean_ms": float(np.mean(xs)) * 1000,
        f"{prefix}_median_ms": float(np.median(xs)) * 1000,
        f"{prefix}_std_ms": float(np.std(xs)) * 1000,
    }
    for p in pcts:
        out[f"{prefix}_p{p}_ms"] = float(np.percentile(xs, p)) * 1000
    return out


def recompute_from_details(row: dict[str, Any], *, as_tool: bool = True) -> dict[str, float]:
    """Summary metrics (names as :mod:`.parse`) rebuilt from the per-request details of one result
    line, durations from the tool's ``duration``. ``as_tool``: every request the tool counted a
    success (``calculate_metrics``, non-speculative path), else only those that streamed a token."""
    dur = float(row["duration"])
    ttfts: list[float] = []
    itls: list[float] = []
    e2es: list[float] = []
    tpots: list[float] = []
    total_out = 0
    total_in = 0
    completed = 0
    for inp, out, ttft, itl, _text, err in zip(*(row[k] for k in DETAIL_KEYS), strict=False):
        status = request_status(out, ttft, itl, err)
        if status == "failed" or (status == "no_token" and not as_tool):
            continue
        completed += 1
        total_out += out
        total_in += inp
        ttfts.append(ttft)
        itls.extend(itl)
        e2e = ttft + sum(itl)
        e2es.append(e2e)
        if out > 1:
            tpots.append((e2e - ttft) / (out - 1))
    m: dict[str, float] = {
        "completed_count" if not as_tool else "tool_completed_count": float(completed),
        "total_output_tokens_count": float(total_out),
        "details_input_tokens_count": float(total_in),
        "request_throughput_req_s": completed / dur,
        "output_throughput_tok_s": total_out / dur,
        "concurrency": float(np.sum(e2es)) / dur if e2es else 0.0,
        "itl_max_ms": float(np.max(itls or 0)) * 1000,
    }
    m.update(_stats(ttfts, "ttft", (90, 95, 99)))
    m.update(_stats(itls, "itl", (90, 95, 99)))
    m.update(_stats(tpots, "tpot", (90, 95, 99)))
    if e2es:
        m.update(_stats(e2es, "e2e_latency", (90, 95, 99)))
    return m


#: metrics our recomputation reproduces exactly (same inputs, same numpy calls as the tool)
EXACT = (
    "tool_completed_count",
    "total_output_tokens_count",
    "request_throughput_req_s",
    "output_throughput_tok_s",
    "ttft_mean_ms",
    "ttft_median_ms",
    "ttft_p99_ms",
    "itl_mean_ms",
    "itl_median_ms",
    "itl_p95_ms",
    "itl_p99_ms",
)
#: metrics that use the per-request E2E, which the details lack (ttft + sum(itl) instead)
APPROX = ("e2e_latency_mean_ms", "e2e_latency_median_ms", "tpot_mean_ms", "tpot_median_ms")
#: concurrency = sum(E2E) / duration: relative tolerance only
APPROX_REL = ("concurrency",)


def compare_with_summary(
    tool: dict[str, float], ours: dict[str, float], *, rel_tol: float, abs_tol_ms: float
) -> list[str]:
    """Lines naming every metric where our recomputation disagrees with the tool's summary ([]:
    agreement): EXACT within 1e-9 relative, APPROX (ms) within max(rel_tol * value, abs_tol_ms),
    APPROX_REL within rel_tol; metrics missing on either side are skipped."""
    bad = []
    for name in (*EXACT, *APPROX, *APPROX_REL):
        if name not in tool or name not in ours:
            continue
        a, b = tool[name], ours[name]
        if name in EXACT:
            ok = math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        elif name in APPROX:
            ok = abs(a - b) <= max(rel_tol * abs(a), abs_tol_ms)
        else:
            ok = math.isclose(a, b, rel_tol=rel_tol)
        if not ok:
            bad.append(f"{name}: bench_serving {a:.4f}, recomputed from details {b:.4f}")
    return bad
