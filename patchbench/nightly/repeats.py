"""``schedule.repeats: auto`` in the nightly job: the repeats tonight runs, chosen before the run
from the learned noise (:func:`pick_repeats`), and the choice added to the written nightly.json
(:func:`record_repeats`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from patchbench.nightly.builds import keep_config
from patchbench.nightly.gates import NightlySettings
from patchbench.nightly.gates.planning import RepeatsPlan, plan_repeats
from patchbench.nightly.history import History, HistoryError, Night
from patchbench.records import write_json


def pick_repeats(
    config_path: str | os.PathLike,
    cfg: Any,
    settings: NightlySettings,
    hpath: Path,
    *,
    out: Any = None,
    workdir: str | os.PathLike | None = None,
) -> tuple[RepeatsPlan, Path]:
    """``schedule.repeats: auto``: the repeats tonight runs, before the run.

    Reads the config's recorded nights from the history at ``hpath`` (read only; an absent or
    unreadable history counts as empty: the prior ``run_cv_pct`` decides), computes the repeats
    the gates' targets need (:func:`patchbench.nightly.gates.planning.plan_repeats`: the learned noise,
    ``min_repeats`` .. ``max_repeats``), prints the choice and why, and writes the config with
    ``schedule.repeats`` set to it under ``workdir`` (default: ``nightly-configs/`` in the
    results root, :func:`patchbench.nightly.builds.keep_config`, so the run's manifest and its
    "resume with" line name a file that stays: ``patchbench bench COPY --resume RUN`` reruns
    the same repeats), named ``<config stem>.auto-<sha256 of its text, 12 hex>.yaml``.
    Relative paths in a config resolve against the repository, so the copy runs as the
    original. Returns the plan and the copy's path. Raises ValueError when no noise
    is known; OSError when the folder cannot be written."""
    import yaml

    out = out or sys.stdout
    prior: list[Night] = []
    if hpath.is_file():
        try:
            with History(hpath, timeout_s=settings.lock_timeout_s) as h:
                prior = h.nights(cfg.name)
        except HistoryError as e:
            print(f"nightly: repeats from the prior noise: history unreadable: {e}", file=out)
    plan = plan_repeats(settings, prior, list(cfg.variants), cfg.baseline)
    print(f"nightly: {plan.why}", file=out)
    raw = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
    raw.setdefault("schedule", {})["repeats"] = plan.repeats
    text = f"# {config_path} with schedule.repeats: auto -> {plan.repeats} ({plan.why})\n"
    text += yaml.safe_dump(raw, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return plan, keep_config(Path(config_path).stem, "auto", text, workdir)


def record_repeats(json_path: Path | None, plan: RepeatsPlan) -> None:
    """Add the repeats choice (``"repeats"``: :meth:`RepeatsPlan.to_json`) to a written
    nightly.json."""
    import json

    if json_path is None or not Path(json_path).is_file():
        return
    doc = json.loads(Path(json_path).read_text(encoding="utf-8"))
    doc["repeats"] = plan.to_json()
    write_json(Path(json_path), doc)
