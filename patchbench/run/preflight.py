"""What ``bench`` checks before any server starts: builds, model, a resumed folder's config,
orphaned servers, the port (ConfigError exit 2, EnvironmentNotReady exit 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench.config import Config, config_from_mapping
from patchbench.config.args import launch_size_problem
from patchbench.envs import envinfo
from patchbench.envs.builds import MakeMode
from patchbench.errors import ConfigError, EnvironmentNotReady
from patchbench.redact import has_redacted
from patchbench.run.ports import find_stale_servers, kill_stale, marked_for, port_taken_by
from patchbench.run.server import launch_command
from patchbench.run.variants import base_env, is_cpu
from patchbench.runfolder import RunFolderError, RunManifest, SchemaTooNew, read_manifest

_RUN_FOLDER_HINT = (
    "give a run folder that `patchbench bench` wrote (results/<UTC stamp>-<config name>)"
)


def check_environment(
    cfg: Config, resumed: RunManifest | None = None, *, make: MakeMode = "no", log=print
) -> dict:
    """Resolve the builds (filling ``cfg.builds``); with ``make="yes"`` the environment of a
    build no environment here has is made (once, its progress through ``log``); returns envinfo.
    Raises EnvironmentNotReady (exit 3) for a build without an environment (or whose environment
    cannot be made), ConfigError (exit 2) for a build refused or resolving otherwise than in the
    ``resumed`` run."""
    from patchbench.envs.builds import resolve_builds

    try:
        resolve_builds(cfg, cpu=is_cpu(cfg), make=make, log=log)
    except EnvironmentNotReady as e:
        raise EnvironmentNotReady(f"{cfg.source}: {e}") from None
    for v, old in (resumed.builds if resumed is not None else {}).items():
        now = cfg.builds.get(v)
        if now is not None and old.get("resolved") != now.resolved:
            raise ConfigError(
                f"{cfg.source}: variant '{v}': sglang {now.spec} is {now.resolved} now and was "
                f"{old.get('resolved')} in the resumed run; a resumed run must measure the same "
                "builds: start a new run"
            )
    return envinfo.collect(with_torch=False)


def ensure_model(cfg: Config, *, log) -> Path:
    """The model folder, built for ``model.tiny`` when missing; EnvironmentNotReady (exit 3) for
    a missing local folder."""
    cfg.require_model()
    d = cfg.model_dir
    if cfg.model.tiny:
        from patchbench.envs.tinymodel import build_tiny_qwen25vl, is_built

        if not is_built(d):
            log(f"building the tiny Qwen2.5-VL into {d}")
            build_tiny_qwen25vl(d)
    return d


#: server keys added after manifests were first written: absent in an older folder's config
_ADDED_SERVER_KEYS = ("stall_timeout_s", "secret_env")


def _resumed(run_dir: Path) -> RunManifest:
    """The manifest of the run folder ``--resume`` names; ConfigError when there is none."""
    if not Path(run_dir).is_dir():
        raise ConfigError(f"--resume {run_dir}: no such folder; {_RUN_FOLDER_HINT}")
    if not (Path(run_dir) / "manifest.json").is_file():
        raise ConfigError(f"--resume {run_dir}: no manifest.json there; {_RUN_FOLDER_HINT}")
    try:
        return read_manifest(run_dir)
    except SchemaTooNew:
        raise
    except RunFolderError as e:
        raise ConfigError(f"--resume {run_dir}: {e}") from None


def config_of_run(run_dir: Path) -> Config:
    """The config ``run_dir`` ran with, from its manifest (``bench --resume RUN``). Raises
    ConfigError when there is no readable manifest or config, or it no longer validates;
    SchemaTooNew."""
    old = _resumed(run_dir)
    if old.config is None:
        raise ConfigError(f"--resume {run_dir}: its manifest holds no config; give the CONFIG")
    gone = [f"server.env.{k}" for k in has_redacted(old.config.server.env)] + [
        f"variants.{v}.env.{k}"
        for v, spec in old.config.variants.items()
        for k in has_redacted(spec.env)
    ]
    if gone:
        raise ConfigError(
            f"--resume {run_dir}: its manifest keeps {', '.join(gone)} redacted (a secret is "
            "never written to a run folder); give the CONFIG it ran with: bench CONFIG --resume RUN"
        )
    return config_from_mapping(
        old.config.model_dump(mode="json"), f"{Path(run_dir) / 'manifest.json'} (config)"
    )


def resume_manifest(cfg: Config, run_dir: Path) -> RunManifest:
    """The manifest of ``run_dir`` for ``--resume``. Raises ConfigError when there is no
    readable manifest.json or its config differs from ``cfg``; SchemaTooNew."""
    old = _resumed(run_dir)
    now = cfg.redacted().model_dump(mode="json")  # the manifest keeps secrets redacted
    there = old.config.model_dump(mode="json") if old.config is not None else {}
    for key in _ADDED_SERVER_KEYS:  # a folder written before the key existed ran without it
        if old.config is not None and key not in old.config.server.model_fields_set:
            there["server"].pop(key, None)
            now["server"].pop(key, None)
    if there != now:
        diffs = config_diffs(there, now)
        shown = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, a, b in diffs[:5])
        raise ConfigError(
            f"--resume {run_dir}: its manifest's config differs from {cfg.source or 'the config'} "
            f"({shown}{'; ...' if len(diffs) > 5 else ''}); a resumed run must "
            "measure the same thing: resume with that config, or start a new run"
        )
    return old


def config_diffs(a: Any, b: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every leaf where two config dicts differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            out += config_diffs(a.get(k), b.get(k), f"{key}.{k}" if key else str(k))
        return out
    return [] if a == b else [(key, a, b)]


def report_stale_servers(results_root: Path, *, kill: bool, log) -> None:
    """Report (or with ``kill`` stop) servers orphaned by a killed run."""
    found = find_stale_servers(results_root, anywhere=True)
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


def stop_orphans_of(run_dir: Path, *, log) -> None:
    """A resumed run, once it holds the folder's lock: stop and name the servers the run before it
    left (:func:`patchbench.run.ports.find_stale_servers`), each only when its own environment
    marks it as a server of ``run_dir``; one that cannot be read is named, not touched. Raises
    EnvironmentNotReady (exit 3) when one outlives SIGKILL."""
    found = find_stale_servers(run_dir)
    mine = [s for s in found if marked_for(s.pid, run_dir)]
    for s in found:
        if s not in mine:
            log(f"{s.describe()}: its environment does not name {run_dir}, so it is left alone")
    for s, ok in kill_stale(mine):
        if not ok:
            raise EnvironmentNotReady(
                f"the server pid {s.pid} the run before this one left ({s.cell}) outlived "
                f"SIGKILL; stop it (`{s.kill_command}`), then resume again"
            )
        log(
            f"stopped server pid {s.pid} (cell {s.cell}, port {s.port}) that the killed run "
            f"before this one left running"
        )


def launch_fits_or_raise(cfg: Config, port: int) -> None:
    """ConfigError (exit 2), before any process is started for a variant, when its server command
    and environment are over this system's limit (:func:`patchbench.config.args.launch_size_problem`).
    """
    import sys

    for name in cfg.variants:
        b = cfg.builds.get(name)
        python = b.python if b is not None and b.python else sys.executable
        argv = launch_command(
            str(python), cfg.model_ref, cfg.server.host, port, cfg.server_args_of(name)
        )
        problem = launch_size_problem(argv, base_env(cfg, name))
        if problem:
            raise ConfigError(f"{cfg.source}: variant {name}: {problem}")


def port_free_or_raise(host: str, port: int) -> None:
    """EnvironmentNotReady (exit 3) naming the holder when the server port already answers."""
    holder = port_taken_by(host, port)
    if holder is not None:
        raise EnvironmentNotReady(
            f"port {port} on {host} already answers before the run: {holder}; "
            "stop it, or choose another port (server.port in the config, or --port)"
        )
