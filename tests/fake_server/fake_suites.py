"""Suites for runner tests, registered through the public contract (patchbench.suite.register).

- ``fake``: ``n`` tiny /generate calls against the cell's server. FAKE_SUITE_INTERRUPT=
  "<variant>/<repeat>" makes it raise KeyboardInterrupt (a Ctrl-C during the suite);
  FAKE_SUITE_MARK=<file> makes it write a line "<variant>/<repeat> <pid>" there when it starts
  (tests send signals once it is there); FAKE_SUITE_INCOMPLETE="<variant>/<repeat>" makes it
  return status "incomplete" there (a measurement found invalid).
- ``fake_instr``: a timed suite that declares in-server instrumentation (an environment variable
  the fake server sees, and a collect() result).
- ``fake_untimed``: ``timed = False`` (runs only in correctness cells).
"""

import json
import os
import urllib.request
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from patchbench.records import write_json
from patchbench.suite import Instrumentation, MetricInfo, Suite, SuiteError, SuiteResult, register


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 3


@register
class FakeSuite(Suite):
    name = "fake"
    Params = Params
    metrics = {"requests_count": MetricInfo("none", "count")}

    def run(self, ctx, params):
        here = f"{ctx.variant}/{ctx.repeat}"
        if os.environ.get("FAKE_SUITE_MARK"):
            with open(os.environ["FAKE_SUITE_MARK"], "a") as f:
                f.write(f"{here} {os.getpid()}\n")
        if os.environ.get("FAKE_SUITE_INTERRUPT") == here:
            raise KeyboardInterrupt
        done = 0
        for _ in range(params.n):
            req = urllib.request.Request(
                ctx.server.base_url + "/generate",
                data=json.dumps({"text": "x"}).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                urllib.request.urlopen(req, timeout=600).read()
            except OSError as e:
                raise SuiteError(f"request failed: {e}") from None
            done += 1
        write_json(ctx.out_dir / "records.json", {"done": done})
        if os.environ.get("FAKE_SUITE_INCOMPLETE") == here:
            return SuiteResult(
                status="incomplete",
                metrics={"requests_count": float(done)},
                errors=["fake: the measurement is invalid"],
            )
        return SuiteResult(metrics={"requests_count": float(done)})


class InstrParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@register
class FakeInstrSuite(Suite):
    name = "fake_instr"
    Params = InstrParams
    metrics = {"seen_count": MetricInfo("none", "count")}

    def run(self, ctx, params):
        return SuiteResult(metrics={"seen_count": 1.0})

    def instrumentation(self, ctx, params):
        out = Path(ctx.out_dir) / "instr"
        return Instrumentation(
            env={"FAKE_INSTRUMENTED": "1"},
            out_dir=out,
            collect=lambda d: {"files_count": len(list(Path(d).iterdir()))},
        )


@register
class FakeUntimedSuite(Suite):
    name = "fake_untimed"
    Params = InstrParams
    metrics = {"seen_count": MetricInfo("none", "count")}
    timed = False

    def run(self, ctx, params):
        return SuiteResult(metrics={"seen_count": 1.0})


@register
class FakeOfflineInstrSuite(Suite):
    """Instrumentation but no server traffic of its own (like sync_probe's cross-check): a
    correctness cell then also runs the timed server suites so the instrumented server is used."""

    name = "fake_instr_offline"
    Params = InstrParams
    metrics = {"seen_count": MetricInfo("none", "count")}
    needs_server = False

    def run(self, ctx, params):
        return SuiteResult(metrics={"seen_count": 1.0})

    def instrumentation(self, ctx, params):
        return Instrumentation(env={"FAKE_INSTRUMENTED": "1"})
