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
from patchbench.cell import cell_done, is_cpu, needs_correctness_cells, run_cell, utc_stamp
from patchbench.config import REPO_ROOT, Config, ConfigError, load_config
from patchbench.errors import EnvironmentNotReady, Interrupted, RunFailed
from patchbench.records import read_json
from patchbench.runfolder import write_manifest
from patchbench.schedule import Cell, plan_cells
from patchbench.shims import SITE_DIR
from patchbench.signals import signum_of, terminate_like_ctrl_c
from patchbench.variants import (
    CACHE_DIR,
    PatchProblem,
    VariantEnv,
    _pythonpath,
    base_env,
    prepare_variants,
    stand_in_dirs,
    stock_client_env,
)

RESULTS_DIR = REPO_ROOT / "results"

__all__ = ["run_bench", "describe_plan", "resume_manifest", "check_environment", "ensure_model",
           "plan", "EnvironmentNotReady", "PatchProblem", "RunFailed", "Interrupted",
           "CACHE_DIR", "RESULTS_DIR", "VariantEnv", "base_env", "stock_client_env",
           "stand_in_dirs", "prepare_variants", "is_cpu"]


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
            f"(or `make bench CONFIG={cfg.source} SGLANG={cfg.sglang}`)")
    return envinfo.collect(with_torch=False)


def ensure_model(cfg: Config) -> Path:
    """The model folder for ``cfg``.

    ``model.tiny``: the folder is built (patchbench.tinymodel) when it is missing or incomplete.
    A hub id (``cfg.model_ref`` equals ``model.path``) is returned as is: sglang finds it in the HF
    cache (offline) or on the hub. Any other path must exist.

    Raises EnvironmentNotReady for a local path that does not exist.
    """
    d = cfg.model_dir
    if cfg.model.tiny:
        from patchbench.tinymodel import build_tiny_qwen25vl, is_built
        if not is_built(d):
            _log(f"building the tiny Qwen2.5-VL into {d}")
            build_tiny_qwen25vl(d)
    elif cfg.model_ref == cfg.model.path:
        return d  # a hub id
    elif not d.exists():
        raise EnvironmentNotReady(f"{cfg.source}: model.path {d} does not exist (give a local "
                                  "folder, a hub id such as Qwen/Qwen2.5-VL-3B-Instruct, or "
                                  "tiny: true)")
    return d


