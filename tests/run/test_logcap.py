"""server.log's disk use held at server.log_max_mb (patchbench/run/logcap.py): the middle punched
out as a hole, head and tail kept, a note line where the middle was; every reader skips the hole.
Fake server port 31911."""

from __future__ import annotations

import errno
import os
import time
import tracemalloc
from pathlib import Path

import pytest

import tests.fake_server.fake_suites  # noqa: F401 (registers the fake suites)
from patchbench.config import load_config
from patchbench.records import read_json
from patchbench.run import bench, logcap
from patchbench.run.logcap import BLOCK, LogCap, PunchUnsupported, allocated_bytes, read_lines
from patchbench.run.logscan import scan_server_log
from patchbench.run.server import scan_log, tail
from tests.run.test_bench_runner import write_config

MIB = 1 << 20
PORT = 31911
RETRACT = b"KV cache pool is full. Retract requests. #retracted_reqs: 2"
KV_OOM = b"Decode out of memory. Try to lower your batch size"
CUDA_OOM = b"CUDA out of memory"


def _line(i: int, what: bytes = b"") -> bytes:
    """Line ``i`` of the test log: 128 bytes with its newline."""
    return (b"line %08d " % i + what).ljust(127, b".") + b"\n"


def _write_log(path: Path, mib: int) -> bytes:
    """``mib`` MiB of 128-byte lines: a retraction in line 10 (the head), a CUDA OOM in the
    middle, a KV OOM 20 lines before the end (the tail). Returns what was written."""
    n = mib * MIB // 128
    marks = {10: RETRACT, n // 2: CUDA_OOM, n - 20: KV_OOM}
    data = b"".join(_line(i, marks.get(i, b"")) for i in range(n))
    path.write_bytes(data)
    os.sync()
    return data


def _punch_or_skip(cap: LogCap) -> bool:
    done = cap.check()
    if cap.unsupported:
        pytest.skip(f"{cap.path.parent}: {cap.unsupported}")
    return done


def test_a_log_over_its_cap_keeps_head_and_tail_with_a_note_and_frees_the_middle(tmp_path):
    log = tmp_path / "server.log"
    data = _write_log(log, 3)  # 3 MiB = 3145728 bytes
    before = allocated_bytes(log)
    assert before >= 3 * MIB
    cap = LogCap(log, 1)  # head 262144 (a quarter), tail 786432
    assert (cap.head, cap.tail) == (262144, 786432)
    assert _punch_or_skip(cap)
    # the hole: from the head's end to the block at or before size - tail = 2359296
    assert cap.dropped == (262144, 2359296)
    after = allocated_bytes(log)
    assert after <= MIB + 2 * BLOCK  # head + the note's block + tail = 1052672 here
    assert before - after >= 2359296 - 262144 - BLOCK
    raw = log.read_bytes()
    assert len(raw) == 3 * MIB  # the size and every offset stay
    assert raw[:262144] == data[:262144]
    assert raw[2359296:] == data[2359296:]
    note = (
        b"[patchbench: bytes 262144-2359296 of server.log dropped (server.log_max_mb = 1); "
        b"what follows is the log's end]\n"
    )
    assert raw[262144 : 262144 + len(note)] == note  # line 2048 ended at 262143: no lead \n
    assert raw[262144 + len(note) : 2359296] == b"\0" * (2359296 - 262144 - len(note))
    assert cap.note == (
        "server.log capped at server.log_max_mb = 1: bytes 262144-2359296 (2.0 MiB) of the "
        "server's output dropped; the first 262144 bytes and everything from byte 2359296 on "
        "kept, a note line where they were"
    )
    # nothing new past the hole: a second check punches nothing
    assert not cap.check()

    scan = scan_server_log(log)
    assert scan["retractions_count"] == 1 and scan["retracted_requests_count"] == 2
    assert scan["oom_count"] == 1  # the tail's KV OOM; the middle's CUDA OOM was dropped
    assert scan["end_offset"] == 3 * MIB
    assert scan["first_lines"] == [
        _line(10, RETRACT).decode().strip(),
        _line(24556, KV_OOM).decode().strip(),
    ]
    # from an offset inside the hole: the rest of the line it is in is the part before's
    part = scan_server_log(log, start_offset=MIB)
    assert (part["retractions_count"], part["oom_count"], part["end_offset"]) == (0, 1, 3 * MIB)
    assert scan_log(log, "patchbench: bytes") == [note.decode().rstrip("\n")]
    assert scan_log(log, "Retract requests") == [_line(10, RETRACT).decode().rstrip("\n")]
    assert tail(log, 2).splitlines() == [
        _line(24574).decode().strip(),
        _line(24575).decode().strip(),
    ]


def test_a_log_that_grows_on_moves_its_hole_end_and_rewrites_the_note(tmp_path):
    log = tmp_path / "server.log"
    _write_log(log, 3)
    cap = LogCap(log, 1)
    assert _punch_or_skip(cap)
    with open(log, "ab") as f:  # the server appends 512 KiB more
        f.write(b"".join(_line(i) for i in range(4096)))
    assert cap.check()
    # size 3670016 - tail 786432 = 2883584 (a multiple of 4096)
    assert cap.dropped == (262144, 2883584)
    assert allocated_bytes(log) <= MIB + 2 * BLOCK
    assert scan_log(log, "patchbench: bytes") == [
        "[patchbench: bytes 262144-2883584 of server.log dropped (server.log_max_mb = 1); "
        "what follows is the log's end]"
    ]


def test_a_log_under_its_cap_or_with_no_cap_is_left_alone(tmp_path):
    log = tmp_path / "server.log"
    data = _write_log(log, 1)
    assert not LogCap(log, 2).check()
    assert not LogCap(log, 0).check()
    assert not LogCap(tmp_path / "missing.log", 1).check()
    assert log.read_bytes() == data


def test_where_punching_is_unsupported_nothing_is_dropped_and_the_note_says_so(
    tmp_path, monkeypatch
):
    def refuse(fd, offset, length):
        raise PunchUnsupported(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(logcap, "punch_hole", refuse)
    log = tmp_path / "server.log"
    data = _write_log(log, 3)
    cap = LogCap(log, 1)
    assert not cap.check()
    assert not cap.check()  # tried once only
    assert log.read_bytes() == data
    assert cap.note == (
        "server.log not capped at server.log_max_mb = 1: this file system cannot punch holes "
        f"(fallocate: EOPNOTSUPP, {os.strerror(errno.EOPNOTSUPP)}); it keeps everything the "
        "server wrote"
    )


def test_a_200_mib_hole_is_jumped_not_read_into_memory(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "wb") as f:
        f.write(_line(0, RETRACT))
        f.truncate(200 * MIB)  # a 200 MiB hole without one newline
        f.seek(200 * MIB)
        f.write(_line(1, KV_OOM))
    tracemalloc.start()
    t = time.monotonic()
    scan = scan_server_log(log)
    took = time.monotonic() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert (scan["retractions_count"], scan["oom_count"]) == (1, 1)
    assert scan["end_offset"] == 200 * MIB + 128
    assert peak < 4 * MIB, peak  # one chunk (1 MiB) at most, never the hole
    assert took < 2.0, took
    with open(log, "rb") as f:
        lines = list(read_lines(f.fileno()))
    # the line after the hole starts where the hole does: its NUL bytes are nothing
    assert lines == [
        (0, _line(0, RETRACT)[:-1], 128),
        (128, _line(1, KV_OOM)[:-1], 200 * MIB + 128),
    ]


def test_read_lines_yields_offsets_and_lines_without_nul_bytes(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"ab\ncd\0\0e\n\0\0\0fg")
    with open(log, "rb") as f:
        got = list(read_lines(f.fileno(), chunk_bytes=4))
        assert list(read_lines(f.fileno(), start=3)) == got[1:]
    assert got == [(0, b"ab", 3), (3, b"cde", 9), (9, b"fg", 14)]


def test_log_max_mb_is_a_whole_number_of_mib_at_least_0(tmp_path):
    body = """\
        name: cap
        sglang: "@SGLANG@"
        model: {path: "@MODEL@"}
        server: {port: 31911, log_max_mb: @CAP@}
        variants: {baseline: []}
        suites: {fake: {n: 1}}
    """
    assert load_config(write_config(tmp_path, body.replace("@CAP@", "0"))).server.log_max_mb == 0
    default = body.replace(", log_max_mb: @CAP@", "")
    assert load_config(write_config(tmp_path, default)).server.log_max_mb == 64
    for bad in ("-1", "1.5", "true"):
        with pytest.raises(Exception, match="log_max_mb"):
            load_config(write_config(tmp_path, body.replace("@CAP@", bad)))


def test_a_server_flooding_its_output_keeps_its_log_under_the_cap(fake_env, tmp_path):
    cfg = load_config(
        write_config(
            tmp_path,
            f"""\
            name: flood
            sglang: "@SGLANG@"
            model: {{path: "@MODEL@"}}
            server: {{port: {PORT}, ready_timeout_s: 30, stop_grace_s: 3, log_max_mb: 1}}
            variants:
              baseline: []
            schedule: {{repeats: 1}}
            suites:
              fake: {{n: 2}}
            """,
        )
    )
    fake_env["baseline/rep0"] = {"FAKE_FLOOD_STDOUT_MB": "40"}
    run_dir = bench.run_bench(cfg, launch_spec=fake_env, results_root=tmp_path / "results")
    cdir = run_dir / "baseline" / "rep0"
    rec = read_json(cdir / "cell.json")
    log = cdir / "server.log"
    size, on_disk = log.stat().st_size, allocated_bytes(log)
    print(f"\nflood of 40 MiB, cap 1 MiB: size {size} bytes, on disk {on_disk} bytes")
    notes = [n for n in rec["notes"] if "server.log_max_mb" in n]
    if notes and "not capped" in notes[0]:
        pytest.skip(notes[0])
    assert rec["status"] == "ok", rec
    assert size > 40 * MIB
    assert on_disk <= MIB + 2 * BLOCK
    assert len(notes) == 1 and notes[0].startswith("server.log capped at server.log_max_mb = 1")
    note = scan_log(log, "[patchbench: bytes 262144-")
    assert len(note) == 1 and note[0].endswith(
        "of server.log dropped (server.log_max_mb = 1); what follows is the log's end]"
    )
    assert len(scan_log(log, "fake: flood head")) == 1
    assert len(scan_log(log, "fake: flood tail")) == 1
