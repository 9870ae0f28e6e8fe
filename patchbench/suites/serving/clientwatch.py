"""The client's own state during bench_serving's measured run, recorded inside its process:
``python clientwatch.py <plan.json> [<client>]`` (docs/serving.md, "Is the client the bottleneck?").

Standard library only, besides the release's aiohttp; sglang is not edited. Plan: ``{"module",
"barrier", "clients": [{"argv", "dir"}]}``: one client runs in this process; with several, one
child each (fds 1 and 2 into its ``dir``), the exit code the first non-zero one. Each client
writes ``dir``/client.json: ``{"part": [k, n], "indices", "requests": [[made, sent, ended] s after
the start], "gaps_s", "loop_lag_s", "cpu_s", "wall_s", "start" (CLOCK_MONOTONIC s), "burn_ms"}``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

#: environment variable: milliseconds of CPU burnt in the client's event loop per turn of a
#: burner task (a throttled client, for tests); unset or 0: none
BURN_ENV = "PATCHBENCH_CLIENT_BURN_MS"
#: the loop-lag monitor's sleep (s); its overshoot is the loop lag
TICK_S = 0.01
#: seconds a client waits at the start for the others before it goes on alone
BARRIER_TIMEOUT_S = 600.0


class Watch:
    """One client's records (the module docstring); ``part`` = (k, n) of the plan's clients."""

    def __init__(self, part: tuple[int, int] = (0, 1), barrier: Path | None = None) -> None:
        self.part, self.barrier = part, barrier
        self.start: float | None = None
        self.indices: list[int] | None = None
        self.requests: list[list[float | None]] = []
        self.by_task: dict[asyncio.Task, list[float | None]] = {}
        self.gaps_s: list[float] = []
        self.lags: list[tuple[float, float]] = []
        self.burn_ms = float(os.environ.get(BURN_ENV) or 0)

    def begin(self) -> None:
        """The measured run starts: wait for the other clients, then note the time and CPU."""
        k, n = self.part
        if self.barrier is not None and n > 1:
            self.barrier.mkdir(parents=True, exist_ok=True)
            (self.barrier / f"ready-{k}").write_text("")
            until = time.monotonic() + BARRIER_TIMEOUT_S
            while len(list(self.barrier.glob("ready-*"))) < n and time.monotonic() < until:
                time.sleep(0.002)
        self.start = self.end = time.monotonic()
        self.cpu0 = self.cpu1 = time.process_time()

    def task(self, loop, coro, **kw):
        """The loop's task factory: a measured request's coroutine is timed."""
        if self.start is not None and getattr(coro, "__name__", "") == "limited_request_func":
            rec: list[float | None] = [time.monotonic() - self.start, None, None]
            self.requests.append(rec)
            t = asyncio.Task(self.timed(coro, rec), loop=loop, **kw)
            self.by_task[t] = rec
            return t
        return asyncio.Task(coro, loop=loop, **kw)

    async def timed(self, coro, rec):
        try:
            return await coro
        finally:
            self.end, self.cpu1 = time.monotonic(), time.process_time()
            rec[2] = self.end - self.start

    async def on_request_start(self, _session, _ctx, _params) -> None:
        rec = self.by_task.get(asyncio.current_task())
        if rec is not None and rec[1] is None:
            rec[1] = time.monotonic() - self.start

    async def monitor(self, sleep) -> None:
        while True:
            t = time.monotonic()
            await sleep(TICK_S)
            if self.start is not None and t >= self.start:
                self.lags.append((t, time.monotonic() - t - TICK_S))

    async def burner(self, sleep) -> None:
        while True:
            until = time.perf_counter() + self.burn_ms / 1000
            while time.perf_counter() < until:
                pass
            await sleep(0)

    async def measured(self, main, sleep):
        """Run the tool's ``benchmark`` coroutine ``main`` watched."""
        loop = asyncio.get_running_loop()
        first, finalizer = sys.get_asyncgen_hooks()

        def firstiter(agen) -> None:
            if agen.ag_code.co_name == "get_request" and self.start is None:
                self.begin()
            if first is not None:
                first(agen)

        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=finalizer)
        loop.set_task_factory(self.task)
        helpers = [loop.create_task(self.monitor(sleep))]
        if self.burn_ms > 0:
            helpers.append(loop.create_task(self.burner(sleep)))
        try:
            return await main
        finally:
            for h in helpers:
                h.cancel()

    def record(self) -> dict:
        """client.json's content."""
        lags = [lag for t, lag in self.lags if t <= self.end]
        keys = ("part", "indices", "requests", "gaps_s", "start", "burn_ms")
        return {k: getattr(self, k) for k in keys} | {
            "loop_lag_s": lags,
            "cpu_s": self.cpu1 - self.cpu0,
            "wall_s": self.end - self.start,
        }


