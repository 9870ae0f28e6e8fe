"""The run's :class:`~patchbench.runfolder.RunManifest` as ``bench`` starts it
(:func:`new_manifest`), the files of the config it copies into the run folder
(:func:`copy_config_files`) and the manifest's entry of one cell (:func:`cell_entry`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from patchbench.config import Config, DiffPatch
from patchbench.envs.envinfo import cpu_model
from patchbench.errors import PatchError
from patchbench.inputs import sha256_file
from patchbench.patches import apply
from patchbench.records import write_bytes
from patchbench.run.plan import Cell
from patchbench.run.variants import CACHE_DIR, VariantEnv, client_release
from patchbench.runfolder.models import (
    CellRecord,
    CopiedFile,
    HostInfo,
    MachineInfo,
    ManifestCell,
    PatchHash,
    ResumeRecord,
    RunManifest,
    RunTimings,
)
from patchbench.suite import get_suite

#: the keys of patchbench.envs.envinfo.collect() that ``manifest.host`` repeats
HOST_KEYS = (
    "hostname",
    "platform",
    "python",
    "cpu_count",
    "cpu_usable",
    "memory_total_gib",
    "transformers",
)


def new_manifest(
    cfg: Config,
    run_dir: Path,
    env: dict,
    variants: dict[str, VariantEnv],
    timings: RunTimings,
    *,
    started: str,
    resumed: RunManifest | None = None,
    resumed_at: str | None = None,
    nvml: Any = None,
) -> RunManifest:
    """The manifest of a run starting now in ``run_dir`` (no cells yet; the config's files are
    copied in, its secret values redacted). ``env``: patchbench.envs.envinfo.collect();
    ``variants``: the prepared overlays; ``timings``: this invocation's (a resumed run's, with
    ``resumed`` its manifest, go to a new entry of ``resumes`` started at ``resumed_at``);
    ``nvml``: the run's :class:`patchbench.run.gpu.Nvml` (None: a CPU run), for
    :func:`machine_info`."""
    shown = cfg.redacted()
    m = RunManifest(
        run_id=run_dir.name,
        config_path=str(cfg.source) if cfg.source is not None else None,
        config=shown,
        sglang_version=client_release(cfg),
        model=cfg.model_ref,
        patches={
            v: [
                PatchHash(name=n, sha256=ve.overlay.patch_hashes.get(o))
                for n, o in zip(ve.patches, ve.overlay.patches, strict=False)
            ]
            for v, ve in variants.items()
        },
        overlays={v: ve.overlay.to_json() for v, ve in variants.items()},
        git_sha=env.get("git_sha"),
        host=HostInfo(**{k: env.get(k) for k in HOST_KEYS}),
        gpu=env.get("gpu"),
        machine=machine_info(
            nvml,
            cfg.server.env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES")),
            env.get("hostname"),
        ),
        environment=env,
        started_at=started,
        ended_at=None,
        timings_s=timings,
        variant_diffs={v: variant_diff(shown, v, cache_dir=CACHE_DIR) for v in cfg.variants},
        suite_rounds={
            s: (cfg.rounds_of(s) if get_suite(s).timed else "correctness") for s in cfg.suites
        },
        copied_files=copy_config_files(cfg, run_dir),
    )
    if cfg.has_own_builds():
        m.builds = {v: b.to_json() for v, b in cfg.builds.items()}
    if resumed is not None:
        m.timings_s = resumed.timings_s
        m.resumes = [*resumed.resumes, ResumeRecord(started_at=resumed_at, timings_s=timings)]
    return m


def machine_info(nvml: Any, visible: str | None, hostname: str | None) -> MachineInfo:
    """The machine the nightly compares a run's nights by: with ``nvml`` the model and NVML UUIDs
    of the GPUs the server sees (``visible``: its ``CUDA_VISIBLE_DEVICES``, the config's
    ``server.env`` before this process's; :meth:`patchbench.run.gpu.Nvml.devices`); without
    one, or when NVML names none, the CPU's model name and ``hostname``; ``driver``: NVML's."""
    if nvml is not None:
        gpus = nvml.devices(visible)
        if gpus:
            models = "/".join(sorted({name for _i, name, _u in gpus}))
            return MachineInfo(
                model=models, gpu_uuids=[u for _i, _n, u in gpus], driver=nvml.driver()
            )
    return MachineInfo(model=cpu_model(), hostname=hostname)


def variant_diff(cfg: Config, variant: str, *, cache_dir: Path | None = None) -> dict:
    """:meth:`Config.variant_diff` with each patch's sha256 for the variant's release (a named
    patch's diff, a derived patch's from its wheels fetched once into ``cache_dir``; None where
    it cannot be computed) or of the diff file."""
    d = cfg.variant_diff(variant)
    release = cfg.release_of(variant)
    for p in d["patches"]:
        if p["kind"] == "diff":
            p["sha256"] = sha256_file(Path(p["path"])) if Path(p["path"]).is_file() else None
        elif release is not None:
            try:
                p["sha256"] = apply.patch_sha256(p["name"], release, cache_dir)
            except PatchError:
                pass
    return d


def copy_config_files(cfg: Config, run_dir: Path) -> list[CopiedFile]:
    """Copy every diff file a variant names into ``run_dir`` as ``diffs/<sha256 first
    12>-<file name>`` (atomically; one already there is kept); returns where each went."""
    files = {
        p.diff: cfg.resolve_path(p.diff)
        for spec in cfg.variants.values()
        for p in spec.patches
        if isinstance(p, DiffPatch)
    }
    out = []
    for src in files.values():
        rel = f"diffs/{sha256_file(src)[:12]}-{src.name}"
        dest = run_dir / rel
        if not dest.exists():
            write_bytes(dest, src.read_bytes())
        out.append(CopiedFile(source=str(src), path=rel))
    return out


def cell_entry(cell: Cell, run_dir: Path, rec: CellRecord | None, *, skipped: bool) -> ManifestCell:
    """The manifest's entry of ``cell`` from its record (None: no cell.json): ``skipped`` for a
    cell an earlier invocation finished, else with the first line of its error."""
    rec = rec if rec is not None else CellRecord()
    entry = ManifestCell(
        variant=cell.variant,
        repeat=cell.repeat,
        cell_kind=cell.kind,
        instrumented=rec.instrumented,
        status=rec.status,
        dir=str(cell.path(run_dir).relative_to(run_dir)),
        suites=dict(rec.suites),
        timings_s=dict(rec.timings_s),
    )
    if skipped:
        entry.skipped = True
    else:
        entry.error = _first_line(rec.error)
    return entry


def _first_line(text: str | None, limit: int = 300) -> str | None:
    lines = (text or "").strip().splitlines()
    return lines[0][:limit] if lines else None
