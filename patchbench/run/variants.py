"""What one variant's server runs: its overlay, its environment, the stock clients' environment,
and its identity (:func:`variant_identity`), which ``--resume`` checks."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchbench.config import Config, patch_label
from patchbench.envs import envinfo
from patchbench.envs.builds import overlay_patches
from patchbench.errors import ConfigError, EnvironmentNotReady, PatchError
from patchbench.inputs import CACHE_DIR
from patchbench.patches import apply
from patchbench.patches import overlay as ov
from patchbench.runfolder import read_cell
from patchbench.shims import HOOKS_ENV, SITE_DIR, stand_in_path

#: the parts of an identity, in the order messages name them
PARTS = ("patches", "server_args", "env", "sglang")


@dataclass
class VariantEnv:
    """What one variant's server gets (``build``: None when the run resolved no builds)."""

    name: str
    patches: list[str]
    overlay: Any
    sglang_dir: Path
    server_env: dict[str, str]
    fbi_sha256: str
    python: str = sys.executable
    build: Any = None
    identity: dict[str, str] = field(default_factory=dict)


def pythonpath(*parts: Path | str | None, inherit: str | None = None) -> str:
    """``parts`` (None left out), then ``inherit``, joined as a PYTHONPATH."""
    items = [str(p) for p in parts if p]
    if inherit:
        items.append(inherit)
    return os.pathsep.join(items)


