"""``patchbench bench CONFIG``: the data flow of docs/design.md.

1. load and validate the config; 2. check the environment (installed sglang == the pin; the
tiny model built when asked; servers orphaned by an earlier, killed run); 3. build one overlay per
variant and verify it in the server's environment (patchbench.variants) - all before any server
starts; 4. plan the cells (one untimed correctness cell per variant when a suite is instrumented
or untimed, then the interleaved timed repeats; patchbench.schedule); 5. run each cell
(patchbench.cell: start, run suites, stop, record) with the overall progress on the console
(patchbench.progress); 6-7. compare, report, and print the verdict summary.

Nothing measured is lost: every file is written atomically, the manifest is rewritten after each
cell, a failed cell is recorded with the server log's tail and the run goes on, Ctrl-C, SIGTERM
and SIGHUP stop the server (and any client) and keep what finished (exit 130, 143 for SIGTERM),
and ``--resume RUN_DIR`` runs only what is missing.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from patchbench import envinfo
from patchbench.cell import (
    cell_done,
    cell_suites,
    check_instrumentation,
    is_cpu,
    needs_correctness_cells,
    run_cell,
    utc_stamp,
)
from patchbench.config import Config, load_config, patch_label
from patchbench.errors import ConfigError, EnvironmentNotReady, Interrupted, RunFailed
from patchbench.inputs import RESULTS_DIR
from patchbench.records import ResultsWriteError, make_dir, read_json
from patchbench.runfolder import write_manifest
from patchbench.schedule import Cell, plan_cells
from patchbench.shims import SITE_DIR
from patchbench.signals import signum_of, terminate_like_ctrl_c
from patchbench.suite import get_suite
from patchbench.variants import (
    CACHE_DIR,
    VariantEnv,
    _pythonpath,
    base_env,
    prepare_variants,
    stand_in_dirs,
    stock_client_env,
)

__all__ = [
    "run_bench",
    "describe_plan",
    "resume_manifest",
    "check_environment",
    "ensure_model",
    "plan",
    "EnvironmentNotReady",
    "RunFailed",
    "Interrupted",
    "CACHE_DIR",
    "RESULTS_DIR",
    "VariantEnv",
    "base_env",
    "stock_client_env",
    "stand_in_dirs",
    "prepare_variants",
    "is_cpu",
]


#: how to run patchbench again from this environment (the venv's console script need not be on PATH)
_PROG = f"{sys.executable} -m patchbench"


def _log(msg: str) -> None:
    print(f"[patchbench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------- environment
def check_environment(cfg: Config) -> dict:
    """Installed sglang must equal the pin; returns envinfo. Raises EnvironmentNotReady."""
    have = envinfo.installed_version("sglang")
    if have != cfg.sglang:
        venv = ".venv" if cfg.sglang == "0.5.1.post3" else f".venv-{cfg.sglang}"
        make = "make setup" if cfg.sglang == "0.5.1.post3" else f"make setup SGLANG={cfg.sglang}"
        raise EnvironmentNotReady(
            f"{cfg.source}: config pins sglang {cfg.sglang}, but this environment "
            f"({sys.executable}) has {have or 'no sglang'}; run `{make}` and use {venv}/bin/python "
            f"(or `make bench CONFIG={cfg.source} SGLANG={cfg.sglang}`)"
        )
    return envinfo.collect(with_torch=False)


def ensure_model(cfg: Config) -> Path:
    """The model folder for ``cfg`` (call before any launch).

    ``model.tiny``: the folder is built (patchbench.tinymodel) when it is missing or incomplete.
    A hub id (:attr:`Config.model_is_hub`) is left to sglang, which finds it in the HF cache
    (offline) or on the hub. A local model (and tokenizer) folder must exist
    (:meth:`Config.require_model`).

    Raises EnvironmentNotReady (exit 3) for a local folder that does not exist.
    """
    cfg.require_model()
    d = cfg.model_dir
    if cfg.model.tiny:
        from patchbench.tinymodel import build_tiny_qwen25vl, is_built

        if not is_built(d):
            _log(f"building the tiny Qwen2.5-VL into {d}")
            build_tiny_qwen25vl(d)
    return d


_RUN_FOLDER_HINT = (
    "give a run folder that `runner.py bench` wrote (results/<UTC stamp>-<config name>)"
)


def resume_manifest(cfg: Config, run_dir: Path) -> dict:
    """The manifest of ``run_dir`` for ``--resume``, checked against ``cfg``.

    Raises ConfigError when ``run_dir`` holds no readable manifest.json or when the manifest's
    config differs from ``cfg`` (a resumed run must measure the same thing).
    """
    mf = Path(run_dir) / "manifest.json"
    if not Path(run_dir).is_dir():
        raise ConfigError(f"--resume {run_dir}: no such folder; {_RUN_FOLDER_HINT}")
    if not mf.is_file():
        raise ConfigError(f"--resume {run_dir}: no manifest.json there; {_RUN_FOLDER_HINT}")
    try:
        old = read_json(mf)
    except ValueError as e:
        raise ConfigError(f"--resume {run_dir}: manifest.json is not valid JSON ({e})") from None
    now = cfg.model_dump(mode="json")
    if old.get("config") != now:
        diffs = _config_diffs(old.get("config") or {}, now)
        shown = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, a, b in diffs[:5])
        raise ConfigError(
            f"--resume {run_dir}: its manifest's config differs from {cfg.source} "
            f"({shown}{'; ...' if len(diffs) > 5 else ''}); a resumed run must "
            "measure the same thing: resume with that config, or start a new run"
        )
    return old


def _config_diffs(a: Any, b: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every leaf where two config dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            out += _config_diffs(a.get(k), b.get(k), f"{key}.{k}" if key else str(k))
        return out
    return [] if a == b else [(key, a, b)]


# ---------------------------------------------------------------------------------- the plan
def plan(cfg: Config) -> list[Cell]:
    """The run's cells: one correctness cell per variant first when a suite is instrumented or
    untimed (patchbench.cell.needs_correctness_cells), then the timed rounds (as many as the
    schedule may take: a sequential schedule's ``max``; it may stop earlier)."""
    return plan_cells(
        list(cfg.variants),
        cfg.schedule.max_repeats,
        cfg.schedule.order,
        correctness=needs_correctness_cells(cfg),
    )


def _variant_lines(cfg: Config, extra_args: dict[str, list[str]]) -> list[str]:
    lines = []
    for v, spec in cfg.variants.items():
        tag = " (baseline)" if v == cfg.baseline else (" (A/A)" if cfg.is_aa(v) else "")
        names = [patch_label(p) for p in spec.patches]
        lines.append(f"  {v:<24} patches: {', '.join(names) or '(stock)'}{tag}")
        if spec.server_args:
            lines.append(f"  {'':<24} server args: {' '.join(spec.server_args)}")
        if spec.env:
            lines.append(f"  {'':<24} env: " + " ".join(f"{k}={x}" for k, x in spec.env.items()))
        if extra_args.get(v):
            lines.append(
                f"  {'':<24} correctness cell adds: {' '.join(extra_args[v])} (instrumentation)"
            )
    return lines


def _round_groups(cfg: Config, rounds: int) -> list[tuple[list[int], list[str]]]:
    """[(consecutive round indices, the timed suites they run)]."""
    out: list[tuple[list[int], list[str]]] = []
    for k in range(rounds):
        here = cell_suites(cfg, Cell(0, cfg.baseline, k))
        if out and out[-1][1] == here:
            out[-1][0].append(k)
        else:
            out.append(([k], here))
    return out


def describe_plan(cfg: Config, resume: Path | None = None) -> str:
    """The resolved plan as text (``--dry-run``): variants (patches, server arguments,
    environment), cells in order, the suites of each round, the stopping rule of a sequential
    schedule, commands.

    With ``resume`` (a run folder, checked by :func:`resume_manifest`), cells already done there
    are marked ``(done)`` and only the rest count as launches. Raises ConfigError for a conflict
    between an instrumentation's server arguments and the config's.
    """
    cells = plan(cfg)
    extra_args = check_instrumentation(cfg)
    done = set()
    if resume is not None:
        resume_manifest(cfg, resume)
        done = {c for c in cells if cell_done(resume, c, cfg)}
    lines = [
        f"config     {cfg.source}",
        f"name       {cfg.name}",
        f"sglang     {cfg.sglang}",
        f"model      {cfg.model_ref}" + ("  (tiny, built when missing)" if cfg.model.tiny else ""),
        f"baseline   {cfg.baseline}",
        "variants:",
        *_variant_lines(cfg, extra_args),
    ]

    def name(c: Cell) -> str:
        return (
            f"{c.variant}#correctness" if c.kind == "correctness" else f"{c.variant}#{c.repeat}"
        ) + (" (done)" if c in done else "")

    corr = [c for c in cells if c.kind == "correctness"]
    if corr:
        lines.append(
            "correctness "
            + " ".join(name(c) for c in corr)
            + "  (untimed: instrumented and untimed suites; feed no timing verdict)"
        )
    lines.append(
        f"schedule   {cfg.schedule.describe()}, {cfg.schedule.order}: "
        + " ".join(name(c) for c in cells if c.kind == "timed")
    )
    seq = cfg.schedule.sequential
    if seq is not None:
        prim = sequential_primaries(cfg)
        lines.append(
            f"sequential stop when every primary of every non-A/A variant is decided or futile "
            f"(improved/regressed at the {seq.boundary} boundary, or equivalent within "
            f"its margin; futile: conditional power < {seq.futility:g} at max), else after {seq.max} rounds; "
            f"primaries: "
            + (
                ", ".join(f"{s}.{m} (±{pct:g}%)" for s, m, _, pct in prim)
                or "none (stops at the first look)"
            )
            + " (accuracy and exact-count primaries, and suites not in every round, are judged "
            "on the rounds they ran in and do not hold the run open)"
        )
    if resume is not None:
        lines.append(
            f"resume     {resume}: {len(done)} of {len(cells)} cells done, "
            f"{len(cells) - len(done)} to run"
        )
    lines.append("suites (in this order, cache flushed between them):")
    for sname, params in cfg.suite_params.items():
        r = cfg.suite_rounds.get(sname, "all")
        when = "" if r == "all" else f"  [rounds: {r}]"
        lines.append(f"  {sname}: {params.model_dump(mode='json')}{when}")
    lines.append("suites per round:")
    if corr:
        lines.append(f"  correctness: {', '.join(cell_suites(cfg, corr[0])) or '(none)'}")
    for ks, here in _round_groups(cfg, cfg.schedule.max_repeats):
        which = f"round {ks[0]}" if len(ks) == 1 else f"rounds {ks[0]}-{ks[-1]}"
        lines.append(f"  {which}: {', '.join(here) or '(none)'}")
    for v in cfg.variants:
        cmd = [
            "python",
            "-m",
            "sglang.launch_server",
            "--model-path",
            cfg.model_ref,
            "--host",
            cfg.server.host,
            "--port",
            str(cfg.server.port),
            *cfg.server_args_of(v),
        ]
        lines.append(f"server     {v}: " + " ".join(cmd))
    env = dict(cfg.server.env)
    if cfg.server.cpu_stand_ins:
        env["PATCHBENCH_CPU_STAND_INS"] = "1"
        env["PYTHONPATH"] = "<overlay>:" + _pythonpath(SITE_DIR, *stand_in_dirs(cfg))
    else:
        env["PYTHONPATH"] = "<overlay>:" + str(SITE_DIR)
    lines.append(
        "server env "
        + " ".join(f"{k}={v}" for k, v in env.items())
        + "  (plus each variant's own env, when it sets one)"
    )
    todo = len(cells) - len(done)
    if seq is not None:
        least = len([c for c in cells if c.kind == "correctness" or c.repeat < seq.min])
        least -= len([c for c in done if c.kind == "correctness" or c.repeat < seq.min])
        lines.append(
            f"{least} to {todo} server launches (sequential); nothing is launched in a dry run"
        )
    else:
        lines.append(f"{todo} server launches; nothing is launched in a dry run")
    return "\n".join(lines)


def _manifest(
    cfg: Config,
    run_dir: Path,
    env: dict,
    variants: dict[str, VariantEnv],
    cells: list[dict],
    started: str,
    timings: dict,
) -> dict:
    return {
        "run_id": run_dir.name,
        "config_path": str(cfg.source),
        "config": cfg.model_dump(mode="json"),
        "sglang_version": cfg.sglang,
        "model": cfg.model_ref,
        "variants": {v: cfg.variant_diff(v, cache_dir=CACHE_DIR) for v in cfg.variants},
        "patches": {
            v: [
                {"name": n, "sha256": ve.overlay.patch_hashes.get(o)}
                for n, o in zip(ve.patches, ve.overlay.patches, strict=False)
            ]
            for v, ve in variants.items()
        },
        "overlays": {v: ve.overlay.to_json() for v, ve in variants.items()},
        "suite_rounds": {
            s: (cfg.rounds_of(s) if get_suite(s).timed else "correctness") for s in cfg.suites
        },
        "git_sha": env.get("git_sha"),
        "host": {
            k: env.get(k)
            for k in (
                "hostname",
                "platform",
                "python",
                "cpu_count",
                "memory_total_gib",
                "transformers",
            )
        },
        "gpu": env.get("gpu"),
        "environment": env,
        "cells": cells,
        "started_at": started,
        "ended_at": None,
        "timings_s": timings,
    }


def copy_config_files(cfg: Config, run_dir: Path) -> list[dict]:
    """Copy every file the config names directly (diffs, :meth:`Config.files_to_copy`) into
    ``run_dir`` (atomically; one already there is kept); returns ``[{"source", "path"}]``."""
    from patchbench.records import write_bytes

    out = []
    for src, rel in cfg.files_to_copy():
        dest = run_dir / rel
        if not dest.exists():
            write_bytes(dest, Path(src).read_bytes())
        out.append({"source": str(src), "path": rel})
    return out


def _cell_entry(cell: Cell, run_dir: Path, rec: dict, **extra) -> dict:
    """One line of ``manifest.cells`` for ``cell`` from its record (a cell.json dict)."""
    out = {
        "variant": cell.variant,
        "repeat": cell.repeat,
        "cell_kind": cell.kind,
        "instrumented": bool(rec.get("instrumented")),
        "status": rec.get("status", "ok"),
        "dir": str(cell.path(run_dir).relative_to(run_dir)),
        "suites": dict(rec.get("suites") or {}),
        "timings_s": rec.get("timings_s", {}),
    }
    out.update(extra)
    return out


def _first_line(text: str | None, limit: int = 300) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else None


# ---------------------------------------------------------------------------------- the run
def run_bench(
    config_path: str | os.PathLike,
    *,
    resume: str | os.PathLike | None = None,
    results_root: str | os.PathLike | None = None,
    port: int | None = None,
    kill_stale: bool = False,
    verbose: bool = False,
    log=None,
    nvml: Any = "auto",
    python_start_s: float | None = None,
) -> Path:
    """Run a config end to end; returns the run folder.

    Raises ConfigError / PatchError (exit 2) or EnvironmentNotReady (exit 3) before any server
    starts; RunFailed (exit 4) after the run when a cell failed (everything that finished is on
    disk, compare.json and report.md included); Interrupted (exit 130, 143 for SIGTERM) after
    Ctrl-C, SIGTERM or SIGHUP, once the server and any client are stopped (finished cells kept).
    ``kill_stale``: stop servers orphaned by an earlier killed run first (otherwise they are only
    reported). ``verbose``: print the timing breakdown at the end. ``nvml``: a patchbench.gpu.Nvml,
    None (no GPU checks) or "auto" (NVML where a GPU is present). ``python_start_s``: seconds
    this process spent before the call (interpreter start-up and imports; the command line
    passes it): counted in the total and the harness overhead.
    """
    from patchbench.progress import BenchProgress

    t_call = time.monotonic()
    t_run = t_call - (python_start_s or 0.0)  # the run's wall clock starts with the process
    run_dir: Path | None = None
    manifest: dict | None = None
    progress: BenchProgress | None = None
    say = log or _log
    with terminate_like_ctrl_c(log=lambda m: (progress.log if progress else say)(m)):
        try:
            cfg = load_config(config_path)
            old = resume_manifest(cfg, Path(resume)) if resume else None  # before anything slow
            env = check_environment(cfg)
            check_instrumentation(cfg)  # a conflicting instrumentation argument: exit 2 first
            ensure_model(cfg)
            root = Path(results_root) if results_root else RESULTS_DIR
            _stale_servers(Path(resume).parent if resume else root, kill=kill_stale, log=say)
            variants = prepare_variants(cfg, log=say)
            port = port or cfg.server.port
            _port_free_or_raise(cfg.server.host, port)
            if nvml == "auto":
                from patchbench.gpu import open_nvml

                nvml = open_nvml() if not is_cpu(cfg) else None
            if resume:
                run_dir = Path(resume)
                started = old.get("started_at") or utc_stamp()
            else:
                run_dir = root / f"{utc_stamp()}-{cfg.name}"
                make_dir(run_dir, exist_ok=False)
                started = utc_stamp()
            cells = plan(cfg)
            records: list[dict] = []
            timings: dict[str, Any] = {"setup": round(time.monotonic() - t_call, 3)}
            if python_start_s is not None:
                timings["python_start"] = round(python_start_s, 3)
            manifest = _manifest(cfg, run_dir, env, variants, records, started, timings)
            manifest["copied_files"] = copy_config_files(cfg, run_dir)
            if resume:  # keep the first invocation's timings; this one's go to "resumes"
                manifest["timings_s"] = old.get("timings_s", {})
                manifest["resumes"] = old.get("resumes", []) + [
                    {"started_at": utc_stamp(), "timings_s": timings}
                ]
            write_manifest(run_dir, manifest)
            say(f"run folder {run_dir}")
            progress = BenchProgress(len(cells), plan={c.label: cell_suites(cfg, c) for c in cells})
            cell_log = log or (
                lambda m: progress.log(f"[patchbench {time.strftime('%H:%M:%S')}] {m}")
            )
            failed = 0
            design = sequential_design(cfg)
            looks = list(design.looks) if design else [cfg.schedule.max_repeats]
            processed: set[int] = set()
            decision = None
            for li, n_rounds in enumerate(looks):
                for cell in cells:
                    if cell.index in processed or (
                        cell.kind == "timed" and cell.repeat >= n_rounds
                    ):
                        continue
                    processed.add(cell.index)
                    cdir = cell.path(run_dir)
                    if cell_done(run_dir, cell, cfg):
                        rec = read_json(cdir / "cell.json") if (cdir / "cell.json").exists() else {}
                        cell_log(f"{cell.label}: done already, skipped")
                        records.append(_cell_entry(cell, run_dir, rec, skipped=True))
                        progress.cell_skipped(cell.label)
                        continue
                    progress.cell_started(cell.label)
                    rec = run_cell(
                        cfg,
                        cell,
                        variants[cell.variant],
                        run_dir,
                        port=port,
                        log=cell_log,
                        progress=progress,
                        nvml=nvml,
                    ).model_dump(mode="json")
                    progress.cell_finished(rec["status"], rec.get("timings_s"))
                    failed += rec["status"] == "failed"
                    records.append(
                        _cell_entry(cell, run_dir, rec, error=_first_line(rec.get("error")))
                    )
                    write_manifest(run_dir, manifest)
                if design is None:
                    continue
                decision, why = sequential_look(cfg, run_dir, design, li, decision)
                manifest["sequential"] = _sequential_record(
                    cfg, design, manifest.get("sequential"), li, n_rounds, decision, why
                )
                write_manifest(run_dir, manifest)
                cell_log(
                    f"sequential look {li + 1} of {len(looks)} after {n_rounds} rounds: "
                    + manifest["sequential"]["reason"]
                )
                if decision is None or decision.stop:
                    break
            progress.set_total(len(processed))
            progress.close()
        except ResultsWriteError as e:  # results folder unwritable or full: exit 4, one line
            if progress is not None:
                progress.close()
            if manifest is not None:
                manifest["ended_at"] = utc_stamp()
                manifest["error"] = str(e)
                try:
                    write_manifest(run_dir, manifest)
                except ResultsWriteError:
                    pass
            if run_dir is not None:
                e.run_dir = run_dir
                say(
                    f"stopped: {e}; finished cells are kept in {run_dir}; once it is writable, "
                    f"resume with: {_PROG} bench {config_path} --resume {run_dir}"
                )
            raise
        except KeyboardInterrupt as e:
            if progress is not None:
                progress.close()
            if run_dir is None:
                raise Interrupted("interrupted before any cell ran", signum=signum_of(e)) from None
            manifest["ended_at"] = utc_stamp()
            manifest["interrupted"] = True
            write_manifest(run_dir, manifest)
            cmd = f"{_PROG} bench {config_path} --resume {run_dir}"
            say(f"interrupted; finished cells are kept in {run_dir}; resume with: {cmd}")
            raise Interrupted(
                f"interrupted by signal {signum_of(e)}; finished cells are kept in "
                f"{run_dir}; resume with `{cmd}`",
                signum=signum_of(e),
                run_dir=run_dir,
            ) from None
    manifest["ended_at"] = utc_stamp()  # the measurements end here; the report reads it
    write_manifest(run_dir, manifest)
    t_report = time.monotonic()
    report_error = _compare_and_report(run_dir, log=say)
    timings["report"] = round(time.monotonic() - t_report, 3)
    timings["total"] = round(time.monotonic() - t_run, 3)
    timings["harness_overhead_share"] = _overhead_share(records, timings)
    timings["overhead_breakdown_s"] = _overhead_breakdown(records, timings)
    timings["server_stop_breakdown_s"] = _stop_breakdown(run_dir, records)
    if report_error:
        manifest["report_error"] = report_error
    write_manifest(run_dir, manifest)
    b = timings["overhead_breakdown_s"]
    say(
        f"done in {timings['total']:.0f} s; harness overhead "
        f"{100 * (timings['harness_overhead_share'] or 0):.1f}% of wall time; {run_dir}"
    )
    if verbose:
        say(
            f"overhead breakdown: python start {b['python_start']:.1f} s, "
            f"server stops {b['server_stop']:.1f} s, setup {b['setup']:.1f} s, "
            f"flushes {b['flush']:.1f} s, report {b['report']:.1f} s, other {b['other']:.1f} s; "
            f"stop phases {timings['server_stop_breakdown_s']}"
        )
    if failed:
        raise RunFailed(
            f"{failed} of {len(processed)} cells failed; see {run_dir}/*/*/cell.json", run_dir
        )
    return run_dir


def _port_free_or_raise(host: str, port: int) -> None:
    """Refuse to start a run whose server port already answers (EnvironmentNotReady, exit 3,
    naming the holder): every cell would fail on it. Orphaned patchbench servers were reported
    (or, with --kill-stale, stopped) just before; a port taken later fails only its cell."""
    from patchbench.server import port_taken_by

    holder = port_taken_by(host, port)
    if holder is not None:
        raise EnvironmentNotReady(
            f"port {port} on {host} already answers before the run: {holder}; "
            "stop it, or choose another port (server.port in the config, or --port)"
        )


# ---------------------------------------------------------------------------------- sequential
def sequential_design(cfg: Config):
    """The patchbench.sequential.Design of a ``schedule.repeats: {min, max, step}`` config (alpha
    = 1 - ``compare.confidence`` per report; a non-binding futility stop at conditional power
    ``schedule.repeats.futility``); None for a fixed number of repeats."""
    seq = cfg.schedule.sequential
    if seq is None:
        return None
    from patchbench.sequential import Design

    return Design(
        looks=seq.looks,
        alpha=round(1.0 - cfg.compare.confidence, 12),
        kind=seq.boundary,
        futility=seq.futility,
    )


def sequential_primaries(cfg: Config) -> list[tuple[str, str, Any, float]]:
    """[(suite, metric, MetricInfo, margin in percent)] of the primaries that decide when a
    sequential run stops: run-level metrics (kind "run", with a direction) of timed suites that
    run in every round. Accuracy and deterministic primaries (and suites scheduled in only some
    rounds) gain nothing from more repeats and do not hold the run up; their verdicts come from
    the analysis as usual. A margin of 0 means no equivalence stop for that metric."""
    every = list(range(cfg.schedule.max_repeats))
    out = []
    for s in cfg.suites:
        obj = get_suite(s)
        if not obj.timed or cfg.rounds_of(s) != every:
            continue
        for m, info in obj.metrics.items():
            if info.primary and info.kind == "run" and info.better in ("higher", "lower"):
                out.append((s, m, info, float(cfg.compare.margin_for(s, m, info.margin) or 0.0)))
    return out


def sequential_look(cfg: Config, run_dir: Path, design, look_index: int, previous=None):
    """Decide at look ``look_index`` from the timed cells on disk (patchbench.sequential.decide
    on the paired log ratios ``log(variant / baseline)`` of :func:`sequential_primaries`, for
    every variant but the baseline; A/A variants (``cfg.is_aa``) are decided and recorded but,
    as controls, never hold the run open).

    Returns (LookDecision, None), or (None, why) when a needed pair is missing (a failed cell):
    the run then stops; ``--resume`` re-runs the failed cells and looks again.
    """
    import math

    from patchbench.rundata import read_run
    from patchbench.sequential import decide

    n = design.looks[look_index]
    data = read_run(run_dir)
    prim = sequential_primaries(cfg)
    ratios: dict[str, dict[str, list[float]]] = {}
    margins: dict[str, float] = {}
    better: dict[str, str] = {}
    missing: list[str] = []
    for v in data.variants[1:]:
        for s, m, info, pct in prim:
            key = f"{s}.{m}"
            xs: list[float] = []
            for k in range(n):
                b, x = data.value(data.baseline, k, s, m), data.value(v, k, s, m)
                timed = data.timed(data.baseline, k, s) and data.timed(v, k, s)
                if b is None or x is None or b <= 0 or x <= 0 or not timed:
                    missing.append(f"{v}/rep{k} {key}")
                    continue
                xs.append(math.log(x / b))
            ratios.setdefault(v, {})[key] = xs
            margins[key] = math.log1p(pct / 100.0)
            better[key] = info.better
    if missing:
        shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
        return None, (
            f"stopped at the look after {n} rounds: no paired value for {shown} "
            "(a failed or incomplete cell); resume the run to re-run it and go on"
        )
    controls = [v for v in ratios if cfg.is_aa(v)]
    return decide(
        look_index,
        ratios,
        margins,
        design=design,
        better=better,
        previous=previous,
        controls=controls,
    ), None


def _sequential_record(
    cfg: Config, design, old: dict | None, look_index: int, n_rounds: int, decision, why: str | None
) -> dict:
    """The manifest's ``sequential`` entry after a look: ``{"design", "looks": [per look],
    "stopped_at" (rounds run when it stopped, None while going on), "repeats_run", "reason",
    "decisions": {"variant/suite.metric": decision}}``."""
    rec = dict(old or {})
    looks = [x for x in rec.get("looks", []) if x.get("look_index", -1) < look_index]
    rec["design"] = {
        "looks": list(design.looks),
        "alpha": design.alpha,
        "boundary": design.kind,
        "primaries": [f"{s}.{m}" for s, m, _, _ in sequential_primaries(cfg)],
        "alpha_split": "Bonferroni across variants, Holm within each variant",
        "futility": design.futility,
        "controls": [v for v in cfg.variants if cfg.is_aa(v)],
    }
    if decision is None:
        rec.update(
            looks=looks,
            stopped_at=n_rounds,
            repeats_run=n_rounds,
            reason=why,
            stopped_early=n_rounds < design.looks[-1],
        )
        return rec
    looks.append(decision.to_json())
    rec["looks"] = looks
    rec["repeats_run"] = n_rounds
    rec["stopped_at"] = n_rounds if decision.stop else None
    rec["stopped_early"] = bool(decision.stop and n_rounds < design.looks[-1])
    rec["reason"] = (
        decision.reason
        if decision.metrics or not decision.stop
        else (
            f"no run-level primary metric to decide on (see the design); stopped after {n_rounds} "
            "rounds"
        )
    )
    rec["decisions"] = {f"{v}/{m}": d.decision for (v, m), d in sorted(decision.metrics.items())}
    return rec


def _stale_servers(results_root: Path, *, kill: bool, log) -> None:
    """Report (or with ``kill`` stop) servers orphaned by an earlier killed run."""
    from patchbench.stale import find_stale_servers, kill_stale

    found = find_stale_servers(results_root)
    if not found:
        return
    if kill:
        for s, ok in kill_stale(found):
            log(
                f"stopped orphaned server pid {s.pid} of {s.run_dir}"
                if ok
                else f"could not stop orphaned server pid {s.pid}: {s.kill_command}"
            )
        return
    for s in found:
        log(s.describe())


def _stop_breakdown(run_dir: Path, records: list[dict]) -> dict[str, float]:
    """Seconds of the server stops of the cells this invocation ran, per phase (``exit``: signal
    until every process is gone, ``port``: until the port refused, ``gpu``: until NVML listed no
    server process)."""
    out = {"exit": 0.0, "port": 0.0, "gpu": 0.0}
    for r in records:
        if r.get("skipped"):
            continue
        try:
            b = (read_json(run_dir / r["dir"] / "cell.json").get("server") or {}).get(
                "stop_breakdown_s"
            ) or {}
        except (OSError, ValueError):
            continue
        for k in out:
            out[k] += float(b.get(k) or 0.0)
    return {k: round(v, 3) for k, v in out.items()}


def _ran_timings(records: list[dict]) -> list[dict]:
    """``timings_s`` of the cells this invocation ran (skipped, resumed cells left out)."""
    return [r.get("timings_s", {}) for r in records if not r.get("skipped")]


def _inside_s(ran: list[dict]) -> float:
    """Seconds spent in server start-up and the suites themselves, over ``ran``."""
    return sum(
        t.get("server_start", 0.0) + sum(v for k, v in t.items() if k.startswith("suite:"))
        for t in ran
    )


def _overhead_breakdown(records: list[dict], timings: dict) -> dict[str, float]:
    """Where the harness overhead went, in seconds: ``python_start`` (the process's start-up and
    imports before the run began; 0 when ``bench`` was called in-process), ``setup`` (config,
    environment, overlays),
    ``server_stop`` (SIGTERM until the port closes; sglang's SIGTERM watchdog polls every 5 s,
    tokenizer_manager.sigterm_watchdog, 0.5.1.post3), ``flush`` (/flush_cache between suites),
    ``report`` (compare.json, report.md, plots) and ``other`` (the rest of the wall time outside
    server start-up and the suites). Skipped (resumed) cells count nothing."""
    ran = _ran_timings(records)
    stop = sum(t.get("server_stop", 0.0) for t in ran)
    flush = sum(v for t in ran for k, v in t.items() if k.startswith("flush:"))
    setup, report = timings.get("setup", 0.0), timings.get("report", 0.0)
    start = timings.get("python_start", 0.0)
    other = timings.get("total", 0.0) - _inside_s(ran) - stop - flush - setup - report - start
    return {
        "python_start": round(start, 3),
        "setup": round(setup, 3),
        "server_stop": round(stop, 3),
        "flush": round(flush, 3),
        "report": round(report, 3),
        "other": round(max(0.0, other), 3),
    }


def _overhead_share(records: list[dict], timings: dict) -> float | None:
    """Share of wall time outside server start-up and the suites themselves (goal < 5%)."""
    total = timings.get("total")
    ran = _ran_timings(records)
    if not total or not ran:
        return None  # nothing ran (a resume of a finished run)
    return round(max(0.0, total - _inside_s(ran)) / total, 4)


def _compare_and_report(run_dir: Path, *, log=_log) -> str | None:
    """Write compare.json, report.md and plots, then print the verdict summary; a failure here
    never loses the measurements."""
    try:
        from patchbench.report import render_run
    except ImportError as e:
        return f"report not available: {e}"
    try:
        out = render_run(run_dir)
    except Exception as e:  # noqa: BLE001 - the measurements are on disk; say what broke
        log(
            f"report failed ({type(e).__name__}: {e}); re-render with `patchbench report {run_dir}`"
        )
        return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    try:
        from patchbench.comparison import read_comparison
        from patchbench.report import console_summary

        console_summary(read_comparison(run_dir), out)
    except Exception as e:  # noqa: BLE001 - the summary is a courtesy; report.md is written
        log(f"report: {out} (console summary failed: {type(e).__name__}: {e})")
    return None
