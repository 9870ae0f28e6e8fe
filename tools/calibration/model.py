"""The calibration's synthetic run: who runs, what is measured, and the noise model.

One trial is one run of a baseline and three compared variants: an A/A variant, ``patch-a`` and
``patch-b`` (as in configs/pr9460-h200.yaml with an A/A variant added), over ``repeats`` cells
each. Noise model (two levels; times in ms):

- run level, per server lifetime (cell): a decode-speed shock ``s ~ N(0, run_cv)`` multiplies
  every inter-token gap by ``exp(s)``; the prefill shock of TTFT is ``0.5 s + sqrt(0.75) u``,
  ``u ~ N(0, run_cv)``, so TTFT is partly correlated with decode; E2E, TPOT, ITL and the
  throughputs follow from the requests, so their run-to-run correlations are those of one server;
- request level, CV ``req_cv`` (default 20 %): 200 requests of 1024 output tokens at concurrency
  16 run in waves of 16 that share their decode steps: a step's noise (share ``step_share`` of
  the log variance) is common to the 16 requests of the wave, the rest is the request's own; each
  request is represented by ``steps`` sampled decode steps; TTFT likewise has a wave part and a
  request part, times a prompt factor fixed per prompt (the same prompts in every cell);
- output throughput = 1024 x 200 / duration, duration = sum over waves of the slowest request's
  E2E; median ITL is taken over the sampled per-token gaps, TPOT per request;
- MMMU: 900 questions, each right or wrong once and for all (45 % right) except a ``fragile``
  share (5 %) that is right with probability 1/2 in every cell (batch-dependent numerics);
- sync probe: 2 host syncs per call, exactly, in every cell (0 for ``patch-a`` in ``effect``).

The run-level shocks (:func:`run_shocks`) are Gaussian and the same for every arm by default;
other run noise, one :class:`Model` field each (``--noise`` of tools/calibrate.py, parsed by
:func:`parse_noise`; they combine):

- ``tail_df``: heavy tails: each shock is a Student t with ``tail_df`` (> 2) degrees of freedom
  scaled to the standard deviation ``run_cv`` (``t * run_cv / sqrt(df / (df - 2))``);
- ``outlier_p``: with this chance a trial has one abnormal cell (uniform over every variant and
  round of the trial; a sequential run that stops before its round never sees it) whose times are
  all multiplied by ``1 + U(outlier_slow)`` (10-20 % slower);
- ``drift``: every time is multiplied by ``(1 + drift) ** (p / V)``, ``p`` the cell's position in
  the run's interleaved order (``baseline, aa, patch-a, patch-b``, reversed in odd rounds, as
  ``patchbench.run.plan`` orders them) and ``V`` the variants: a slow-down of ``drift`` per round
  shared by the arms;
- ``noisy_factor``: the run-level shocks of ``noisy_variant``'s cells are this many times wider
  (2: a patch that doubles the run-to-run CV);
- ``period``: a periodic disturbance: every time of the cells at positions 0, ``period``,
  2 ``period``, ... of the run's order is multiplied by ``1 + period_slow`` (a job on the host
  that recurs every ``period`` cells).

The run's order is ``order`` (``schedule.order``: interleaved, or randomized with a seed drawn
per trial from its seed sequence, :func:`patchbench.run.plan.plan_cells`); it moves the drift
and the periodic disturbance only.

The abnormal cell and its size are drawn from a child of the trial's seed sequence, so the rest
of the trial is the same draw as without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

BASELINE = "baseline"
AA = "aa"
VARIANTS: dict[str, list[str]] = {
    BASELINE: [],
    AA: [],
    "patch-a": ["patch-a"],
    "patch-b": ["patch-b"],
}
PATCHES = ("patch-a", "patch-b")
EFFECT_VARIANT = "patch-a"
#: scenario -> the last entry of its trials' seeds
SCENARIO_KEY = {"null": 0, "effect": 1, "small": 2}
THR = "output_throughput_tok_s"
SUITES = ("serving", "mmmu", "sync_probe")
PRIMARIES: dict[str, tuple[str, ...]] = {
    "serving": (
        "output_throughput_tok_s",
        "itl_median_ms",
        "ttft_median_ms",
        "e2e_latency_median_ms",
    ),
    "mmmu": ("mmmu_overall_acc",),
    "sync_probe": ("host_syncs_per_call_count",),
}
SHORT = {
    "output_throughput_tok_s": "output thr",
    "itl_median_ms": "median ITL",
    "ttft_median_ms": "median TTFT",
    "e2e_latency_median_ms": "median E2E",
    "mmmu_overall_acc": "MMMU acc",
    "host_syncs_per_call_count": "host syncs",
}
#: the summary statistics the simulation produces per serving quantity (all kind "run")
STATS = (("mean", None), ("median", 50), ("p90", 90), ("p95", 95), ("p99", 99))


@dataclass(frozen=True)
class Model:
    """The synthetic run's parameters (see the module docstring). CVs are log-scale standard
    deviations (fractions: 0.03 = 3 %); times in ms."""

    run_cv: float = 0.03
    req_cv: float = 0.20
    step_share: float = 0.5
    prefill_corr: float = 0.5
    requests: int = 200
    concurrency: int = 16
    steps: int = 16
    out_len: int = 1024
    in_len: int = 68
    itl_ms: float = 5.9
    ttft_ms: float = 97.0
    prompt_cv: float = 0.3
    questions: int = 900
    accuracy: float = 0.45
    fragile: float = 0.05
    syncs: int = 2
    tail_df: float | None = None
    outlier_p: float = 0.0
    outlier_slow: tuple[float, float] = (0.10, 0.20)
    drift: float = 0.0
    noisy_variant: str = EFFECT_VARIANT
    noisy_factor: float = 1.0
    period: int = 0
    period_slow: float = 0.05
    order: str = "interleaved"

    @property
    def noise_label(self) -> str:
        """The run noise in words ("Gaussian" by default; see the module docstring)."""
        parts = [f"Student t ({self.tail_df:g} df)" if self.tail_df else "Gaussian"]
        if self.outlier_p:
            lo, hi = self.outlier_slow
            parts.append(
                f"one cell {100 * lo:g}-{100 * hi:g}% slow in {100 * self.outlier_p:g}% of runs"
            )
        if self.drift:
            parts.append(f"drift {100 * self.drift:+g}%/round")
        if self.noisy_factor != 1.0:
            parts.append(f"{self.noisy_variant} run CV x{self.noisy_factor:g}")
        if self.period:
            parts.append(f"every {self.period:g}th cell {100 * self.period_slow:g}% slow")
        return ", ".join(parts)


#: ``--noise`` names: name -> (Model field, its value when the name is given alone)
NOISE = {
    "t": ("tail_df", 3.0),
    "outlier": ("outlier_p", 0.2),
    "drift": ("drift", 0.005),
    "unequal": ("noisy_factor", 2.0),
    "period": ("period", 2),
}


def parse_noise(texts: list[str]) -> dict[str, float]:
    """``["t:3", "outlier:0.2", "drift", ...]`` as :class:`Model` fields (``NAME[:VALUE]``, the
    names and defaults of :data:`NOISE`; "gauss" adds nothing). Raises ValueError on an unknown
    name, a value that is not a number or a t with 2 or fewer degrees of freedom (no variance)."""
    out: dict[str, float] = {}
    for text in texts:
        name, _, val = text.partition(":")
        if name == "gauss" and not val:
            continue
        if name not in NOISE:
            raise ValueError(f"{text!r}: noise is one of gauss, {', '.join(NOISE)}")
        field_, default = NOISE[name]
        try:
            x = float(val) if val else default
        except ValueError:
            raise ValueError(f"{text!r}: {name}:VALUE needs a number") from None
        if name == "t" and not x > 2:
            raise ValueError(f"{text!r}: a t needs more than 2 degrees of freedom")
        if name == "outlier" and not 0 <= x <= 1:
            raise ValueError(f"{text!r}: the outlier chance lies in [0, 1]")
        if name == "unequal" and not x > 0:
            raise ValueError(f"{text!r}: the CV factor must be positive")
        if name == "period":
            if not (x >= 1 and x == int(x)):
                raise ValueError(f"{text!r}: the period is a whole number of cells >= 1")
            x = int(x)
        out[field_] = x
    return out


@dataclass
class Trial:
    """One synthetic run: ``metrics[(variant, k)] = {suite: {metric: value}}``, per-question
    correctness ``correct[(variant, k)]`` (bool, shape (questions,)) and the abnormal slow cell
    ``abnormal`` (variant, k) of the outlier noise model (None: none)."""

    run_id: str
    repeats: int
    variants: list[str]
    metrics: dict[tuple[str, int], dict[str, dict[str, float]]] = field(default_factory=dict)
    correct: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    abnormal: tuple[str, int] | None = None
    order: str = "interleaved"
    order_seed: int = 0

    def values(self, variant: str, suite: str, metric: str) -> np.ndarray:
        """Per-repeat values of one metric, shape (repeats,)."""
        return np.array([self.metrics[(variant, k)][suite][metric] for k in range(self.repeats)])


def simulate(
    rng: np.random.Generator,
    m: Model,
    repeats: int,
    *,
    speedup: dict[str, float],
    syncs: dict[str, int],
    run_id: str,
) -> Trial:
    """Draw one trial: every variant of ``VARIANTS`` over ``repeats`` cells.

    speedup[variant]: every time of that variant is divided by (1 + speedup) (0.10: output
    throughput +10 %); syncs[variant]: host syncs per call (default ``m.syncs``)."""
    vs = list(VARIANTS)
    C = len(vs) * repeats  # cells, variant-major
    prompt = np.exp(rng.normal(0.0, m.prompt_cv, m.requests))  # fixed per prompt, every cell
    base_ok = rng.random(m.questions) < m.accuracy
    fragile = rng.random(m.questions) < m.fragile
    scale = np.repeat([1.0 / (1.0 + speedup.get(v, 0.0)) for v in vs], repeats)
    seed = order_seed(rng) if m.order == "randomized" else 0
    s_d, s_p, abnormal = run_shocks(rng, m, vs, repeats, seed)
    cols = _serving_columns(m, *_request_times(rng, m, scale, prompt, (s_d, s_p)))
    flips = rng.random((C, m.questions)) < 0.5
    correct = np.where(fragile[None, :], flips, base_ok[None, :])
    tr = Trial(run_id, repeats, vs, order=m.order, order_seed=seed)
    if abnormal is not None:
        tr.abnormal = (vs[abnormal // repeats], abnormal % repeats)
    for i, v in enumerate(vs):
        for k in range(repeats):
            c = i * repeats + k
            tr.metrics[(v, k)] = {
                "serving": {name: float(col[c]) for name, col in cols.items()},
                "mmmu": {"mmmu_overall_acc": float(correct[c].mean())},
                "sync_probe": {"host_syncs_per_call_count": float(syncs.get(v, m.syncs))},
            }
            tr.correct[(v, k)] = correct[c]
    return tr


def _shock(rng: np.random.Generator, m: Model, size: int) -> np.ndarray:
    """``size`` run-level log shocks with standard deviation ``m.run_cv``: Gaussian, or Student t
    with ``m.tail_df`` degrees of freedom scaled to that standard deviation."""
    if m.tail_df is None:
        return rng.normal(0.0, m.run_cv, size)
    return rng.standard_t(m.tail_df, size) * m.run_cv / math.sqrt(m.tail_df / (m.tail_df - 2))


def order_seed(rng: np.random.Generator) -> int:
    """A randomized order's seed for the trial drawn by ``rng``: from its seed sequence, so no
    draw of the trial changes."""
    return int(rng.bit_generator.seed_seq.generate_state(1)[0])


def run_position(
    variants: list[str], repeats: int, order: str = "interleaved", seed: int = 0
) -> np.ndarray:
    """Each cell's position in the run (variant-major cells, shape (variants x repeats,)) in
    ``patchbench.run.plan``'s ``order`` (interleaved: round k runs the variants in order when k
    is even and reversed when odd; randomized: drawn from ``seed``)."""
    from patchbench.run.plan import plan_cells

    pos = {(c.variant, c.repeat): c.index for c in plan_cells(variants, repeats, order, seed=seed)}
    return np.array([pos[(v, k)] for v in variants for k in range(repeats)])


def run_shocks(
    rng: np.random.Generator, m: Model, variants: list[str], repeats: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The run-level log shocks of every cell (variant-major, shape (variants x repeats,) each):
    (decode ``s_d``, prefill ``s_p``, the abnormal cell's index or None); every time of a cell is
    multiplied by ``exp`` of them (the module docstring has the noise models; ``seed``: a
    randomized order's). The Gaussian model
    draws exactly what it always drew: ``s_d ~ N(0, run_cv)``, ``s_p = 0.5 s_d + sqrt(0.75)
    N(0, run_cv)``."""
    C = len(variants) * repeats
    s_d = _shock(rng, m, C)
    s_p = m.prefill_corr * s_d + math.sqrt(1 - m.prefill_corr**2) * _shock(rng, m, C)
    if m.noisy_factor != 1.0 and m.noisy_variant in variants:
        f = np.repeat([m.noisy_factor if v == m.noisy_variant else 1.0 for v in variants], repeats)
        s_d, s_p = s_d * f, s_p * f
    extra, abnormal = np.zeros(C), None
    pos = run_position(variants, repeats, m.order, seed) if m.drift or m.period else None
    if m.drift:
        extra += math.log1p(m.drift) * pos / len(variants)
    if m.period:
        extra += math.log1p(m.period_slow) * (pos % m.period == 0)
    if m.outlier_p:
        aux = np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])
        hit, cell, slow = aux.random() < m.outlier_p, aux.integers(C), aux.uniform(*m.outlier_slow)
        if hit:
            extra[cell] += math.log1p(slow)
            abnormal = int(cell)
    return s_d + extra, s_p + extra, abnormal


