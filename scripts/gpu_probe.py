#!/usr/bin/env python3
"""The GPU check of the mrope-sync-free patch, runnable without sglang (see scripts/gpu_check.sh).

    gpu_probe.py prepare DIR
        (here, in .venv) write DIR/<release>/<variant>/forward_batch_info.py for 0.5.1.post3 and
        0.5.23, variants stock and patched (plus "upstream" = 0.5.2rc2's file, PR #9460, for
        0.5.1.post3), and DIR/sources.json with their sha256; about 0.5 MB.
    gpu_probe.py run --sources DIR [--device cuda|cpu] [--batch-sizes 1,8,32,128] [--json FILE]
        for every file: extract the ForwardBatch mrope methods (patchbench/suites/sync_probe/mrope/) and run
        them on decode batches; print one table (release, variant, batch size, D2H reads/call,
        blocking H2D copies/call, sync warnings/call, host-blocked ms, positions = stock).
        ``--device cpu``
        runs the CPU probes (seq_lens on the meta device) instead of the CUDA measurements.

Exit status: 0 when every patched row has equal positions and no read / blocking copy / sync
warning, 1 otherwise, 2 on bad usage or missing files.

``run`` needs only python3 and torch: it loads the package patchbench/suites/sync_probe/mrope/ and
patchbench/suites/sync_probe/table.py by file path (no ``patchbench`` package, no pydantic, no sglang);
``prepare`` runs in the project's environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE_DIR = REPO / "patchbench" / "suites" / "sync_probe"
FILE = "forward_batch_info.py"


def load_by_path(name: str, path: Path):
    """Import one standalone file, or a package folder's ``__init__.py`` (its submodules then
    import as ``name.<sub>``), as module ``name`` without importing the package above it (the
    suite's __init__ needs pydantic and patchbench, which the lent GPU machine does not have)."""
    import importlib.util

    folder = [str(path.parent)] if path.name == "__init__.py" else None
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=folder)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    return mod


def prepare(out: Path) -> int:
    """Write the source files and sources.json into ``out`` (replacing what was there)."""
    sys.path.insert(0, str(REPO))
    from tools.mrope_sources import release_sources, stock_source

    files = {}
    for release in ("0.5.1.post3", "0.5.23"):
        sources = dict(release_sources(release))
        if release == "0.5.1.post3":
            sources["upstream"] = stock_source("0.5.2rc2")
        for variant, path in sources.items():
            dest = out / release / variant / FILE
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            files[f"{release}/{variant}"] = hashlib.sha256(dest.read_bytes()).hexdigest()
    (out / "sources.json").write_text(json.dumps({"files": files}, indent=1))
    print(f"prepared {len(files)} files in {out}")
    return 0


def run(
    sources: Path,
    device: str,
    batch_sizes: list[int],
    json_out: Path | None,
    iterations: int,
    image_share: float,
) -> int:
    """Probe every prepared file at every batch size, print the table and the verdict; the exit
    status (0 ok, 1 a patched row synced or differed from stock, 2 missing files / no GPU)."""
    import torch

    mrope = load_by_path("_gpu_probe_mrope", SUITE_DIR / "mrope" / "__init__.py")
    format_table = load_by_path("_gpu_probe_table", SUITE_DIR / "table.py").format_table
    files = _source_index(sources, device, torch)
    if files is None:
        return 2
    t0 = time.time()
    cycles = mrope.calibrate_sleep_cycles(50.0) if device == "cuda" else None
    rows, bad = [], []
    for key, sha in files.items():
        release, variant = key.split("/")
        path = sources / release / variant / FILE
        if hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            print(f"gpu_probe: {path} does not match sources.json", file=sys.stderr)
            return 2
        methods = mrope.MropeMethods(path, key)
        stock = mrope.MropeMethods(sources / release / "stock" / FILE, f"{release}/stock")
        for bs in batch_sizes:
            row = mrope.measure_row(
                methods,
                stock,
                bs,
                device=device,
                image_share=image_share,
                seed=bs,
                iterations=iterations,
                sleep_cycles=cycles,
            )
            row.update(release=release, variant=variant)
            rows.append(row)
            if variant == "patched" and _syncs_or_differs(row, device):
                bad.append(f"{key} batch {bs}: {row}")
    header = _header(device, torch, image_share)
    print(header)
    print(format_table(rows, lead=[("release", "release"), ("variant", "variant")]))
    print(f"{len(rows)} rows in {time.time() - t0:.1f} s")
    print(
        "verdict: patched rows sync-free and equal to stock"
        if not bad
        else "verdict: FAILED\n" + "\n".join(bad)
    )
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(
            json.dumps({"header": header, "rows": rows, "failed": bad}, indent=1, default=str)
        )
    return 1 if bad else 0


def _source_index(sources: Path, device: str, torch) -> dict[str, str] | None:
    """sources.json's ``{"<release>/<variant>": sha256}``; None (the reason on stderr) when it
    is missing or ``device`` is cuda and torch sees no GPU."""
    index = sources / "sources.json"
    if not index.is_file():
        print(f"gpu_probe: no {index}; run `gpu_probe.py prepare {sources}` first", file=sys.stderr)
        return None
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_probe: --device cuda but torch sees no GPU", file=sys.stderr)
        return None
    return json.loads(index.read_text())["files"]


def _syncs_or_differs(row: dict, device: str) -> bool:
    """A patched row that fails the check: positions differ from stock, an error, a read, a
    blocking copy, a sync warning, or (CUDA) a copy from pageable memory."""
    return bool(
        not row.get("positions_equal_stock")
        or row.get("error")
        or row.get("d2h_reads_per_call")
        or row.get("blocking_h2d_copies_per_call")
        or row.get("sync_warnings_per_call")
        or row.get("strict_error")
        or (device == "cuda" and not row.get("h2d_copies_pinned", True))
    )


def _header(device: str, torch, image_share: float) -> str:
    where = (
        f" ({torch.cuda.get_device_name()})"
        if device == "cuda"
        else " (CPU probes: seq_lens on meta)"
    )
    return (
        f"mrope decode positions, {device}{where}, torch {torch.__version__}, "
        f"image share {image_share}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("out", type=Path)
    r = sub.add_parser("run")
    r.add_argument("--sources", type=Path, default=REPO / ".cache" / "gpu_check")
    r.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    r.add_argument("--batch-sizes", default="1,8,32,128")
    r.add_argument("--iterations", type=int, default=5)
    r.add_argument("--image-share", type=float, default=0.5)
    r.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        return prepare(args.out)
    sizes = [int(x) for x in args.batch_sizes.split(",") if x]
    json_out = args.json or (
        Path(os.environ["OUT"]) / "gpu_probe.json" if os.environ.get("OUT") else None
    )
    return run(args.sources, args.device, sizes, json_out, args.iterations, args.image_share)


if __name__ == "__main__":
    sys.exit(main())
