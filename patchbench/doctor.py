"""``patchbench doctor [CONFIG]``: print the environment and what is missing for a config.

Prints GPU, driver, CUDA build, torch, sglang, the pins this repo supports, whether the model hub
answers, free disk, each GPU's persistence mode and application clocks (NVML:
:func:`patchbench.run.gpu.doctor_rows`; "no NVIDIA GPU" without one); with a CONFIG also each
requirement of that config with OK / MISSING and the command that fixes it: the sglang pin, the
model, a GPU, the port, and each suite's own checks
(:meth:`patchbench.suite.Suite.doctor_checks`; the core names no suite). Exit 0 when nothing is
missing, 3 otherwise; an invalid CONFIG raises :class:`patchbench.errors.ConfigError` (exit 2).
"""

from __future__ import annotations

import contextvars
import sys
from pathlib import Path
from typing import Any, TextIO

from patchbench.config import load_config
from patchbench.envs import envinfo
from patchbench.errors import EXIT_ENV, EXIT_OK, PatchbenchError
from patchbench.inputs import REPO_ROOT, RESULTS_DIR, is_hub_id

#: the environment facts (:func:`patchbench.envs.envinfo.collect`) of the doctor run in progress, so a
#: suite's ``doctor_checks`` can ask (e.g. whether the hub answers) without probing again
_INFO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("doctor_info", default=None)

Check = tuple[str, bool, str]  # (what, ok, how to fix)


def supported_pins() -> list[str]:
    """sglang releases with a CPU profile in requirements/ (GPU installs take any release)."""
    return sorted(
        p.stem.removeprefix("cpu-") for p in (REPO_ROOT / "requirements").glob("cpu-*.txt")
    )


def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers, as this doctor run found it (probed when unknown)."""
    info = _INFO.get()
    if info is not None and "hub_reachable" in info:
        return bool(info["hub_reachable"])
    return envinfo.hub_reachable()


def hf_dataset_check(what: str, repo_id: str, local_path: str | None = None) -> Check:
    """A check row for a Hugging Face dataset a suite reads: ok when ``local_path`` is set (the
    suite reads that instead), the hub cache holds ``repo_id``, or the hub answers.

    ``what`` names the requirement, e.g. "suite mmmu: dataset MMMU/MMMU"; the row's text adds
    where the data was found. For use in a suite's ``doctor_checks``.
    """
    if local_path:
        return f"{what} (local: {local_path})", True, ""
    cached = envinfo.hf_cached(repo_id, "dataset")
    reachable = hub_reachable()
    where = (
        "in the HF hub cache"
        if cached
        else "hub reachable"
        if reachable
        else "not cached, hub unreachable"
    )
    return (
        f"{what} ({where})",
        cached or reachable,
        "fill the HF cache and set HF_DATASETS_OFFLINE=1, or set dataset_path",
    )


def _suite_checks(cfg: Any) -> list[Check]:
    """Each suite's own ``doctor_checks`` (a suite that does not load is a MISSING row)."""
    from patchbench.suite import get_suite

    out: list[Check] = []
    for name, params in cfg.suite_params.items():
        try:
            suite = get_suite(name)
        except (KeyError, ImportError) as e:
            out.append((f"suite {name} loads", False, str(e).strip("'\"")))
            continue
        out.extend(suite.doctor_checks(cfg, params))
    return out


def _stale_server_checks(results_dir: Path | None = None) -> list[Check]:
    """sglang servers left by a killed patchbench run (:func:`patchbench.run.stale.find_stale_servers`
    over ``results_dir``, default results/, and every server of this user that carries the
    harness's markers, wherever its run wrote to), each with the command that stops it."""
    try:
        from patchbench.run.stale import find_stale_servers
    except ImportError:  # the module is optional until every environment has it
        return []
    if results_dir is None:
        results_dir = RESULTS_DIR
    stale = find_stale_servers(results_dir, anywhere=True)
    if not stale:
        return [("no sglang server left over by an earlier patchbench run", True, "")]
    return [
        (
            f"sglang server pid {s.pid} left over by run {s.run_dir or '?'} "
            f"(cell {s.cell or '?'}, port {s.port or '?'})",
            False,
            f"{s.kill_command}   (or: patchbench bench --kill-stale CONFIG)",
        )
        for s in stale
    ]


def _build_checks(cfg: Any) -> list[Check]:
    """One check per distinct ``sglang:`` of the config's variants (a release, ``latest``, a
    wheel or a git checkout): resolved to an environment of this machine, as ``bench`` does
    (:func:`patchbench.envs.builds.resolve_builds`), or the reason it cannot be and its fix."""
    from patchbench.config import sglang_label
    from patchbench.envs.builds import resolve_builds

    labels = sorted({sglang_label(cfg.sglang_of(v)) for v in cfg.variants})
    try:
        builds = resolve_builds(cfg)
    except PatchbenchError as e:
        return [(f"sglang {', '.join(labels)} has an environment here", False, str(e))]
    seen: dict[str, Check] = {}
    for b in builds.values():
        seen.setdefault(b.spec, (b.describe(), True, ""))
    return list(seen.values())


