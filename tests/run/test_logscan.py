"""patchbench.run.logscan on synthetic server logs built from the message texts the pinned releases log
(each text is also looked up in the installed sglang sources, where they are installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchbench.run.logscan import log_size, scan_server_log, taint_warning

# 0.5.1.post3: logger.info; 0.5.23: logger.warning (also "#new_tokens_gained")
RETRACT_051 = (
    "[2025-08-20 10:00:01 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
    "#new_token_ratio: 0.4000 -> 0.7000\n"
)
RETRACT_0523 = (
    "[2026-01-02 10:00:01 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, "
    "#new_tokens_gained: 512, #new_token_ratio: 0.4000 -> 0.6000\n"
)
TEST_RETRACT = (
    "[2026-01-02 10:00:02] Testing retraction. #retracted_reqs: 5, #new_tokens_gained: 9\n"
)
DECODE_OOM = (
    "[2025-08-20 10:00:03 TP0] Decode out of memory. Try to lower your batch size.\n"
    "Try to allocate 16 tokens.\n"
    "Available tokens: 0, evictable tokens: 0\n"
)
SCHED_TRACEBACK = (
    "[2025-08-20 10:00:03 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "scheduler.py", line 1732, in update_running_batch\n'
    "    raise RuntimeError(error_msg)\n"
    "RuntimeError: Decode out of memory. Try to lower your batch size.\n"
    "Try to allocate 16 tokens.\n"
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 139.81 GiB of which 1.10 GiB is free.\n"
)
NOT_OOM = (
    "[2026-01-02 09:59:00] Available memory 3GB is less than required memory 4GB for warmup, "
    "reducing max_m to 1024 to avoid out of memory\n"
)
DECODE_LINE = (
    "[2025-08-20 10:00:00 TP0] Decode batch. #running-req: 16, #token: 4096, "
    "gen throughput (token/s): 812.5\n"
)


def _log(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "server.log"
    p.write_bytes(text.encode())
    return p


def test_retractions_and_ooms_counted_once_each(tmp_path):
    p = _log(
        tmp_path,
        DECODE_LINE
        + RETRACT_051
        + DECODE_LINE
        + RETRACT_0523
        + TEST_RETRACT
        + NOT_OOM
        + DECODE_OOM
        + SCHED_TRACEBACK
        + CUDA_OOM,
    )
    s = scan_server_log(p)
    # 3 retraction events of 3 + 2 + 5 requests; the Decode OOM logged and then re-raised in the
    # traceback is one event, plus one CUDA OOM; the deep_gemm warning is not an OOM
    assert s["retractions_count"] == 3
    assert s["retracted_requests_count"] == 10
    assert s["oom_count"] == 2
    assert s["first_lines"][0].startswith("[2025-08-20 10:00:01 TP0] KV cache pool is full.")
    assert len(s["first_lines"]) == 5
    assert s["end_offset"] == p.stat().st_size


def test_two_ranks_each_log_and_raise(tmp_path):
    two = DECODE_OOM.replace("TP0", "TP1")
    p = _log(tmp_path, DECODE_OOM + two + SCHED_TRACEBACK + SCHED_TRACEBACK.replace("TP0", "TP1"))
    assert scan_server_log(p)["oom_count"] == 2
    # an exception line without an earlier logged line is an event of its own
    q = _log(tmp_path, SCHED_TRACEBACK)
    assert scan_server_log(q)["oom_count"] == 1


def test_slice_from_offset_counts_only_the_later_part(tmp_path):
    head = DECODE_LINE + RETRACT_051
    p = _log(tmp_path, head + DECODE_LINE + RETRACT_0523)
    off = len(head.encode())
    s = scan_server_log(p, start_offset=off)
    assert s["retractions_count"] == 1 and s["retracted_requests_count"] == 2
    # an offset inside a line skips that line (it began before the offset)
    inside = len(DECODE_LINE.encode()) + 5
    assert scan_server_log(p, start_offset=inside)["retractions_count"] == 1
    # an end offset stops the slice; the next slice starts where it ended
    first = scan_server_log(p, end_offset=off)
    assert first["retractions_count"] == 1 and first["end_offset"] == off
    assert scan_server_log(p, start_offset=first["end_offset"])["retracted_requests_count"] == 2
    # an offset past the end (the log was rotated or replaced): nothing, no error
    assert scan_server_log(p, start_offset=10**9)["retractions_count"] == 0


def test_clean_log_and_errors(tmp_path):
    p = _log(tmp_path, DECODE_LINE * 3 + NOT_OOM)
    s = scan_server_log(p)
    assert (s["retractions_count"], s["oom_count"], s["first_lines"]) == (0, 0, [])
    assert taint_warning(s) is None
    with pytest.raises(FileNotFoundError):
        scan_server_log(tmp_path / "nope.log")
    with pytest.raises(ValueError, match="start_offset"):
        scan_server_log(p, start_offset=-1)
    assert log_size(tmp_path / "nope.log") == 0 and log_size(p) == p.stat().st_size


def test_invalid_utf8_does_not_stop_the_scan(tmp_path):
    p = tmp_path / "server.log"
    p.write_bytes(b"\xff\xfe garbage\n" + RETRACT_051.encode())
    assert scan_server_log(p)["retractions_count"] == 1


def test_taint_warning_names_the_counts():
    w = taint_warning(
        {
            "retractions_count": 2,
            "retracted_requests_count": 7,
            "oom_count": 1,
            "first_lines": ["x"],
        }
    )
    assert "2 retraction(s) of 7 request(s)" in w and "1 out-of-memory event(s)" in w


@pytest.mark.parametrize(
    ("venv", "files"),
    [
        (".venv", ("srt/managers/scheduler.py", "srt/managers/schedule_batch.py")),
        (".venv-0.5.23", ("srt/managers/scheduler.py", "srt/mem_cache/allocation.py")),
    ],
)
def test_the_texts_are_the_pinned_releases_own(venv, files):
    repo = Path(__file__).resolve().parents[2]
    pkg = repo / venv / "lib" / "python3.11" / "site-packages" / "sglang"
    if not pkg.is_dir():
        pytest.skip(f"{pkg} not installed")
    src = "".join((pkg / f).read_text(encoding="utf-8") for f in files)
    assert '"KV cache pool is full. Retract requests. "' in src
    assert "#retracted_reqs: " in src
    assert 'f"Decode out of memory. Try to lower your batch size.\\n"' in src
    assert 'f"Prefill out of memory. Try to lower your batch size.\\n"' in src
