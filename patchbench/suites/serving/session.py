"""One client process for many bench_serving calls (``multi_point.py``): the harness hands it the
points one at a time, so a sweep's points, the traffic suite's calls and a capacity search's probes
pay the tool's import (~13 s on the CPU machine) once a suite (docs/serving.md, "How a cell runs
a sweep")."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from patchbench.records import read_json, write_json
from patchbench.suite import SuiteContext, SuiteError, SuiteResult

from .params import Params
from .point import (
    POLL_S,
    check_running,
    client_idle_s,
    finish_point,
    log_offset,
    prepare_point,
    stop_tool,
)

#: the client-side script (standard library + the release's package only)
SCRIPT = Path(__file__).with_name("multi_point.py")
#: seconds between looks for the driver's "point done" file
DONE_POLL_S = 0.02
#: seconds the driver has to exit after ``end`` before its group is stopped
END_WAIT_S = 10.0


class ClientSession:
    """The multi-point driver of one suite, its control files in ``control`` (emptied first).

    A context manager: entering starts the driver (SuiteError without a server), :meth:`run` runs
    one point and returns its result, leaving ends the driver (``end``; its process group stopped
    after :data:`END_WAIT_S`, after 1 s when leaving on an exception). ``what`` names a point in
    errors ("sweep point", "capacity probe")."""

    def __init__(self, ctx: SuiteContext, control: Path, what: str = "sweep point") -> None:
        self.ctx, self.control, self.what = ctx, Path(control), what
        self.count = 0
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ClientSession:
        if self.ctx.server is None:
            raise SuiteError("the serving suite needs a running server")
        self.control.mkdir(parents=True, exist_ok=True)
        for pattern in ("point-*.json", "done-*", "end"):
            for f in self.control.glob(pattern):
                f.unlink()
        cmd = [self.ctx.python, str(SCRIPT), str(self.control)]
        write_json(self.control / "command.json", {"argv": cmd})
        with (
            open(self.control / "stdout.txt", "wb") as so,
            open(self.control / "stderr.txt", "wb") as se,
        ):
            self.proc = subprocess.Popen(
                cmd,
                env=dict(self.ctx.stock_env),
                stdout=so,
                stderr=se,
                stdin=subprocess.DEVNULL,
                cwd=self.control,
                start_new_session=True,
            )
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.proc is not None
        (self.control / "end").write_text("")
        try:
            self.proc.wait(timeout=1.0 if exc_type else END_WAIT_S)
        except subprocess.TimeoutExpired:
            stop_tool(self.proc)
        finally:
            if self.ctx.server is not None and self.ctx.server.progress is not None:
                self.ctx.server.progress.unwatch_client()

    def run(
        self, key: str, pdir: Path, params: Params, wrapper: list[str] | None = None
    ) -> SuiteResult:
        """Run one bench_serving call with ``params``, its files in ``pdir`` (summary.json
        written), through ``wrapper`` (multi_point.py's); its result. SuiteError naming ``key``
        when the tool fails or is refused, the server dies, ``params.timeout_s`` passes (the
        first point's includes the tool's import) or the driver exits early."""
        assert self.proc is not None, "run() outside the with-block"
        ctx = replace(self.ctx, out_dir=pdir)
        prep = prepare_point(ctx, params)
        if prep.argv[1:3] != ["-m", "sglang.bench_serving"]:
            raise SuiteError(f"{self.what} {key}: unexpected bench_serving command {prep.argv[:3]}")
        for f in ("point.json", "client.json"):
            (pdir / f).unlink(missing_ok=True)
        i, self.count = self.count, self.count + 1
        offset = log_offset(ctx)
        self.ctx.log(f"serving: {self.what} {key} (one client process, call {i + 1})")
        spec = {"key": key, "dir": str(pdir), "argv": prep.argv[3:], "wrapper": wrapper}
        write_json(self.control / f"point-{i}.json", spec)
        self._wait(i, key, pdir, params)
        got = read_json(pdir / "point.json")
        try:
            r = finish_point(ctx, params, prep, got["rc"], got["wall_s"], offset)
        except SuiteError as e:
            raise SuiteError(f"{self.what} {key}: {e}") from None
        write_json(pdir / "summary.json", r.to_json("serving"))
        return r

    def _wait(self, i: int, key: str, pdir: Path, params: Params) -> None:
        """Until the driver marks point ``i`` done; SuiteError (the driver stopped) otherwise."""
        srv = self.ctx.server
        assert self.proc is not None and srv is not None
        if srv.progress is not None:
            logs = [pdir / "stdout.txt", pdir / "stderr.txt", self.control / "stdout.txt"]
            srv.progress.watch_client(
                self.proc.pid, "bench_serving", logs, idle_s=client_idle_s(params.request_rate)
            )
        done = self.control / f"done-{i}"
        t0 = last_check = time.monotonic()
        try:
            while not done.exists():
                time.sleep(DONE_POLL_S)
                now = time.monotonic()
                if now - last_check < POLL_S:
                    continue
                last_check = now
                if done.exists():
                    break
                if (rc := self.proc.poll()) is not None:
                    stderr = (self.control / "stderr.txt").read_text(errors="replace")[-2000:]
                    raise SuiteError(
                        f"the multi-point client exited with {rc} before the point finished; "
                        f"its stderr tail:\n{stderr}"
                    )
                check_running(t0, params.timeout_s, srv.alive, srv.log_path, srv.progress)
        except SuiteError as e:
            stop_tool(self.proc)
            raise SuiteError(f"{self.what} {key}: {e}") from None


def run_points_together(
    ctx: SuiteContext,
    plan: list[tuple[str, Path, Params]],
    between: Callable[[int], None] | None = None,
    wrappers: dict[str, list[str]] | None = None,
) -> list[SuiteResult]:
    """Run the points ``plan`` ([(key, point folder, point params)], in run order) in one client
    process (:class:`ClientSession`, its control files in ``<suite>/multi_point/``); their results
    in that order, each summary.json written as it finishes. Before point i > 0 ``between(i)`` is
    called (default: the cache flushed). ``wrappers``: {key: multi_point.py's ``wrapper``}.
    SuiteError names the point that failed (the points before it keep their files)."""
    srv = ctx.server
    if srv is None:
        raise SuiteError("the serving suite needs a running server")
    results: list[SuiteResult] = []
    with ClientSession(ctx, Path(ctx.out_dir) / "multi_point") as session:
        for i, (k, pdir, pp) in enumerate(plan):
            if i:
                (between or (lambda _i: srv.flush_cache()))(i)
            results.append(session.run(k, pdir, pp, (wrappers or {}).get(k)))
    return results
