"""End to end: `runner.py bench` on the CPU demo configs against REAL sglang servers.

One run per release per session (the demo_0513 and demo_0523 fixtures of tests/conftest.py),
shared by every assertion:
- sglang 0.5.1.post3 (this environment): configs/demo-cpu.yaml, stock vs the upstream change of
  PR #9460 vs ours, 2 interleaved repeats, all suites;
- sglang 0.5.23 (.venv-0.5.23, run as a subprocess with that environment's python):
  configs/demo-cpu-0.5.23.yaml, stock vs ours, its serving point as a one-point sweep.
What is checked: the results folder (manifest, cells, suite files parse; one untimed correctness
cell per variant, and timed cells that carry no instrumentation), every server stopped (no process
of its group alive, port closed), --resume does nothing, the patched decode path ran on batches of
>= 2 requests with images carrying non-zero mrope deltas and matched the stock method on every
batch (the sync_probe suite's in-server cross-check, recorded in the correctness cells), the
profile suite's live-server traces (stock 0.5.1.post3 syncs inside the mrope range on every decode
step, more with a larger batch; ours none), greedy outputs token-identical between variants, and
the report exists.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from patchbench.records import read_json, read_jsonl
from patchbench.run.ports import port_answers

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def _cells(run_dir: Path) -> list[dict]:
    """The timed cells of the run (manifest order)."""
    return [c for c in read_json(run_dir / "manifest.json")["cells"] if c["cell_kind"] == "timed"]


def _correctness(run_dir: Path) -> dict[str, dict]:
    """{variant: manifest entry} of the untimed correctness cells."""
    return {
        c["variant"]: c
        for c in read_json(run_dir / "manifest.json")["cells"]
        if c["cell_kind"] == "correctness"
    }


@pytest.mark.parametrize("which", ["demo_0513", "demo_0523"])
def test_results_folder_and_servers_stopped(which, request):
    run_dir = request.getfixturevalue(which)
    man = read_json(run_dir / "manifest.json")
    cfg = man["config"]
    n_timed = len(cfg["variants"]) * cfg["schedule"]["repeats"]
    assert len(man["cells"]) == n_timed + len(cfg["variants"])  # + one correctness cell each
    assert [c["variant"] for c in man["cells"][: len(cfg["variants"])]] == list(cfg["variants"])
    assert all(c["status"] == "ok" for c in man["cells"]), man["cells"]
    assert man["ended_at"] and man["git_sha"]
    # timed cells carry no instrumentation and never run the (untimed) profile suite
    timed = [c for c in man["cells"] if c["cell_kind"] == "timed"]
    corr = [c for c in man["cells"] if c["cell_kind"] == "correctness"]
    assert len(timed) == n_timed and all(c["instrumented"] is False for c in timed)
    assert all(
        c["instrumented"] is True and c["dir"] == f"{c['variant']}/correctness" for c in corr
    )
    for c in man["cells"]:
        cdir = run_dir / c["dir"]
        cell = read_json(cdir / "cell.json")
        assert cell["status"] == "ok"
        # timed: every timed suite; correctness: the instrumented (sync_probe's cross-check) and
        # untimed (profile) suites only; profile sends the traffic (patchbench/run/cell.py cell_suites)
        # (a timed suite runs in the timed cells of its rounds: traffic in round 0 only)
        rounds = man["suite_rounds"]  # timed suites: [round, ...]; untimed: "correctness"
        want = (
            {s for s, r in rounds.items() if isinstance(r, list) and c["repeat"] in r}
            if c["cell_kind"] == "timed"
            else {"sync_probe", "profile"}
        )
        assert set(cell["suites"]) == want, (c["dir"], cell["suites"])
        if c["cell_kind"] == "timed":
            assert cell["instrumentation"] == {} and cell["instrumented"] is False
            assert "--disable-overlap-schedule" not in cell["server"]["command"]
        else:  # the profiler needs the forward pass in the thread it starts in
            assert "--disable-overlap-schedule" in cell["server"]["command"]
        events = [e["event"] for e in cell["server"]["events"]]
        assert events[0] == "launched" and "ready" in events and events[-1] == "stopped"
        stopped = cell["server"]["events"][-1]
        assert stopped["survivors"] == [] and stopped["port_open"] is False
        pgid = cell["server"]["pid"]
        for p in psutil.process_iter(["pid"]):
            try:
                assert os.getpgid(p.pid) != pgid or p.status() == psutil.STATUS_ZOMBIE
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        for suite in want:
            s = read_json(cdir / suite / "summary.json")
            assert s["status"] == "ok", (c["dir"], suite, s["errors"])
            assert s["metrics"]
    assert not port_answers("127.0.0.1", cfg["server"]["port"])
    assert (run_dir / "compare.json").exists() and (run_dir / "report.md").exists()
    assert list((run_dir / "plots").glob("*.png"))


@pytest.mark.parametrize("which", ["demo_0513", "demo_0523"])
def test_patched_decode_path_ran_on_mixed_image_batches_and_matched_stock(which, request):
    """The patched method ran in the server on decode batches of >= 2 requests
    that include image requests with non-zero mrope deltas, and the stock method, run on the same
    batch, gave the same positions every time."""
    run_dir = request.getfixturevalue(which)
    corr = _correctness(run_dir)
    assert set(corr) == set(read_json(run_dir / "manifest.json")["config"]["variants"])
    for c in corr.values():
        rec = read_json(run_dir / c["dir"] / "cell.json")["instrumentation"]["sync_probe"]
        assert rec["processes"] >= 1 and not rec["unreadable"], (c["dir"], rec)
        probe = rec["counts"]
        assert probe.get("decode_multi_image_calls", 0) > 0, (c["dir"], probe)
        assert probe.get("crosscheck_decode_equal", 0) >= probe["decode_calls"] > 0
        assert probe.get("crosscheck_decode_mismatch", 0) == 0
        assert probe.get("crosscheck_extend_mismatch", 0) == 0
        assert probe.get("decode_live_errors", 0) == 0
        print(
            c["dir"],
            {
                k: probe[k]
                for k in ("decode_calls", "decode_multi_image_calls", "crosscheck_decode_equal")
            },
        )


@pytest.mark.parametrize("which", ["demo_0513", "demo_0523"])
def test_greedy_outputs_identical_between_variants(which, request):
    """Stock and patched produce token-identical greedy outputs: every serving request's text
    (bench_serving --output-details, paired by index) and every MMMU response."""
    run_dir = request.getfixturevalue(which)
    cells = _cells(run_dir)
    base = next(c for c in cells if c["variant"] == "baseline" and c["repeat"] == 0)
    b_pts = _serving_requests(run_dir / base["dir"])
    b_mmmu = _mmmu_responses(run_dir / base["dir"])
    assert sum(len(r["generated_text"]) for r in b_pts.values()) >= 20
    assert all(len(x) >= 60 for x in b_mmmu.values())
    for c in cells:
        # MMMU: every demo question at each concurrency, token-identical (0.5.23's demo sends
        # them one at a time: its CPU engine's batched decoding is not bit-deterministic)
        assert _mmmu_responses(run_dir / c["dir"]) == b_mmmu, c["dir"]
        pts = _serving_requests(run_dir / c["dir"])
        assert set(pts) == set(b_pts), c["dir"]
        for k, req in pts.items():
            b_req = b_pts[k]
            same = sum(
                a == b for a, b in zip(req["generated_text"], b_req["generated_text"], strict=True)
            )
            if which == "demo_0513":  # 0.5.1.post3's CPU engine: identical even when batched
                assert req["generated_text"] == b_req["generated_text"], (c["dir"], k)
            else:  # batched at concurrency 8 (the decode path under test needs batches)
                assert same >= 0.9 * len(b_req["generated_text"]), (c["dir"], k, same)
    ident = read_json(run_dir / "compare.json").get("output_identity", {})
    print(json.dumps(ident)[:1000])


def _mmmu_responses(cell_dir: Path) -> dict[str, dict[str, str]]:
    """{concurrency key: {question id: response}} of a cell's MMMU suite; key "" for one
    concurrency."""
    d = cell_dir / "mmmu"
    dirs = {"": d} if (d / "records.jsonl").exists() else {p.name: p for p in d.glob("c*")}
    return {
        k: {r["id"]: r["response"] for r in read_jsonl(p / "records.jsonl")}
        for k, p in sorted(dirs.items())
    }


def test_mmmu_at_two_concurrencies_0513(demo_0513):
    """configs/demo-cpu.yaml's MMMU at concurrencies 1 and 8 in every timed cell: both
    accuracies, the answers changed between them counted from the records, a row per
    concurrency in compare.json and report.md's line per variant and concurrency."""
    for c in _cells(demo_0513):
        m = read_json(demo_0513 / c["dir"] / "mmmu" / "summary.json")["metrics"]
        resp = _mmmu_responses(demo_0513 / c["dir"])
        assert set(resp) == {"c1", "c8"} and m["mmmu_asked_count@c1"] == len(resp["c1"]) >= 60
        assert 0 <= m["mmmu_overall_acc@c1"] <= 1 and 0 <= m["mmmu_overall_acc@c8"] <= 1
        diff = sum(resp["c1"][i] != resp["c8"][i] for i in resp["c1"])
        assert m["mmmu_batch_changed_count@c8"] == diff, c["dir"]
        print(c["dir"], m["mmmu_overall_acc@c1"], m["mmmu_overall_acc@c8"], diff)
    rows = read_json(demo_0513 / "compare.json")["rows"]
    variants = list(read_json(demo_0513 / "manifest.json")["config"]["variants"])[1:]
    for name in ("mmmu_overall_acc@c1", "mmmu_overall_acc@c8"):
        assert {r["variant"] for r in rows if r["metric"] == name} == set(variants), name
    report = (demo_0513 / "report.md").read_text()
    for v in variants:
        assert f"| {v} | 1 | 2 |" in report and f"| {v} | 8 | 2 |" in report, v
    assert "Answers changed from concurrency 1 to 8 (same cell), per repeat: baseline " in report


