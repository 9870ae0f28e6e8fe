"""The profile suite's trace analysis on small hand-written Chrome traces (values worked out by hand
in the comments next to each event)."""

import gzip
import json

import pytest

from patchbench.suites.profile import trace as T


def X(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if args:
        e["args"] = args
    return e


def cpu_trace():
    return [
        X("patchbench::decode_step bs=2", 0, 100, cat="user_annotation"),
        X("patchbench::mrope decode bs=2", 10, 30, cat="user_annotation"),
        X("aten::item", 12, 5),
        X("aten::_local_scalar_dense", 13, 3),  # point 1 (mrope)
        X("aten::item", 20, 5),
        X("aten::_local_scalar_dense", 21, 3),  # point 2 (mrope)
        X("aten::item", 50, 4),  # point 3
        X("aten::item", 120, 4),  # between steps: ignored
        X("aten::item", 60, 4, tid=2),  # other thread: ignored
        X("patchbench::decode_step bs=3", 150, 80, cat="user_annotation"),
        X("aten::add", 160, 10),
        {"ph": "i", "name": "marker", "ts": 170, "pid": 1, "tid": 1},  # not complete: dropped
    ]


def gpu_trace():
    rt = "cuda_runtime"
    return [
        # step 0: host 0..50; GPU work 8..32; first launch at 5
        X("patchbench::decode_step bs=1", 0, 50, cat="user_annotation"),
        X("cudaLaunchKernel", 5, 3, cat=rt, correlation=1),
        X("cudaLaunchKernel", 10, 3, cat=rt, correlation=2),
        X("cudaMemcpyAsync", 20, 4, cat=rt, correlation=3),  # DtoH pageable copy
        X("cudaStreamSynchronize", 25, 10, cat=rt, correlation=30),  # ... its sync: 1 point
        X("k1", 8, 10, cat="kernel", pid=0, tid=7, correlation=1, stream=7),
        X("k2", 18, 5, cat="kernel", pid=0, tid=7, correlation=2, stream=7),
        X(T.DTOH_PAGEABLE, 30, 2, cat="gpu_memcpy", pid=0, tid=7, correlation=3, stream=7),
        # a kernel nobody in a step launched, inside the gap 32..64: 6 us busy
        X("other", 40, 6, cat="kernel", pid=0, tid=8, correlation=99, stream=8),
        # step 1: host 60..90; GPU 64..102; first launch 62
        X("patchbench::decode_step bs=1", 60, 30, cat="user_annotation"),
        X("cudaLaunchKernel", 62, 3, cat=rt, correlation=4),
        X("cudaMemcpyAsync", 70, 2, cat=rt, correlation=5),  # blocking H2D ...
        X("cudaStreamSynchronize", 73, 4, cat=rt, correlation=50),  # ... 1 point
        X("cudaLaunchKernel", 80, 2, cat=rt, correlation=6),
        X("k4", 64, 10, cat="kernel", pid=0, tid=7, correlation=4, stream=7),
        X(T.HTOD_PAGEABLE, 74, 1, cat="gpu_memcpy", pid=0, tid=7, correlation=5, stream=7),
        X("k6", 82, 20, cat="kernel", pid=0, tid=7, correlation=6, stream=7),
        # step 2: host 90..110; GPU 100..116 (starts before step 1's GPU work ends at 102)
        X("patchbench::decode_step bs=1", 90, 20, cat="user_annotation"),
        X("cudaGraphLaunch", 92, 5, cat=rt, correlation=7),
        X("aten::_local_scalar_dense", 94, 8),  # point 1 ...
        X("cudaMemcpyAsync", 95, 1, cat=rt, correlation=8),  # ... nested copy
        X("cudaStreamSynchronize", 97, 4, cat=rt, correlation=80),  # ... nested sync
        X("cudaEventSynchronize", 104, 1, cat=rt, correlation=81),  # point 2
        X("g1", 100, 10, cat="kernel", pid=0, tid=7, correlation=7, stream=7),
        X("g2", 110, 5, cat="kernel", pid=0, tid=7, correlation=7, stream=7),
        X(T.DTOH_PAGEABLE, 115, 1, cat="gpu_memcpy", pid=0, tid=7, correlation=8, stream=7),
    ]


def test_cpu_trace_syncs_and_host_time():
    a = T.analyze(cpu_trace())
    assert a.source == "patchbench" and not a.has_gpu
    s0, s1 = a.steps
    assert (s0.batch_size, s1.batch_size) == (2, 3)
    assert s0.syncs == 3 and s0.mrope_syncs == 2 and s0.mrope_ranges == 1
    assert s0.by_kind == {"aten::item": 3, "aten::_local_scalar_dense": 2}
    assert s0.mrope_by_kind == {"aten::item": 2, "aten::_local_scalar_dense": 2}
    assert s0.sync_ts_us == [12.0, 20.0, 50.0]
    assert s1.syncs == 0 and s1.mrope_syncs == 0
    assert s0.interval_us == 150 and s1.interval_us is None
    assert s0.gpu_idle_gap_us is None and s0.launch_lead_us is None
    m = a.summary()
    # the upper median of 3 and 0, of 2 and 0: a count a step had, never 1.5 or 1
    assert m["syncs_per_decode_step"] == 3 and m["mrope_syncs_per_decode_step"] == 2
    assert m["host_step_ms_median"] == pytest.approx(0.150)
    assert m["host_step_range_ms_median"] == pytest.approx(0.090)
    assert "gpu_idle_gap_us_median" not in m
    assert a.by_batch_size() == {
        2: {"steps": 1, "syncs": [3], "mrope_syncs": [2]},
        3: {"steps": 1, "syncs": [0], "mrope_syncs": [0]},
    }


def test_gpu_trace_syncs_gaps_and_leads():
    a = T.analyze(gpu_trace())
    assert a.has_gpu
    s0, s1, s2 = a.steps
    assert s0.syncs == 1
    assert s0.by_kind == {"memcpy_dtoh_pageable": 1, "cudaStreamSynchronize": 1}
    assert s1.syncs == 1
    assert s1.by_kind == {"h2d_blocking": 1, "cudaStreamSynchronize": 1}
    assert s2.syncs == 2
    assert s2.by_kind == {
        "aten::_local_scalar_dense": 1,
        "memcpy_dtoh_pageable": 1,
        "cudaStreamSynchronize": 1,
        "cudaEventSynchronize": 1,
    }
    assert (s0.gpu_start_us, s0.gpu_end_us, s0.first_launch_us) == (8, 32, 5)
    assert (s1.gpu_start_us, s1.gpu_end_us, s1.first_launch_us) == (64, 102, 62)
    assert (s2.gpu_start_us, s2.gpu_end_us) == (100, 116)
    assert s0.gpu_idle_gap_us == 26  # window 32..64 = 32, minus 6 us of "other"
    assert s0.launch_lead_us == -30  # 32 - 62: the GPU waited for the host
    assert s1.gpu_idle_gap_us == 0  # step 2's work starts (100) before 102
    assert s1.launch_lead_us == 10  # 102 - 92: the host ran 10 us ahead
    assert s2.gpu_idle_gap_us is None and s2.launch_lead_us is None
    m = a.summary()
    assert m["gpu_idle_gap_us_median"] == 13 and m["launch_lead_us_median"] == -10
    assert m["syncs_per_decode_step"] == 1


def test_sglang_step_annotations_when_no_patchbench_ranges():
    evs = [
        X("step[DECODE bs=4]", 0, 10, cat="user_annotation"),
        X("aten::item", 2, 1),
        X("step[EXTEND bs=1 toks=9]", 20, 10, cat="user_annotation"),
        X("step[DECODE bs=4]", 0, 10, cat="gpu_user_annotation", pid=0, tid=7),
        X("step[DECODE bs=5 extra=1]", 40, 10, cat="user_annotation"),
    ]
    a = T.analyze(evs)
    assert a.source == "sglang"
    assert [s.batch_size for s in a.steps] == [4, 5]
    assert [s.syncs for s in a.steps] == [1, 0]


def test_no_steps():
    a = T.analyze([X("aten::item", 0, 1)])
    assert a.source == "none" and a.steps == [] and a.summary() == {}


def test_load_events_json_and_gzip(tmp_path):
    plain = tmp_path / "t.json"
    plain.write_text(json.dumps({"traceEvents": cpu_trace()}))
    gz = tmp_path / "t.trace.json.gz"
    gz.write_bytes(gzip.compress(json.dumps(cpu_trace()).encode()))
    assert len(T.load_events(plain)) == len(T.load_events(gz)) == len(cpu_trace()) - 1
    assert T.analyze(T.load_events(gz)).steps[0].syncs == 3


def test_load_events_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(T.TraceError, match="bad.json: not a readable Chrome trace"):
        T.load_events(bad)
    wrong = tmp_path / "wrong.json"
    wrong.write_text('{"events": []}')
    with pytest.raises(T.TraceError, match="no 'traceEvents' list"):
        T.load_events(wrong)
    with pytest.raises(T.TraceError, match="missing.json"):
        T.load_events(tmp_path / "missing.json")


def test_syncs_of_the_harness_own_instrumentation_are_not_counted():
    """The sync probe's in-server cross-check reads values on the host inside the same decode step
    (and inside the mrope range when it wraps innermost); it marks its work with a
    ``patchbench::instrumentation`` range, and those syncs are sglang's no more: here 2 points in
    the step, 1 of them in mrope, instead of 4 and 2."""
    ev = [
        X("patchbench::decode_step bs=1", 0, 100, cat="user_annotation"),
        X("patchbench::mrope decode bs=1", 10, 50, cat="user_annotation"),
        X("aten::item", 12, 3),  # sglang's, in mrope: counted
        X(T.INSTR_PREFIX, 20, 30, cat="user_annotation"),
        X("aten::item", 22, 3),  # the cross-check's: not counted
        X("aten::item", 70, 3),  # sglang's, outside mrope: counted
        X(T.INSTR_PREFIX, 80, 10, cat="user_annotation"),
        X("aten::item", 82, 3),  # the counters' read: not counted
    ]
    (step,) = T.analyze(ev).steps
    assert (step.syncs, step.mrope_syncs) == (2, 1)
