"""bench_serving's command line per release (patchbench.suites.serving.command), read from the installed
packages' source (both environments are in the checkout: .venv and .venv-0.5.23)."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
from pydantic import ValidationError

from patchbench.suites.serving import Params
from patchbench.suites.serving.command import (
    ToolMismatch,
    build_command,
    effective_seed,
    release_dataset_name,
    tool_info,
    wants_chat_template,
)

REPO = Path(__file__).resolve().parents[2]


def _pkg(venv: str) -> Path | None:
    hits = glob.glob(str(REPO / venv / "lib" / "python3*" / "site-packages" / "sglang"))
    return Path(hits[0]) if hits else None


OLD = _pkg(".venv")  # sglang 0.5.1.post3
NEW = _pkg(".venv-0.5.23")  # sglang 0.5.23
need_old = pytest.mark.skipif(OLD is None, reason=".venv (sglang 0.5.1.post3) not installed")
need_new = pytest.mark.skipif(NEW is None, reason=".venv-0.5.23 not installed")


def _argv(cmd, flag):
    return cmd[cmd.index(flag) + 1]


@need_old
def test_tool_info_0513():
    info = tool_info(OLD)
    assert info.source.name == "bench_serving.py"
    assert "random-image" in info.dataset_choices and "image" not in info.dataset_choices
    assert {"mmmu", "random-ids", "random"} <= set(info.dataset_choices)
    assert "--random-image-num-images" in info.options
    assert info.defaults["--seed"] == 1


@need_new
def test_tool_info_0523():
    info = tool_info(NEW)
    assert info.source.as_posix().endswith("benchmark/serving.py")
    assert "image" in info.dataset_choices and "random-image" not in info.dataset_choices
    assert "--image-count" in info.options and "--image-resolution" in info.options
    assert info.defaults["--seed"] == 42


@need_old
@need_new
@pytest.mark.parametrize("asked", ["image", "random-image"])
def test_image_dataset_name_maps_per_release(asked):
    assert release_dataset_name(asked, tool_info(OLD)) == "random-image"
    assert release_dataset_name(asked, tool_info(NEW)) == "image"


@need_old
def test_unknown_dataset_is_a_clear_error():
    info = tool_info(OLD)
    with pytest.raises(
        ToolMismatch, match="'sharegpt2' is not available.*it offers: .*random-image"
    ):
        release_dataset_name("sharegpt2", info)


@need_old
def test_pr_defaults_command_0513(tmp_path):
    p = Params()
    cmd = build_command(
        p,
        python="py",
        info=tool_info(OLD),
        sglang_version="0.5.1.post3",
        host="127.0.0.1",
        port=31234,
        model="/m",
        tokenizer="/t",
        output_file=tmp_path / "r.jsonl",
    )
    assert cmd[:3] == ["py", "-m", "sglang.bench_serving"]
    assert _argv(cmd, "--backend") == "sglang" and _argv(cmd, "--dataset-name") == "mmmu"
    assert _argv(cmd, "--num-prompts") == "200" and _argv(cmd, "--max-concurrency") == "16"
    assert _argv(cmd, "--request-rate") == "inf" and _argv(cmd, "--random-output-len") == "1024"
    assert _argv(cmd, "--output-file") == str(tmp_path / "r.jsonl") and "--output-details" in cmd
    assert _argv(cmd, "--tokenizer") == "/t" and _argv(cmd, "--port") == "31234"
    assert "--apply-chat-template" in cmd  # auto: image dataset on a release before 0.5.6
    assert "--seed" not in cmd and effective_seed(p, tool_info(OLD)) == 1
    assert "--disable-ignore-eos" not in cmd


@need_old
@need_new
def test_image_flags_per_release(tmp_path):
    p = Params(
        dataset_name="image",
        image_count=2,
        image_resolution="224x224",
        seed=7,
        extra_args=["--flush-cache"],
    )
    kw = dict(python="py", host="h", port=1, model="m", tokenizer="t", output_file=tmp_path / "o")
    old = build_command(p, info=tool_info(OLD), sglang_version="0.5.1.post3", **kw)
    new = build_command(p, info=tool_info(NEW), sglang_version="0.5.23", **kw)
    assert _argv(old, "--random-image-num-images") == "2"
    assert _argv(old, "--random-image-resolution") == "224x224"
    assert _argv(new, "--image-count") == "2" and _argv(new, "--image-resolution") == "224x224"
    assert "--apply-chat-template" in old and "--apply-chat-template" not in new
    assert _argv(new, "--seed") == "7" and new[-1] == "--flush-cache"


def test_chat_template_choice():
    assert wants_chat_template(Params(dataset_name="mmmu"), "0.5.1.post3")
    assert not wants_chat_template(Params(dataset_name="random-ids"), "0.5.1.post3")
    assert not wants_chat_template(Params(dataset_name="image"), "0.5.23")
    assert not wants_chat_template(Params(apply_chat_template=False), "0.5.1.post3")
    assert wants_chat_template(
        Params(apply_chat_template=True, dataset_name="random-ids"), "0.5.23"
    )


def test_params_reject_unknown_keys_and_bad_values():
    with pytest.raises(ValidationError, match="extra"):
        Params(num_promts=10)
    with pytest.raises(ValidationError):
        Params(dataset_name="sharegpt")
    with pytest.raises(ValidationError):
        Params(num_prompts=0)
    assert Params(max_concurrency=None).max_concurrency is None