def _serving_requests(cell_dir: Path) -> dict[str, dict]:
    """{point key: requests.json} of a cell's serving suite; key "" without a load sweep."""
    pts = cell_dir / "serving" / "points"
    if not pts.is_dir():
        return {"": read_json(cell_dir / "serving" / "requests.json")}
    return {d.name: read_json(d / "requests.json") for d in sorted(pts.iterdir())}


def test_demo_sweep_points_0513(demo_0513):
    """The demo's two-point sweep (concurrency 8 with 24 prompts, 1 with 4) in one client process
    a cell: the order and its seed, per-point metrics under their names and the curve metrics,
    both points' records (every request answered), the primaries compared, the load-curve report
    section and the curve figures."""
    for c in _cells(demo_0513):
        sdir = demo_0513 / c["dir"] / "serving"
        summary = read_json(sdir / "summary.json")
        assert summary["status"] == "ok", summary["errors"]
        sweep = summary["meta"]["sweep"]
        assert sorted(sweep["order"]) == ["c1", "c8"] and isinstance(sweep["order_seed"], int)
        for k, n in (("c1", 4), ("c8", 24)):
            req = read_json(sdir / "points" / k / "requests.json")
            assert len(req["status"]) == n and set(req["status"]) == {"ok"}, (c["dir"], k)
            assert read_json(sdir / "points" / k / "point.json")["rc"] == 0
            assert summary["metrics"][f"output_throughput_tok_s@{k}"] > 0
            assert summary["metrics"][f"goodput_req_s@{k}"] >= 0
            # ITL is measured, or withheld as reads of bunched chunks (never both, never neither)
            withheld = (summary["meta"].get("not_judged") or {}).get(f"itl_median_ms@{k}")
            assert (f"itl_median_ms@{k}" in summary["metrics"]) != bool(withheld), withheld
        assert "output_throughput_tok_s" not in summary["metrics"]
        assert "goodput_at_slo_req_s" in summary["metrics"]
        assert sweep["max_load_at_slo"]["answer"] in ("within the sweep", "beyond the sweep")
        assert (sdir / "multi_point" / "stdout.txt").read_text().count("exit 0") == 2
    prim = {r["metric"] for r in read_json(demo_0513 / "compare.json")["rows"] if r["primary"]}
    assert {"output_throughput_tok_s@c8", "itl_median_ms@c1", "goodput_at_slo_req_s"} <= prim
    report = (demo_0513 / "report.md").read_text()
    details = (demo_0513 / "report-details.md").read_text()
    assert "## Load curve (serving)" in report and "[point c1]" in details
    for png in ("curve_latency.png", "curve_change.png", "curve_frontier.png", "pr_figure.png"):
        assert (demo_0513 / "plots" / png).stat().st_size > 10_000


