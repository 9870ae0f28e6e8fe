"""Compare every variant of a run with its baseline and write ``compare.json`` (issue 6).

Input: a run folder (docs/CONTRACTS.md, "Run folder"): ``manifest.json`` (the resolved config with
``variants``, ``baseline``, ``schedule.repeats``, ``suites``, ``compare``), per cell
``<variant>/rep<k>/cell.json`` and ``<suite>/summary.json``, and the per-item records the paired
analyses read (serving ``requests.json``, mmmu ``records.jsonl``).

Output: ``compare.json`` (shape in docs/CONTRACTS.md). Per (suite, metric, variant): baseline and
variant medians over repeats (each repeat listed, ``null`` where the cell is not ok), the change in
percent, its interval and the method that gave it, the A/A noise floor, a direction-aware verdict:

- ``incomplete``: any cell of the pair (baseline or variant, any repeat) is not ``ok`` or lacks
  the metric; numbers are still computed from the pairs that are ok, but no verdict is given;
- ``improved`` / ``regressed``: the interval excludes 0 and ``|change|`` is above the A/A noise
  floor (when A/A variants exist), in the metric's good / bad direction;
- ``changed``: the same for a metric without a direction (``MetricInfo.better == "none"``);
- ``no significant change``: otherwise, including when no interval could be computed (a note
  says why).

Intervals (``patchbench.stats``): paired repeats (repeat k of the baseline with repeat k of the
variant, the schedule interleaving them) with a t-interval on log ratios for 2 <= n <
``min_repeats_for_bootstrap``, a BCa bootstrap from there on; a single repeat gets within-cell
intervals for TTFT / E2E (paired requests) and ITL (request blocks) from serving's requests.json.

A/A: a variant whose patch list equals the baseline's is an A/A variant; its intervals give the
noise floor of each metric.
"""
from __future__ import annotations

import functools
import math
import os
import re
import statistics
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from patchbench import records, stats
from patchbench.suite import MetricInfo, load_suite

SCHEMA = 1
VERDICTS = ("improved", "regressed", "changed", "no significant change", "incomplete")


class CompareSettings(BaseModel):
    """The ``compare:`` section of a config (all keys optional).

    confidence: two-sided confidence of every interval (0.95).
    bootstrap_resamples / bootstrap_method / seed: ``scipy.stats.bootstrap`` settings; the seed
    makes every interval reproducible.
    min_repeats_for_bootstrap: from this many paired repeats on, a bootstrap replaces the
    t-interval (50). Measured with normal log-ratio noise (400 seeded no-change trials each), the
    BCa bootstrap called no change significant in 13.5 % of trials at n=10, 6 % at n=20, 7 % at
    n=30, 5.5 % at n=50, against a nominal 5 %; the t-interval stayed at 4.75-7.75 %. Lower it
    (e.g. to 10) only for heavy-tailed noise, where the t-interval is the one that misleads.
    within_cell_intervals: with one repeat, compute paired-request / request-block intervals from
    serving's requests.json (True).
    noise_floor_from: "ci_bound" (largest |bound| of the A/A intervals) or "change" (largest
    |A/A change|); see :func:`patchbench.stats.noise_floor`.
    identity_share_tolerance: flag outputs as changed when the identical-output share is below the
    reference (A/A share, else 100 %) by more than this (0.02).
    retokenized_change_share: flag outputs as changed when the retokenized output-token count
    differs from the baseline's by more than this share (0.01).
    """

    model_config = ConfigDict(extra="forbid")

    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    bootstrap_resamples: int = Field(2000, ge=100, le=200_000)
    bootstrap_method: Literal["BCa", "percentile", "basic"] = "BCa"
    seed: int = 0
    min_repeats_for_bootstrap: int = Field(50, ge=3)
    within_cell_intervals: bool = True
    noise_floor_from: Literal["ci_bound", "change"] = "ci_bound"
    identity_share_tolerance: float = Field(0.02, ge=0.0, le=1.0)
    retokenized_change_share: float = Field(0.01, ge=0.0, le=1.0)


# --------------------------------------------------------------------------- run folder view

