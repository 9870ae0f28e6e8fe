"""Which sglang releases start on this CPU: for each VERSION, make its layer (patchbench.envs.layers,
the mechanism `make setup SGLANG=V` and `--make-env` use), then run one MMMU cell of stock sglang V
on the tiny model; print one row per release and write them to OUT (JSON lines).

    .venv/bin/python tools/survey_releases.py 0.5.3.post3 0.5.8.post1 --out survey.jsonl [--drop]

A row: version, the layer's packages and disk (MB), seconds to make it, whether the server
started and answered (``ok``), the run's seconds, and the first line of what stopped it. ``--drop``
removes each layer after its row (the disk is what a survey of twenty releases would not have).
Run from the repository root; uses ports 30700 + i.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python")

CONFIG = """\
name: survey-{tag}
sglang: {version}
model:
  path: .cache/models/{model}
  tiny: true
server:
  host: 127.0.0.1
  port: {port}
  args: [--device=cpu, --attention-backend=torch_native, --max-total-tokens=8192,
         --mem-fraction-static=0.05, --disable-fast-image-processor, --grammar-backend=none]
  env: {{SGLANG_USE_CPU_ENGINE: "1", TORCHDYNAMO_DISABLE: "1", HF_HUB_OFFLINE: "1",
        TRANSFORMERS_OFFLINE: "1", SGLANG_DISABLE_CUDNN_CHECK: "1"}}
  cpu_stand_ins: {stand_ins}
  ready_timeout_s: 400
variants:
  baseline: []
baseline: baseline
schedule: {{repeats: 1}}
suites:
  mmmu: {{dataset: patchbench/mmmu-demo, concurrency: 1, max_tokens: 8, limit: 4}}
"""


def layer_dir(version: str) -> Path | None:
    """The layer made for ``version`` under .cache/envs (None when there is none)."""
    found = sorted((ROOT / ".cache" / "envs").glob(f"sglang-{version}-*"))
    return found[0] if found else None


def env_python(version: str) -> str | None:
    """The Python of the environment that has sglang ``version`` (a pin's venv or a layer)."""
    pin = ROOT / f".venv-{version}" / "bin" / "python"
    if version == "0.5.1.post3":
        return PY
    if pin.exists():
        return str(pin)
    lay = layer_dir(version)
    return str(lay / "bin" / "python") if lay else None


def version_of(python: str, dist: str) -> str:
    """``dist``'s version as the environment of ``python`` sees it ('' when absent)."""
    out = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def first_error(text: str) -> str:
    """The most telling line of a failed run's output: a Python error line, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pat in (r"(Error|Exception)\b.*:", r"FAILED", r"exit code"):
        hits = [ln for ln in lines if re.search(pat, ln)]
        if hits:
            return hits[-1][:300]
    return lines[-1][:300] if lines else ""


def survey(version: str, port: int, drop: bool) -> dict:
    """Make ``version``'s environment, run one stock MMMU cell on it; the row (module docstring)."""
    row: dict = {"version": version}
    t0 = time.monotonic()
    made = subprocess.run(
        [PY, "-m", "patchbench.envs.layers", version], cwd=ROOT, capture_output=True, text=True
    )
    row["make_s"] = round(time.monotonic() - t0, 1)
    python = env_python(version)
    if made.returncode != 0 or python is None:
        row.update(ok=False, stage="environment", error=first_error(made.stdout + made.stderr))
        return row
    lay = layer_dir(version)
    if lay is not None:
        du = subprocess.run(["du", "-sm", str(lay)], capture_output=True, text=True).stdout
        row["layer_mb"] = int(du.split()[0]) if du else None
        stamp = lay / "patchbench-env.json"
        if stamp.exists():
            row["layer_packages"] = len(json.loads(stamp.read_text()).get("installed", []))
    tf = version_of(python, "transformers")
    row["transformers"] = tf
    row["torch"] = version_of(python, "torch")
    has_vllm = bool(version_of(python, "vllm"))
    stand_ins = "[sgl_kernel]" if has_vllm or tf.startswith("5") else "[sgl_kernel, vllm]"
    model = "tiny-qwen25vl-tf5" if tf.startswith("5") else "tiny-qwen25vl-tf4"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "survey.yaml"
        tag = version.replace(".", "-")
        cfg.write_text(
            CONFIG.format(tag=tag, version=version, model=model, port=port, stand_ins=stand_ins)
        )
        t1 = time.monotonic()
        run = subprocess.run(
            [PY, "-m", "patchbench", "bench", str(cfg), "--results", tmp],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        row["run_s"] = round(time.monotonic() - t1, 1)
        row["ok"] = run.returncode == 0
        row["exit"] = run.returncode
        if not row["ok"]:
            row["stage"] = "server or suite"
            logs = sorted(Path(tmp).glob("*/*/rep*/server.log"))
            tail = logs[0].read_text(errors="replace")[-20000:] if logs else ""
            row["error"] = first_error(tail) or first_error(run.stdout + run.stderr)
    if drop and lay is not None:
        shutil.rmtree(lay, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("versions", nargs="+")
    ap.add_argument("--out", type=Path, default=Path("survey.jsonl"))
    ap.add_argument("--drop", action="store_true", help="remove each layer after its row")
    a = ap.parse_args(argv)
    for i, v in enumerate(a.versions):
        row = survey(v, 30700 + i, a.drop)
        with a.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
