"""The words and marks a figure shows so that it cannot be misread, as small pure functions the
figure code calls and the tests check by hand: the subtitle every figure carries (model,
hardware, sglang version, paired repeats), which points get an equivalence band (only those with
an interval) and what a point without one says, the absolute values beside a change, titles that
name intervals only where some are drawn, the one-repeat distribution's direction against the
paired estimate, the profiled timeline's caption and "per GPU" only on a GPU.

Each takes a typed comparison or row, or its JSON form (the suites' ``plots`` hooks get either).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from patchbench.suite import comparison_get

#: the tiny model patchbench builds for its CPU runs (patchbench.envs.tinymodel) is always this
TINY_MODEL = "Qwen2.5-VL tiny (random weights)"
#: what a figure says of a timeline the profiler recorded
PROFILED = "profiled, untimed"


def _get(obj: Any, key: str, default: Any = None) -> Any:
    """``obj.key`` of a typed model, ``obj[key]`` of its JSON form; ``default`` for None."""
    val = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
    return default if val is None else val


# --- the subtitle ---------------------------------------------------------------------------


def model_name(model: str, tiny: bool) -> str:
    """The model as a reader names it: :data:`TINY_MODEL` for the tiny model, else the last part
    of its path or hub id ("Qwen/Qwen2.5-VL-7B-Instruct" -> "Qwen2.5-VL-7B-Instruct")."""
    if tiny:
        return TINY_MODEL
    name = os.path.basename(str(model or "").rstrip("/\\"))
    return name or "?"


def hardware(gpu: str | None) -> str:
    """The run's hardware: the GPU name the manifest recorded, "CPU" without one (the CPU
    engine; the report's header says "none (CPU engine)")."""
    return gpu or "CPU"


def on_gpu(comparison: Any) -> bool:
    """Whether the run recorded a GPU (``run.gpu``)."""
    return bool(_get(comparison_get(comparison, "run", {}), "gpu"))


def paired_repeats(comparison: Any) -> int:
    """The paired repeats the run-level changes rest on: the most ``n_pairs`` of any run row
    (a failed cell costs its pair), else the comparison's ``repeats``."""
    rows = comparison_get(comparison, "rows", []) or []
    ns = [int(_get(r, "n_pairs", 0)) for r in rows if _get(r, "kind", "run") == "run"]
    return max(ns) if ns and max(ns) > 0 else int(comparison_get(comparison, "repeats", 0))


def subtitle(comparison: Any) -> str:
    """One line every figure carries: "Qwen2.5-VL tiny (random weights) on CPU, sglang
    0.5.1.post3, 2 paired repeats" (the version left out when unknown)."""
    run = comparison_get(comparison, "run", {})
    parts = [
        f"{model_name(_get(run, 'model', '?'), bool(_get(run, 'tiny', False)))} "
        f"on {hardware(_get(run, 'gpu'))}"
    ]
    version = _get(run, "sglang", "?")
    if version and version != "?":
        parts.append(f"sglang {version}")
    n = paired_repeats(comparison)
    parts.append(f"{n} paired repeat{'' if n == 1 else 's'}")
    return ", ".join(parts)


def figure_title(title: str, comparison: Any) -> str:
    """A figure's suptitle: ``title``, then :func:`subtitle` with the run id on its own line."""
    run_id = comparison_get(comparison, "run_id", "")
    return f"{title}\n{subtitle(comparison)}" + (f"   [{run_id}]" if run_id else "")


# --- intervals and bands --------------------------------------------------------------------


def has_interval(r: Any) -> bool:
    """Whether the row has both ends of an interval."""
    return _get(r, "low") is not None and _get(r, "high") is not None


def band_points(rows: list[tuple[float, Any]]) -> list[float]:
    """Of ``(position, row)`` pairs, the positions that get the equivalence band behind them:
    those whose row has a margin and an interval. A point without an interval never sits in a
    band (it would read "equivalent" while nothing was decided)."""
    return [y for y, r in rows if has_interval(r) and _get(r, "margin") is not None]


