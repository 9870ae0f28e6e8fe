"""The sequential looks of a ``schedule.repeats: {min, max, step}`` run: its design, the primaries
that decide when it stops, one look at the cells on disk and the manifest's record of the looks."""

from __future__ import annotations

from pathlib import Path

from patchbench.config import Config
from patchbench.config.load import sequential_primaries
from patchbench.runfolder.models import SequentialDesign, SequentialLook, SequentialRecord


def sequential_design(cfg: Config):
    """The patchbench.analysis.sequential.Design of a sequential config; None for fixed repeats."""
    if cfg.schedule.sequential is None:
        return None
    from patchbench.analysis.sequential import Design

    return Design.of(cfg.schedule.sequential, cfg.compare.confidence)


def sequential_look(cfg: Config, run_dir: Path, design, look_index: int, previous=None):
    """Decide at look ``look_index`` from the cells on disk (patchbench.analysis.build.look_decision:
    the report's family and rule). Returns (LookDecision, None), or (None, why) when a needed
    pair is missing (a failed cell: the run stops; ``--resume`` re-runs it). A value its suite
    left out on purpose (``RunData.not_judged``) is not missing."""
    from patchbench.analysis.build import look_decision
    from patchbench.analysis.rundata import read_run

    n = design.looks[look_index]
    data = read_run(run_dir)
    missing: list[str] = []
    for v in data.variants[1:]:
        for s, m, _, _ in sequential_primaries(cfg):
            for k in range(n):
                b, x = data.value(data.baseline, k, s, m), data.value(v, k, s, m)
                timed = data.timed(data.baseline, k, s) and data.timed(v, k, s)
                if any(
                    y is None and data.not_judged(a, k, s, m)
                    for a, y in ((data.baseline, b), (v, x))
                ):
                    continue  # left out on purpose (never judged): not a failed cell
                if b is None or x is None or b <= 0 or x <= 0 or not timed:
                    missing.append(f"{v}/rep{k} {s}.{m}")
    if missing:
        shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
        return None, (
            f"stopped at the look after {n} rounds: no paired value for {shown} "
            "(a failed or incomplete cell); resume the run to re-run it and go on"
        )
    decision, _ = look_decision(run_dir, look_index)
    if decision is None or decision.look_index != look_index:
        return None, f"stopped at the look after {n} rounds: the rule could not look"
    return decision, None


def _design_record(cfg: Config, design) -> SequentialDesign:
    return SequentialDesign(
        looks=list(design.looks),
        alpha=design.alpha,
        boundary=design.kind,
        primaries=[f"{s}.{m}" for s, m, _, _ in sequential_primaries(cfg)],
        alpha_split="one family per report: Holm shares over every non-A/A primary",
        futility=design.futility,
        controls=[v for v in cfg.variants if cfg.is_aa(v)],
    )


def sequential_record(
    cfg: Config,
    design,
    old: SequentialRecord | None,
    look_index: int,
    n_rounds: int,
    decision,
    why: str | None,
) -> SequentialRecord:
    """The manifest's ``sequential`` record after look ``look_index`` (``n_rounds`` rounds): the
    earlier looks of ``old``, then this one; ``decision`` None (with ``why``): a pair was
    missing, the run stops there (earlier decisions are kept)."""
    looks = [x for x in (old.looks if old is not None else []) if x.look_index < look_index]
    if decision is None:
        rec = SequentialRecord(
            design=_design_record(cfg, design),
            looks=looks,
            repeats_run=n_rounds,
            stopped_at=n_rounds,
            stopped_early=n_rounds < design.looks[-1],
            reason=why,
        )
        if old is not None and "decisions" in old.model_fields_set:
            rec.decisions = dict(old.decisions)
        return rec
    looks.append(SequentialLook.model_validate(decision.to_json()))
    reason = (
        decision.reason
        if decision.metrics or not decision.stop
        else (
            f"no run-level primary metric to decide on (see the design); stopped after {n_rounds} "
            "rounds"
        )
    )
    return SequentialRecord(
        design=_design_record(cfg, design),
        looks=looks,
        repeats_run=n_rounds,
        stopped_at=n_rounds if decision.stop else None,
        stopped_early=bool(decision.stop and n_rounds < design.looks[-1]),
        reason=reason,
        decisions={f"{v}/{m}": d.decision for (v, m), d in sorted(decision.metrics.items())},
    )