def test_goodput_matches_the_tools_own_0523(demo_0523):
    """0.5.23's bench_serving computes goodput itself (``--goodput``, which the serving suite
    passes at a sweep's points where the release has the flag). Its rule
    (sglang/benchmark/goodput.py): a request is good when it succeeded, TTFT <= the TTFT bound and
    TPOT = (latency - TTFT) / (output tokens - 1) <= the TPOT bound (0 for one token); goodput =
    good requests / the benchmark's duration. Ours (patchbench/suites/serving/curve.py) is the same rule on
    our requests.json, except that our E2E is the last token's time (TTFT + the ITLs) while the
    tool's latency runs to the stream's end, so our TPOT is never larger: TTFT attainment must
    match exactly, TPOT attainment and goodput exactly unless a request's TPOT lies just under
    the bound (then ours may only be higher)."""
    from patchbench.suites.serving.curve import goodput_req_s, request_tpot_ms
    from patchbench.suites.serving.parse import read_result_line
    from patchbench.suites.serving.sweep import Slo

    for c in _cells(demo_0523):
        sdir = demo_0523 / c["dir"] / "serving"
        summary = read_json(sdir / "summary.json")
        assert summary["status"] == "ok", summary["errors"]
        sweep = summary["meta"]["sweep"]
        slo = Slo.model_validate(sweep["slo"])
        for k, point in sweep["points"].items():
            tool = read_result_line(sdir / "points" / k / "result.jsonl")
            assert tool["goodput_slos_ms"] == {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms}
            assert point["tool_goodput_req_s"] == tool["request_goodput"]
            recs = read_json(sdir / "points" / k / "requests.json")
            # every request streamed tokens: the tool's successes are our "ok" requests
            assert set(recs["status"]) == {"ok"}, (c["dir"], k)
            ours = summary["metrics"][f"goodput_req_s@{k}"]
            assert ours == goodput_req_s(recs, tool["duration"], slo)
            n_ttft = sum(t <= slo.ttft_ms for t in recs["ttft_ms"])
            want = tool["slo_attainment_by_metric"]["ttft"] * len(recs["ttft_ms"])
            assert n_ttft == pytest.approx(want, abs=1e-6), (c["dir"], k)
            tpot = [0.0 if t is None else t for t in request_tpot_ms(recs)]  # 1 token: 0
            n_tpot = sum(t <= slo.tpot_ms for t in tpot)
            tool_tpot = tool["slo_attainment_by_metric"]["tpot"] * len(tpot)
            borderline = any(0.9 * slo.tpot_ms < t <= slo.tpot_ms for t in tpot)
            print(c["dir"], k, "goodput", ours, tool["request_goodput"], "TTFT met", n_ttft)
            print("  TPOT met", n_tpot, tool_tpot, "borderline", borderline)
            if borderline:  # our TPOT is never larger: only ours may be higher
                assert n_tpot >= tool_tpot - 1e-6
                assert ours >= tool["request_goodput"] - 1e-9
            else:
                assert n_tpot == pytest.approx(tool_tpot, abs=1e-6), (c["dir"], k)
                assert ours == pytest.approx(tool["request_goodput"], rel=1e-9)
            assert not any("--goodput" in w for w in summary["warnings"]), summary["warnings"]