@dataclass
class CellView:
    """One (variant, repeat) cell as read from disk; ``dir`` may not exist (status "missing")."""

    variant: str
    repeat: int
    dir: Path
    status: str = "missing"
    error: str | None = None
    summaries: dict[str, dict] = field(default_factory=dict)

    def suite_status(self, suite: str) -> str:
        s = self.summaries.get(suite)
        if self.status != "ok":
            return self.status
        return "missing" if s is None else str(s.get("status", "missing"))

    def suite_ok(self, suite: str) -> bool:
        return self.suite_status(suite) == "ok"

    def metric(self, suite: str, name: str) -> float | None:
        s = self.summaries.get(suite) or {}
        v = (s.get("metrics") or {}).get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        return float(v)

    def suite_dir(self, suite: str) -> Path:
        return self.dir / suite


@dataclass
class RunView:
    """What the comparison needs from one run folder (or from two, for ``runner.py compare``)."""

    run_dir: Path
    run_id: str
    manifest: dict
    baseline: str
    variants: list[str]            # all variants, baseline first
    aa_variants: list[str]
    repeats: int
    suites: list[str]
    cells: dict[tuple[str, int], CellView]
    schedule: list[dict]           # [{"variant","repeat","position","status"}] in execution order
    notes: list[str] = field(default_factory=list)

    def cell(self, variant: str, repeat: int) -> CellView:
        return self.cells[(variant, repeat)]


def read_cell(variant: str, repeat: int, cdir: Path, suites: list[str]) -> CellView:
    """Read cell.json and each suite's summary.json of one cell (missing files -> "missing")."""
    cv = CellView(variant, repeat, cdir)
    cj = cdir / "cell.json"
    if cj.is_file():
        try:
            c = records.read_json(cj)
            cv.status = str(c.get("status", "missing"))
            cv.error = c.get("error")
        except (OSError, ValueError) as e:
            cv.status, cv.error = "failed", f"unreadable cell.json: {e}"
    for s in suites:
        sj = cdir / s / "summary.json"
        if sj.is_file():
            try:
                cv.summaries[s] = records.read_json(sj)
            except (OSError, ValueError) as e:
                cv.summaries[s] = {"suite": s, "status": "failed", "metrics": {},
                                   "errors": [f"unreadable summary.json: {e}"]}
    return cv


def load_run(run_dir: str | os.PathLike) -> RunView:
    """Read a run folder into a :class:`RunView`.

    Raises FileNotFoundError when ``manifest.json`` is missing. Cells named by the config
    (variants x repeats) that have no folder are "missing"; extra ``rep<k>`` folders found on disk
    are included.
    """
    run_dir = Path(run_dir)
    man = records.read_json(run_dir / "manifest.json")
    cfg = man.get("config") or {}
    variants_cfg: dict[str, list] = cfg.get("variants") or {}
    variants = list(variants_cfg) or sorted({c["variant"] for c in man.get("cells", [])})
    if not variants:
        raise ValueError(f"{run_dir}/manifest.json: no variants in config.variants or cells")
    baseline = cfg.get("baseline") or variants[0]
    variants = [baseline] + [v for v in variants if v != baseline]
    repeats = int((cfg.get("schedule") or {}).get("repeats") or 1)
    for v in variants:
        for d in (run_dir / v).glob("rep*"):
            m = re.fullmatch(r"rep(\d+)", d.name)
            if m and d.is_dir():
                repeats = max(repeats, int(m.group(1)) + 1)
    suites = list(cfg.get("suites") or {})
    if not suites:
        found = set()
        for v in variants:
            for sj in (run_dir / v).glob("rep*/*/summary.json"):
                found.add(sj.parent.name)
        suites = sorted(found)
    base_patches = sorted(variants_cfg.get(baseline) or [])
    aa = [v for v in variants[1:] if v in variants_cfg and sorted(variants_cfg[v] or []) == base_patches]
    cells = {}
    for v in variants:
        for k in range(repeats):
            cells[(v, k)] = read_cell(v, k, records.cell_dir(run_dir, v, k), suites)
    schedule = []
    man_cells = man.get("cells") or []
    if man_cells:
        for pos, c in enumerate(man_cells):
            key = (c.get("variant"), int(c.get("repeat", 0)))
            status = cells[key].status if key in cells else c.get("status")
            schedule.append({"variant": key[0], "repeat": key[1], "position": pos, "status": status})
    else:
        pos = 0
        for k in range(repeats):
            for v in variants:
                schedule.append({"variant": v, "repeat": k, "position": pos,
                                 "status": cells[(v, k)].status})
                pos += 1
    return RunView(run_dir=run_dir, run_id=str(man.get("run_id") or run_dir.name), manifest=man,
                   baseline=baseline, variants=variants, aa_variants=aa, repeats=repeats,
                   suites=suites, cells=cells, schedule=schedule)


