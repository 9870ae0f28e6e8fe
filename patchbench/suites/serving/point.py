"""One point of the serving suite: the STOCK package's ``python -m sglang.bench_serving`` against
the cell's server, watched while it runs, and its result; many points in one client process:
:mod:`.session`."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbench.records import write_json
from patchbench.run.logscan import log_size, scan_server_log, taint_warning
from patchbench.run.ports import kill_group
from patchbench.run.server import tail
from patchbench.suite import SuiteContext, SuiteError, SuiteResult

from .caveats import WarmupBehaviour, backend_warnings, warmup_behaviour, warmup_warning
from .clients import client_state, merge_point, records
from .clients import plan as client_plan
from .command import build_command, effective_seed, tool_info, wants_chat_template
from .params import IMAGE_DATASETS, Params
from .parse import METRICS, ResultError, read_result_line, request_records, summary_metrics
from .validity import (
    asked_output_lens,
    asked_zero,
    bunched_check,
    coalesced_itl,
    compare_with_summary,
    images_check,
    output_length_checks,
    recompute_from_details,
    request_checks,
)

#: seconds between checks of the bench_serving process and the server while it runs
POLL_S = 0.5
#: datasets whose output lengths are not drawn by the tool (mooncake: each record's own; the
#: traffic suite's trace workloads)
NOT_DRAWN = frozenset({"mmmu", "mooncake"})


def _tail(path: Path | None, n: int = 40) -> str:
    return tail(path, n) if path is not None else "(no log)"


def stop_tool(proc: subprocess.Popen) -> None:
    """SIGTERM to the tool's process group, SIGKILL after 5 s."""
    kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.wait()


def run_tool(
    cmd: list[str],
    *,
    env: dict[str, str],
    out_dir: Path,
    timeout_s: float,
    server_alive,
    server_log: Path | None,
    progress=None,
    idle_s: float = 0.0,
    outputs: list[Path] = (),
) -> tuple[int, float]:
    """Run bench_serving in its own process group, stdout/stderr into ``out_dir``; (exit code,
    wall seconds).

    Polls every :data:`POLL_S`: a dead server or ``timeout_s`` passed stops the tool and raises
    SuiteError with the server log's tail. ``progress``: the liveness watch's ProgressMeter, which
    watches the tool (and ``outputs``) so one doing nothing for ``server.stall_timeout_s`` ends the
    suite as a stall; ``idle_s``: the longest it may wait with nothing in flight
    (:func:`client_idle_s`)."""
    t0 = time.monotonic()
    with open(out_dir / "stdout.txt", "wb") as so, open(out_dir / "stderr.txt", "wb") as se:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=so,
            stderr=se,
            stdin=subprocess.DEVNULL,
            cwd=out_dir,
            start_new_session=True,
        )
        if progress is not None:
            logs = [out_dir / "stdout.txt", out_dir / "stderr.txt", *outputs]
            progress.watch_client(proc.pid, "bench_serving", logs, idle_s=idle_s)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                check_running(t0, timeout_s, server_alive, server_log, progress)
        except BaseException:
            if proc.poll() is None:
                stop_tool(proc)
            raise
        finally:
            if progress is not None:
                progress.unwatch_client()
    return rc, time.monotonic() - t0


def check_running(
    t0: float, timeout_s: float, server_alive, server_log: Path | None, progress=None
) -> None:
    """SuiteError with the server log's tail when the server died, or when ``timeout_s`` passed
    since ``t0`` (time.monotonic) while bench_serving runs (:func:`progress_at_timeout` says how
    it went): one poll of :func:`run_tool` and of :class:`.session.ClientSession`."""
    if not server_alive():
        raise SuiteError(
            f"the sglang server died during bench_serving; server log tail:\n{_tail(server_log)}"
        )
    if time.monotonic() - t0 > timeout_s:
        raise SuiteError(
            f"bench_serving ran past timeout_s={timeout_s:.0f}"
            f"{progress_at_timeout(progress)}; server log tail:\n{_tail(server_log)}"
        )


