"""The profile suite on real CPU traces of sglang 0.5.1.post3 (tests/data/profile: 3 decode steps
each, recorded from the tiny Qwen2.5-VL on the CPU engine with this suite's ranges, overlap schedule
off), its in-server ranges under a real torch profiler, and its comparison hooks."""

import types
from pathlib import Path

import pytest

from patchbench.records import write_json, write_jsonl
from patchbench.suite import get_suite
from patchbench.suites.profile import pair_cells, report_section
from patchbench.suites.profile import trace as T

DATA = Path(__file__).parent.parent / "data" / "profile"
HOOK = (
    Path(__file__).resolve().parents[2]
    / "patchbench/suites/profile/instr/patchbench_profile_instr.py"
)


@pytest.mark.parametrize(
    "tag,bs,mrope,total",
    [
        # stock 0.5.1.post3 reads int(seq_lens[i]) twice per request in mrope decode: 2 x bs;
        # torch_native attention reads 2 values per request per step elsewhere (2 layers): 4 x bs
        ("stock", 1, 2, 6),
        ("stock", 3, 6, 18),
        ("mrope-sync-free", 1, 0, 4),
        ("mrope-sync-free", 3, 0, 12),
    ],
)
def test_real_cpu_traces(tag, bs, mrope, total):
    a = T.analyze(T.load_events(DATA / f"cpu-0.5.1.post3-{tag}-c{bs}.trace.json.gz"))
    assert a.source == "patchbench" and not a.has_gpu and len(a.steps) == 3
    for s in a.steps:
        assert s.batch_size == bs and s.mrope_ranges == 1
        assert (s.mrope_syncs, s.syncs) == (mrope, total)
        assert s.by_kind == {"aten::item": total, "aten::_local_scalar_dense": total}
    assert all(s.interval_us > s.host_us > 0 for s in a.steps[:-1])


def _fake_sglang():
    class Mode:
        def __init__(self, decode):
            self.decode = decode

        def is_decode(self):
            return self.decode

        def is_extend(self):
            return not self.decode

    class ForwardBatch:
        def __init__(self, batch):
            self.forward_mode, self.seq_lens = batch.forward_mode, batch.seq_lens

        def _compute_mrope_positions(self, model_runner, batch):
            for i in range(self.seq_lens.shape[0]):  # stock: two host reads per request
                int(self.seq_lens[i]), int(self.seq_lens[i])

    class TpModelWorker:
        def forward_batch_generation(self, model_worker_batch):
            fb = ForwardBatch(model_worker_batch)
            fb._compute_mrope_positions(None, model_worker_batch)
            return "ok"

    fbi = types.ModuleType("fake_fbi")
    fbi.ForwardBatch = ForwardBatch
    tpw = types.ModuleType("fake_tpw")
    tpw.TpModelWorker = TpModelWorker
    return fbi, tpw, Mode


def test_ranges_under_a_real_profiler(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(HOOK.parent))
    monkeypatch.delenv("PATCHBENCH_PROFILE_RANGES", raising=False)
    import patchbench_profile_instr as instr

    fbi, tpw, Mode = _fake_sglang()
    instr.wrap_forward_batch(fbi)
    instr.wrap_tp_worker(tpw)
    instr.wrap_tp_worker(tpw)  # twice: wrapped once
    w = tpw.TpModelWorker()

    def batch(n, dec=True):
        return types.SimpleNamespace(forward_mode=Mode(dec), seq_lens=torch.arange(1, n + 1))

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        w.forward_batch_generation(batch(3, dec=False))  # extend: no step range
        for n in (1, 2, 4):
            assert w.forward_batch_generation(batch(n)) == "ok"
    out = tmp_path / "t.json"
    p.export_chrome_trace(str(out))
    a = T.analyze(T.load_events(out))
    assert [s.batch_size for s in a.steps] == [1, 2, 4]
    assert [s.mrope_syncs for s in a.steps] == [2, 4, 8]
    assert [s.syncs for s in a.steps] == [2, 4, 8]


def _cell(d: Path, steps: list[dict], metrics: dict, timeline: dict | None = None) -> Path:
    d.mkdir(parents=True)
    write_jsonl(d / "steps.jsonl", steps)
    write_json(d / "summary.json", {"suite": "profile", "status": "ok", "metrics": metrics})
    if timeline:
        write_json(d / "timeline-c3.json", timeline)
    return d


def test_pair_report_and_plot(tmp_path):
    tl = {
        "steps": [{"ts": 0, "dur": 50, "batch_size": 3}],
        "mrope": [[5, 10]],
        "syncs": [[6, True], [30, False]],
        "gpu": [],
        "span_us": 60,
    }
    b = _cell(
        tmp_path / "b",
        [
            {"batch_size": 3, "syncs": 18, "mrope_syncs": 6},
            {"batch_size": 3, "syncs": 18, "mrope_syncs": 6},
            {"batch_size": 1, "syncs": 6, "mrope_syncs": 2},
        ],
        {"host_step_ms_median": 2.0},
        tl,
    )
    v = _cell(
        tmp_path / "v",
        [{"batch_size": 3, "syncs": 12, "mrope_syncs": 0}],
        {"host_step_ms_median": 1.5},
        tl,
    )
    p = pair_cells([b], [v])
    rows = {r["batch_size"]: r for r in p["by_batch_size"]}
    assert rows[3]["baseline"] == {"syncs": [18], "mrope_syncs": [6], "steps": 2}
    assert rows[3]["variant"] == {"syncs": [12], "mrope_syncs": [0], "steps": 1}
    assert not rows[3]["syncs_equal"] and rows[1]["variant"] is None
    assert p["values"]["host_step_ms_median"] == {"baseline": [2.0], "variant": [1.5]}
    cmp = {
        "baseline": "baseline",
        "pairs": {"profile": {"ours": p}},
        "refusals": {"profile": {"other": "different prompts"}},
    }
    text = "\n".join(report_section(cmp))
    assert "| 3 | 2/1 | 18 → 12 | 6 → 0 | no |" in text
    assert "**other**: not compared: different prompts" in text
    pngs = get_suite("profile").plots(cmp, tmp_path / "plots")
    assert [x.name for x in pngs] == ["profile_timeline_ours.png"]
    assert pngs[0].read_bytes()[:4] == b"\x89PNG"
    assert pair_cells([tmp_path / "none"], [tmp_path / "none2"]) is None