# --------------------------------------------------------------------------- metrics

_UNITS = (("_tok_s", "tok/s"), ("_req_s", "req/s"), ("_ms", "ms"), ("_s", "s"), ("_acc", "acc"),
          ("_count", "count"), ("_share", "share"), ("_pct", "%"))


def guess_metric_info(name: str) -> MetricInfo:
    """Direction and unit from a metric's name, for suites that do not declare METRICS yet.

    ``*_tok_s``, ``*_req_s``, ``*_acc`` -> higher is better; ``*_ms``, ``*_s`` -> lower;
    anything else (counts, shares) -> no direction.
    """
    unit = next((u for suf, u in _UNITS if name.endswith(suf)), "")
    if unit in ("tok/s", "req/s", "acc"):
        better = "higher"
    elif unit in ("ms", "s"):
        better = "lower"
    else:
        better = "none"
    return MetricInfo(better=better, unit=unit)


def suite_metrics(suite: str, seen: list[str]) -> tuple[list[tuple[str, MetricInfo, bool]], list[str]]:
    """[(metric, info, declared)] for one suite: the suite's METRICS that occur in a summary (in
    the suite's order), then metrics seen in summaries that METRICS lacks (direction guessed from
    the name, ``declared`` False). Second value: notes (e.g. the suite could not be imported)."""
    notes = []
    declared: dict[str, MetricInfo] = {}
    try:
        mod = load_suite(suite)
        declared = dict(getattr(mod, "METRICS", None) or {})
        if not declared:
            notes.append(f"suite '{suite}' declares no METRICS; directions guessed from metric names")
    except KeyError:
        notes.append(f"suite '{suite}' is not a known suite; directions guessed from metric names")
    except Exception as e:  # a suite module that fails to import must not hide the other numbers
        notes.append(f"suite '{suite}' could not be imported ({type(e).__name__}: {e}); "
                     "directions guessed from metric names")
    out = [(m, info, True) for m, info in declared.items() if m in seen]
    out += [(m, guess_metric_info(m), False) for m in seen if m not in declared]
    return out, notes


_WITHIN = re.compile(r"(?:^|_)(ttft|itl|e2e)(?:_|$)")
_STAT = re.compile(r"(?:^|_)(mean|median|std|max|min|p\d{1,2}(?:\.\d+)?)(?:_|$)")


def within_cell_kind(metric: str) -> tuple[str, str] | None:
    """("ttft"|"itl"|"e2e", statistic) for a serving latency metric name, else None.

    Accepts both orders: ``mean_ttft_ms``, ``ttft_p99_ms``, ``median_e2e_latency_ms``.
    """
    m = _WITHIN.search(metric)
    s = _STAT.search(metric)
    if not m or not s:
        return None
    return m.group(1), s.group(1)


def _serving_suite(view: RunView) -> str | None:
    if "serving" in view.suites:
        return "serving"
    return None