def _profile_steps(run_dir: Path, variant: str) -> list[dict]:
    return read_jsonl(run_dir / variant / "correctness" / "profile" / "steps.jsonl")


def _mrope_syncs_by_batch(steps: list[dict]) -> dict[int, list[int]]:
    """{decode batch size: mrope syncs of each step that ran the mrope computation}."""
    out: dict[int, list[int]] = {}
    for s in steps:
        if s.get("batch_size") is not None and s.get("mrope_ranges", 0) > 0:
            out.setdefault(int(s["batch_size"]), []).append(int(s["mrope_syncs"]))
    return out


def test_profile_stock_mrope_syncs_grow_with_batch_size_0513(demo_0513):
    """Stock 0.5.1.post3 reads on the host inside the mrope computation of every decode step,
    more with a larger batch (docs/profile.md measured 2 per request); the profile suite ran
    at concurrency 1 and 3."""
    by = _mrope_syncs_by_batch(_profile_steps(demo_0513, "baseline"))
    print("stock mrope syncs by batch size", {k: sorted(set(v)) for k, v in by.items()})
    assert 1 in by and 3 in by, by
    med = {bs: statistics.median(v) for bs, v in by.items()}
    assert med[1] > 0 and med[3] > med[1]
    summ = read_json(demo_0513 / "baseline" / "correctness" / "profile" / "summary.json")
    assert summ["status"] == "ok" and summ["metrics"]["mrope_syncs_per_decode_step"] > 0


