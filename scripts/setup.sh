#!/usr/bin/env bash
# Create (or refresh) the virtual environment for one sglang pin, idempotently.
#   usage: scripts/setup.sh PIN VENV [cpu|gpu|auto]
# cpu: the release without its CUDA-only dependencies (requirements/cpu-PIN.txt) plus the
#      import-time stand-ins that patchbench/shims carries; gpu: the release's full install
#      (sglang[srt]==0.5.1.post3, sglang==0.5.23 and later). auto: gpu when nvidia-smi sees a GPU.
# A stamp file in the venv records what was installed; a second call with the same inputs
# does nothing.
# Disk: pip keeps no cache (--no-cache-dir: the CUDA wheels would otherwise sit on disk twice) and
# torch's large dependencies are installed one per pip call, so a fresh venv needs about its own
# final size plus one wheel. A fresh CPU venv is refused at once (exit 4) when the disk holding it
# has less free space than the `# disk-gb:` line of requirements/cpu-PIN.txt states.
# SETUP_DRY_RUN=1 (make check-gpu-profile): ask pip to resolve exactly what the gpu profile would
# install (pip install --dry-run --ignore-installed --report), install nothing, print a summary;
# VENV is then unused. Exit 0 when it resolves, 1 otherwise.
set -euo pipefail
PIN=${1:?usage: setup.sh PIN VENV [cpu|gpu|auto]}
VENV=${2:?usage: setup.sh PIN VENV [cpu|gpu|auto]}
PROFILE=${3:-auto}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
if [ "$PROFILE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then PROFILE=gpu; else PROFILE=cpu; fi
fi
case "$PROFILE" in cpu|gpu) ;; *) echo "setup.sh: profile must be cpu, gpu or auto, not '$PROFILE'" >&2; exit 2;; esac
REQ="$HERE/requirements/cpu-$PIN.txt"
if [ "$PROFILE" = cpu ] && [ ! -f "$REQ" ] && [ "${SETUP_DRY_RUN:-0}" != 1 ]; then
  # any other release: a layer over the default environment, from the release's own declared
  # dependencies with the CUDA-only ones left out by rule (patchbench/envs/layers.py); VENV
  # becomes a link to it
  DEFAULT="$HERE/.venv"
  [ -x "$DEFAULT/bin/python" ] || "$0" 0.5.1.post3 "$DEFAULT" cpu
  echo "setup: sglang $PIN has no CPU profile in requirements/: making it as a layer over .venv"
  exec "$DEFAULT/bin/python" -m patchbench.envs.layers "$PIN" --link "$VENV"
fi
# what the venv is made from: pyproject.toml without its test and lint settings ([tool.pytest*],
# [tool.ruff*]), whose edits need no reinstall
stamp_inputs() {
  echo "pin=$PIN profile=$PROFILE python=$($PY -c 'import sys;print(sys.version.split()[0])')"
  cat "$HERE/requirements/harness.txt"
  awk '/^\[/ { skip = /^\[tool\.(pytest|ruff)/ } !skip' "$HERE/pyproject.toml"
  [ "$PROFILE" = cpu ] && cat "$REQ"
  true
}
gpu_spec() {
  case "$PIN" in 0.5.1*|0.5.0*|0.4.*) echo "sglang[srt]==$PIN";; *) echo "sglang==$PIN";; esac
}
if [ "${SETUP_DRY_RUN:-0}" = 1 ]; then
  [ "$PROFILE" = gpu ] || { echo "setup.sh: SETUP_DRY_RUN=1 resolves the gpu profile only" >&2; exit 2; }
  step "resolving $TORCH"
  report=$(mktemp --suffix=.json)
  t0=$(date +%s)
  echo "check-gpu-profile: resolving $(gpu_spec) -r requirements/harness.txt with $($PY --version)"
  if ! $PY -m pip install --dry-run --ignore-installed --disable-pip-version-check --quiet \
        --progress-bar off --report "$report" "$(gpu_spec)" -r "$HERE/requirements/harness.txt"; then
    echo "check-gpu-profile: sglang $PIN (gpu profile) does NOT resolve (pip output above)" >&2
    rm -f "$report"; exit 1
  fi
  $PY - "$report" "$PIN" "$(( $(date +%s) - t0 ))" <<'PYEOF'
import json, sys
rep = json.load(open(sys.argv[1]))
got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in rep["install"]}
keys = ["sglang", "torch", "flashinfer-python", "sgl-kernel", "transformers", "triton", "xgrammar"]
shown = ", ".join(f"{k} {got[k]}" for k in keys if k in got)
print(f"check-gpu-profile: sglang {sys.argv[2]} (gpu profile) resolves: {len(got)} packages "
      f"({shown}) in {sys.argv[3]} s")