def read_requests(suite_dir: Path) -> dict | None:
    """serving's ``requests.json`` of one cell (None when absent or unreadable).

    Cached by (path, mtime, size): every latency metric of a cell reads the same file. Callers
    must not modify the returned dict."""
    p = suite_dir / "requests.json"
    try:
        st = p.stat()
    except OSError:
        return None
    return _read_requests_cached(str(p), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _read_requests_cached(path: str, mtime_ns: int, size: int) -> dict | None:
    try:
        return records.read_json(path)
    except (OSError, ValueError):
        return None


def request_ok(req: dict, i: int) -> bool:
    """Request i of a requests.json succeeded: no error and, where the file has ``status``
    (serving writes "ok" / "failed" / "no_token"), status "ok"."""
    errs = req.get("error") or []
    if i < len(errs) and errs[i]:
        return False
    st = req.get("status")
    return not (st and i < len(st) and st[i] != "ok")


def within_cell_interval(kind: str, stat: str, req_b: dict, req_v: dict,
                         s: CompareSettings) -> stats.Interval:
    """Paired-request (ttft, e2e) or request-block (itl) interval from two requests.json files.

    Requests pair by index; a request that failed in either arm is dropped from both.
    Raises ValueError when the files do not pair up (different request counts) or hold no values.
    """
    field_ = {"ttft": "ttft_ms", "e2e": "e2e_ms", "itl": "itl_ms"}[kind]
    xb, xv = req_b.get(field_) or [], req_v.get(field_) or []
    if len(xb) != len(xv):
        raise ValueError(f"request counts differ: baseline {len(xb)}, variant {len(xv)}")
    keep = [i for i in range(len(xb)) if request_ok(req_b, i) and request_ok(req_v, i)]
    if kind == "itl":
        return stats.block_bootstrap_interval([xb[i] or [] for i in keep], [xv[i] or [] for i in keep],
                                              stat, s.confidence, n_resamples=s.bootstrap_resamples,
                                              seed=s.seed)
    keep = [i for i in keep if xb[i] is not None and xv[i] is not None and xb[i] > 0 and xv[i] > 0]
    return stats.paired_request_interval([xb[i] for i in keep], [xv[i] for i in keep], stat,
                                         s.confidence, n_resamples=s.bootstrap_resamples,
                                         seed=s.seed, method=s.bootstrap_method)


def _pct(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else 100.0 * x


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def compare_metric(view: RunView, suite: str, metric: str, info: MetricInfo, variant: str,
                   s: CompareSettings) -> tuple[dict, stats.Interval | None]:
    """One row of compare.json (without noise floor and verdict) and its interval."""
    notes: list[str] = []
    base_rep: list[float | None] = []
    var_rep: list[float | None] = []
    bad_cells = []
    pairs = []
    for k in range(view.repeats):
        cb, cv = view.cell(view.baseline, k), view.cell(variant, k)
        vb = cv_ = None
        for c in (cb, cv):
            if not c.suite_ok(suite):
                bad_cells.append(f"{c.variant}/rep{k}: {c.suite_status(suite)}")
            elif c.metric(suite, metric) is None:
                bad_cells.append(f"{c.variant}/rep{k}: no value")
        if cb.suite_ok(suite):
            vb = cb.metric(suite, metric)
        if cv.suite_ok(suite):
            cv_ = cv.metric(suite, metric)
        base_rep.append(vb)
        var_rep.append(cv_)
        if vb is not None and cv_ is not None:
            pairs.append((k, vb, cv_))
    bmed = _median([x for x in base_rep if x is not None])
    vmed = _median([x for x in var_rep if x is not None])
    n = len(pairs)
    iv: stats.Interval | None = None
    method = None
    has_zero = any(p[1] <= 0 or p[2] <= 0 for p in pairs)
    try:
        if has_zero and n >= 2:
            # counts that can be 0 (e.g. host syncs per call): no log ratio; paired differences
            iv = stats.t_interval_diff([p[1] for p in pairs], [p[2] for p in pairs], s.confidence)
        elif has_zero:
            method = "none (values <= 0 and 1 paired repeat)"
        elif n >= s.min_repeats_for_bootstrap:
            iv = stats.bootstrap_log_ratio([p[1] for p in pairs], [p[2] for p in pairs], s.confidence,
                                           n_resamples=s.bootstrap_resamples, seed=s.seed,
                                           method=s.bootstrap_method)
        elif n >= 2:
            iv = stats.t_interval_log_ratio([p[1] for p in pairs], [p[2] for p in pairs], s.confidence)
        elif n == 1:
            kind = within_cell_kind(metric) if suite == _serving_suite(view) else None
            if kind and s.within_cell_intervals:
                k = pairs[0][0]
                rb = read_requests(view.cell(view.baseline, k).suite_dir(suite))
                rv = read_requests(view.cell(variant, k).suite_dir(suite))
                if rb is None or rv is None:
                    method = "none (1 paired repeat; requests.json missing)"
                else:
                    iv = within_cell_interval(kind[0], kind[1], rb, rv, s)
                    notes.append("interval within one cell: request-to-request noise only, "
                                 "not run-to-run; use repeats >= 2 for that")
            else:
                method = "none (1 paired repeat; needs >= 2 repeats)"
        else:
            method = "none (no paired repeat)"
    except ValueError as e:
        iv = None
        method = f"none ({str(e)[:80]})"
    if iv is not None and not iv.ok:
        notes.append(f"interval could not be computed ({iv.method})")
    if iv is not None:
        change = iv.estimate
        method = iv.method
    elif bmed not in (None, 0) and vmed is not None:
        change = vmed / bmed - 1
    else:
        change = None
        if bmed == 0 and vmed is not None and vmed != 0:
            notes.append(f"baseline is 0, variant {vmed:g}: no relative change")
    if bad_cells:
        notes.append("incomplete cells: " + "; ".join(bad_cells))
    if n == 0 and not bad_cells:
        notes.append("no values")
    row = {
        "suite": suite, "metric": metric, "unit": info.unit, "better": info.better,
        "variant": variant, "baseline_median": bmed, "variant_median": vmed,
        "baseline_repeats": base_rep, "variant_repeats": var_rep, "n_pairs": n,
        "change_pct": _pct(change),
        "ci_low_pct": _pct(iv.low) if iv is not None and iv.ok else None,
        "ci_high_pct": _pct(iv.high) if iv is not None and iv.ok else None,
        "ci_method": method, "noise_floor_pct": None, "verdict": None,
        "aa": variant in view.aa_variants, "notes": notes,
        "_incomplete": bool(bad_cells) or n == 0,
    }
    return row, iv


def verdict_of(row: dict, iv: stats.Interval | None, floor: float | None) -> str:
    """Direction-aware verdict of one row (see module docstring)."""
    if row["_incomplete"]:
        return "incomplete"
    if iv is None or not iv.ok:
        return "no significant change"
    if not stats.is_significant(iv, floor):
        if stats.is_significant(iv, None) and floor is not None:
            row["notes"].append(f"interval excludes 0 but |change| {abs(iv.estimate) * 100:.2f}% "
                                f"is within the A/A noise floor {floor * 100:.2f}%")
        return "no significant change"
    if row["better"] == "none":
        return "changed"
    up = iv.estimate > 0
    return "improved" if up == (row["better"] == "higher") else "regressed"


# --------------------------------------------------------------------------- output identity

def _first_diff(a: str, b: str) -> int:
    """Index of the first character where a and b differ (len of the shorter when one is a prefix)."""
    return len(os.path.commonprefix([a, b]))


def serving_identity(view: RunView, variant: str, suite: str = "serving") -> dict | None:
    """Identical generated_text share between baseline and ``variant`` by request index.

    Requests that failed in either arm are left out (counted per repeat as ``failed_either``).
    Returns {"n", "identical", "share", "share_ci" [low, high] (Wilson), "repeats": [...],
    "first_diff": [{"repeat", "request", "char"}] (first 50), "first_diff_char_median"} or None
    when no repeat has requests.json in both arms.
    """
    n = ident = 0
    reps, diffs = [], []
    for k in range(view.repeats):
        cb, cv = view.cell(view.baseline, k), view.cell(variant, k)
        rb, rv = read_requests(cb.suite_dir(suite)), read_requests(cv.suite_dir(suite))
        if rb is None or rv is None:
            continue
        tb, tv = rb.get("generated_text") or [], rv.get("generated_text") or []
        m_all = min(len(tb), len(tv))
        idx = [i for i in range(m_all) if request_ok(rb, i) and request_ok(rv, i)]
        m = len(idx)
        same = 0
        for i in idx:
            a, b = tb[i] or "", tv[i] or ""
            if a == b:
                same += 1
            else:
                diffs.append({"repeat": k, "request": i, "char": _first_diff(a, b)})
        reps.append({"repeat": k, "n": m, "identical": same,
                     "share": same / m if m else None, "failed_either": m_all - m,
                     "count_mismatch": len(tb) != len(tv)})
        n += m
        ident += same
    if not reps or n == 0:
        return None
    chars = [d["char"] for d in diffs]
    return {"n": n, "identical": ident, "share": ident / n,
            "share_ci": list(stats.wilson_interval(ident, n)), "repeats": reps,
            "first_diff": diffs[:50],
            "first_diff_char_median": statistics.median(chars) if chars else None}


def _read_mmmu(suite_dir: Path) -> list[dict] | None:
    p = suite_dir / "records.jsonl"
    if not p.is_file():
        return None
    try:
        return records.read_jsonl(p)
    except (OSError, ValueError):
        return None


def pair_mmmu_records(ra: list[dict], rb: list[dict]) -> dict:
    """Question-by-question pairing of two MMMU cells (baseline ``ra``, variant ``rb``), by ``id``.

    Returns {"n", "acc_a", "acc_b", "right_to_wrong", "wrong_to_right", "flips",
    "mcnemar_p" (exact binomial McNemar, statsmodels), "identical_responses",
    "identical_share", "subjects": {subject: {"n", "acc_a", "acc_b", "right_to_wrong",
    "wrong_to_right"}}}. ``acc_*`` count verdict == "correct" over the paired questions.
    """
    from statsmodels.stats.contingency_tables import mcnemar
    a = {r["id"]: r for r in ra if "id" in r}
    b = {r["id"]: r for r in rb if "id" in r}
    ids = [i for i in a if i in b]
    tab = [[0, 0], [0, 0]]  # rows: baseline correct/wrong; cols: variant correct/wrong
    subjects: dict[str, dict] = {}
    ident = 0
    for i in ids:
        ca, cb = a[i].get("verdict") == "correct", b[i].get("verdict") == "correct"
        tab[0 if ca else 1][0 if cb else 1] += 1
        ident += (a[i].get("response") == b[i].get("response"))
        sub = subjects.setdefault(str(a[i].get("subject", "?")),
                                  {"n": 0, "correct_a": 0, "correct_b": 0,
                                   "right_to_wrong": 0, "wrong_to_right": 0})
        sub["n"] += 1
        sub["correct_a"] += ca
        sub["correct_b"] += cb
        sub["right_to_wrong"] += ca and not cb
        sub["wrong_to_right"] += cb and not ca
    n = len(ids)
    for sub in subjects.values():
        sub["acc_a"] = sub["correct_a"] / sub["n"]
        sub["acc_b"] = sub["correct_b"] / sub["n"]
    r2w, w2r = tab[0][1], tab[1][0]
    p = float(mcnemar(tab, exact=True).pvalue) if n else None
    return {"n": n, "acc_a": (tab[0][0] + tab[0][1]) / n if n else None,
            "acc_b": (tab[0][0] + tab[1][0]) / n if n else None,
            "right_to_wrong": r2w, "wrong_to_right": w2r, "flips": r2w + w2r, "mcnemar_p": p,
            "identical_responses": ident, "identical_share": ident / n if n else None,
            "subjects": dict(sorted(subjects.items()))}


#: our key -> the names suites.mmmu.pair may use for it (its values win where present)
_PAIR_KEYS = {"identical_share": ("identical_share", "identical_response_share"),
              "identical_responses": ("identical_responses",),
              "mcnemar_p": ("mcnemar_p", "mcnemar_pvalue"),
              "n": ("n_paired", "n"),
              "acc_a": ("acc_a",), "acc_b": ("acc_b",),
              "right_to_wrong": ("right_to_wrong",), "wrong_to_right": ("wrong_to_right",)}


def mmmu_pairs(view: RunView, variant: str, suite: str = "mmmu") -> dict | None:
    """MMMU pairing of baseline and ``variant`` for repeat 0 (the first repeat both have).

    Uses ``suites.mmmu.pair(records_a, records_b)`` when the suite exposes it (its result under
    "pair"; its identical share, McNemar p and flips override ours where it names them), and
    :func:`pair_mmmu_records` for the per-subject table and as the fallback.
    """
    for k in range(view.repeats):
        ra = _read_mmmu(view.cell(view.baseline, k).suite_dir(suite))
        rb = _read_mmmu(view.cell(variant, k).suite_dir(suite))
        if ra is None or rb is None:
            continue
        out = {"repeat": k, "source": "patchbench.compare.pair_mmmu_records"}
        out.update(pair_mmmu_records(ra, rb))
        try:
            pair = getattr(load_suite("mmmu"), "pair", None)
        except Exception:
            pair = None
        if callable(pair):
            try:
                theirs = pair(ra, rb)
                theirs = theirs.model_dump() if hasattr(theirs, "model_dump") else theirs
                if isinstance(theirs, dict):
                    theirs = dict(theirs)
                    if isinstance(theirs.get("changed"), list):
                        theirs["changed"] = theirs["changed"][:20]
                    out["pair"] = theirs
                    out["source"] = "patchbench.suites.mmmu.pair"
                    for key, names in _PAIR_KEYS.items():
                        for nm in names:
                            if isinstance(theirs.get(nm), (int, float)) and not isinstance(theirs.get(nm), bool):
                                out[key] = theirs[nm]
                                break
                    out["flips"] = out["right_to_wrong"] + out["wrong_to_right"]
            except Exception as e:
                out["pair_error"] = f"patchbench.suites.mmmu.pair failed: {type(e).__name__}: {e}"
        return out
    return None


def output_identity(view: RunView, s: CompareSettings, rows: list[dict]) -> dict:
    """Per variant: serving identity, MMMU identical share, retokenized-count change, verdict.

    Judged against the A/A share (the smallest serving identical share among A/A variants) when
    A/A variants exist, else against 100 % (the CPU engine is deterministic). ``flag`` is True when
    the share is below the reference by more than ``identity_share_tolerance``, or the retokenized
    output-token count moved by more than ``retokenized_change_share``.
    """
    serving = _serving_suite(view)
    per = {}
    for v in view.variants[1:]:
        per[v] = {"serving": serving_identity(view, v, serving) if serving else None}
    aa_shares = [per[v]["serving"]["share"] for v in view.aa_variants if per[v]["serving"]]
    for v in view.variants[1:]:
        d = per[v]
        if v in view.aa_variants or not aa_shares:
            ref, ref_name = 1.0, "100% (deterministic engine)"
        else:
            ref = min(aa_shares)
            ref_name = "A/A share"
        d["reference_share"], d["reference"] = ref, ref_name
        reasons = []
        sv = d["serving"]
        if sv and sv["share"] < ref - s.identity_share_tolerance:
            ref_txt = ref_name if ref_name != "A/A share" else f"A/A share {ref * 100:.1f}%"
            reasons.append(f"serving: {sv['share'] * 100:.1f}% of requests identical "
                           f"(reference: {ref_txt})")
        retok = [r for r in rows if r["variant"] == v and "retokenized" in r["metric"]
                 and r["baseline_median"] and r["variant_median"] is not None]
        d["retokenized"] = None
        for r in retok:
            ch = r["variant_median"] / r["baseline_median"] - 1
            d["retokenized"] = {"metric": r["metric"], "baseline": r["baseline_median"],
                                "variant": r["variant_median"], "change_pct": ch * 100}
            if abs(ch) > s.retokenized_change_share:
                reasons.append(f"{r['metric']} changed by {ch * 100:+.2f}%")
        d["flag"] = bool(reasons)
        d["reasons"] = reasons
    return per


# --------------------------------------------------------------------------- main entry

def settings_of(view: RunView) -> CompareSettings:
    """The run's ``compare:`` settings from its manifest (defaults where absent)."""
    return CompareSettings.model_validate((view.manifest.get("config") or {}).get("compare") or {})


def compare_view(view: RunView, settings: CompareSettings | None = None) -> dict:
    """The compare.json dict of a :class:`RunView` (writes nothing)."""
    s = settings or settings_of(view)
    out_rows: list[dict] = []
    notes = list(view.notes)
    aa_ivs: dict[tuple[str, str], list[stats.Interval]] = {}
    pending: list[tuple[dict, stats.Interval | None]] = []
    for suite in view.suites:
        seen: list[str] = []
        for c in view.cells.values():
            for m in ((c.summaries.get(suite) or {}).get("metrics") or {}):
                if m not in seen:
                    seen.append(m)
        metrics, mnotes = suite_metrics(suite, seen)
        notes += mnotes
        # A/A variants first so that their intervals give the floor for the others
        order = [v for v in view.variants[1:] if v in view.aa_variants] + \
                [v for v in view.variants[1:] if v not in view.aa_variants]
        for metric, info, declared in metrics:
            for v in order:
                try:
                    row, iv = compare_metric(view, suite, metric, info, v, s)
                except Exception as e:  # one bad metric must not lose the others
                    row = {"suite": suite, "metric": metric, "unit": info.unit, "better": info.better,
                           "variant": v, "baseline_median": None, "variant_median": None,
                           "baseline_repeats": [], "variant_repeats": [], "n_pairs": 0,
                           "change_pct": None, "ci_low_pct": None, "ci_high_pct": None,
                           "ci_method": None, "noise_floor_pct": None, "verdict": None,
                           "aa": v in view.aa_variants,
                           "notes": [f"comparison failed: {type(e).__name__}: {e}",
                                     traceback.format_exc(limit=2).splitlines()[-1]],
                           "_incomplete": True}
                    iv = None
                if not declared:
                    row["notes"].append("direction guessed from the metric name")
                if v in view.aa_variants and iv is not None:
                    aa_ivs.setdefault((suite, metric), []).append(iv)
                pending.append((row, iv))
    for row, iv in pending:
        floor = None
        if not row["aa"]:
            floor = stats.noise_floor(aa_ivs.get((row["suite"], row["metric"]), []),
                                      source=s.noise_floor_from)
        row["noise_floor_pct"] = _pct(floor)
        row["verdict"] = verdict_of(row, iv, floor)
        row.pop("_incomplete")
        out_rows.append(row)
    # rows in a stable order: suite, metric as declared, variant as configured
    vorder = {v: i for i, v in enumerate(view.variants)}
    sorder = {x: i for i, x in enumerate(view.suites)}
    morder: dict[tuple[str, str], int] = {}
    for row, _ in pending:
        morder.setdefault((row["suite"], row["metric"]), len(morder))
    out_rows.sort(key=lambda r: (sorder.get(r["suite"], 99), morder[(r["suite"], r["metric"])],
                                 vorder.get(r["variant"], 99)))
    cells = []
    warnings: dict[str, dict[str, list[str]]] = {}
    for (v, k), c in sorted(view.cells.items(), key=lambda x: (vorder.get(x[0][0], 99), x[0][1])):
        cells.append({"variant": v, "repeat": k, "status": c.status, "error": c.error,
                      "suites": {x: c.suite_status(x) for x in view.suites}})
        for x in view.suites:
            sm = c.summaries.get(x) or {}
            for line in list(sm.get("warnings") or []) + list(sm.get("errors") or []):
                warnings.setdefault(x, {}).setdefault(v, []).append(f"rep{k}: {line}")
            if c.status == "ok" and x not in c.summaries:
                warnings.setdefault(x, {}).setdefault(v, []).append(f"rep{k}: no summary.json")
        if c.status != "ok":
            for x in view.suites:
                warnings.setdefault(x, {}).setdefault(v, []).append(
                    f"rep{k}: cell {c.status}" + (f" ({c.error})" if c.error else ""))
    mm = {}
    if "mmmu" in view.suites:
        for v in view.variants[1:]:
            p = mmmu_pairs(view, v)
            if p is not None:
                mm[v] = p
    ident = output_identity(view, s, out_rows)
    for v, d in ident.items():
        if v in mm:
            d["mmmu_identical_share"] = mm[v].get("identical_share")
    sync = {}
    if "sync_probe" in view.suites:
        for v in view.variants:
            for k in range(view.repeats):
                c = view.cell(v, k)
                sm = c.summaries.get("sync_probe")
                if sm is not None:
                    probe = None
                    pj = c.suite_dir("sync_probe") / "probe.json"
                    if pj.is_file():
                        try:
                            probe = records.read_json(pj)
                        except (OSError, ValueError):
                            probe = None
                    sync[v] = {"repeat": k, "status": sm.get("status"), "metrics": sm.get("metrics"),
                               "probe": probe}
                    break
    return {"schema": SCHEMA, "run_id": view.run_id, "baseline": view.baseline,
            "variants": view.variants[1:], "aa_variants": view.aa_variants,
            "repeats": view.repeats, "suites": view.suites,
            "settings": s.model_dump(), "metrics": out_rows, "cells": cells,
            "schedule": view.schedule, "cell_warnings": warnings, "mmmu_pairs": mm,
            "output_identity": ident, "sync_probe": sync, "notes": notes}


def compare_run(run_dir: str | os.PathLike, settings: CompareSettings | None = None) -> dict:
    """Compare every variant of ``run_dir`` with its baseline; write and return compare.json.

    settings: None -> the run's own ``compare:`` section (defaults where absent).
    Raises FileNotFoundError when the run has no manifest.json.
    """
    view = load_run(run_dir)
    out = compare_view(view, settings)
    records.write_json(Path(run_dir) / "compare.json", out)
    return out