def test_profile_ours_has_no_sync_inside_the_mrope_range_0513(demo_0513):
    by = _mrope_syncs_by_batch(_profile_steps(demo_0513, "mrope-sync-free"))
    print("mrope-sync-free mrope syncs by batch size", {k: sorted(set(v)) for k, v in by.items()})
    assert sum(len(v) for v in by.values()) > 0  # the mrope range ran in decode steps
    assert all(x == 0 for v in by.values() for x in v), by
    summ = read_json(demo_0513 / "mrope-sync-free" / "correctness" / "profile" / "summary.json")
    assert summ["metrics"]["mrope_syncs_per_decode_step"] == 0


def test_profile_0523_reads_are_the_same_in_stock_and_ours_on_the_cpu(demo_0523):
    """0.5.23 reads each request's mrope delta with ``.item()`` in stock and ours alike; the delta
    is a host tensor, so on a GPU that read is no sync (stock's sync there is the blocking pageable
    host-to-device copy, which the patch makes non-blocking). On the CPU engine every tensor is a
    host tensor and a copy never blocks, so the CPU trace cannot tell the two apart: the counts
    per batch size must be equal, and larger with the batch (docs/profile.md, Limits)."""
    stock = _mrope_syncs_by_batch(_profile_steps(demo_0523, "baseline"))
    ours = _mrope_syncs_by_batch(_profile_steps(demo_0523, "mrope-sync-free"))
    print("0.5.23 mrope reads by batch size", stock, ours)
    assert stock and set(stock) == set(ours)
    med = {bs: (statistics.median(stock[bs]), statistics.median(ours[bs])) for bs in stock}
    assert all(a == b for a, b in med.values()), med
    assert med[max(med)][0] > med[min(med)][0]


def test_sync_probe_catches_stock_and_clears_ours_0513(demo_0513):
    run_dir = demo_0513
    by = {
        c["variant"]: read_json(run_dir / c["dir"] / "sync_probe" / "summary.json")["metrics"]
        for c in _cells(run_dir)
        if c["repeat"] == 0
    }
    assert by["baseline"]["sync_d2h_reads_count"] > 0
    assert by["mrope-sync-free"]["sync_d2h_reads_count"] == 0
    assert by["mrope-sync-free"]["sync_blocking_h2d_copies_count"] == 0


def test_resume_does_nothing(demo_0513):
    run_dir = demo_0513
    before = {p: p.stat().st_mtime_ns for p in run_dir.glob("*/*/cell.json")}
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "runner.py"),
            "bench",
            "configs/demo-cpu.yaml",
            "--resume",
            str(run_dir),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert "starting server" not in p.stdout
    assert {p: p.stat().st_mtime_ns for p in run_dir.glob("*/*/cell.json")} == before
    assert any("correctness" in str(p) for p in before)


