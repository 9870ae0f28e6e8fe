"""Serving suite: the STOCK package's ``python -m sglang.bench_serving`` of the pinned release (the
same client for every variant) against the cell's server, once or per point of a load sweep.

A point keeps the tool's stdout/stderr and result line, writes ``requests.json``
(docs/CONTRACTS.md), checks the run's validity (:mod:`.validity`), counts what the server logged
meanwhile (retractions, out-of-memory) and flags what the release's tool mis-measures
(:mod:`.caveats`). Parameters: docs/serving.md."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbench.records import write_json
from patchbench.run import logscan
from patchbench.suite import MetricInfo, Suite, SuiteContext, SuiteError, SuiteResult, register

from .block import report_block
from .caveats import backend_warnings, warmup_behaviour, warmup_warning
from .command import ToolMismatch, build_command, effective_seed, tool_info, wants_chat_template
from .params import IMAGE_DATASETS, Params
from .parse import ResultError, read_result_line, request_records, summary_metrics
from .recompute import compare_with_summary, recompute_from_details
from .validity import coalesced_itl, images_check, output_length_checks, request_checks

__all__ = ["METRICS", "PRIMARY", "Params", "ServingSuite", "report_block", "run", "run_point"]

_H, _L, _N = "higher", "lower", "none"
#: the primary metrics (Holm family of a variant; the headline) and their default margin (%)
PRIMARY = ("output_throughput_tok_s", "itl_median_ms", "ttft_median_ms", "e2e_latency_median_ms")
MARGIN_PCT = 5.0


def _run_metric(better: str, unit: str, label: str, name: str) -> MetricInfo:
    return MetricInfo(better, unit, label, primary=name in PRIMARY, kind="run", margin=MARGIN_PCT)


def _descriptive(unit: str, label: str = "", better: str = _N) -> MetricInfo:
    return MetricInfo(better, unit, label, kind="descriptive")


def _metrics() -> dict[str, MetricInfo]:
    m = {
        name: _run_metric(_H, unit, label, name)
        for name, unit, label in (
            ("request_throughput_req_s", "req/s", "Request throughput (req/s):"),
            ("input_throughput_tok_s", "tok/s", "Input token throughput (tok/s):"),
            ("output_throughput_tok_s", "tok/s", "Output token throughput (tok/s):"),
            ("total_throughput_tok_s", "tok/s", "Total token throughput (tok/s):"),
            ("peak_output_throughput_tok_s", "tok/s", "Peak output token throughput (tok/s):"),
        )
    }
    labels = {"e2e_latency": "E2E Latency", "ttft": "TTFT", "tpot": "TPOT", "itl": "ITL"}
    for q, lab in labels.items():
        for stat, word in (
            ("mean", "Mean"),
            ("median", "Median"),
            ("p90", "P90"),
            ("p95", "P95"),
            ("p99", "P99"),
        ):
            name = f"{q}_{stat}_ms"
            m[name] = _run_metric(_L, "ms", f"{word} {lab} (ms):", name)
        m[f"{q}_std_ms"] = _descriptive("ms")  # spread, descriptive only
    m["itl_max_ms"] = _run_metric(_L, "ms", "Max ITL (ms):", "itl_max_ms")
    m["concurrency"] = _descriptive("req", "Concurrency:")
    m["duration_s"] = _descriptive("s", "Benchmark duration (s):")
    m["accept_length"] = _descriptive("tok", "Accept length:")
    m["retokenized_output_share"] = _descriptive("share")
    for name, label in (
        ("requested_count", ""),
        ("completed_count", ""),
        ("failed_count", ""),
        ("no_token_count", ""),
        ("tool_completed_count", "Successful requests:"),
        ("total_input_tokens_count", "Total input tokens:"),
        ("total_input_text_tokens_count", "Total input text tokens:"),
        ("total_input_vision_tokens_count", "Total input vision tokens:"),
        ("total_output_tokens_count", "Total generated tokens:"),
        ("total_output_tokens_retokenized_count", "Total generated tokens (retokenized):"),
        ("peak_concurrent_requests_count", "Peak concurrent requests:"),
    ):
        m[name] = _descriptive("count", label)
    # what the server logged during the suite (patchbench.run.logscan): shown, never judged
    for name in ("retractions_count", "retracted_requests_count", "oom_count"):
        m[name] = _descriptive("count", better=_L)
    return m


#: every metric the suite can report, labelled as bench_serving prints it: throughputs and
#: latencies judged (kind "run", margin 5 %, :data:`PRIMARY` primary), the rest descriptive
METRICS: dict[str, MetricInfo] = _metrics()

#: seconds between checks of the bench_serving process and the server while it runs
POLL_S = 0.5
#: lines of the server log / the tool's stderr quoted in an error
TAIL_LINES = 40


def _tail(path: Path | None, n: int = TAIL_LINES) -> str:
    if path is None:
        return "(no log)"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(lines[-n:])


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
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
    on_poll: Callable[[], None] | None = None,
) -> tuple[int, float]:
    """Run bench_serving in its own process group, stdout/stderr into ``out_dir``; (exit code,
    wall seconds).

    Polls every :data:`POLL_S`: a dead server or ``timeout_s`` passed stops the tool and raises
    SuiteError with the server log's tail. ``progress``: the liveness watch's ProgressMeter, which
    watches the tool (and ``outputs``) so one doing nothing for ``server.stall_timeout_s`` ends the
    suite as a stall; ``idle_s``: the longest it may wait with nothing in flight
    (:func:`client_idle_s`); ``on_poll``: called at every poll (an exception stops the tool)."""
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
            progress.watch_client(
                proc.pid,
                "bench_serving",
                [out_dir / "stdout.txt", out_dir / "stderr.txt", *outputs],
                idle_s=idle_s,
            )
        try:
            while True:
                try:
                    rc = proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if on_poll is not None:
                    on_poll()
                if not server_alive():
                    _kill_group(proc)
                    raise SuiteError(
                        "the sglang server died during bench_serving; server log "
                        f"tail:\n{_tail(server_log)}"
                    )
                if time.monotonic() - t0 > timeout_s:
                    _kill_group(proc)
                    raise SuiteError(
                        f"bench_serving ran past timeout_s={timeout_s:.0f}"
                        f"{_progress_at_timeout(progress)}; server log tail:\n{_tail(server_log)}"
                    )
        except BaseException:
            if proc.poll() is None:
                _kill_group(proc)
            raise
        finally:
            if progress is not None:
                progress.unwatch_client()
    return rc, time.monotonic() - t0


def _progress_at_timeout(progress) -> str:
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
        scan = logscan.scan_server_log(log_path, start_offset=offset)
    except OSError as e:
        return None, (
            f"cannot read the server log {log_path} ({e}): retractions and out-of-memory "
            "events were not counted"
        )
    return scan, logscan.taint_warning(scan)


def _events_note(log_path: Path | None, offset: int) -> str:
    """A line for an error message: what the server logged during the suite ("" if nothing)."""
    scan, warn = _server_events(log_path, offset)
    return f"\n{warn}" if scan is not None and warn else ""


def _image_probe(
    ctx: SuiteContext, params: Params, tokenizer: str, chat: bool, seed: int
) -> dict[str, Any]:
    """image_probe.py's JSON line against the cell's server, or {"error": ...} with its last stderr
    line."""
    script = Path(__file__).with_name("image_probe.py")
    cmd = [
        ctx.python,
        str(script),
        ctx.server.base_url,
        tokenizer,
        params.dataset_name,
        str(params.random_input_len),
        str(params.image_count),
        params.image_resolution,
        "1" if chat else "0",
        str(seed),
    ]
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
    return json.loads(lines[-1])


def run(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Run bench_serving against ``ctx.server``: once (:func:`run_point`) or per point of
    ``params.sweep`` (:func:`.points.run_sweep`, two or more points in one client process)."""
    if params.sweep is not None:
        from .driver import run_points_together
        from .points import run_sweep

        together = functools.partial(run_points_together, tool=sys.modules[__name__])
        return run_sweep(ctx, params, run_point, METRICS, run_points=together)
    return run_point(ctx, params)


