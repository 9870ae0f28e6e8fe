"""MMMU under load (docs/mmmu.md, "Accuracy under load"): one pass per concurrency in the same
cell, metrics named ``<metric>@c<N>`` as the serving sweep's, the answers each arm changed
between concurrencies, and the deterministic-mode control that tells a flip batching can make
from one the patch made."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from patchbench.errors import ConfigError
from patchbench.records import read_jsonl
from patchbench.suite import Instrumentation, MetricInfo, SuiteContext, SuiteResult, read_file
from patchbench.suites.mmmu.pairing import pair_repeats
from patchbench.suites.mmmu.params import Params

#: the server flag of sglang's deterministic (batch-invariant) inference mode
FLAG = "--enable-deterministic-inference"
#: answers of one cell that differ from those at its lowest concurrency
CHANGED = "mmmu_batch_changed_count"


def at(metric: str, key: str) -> str:
    """``mmmu_overall_acc`` at ``c8`` -> ``mmmu_overall_acc@c8`` (docs/CONTRACTS.md, "Load sweeps")."""
    return f"{metric}@{key}"


def declarations(params: Any, metrics: dict[str, MetricInfo]) -> dict[str, MetricInfo]:
    """``metrics`` for one concurrency (or parameters that do not validate); with several, each
    metric at each concurrency (label "... at concurrency N", primary as declared) and
    :data:`CHANGED` at each but the lowest."""
    if not isinstance(params, Params) or not params.loads:
        return dict(metrics)
    out: dict[str, MetricInfo] = {}
    for name, info in metrics.items():
        for key in params.loads:
            label = f"{info.label or name} at concurrency {key[1:]}"
            out[at(name, key)] = dataclasses.replace(info, label=label)
    low = params.loads[0]
    for key in params.loads[1:]:
        label = f"Answers changed from concurrency {low[1:]} to {key[1:]} (same cell)"
        out[at(CHANGED, key)] = MetricInfo("none", "count", label, kind="descriptive")
    return out


def changed(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    """Questions answered in both record lists (no failed request) whose responses differ."""
    got = {r["id"]: r.get("response") for r in b if r.get("verdict") != "failed"}
    return sum(
        r["id"] in got and r.get("verdict") != "failed" and r.get("response") != got[r["id"]]
        for r in a
    )


def merge_passes(passes: dict[str, SuiteResult], out_dir: Path) -> SuiteResult:
    """One summary of a cell's passes ({``c<N>``: its result, lowest first}; the records in
    ``out_dir/c<N>/``): every metric named at its concurrency, :data:`CHANGED` from the records,
    errors and warnings prefixed with the concurrency, status incomplete when a pass is."""
    recs = {k: read_jsonl(Path(out_dir) / k / "records.jsonl") for k in passes}
    low = next(iter(passes))
    out = SuiteResult(status="ok", meta={"concurrency": {}})
    for key, res in passes.items():
        out.metrics.update({at(m, key): x for m, x in res.metrics.items()})
        if key != low:
            out.metrics[at(CHANGED, key)] = float(changed(recs[low], recs[key]))
        out.errors += [f"{key}: {e}" for e in res.errors]
        out.warnings += [f"{key}: {w}" for w in res.warnings]
        out.meta["concurrency"][key] = res.meta
        if res.status != "ok":
            out.status = res.status
    for k in ("protocol", "parser", "parser_seed", "params"):
        out.meta[k] = passes[low].meta.get(k)
    return out


# ------------------------------------------------------------------ deterministic control


def is_control(ctx: SuiteContext, params: Params) -> bool:
    """Whether this is the deterministic-mode pass: the option is on and the cell is a
    correctness cell (``<variant>/correctness/``)."""
    return params.deterministic_control and Path(ctx.out_dir).parent.name == "correctness"


def has_flag(sglang_dir: Path) -> bool:
    """Whether the sglang package at ``sglang_dir`` declares :data:`FLAG` (its server
    arguments: ``srt/server_args.py``, and ``srt/arg_groups/`` where a release has it)."""
    srt = Path(sglang_dir) / "srt"
    files = [srt / "server_args.py", *sorted((srt / "arg_groups").rglob("*.py"))]
    word = FLAG.lstrip("-").replace("-", "_")
    return any(word in p.read_text(errors="replace") for p in files if p.is_file())


def instrumentation(ctx: SuiteContext, params: Params) -> Instrumentation | None:
    """With ``deterministic_control``: :data:`FLAG` on every arm's correctness cell; ConfigError
    (exit 2) naming the pin when its sglang has no such mode."""
    if not params.deterministic_control:
        return None
    from patchbench.envs.envinfo import environment_for

    env = environment_for(ctx.sglang_version)
    where = env.site_dir / "sglang" if env is not None else Path(ctx.variant_sglang_dir)
    if not has_flag(where):
        raise ConfigError(
            f"suites.mmmu.deterministic_control: sglang {ctx.sglang_version} has no "
            f"deterministic (batch-invariant) mode ({FLAG} is not among its server arguments "
            f"in {where}); remove the option or run a release that has it"
        )
    return Instrumentation(server_args=[FLAG])


def attribute(pair: dict[str, Any], ctrl_a: list[dict], ctrl_b: list[dict]) -> None:
    """Give each flipped question of ``pair`` its ``cause``: "patch" when the arms' answers
    under the deterministic mode are right and wrong as in the flip, else "batching"; counts in
    ``flips_patch`` / ``flips_batching``."""
    ok_a = {r["id"]: r.get("verdict") == "correct" for r in ctrl_a}
    ok_b = {r["id"]: r.get("verdict") == "correct" for r in ctrl_b}
    for f in pair["flipped"]:
        i = f["id"]
        same_way = (
            i in ok_a and i in ok_b and (ok_b[i] - ok_a[i]) * (f["variant"] - f["baseline"]) > 0
        )
        f["cause"] = "patch" if same_way else "batching"
    pair["flips_patch"] = sum(f["cause"] == "patch" for f in pair["flipped"])
    pair["flips_batching"] = len(pair["flipped"]) - pair["flips_patch"]


def pair(baseline_dirs: list[Path], variant_dirs: list[Path], params: Params) -> dict | None:
    """The pairing of each concurrency (``by_concurrency``: {``c<N>``: :func:`pair_repeats`'
    dict without ``accuracy``}, ``accuracy`` keyed ``<metric>@c<N>``; one concurrency: today's
    dict); with the control (``<variant>/correctness/mmmu/records.jsonl`` beside each arm's
    ``<variant>/rep<k>/mmmu``), each flip's cause (:func:`attribute`) or a note why not."""
    params = params if isinstance(params, Params) else Params()  # a config that no longer validates
    keys = params.loads or [None]
    out: dict[str, Any] = {"by_concurrency": {}, "accuracy": {}}
    for key in keys:
        a, b = ([Path(d) / (key or "") for d in ds] for ds in (baseline_dirs, variant_dirs))
        p = pair_repeats(a, b)
        if p is None:
            continue
        if params.deterministic_control:
            (ca, why_a), (cb, why_b) = (
                read_file(Path(ds[0]).parents[1] / "correctness/mmmu/records.jsonl", read_jsonl)
                for ds in (baseline_dirs, variant_dirs)
            )
            if ca is None or cb is None:
                p["notes"].append(
                    "deterministic control: " + "; ".join(w for w in (why_a, why_b) if w)
                )
            else:
                attribute(p, ca, cb)
        if key is None:
            return p
        out["accuracy"].update({at(m, key): e for m, e in p.pop("accuracy").items()})
        out["by_concurrency"][key] = p
    return out if out["by_concurrency"] else None


