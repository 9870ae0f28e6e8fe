#!/usr/bin/env bash
# GPU check of the mrope-sync-free patch on a lent H200 (no network, Python 3.12, torch 2.11, no
# sglang there): runs the stock, upstream (PR #9460, 0.5.2rc2) and patched ForwardBatch mrope
# methods, extracted from their forward_batch_info.py files, on CUDA decode batches and prints one
# table: release, variant, batch size, D2H reads/call, blocking H2D copies/call, sync warnings/call
# (torch.cuda.set_sync_debug_mode("warn")), host-blocked ms behind a 50 ms kernel, positions = stock.
#
# 1. here, once (needs .venv; writes the git-ignored .cache/gpu_check/, about 0.5 MB):
#      scripts/gpu_check.sh prepare
# 2. on the lent machine (device tool), the exact call:
#      run(command="bash scripts/gpu_check.sh", carry=[".cache/gpu_check"], timeout_s=300)
#    (finishes in well under 4 minutes; the table is in the output, $OUT/gpu_probe.json has the rows)
# Without a GPU the same files can be checked with the CPU probes:
#      scripts/gpu_check.sh --device cpu
# Exit status: gpu_probe.py's (0 ok, 1 a patched row synced or differed from stock, 2 usage).
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
SOURCES="$HERE/.cache/gpu_check"
if [ "${1:-}" = prepare ]; then
  rm -rf "$SOURCES"
  exec "${PYTHON:-$HERE/.venv/bin/python}" "$HERE/scripts/gpu_probe.py" prepare "$SOURCES"
fi
PY=${PYTHON:-python3}
# here (not on the lent machine) the CPU check needs the project environment's torch
if [ -z "${PYTHON:-}" ] && [ "${1:-}" = --device ] && [ -x "$HERE/.venv/bin/python" ]; then
  PY="$HERE/.venv/bin/python"
fi
if [ ! -f "$SOURCES/sources.json" ]; then
  echo "gpu_check: $SOURCES/sources.json missing: run 'scripts/gpu_check.sh prepare' here and carry .cache/gpu_check" >&2
  exit 2
fi
DEVICE=cuda
if [ "${1:-}" = --device ]; then DEVICE=${2:?--device cuda|cpu}; shift 2; fi
if [ "$DEVICE" = cuda ]; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; fi
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
exec timeout 220 "$PY" "$HERE/scripts/gpu_probe.py" run --sources "$SOURCES" --device "$DEVICE" "$@"