def checks_for(cfg: Any, info: dict) -> list[Check]:
    """(what, ok, how to fix) for each requirement of ``cfg`` (a loaded Config) in this
    environment; ``info`` is :func:`patchbench.envs.envinfo.collect`'s dict (keys used: sglang,
    hub_reachable, gpu)."""
    from patchbench.run.ports import port_answers

    token = _INFO.set(info)
    try:
        out: list[Check] = []
        out += _build_checks(cfg)
        if cfg.model.tiny:
            from patchbench.envs.tinymodel import is_built

            # not a missing requirement: the first run builds it (``model.tiny``)
            built = is_built(cfg.model_dir)
            out.append(
                (
                    f"tiny model at {cfg.model_dir}"
                    + (
                        ""
                        if built
                        else " (not built yet: the first run builds it; or now: "
                        f"patchbench make-tiny-model {cfg.model_dir})"
                    ),
                    True,
                    "",
                )
            )
        else:
            if cfg.model_dir.exists():
                where, ok = "local folder", True
            elif is_hub_id(cfg.model.path) and envinfo.hf_cached(cfg.model.path):
                where, ok = "in the HF hub cache", True
            else:
                reach = bool(info.get("hub_reachable"))
                where = "hub reachable" if reach else "not local, not cached, hub unreachable"
                ok = reach and is_hub_id(cfg.model.path)
            out.append(
                (
                    f"model {cfg.model.path} ({where})",
                    ok,
                    "download the weights to a local folder and set model.path, or fill the "
                    "HF cache (huggingface-cli download ID) and set HF_HUB_OFFLINE=1",
                )
            )
        if not any(a in ("cpu", "--device=cpu") for a in cfg.server.args):
            out.append(
                (
                    "NVIDIA GPU (the config does not run on --device cpu)",
                    bool(info.get("gpu")),
                    "run on a GPU machine, or use a CPU config (configs/demo-cpu.yaml)",
                )
            )
        out.append(
            (
                f"port {cfg.server.port} free",
                not port_answers(cfg.server.host, cfg.server.port),
                "stop whatever listens there or change server.port",
            )
        )
        out.extend(_suite_checks(cfg))
        return out
    finally:
        _INFO.reset(token)


def environment_rows(info: dict) -> list[tuple[str, str]]:
    """(label, value) lines describing this environment, from :func:`envinfo.collect`'s dict."""
    gpu = info.get("gpu")
    return [
        ("python", f"{info['python']} ({info['executable']})"),
        ("GPU", ", ".join(g["name"] for g in gpu["gpus"]) if gpu else "none (CPU only)"),
        ("driver", gpu["driver"] if gpu else "-"),
        (
            "torch",
            f"{info.get('torch')} (CUDA build {info.get('cuda_build')}, "
            f"CUDA available: {info.get('cuda_available')})",
        ),
        ("sglang", info.get("sglang") or "not installed"),
        ("transformers", info.get("transformers") or "-"),
        ("supported pins", ", ".join(supported_pins())),
        ("model hub", "reachable" if info.get("hub_reachable") else "NOT reachable (offline)"),
        ("HF_HUB_OFFLINE", info.get("hf_hub_offline") or "-"),
        ("free disk", f"{info['disk_free_gib']} GiB"),
        ("repo commit", info.get("git_sha") or "-"),
    ]


def gpu_rows(nvml: Any = "auto") -> list[tuple[str, str]]:
    """(label, value) lines of each GPU's persistence mode and application clocks
    (:func:`patchbench.run.gpu.doctor_rows`). ``nvml``: a patchbench.run.gpu.Nvml, None (no GPU), or
    "auto" (NVML where a driver and a GPU are present)."""
    from patchbench.run import gpu

    if nvml == "auto":
        nvml = gpu.open_nvml()
    return gpu.doctor_rows(nvml)


def run_doctor(config: str | None = None, out: TextIO | None = None, *, nvml: Any = "auto") -> int:
    """Print the environment, the GPUs' settings (``nvml``: see :func:`gpu_rows`), leftover
    servers (of any run of this user, wherever its results went) and (with ``config``) each
    requirement of that config. Returns 0 when nothing is missing, 3 (EXIT_ENV) otherwise.
    Raises ConfigError (exit 2) for an invalid config."""
    out = out or sys.stdout
    info = envinfo.collect(with_torch=True, with_hub=True)
    for k, v in environment_rows(info) + gpu_rows(nvml):
        print(f"{k:<18} {v}", file=out)
    rows = _stale_server_checks()
    if config:
        cfg = load_config(config)
        rows = checks_for(cfg, info) + rows
        print(f"\nfor {config}:", file=out)
    elif rows:
        print("", file=out)
    for what, ok, fix in rows:
        print(
            f"  {'OK     ' if ok else 'MISSING'} {what}" + ("" if ok else f"  -> {fix}"), file=out
        )
    return EXIT_OK if all(ok for _, ok, _ in rows) else EXIT_ENV