def test_params_and_contract():
    s = get_suite("profile")
    assert s.timed is False and s.needs_server is True
    assert s.metrics["mrope_syncs_per_decode_step"].primary
    assert s.metrics["mrope_syncs_per_decode_step"].kind == "deterministic"
    instr = s.instrumentation(None, s.Params())
    assert instr.env == {"PATCHBENCH_PROFILE_RANGES": "1"} and instr.hooks == [HOOK]
    from patchbench.suites.profile import profile_request

    body = profile_request(s.Params(num_steps=7), "cpu", Path("/x"))
    assert body == {
        "output_dir": "/x",
        "num_steps": 7,
        "activities": ["CPU"],
        "with_stack": False,
        "record_shapes": False,
    }
    assert profile_request(s.Params(), "cuda", Path("/x"))["activities"] == ["CPU", "GPU"]
    with pytest.raises(Exception, match="extra"):
        s.Params(bogus=1)


def test_a_trace_file_is_complete_only_once_it_parses(tmp_path):
    """The profiler creates the file before writing it: an empty file, or a gzip holding half a
    JSON document, is not a trace yet (a real demo run read an empty one and failed)."""
    import gzip

    from patchbench.suites.profile import _complete_trace

    p = tmp_path / "1-TP-0.trace.json.gz"
    p.write_bytes(b"")
    assert _complete_trace(tmp_path) is None
    p.write_bytes(gzip.compress(b""))
    assert _complete_trace(tmp_path) is None
    p.write_bytes(gzip.compress(b'{"traceEvents": [{"ph": "X"'))
    assert _complete_trace(tmp_path) is None
    p.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert _complete_trace(tmp_path) == p


def test_itl_from_arrivals_is_robust_to_chunks_read_together():
    """Chunks in bursts of 3 sharing one timestamp every 30 ms (10 ms per token): a median of
    gaps is 0, the span estimator gives 30 ms x 99 bursts / 299 gaps = 9.933 ms; a gap between
    two requests (here 500 ms of prefill) never counts; chunks outside the window do not."""
    from statistics import median

    from patchbench.suites.profile.load import itl_from_arrivals

    burst = [0.030 * (i // 3) for i in range(300)]  # 100 bursts of 3
    gaps = [b - a for a, b in zip(burst, burst[1:], strict=False)]
    assert median(gaps) == 0.0  # what the old estimator reported
    second = [burst[-1] + 0.5 + t for t in burst]  # the next request, 500 ms later
    got = itl_from_arrivals([[burst, second]], 0.0, 100.0)
    assert got == pytest.approx(1000.0 * 2 * 0.030 * 99 / (2 * 299))
    assert got == pytest.approx(9.933, abs=1e-3)
    # only the first request's first 150 chunks (t <= 1.47 s: bursts 0..49) lie in the window
    assert itl_from_arrivals([[burst, second]], 0.0, 1.47) == pytest.approx(1000 * 1.47 / 149)
    assert itl_from_arrivals([[[1.0]], []], 0.0, 2.0) is None


def test_overhead_share_left_out_when_the_two_times_cannot_be_the_same_steps():
    from patchbench.suites.profile import overhead_share

    assert overhead_share(12.0, 10.0) == (pytest.approx(0.2), None)
    assert overhead_share(None, 10.0) == (None, None)
    assert overhead_share(12.0, None) == (None, "no unprofiled inter-token latency")
    # the field case: 25 ms steps against a 0.006 ms "ITL" (a median of bursts)
    share, why = overhead_share(25.0, 0.006)
    assert share is None and "25 ms" in why and "0.006 ms" in why and "4.17e+03" in why
    assert overhead_share(4.0, 10.0)[0] is None  # a profiled step at 0.4x the ITL


def test_timeline_legend_names_only_what_the_excerpts_show():
    """A CPU trace has no GPU lane: no "GPU busy" entry; a CUDA one has it. Syncs inside and
    outside mrope ranges each get their entry only when present."""
    from patchbench.suites.profile.timeline import legend_labels

    cpu_stock = {"steps": [{"ts": 0, "dur": 10}], "mrope": [[1, 2]], "syncs": [[1.5, True]]}
    cpu_ours = {"steps": [{"ts": 0, "dur": 8}], "mrope": [[1, 2]], "syncs": [[5, False]]}
    assert legend_labels(cpu_stock, cpu_ours) == [
        "decode step (host)",
        "mrope",
        "host sync",
        "sync in mrope",
    ]
    gpu = dict(cpu_ours, gpu=[[0, 9]], syncs=[])
    assert legend_labels(gpu, {"steps": []}) == ["decode step (host)", "mrope", "GPU busy"]