def test_harness_overhead_recorded(demo_0513):
    t = read_json(demo_0513 / "manifest.json")["timings_s"]
    print("timings", t)
    assert (
        0 <= t["harness_overhead_share"] < 0.5
    )  # goal < 2% on a quiet machine (README "Measured"); CI shares its cores
    b = t["overhead_breakdown_s"]
    assert sum(b.values()) == pytest.approx(t["harness_overhead_share"] * t["total"], abs=0.05)
    # the fast stop on a real sglang server: SIGTERM, 0.05 s, SIGKILL, port free; a 1 s grace
    # (sglang's front end ignores SIGTERM for up to 5 s) made every stop last over 1 s. The
    # median, so that one stop slowed by a loaded machine (1.16 s seen at load 10) is no failure
    stops = [read_json(c)["timings_s"]["server_stop"] for c in demo_0513.glob("*/*/cell.json")]
    assert len(stops) == 9 and statistics.median(stops) < 1.0, stops


def test_traffic_workloads_were_flushed_primed_and_measured(demo_0513):
    """configs/demo-cpu.yaml's traffic suite (round 0): each workload's prime sent one request per
    prefix group before its measured requests, all of them answered, metrics named per workload."""
    man = read_json(demo_0513 / "manifest.json")
    cells = [c for c in man["cells"] if c["cell_kind"] == "timed" and c["repeat"] == 0]
    assert len(cells) == len(man["config"]["variants"])
    # report.md shows each workload per variant (patchbench/suites/traffic/render.py)
    section = (demo_0513 / "report.md").read_text().split("## Traffic workloads (traffic)")[1]
    for v in man["config"]["variants"]:
        if v != man["config"]["baseline"]:
            assert f"| {v} | shared-prefix | 8 |" in section and f"| {v} | chat | 8 |" in section
    for c in cells:
        s = read_json(demo_0513 / c["dir"] / "traffic" / "summary.json")
        assert s["status"] == "ok", s["errors"]
        m, wl = s["metrics"], s["meta"]["workloads"]
        # shared-prefix: 2 groups x 4 prompts, primed with one request per group
        assert m["completed_count@shared-prefix"] == 8 == m["requested_count@shared-prefix"]
        assert wl["shared-prefix"]["primed"]["requests"] == 2
        assert wl["shared-prefix"]["primed"]["completed"] == 2
        # chat: 4 conversations x 2 turns; the first three share one system prompt, the fourth has
        # another (patchbench/suites/traffic/data/conversations.jsonl): one prime each
        assert m["completed_count@chat"] == 8 and wl["chat"]["primed"]["requests"] == 2
        assert "ttft_median_ms@chat" in m and "output_throughput_tok_s@shared-prefix" in m
        for w in wl.values():
            assert w["flushed"] and w["window"]["before"]["unix_s"] < w["window"]["after"]["unix_s"]
        # the hit rate from the server's own counters over each measured call: a primed 64-token
        # prefix of prompts of about 72 tokens is mostly cached (the server log's #cached-token
        # read 89 % on such a run, docs/traffic.md). The counters rose by the 8 measured prompts
        # only: at least the tool's own token count of them (the server's count adds each
        # prompt's special tokens: 12 more a prompt here), less than with the prime's 2 requests
        # (each a ~64-token prefix) or a warm-up request (a whole prompt) inside the window
        win = wl["shared-prefix"]["window"]
        grew = win["after"]["prompt_tokens"] - win["before"]["prompt_tokens"]
        lens = read_json(demo_0513 / c["dir"] / "traffic" / "shared-prefix" / "requests.json")[
            "input_len"
        ]
        assert sum(lens) <= grew < sum(lens) + 12 * len(lens) + min(lens), (grew, lens)
        assert 50 <= m["prefix_cache_hit_pct@shared-prefix"] <= 100
        assert 0 <= m["prefix_cache_hit_pct@chat"] <= 100
        recs = read_json(demo_0513 / c["dir"] / "traffic" / "chat" / "requests.json")
        assert recs["status"] == ["ok"] * 8
        # (turn, conversation) order: each conversation's second turn repeats its first
        assert all(recs["input_len"][i + 4] > recs["input_len"][i] for i in range(4))