@contextlib.contextmanager
def watch(out: Path, part: tuple[int, int] = (0, 1), barrier: Path | None = None):
    """Inside, bench_serving in this process is watched: ``asyncio.run`` of its ``benchmark``
    coroutine gets the task factory and the monitor (client k of n keeps ``input_requests[k::n]``),
    ``asyncio.sleep`` notes the gaps ``get_request`` draws, every ``aiohttp.ClientSession`` traces
    its requests' start. The measured run starts at the first step of ``get_request`` (after the
    warmup; the clients wait for each other there); its requests are the ``limited_request_func``
    tasks made from then on. At the end ``out`` is written if a measured run started."""
    w = Watch(part, barrier)
    run, sleep = asyncio.run, asyncio.sleep

    def watched_run(main, *a, **kw):
        code = getattr(main, "cr_code", None)
        if code is None or code.co_name != "benchmark":
            return run(main, *a, **kw)
        k, n = part
        reqs = main.cr_frame.f_locals.get("input_requests")
        if isinstance(reqs, list):
            w.indices = list(range(len(reqs)))[k::n]
            reqs[:] = reqs[k::n]
        return run(w.measured(main, sleep), *a, **kw)

    def gap_sleep(delay, result=None):
        if sys._getframe(1).f_code.co_name == "get_request":
            w.gaps_s.append(float(delay))
        return sleep(delay, result)

    asyncio.run, asyncio.sleep = watched_run, gap_sleep
    import aiohttp  # the release's client library

    session, trace = aiohttp.ClientSession, aiohttp.TraceConfig()
    trace.on_request_start.append(w.on_request_start)

    def traced(*a, **kw):
        kw["trace_configs"] = [*(kw.get("trace_configs") or []), trace]
        return session(*a, **kw)

    aiohttp.ClientSession = traced
    try:
        yield w
    finally:
        asyncio.run, asyncio.sleep, aiohttp.ClientSession = run, sleep, session
        if w.start is not None:
            Path(out).write_text(json.dumps(w.record()))


def run_module(module: str, argv: list[str], wrapper: list[str] = ()) -> tuple[int, str | None]:
    """``python -m module argv`` in this process, or with ``wrapper`` ``[script, args...]`` that
    script as ``__main__`` with ``args`` before ``argv`` (it runs the tool itself, e.g. the traffic
    suite's replay.py); (exit code, the exception's last line or None)."""
    old = sys.argv
    try:
        if wrapper:
            sys.argv = [*wrapper, *argv]
            runpy.run_path(wrapper[0], run_name="__main__")
        else:
            sys.argv = [module, *argv]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        return rc, None if rc == 0 else f"SystemExit({e.code!r})"
    except BaseException as e:  # noqa: BLE001 (the caller records it)
        import traceback

        traceback.print_exc()
        return 1, f"{type(e).__name__}: {e}"
    finally:
        sys.argv = old
    return 0, None


def main(plan_path: str, index: str | None = None) -> int:
    """Run the plan (the module docstring); the exit code."""
    plan = json.loads(Path(plan_path).read_text())
    clients, n = plan["clients"], len(plan["clients"])
    if index is not None or n == 1:
        k = int(index or 0)
        c = clients[k]
        with watch(Path(c["dir"]) / "client.json", (k, n), Path(plan["barrier"])):
            rc, _err = run_module(plan["module"], list(c["argv"]))
        return rc
    procs = []
    for k, c in enumerate(clients):
        d = Path(c["dir"])
        d.mkdir(parents=True, exist_ok=True)
        with open(d / "stdout.txt", "wb") as so, open(d / "stderr.txt", "wb") as se:
            cmd = [sys.executable, __file__, plan_path, str(k)]
            procs.append(subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL))
    while True:
        rcs = [p.poll() for p in procs]
        bad = next((k for k, rc in enumerate(rcs) if rc not in (None, 0)), None)
        if bad is not None or all(rc == 0 for rc in rcs):
            break
        time.sleep(0.2)
    if bad is None:
        return 0
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait()
    tail = (Path(clients[bad]["dir"]) / "stderr.txt").read_text(errors="replace")[-3000:]
    print(f"client {bad} of {n} exited with {rcs[bad]}; its stderr tail:\n{tail}", file=sys.stderr)
    return rcs[bad]


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