PYEOF
  rm -f "$report"
  exit 0
fi
want=$(stamp_inputs | sha256sum | cut -d' ' -f1)
if [ -f "$VENV/.patchbench-setup" ] && [ "$(cat "$VENV/.patchbench-setup")" = "$want" ]; then
  echo "setup: $VENV already holds sglang $PIN ($PROFILE profile); nothing to do"
  exit 0
fi
t0=$(date +%s)
if [ "$PROFILE" = cpu ] && [ ! -x "$VENV/bin/python" ]; then
  need_gb=$(sed -n 's/^# disk-gb: *\([0-9][0-9]*\).*/\1/p' "$REQ" | head -1)
  parent=$(dirname "$VENV"); mkdir -p "$parent"
  for dir in "$parent" "${TMPDIR:-/tmp}"; do
    free_gb=$(df -Pk "$dir" | awk 'NR==2 {printf "%d", $4 / 1048576}')
    if [ -n "$need_gb" ] && [ "$free_gb" -lt "$need_gb" ]; then
      echo "setup: sglang $PIN's CPU environment needs about $need_gb GB free on the disk" \
           "holding $dir ('# disk-gb:' in requirements/cpu-$PIN.txt); $free_gb GB free there." \
           "Free space (old clones, ~/.cache/pip) or make the venv on a larger disk:" \
           "scripts/setup.sh $PIN /larger/disk/venv cpu (TMPDIR too)" >&2
      exit 4
    fi
  done
fi
if [ -x "$VENV/bin/python" ]; then
  echo "setup: updating $VENV for sglang $PIN ($PROFILE profile): the requirements or pins changed since its last set-up"
else
  echo "setup: creating $VENV for sglang $PIN ($PROFILE profile)"
fi
[ -x "$VENV/bin/python" ] || $PY -m venv "$VENV"
# --no-compile, then compileall on every core: pip compiles the bytecode one file at a time (about
# a third of a fresh venv's setup); the bytecode must exist: where PYTHONDONTWRITEBYTECODE is set (as
# on this project's machines) every server start would compile torch in memory again
# --quiet: pip's errors and warnings still print; the steps below say what is being installed
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --progress-bar off --no-cache-dir --no-compile)
# a host whose pip config names local indexes without most packages gets one warning a package
# ("Location 'file:///...' is ignored: it is neither a file nor a directory", 241 lines a set-up):
# that line alone is dropped, every other warning and error still prints
pip_install() { "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
step() { echo "setup: $* ($(( $(date +%s) - t0 )) s so far)"; }
if [ "$PROFILE" = gpu ]; then
  step "installing sglang $PIN (gpu profile) and the harness"
  pip_install "$(gpu_spec)" -r "$HERE/requirements/harness.txt"
else
  TORCH=$(grep -E '^(torch|torchvision)==' "$REQ" | tr '\n' ' ')
  # torch first: the CPU profile's own pin decides it, not a later resolver pass. pip fetches
  # every wheel of one call before unpacking any (torch with its CUDA libraries: ~3.5 GB of
  # wheels, ~7 GB unpacked), so resolve once, then install torch, triton and the CUDA packages
  # one per call (--no-deps, exact versions), then the same request again to check the set.
  step "resolving $TORCH"
  report=$(mktemp --suffix=.json)
  pip_install --dry-run --ignore-installed --report "$report" $TORCH
  for spec in $("$VENV/bin/python" - "$report" <<'PYEOF'
import json, re, sys
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if re.match(r"(torch|triton|nvidia-|cuda-)", name.lower()):
        print(f"{name}=={version}")
PYEOF
  ); do
    step "installing $spec"
    pip_install --no-deps "$spec"
  done
  rm -f "$report"
  pip_install $TORCH
  step "installing sglang $PIN"
  pip_install --no-deps "sglang==$PIN"
  step "installing sglang's requirements and the harness's"
  pip_install -r "$REQ" -r "$HERE/requirements/harness.txt"
fi
pip_install --no-deps -e "$HERE"
step "compiling bytecode"
# a file that does not compile (a package's Python 2 test data) is skipped, as pip skips it
"$VENV/bin/python" -m compileall -q -j 0 "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null 2>&1 || true
got=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')
if [ "$got" != "$PIN" ]; then echo "setup: expected sglang $PIN in $VENV, found $got" >&2; exit 3; fi
echo "$want" > "$VENV/.patchbench-setup"
echo "setup: sglang $got in $VENV ($PROFILE profile) in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1)"
