"""A minimal suite for runner tests: N tiny /generate calls against the cell's server.

Registered only by tests (monkeypatching patchbench.suite.SUITES); FAKE_SUITE_INTERRUPT in the
environment makes run() raise KeyboardInterrupt (a Ctrl-C during a suite)."""

import json
import os
import urllib.request

from pydantic import BaseModel, ConfigDict

from patchbench.records import write_json
from patchbench.suite import MetricInfo, SuiteError, SuiteResult

METRICS = {"requests_count": MetricInfo("none", "count")}


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int = 3


def run(ctx, params):
    if os.environ.get("FAKE_SUITE_INTERRUPT") == f"{ctx.variant}/{ctx.repeat}":
        raise KeyboardInterrupt
    done = 0
    for _ in range(params.n):
        req = urllib.request.Request(
            ctx.server.base_url + "/generate",
            data=json.dumps({"text": "x"}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=10).read()
        except OSError as e:
            raise SuiteError(f"request failed: {e}") from None
        done += 1
    write_json(ctx.out_dir / "records.json", {"done": done})
    return SuiteResult(metrics={"requests_count": float(done)})
