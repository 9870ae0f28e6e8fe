"""The harness side of a sweep run in one client process (``multi_point.py``): every point's call
built as a single-point run builds it, the process watched like one bench_serving, and between
two points the point just run finished, the cache flushed and the next one let go. The control
files live in ``<suite>/multi_point/``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from patchbench.records import write_json
from patchbench.run import logscan
from patchbench.suite import SuiteContext, SuiteError, SuiteResult

from .params import Params

#: the client-side script (standard library + the release's package only)
SCRIPT = Path(__file__).with_name("multi_point.py")
#: argv head of a single-point call that the driver replaces
TOOL_HEAD = ["-m", "sglang.bench_serving"]


def run_points_together(
    ctx: SuiteContext, plan: list[tuple[str, Path, Params]], tool: Any
) -> list[SuiteResult]:
    """Run the points ``plan`` ([(key, point folder, point params)], in run order) in one client
    process; their results in that order, each summary.json written as it finishes.

    Timeout: the sum of the points' ``timeout_s``; idle limit: the largest point's. SuiteError
    names the point that failed (the points before it keep their files). ``tool``: the module with
    ``prepare_point``, ``finish_point``, ``run_tool`` and ``client_idle_s`` (the package, passed in)."""
    client_idle_s, finish_point = tool.client_idle_s, tool.finish_point
    prepare_point, run_tool = tool.prepare_point, tool.run_tool

    srv = ctx.server
    if srv is None:
        raise SuiteError("the serving suite needs a running server")
    preps = [prepare_point(replace(ctx, out_dir=pdir), pp) for _k, pdir, pp in plan]
    control = _write_plan(Path(ctx.out_dir) / "multi_point", plan, preps)
    offsets: list[int] = []
    results: list[SuiteResult] = []

    def log_size() -> int:
        return logscan.log_size(srv.log_path) if srv.log_path is not None else 0

    def start(i: int) -> None:
        offsets.append(log_size())
        ctx.log(f"serving: sweep point {plan[i][0]} ({i + 1}/{len(plan)}, one client process)")

    def finish(i: int) -> None:
        k, pdir, pp = plan[i]
        got = json.loads((pdir / "point.json").read_text())
        try:
            r = finish_point(
                replace(ctx, out_dir=pdir), pp, preps[i], got["rc"], got["wall_s"], offsets[i]
            )
        except SuiteError as e:
            raise SuiteError(f"sweep point {k}: {e}") from None
        write_json(pdir / "summary.json", r.to_json("serving"))
        results.append(r)

    def on_poll() -> None:
        i = len(offsets)  # the next point to start
        if i >= len(plan) or not (control / f"flush-{i}.want").exists():
            return
        finish(i - 1)
        try:
            srv.flush_cache()
        except BaseException:
            (control / f"flush-{i}.fail").write_text("")
            raise
        start(i)
        (control / f"flush-{i}.ok").write_text("")

    cmd = [ctx.python, str(SCRIPT), str(control / "plan.json")]
    write_json(control / "command.json", {"argv": cmd})
    start(0)
    try:
        rc, _wall = run_tool(
            cmd,
            env=dict(ctx.stock_env),
            out_dir=control,
            timeout_s=sum(pp.timeout_s for _k, _d, pp in plan),
            server_alive=srv.alive,
            server_log=srv.log_path,
            progress=srv.progress,
            idle_s=max(client_idle_s(pp.request_rate) for _k, _d, pp in plan),
            outputs=[Path(d) / n for _k, d, _pp in plan for n in ("stdout.txt", "stderr.txt")],
            on_poll=on_poll,
        )
    except SuiteError as e:
        k = plan[min(len(offsets), len(plan)) - 1][0]
        raise SuiteError(f"sweep point {k}: {e}") from None
    last = len(offsets) - 1
    if len(results) == last and (plan[last][1] / "point.json").is_file():
        finish(last)  # raises for a failed tool, naming the point
    if len(results) < len(plan):
        k = plan[len(results)][0]
        tail = (control / "stderr.txt").read_text(errors="replace")[-2000:]
        raise SuiteError(
            f"sweep point {k}: the multi-point client exited with {rc} before the point "
            f"finished; its stderr tail:\n{tail}"
        )
    return results


def _write_plan(control: Path, plan: list[tuple[str, Path, Params]], preps: list[Any]) -> Path:
    """The driver's ``plan.json`` in ``control`` (stale flush and point files removed); returns
    ``control``. SuiteError for a command that is not ``python -m sglang.bench_serving ...``."""
    control.mkdir(parents=True, exist_ok=True)
    for f in control.glob("flush-*"):
        f.unlink()
    points = []
    for (k, pdir, _pp), prep in zip(plan, preps, strict=True):
        (pdir / "point.json").unlink(missing_ok=True)
        if prep.argv[1:3] != TOOL_HEAD:
            raise SuiteError(f"sweep point {k}: unexpected bench_serving command {prep.argv[:3]}")
        points.append({"key": k, "dir": str(pdir), "argv": prep.argv[3:]})
    write_json(control / "plan.json", {"control_dir": str(control), "points": points})
    return control
