"""One ``runner.py bench CONFIG``: the data flow of DESIGN.md, steps 1-7.

1. load and validate the config; 2. check the environment (installed sglang == the pin; the
tiny model built when asked); 3. build one overlay per variant and verify that the server's
environment resolves forward_batch_info inside it with the expected sha256 - all before any
server starts; 4. plan the cells (interleaved repeats); 5. per cell: start a fresh server, wait
until ready, run each suite (cache flushed between suites), stop the server and wait until its
port is closed; 6-7. compare and report.

Nothing measured is lost: every file is written atomically, the manifest is rewritten after each
cell, a failed cell is recorded with the server log's tail and the run goes on, Ctrl-C stops the
server and keeps what finished, and ``--resume RUN_DIR`` runs only what is missing.
"""
from __future__ import annotations

import datetime as _dt
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchbench import EXIT_ENV, EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE
from patchbench import envinfo
from patchbench.config import REPO_ROOT, Config, ConfigError, load_config
from patchbench.records import cell_dir, read_json, write_json
from patchbench.schedule import Cell, plan_cells
from patchbench.server import LaunchSpec, ServerError, SglangServer, scan_log
from patchbench.shims import CALLED_MARKER, SITE_DIR, stand_in_path
from patchbench.suite import ServerInfo, SuiteContext, SuiteError, SuiteResult, load_suite

RESULTS_DIR = REPO_ROOT / "results"
CACHE_DIR = REPO_ROOT / ".cache"
FBI_REL = "sglang/srt/model_executor/forward_batch_info.py"
DONE_STATUSES = ("ok", "incomplete")


class EnvironmentNotReady(RuntimeError):
    """The environment cannot run this config (wrong sglang, missing model, ...): exit 3."""


class PatchProblem(RuntimeError):
    """A variant's patch does not apply or its overlay does not verify: exit 2."""


class RunFailed(RuntimeError):
    """The run finished but some cells failed: exit 4 (run_dir attribute holds the folder)."""

    def __init__(self, message: str, run_dir: Path):
        super().__init__(message)
        self.run_dir = run_dir


@dataclass
class VariantEnv:
    """What one variant's server gets: the overlay and the environment of the process."""

    name: str
    patches: list[str]
    overlay: Any  # patchbench.overlay.Overlay
    sglang_dir: Path
    server_env: dict[str, str]
    fbi_sha256: str


