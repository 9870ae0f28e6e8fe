"""Per-request SLO attainment of one probe (docs/serving.md, "Capacity at the SLO"): which requests
met every latency bound, and whether the probe meets the SLO by the share rule or the percentile
rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .curve import request_tpot_ms

#: request statuses left out of the attainment and counted: the request was not the server's to
#: serve ("asked_zero": asked for 0 tokens) or did not run to its end ("cut": stopped by a time
#: limit); every other status but "ok" (failed, no_token) fails every bound
EXCLUDED = ("asked_zero", "cut")


class AttainmentSlo(BaseModel):
    """A per-request SLO: bounds on TTFT, TPOT (the mean ITL after the first token, (E2E - TTFT) /
    (output tokens - 1)) and E2E latency in ms, each optional (None: not bounded, at least one
    set). ``rule`` "share": the probe meets it when >= ``target`` of the judged requests meet every
    bound; "percentile": when, for each bound alone, >= ``target`` of them meet it (the
    nearest-rank 100 x target-th percentile of that latency is within the bound). Defaults:
    MLPerf Inference's Llama-2-70B server-scenario constraints (TTFT 2 s, TPOT 200 ms, p99)."""

    model_config = ConfigDict(extra="forbid")

    ttft_ms: float | None = Field(2000.0, gt=0)
    tpot_ms: float | None = Field(200.0, gt=0)
    e2e_ms: float | None = Field(None, gt=0)
    rule: Literal["share", "percentile"] = "percentile"
    target: float = Field(0.99, gt=0, le=1)

    @model_validator(mode="after")
    def _one_bound(self) -> AttainmentSlo:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("the SLO needs at least one of ttft_ms, tpot_ms, e2e_ms")
        return self

    def bounds(self) -> dict[str, float]:
        """{"ttft_ms" | "tpot_ms" | "e2e_ms": bound} of the bounds set."""
        got = {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms}
        return {k: v for k, v in got.items() if v is not None}

    def definition(self) -> str:
        """The SLO in words, as the report prints it."""
        b = " and ".join(f"{k.split('_')[0].upper()} <= {v:g} ms" for k, v in self.bounds().items())
        pct = f"{self.target * 100:g} %"
        if self.rule == "share":
            how = f"at least {pct} of requests meet every bound"
        else:
            how = f"for each bound, at least {pct} of requests meet it (nearest-rank p{self.target * 100:g})"
        return (
            f"{b}; {how}; TPOT = (E2E - TTFT) / (output tokens - 1); errored requests fail, "
            f"requests {' or '.join(EXCLUDED)} are left out and counted"
        )


@dataclass(frozen=True)
class Attainment:
    """One probe's attainment. score: the share (0..1) the rule compares with the target (share
    rule: of requests meeting every bound; percentile rule: the smallest per-bound share);
    per_bound: {bound name: share meeting it}; judged / met / errored / excluded: request counts
    (met: every bound met)."""

    score: float
    meets: bool
    per_bound: dict[str, float]
    judged: int
    met: int
    errored: int
    excluded: int


def attainment(recs: dict, slo: AttainmentSlo) -> Attainment:
    """The attainment of the requests of one probe (a requests.json dict: parallel lists
    ``status``, ``ttft_ms``, ``e2e_ms``, ``output_len``). A one-token request has no TPOT and is
    judged on its other bounds; no judged request: score 0 (fails). ValueError for lists of
    different lengths."""
    bounds = slo.bounds()
    tpot = request_tpot_ms(recs)
    hits = {k: 0 for k in bounds}
    judged = met = errored = excluded = 0
    for st, ttft, e2e, tp in zip(
        recs["status"], recs["ttft_ms"], recs["e2e_ms"], tpot, strict=True
    ):
        if st in EXCLUDED:
            excluded += 1
            continue
        judged += 1
        if st != "ok":
            errored += 1
            continue
        got = {"ttft_ms": ttft, "tpot_ms": tp, "e2e_ms": e2e}
        ok = {
            k: got[k] is None and k == "tpot_ms" or got[k] is not None and got[k] <= b
            for k, b in bounds.items()
        }
        for k, v in ok.items():
            hits[k] += v
        met += all(ok.values())
    per = {k: (h / judged if judged else 0.0) for k, h in hits.items()}
    if slo.rule == "share":
        score = met / judged if judged else 0.0
    else:
        score = min(per.values())
    return Attainment(score, score >= slo.target, per, judged, met, errored, excluded)
