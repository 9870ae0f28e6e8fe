"""Serving suite: the STOCK package's ``python -m sglang.bench_serving`` of the pinned release (the
same client for every variant) against the cell's server, once (:mod:`.point`) or per point of a
load sweep (:mod:`.points`). Parameters: docs/serving.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from patchbench.suite import MetricInfo, Suite, SuiteContext, SuiteResult, register

from .block import report_block
from .capacity import cost_lines as capacity_cost_lines
from .capacity import declarations as capacity_declarations
from .capacity import pair_capacity, run_capacity
from .capplot import pr_panels
from .pairing import pair_cells
from .params import Params
from .parse import METRICS, PRIMARY
from .point import client_idle_s, run_point, run_tool
from .points import declarations, pair_points, run_sweep
from .render import plots, report_section
from .sweep import cost_lines

__all__ = [
    "METRICS",
    "PRIMARY",
    "Params",
    "client_idle_s",
    "report_block",
    "run",
    "run_point",
    "run_tool",
]


def run(ctx: SuiteContext, params: Params) -> SuiteResult:
    """Run bench_serving against ``ctx.server``: once (:func:`.point.run_point`) or per point of
    ``params.sweep`` (:func:`.points.run_sweep`), or a capacity search (:func:`.capacity.run_capacity`)."""
    if params.sweep is not None:
        return run_sweep(ctx, params)
    if params.capacity is not None:
        return run_capacity(ctx, params)
    return run_point(ctx, params)


@register
class ServingSuite(Suite):
    """sglang.bench_serving against the cell's server."""

    name = "serving"
    Params = Params
    metrics = METRICS
    run = staticmethod(run)
    report_block = staticmethod(report_block)
    report_section = staticmethod(report_section)
    plots = staticmethod(plots)
    pr_panels = staticmethod(pr_panels)

    def hf_datasets(self, params: Params) -> list[tuple[str, str, str | None]]:
        """bench_serving's mmmu dataset reads MMMU/MMMU from the hub."""
        if params.dataset_name != "mmmu":
            return []
        return [(f"suite serving: dataset {params.dataset_name}", "MMMU/MMMU", None)]

    def pair(
        self, baseline_dirs: list[Path], variant_dirs: list[Path], params: Params
    ) -> dict | None:
        """Requests paired by index after the prompt check (:func:`.pairing.pair_cells`; a sweep's
        points: :func:`.points.pair_points`; a capacity search: its SLO and each arm's probes,
        :func:`.capacity.pair_capacity`); PairingRefused when no repeat's prompts pair."""
        if isinstance(params, Params) and params.capacity is not None:
            return pair_capacity(list(baseline_dirs), list(variant_dirs), params.capacity)
        if isinstance(params, Params) and params.sweep is not None:
            return pair_points(list(baseline_dirs), list(variant_dirs), params, list(METRICS))
        return pair_cells(list(baseline_dirs), list(variant_dirs), list(METRICS))

    def plan_lines(self, params: Any, cells_per_round: int = 1, cpu: bool = False) -> list[str]:
        """A sweep's points, prompts and estimated minutes per cell (:func:`.sweep.cost_lines`);
        a capacity search's (:func:`.capacity.cost_lines`)."""
        if isinstance(params, Params) and params.capacity is not None:
            return capacity_cost_lines(params.capacity, params.output_len, cells_per_round, cpu)
        if not isinstance(params, Params) or params.sweep is None:
            return []
        sw = params.sweep
        return cost_lines(sw, params.num_prompts, params.output_len, cells_per_round, cpu=cpu)

    def declarations(self, params: Any) -> dict[str, MetricInfo]:
        """:data:`METRICS`, or with a sweep the per-point and curve metrics (:func:`.points.declarations`)."""
        if isinstance(params, Params) and params.capacity is not None:
            return capacity_declarations(params.capacity)
        return declarations(params) if isinstance(params, Params) else dict(METRICS)
