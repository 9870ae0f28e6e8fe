"""What a variant runs, as hashes (``cell.json`` ``variant_identity``), and the resume check.

Every cell records :func:`variant_identity`: one short sha256 per input that decides the code
or the arguments of the variant's server: ``patches`` (each patch's name and the hash of its
diff, so an edited ``{diff: FILE}`` shows), ``server_args`` (``server.args`` plus the variant's),
``env`` (``server.env`` plus the variant's, and the CPU stand-ins), ``sglang`` (the release and
the fingerprint of the installed build, ``VariantEnv.fbi_sha256``). ``--resume`` compares the
cells already in the folder with the current inputs (:func:`check_resume_identity`) and refuses
(exit 2) naming what changed, unless the variant is started over (``--restart-variant NAME``:
its cell folders move to ``RUN/.restarted/`` and all its cells run again).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from patchbench.errors import ConfigError
from patchbench.runfolder import read_cell

#: the parts of an identity, in the order messages name them
PARTS = ("patches", "server_args", "env", "sglang")


def _h(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def variant_identity(cfg, venv) -> dict[str, str]:
    """{part: 16-hex sha256} of what variant ``venv.name`` runs (see the module docstring).
    ``cfg``: the Config; ``venv``: its prepared patchbench.run.variants.VariantEnv."""
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
    """Refuse a resume whose variants would run other code than the cells already there.

    current: {variant: :func:`variant_identity`}; restart: variants to start over (their cell
    folders move to ``RUN/.restarted/<variant>-<stamp>``). Raises ConfigError (exit 2) naming the
    variant, the parts that changed and the cells that ran the old inputs; ConfigError for a
    restart name that is not a variant.
    """
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