def _request_times(
    rng: np.random.Generator,
    m: Model,
    scale: np.ndarray,
    prompt: np.ndarray,
    shocks: tuple[np.ndarray, np.ndarray],
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The requests of every cell (``scale``: one time factor per cell, shape (cells,);
    ``shocks``: :func:`run_shocks`): ({"ttft", "itl", "tpot", "e2e_latency"}: ms, shape (cells,
    requests), ITL (cells, requests x steps); the benchmark's duration per cell in s, shape
    (cells,))."""
    n, T, C = m.requests, m.steps, scale.size
    W = math.ceil(n / m.concurrency)
    wave = np.arange(n) // m.concurrency
    starts = np.arange(0, n, m.concurrency)
    s_d, s_p = shocks
    sd_w, sd_r = m.req_cv * math.sqrt(m.step_share), m.req_cv * math.sqrt(1 - m.step_share)
    step = rng.normal(0.0, sd_w, (C, W, T))[:, wave, :]  # a decode step, shared by its wave
    own = rng.normal(0.0, sd_r, (C, n, 1))
    gaps = m.itl_ms * scale[:, None, None] * np.exp(s_d[:, None, None] + step + own)
    tpot = gaps.mean(axis=2)
    ttft = (
        m.ttft_ms
        * prompt
        * scale[:, None]
        * np.exp(
            s_p[:, None] + rng.normal(0.0, sd_w, (C, W))[:, wave] + rng.normal(0.0, sd_r, (C, n))
        )
    )
    e2e = ttft + (m.out_len - 1) * tpot
    duration_s = np.maximum.reduceat(e2e, starts, axis=1).sum(axis=1) / 1000.0
    itl = gaps.reshape(C, n * T)
    return {"ttft": ttft, "itl": itl, "tpot": tpot, "e2e_latency": e2e}, duration_s


def _serving_columns(
    m: Model, per: dict[str, np.ndarray], duration_s: np.ndarray
) -> dict[str, np.ndarray]:
    """bench_serving's summary metrics per cell, {metric: shape (cells,)}: the throughputs and,
    per quantity of ``per``, its mean and the percentiles of :data:`STATS`."""
    n = m.requests
    cols: dict[str, np.ndarray] = {
        "request_throughput_req_s": n / duration_s,
        "input_throughput_tok_s": n * m.in_len / duration_s,
        "output_throughput_tok_s": n * m.out_len / duration_s,
        "total_throughput_tok_s": n * (m.in_len + m.out_len) / duration_s,
    }
    qs = [q for _, q in STATS if q is not None]
    for name, x in per.items():
        pct = np.percentile(x, qs, axis=1)
        cols[f"{name}_mean_ms"] = x.mean(axis=1)
        for (s, _q), row in zip([st for st in STATS if st[1] is not None], pct, strict=True):
            cols[f"{name}_{s}_ms"] = row
    return cols


def truncate(tr: Trial, n: int) -> Trial:
    """The first ``n`` repeats of a trial (what a run that stopped after n rounds has)."""
    out = Trial(tr.run_id, n, tr.variants)
    out.metrics = {key: x for key, x in tr.metrics.items() if key[1] < n}
    out.correct = {key: x for key, x in tr.correct.items() if key[1] < n}
    out.abnormal = tr.abnormal if tr.abnormal is not None and tr.abnormal[1] < n else None
    out.order, out.order_seed = tr.order, tr.order_seed
    return out