def base_env(cfg: Config, variant: str | None = None) -> dict[str, str]:
    """os.environ + server.env (+ ``variant``'s ``env``), the stand-in switch set, no PYTHONPATH
    and no in-server hooks yet."""
    env = dict(os.environ)
    env.pop(HOOKS_ENV, None)
    env.update(cfg.server_env_of(variant) if variant is not None else cfg.server.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cfg.server.cpu_stand_ins:
        env["PATCHBENCH_CPU_STAND_INS"] = "1"
    return env


def stand_in_dirs(cfg: Config) -> list[Path]:
    return [stand_in_path(n) for n in cfg.server.cpu_stand_ins]


def stock_client_env(cfg: Config) -> dict[str, str]:
    """Environment of the STOCK sglang as a client (bench_serving): stand-ins, no overlay, the
    site hook's client switches (patchbench/shims/site/sitecustomize.py)."""
    env = base_env(cfg)
    env["PYTHONPATH"] = pythonpath(
        SITE_DIR, *stand_in_dirs(cfg), inherit=os.environ.get("PYTHONPATH")
    )
    # see shims/site/sitecustomize.py
    env["PATCHBENCH_STABLE_VOCAB_ORDER"] = "1"
    env["PATCHBENCH_STREAM_ERRORS"] = "1"
    return env


def prepare_variants(cfg: Config, *, log) -> dict[str, VariantEnv]:
    """Build and verify one overlay per variant (before any server starts). Raises
    :class:`patchbench.errors.PatchError` (exit 2) naming the variant, patch, file and hunk when a
    diff does not apply, or when the server's environment would not import the overlay."""
    site = envinfo.stock_site_dir()
    if site is None and not cfg.builds:
        raise EnvironmentNotReady("sglang is not importable in this environment")
    out: dict[str, VariantEnv] = {}
    for name in cfg.variants:
        labels = [patch_label(p) for p in cfg.patches_of(name)]
        build = cfg.builds.get(name)
        python = build.python if build is not None else sys.executable
        try:
            o = _overlay_of(cfg, name, build, site)
        except PatchError as e:
            raise PatchError(f"variant '{name}': {e}") from None
        env = base_env(cfg, name)
        env["PYTHONPATH"] = pythonpath(
            o.root, SITE_DIR, *stand_in_dirs(cfg), inherit=os.environ.get("PYTHONPATH")
        )
        try:
            found = ov.verify_in_env(o, python, env)
        except ov.OverlayError as e:
            raise PatchError(f"variant '{name}': {e}") from None
        sha = found.get("sha256") or o.fbi_sha256
        extra = cfg.variants[name]
        log(
            f"variant {name}: patches {', '.join(labels) or '(none)'}"
            + (f"; server args {' '.join(extra.server_args)}" if extra.server_args else "")
            + (
                f"; env {' '.join(f'{k}={v}' for k, v in cfg.shown_env(extra.env).items())}"
                if extra.env
                else ""
            )
            + (f"; build {build.describe()}" if build is not None and cfg.has_own_builds() else "")
            + (
                f" (the checkout's sglang replaces {len(o.files)} file(s) of the environment's)"
                if build is not None and build.tree
                else ""
            )
            + f"; forward_batch_info {(sha or '?')[:12]} in {o.sglang_dir}"
        )
        out[name] = v = VariantEnv(
            name, labels, o, Path(o.sglang_dir), env, sha or "", python, build
        )
        v.identity = variant_identity(cfg, v)
    return out


def _overlay_of(cfg: Config, name: str, build: Any, site: Path | None) -> Any:
    """Variant ``name``'s overlay: its patches, or its build's tree."""
    if build is not None and build.tree is not None:
        return ov.build_source_overlay(
            build.release,
            build.tree,
            label=build.spec,
            source_id=build.resolved,
            stock_site_dir=build.env.site_dir,
            cache_root=CACHE_DIR / "overlays",
        )
    release = build.release if build is not None else cfg.sglang
    return ov.build_overlay(
        release,
        overlay_patches(cfg, name, cfg.release_of(name), cache_dir=CACHE_DIR),
        stock_site_dir=build.env.site_dir if build is not None else site,
        cache_root=CACHE_DIR / "overlays",
        patch_cache_dir=CACHE_DIR,
    )


def is_cpu(cfg: Config) -> bool:
    """True when ``server.args`` asks for ``--device cpu``."""
    a = cfg.server.args
    return "--device=cpu" in a or any(
        a[i] == "--device" and a[i + 1] == "cpu" for i in range(len(a) - 1)
    )


def client_python(cfg: Config) -> str:
    """The clients' interpreter: the baseline's build's (else this one)."""
    b = cfg.builds.get(cfg.baseline)
    return b.python if b is not None else sys.executable


def client_release(cfg: Config) -> str:
    """The sglang release of the clients' environment (:func:`client_python`)."""
    b = cfg.builds.get(cfg.baseline)
    return b.release if b is not None else str(cfg.sglang)


def check_patches(cfg: Config) -> list[str]:
    """Apply every variant's patches to a pristine copy of its release's files, offline
    (``bench --dry-run``). One line per problem (``variant 'V': <why>``, then the failing
    patch's state and next step); a release not at hand offline is reported as not checked."""
    from patchbench.patches import state, wheels

    out: list[str] = []
    for name in cfg.variants:
        release = cfg.release_of(name)
        if not cfg.patches_of(name) or release is None:
            continue
        env = envinfo.environment_for(release)
        with tempfile.TemporaryDirectory(prefix="patchbench-dryrun-") as tmp, wheels.offline():
            try:
                patches = overlay_patches(cfg, name, release, cache_dir=CACHE_DIR)
                if env is not None:
                    ov.build_overlay(
                        release,
                        patches,
                        stock_site_dir=env.site_dir,
                        cache_root=Path(tmp),
                        patch_cache_dir=CACHE_DIR,
                    )
                else:
                    for p in patches:
                        if isinstance(p, str):
                            apply.check_patch(p, release, cache_dir=CACHE_DIR)
            except wheels.FetchError as e:
                out.append(f"variant '{name}': not checked on sglang {release}: {e}")
                continue
            except PatchError as e:
                out.append(f"variant '{name}': {e}")
                bad = next((p for p in patches_named(cfg, name) if p in str(e)), None)
                if bad is not None:
                    try:
                        st = state.patch_state(bad, release, cache_dir=CACHE_DIR)
                    except PatchError:
                        continue
                    if st.state != "applies":
                        out += [f"  {ln.strip()}" for ln in st.lines()]
    return out


def patches_named(cfg: Config, variant: str) -> list[str]:
    """The names of ``variant``'s patches that are folders of ``patches/`` (not diff files)."""
    return [p for p in cfg.patches_of(variant) if isinstance(p, str)]


# ------------------------------------------------------------------ identity
def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def variant_identity(cfg: Config, venv: VariantEnv) -> dict[str, str]:
    """{part: 16-hex sha256} of what ``venv`` runs (module docstring)."""
    ov = venv.overlay
    patches = [
        [n, getattr(ov, "patch_hashes", {}).get(o)]
        for n, o in zip(venv.patches, getattr(ov, "patches", []), strict=False)
    ]
    return {
        "patches": _h(patches),
        "server_args": _h(cfg.server_args_of(venv.name)),
        "env": _h([cfg.server_env_of(venv.name), list(cfg.server.cpu_stand_ins)]),
        "sglang": _h([cfg.sglang, venv.fbi_sha256]),
    }


def _recorded(run_dir: Path, variant: str) -> list[tuple[str, dict[str, str]]]:
    """(cell folder name, identity) of every cell of ``variant`` in ``run_dir`` that has one."""
    out = []
    for cj in sorted((run_dir / variant).glob("*/cell.json")):
        try:
            rec = read_cell(cj.parent)
        except Exception:  # noqa: BLE001 - an unreadable cell runs again anyway
            continue
        if rec is not None and rec.variant_identity:
            out.append((cj.parent.name, dict(rec.variant_identity)))
    return out


def check_resume_identity(
    run_dir: Path, current: dict[str, dict[str, str]], restart: list[str], *, log
) -> None:
    """Refuse a resume whose variants would run other code than the cells already there
    (``current``: {variant: :func:`variant_identity`}); ``restart``: variants to start over
    (their folders move to ``RUN/.restarted/<variant>-<stamp>``). Raises ConfigError (exit 2)
    naming the variant, the changed parts and the cells, or an unknown restart name."""
    unknown = [v for v in restart if v not in current]
    if unknown:
        raise ConfigError(
            f"--restart-variant {', '.join(unknown)}: not a variant of this config "
            f"({', '.join(current)})"
        )
    problems = []
    for v, now in current.items():
        if v in restart:
            folder = run_dir / v
            if folder.is_dir():
                dest = (
                    run_dir / ".restarted" / f"{v}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
                )
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(folder, dest)
                log(f"variant {v}: started over; its earlier cells moved to {dest}")
            continue
        changed: dict[str, list[str]] = {}
        for cell, there in _recorded(run_dir, v):
            for part in PARTS:
                if part in there and there[part] != now.get(part):
                    changed.setdefault(part, []).append(cell)
        if changed:
            what = "; ".join(
                f"{part} differ from what {', '.join(cells)} ran" for part, cells in changed.items()
            )
            problems.append(f"variant {v}: {what}")
    if problems:
        raise ConfigError(
            f"--resume {run_dir}: " + " | ".join(problems) + ". One variant's repeats must run one "
            "version: restore the inputs, or start the variant over with --restart-variant NAME"
        )