_RUN_FOLDER_HINT = "give a run folder that `runner.py bench` wrote (results/<UTC stamp>-<config name>)"


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
        raise ConfigError(f"--resume {run_dir}: its manifest's config differs from {cfg.source} "
                          f"({shown}{'; ...' if len(diffs) > 5 else ''}); a resumed run must "
                          "measure the same thing: resume with that config, or start a new run")
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
    untimed (patchbench.cell.needs_correctness_cells), then the timed repeats."""
    return plan_cells(list(cfg.variants), cfg.schedule.repeats, cfg.schedule.order,
                      correctness=needs_correctness_cells(cfg))


def describe_plan(cfg: Config, resume: Path | None = None) -> str:
    """The resolved plan as text (``--dry-run``): variants, cells in order, suites, commands.

    With ``resume`` (a run folder, checked by :func:`resume_manifest`), cells already done there
    are marked ``(done)`` and only the rest count as launches.
    """
    cells = plan(cfg)
    done = set()
    if resume is not None:
        resume_manifest(cfg, resume)
        done = {c for c in cells if cell_done(resume, c, cfg)}
    lines = [f"config     {cfg.source}", f"name       {cfg.name}", f"sglang     {cfg.sglang}",
             f"model      {cfg.model_ref}" + ("  (tiny, built when missing)" if cfg.model.tiny else ""),
             f"baseline   {cfg.baseline}", "variants:"]
    for v, p in cfg.variants.items():
        names = [x if isinstance(x, str) else getattr(x, "label", None) or str(x) for x in p]
        lines.append(f"  {v:<24} patches: {', '.join(names) or '(stock)'}")

    def name(c: Cell) -> str:
        return (f"{c.variant}#correctness" if c.kind == "correctness" else f"{c.variant}#{c.repeat}") \
            + (" (done)" if c in done else "")
    corr = [c for c in cells if c.kind == "correctness"]
    if corr:
        lines.append("correctness " + " ".join(name(c) for c in corr)
                     + "  (untimed: instrumented and untimed suites; feed no timing verdict)")
    lines.append(f"schedule   {cfg.schedule.repeats} repeat(s), {cfg.schedule.order}: "
                 + " ".join(name(c) for c in cells if c.kind == "timed"))
    if resume is not None:
        lines.append(f"resume     {resume}: {len(done)} of {len(cells)} cells done, "
                     f"{len(cells) - len(done)} to run")
    lines.append("suites (in this order, cache flushed between them):")
    for sname, params in cfg.suite_params.items():
        lines.append(f"  {sname}: {params.model_dump(mode='json')}")
    cmd = ["python", "-m", "sglang.launch_server", "--model-path", cfg.model_ref,
           "--host", cfg.server.host, "--port", str(cfg.server.port), *cfg.server.args]
    lines.append("server     " + " ".join(cmd))
    env = dict(cfg.server.env)
    if cfg.server.cpu_stand_ins:
        env["PATCHBENCH_CPU_STAND_INS"] = "1"
        env["PYTHONPATH"] = "<overlay>:" + _pythonpath(SITE_DIR, *stand_in_dirs(cfg))
    else:
        env["PYTHONPATH"] = "<overlay>:" + str(SITE_DIR)
    lines.append("server env " + " ".join(f"{k}={v}" for k, v in env.items()))
    lines.append(f"{len(cells) - len(done)} server launches; nothing is launched in a dry run")
    return "\n".join(lines)


def _patch_names(ve: VariantEnv) -> list[str]:
    return [p if isinstance(p, str) else getattr(p, "label", None) or str(p) for p in ve.patches]


def _manifest(cfg: Config, run_dir: Path, env: dict, variants: dict[str, VariantEnv],
              cells: list[dict], started: str, timings: dict) -> dict:
    return {
        "run_id": run_dir.name,
        "config_path": str(cfg.source),
        "config": cfg.model_dump(mode="json"),
        "sglang_version": cfg.sglang,
        "model": cfg.model_ref,
        "patches": {v: [{"name": n, "sha256": ve.overlay.patch_hashes.get(n)}
                        for n in _patch_names(ve)] for v, ve in variants.items()},
        "overlays": {v: ve.overlay.to_json() for v, ve in variants.items()},
        "git_sha": env.get("git_sha"),
        "host": {k: env.get(k) for k in ("hostname", "platform", "python", "cpu_count",
                                         "memory_total_gib", "transformers")},
        "gpu": env.get("gpu"),
        "environment": env,
        "cells": cells,
        "started_at": started,
        "ended_at": None,
        "timings_s": timings,
    }


def _cell_entry(cell: Cell, run_dir: Path, rec: dict, **extra) -> dict:
    """One line of ``manifest.cells`` for ``cell`` from its record (a cell.json dict)."""
    out = {"variant": cell.variant, "repeat": cell.repeat, "cell_kind": cell.kind,
           "instrumented": bool(rec.get("instrumented")), "status": rec.get("status", "ok"),
           "dir": str(cell.path(run_dir).relative_to(run_dir)),
           "timings_s": rec.get("timings_s", {})}
    out.update(extra)
    return out


def _first_line(text: str | None, limit: int = 300) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else None


# ---------------------------------------------------------------------------------- the run
def run_bench(config_path: str | os.PathLike, *, resume: str | os.PathLike | None = None,
              results_root: str | os.PathLike | None = None, port: int | None = None,
              kill_stale: bool = False, verbose: bool = False, log=None, nvml: Any = "auto") -> Path:
    """Run a config end to end; returns the run folder.

    Raises ConfigError / PatchProblem (exit 2) or EnvironmentNotReady (exit 3) before any server
    starts; RunFailed (exit 4) after the run when a cell failed (everything that finished is on
    disk, compare.json and report.md included); Interrupted (exit 130, 143 for SIGTERM) after
    Ctrl-C, SIGTERM or SIGHUP, once the server and any client are stopped (finished cells kept).
    ``kill_stale``: stop servers orphaned by an earlier killed run first (otherwise they are only
    reported). ``verbose``: print the timing breakdown at the end. ``nvml``: a patchbench.gpu.Nvml,
    None (no GPU checks) or "auto" (NVML where a GPU is present).
    """
    from patchbench.progress import BenchProgress
    t_run = time.monotonic()
    run_dir: Path | None = None
    progress: BenchProgress | None = None
    say = log or _log
    with terminate_like_ctrl_c(log=lambda m: (progress.log if progress else say)(m)):
        try:
            cfg = load_config(config_path)
            old = resume_manifest(cfg, Path(resume)) if resume else None  # before anything slow
            env = check_environment(cfg)
            ensure_model(cfg)
            root = Path(results_root) if results_root else RESULTS_DIR
            _stale_servers(Path(resume).parent if resume else root, kill=kill_stale, log=say)
            variants = prepare_variants(cfg, log=say)
            port = port or cfg.server.port
            if nvml == "auto":
                from patchbench.gpu import open_nvml
                nvml = open_nvml() if not is_cpu(cfg) else None
            if resume:
                run_dir = Path(resume)
                started = old.get("started_at") or utc_stamp()
            else:
                run_dir = root / f"{utc_stamp()}-{cfg.name}"
                run_dir.mkdir(parents=True, exist_ok=False)
                started = utc_stamp()
            cells = plan(cfg)
            records: list[dict] = []
            timings: dict[str, Any] = {"setup": round(time.monotonic() - t_run, 3)}
            manifest = _manifest(cfg, run_dir, env, variants, records, started, timings)
            if resume:  # keep the first invocation's timings; this one's go to "resumes"
                manifest["timings_s"] = old.get("timings_s", {})
                manifest["resumes"] = old.get("resumes", []) + [{"started_at": utc_stamp(),
                                                                  "timings_s": timings}]
            write_manifest(run_dir, manifest)
            say(f"run folder {run_dir}")
            progress = BenchProgress(len(cells))
            cell_log = log or (lambda m: progress.log(f"[patchbench {time.strftime('%H:%M:%S')}] {m}"))
            failed = 0
            for cell in cells:
                cdir = cell.path(run_dir)
                if cell_done(run_dir, cell, cfg):
                    rec = read_json(cdir / "cell.json") if (cdir / "cell.json").exists() else {}
                    cell_log(f"{cell.label}: done already, skipped")
                    records.append(_cell_entry(cell, run_dir, rec, skipped=True))
                    progress.cell_skipped()
                    continue
                progress.cell_started(cell.label)
                rec = run_cell(cfg, cell, variants[cell.variant], run_dir, port=port,
                               log=cell_log, progress=progress, nvml=nvml).model_dump(mode="json")
                progress.cell_finished(rec["status"])
                failed += rec["status"] == "failed"
                records.append(_cell_entry(cell, run_dir, rec, error=_first_line(rec.get("error"))))
                write_manifest(run_dir, manifest)
            progress.close()
        except KeyboardInterrupt as e:
            if progress is not None:
                progress.close()
            if run_dir is None:
                raise Interrupted("interrupted before any cell ran", signum=signum_of(e)) from None
            manifest["ended_at"] = utc_stamp()
            manifest["interrupted"] = True
            write_manifest(run_dir, manifest)
            cmd = f"patchbench bench {config_path} --resume {run_dir}"
            say(f"interrupted; finished cells are kept in {run_dir}; resume with: {cmd}")
            raise Interrupted(f"interrupted by signal {signum_of(e)}; finished cells are kept in "
                              f"{run_dir}; resume with `{cmd}`", signum=signum_of(e),
                              run_dir=run_dir) from None
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
    say(f"done in {timings['total']:.0f} s; harness overhead "
        f"{100 * (timings['harness_overhead_share'] or 0):.1f}% of wall time; {run_dir}")
    if verbose:
        say(f"overhead breakdown: server stops {b['server_stop']:.1f} s, setup {b['setup']:.1f} s, "
            f"flushes {b['flush']:.1f} s, report {b['report']:.1f} s, other {b['other']:.1f} s; "
            f"stop phases {timings['server_stop_breakdown_s']}")
    if failed:
        raise RunFailed(f"{failed} of {len(cells)} cells failed; see {run_dir}/*/*/cell.json", run_dir)
    return run_dir


def _stale_servers(results_root: Path, *, kill: bool, log) -> None:
    """Report (or with ``kill`` stop) servers orphaned by an earlier killed run."""
    from patchbench.stale import find_stale_servers, kill_stale
    found = find_stale_servers(results_root)
    if not found:
        return
    if kill:
        for s, ok in kill_stale(found):
            log(f"stopped orphaned server pid {s.pid} of {s.run_dir}" if ok
                else f"could not stop orphaned server pid {s.pid}: {s.kill_command}")
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
            b = (read_json(run_dir / r["dir"] / "cell.json").get("server") or {}).get("stop_breakdown_s") or {}
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
    return sum(t.get("server_start", 0.0) + sum(v for k, v in t.items() if k.startswith("suite:"))
               for t in ran)


def _overhead_breakdown(records: list[dict], timings: dict) -> dict[str, float]:
    """Where the harness overhead went, in seconds: ``setup`` (config, environment, overlays),
    ``server_stop`` (SIGTERM until the port closes; sglang's SIGTERM watchdog polls every 5 s,
    tokenizer_manager.sigterm_watchdog, 0.5.1.post3), ``flush`` (/flush_cache between suites),
    ``report`` (compare.json, report.md, plots) and ``other`` (the rest of the wall time outside
    server start-up and the suites). Skipped (resumed) cells count nothing."""
    ran = _ran_timings(records)
    stop = sum(t.get("server_stop", 0.0) for t in ran)
    flush = sum(v for t in ran for k, v in t.items() if k.startswith("flush:"))
    setup, report = timings.get("setup", 0.0), timings.get("report", 0.0)
    other = timings.get("total", 0.0) - _inside_s(ran) - stop - flush - setup - report
    return {"setup": round(setup, 3), "server_stop": round(stop, 3), "flush": round(flush, 3),
            "report": round(report, 3), "other": round(max(0.0, other), 3)}


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
        log(f"report failed ({type(e).__name__}: {e}); re-render with `patchbench report {run_dir}`")
        return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    try:
        from patchbench.comparison import read_comparison
        from patchbench.report import console_summary
        console_summary(read_comparison(run_dir), out)
    except Exception as e:  # noqa: BLE001 - the summary is a courtesy; report.md is written
        log(f"report: {out} (console summary failed: {type(e).__name__}: {e})")
    return None


# ---------------------------------------------------------------------------------- command line
def cli(argv: list[str]) -> int:
    """``patchbench bench ...`` through the one command line (patchbench.cli)."""
    from patchbench.cli import main
    return main(["bench", *argv])
