"""What runs the units of a matrix: :class:`LocalExecutor` (one after another here) or
:class:`RayExecutor` (one Ray task per unit; Ray imported only there)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from patchbench.envs.nodes import EnvPlan, machine_key, node_name, plan_env
from patchbench.errors import EnvironmentNotReady, UsageError
from patchbench.inputs import REPO_ROOT
from patchbench.matrix.execute import execute_unit, pack_folder, unit_workdir, unpack_folder
from patchbench.matrix.spec import Resources, Unit

#: what ``runtime_env.working_dir`` leaves out when the repo is shipped to Ray nodes
SHIP_EXCLUDES = [
    ".venv",
    ".venv-*",
    "results",
    ".cache",
    ".git",
    "*.egg-info",
    "__pycache__",
    "build",
]
RAY_HINT = "install it with `pip install .[ray]` or `make setup RAY=1`"


def log(msg: str) -> None:
    """The matrix's progress line on stderr: ``[patchbench matrix HH:MM:SS] msg``."""
    print(f"[patchbench matrix {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


#: ``record(unit id, **fields)``: the driver sets those fields of the unit's
#: patchbench.matrix.record.UnitRecord (status, exit_code, message, node, timings_s,
#: archive_bytes) and rewrites matrix.json
Record = Callable[..., None]


class Executor:
    """Runs units: ``run(units, matrix_dir, record, resume)`` records each unit as it ends and
    returns when all have ended (Ctrl-C: stops what runs, records it, re-raises). Before anything
    runs: ``check(units)`` -> {unit id: why no node can take it}; ``plan_envs(units)`` -> where
    each pin's python comes from on each node (:class:`EnvPlan`).

    Options: ``env_setup``/``env_root`` (patchbench.envs.nodes.prepare_python); ``build_envs``:
    build a missing environment; ``command``: the bench command template; ``env``: extra
    environment for bench; ``stop_grace_s``: before a stopped bench gets SIGKILL.
    """

    name = "?"

    def __init__(
        self,
        *,
        env_setup: str = "auto",
        env_root: str | None = None,
        build_envs: bool = False,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        stop_grace_s: float = 60,
    ):
        self.build_envs = build_envs
        self.opts = {
            "env_setup": env_setup,
            "env_root": env_root,
            "build_envs": build_envs,
            "command": command,
            "env": env,
            "stop_grace_s": stop_grace_s,
        }

    def check(self, units: list[Unit]) -> dict[str, str]:
        return {}

    def plan_envs(self, units: list[Unit]) -> list[EnvPlan]:
        return []

    def run(
        self,
        units: list[Unit],
        matrix_dir: Path,
        record: Record,
        resume: set[str],
    ) -> None:
        raise NotImplementedError


def _unit_spec(u: Unit, matrix_dir: Path, opts: dict) -> dict:
    return {
        "id": u.id,
        "config": u.config.model_dump(mode="json"),
        "sglang": u.sglang,
        "env_setup": opts.get("env_setup"),
        "env_root": opts.get("env_root"),
        "build_envs": bool(opts.get("build_envs")),
        "command": list(opts["command"]) if opts.get("command") else None,
        "stop_grace_s": opts.get("stop_grace_s", 60),
        "env": opts.get("env") or {},
    }


def _result_of(out: dict) -> dict[str, Any]:
    """The unit's record fields from :func:`execute_unit`'s result."""
    code = out.get("exit_code")
    if code == 0:
        status = "ok"
    elif code == 4 and out.get("has_folder"):
        status = "failed"
    else:
        status = "interrupted" if code in (130, 143) else "error"
    t = dict(out.get("timings_s") or {})
    if out.get("ended_at") and out.get("started_at"):
        t["task"] = round(out["ended_at"] - out["started_at"], 3)
    return {
        "status": status,
        "exit_code": code,
        "message": out.get("message") or "",
        "node": out.get("node"),
        "timings_s": t,
        "archive_bytes": int(out.get("archive_bytes") or 0),
    }


def _pin_specs(units: list[Unit], opts: dict) -> dict[str, dict]:
    """{pin: the environment part of a unit spec} for the distinct pins of ``units``."""
    keys = ("env_setup", "env_root", "build_envs")
    return {u.sglang: {"sglang": u.sglang, **{k: opts.get(k) for k in keys}} for u in units}


class LocalExecutor(Executor):
    """Runs the units one after another on this machine."""

    name = "local"

    def plan_envs(self, units):
        return [plan_env(spec, REPO_ROOT) for spec in _pin_specs(units, self.opts).values()]

    def run(self, units, matrix_dir, record, resume):
        for u in units:
            spec = _unit_spec(u, matrix_dir, self.opts)
            dest = matrix_dir / u.id
            spec["out_dir"] = str(dest)
            if u.id in resume:
                spec["resume_dir"] = str(dest)
            log(f"unit {u.id}: running{' (resumed)' if u.id in resume else ''}")
            try:
                out = execute_unit(spec)
            except KeyboardInterrupt:
                msg = "interrupted; finished cells kept"
                record(u.id, status="interrupted", exit_code=130, message=msg, node=node_name())
                raise
            res = _result_of(out)
            record(u.id, **res)
            log(f"unit {u.id}: {res['status']}{': ' + res['message'] if res['message'] else ''}")


def _ray():
    try:
        import ray
    except ImportError:
        raise EnvironmentNotReady(
            f"--on ray needs the Ray package, which is not installed; {RAY_HINT}"
        ) from None
    return ray


def _ray_unit_task(spec: dict) -> dict:
    """The Ray task: :func:`execute_unit` on the node Ray picked; the node id is added."""
    import ray

    out = execute_unit(spec)
    out["node_id"] = ray.get_runtime_context().get_node_id()
    return out


def _ray_env_probe(specs: list[dict]) -> list[dict]:
    """The Ray task that looks, on one node, where each pin's python would come from
    (:func:`plan_env`, as a unit's task would see it); builds nothing."""
    return [plan_env(s, unit_workdir(s)).model_dump() for s in specs]


def queue_split(submitted: float, started: float, ends_on_node: list[float]) -> tuple[float, float]:
    """(queued, dispatch) seconds of a Ray task's start delay (``started - submitted``):
    ``queued`` until the last of ``ends_on_node`` (the other units of its node ending) between
    submission and start, ``dispatch`` the rest (Ray's scheduling, the worker's start)."""
    freed = max((e for e in ends_on_node if submitted <= e <= started), default=submitted)
    return round(max(0.0, freed - submitted), 3), round(max(0.0, started - freed), 3)


class RayExecutor(Executor):
    """One Ray task per unit (``max_retries=0``: a benchmark is never silently re-run).

    ``address``: the cluster (None: Ray's default); ``ship_code``: send this checkout as the
    job's ``working_dir`` (a node on the driver's machine runs in the driver's checkout);
    ``cancel_wait_s``: how long Ctrl-C waits for cancelled units to stop their servers.
    Resources per unit: the matrix's ``resources`` and the ``accelerator_type:<T>`` resource of
    the unit's GPU type.
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        resources: Resources | None = None,
        ship_code: bool = True,
        env_setup: str = "make",
        cancel_wait_s: float = 90,
        log=log,
        **opts,
    ):
        super().__init__(env_setup=env_setup, **opts)
        self.address = address
        self.resources = resources or Resources()
        self.ship_code = ship_code
        self.cancel_wait_s = cancel_wait_s
        self.log = log
        self._started = False

    def connect(self):
        """Connect to the cluster (once); returns the ray module."""
        ray = _ray()
        if not ray.is_initialized():
            kw: dict[str, Any] = {"address": self.address, "log_to_driver": False}
            if self.ship_code:
                kw["runtime_env"] = {"working_dir": str(REPO_ROOT), "excludes": SHIP_EXCLUDES}
            ray.init(**kw)
            self._started = True
        return ray

    def close(self) -> None:
        if self._started:
            _ray().shutdown()
            self._started = False

    def _candidates(self, ray, u: Unit) -> list[dict]:
        """The alive nodes (ray.nodes() entries) of the unit's GPU type (all for none)."""
        key = f"accelerator_type:{u.gpu_type}" if u.gpu_type else None
        return [
            n
            for n in ray.nodes()
            if n.get("Alive") and (key is None or n.get("Resources", {}).get(key, 0) > 0)
        ]

    def _workdir_spec(self) -> dict:
        """How a task finds the checkout bench runs in (:func:`unit_workdir`)."""
        if not self.ship_code:
            return {"workdir": None}
        return {"workdir": "cwd", "checkout": {"path": str(REPO_ROOT), "machine": machine_key()}}

    def plan_envs(self, units):
        """:func:`plan_env` on each node that may run a unit (a probe task pinned there), per pin
        (``env_setup`` "current": no probe, each worker's own python)."""
        specs = _pin_specs(units, self.opts)
        if self.opts["env_setup"] == "current":
            return [
                EnvPlan(pin=p, node="every node", source="current", path="the Ray worker's python")
                for p in specs
            ]
        ray = self.connect()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        per_node: dict[str, list[dict]] = {}
        for u in units:
            for n in self._candidates(ray, u):
                todo = per_node.setdefault(n["NodeID"], [])
                if all(s["sglang"] != u.sglang for s in todo):
                    todo.append({**specs[u.sglang], **self._workdir_spec()})
        probe = ray.remote(_ray_env_probe)
        refs = [
            probe.options(
                num_cpus=0,
                max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            ).remote(todo)
            for node_id, todo in per_node.items()
        ]
        return [EnvPlan.model_validate(p) for got in ray.get(refs, timeout=300) for p in got]

    def _requests(self, units: list[Unit]) -> tuple[dict[str, dict], dict[str, str]]:
        """{unit id: Ray options} for units some alive node can take, {unit id: why not} else."""
        ray = self.connect()
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        have = sorted(
            {k.split(":", 1)[1] for r in nodes for k in r if k.startswith("accelerator_type:")}
        )
        opts, bad = {}, {}
        for u in units:
            key = f"accelerator_type:{u.gpu_type}" if u.gpu_type else None
            cands = [r for r in nodes if key is None or r.get(key, 0) > 0]
            if not cands:
                bad[u.id] = (
                    f"no node of the cluster has GPU type {u.gpu_type} (resource {key}); "
                    f"types present: {', '.join(have) or 'none'}; start a node of that "
                    f"type or pass `--resources '{{\"{key}\": 1}}'` to its `ray start`"
                )
                continue
            want = {}
            for res, rkey in (("num_gpus", "GPU"), ("num_cpus", "CPU")):
                v = getattr(self.resources, res)
                if v == "node":
                    v = min(r.get(rkey, 0) for r in cands)
                want[res] = v
            fits = [
                r
                for r in cands
                if r.get("GPU", 0) >= want["num_gpus"] and r.get("CPU", 0) >= want["num_cpus"]
            ]
            if not fits:
                bad[u.id] = (
                    f"no node{' of type ' + u.gpu_type if u.gpu_type else ''} has "
                    f"{want['num_gpus']} GPUs and {want['num_cpus']} CPUs (nodes: "
                    + "; ".join(f"GPU {r.get('GPU', 0):g} CPU {r.get('CPU', 0):g}" for r in cands)
                    + ")"
                )
                continue
            o = {
                **want,
                "max_retries": 0,
                "retry_exceptions": False,
                "name": f"patchbench-unit-{u.id}",
            }
            if key:
                o["resources"] = {key: 0.001}
            opts[u.id] = o
        return opts, bad

    def check(self, units):
        return self._requests(units)[1]

    def run(self, units, matrix_dir, record, resume):
        ray = self.connect()
        opts, bad = self._requests(units)
        for uid, why in bad.items():
            record(uid, status="unschedulable", message=why)
        task = ray.remote(_ray_unit_task)
        pending: dict[Any, tuple[Unit, float]] = {}
        self._ran: dict[str, tuple[dict, str, float, float, float]] = {}
        for u in units:
            if u.id not in opts:
                continue
            spec = {**_unit_spec(u, matrix_dir, self.opts), **self._workdir_spec()}
            if u.id in resume and (matrix_dir / u.id / "manifest.json").exists():
                spec["resume_archive"] = pack_folder(matrix_dir / u.id)
            t0 = time.time()
            ref = task.options(**opts[u.id]).remote(spec)
            pending[ref] = (u, t0)
            self.log(
                f"unit {u.id}: submitted (gpu_type={u.gpu_type or 'any'}, "
                f"num_gpus={opts[u.id]['num_gpus']:g}, num_cpus={opts[u.id]['num_cpus']:g})"
            )
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in ready:
                    self._collect(ray, ref, *pending.pop(ref), matrix_dir, record)
            self._resplit(record)
        except KeyboardInterrupt:
            self.log(f"interrupted: cancelling {len(pending)} unit(s); finished units are kept")
            for ref in pending:
                ray.cancel(ref, force=False)
            deadline = time.time() + self.cancel_wait_s
            while pending and time.time() < deadline:
                ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.5)
                for ref in ready:
                    self._collect(ray, ref, *pending.pop(ref), matrix_dir, record)
            for u, _ in pending.values():
                record(u.id, status="cancelled", message="cancelled before it ended")
            raise

    def _collect(self, ray, ref, u: Unit, submitted: float, matrix_dir: Path, record) -> None:
        ready_at = time.time()
        t0 = time.monotonic()
        try:
            out = ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            record(u.id, status="cancelled", message="cancelled")
            self.log(f"unit {u.id}: cancelled")
            return
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(getattr(e, "cause", None), BaseException) else e
            if isinstance(cause, (ray.exceptions.TaskCancelledError, KeyboardInterrupt)):
                record(u.id, status="cancelled", message="cancelled")
                self.log(f"unit {u.id}: cancelled")
                return
            msg = f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
            record(u.id, status="error", exit_code=getattr(cause, "exit_code", None), message=msg)
            self.log(f"unit {u.id}: error: {msg}")
            return
        except ray.exceptions.RayError as e:  # worker or node died, object lost
            msg = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            record(u.id, status="lost", message=msg)
            self.log(f"unit {u.id}: lost ({type(e).__name__})")
            return
        get_s = time.monotonic() - t0
        res = _result_of(out)
        t1 = time.monotonic()
        if out.get("archive"):
            unpack_folder(out["archive"], matrix_dir / u.id)
        res["timings_s"].update(
            get=round(get_s, 3),
            unpack=round(time.monotonic() - t1, 3),
            start_delay=round(out["started_at"] - submitted, 3),
            return_delay=round(max(0.0, ready_at - out["ended_at"]), 3),
            wall=round(time.time() - submitted, 3),
        )
        node_id = str(out.get("node_id", ""))
        res["node"] = f"{out.get('node')} ({node_id[:12]})"
        self._ran[u.id] = (res, node_id, submitted, out["started_at"], out["ended_at"])
        res["timings_s"].update(zip(("queued", "dispatch"), self._split(u.id), strict=True))
        record(u.id, **res)
        msg = f": {res['message']}" if res["message"] else ""
        self.log(f"unit {u.id}: {res['status']} on {res['node']}{msg}")

    def _split(self, uid: str) -> tuple[float, float]:
        """(queued, dispatch) of a collected unit from the units collected so far."""
        _res, node_id, submitted, started, _ended = self._ran[uid]
        ends = [e for k, (_r, n, _s, _st, e) in self._ran.items() if n == node_id and k != uid]
        return queue_split(submitted, started, ends)

    def _resplit(self, record) -> None:
        """Once every unit is back: split each start delay again (a unit of the same node may
        have been collected after the one that waited for it) and re-record what changed."""
        for uid, (res, *_rest) in self._ran.items():
            t = res["timings_s"]
            queued, dispatch = self._split(uid)
            if (t.get("queued"), t.get("dispatch")) != (queued, dispatch):
                t.update(queued=queued, dispatch=dispatch)
                record(uid, **res)


def make_executor(
    on: str, *, address: str | None = None, resources: Resources | None = None, **kw
) -> Executor:
    """ "local" -> :class:`LocalExecutor`, "ray" -> :class:`RayExecutor` (``kw`` passed on).
    Raises UsageError for another name, EnvironmentNotReady for "ray" without Ray installed."""
    if on == "local":
        if address:
            raise UsageError("--address is for --on ray")
        keep = ("env_setup", "build_envs", "command", "env", "stop_grace_s")
        return LocalExecutor(**{k: v for k, v in kw.items() if k in keep})
    if on == "ray":
        _ray()
        return RayExecutor(address, resources=resources, **kw)
    raise UsageError(f"--on must be local or ray, not {on!r}")