def progress_at_timeout(progress) -> str:
    """What the watched client did before its time ran out, for the timeout's message: still making
    progress (too slow a server: a drip is not a stall) or not; "" without a watch."""
    client = getattr(progress, "client", None)
    if client is None or client.last_sample is None:
        return ""
    ago = time.monotonic() - client.last_progress
    if ago <= 3.0:  # within two of the watch's samples (one a second) and a poll
        return (
            f" while still making progress ({client.last_seen()}): the server answers, too "
            "slowly to finish within timeout_s; raise timeout_s or find what slows the server"
        )
    return f" ({client.last_seen()}; no progress for the last {ago:.0f} s)"


def client_idle_s(request_rate: float) -> float:
    """Seconds bench_serving may wait with nothing in flight: 20 mean gaps at a finite
    ``request_rate`` (exponential gaps: longer with probability e^-20), 0 at an infinite one."""
    if request_rate == float("inf") or request_rate <= 0:
        return 0.0
    return 20.0 / request_rate


def _server_events(log_path: Path | None, offset: int) -> tuple[dict | None, str | None]:
    """(the server log scanned from ``offset``, or None when unreadable; the warning to show, or None)."""
    if log_path is None:
        return None, "no server log: retractions and out-of-memory events were not counted"
    try:
        scan = scan_server_log(log_path, start_offset=offset)
    except OSError as e:
        return None, (
            f"cannot read the server log {log_path} ({e}): retractions and out-of-memory "
            "events were not counted"
        )
    return scan, taint_warning(scan)


def log_offset(ctx: SuiteContext) -> int:
    """The size of the cell's server log now (0 without one): where a point's scan starts."""
    return log_size(ctx.server.log_path) if ctx.server.log_path is not None else 0


