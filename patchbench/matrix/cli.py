"""``patchbench matrix``: its options and how they map onto :func:`patchbench.matrix.driver.run_matrix`."""

from __future__ import annotations

import argparse
from typing import Any

from patchbench.envs.nodes import DEFAULT_ENV_ROOT
from patchbench.errors import UsageError
from patchbench.matrix.driver import describe_matrix, run_matrix
from patchbench.matrix.executors import LocalExecutor
from patchbench.matrix.spec import load_matrix


def add_cli_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``patchbench matrix`` (an argparse parser)."""
    p.add_argument("matrix", help="the matrix file (YAML): a base config with axes, or units")
    p.add_argument(
        "--on",
        choices=("local", "ray"),
        default="local",
        help="local: one unit after another here (default); ray: one Ray task per unit",
    )
    p.add_argument(
        "--address",
        help="the Ray cluster (default: RAY_ADDRESS, a running local cluster, or a new local one)",
    )
    p.add_argument("--dry-run", action="store_true", help="list the units, run nothing")
    p.add_argument(
        "--resume",
        metavar="MATRIX_RUN_DIR",
        help="run only the units not finished ok in MATRIX_RUN_DIR",
    )
    p.add_argument(
        "--results", metavar="DIR", help="parent of the matrix run folder (default results/)"
    )
    p.add_argument(
        "--env-setup",
        choices=("auto", "make", "current"),
        help="how a unit gets its pin's environment (default: auto locally, make on "
        "Ray: `make setup SGLANG=<pin>` into a persistent venv per pin on each node)",
    )
    p.add_argument(
        "--build-envs",
        action="store_true",
        help="build an environment a unit's pin lacks (`make setup`: about 8-9 GB each; "
        "without it such a matrix is refused before anything runs, exit 3)",
    )
    p.add_argument(
        "--env-root",
        metavar="DIR",
        help=f"where nodes keep those venvs (default {DEFAULT_ENV_ROOT})",
    )
    p.add_argument(
        "--no-ship-code",
        action="store_true",
        help="Ray: do not send this checkout "
        "as the job's working_dir (every node has it at the same path)",
    )


def run_cli(a: argparse.Namespace) -> int:
    """``patchbench matrix`` from parsed arguments; returns 0 or raises a PatchbenchError."""
    if a.dry_run:
        m = load_matrix(a.matrix)
        mode = a.env_setup or ("make" if a.on == "ray" else "auto")
        ex = LocalExecutor(env_setup=mode)
        if a.env_root:
            ex.opts["env_root"] = a.env_root
        note = (
            "this machine; a Ray node is looked at when the matrix starts" if a.on == "ray" else ""
        )
        print(describe_matrix(m, a.resume, ex.plan_envs(m.units), note))
        return 0
    kw: dict[str, Any] = {"build_envs": a.build_envs}
    if a.env_setup:
        kw["env_setup"] = a.env_setup
    if a.on == "ray":
        kw.update(env_root=a.env_root, ship_code=not a.no_ship_code)
    elif a.env_root or a.no_ship_code:
        raise UsageError("--env-root and --no-ship-code are for --on ray")
    run_matrix(a.matrix, a.on, a.address, resume=a.resume, results=a.results, **kw)
    return 0
