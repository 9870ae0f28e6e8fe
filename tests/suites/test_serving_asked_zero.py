"""A request the release's draw asked for 0 output tokens (random_range_ratio 0), answered with
none and no error, is neither a failure nor a measurement (a fresh-user ab run on a 0.5.6.post2
branch failed every cell on one such request: "1 of 24 requests failed: 1x (no error text)")."""

from __future__ import annotations

from patchbench.suites.serving.validity import asked_zero, request_checks


def test_only_a_request_that_asked_zero_and_got_none_without_error_is_asked_zero():
    statuses = ["ok", "failed", "failed", "failed", "failed"]
    output_lens = [5, 0, 0, 0, 3]
    errors = ["", "", "", "server error", ""]
    asked = [5, 0, 4, 0, 0]
    # 1: asked 0, got 0, no error; 2 asked 4 (a real failure); 3 has an error; 4 got tokens
    assert asked_zero(statuses, output_lens, errors, asked) == [1]
    assert asked_zero(statuses, output_lens, errors, None) == []  # unknown: still failed


def test_asked_zero_requests_are_not_counted_failed():
    statuses = ["ok"] * 23 + ["asked_zero"]
    errs, warns = request_checks(statuses, [""] * 24, num_prompts=24, tool_completed=24)
    assert errs == [] and warns == []
    errs, _ = request_checks(["ok"] * 23 + ["failed"], [""] * 24, num_prompts=24, tool_completed=24)
    assert errs == ["1 of 24 requests failed: 1x (no error text)"]


def test_the_recorded_run_has_its_one_asked_zero_request_found():
    """The recorded run (tests/data/serving/README.md): the replayed draw says request 15 asked
    for 0 tokens; it is the one request the status rule alone calls failed."""
    from pathlib import Path

    from patchbench.suites.serving.parse import read_result_line, request_records
    from patchbench.suites.serving.validity import asked_output_lens

    data = Path(__file__).resolve().parents[1] / "data" / "serving"
    stdout = (data / "v0562_flagged_asked_zero.stdout.txt").read_text()
    asked = asked_output_lens(
        stdout, output_len=32, input_len=64, range_ratio=0.0, num_prompts=24, seed=1
    )
    recs = request_records(read_result_line(data / "v0562_flagged_asked_zero.jsonl"))
    assert asked is not None and asked[15] == 0 and recs["output_len"][15] == 0
    assert [i for i, s in enumerate(recs["status"]) if s != "ok"] == [15]
    assert asked_zero(recs["status"], recs["output_len"], recs["error"], asked) == [15]