def run_point(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Run bench_serving once against ``ctx.server`` (in ``params.clients`` processes, their
    records merged: :mod:`.clients`) and return the summary.

    Raises SuiteError when the release lacks the dataset, flag or backend, the server dies, the
    tool fails or times out, or its output is refused (:func:`.parse.row_problem`). Failed or
    token-less requests, dropped images or no valid measurement: status "incomplete", the reasons
    in ``errors``. What the server logged meanwhile becomes ``retractions_count``,
    ``retracted_requests_count``, ``oom_count`` (a warning when non-zero)."""
    prep = prepare_point(ctx, params)
    srv = ctx.server
    ctx.log(
        f"serving: bench_serving {params.dataset_name} x{params.num_prompts} "
        f"(concurrency {params.max_concurrency})"
    )
    out = Path(ctx.out_dir)
    try:
        cmd, outputs = client_plan(prep.argv, out, params.clients)
    except ValueError as e:
        raise SuiteError(str(e)) from None
    offset = log_offset(ctx)
    rc, wall_s = run_tool(
        cmd,
        env=dict(ctx.stock_env),
        out_dir=out,
        timeout_s=params.timeout_s,
        server_alive=srv.alive,
        server_log=srv.log_path,
        progress=srv.progress,
        idle_s=client_idle_s(params.request_rate),
        outputs=outputs,
    )
    if rc == 0 and params.clients > 1:
        try:
            merge_point(out, params.clients)
        except (ValueError, KeyError) as e:
            raise SuiteError(f"cannot merge the client processes' results: {e}") from None
    return finish_point(ctx, params, prep, rc, wall_s, offset)


@dataclass(frozen=True)
class Prepared:
    """One bench_serving call, ready to run (:func:`prepare_point`)."""

    argv: list[str]
    info: Any
    tokenizer: str
    warm: WarmupBehaviour
    caveats: list[str]


def prepare_point(ctx: SuiteContext, params: Params) -> Prepared:
    """One call of bench_serving for ``ctx.out_dir`` (created, a stale result.jsonl removed,
    command.json written); SuiteError without a server, when the release's tool cannot be read or
    it lacks what ``params`` asks for (:class:`.command.ToolMismatch`)."""
    srv = ctx.server
    if srv is None:
        raise SuiteError("the serving suite needs a running server")
    out = Path(ctx.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        info = tool_info(Path(ctx.stock_sglang_dir))
        warm = warmup_behaviour(info.source)
        caveats = backend_warnings(params, info.source) if params.backend != "sglang" else []
    except (OSError, SyntaxError) as e:
        raise SuiteError(f"cannot read the release's bench_serving source: {e}") from None
    if w := warmup_warning(params, warm):
        caveats.append(w)
    tokenizer = params.tokenizer or srv.tokenizer_path or srv.model_path
    (out / "result.jsonl").unlink(missing_ok=True)  # the tool appends; a re-run starts clean
    cmd = build_command(
        params,
        python=ctx.python,
        info=info,
        sglang_version=ctx.sglang_version,
        host=srv.host,
        port=srv.port,
        model=srv.model_path,
        tokenizer=tokenizer,
        output_file=out / "result.jsonl",
    )
    write_json(out / "command.json", {"argv": cmd})
    return Prepared(cmd, info, tokenizer, warm, caveats)


def finish_point(
    ctx: SuiteContext, params: Params, prep: Prepared, rc: int, wall_s: float, log_offset: int
) -> SuiteResult:
    """The result of the call ``prep`` after the tool exited with ``rc`` in ``wall_s`` seconds;
    ``log_offset``: the server log's size when it started (:func:`run_point` says what is checked)."""
    out = Path(ctx.out_dir)
    srv = ctx.server
    scan, scan_warning = _server_events(srv.log_path, log_offset)
    events = f"\n{scan_warning}" if scan is not None and scan_warning else ""
    if not srv.alive():
        raise SuiteError(
            f"the sglang server died during bench_serving; server log tail:\n{_tail(srv.log_path)}"
            + events
        )
    if rc != 0:
        raise SuiteError(
            f"bench_serving exited with {rc}; its stderr tail:\n"
            f"{_tail(out / 'stderr.txt', 25)}\nserver log tail:\n{_tail(srv.log_path)}" + events
        )
    try:
        row = read_result_line(out / "result.jsonl")
    except ResultError as e:
        raise SuiteError(
            f"{e}; bench_serving stderr tail:\n{_tail(out / 'stderr.txt', 25)}"
        ) from None
    metrics, recs = _measured(row, scan)
    so = out / ("client0/stdout.txt" if params.clients > 1 else "stdout.txt")
    stdout = so.read_text(encoding="utf-8", errors="replace") if so.is_file() else ""
    asked = _asked(params, prep, stdout)
    notes = prep.caveats + ([scan_warning] if scan_warning else [])
    zero = asked_zero(recs["status"], recs["output_len"], recs["error"], asked)
    if zero:
        for i in zero:
            recs["status"][i] = "asked_zero"
        metrics["failed_count"] -= len(zero)
        metrics["asked_zero_count"] = float(len(zero))
        notes.append(
            f"{len(zero)} of {len(recs['status'])} requests asked for 0 output tokens (the "
            f"release's draw at random_range_ratio {params.random_range_ratio:g}) and got none: "
            "neither failed nor timed; random_range_ratio above 0 asks at least one token"
        )
    write_json(out / "requests.json", recs)
    errors, warnings, disagree = _checks(params, row, metrics, recs, notes, asked=asked)
    meta: dict[str, Any] = {
        "backend": params.backend,
        "request_rate": "{}".format(row.get("request_rate", params.request_rate)),
        "max_concurrency": row.get("max_concurrency"),
        "dataset_name": row.get("dataset_name"),
        "seed": effective_seed(params, prep.info),
        "apply_chat_template": wants_chat_template(params, ctx.sglang_version),
        "tokenizer": prep.tokenizer,
        "tool_source": str(prep.info.source),
        "argv": prep.argv,
        "wall_s": wall_s,
        "startup_overhead_s": wall_s - metrics.get("duration_s", 0.0),
        "recompute_disagreements": disagree,
        "warmup_capped": prep.warm.capped,
        "server_log_scan": scan,
    }
    if params.dataset_name in IMAGE_DATASETS and recs["status"].count("ok"):
        errs, img = _check_images(ctx, params, row, recs, prep)
        errors += errs
        meta.update(img)  # images_*_count are diagnostics, kept in meta: on 0.5.1.post3 they come
        # from one probe request per variant with its own random prompt, so a comparison of them
        # between variants would report a change the patch did not make
    bunched = bunched_check(recs["ttft_ms"], recs["e2e_ms"], recs["output_len"], recs["status"])
    why = bunched[0] if bunched else coalesced_itl(metrics)
    if why:
        warnings.append(why)
        # bunched: TPOT and ITL time the client's reads; coalesced: ITL only
        timed = ("itl_", "tpot_") if bunched else ("itl_",)
        gone = sorted(
            n
            for n in metrics
            if n.startswith(timed) and (bunched or (n in METRICS and METRICS[n].kind == "run"))
        )
        meta["not_judged"] = {n: why for n in gone}
        metrics = {n: v for n, v in metrics.items() if n not in gone}
    recs = records(out, params.clients)
    meta["client"] = (
        client_state(recs, params.max_concurrency, params.request_rate) if recs else None
    )
    if meta["client"] and meta["client"]["bound"]:
        why = f"client-bound: {meta['client']['bound']}"
        warnings.append(f"{why}; never judged")
        meta.setdefault("not_judged", {}).update(
            {n: why for n, i in METRICS.items() if i.kind != "descriptive"}
        )
        metrics = {
            n: v for n, v in metrics.items() if n in METRICS and METRICS[n].kind == "descriptive"
        }
    status = "incomplete" if errors else "ok"
    return SuiteResult(status=status, metrics=metrics, errors=errors, warnings=warnings, meta=meta)


def _measured(row: dict, scan: dict | None) -> tuple[dict[str, float], dict]:
    """(flat metrics with the request counts, retokenized share and server log counts; the
    per-request records, requests.json)."""
    metrics = summary_metrics(row)
    recs = request_records(row)
    st = recs["status"]
    metrics["requested_count"] = float(len(st))
    for name, status in (("completed", "ok"), ("failed", "failed"), ("no_token", "no_token")):
        metrics[f"{name}_count"] = float(st.count(status))
    if metrics.get("total_output_tokens_count"):
        metrics["retokenized_output_share"] = (
            metrics["total_output_tokens_retokenized_count"] / metrics["total_output_tokens_count"]
        )
    if scan is not None:
        for k in ("retractions_count", "retracted_requests_count", "oom_count"):
            metrics[k] = float(scan[k])
    return metrics, recs


def _asked(params: Params, prep: Prepared, tool_stdout: str) -> list[int] | None:
    """Each request's asked output length where the release drew it at random
    (:func:`.validity.asked_output_lens`); None for a fixed length or when it cannot be known."""
    if params.dataset_name in NOT_DRAWN or params.random_range_ratio >= 1.0:
        return None
    return asked_output_lens(
        tool_stdout,
        output_len=params.output_len,
        input_len=params.random_input_len,
        range_ratio=params.random_range_ratio,
        num_prompts=params.num_prompts,
        seed=effective_seed(params, prep.info),
    )


def _checks(
    params: Params,
    row: dict,
    metrics: dict[str, float],
    recs: dict,
    notes: list[str],
    asked: list[int] | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """(errors, warnings, recomputation disagreements) of a finished run; a disagreement is a warning
    only when no request was flagged (a flagged request makes the two differ by design). asked:
    each request's asked output length (None: only the range's floor is checked, with a warning
    when lengths were drawn)."""
    statuses = recs["status"]
    errors, warnings = request_checks(
        statuses,
        recs["error"],
        num_prompts=params.num_prompts,
        tool_completed=int(metrics.get("tool_completed_count", 0)),
    )
    warnings += notes
    errors += output_length_checks(
        recs["output_len"],
        statuses,
        output_len=params.output_len,
        range_ratio=params.random_range_ratio,
        fixed=params.dataset_name == "mmmu" or params.random_range_ratio >= 1.0,
        ignore_eos=not params.disable_ignore_eos,
        asked=asked,
    )
    drawn = params.dataset_name not in NOT_DRAWN and params.random_range_ratio < 1.0
    if drawn and asked is None and not params.disable_ignore_eos:
        warnings.append(
            "each request's asked output length could not be replayed from the release's draw "
            "(no seed, or its '#Output tokens' line does not match): outputs were checked only "
            f"against the floor int({params.output_len} x {params.random_range_ratio:g})"
        )
    if metrics.get("total_output_tokens_count", 0) > 0 and metrics.get("ttft_mean_ms", 0) == 0:
        errors.append("invalid: output tokens > 0 but every TTFT is 0 (no streamed token timed)")
    ours = recompute_from_details(row, as_tool=True)
    disagree = compare_with_summary(
        metrics, ours, rel_tol=params.recompute_rel_tol, abs_tol_ms=params.recompute_abs_tol_ms
    )
    if disagree and statuses.count("ok") == len(statuses):
        warnings.append(
            "recomputation from the per-request details disagrees with "
            "bench_serving's summary: " + "; ".join(disagree)
        )
    return errors, warnings, disagree


def _check_images(
    ctx: SuiteContext, params: Params, row: dict, recs: dict, prep: Prepared
) -> tuple[list[str], dict[str, Any]]:
    """Did the images reach the model? The server's prompt tokens come from bench_serving's
    ``input_lens`` where the release records them (0.5.23: ``_record_server_prompt_len``), else
    from one probe request after the run built by the release's own dataset code
    (image_probe.py), cached per variant and settings."""
    limits = {
        "min_extra_tokens_per_image": params.images_min_extra_tokens_per_image,
        "min_ratio": params.images_min_prompt_token_ratio,
    }
    src_text = prep.info.source.read_text(encoding="utf-8")
    if "_record_server_prompt_len" in src_text and "total_input_text_tokens" in row:
        succ = [i for i, s in enumerate(recs["status"]) if s != "failed"]
        return images_check(
            server_prompt_tokens=float(sum(recs["input_len"][i] for i in succ)),
            text_prompt_tokens=float(row["total_input_text_tokens"]),
            images_sent=len(succ) * (1 if params.dataset_name == "mmmu" else params.image_count),
            source="server prompt_tokens of every request, recorded by bench_serving",
            **limits,
        )
    probe = _image_probe(ctx, params, prep)
    if "error" in probe:
        return [f"images check could not run: {probe['error']}"], {"image_probe": probe}
    errs, img = images_check(
        server_prompt_tokens=float(probe["server_prompt_tokens"]),
        text_prompt_tokens=float(probe["text_tokens"]),
        images_sent=int(probe["images"]),
        source="one probe request after the run, built by the release's own dataset code",
        **limits,
    )
    img["image_probe"] = probe
    return errs, img


def _image_probe(ctx: SuiteContext, params: Params, prep: Prepared) -> dict[str, Any]:
    """image_probe.py's JSON line against the cell's server, or {"error": ...} with its last
    stderr line; cached in ``cache_dir/serving/image-probe-<key>.json`` per (variant, settings)
    (``"cached": True`` when read back; an error is not cached): the probe costs one import of
    bench_serving. The seed is not in the key: the probe is one request whose text and server
    token counts are its own, so a capacity search's new seed each round needs no new probe."""
    chat = wants_chat_template(params, ctx.sglang_version)
    seed = effective_seed(params, prep.info)
    seed = 1 if seed is None else seed  # bench_serving's own default
    args = [params.dataset_name, params.random_input_len, params.image_count]
    args += [params.image_resolution, chat, prep.tokenizer]
    key = hashlib.sha256(json.dumps([ctx.variant, *args]).encode()).hexdigest()[:16]
    cache = Path(ctx.cache_dir) / "serving" / f"image-probe-{key}.json"
    if cache.is_file():
        return dict(json.loads(cache.read_text()), cached=True)
    script = Path(__file__).with_name("image_probe.py")
    cmd = [ctx.python, str(script), ctx.server.base_url, prep.tokenizer, params.dataset_name]
    cmd += [str(params.random_input_len), str(params.image_count), params.image_resolution]
    cmd += ["1" if chat else "0", str(seed)]
    try:
        cp = subprocess.run(cmd, env=ctx.stock_env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return {"error": "image probe timed out"}
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
    if cp.returncode != 0 or not lines:
        last = next((ln for ln in reversed(cp.stderr.splitlines()) if ln.strip()), "")
        return {
            "error": f"image probe failed (exit {cp.returncode}): {last[:500]}",
            "stderr_tail": cp.stderr[-1500:],
        }
    probe = json.loads(lines[-1])
    write_json(cache, probe)
    return probe