# ------------------------------------------------------------------ report


#: the power at which the report states the smallest detectable accuracy change
MDE_POWER = 0.8


def detectable_pt(acc: dict[str, Any] | None, confidence: float) -> float | None:
    """The smallest change in points the paired t on per-question differences (the accuracy
    rows' test) shows at the run's two-sided level with :data:`MDE_POWER` for this many
    questions, at the observed sd of the differences (patchbench.analysis.power
    ``detectable_effect``: statsmodels' noncentral t, Cohen 1988 ch. 2); None with fewer than
    two questions or no question that differs."""
    import statistics

    from patchbench.analysis.power import detectable_effect

    if not acc or len(acc.get("baseline") or []) < 2:
        return None
    sd = statistics.stdev(y - x for x, y in zip(acc["baseline"], acc["variant"], strict=True))
    if sd == 0:
        return None
    alpha = 1.0 - confidence
    return 100 * detectable_effect(
        len(acc["baseline"]), sd, alpha, MDE_POWER, alternative="two-sided"
    )


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def report_lines(comparison: Any, pairs: dict[str, dict], refusals: dict[str, str]) -> list[str]:
    """Markdown "MMMU paired" of several concurrencies: a line per variant and concurrency with
    the smallest detectable change, flips by cause under the control, then each arm's answers
    changed between concurrencies per repeat."""
    from patchbench.suite import comparison_get

    def num(x: Any, spec: str = ".3f") -> str:
        return "n/a" if x is None else format(x, spec)

    conf = float((comparison_get(comparison, "settings", {}) or {}).get("confidence", 0.95))
    ctrl = any("flips_patch" in p for v in pairs.values() for p in v["by_concurrency"].values())
    head = (
        "| variant | concurrency | repeats | questions | accuracy before | accuracy after "
        "| right→wrong | wrong→right | McNemar p | identical responses | detectable change (pt) |"
    )
    lines = [
        "## MMMU paired",
        "",
        "Each concurrency is its own pass over the same questions in the same cell. Detectable "
        f"change: the smallest the paired t over questions shows at {100 * conf:g}% confidence "
        f"with {100 * MDE_POWER:g}% power (one run's question noise; the observed sd)."
        + (
            f" Flips by cause: the arms under {FLAG} flip the same way (patch) or not."
            if ctrl
            else ""
        ),
        "",
        head + (" flips: patch / batching |" if ctrl else ""),
        "|---" * (11 + ctrl) + "|",
    ]
    for v, pv in pairs.items():
        for key, p in pv["by_concurrency"].items():
            ish = p.get("identical_share")
            mde = detectable_pt(pv["accuracy"].get(at("mmmu_overall_acc", key)), conf)
            cells = [
                v, key[1:], p.get("repeats_used"), p.get("n"), num(p.get("acc_a")),
                num(p.get("acc_b")), f"{p.get('right_to_wrong', 0):g}",
                f"{p.get('wrong_to_right', 0):g}", num(p.get("mcnemar_p"), ".3g"),
                "n/a" if ish is None else f"{100 * ish:.1f}%", num(mde, ".1f"),
            ]  # fmt: skip
            if ctrl:
                cells.append(f"{p.get('flips_patch', 'n/a')} / {p.get('flips_batching', 'n/a')}")
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += [
        f"| {v} | pairing refused: {why} |" + " |" * (10 + ctrl) for v, why in refusals.items()
    ]
    lines.append("")
    rows = [r for r in comparison_get(comparison, "rows", []) if _get(r, "suite") == "mmmu"]
    rows = [r for r in rows if str(_get(r, "metric")).startswith(CHANGED + "@")]
    for name in dict.fromkeys(_get(r, "metric") for r in rows):
        rs = [r for r in rows if _get(r, "metric") == name]
        arms = [(comparison_get(comparison, "baseline"), _get(rs[0], "baseline_repeats"))]
        arms += [(_get(r, "variant"), _get(r, "variant_repeats")) for r in rs]
        each = "; ".join(f"{a} " + ", ".join(num(x, "g") for x in xs or []) for a, xs in arms)
        lines.append(f"- {_get(rs[0], 'label')}, per repeat: {each}")
    lines += [
        f"- {v} {k}: {n}"
        for v, pv in pairs.items()
        for k, p in pv["by_concurrency"].items()
        for n in p.get("notes") or []
    ]
    return lines + ([""] if lines[-1] else [])