def _log(msg: str) -> None:
    print(f"[patchbench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def utc_stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


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


def _pythonpath(*parts: Path | str | None, inherit: str | None = None) -> str:
    items = [str(p) for p in parts if p]
    if inherit:
        items.append(inherit)
    return os.pathsep.join(items)


def base_env(cfg: Config) -> dict[str, str]:
    """os.environ + server.env, with the stand-in switch set (no PYTHONPATH yet)."""
    env = dict(os.environ)
    env.update(cfg.server.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cfg.server.cpu_stand_ins:
        env["PATCHBENCH_CPU_STAND_INS"] = "1"
    return env


def stand_in_dirs(cfg: Config) -> list[Path]:
    return [stand_in_path(n) for n in cfg.server.cpu_stand_ins]


def stock_client_env(cfg: Config) -> dict[str, str]:
    """Environment for running the STOCK sglang as a client (bench_serving): stand-ins, no overlay,
    and the tokenizer vocabulary in id order so that bench_serving's seeded random prompts are the
    same in every cell (a fast tokenizer's get_vocab() order differs per process)."""
    env = base_env(cfg)
    env["PYTHONPATH"] = _pythonpath(SITE_DIR, *stand_in_dirs(cfg), inherit=os.environ.get("PYTHONPATH"))
    # seeded random prompts must be the same in every cell (see shims/site/sitecustomize.py)
    env["PATCHBENCH_STABLE_VOCAB_ORDER"] = "1"
    return env


def prepare_variants(cfg: Config, *, log=_log) -> dict[str, VariantEnv]:
    """Build and verify one overlay per variant (before any server starts).

    Raises PatchProblem naming the patch, file and hunk when a diff does not apply, or when the
    server's environment would not import the overlay's forward_batch_info.
    """
    from patchbench import overlay as ov
    from patchbench.patchset import PatchError

    site = envinfo.stock_site_dir()
    if site is None:
        raise EnvironmentNotReady("sglang is not importable in this environment")
    out: dict[str, VariantEnv] = {}
    for name, patches in cfg.variants.items():
        try:
            o = ov.build_overlay(cfg.sglang, list(patches), stock_site_dir=site,
                                 cache_root=CACHE_DIR / "overlays")
        except PatchError as e:
            raise PatchProblem(f"variant '{name}': {e}") from None
        env = base_env(cfg)
        env["PYTHONPATH"] = _pythonpath(o.root, SITE_DIR, *stand_in_dirs(cfg),
                                        inherit=os.environ.get("PYTHONPATH"))
        try:
            found = ov.verify_in_env(o, sys.executable, env)
        except ov.OverlayError as e:
            raise PatchProblem(f"variant '{name}': {e}") from None
        sha = found.get("sha256") or o.fbi_sha256
        log(f"variant {name}: patches {patches or '(none)'}; forward_batch_info "
            f"{(sha or '?')[:12]} in {o.sglang_dir}")
        out[name] = VariantEnv(name, list(patches), o, Path(o.sglang_dir), env, sha or "")
    return out


# ---------------------------------------------------------------------------------- cells
def _cell_done(run_dir: Path, cell: Cell, suites: list[str]) -> bool:
    """A cell is done when every suite has a summary with status ok/incomplete."""
    for s in suites:
        p = cell_dir(run_dir, cell.variant, cell.repeat) / s / "summary.json"
        try:
            if read_json(p).get("status") not in DONE_STATUSES:
                return False
        except (FileNotFoundError, ValueError):
            return False
    return True


def _suite_done(path: Path) -> bool:
    try:
        return read_json(path / "summary.json").get("status") in DONE_STATUSES
    except (FileNotFoundError, ValueError):
        return False


def run_cell(cfg: Config, cell: Cell, venv: VariantEnv, run_dir: Path, *, port: int,
             log=_log) -> dict:
    """Run every suite of one (variant, repeat) on a fresh server; returns the cell record.

    Never raises for a failure of the server or a suite: the cell is marked failed with the error
    and the log's tail. KeyboardInterrupt stops the server, records the cell as interrupted and
    propagates.
    """
    cdir = cell_dir(run_dir, cell.variant, cell.repeat)
    cdir.mkdir(parents=True, exist_ok=True)
    t_cell = time.monotonic()
    rec: dict[str, Any] = {"variant": cell.variant, "repeat": cell.repeat, "index": cell.index,
                           "status": "running", "error": None, "suites": {}, "timings_s": {},
                           "started_at": utc_stamp()}
    write_json(cdir / "cell.json", rec)
    suite_names = list(cfg.suites)
    todo = [s for s in suite_names if not _suite_done(cdir / s)]
    mods = {s: load_suite(s) for s in todo}
    no_server = [s for s in todo if not getattr(mods[s], "NEEDS_SERVER", True)]
    with_server = [s for s in todo if s not in no_server]
    cache_dir = run_dir / ".cache"
    stock_dir = envinfo.stock_site_dir() / "sglang"

    def ctx_for(suite: str, server_info: ServerInfo | None) -> SuiteContext:
        out = cdir / suite
        out.mkdir(parents=True, exist_ok=True)
        return SuiteContext(
            server=server_info, out_dir=out, run_dir=run_dir, cache_dir=cache_dir,
            variant=cell.variant, repeat=cell.repeat, baseline=cfg.baseline,
            sglang_version=cfg.sglang, python=sys.executable, stock_env=stock_client_env(cfg),
            variant_sglang_dir=venv.sglang_dir, stock_sglang_dir=stock_dir,
            device="cpu" if _is_cpu(cfg) else "cuda",
            log=lambda m, _s=suite: log(f"{cell.variant}/rep{cell.repeat}/{_s}: {m}"))

    def run_suite(suite: str, server_info: ServerInfo | None, server: SglangServer | None) -> None:
        t = time.monotonic()
        out = cdir / suite
        try:
            res = mods[suite].run(ctx_for(suite, server_info), cfg.suite_params[suite])
            if not isinstance(res, SuiteResult):
                raise TypeError(f"suite {suite} returned {type(res).__name__}, not SuiteResult")
        except (SuiteError, ServerError) as e:
            res = SuiteResult(status="failed", errors=[str(e)])
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - a suite bug must not lose the other cells
            res = SuiteResult(status="failed", errors=[f"{type(e).__name__}: {e}",
                                                       traceback.format_exc()])
        if server is not None:
            called = scan_log(server.spec.log_path, CALLED_MARKER)
            if called:
                res.status = "failed"
                res.errors.append(f"a CPU stand-in was called, results invalid: {called[0]}")
            if res.status == "failed":  # a failed request may be the server dying: give it a moment
                deadline = time.monotonic() + 2.0
                while server.alive() and time.monotonic() < deadline:
                    time.sleep(0.1)
            if not server.alive():
                res.status = "failed"
                res.errors.append(f"the server died during the suite (exit code "
                                  f"{server.proc.returncode}):\n" + server.log_tail())
        dt = time.monotonic() - t
        res.meta.setdefault("duration_s", round(dt, 3))
        write_json(out / "summary.json", res.to_json(suite))
        rec["suites"][suite] = res.status
        rec["timings_s"][f"suite:{suite}"] = round(dt, 3)
        log(f"{cell.variant}/rep{cell.repeat}/{suite}: {res.status}"
            + (f" - {res.errors[0].splitlines()[0][:200]}" if res.errors else ""))
        write_json(cdir / "cell.json", rec)

    server: SglangServer | None = None
    try:
        for s in no_server:
            run_suite(s, None, None)
        if with_server:
            spec = _launch_spec(cfg, venv, cdir, port)
            if cfg.server.mrope_probe:
                spec.env["PATCHBENCH_MROPE_PROBE_DIR"] = str(cdir / "mrope_probe")
                spec.env["PATCHBENCH_MROPE_CROSSCHECK_REF"] = str(stock_dir / FBI_REL.split("/", 1)[1])
                (cdir / "mrope_probe").mkdir(exist_ok=True)
            server = SglangServer(spec)
            log(f"{cell.variant}/rep{cell.repeat}: starting server on port {port}")
            server.start()
            rec["timings_s"]["server_start"] = round(server.wait_ready(), 3)
            log(f"{cell.variant}/rep{cell.repeat}: server ready in {rec['timings_s']['server_start']:.1f} s")
            info = ServerInfo(base_url=server.base_url, host=spec.host, port=spec.port,
                              model_path=spec.model_path, tokenizer_path=cfg.tokenizer_ref,
                              log_path=spec.log_path, pid=server.pid,
                              flush_cache=server.flush_cache, alive=server.alive)
            for i, s in enumerate(with_server):
                if i > 0:
                    t = time.monotonic()
                    server.flush_cache()
                    rec["timings_s"][f"flush:{s}"] = round(time.monotonic() - t, 3)
                run_suite(s, info, server)
                if not server.alive():
                    raise ServerError("the server died", server.log_tail())
    except KeyboardInterrupt:
        rec["status"], rec["error"] = "interrupted", "interrupted by Ctrl-C"
        raise
    except ServerError as e:
        rec["status"], rec["error"] = "failed", str(e)
        for s in with_server:
            if s not in rec["suites"]:
                write_json(cdir / s / "summary.json", SuiteResult(
                    status="failed", errors=[f"not run: {str(e).splitlines()[0]}"]).to_json(s))
                rec["suites"][s] = "failed"
        log(f"{cell.variant}/rep{cell.repeat}: FAILED - {str(e).splitlines()[0]}")
    finally:
        if server is not None:
            t = time.monotonic()
            try:
                server.stop()
            except ServerError as e:
                rec["status"], rec["error"] = "failed", f"{rec.get('error') or ''}\n{e}".strip()
            rec["timings_s"]["server_stop"] = round(time.monotonic() - t, 3)
            rec["server"] = {"pid": server.pid, "events": server.events,
                             "command": server.spec.command()}
        if cfg.server.mrope_probe:
            rec["mrope_probe"] = _merge_mrope_counts(cdir / "mrope_probe")
        rec["timings_s"]["cell"] = round(time.monotonic() - t_cell, 3)
        if rec["status"] == "running":
            st = set(rec["suites"].values())
            rec["status"] = "failed" if "failed" in st else ("incomplete" if "incomplete" in st else "ok")
        rec["ended_at"] = utc_stamp()
        write_json(cdir / "cell.json", rec)
    return rec


def _first_line(text: str | None, limit: int = 300) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else None


def _merge_mrope_counts(d: Path) -> dict:
    total: dict[str, int] = {}
    for f in sorted(d.glob("counts.*.json")):
        try:
            c = read_json(f).get("counts", {})
        except (ValueError, OSError):
            continue
        for k, v in c.items():
            if isinstance(v, (int, float)):
                total[k] = total.get(k, 0) + v
    return total


def _is_cpu(cfg: Config) -> bool:
    a = cfg.server.args
    return any(x == "--device=cpu" for x in a) or any(
        a[i] == "--device" and i + 1 < len(a) and a[i + 1] == "cpu" for i in range(len(a)))


def _launch_spec(cfg: Config, venv: VariantEnv, cdir: Path, port: int) -> LaunchSpec:
    s = cfg.server
    return LaunchSpec(python=sys.executable, model_path=cfg.model_ref, host=s.host, port=port,
                      args=list(s.args), env=dict(venv.server_env), log_path=cdir / "server.log",
                      ready_timeout_s=s.ready_timeout_s, stop_grace_s=s.stop_grace_s,
                      port_close_timeout_s=s.port_close_timeout_s, flush_retries=s.flush_retries,
                      flush_pause_s=s.flush_pause_s)


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


# ---------------------------------------------------------------------------------- the run
def describe_plan(cfg: Config, resume: Path | None = None) -> str:
    """The resolved plan as text (``--dry-run``): variants, cells in order, suites, commands.

    With ``resume`` (a run folder, checked by :func:`resume_manifest`), cells already done there
    are marked ``(done)`` and only the rest count as launches.
    """
    cells = plan_cells(list(cfg.variants), cfg.schedule.repeats, cfg.schedule.order)
    done = set()
    if resume is not None:
        resume_manifest(cfg, resume)
        done = {(c.variant, c.repeat) for c in cells if _cell_done(resume, c, list(cfg.suites))}
    lines = [f"config     {cfg.source}", f"name       {cfg.name}", f"sglang     {cfg.sglang}",
             f"model      {cfg.model_ref}" + ("  (tiny, built when missing)" if cfg.model.tiny else ""),
             f"baseline   {cfg.baseline}", "variants:"]
    for v, p in cfg.variants.items():
        lines.append(f"  {v:<24} patches: {', '.join(p) or '(stock)'}")
    lines.append(f"schedule   {cfg.schedule.repeats} repeat(s), {cfg.schedule.order}: "
                 + " ".join(f"{c.variant}#{c.repeat}" + (" (done)" if (c.variant, c.repeat) in done
                                                          else "") for c in cells))
    if resume is not None:
        lines.append(f"resume     {resume}: {len(done)} of {len(cells)} cells done, "
                     f"{len(cells) - len(done)} to run")
    lines.append("suites (in this order, cache flushed between them):")
    for name, params in cfg.suite_params.items():
        lines.append(f"  {name}: {params.model_dump(mode='json')}")
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


def _manifest(cfg: Config, run_dir: Path, env: dict, variants: dict[str, VariantEnv],
              cells: list[dict], started: str, timings: dict) -> dict:
    return {
        "schema": 1,
        "run_id": run_dir.name,
        "config_path": str(cfg.source),
        "config": cfg.model_dump(mode="json"),
        "sglang_version": cfg.sglang,
        "model": cfg.model_ref,
        "patches": {v: [{"name": p, "sha256": ve.overlay.patch_hashes.get(p)} for p in ve.patches]
                    for v, ve in variants.items()},
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


def run_bench(config_path: str | os.PathLike, *, resume: str | os.PathLike | None = None,
              results_root: str | os.PathLike | None = None, port: int | None = None,
              log=_log) -> Path:
    """Run a config end to end; returns the run folder.

    Raises ConfigError (exit 2), PatchProblem (exit 2), EnvironmentNotReady (exit 3) before any
    server starts; RunFailed (exit 4) after the run when a cell failed (everything that finished
    is on disk, compare.json and report.md included); KeyboardInterrupt after stopping the server.
    """
    t_run = time.monotonic()
    cfg = load_config(config_path)
    old = resume_manifest(cfg, Path(resume)) if resume else None  # before anything slow
    env = check_environment(cfg)
    ensure_model(cfg)
    variants = prepare_variants(cfg, log=log)
    port = port or cfg.server.port
    if resume:
        run_dir = Path(resume)
        started = old.get("started_at") or utc_stamp()
    else:
        root = Path(results_root) if results_root else RESULTS_DIR
        run_dir = root / f"{utc_stamp()}-{cfg.name}"
        run_dir.mkdir(parents=True, exist_ok=False)
        started = utc_stamp()
    cells = plan_cells(list(cfg.variants), cfg.schedule.repeats, cfg.schedule.order)
    suites = list(cfg.suites)
    records: list[dict] = []
    timings: dict[str, Any] = {"setup": round(time.monotonic() - t_run, 3)}
    manifest = _manifest(cfg, run_dir, env, variants, records, started, timings)
    if resume:  # keep the first invocation's timings; this one's go to "resumes"
        manifest["timings_s"] = old.get("timings_s", {})
        manifest["resumes"] = old.get("resumes", []) + [{"started_at": utc_stamp(),
                                                          "timings_s": timings}]
    write_json(run_dir / "manifest.json", manifest)
    log(f"run folder {run_dir}")
    failed = 0
    try:
        for cell in cells:
            cdir = cell_dir(run_dir, cell.variant, cell.repeat)
            if _cell_done(run_dir, cell, suites):
                rec = read_json(cdir / "cell.json") if (cdir / "cell.json").exists() else {}
                log(f"{cell.variant}/rep{cell.repeat}: done already, skipped")
                records.append({"variant": cell.variant, "repeat": cell.repeat,
                                "status": rec.get("status", "ok"), "dir": str(cdir.relative_to(run_dir)),
                                "timings_s": rec.get("timings_s", {}), "skipped": True})
                continue
            rec = run_cell(cfg, cell, variants[cell.variant], run_dir, port=port, log=log)
            failed += rec["status"] == "failed"
            records.append({"variant": cell.variant, "repeat": cell.repeat, "status": rec["status"],
                            "dir": str(cdir.relative_to(run_dir)), "timings_s": rec["timings_s"],
                            "error": _first_line(rec.get("error"))})
            write_json(run_dir / "manifest.json", manifest)
    except KeyboardInterrupt:
        manifest["ended_at"] = utc_stamp()
        manifest["interrupted"] = True
        write_json(run_dir / "manifest.json", manifest)
        log(f"interrupted; finished cells are kept in {run_dir} (resume with --resume {run_dir})")
        raise
    manifest["ended_at"] = utc_stamp()  # the measurements end here; the report reads it
    write_json(run_dir / "manifest.json", manifest)
    t_report = time.monotonic()
    report_error = _compare_and_report(run_dir, log=log)
    timings["report"] = round(time.monotonic() - t_report, 3)
    timings["total"] = round(time.monotonic() - t_run, 3)
    timings["harness_overhead_share"] = _overhead_share(records, timings)
    timings["overhead_breakdown_s"] = _overhead_breakdown(records, timings)
    if report_error:
        manifest["report_error"] = report_error
    write_json(run_dir / "manifest.json", manifest)
    b = timings["overhead_breakdown_s"]
    log(f"done in {timings['total']:.0f} s; harness overhead "
        f"{100 * (timings['harness_overhead_share'] or 0):.1f}% of wall time (server stops "
        f"{b['server_stop']:.1f} s, setup {b['setup']:.1f} s, report {b['report']:.1f} s, "
        f"other {b['other']:.1f} s); {run_dir}")
    if failed:
        raise RunFailed(f"{failed} of {len(cells)} cells failed; see {run_dir}/*/rep*/cell.json", run_dir)
    return run_dir


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
    """Write compare.json, report.md and plots; a failure here never loses the measurements."""
    try:
        from patchbench.report import render_run
    except ImportError as e:
        return f"report not available: {e}"
    try:
        out = render_run(run_dir)
        log(f"report: {out}")
        return None
    except Exception as e:  # noqa: BLE001 - the measurements are on disk; say what broke
        log(f"report failed ({type(e).__name__}: {e}); re-render with `runner.py report {run_dir}`")
        return f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


# ---------------------------------------------------------------------------------- command line
def cli(argv: list[str]) -> int:
    """``runner.py bench CONFIG [--dry-run] [--resume RUN_DIR] [--results DIR] [--port N]``."""
    import argparse

    ap = argparse.ArgumentParser(prog="runner.py bench",
                                 description="Run every variant of CONFIG through its suites on a "
                                             "real sglang server and write a results folder.")
    ap.add_argument("config")
    ap.add_argument("--dry-run", action="store_true", help="print the resolved plan, launch nothing")
    ap.add_argument("--resume", metavar="RUN_DIR", help="run only the cells missing in RUN_DIR")
    ap.add_argument("--results", metavar="DIR", help="parent folder of the run folder (default results/)")
    ap.add_argument("--port", type=int, help="override server.port")
    args = ap.parse_args(argv)
    try:
        if args.dry_run:
            cfg = load_config(args.config)
            print(describe_plan(cfg, Path(args.resume) if args.resume else None))
            have = envinfo.installed_version("sglang")
            if have != cfg.sglang:
                print(f"note: this environment has sglang {have}; a real run needs {cfg.sglang}")
            return EXIT_OK
        run_bench(args.config, resume=args.resume, results_root=args.results, port=args.port)
        return EXIT_OK
    except ConfigError as e:
        print(f"config error:\n{e}", file=sys.stderr)
        return EXIT_USAGE
    except PatchProblem as e:
        print(f"patch error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except EnvironmentNotReady as e:
        print(f"environment not ready: {e}", file=sys.stderr)
        return EXIT_ENV
    except RunFailed as e:
        print(f"run failed: {e}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:
        return EXIT_RUN_FAILED