def no_interval_reason(r: Any, min_repeats: int = 3) -> str:
    """Why a row has no interval, as its point's label says: "n < 3" when it has fewer paired
    repeats than a run verdict needs (the number its note states, else ``min_repeats``), else
    its first note's head, else "no interval"."""
    for note in _get(r, "notes", []) or []:
        m = re.search(r"fewer than compare\.min_repeats = (\d+)", note)
        if m:
            return f"n < {m.group(1)}"
    if _get(r, "kind", "run") == "run" and int(_get(r, "n_pairs", 0)) < min_repeats:
        return f"n < {min_repeats}"
    notes = _get(r, "notes", []) or []
    return notes[0].split(":")[0].strip() if notes else "no interval"


def no_interval_label(r: Any, min_repeats: int = 3) -> str:
    """The legend label of a hollow grey point: "no interval: n < 3"."""
    why = no_interval_reason(r, min_repeats)
    return why if why == "no interval" else f"no interval: {why}"


def change_title(drawn: int, points: int) -> str:
    """The words a title uses for the changes it shows, ``drawn`` of ``points`` with an
    interval: intervals named only when some are drawn."""
    if points and drawn == 0:
        return "paired change (no interval: too few repeats)"
    if drawn < points:
        return "paired change, interval where there is one (Holm-adjusted level)"
    return "paired change with its interval (Holm-adjusted level)"


# --- values beside a change -----------------------------------------------------------------


def _num(x: float) -> str:
    """4 significant digits, thousands grouped (as the report's tables)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def unit_label(unit: str, kind: str = "run") -> str:
    """The unit a value is shown in: accuracy in "%", "count" as nothing, else the metric's
    unit ("tok/s", "ms")."""
    if kind == "accuracy" or unit == "acc":
        return "%"
    return "" if unit in ("count", "share") else unit


def values_text(r: Any) -> str | None:
    """The absolute values beside a change, baseline -> variant with the unit: "237 -> 258
    tok/s", accuracy in percent ("41.3% -> 44.0%"), the same bound in both arms once ("both ≥8
    req: a bound"); None without both values."""
    b, v = _get(r, "baseline_value"), _get(r, "variant_value")
    if b is None or v is None:
        return None
    kind, unit = _get(r, "kind", "run"), _get(r, "unit", "")
    if kind == "accuracy":
        return f"{100 * b:.1f}% -> {100 * v:.1f}%"
    bounds = {"lower": "≥", "upper": "≤"}
    bb = bounds.get(_get(r, "baseline_bound") or "", "")
    vb = bounds.get(_get(r, "variant_bound") or "", "")
    u = unit_label(unit, kind)
    if bb and bb == vb and _num(b) == _num(v):
        return f"both {bb}{_num(b)}{' ' + u if u else ''}: a bound"
    return f"{bb}{_num(b)} -> {vb}{_num(v)}{' ' + u if u else ''}"


# --- one repeat's distribution --------------------------------------------------------------


def median(xs: list[float]) -> float | None:
    """The median of ``xs`` (None when empty)."""
    s = sorted(x for x in xs if x is not None)
    if not s:
        return None
    k = len(s) // 2
    return s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2


def opposite(shift: float | None, change: float | None) -> bool:
    """Whether a repeat's median shift and the paired estimate point opposite ways (both
    nonzero, signs differ)."""
    if shift is None or change is None or shift == 0 or change == 0:
        return False
    return math.copysign(1, shift) != math.copysign(1, change)


def repeat_shift_note(variant: str, shift: float, unit: str, change: float) -> str:
    """The note an opposite one-repeat distribution carries: "pr: this repeat's shift (+2.1 ms
    median) is opposite to the paired estimate (-8.8%)"."""
    return (
        f"{variant}: this repeat's shift ({shift:+.3g} {unit} median) is opposite to the paired "
        f"estimate ({change:+.1f}%)"
    )


# --- captions -------------------------------------------------------------------------------


def timeline_title(n_steps: int, concurrency: str, batch_size: Any) -> str:
    """The profiled timeline's title, captioned :data:`PROFILED`: the profiler slows every
    step, so lengths are not the variants' speed."""
    return (
        f"{n_steps} consecutive decode steps, concurrency {concurrency} (batch size {batch_size})"
        f": {PROFILED}, step lengths include the profiler's cost"
    )


def per_device(comparison: Any) -> str:
    """ "per GPU" on a run that recorded a GPU, else "per server"."""
    return "per GPU" if on_gpu(comparison) else "per server"
