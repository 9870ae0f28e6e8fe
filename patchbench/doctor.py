"""``runner.py doctor [CONFIG]``: print the environment and what is missing for a config.

Prints GPU, driver, CUDA build, torch, sglang, the pins this repo supports, whether the model hub
answers, free disk; with a CONFIG also each requirement of that config with OK / MISSING and the
command that fixes it. Exit 0 when nothing is missing, 3 otherwise.
"""
from __future__ import annotations

import argparse
import sys

from patchbench import EXIT_ENV, EXIT_OK, EXIT_USAGE, envinfo
from patchbench.config import REPO_ROOT, ConfigError, is_hub_id, load_config


def supported_pins() -> list[str]:
    """sglang releases with a CPU profile in requirements/ (GPU installs take any release)."""
    return sorted(p.stem.removeprefix("cpu-") for p in (REPO_ROOT / "requirements").glob("cpu-*.txt"))


def checks_for(cfg, info: dict) -> list[tuple[str, bool, str]]:
    """(what, ok, how to fix) for each requirement of ``cfg`` in this environment."""
    from patchbench.server import port_answers

    out = []
    have = info.get("sglang")
    fix = "make setup" if cfg.sglang == "0.5.1.post3" else f"make setup SGLANG={cfg.sglang}"
    out.append((f"sglang {cfg.sglang} installed (have {have})", have == cfg.sglang, fix))
    if cfg.model.tiny:
        from patchbench.tinymodel import is_built
        out.append((f"tiny model at {cfg.model_dir}", is_built(cfg.model_dir),
                    f"built on first run, or: runner.py make-tiny-model {cfg.model_dir}"))
    else:
        if cfg.model_dir.exists():
            where, ok = "local folder", True
        elif is_hub_id(cfg.model.path) and envinfo.hf_cached(cfg.model.path):
            where, ok = "in the HF hub cache", True
        else:
            where = "hub reachable" if info.get("hub_reachable") else "not local, not cached, hub unreachable"
            ok = bool(info.get("hub_reachable")) and is_hub_id(cfg.model.path)
        out.append((f"model {cfg.model.path} ({where})", ok,
                    "download the weights to a local folder and set model.path, or fill the HF "
                    "cache (huggingface-cli download ID) and set HF_HUB_OFFLINE=1"))
    needs_gpu = not any(a in ("cpu", "--device=cpu") for a in cfg.server.args)
    if needs_gpu:
        out.append(("NVIDIA GPU (the config does not run on --device cpu)", bool(info.get("gpu")),
                    "run on a GPU machine, or use a CPU config (configs/demo-cpu.yaml)"))
    out.append((f"port {cfg.server.port} free", not port_answers(cfg.server.host, cfg.server.port),
                "stop whatever listens there or change server.port"))
    for name, p in cfg.suite_params.items():
        ds = getattr(p, "dataset_name", None) or getattr(p, "dataset", None)
        if ds and "mmmu" in str(ds).lower() and not getattr(p, "dataset_path", None):
            cached = envinfo.hf_cached("MMMU/MMMU", "dataset")
            how = ("in the HF hub cache" if cached else "hub reachable" if info.get("hub_reachable")
                   else "not cached, hub unreachable")
            out.append((f"suite {name}: dataset {ds} ({how})",
                        cached or bool(info.get("hub_reachable")),
                        "fill the HF cache and set HF_DATASETS_OFFLINE=1, or set dataset_path"))
    return out


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="runner.py doctor", description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?")
    args = ap.parse_args(argv)
    info = envinfo.collect(with_torch=True, with_hub=True)
    gpu = info.get("gpu")
    rows = [
        ("python", f"{info['python']} ({info['executable']})"),
        ("GPU", ", ".join(g["name"] for g in gpu["gpus"]) if gpu else "none (CPU only)"),
        ("driver", gpu["driver"] if gpu else "-"),
        ("torch", f"{info.get('torch')} (CUDA build {info.get('cuda_build')}, "
                  f"CUDA available: {info.get('cuda_available')})"),
        ("sglang", info.get("sglang") or "not installed"),
        ("transformers", info.get("transformers") or "-"),
        ("supported pins", ", ".join(supported_pins())),
        ("model hub", "reachable" if info.get("hub_reachable") else "NOT reachable (offline)"),
        ("HF_HUB_OFFLINE", info.get("hf_hub_offline") or "-"),
        ("free disk", f"{info['disk_free_gib']} GiB"),
        ("repo commit", info.get("git_sha") or "-"),
    ]
    for k, v in rows:
        print(f"{k:<16} {v}")
    if not args.config:
        return EXIT_OK
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"config error:\n{e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"\nfor {args.config}:")
    missing = 0
    for what, ok, fix in checks_for(cfg, info):
        print(f"  {'OK     ' if ok else 'MISSING'} {what}" + ("" if ok else f"  -> {fix}"))
        missing += not ok
    return EXIT_OK if not missing else EXIT_ENV