def run_point(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Run bench_serving once against ``ctx.server`` and return the summary.

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
    log_offset = logscan.log_size(srv.log_path) if srv.log_path is not None else 0
    rc, wall_s = run_tool(
        prep.argv,
        env=dict(ctx.stock_env),
        out_dir=Path(ctx.out_dir),
        timeout_s=params.timeout_s,
        server_alive=srv.alive,
        server_log=srv.log_path,
        progress=srv.progress,
        idle_s=client_idle_s(params.request_rate),
    )
    return finish_point(ctx, params, prep, rc, wall_s, log_offset)


@dataclass(frozen=True)
class Prepared:
    """One bench_serving call, ready to run (:func:`prepare_point`)."""

    argv: list[str]
    info: Any
    tokenizer: str
    warm: Any
    caveats: list[str]
    result_file: Path


def prepare_point(ctx: SuiteContext, params: Params) -> Prepared:
    """One call of bench_serving for ``ctx.out_dir`` (created, a stale result.jsonl removed,
    command.json written); SuiteError without a server or when the release's tool cannot be read
    or lacks what ``params`` asks for."""
    if ctx.server is None:
        raise SuiteError("the serving suite needs a running server")
    out = Path(ctx.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    srv = ctx.server
    try:
        info = tool_info(Path(ctx.stock_sglang_dir))
    except (OSError, SyntaxError) as e:
        raise SuiteError(f"cannot read the release's bench_serving arguments: {e}") from None
    tokenizer = params.tokenizer or srv.tokenizer_path or srv.model_path
    warm, caveats = _tool_caveats(params, info)
    result_file = out / "result.jsonl"
    if result_file.exists():
        result_file.unlink()  # the tool appends; a re-run of the cell starts clean
    cmd = _command(ctx, params, info, tokenizer, result_file)
    write_json(out / "command.json", {"argv": cmd})
    return Prepared(cmd, info, tokenizer, warm, caveats, result_file)


def finish_point(
    ctx: SuiteContext, params: Params, prep: Prepared, rc: int, wall_s: float, log_offset: int
) -> SuiteResult:
    """The result of the call ``prep`` after the tool exited with ``rc`` in ``wall_s`` seconds;
    ``log_offset``: the server log's size when it started (:func:`run_point` says what is checked)."""
    out = Path(ctx.out_dir)
    srv = ctx.server
    info, tokenizer, cmd = prep.info, prep.tokenizer, prep.argv
    row = _tool_result(srv, rc, out, log_offset)
    scan, scan_warning = _server_events(srv.log_path, log_offset)
    metrics, recs = _measured(row, scan)
    write_json(out / "requests.json", recs)
    notes = prep.caveats + ([scan_warning] if scan_warning else [])
    errors, warnings, disagree = _checks(params, row, metrics, recs, notes)
    meta: dict[str, Any] = {
        "backend": params.backend,
        "request_rate": "{}".format(row.get("request_rate", params.request_rate)),
        "max_concurrency": row.get("max_concurrency"),
        "dataset_name": row.get("dataset_name"),
        "seed": effective_seed(params, info),
        "apply_chat_template": wants_chat_template(params, ctx.sglang_version),
        "tokenizer": tokenizer,
        "tool_source": str(info.source),
        "argv": cmd,
        "wall_s": wall_s,
        "startup_overhead_s": wall_s - metrics.get("duration_s", 0.0),
        "recompute_disagreements": disagree,
        "warmup_capped": prep.warm.capped,
        "server_log_scan": scan,
    }
    if params.dataset_name in IMAGE_DATASETS and recs["status"].count("ok"):
        errs, img = _check_images(ctx, params, row, recs, info, tokenizer)
        errors += errs
        meta.update(img)  # images_*_count are diagnostics, kept in meta: on 0.5.1.post3 they come
        # from one probe request per variant with its own random prompt, so a comparison of them
        # between variants would report a change the patch did not make
    if why := coalesced_itl(metrics):
        warnings.append(why)
        gone = sorted(
            n
            for n in metrics
            if n.startswith("itl_") and getattr(METRICS.get(n), "kind", "") == "run"
        )
        meta["not_judged"] = {n: why for n in gone}
        metrics = {n: v for n, v in metrics.items() if n not in gone}
    status = "incomplete" if errors else "ok"
    return SuiteResult(status=status, metrics=metrics, errors=errors, warnings=warnings, meta=meta)


def _tool_caveats(params: Params, info) -> tuple[Any, list[str]]:
    """(the release's warmup behaviour; warnings of what its tool mis-measures with ``params``);
    SuiteError when its source cannot be read or the backend cannot be judged."""
    caveats: list[str] = []
    try:
        warm = warmup_behaviour(info.source)
        if params.backend != "sglang":
            caveats += backend_warnings(params, info.source)
    except ValueError as e:
        raise SuiteError(str(e)) from None
    except (OSError, SyntaxError) as e:
        raise SuiteError(f"cannot read the release's bench_serving source: {e}") from None
    w = warmup_warning(params, warm)
    if w:
        caveats.append(w)
    return warm, caveats


def _command(
    ctx: SuiteContext, params: Params, info, tokenizer: str, result_file: Path
) -> list[str]:
    """bench_serving's argv for the cell's server; SuiteError when the tool lacks what is asked."""
    srv = ctx.server
    try:
        return build_command(
            params,
            python=ctx.python,
            info=info,
            sglang_version=ctx.sglang_version,
            host=srv.host,
            port=srv.port,
            model=srv.model_path,
            tokenizer=tokenizer,
            output_file=result_file,
        )
    except ToolMismatch as e:
        raise SuiteError(str(e)) from None


def _tool_result(srv, rc: int, out: Path, log_offset: int) -> dict:
    """The tool's result line; SuiteError (with the logs' tails) when the server died, the tool
    failed, or its result cannot be read."""
    if not srv.alive():
        raise SuiteError(
            "the sglang server died during bench_serving; server log tail:\n"
            + _tail(srv.log_path)
            + _events_note(srv.log_path, log_offset)
        )
    if rc != 0:
        raise SuiteError(
            f"bench_serving exited with {rc}; its stderr tail:\n"
            f"{_tail(out / 'stderr.txt', 25)}\nserver log tail:\n{_tail(srv.log_path)}"
            + _events_note(srv.log_path, log_offset)
        )
    try:
        return read_result_line(out / "result.jsonl")
    except ResultError as e:
        raise SuiteError(
            f"{e}; bench_serving stderr tail:\n{_tail(out / 'stderr.txt', 25)}"
        ) from None


def _measured(row: dict, scan: dict | None) -> tuple[dict[str, float], dict]:
    """(flat metrics with the request counts, retokenized share and server log counts; the
    per-request records, requests.json)."""
    metrics = summary_metrics(row)
    recs = request_records(row)
    statuses = recs["status"]
    metrics.update(
        {
            "requested_count": float(len(statuses)),
            "completed_count": float(statuses.count("ok")),
            "failed_count": float(statuses.count("failed")),
            "no_token_count": float(statuses.count("no_token")),
        }
    )
    if metrics.get("total_output_tokens_count"):
        metrics["retokenized_output_share"] = (
            metrics["total_output_tokens_retokenized_count"] / metrics["total_output_tokens_count"]
        )
    if scan is not None:
        for k in ("retractions_count", "retracted_requests_count", "oom_count"):
            metrics[k] = float(scan[k])
    return metrics, recs


def _checks(
    params: Params, row: dict, metrics: dict[str, float], recs: dict, notes: list[str]
) -> tuple[list[str], list[str], list[str]]:
    """(errors, warnings, recomputation disagreements) of a finished run; a disagreement is a warning
    only when no request was flagged (a flagged request makes the two differ by design)."""
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
    ctx: SuiteContext, params: Params, row: dict, recs: dict, info, tokenizer: str
) -> tuple[list[str], dict[str, Any]]:
    """Did the images reach the model? The server's prompt tokens come from bench_serving's
    ``input_lens`` where the release records them (0.5.23: ``_record_server_prompt_len``), else
    from one probe request after the run built by the release's own dataset code
    (image_probe.py), cached per variant and settings."""
    src_text = info.source.read_text(encoding="utf-8")
    succ = [i for i, s in enumerate(recs["status"]) if s != "failed"]
    per_req_images = 1 if params.dataset_name == "mmmu" else params.image_count
    if "_record_server_prompt_len" in src_text and "total_input_text_tokens" in row:
        server = float(sum(recs["input_len"][i] for i in succ))
        return images_check(
            server_prompt_tokens=server,
            text_prompt_tokens=float(row["total_input_text_tokens"]),
            images_sent=len(succ) * per_req_images,
            min_extra_tokens_per_image=params.images_min_extra_tokens_per_image,
            min_ratio=params.images_min_prompt_token_ratio,
            source="server prompt_tokens of every request, recorded by bench_serving",
        )
    probe = _cached_image_probe(ctx, params, info, tokenizer)
    if "error" in probe:
        return [f"images check could not run: {probe['error']}"], {"image_probe": probe}
    errs, img = images_check(
        server_prompt_tokens=float(probe["server_prompt_tokens"]),
        text_prompt_tokens=float(probe["text_tokens"]),
        images_sent=int(probe["images"]),
        min_extra_tokens_per_image=params.images_min_extra_tokens_per_image,
        min_ratio=params.images_min_prompt_token_ratio,
        source="one probe request after the run, built by the release's own dataset code",
    )
    img["image_probe"] = probe
    return errs, img


def _cached_image_probe(ctx: SuiteContext, params: Params, info, tokenizer: str) -> dict[str, Any]:
    """:func:`_image_probe`'s result cached in ``cache_dir/serving/image-probe-<key>.json`` per
    (variant, settings) (``"cached": True`` when read back; an error is not cached): the probe
    costs one import of bench_serving."""
    chat = wants_chat_template(params, ctx.sglang_version)
    seed = effective_seed(params, info)
    seed = 1 if seed is None else seed  # bench_serving's own default
    key = hashlib.sha256(
        json.dumps(
            [
                ctx.variant,
                params.dataset_name,
                params.random_input_len,
                params.image_count,
                params.image_resolution,
                chat,
                tokenizer,
                seed,
            ]
        ).encode()
    ).hexdigest()[:16]
    cache = Path(ctx.cache_dir) / "serving" / f"image-probe-{key}.json"
    if cache.is_file():
        probe = dict(json.loads(cache.read_text()), cached=True)
    else:
        probe = _image_probe(ctx, params, tokenizer, chat, seed)
        if "error" not in probe:
            write_json(cache, probe)
    return probe


@register
class ServingSuite(Suite):
    """sglang.bench_serving against the cell's server."""

    name = "serving"
    Params = Params
    metrics = METRICS
    run = staticmethod(run)
    report_block = staticmethod(report_block)

    def doctor_checks(self, cfg: Any, params: Params) -> list[tuple[str, bool, str]]:
        from patchbench.doctor import hf_dataset_check

        if params.dataset_name != "mmmu":
            return []
        return [hf_dataset_check(f"suite serving: dataset {params.dataset_name}", "MMMU/MMMU")]

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: Params
    ) -> dict | None:
        """Requests paired by index after the prompt check (:func:`.pairing.pair_cells`; a sweep's
        points: :func:`.points.pair_points`); PairingRefused when no repeat's prompts pair."""
        from .pairing import pair_cells

        if isinstance(params, Params) and params.sweep is not None:
            from .points import pair_points

            return pair_points(list(baseline_dirs), list(variant_dirs), params, list(METRICS))
        return pair_cells(list(baseline_dirs), list(variant_dirs), list(METRICS))

    def plan_lines(self, params: Any, cells_per_round: int = 1, cpu: bool = False) -> list[str]:
        """A sweep's points, prompts and estimated minutes per cell (:func:`.sweep.cost_lines`)."""
        if not isinstance(params, Params) or params.sweep is None:
            return []
        from .sweep import cost_lines

        return cost_lines(
            params.sweep, params.num_prompts, params.output_len, cells_per_round, cpu=cpu
        )

    def declarations(self, params: Any) -> dict[str, MetricInfo]:
        """:data:`METRICS`, or with a sweep the per-point and curve metrics (:func:`.points.declarations`)."""
        if not isinstance(params, Params) or params.sweep is None:
            return dict(METRICS)
        from .points import declarations

        return declarations(params, METRICS)

    def report_section(self, comparison: Any) -> list[str]:
        from .render import report_section

        return report_section(comparison)

    def plots(self, comparison: Any, out_dir: Path) -> list[Path]:
        from .render import plots

        return plots(comparison, out_dir)
