"""``patchbench doctor [CONFIG]``: the environment, and with a CONFIG each requirement as OK /
MISSING with its fix. Exit 0 when nothing is missing, 3 otherwise; ConfigError (exit 2)."""

from __future__ import annotations

import contextvars
import sys
from pathlib import Path
from typing import Any, TextIO

from patchbench.config import load_config
from patchbench.envs import envinfo
from patchbench.errors import EXIT_ENV, EXIT_OK, PatchbenchError
from patchbench.inputs import REPO_ROOT, RESULTS_DIR, is_hub_id

#: :func:`patchbench.envs.envinfo.collect`'s facts of the doctor run in progress, for the suites'
#: checks (:func:`hub_reachable`)
_INFO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("doctor_info", default=None)

Check = tuple[str, bool, str]  # (what, ok, how to fix)


def supported_pins() -> list[str]:
    """sglang releases with a CPU profile in requirements/ (GPU installs take any release)."""
    return sorted(
        p.stem.removeprefix("cpu-") for p in (REPO_ROOT / "requirements").glob("cpu-*.txt")
    )


def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers, as this doctor run found it (probed when unknown)."""
    info = _INFO.get() or {}
    return bool(info["hub_reachable"]) if "hub_reachable" in info else envinfo.hub_reachable()


def hf_dataset_check(what: str, repo_id: str, local_path: str | None = None) -> Check:
    """A suite's check row for the Hugging Face dataset ``repo_id`` (``what`` names it, e.g.
    "suite mmmu: dataset MMMU/MMMU"): ok when ``local_path`` is set, the hub cache holds it or
    the hub answers."""
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
    fix = "fill the HF cache and set HF_DATASETS_OFFLINE=1, or set dataset_path"
    return f"{what} ({where})", cached or reachable, fix


def _stale_server_checks(results_dir: Path = RESULTS_DIR) -> list[Check]:
    """sglang servers left by a killed patchbench run (of ``results_dir`` or, by their markers,
    anywhere), each with the command that stops it."""
    from patchbench.run.ports import find_stale_servers

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

    try:
        builds = resolve_builds(cfg)
    except PatchbenchError as e:
        labels = sorted({sglang_label(cfg.sglang_of(v)) for v in cfg.variants})
        return [(f"sglang {', '.join(labels)} has an environment here", False, str(e))]
    return list({b.spec: (b.describe(), True, "") for b in builds.values()}.values())


def _model_check(cfg: Any, info: dict) -> Check:
    """The model: a tiny model (built by the first run: never missing), a local folder, the hub
    cache, or a reachable hub."""
    if cfg.model.tiny:
        from patchbench.envs.tinymodel import is_built

        what = f"tiny model at {cfg.model_dir}"
        if not is_built(cfg.model_dir):
            what += f" (not built yet: the first run builds it; or now: patchbench make-tiny-model {cfg.model_dir})"
        return what, True, ""
    if cfg.model_dir.exists():
        where, ok = "local folder", True
    elif is_hub_id(cfg.model.path) and envinfo.hf_cached(cfg.model.path):
        where, ok = "in the HF hub cache", True
    else:
        reach = bool(info.get("hub_reachable"))
        where = "hub reachable" if reach else "not local, not cached, hub unreachable"
        ok = reach and is_hub_id(cfg.model.path)
    fix = (
        "download the weights to a local folder and set model.path, or fill the HF cache "
        "(huggingface-cli download ID) and set HF_HUB_OFFLINE=1"
    )
    return f"model {cfg.model.path} ({where})", ok, fix


def checks_for(cfg: Any, info: dict) -> list[Check]:
    """(what, ok, how to fix) for each requirement of the loaded config ``cfg`` here; ``info``:
    :func:`patchbench.envs.envinfo.collect`'s dict (keys used: hub_reachable, gpu)."""
    from patchbench.run.ports import port_answers
    from patchbench.run.variants import is_cpu
    from patchbench.suite import get_suite

    token = _INFO.set(info)
    try:
        out = [*_build_checks(cfg), _model_check(cfg, info)]
        if not is_cpu(cfg):
            out.append(
                (
                    "NVIDIA GPU (the config does not run on --device cpu)",
                    bool(info.get("gpu")),
                    "run on a GPU machine, or use a CPU config (configs/demo-cpu.yaml)",
                )
            )
        port = cfg.server.port
        out.append(
            (
                f"port {port} free",
                not port_answers(cfg.server.host, port),
                "stop whatever listens there or change server.port",
            )
        )
        for name, params in cfg.suite_params.items():
            try:
                datasets = get_suite(name).hf_datasets(params)
                out += [hf_dataset_check(*d) for d in datasets]
            except (KeyError, ImportError) as e:
                out.append((f"suite {name} loads", False, str(e).strip("'\"")))
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


def run_doctor(config: str | None = None, out: TextIO | None = None, *, nvml: Any = "auto") -> int:
    """Print the environment, the GPUs' settings (``nvml``: a patchbench.run.gpu.Nvml, None for
    no GPU, or "auto"), leftover servers and (with ``config``) its requirements. Returns 0 when
    nothing is missing, 3 otherwise; ConfigError (exit 2) for an invalid config."""
    from patchbench.run import gpu

    out = out or sys.stdout
    info = envinfo.collect(with_torch=True, with_hub=True)
    for k, v in environment_rows(info) + gpu.doctor_rows(
        gpu.open_nvml() if nvml == "auto" else nvml
    ):
        print(f"{k:<18} {v}", file=out)
    rows = _stale_server_checks()
    if config:
        rows = checks_for(load_config(config), info) + rows
        print(f"\nfor {config}:", file=out)
    elif rows:
        print("", file=out)
    for what, ok, fix in rows:
        print(
            f"  {'OK     ' if ok else 'MISSING'} {what}" + ("" if ok else f"  -> {fix}"), file=out
        )
    return EXIT_OK if all(ok for _, ok, _ in rows) else EXIT_ENV
