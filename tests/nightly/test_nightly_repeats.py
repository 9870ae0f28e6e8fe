"""schedule.repeats: auto around the run: the night's config built in memory, matrix units,
``rounds`` indices (patchbench.nightly.repeats.pick_repeats, patchbench.matrix.spec,
patchbench.config.load)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from patchbench.config import load_config
from patchbench.errors import ConfigError
from patchbench.matrix.spec import load_matrix
from patchbench.nightly.repeats import pick_repeats
from tests.helpers import write_nightly_config

TPUT = "output_throughput_tok_s"


def _auto_config(tmp_path: Path, name: str = "auto-night") -> Path:
    nightly = {"run_cv_pct": 1.5, "gates": [{"metric": f"serving.{TPUT}", "threshold_pct": 5}]}
    return write_nightly_config(tmp_path, name, nightly, schedule={"repeats": "auto"})


def test_auto_repeats_give_a_copy_of_the_config_with_that_many(tmp_path):
    src = _auto_config(tmp_path)
    cfg = load_config(src)
    out = io.StringIO()
    plan, night = pick_repeats(cfg, tmp_path / "none.sqlite", out=out)
    assert f"repeats: {plan.repeats}" in out.getvalue() and plan.source == "prior"
    assert not night.schedule.auto and night.schedule.repeats == plan.repeats
    assert night.source == cfg.source == src and night.schedule.order == cfg.schedule.order
    assert cfg.schedule.auto and cfg.schedule.repeats == 3  # the loaded config is unchanged
    assert not (tmp_path / "results").exists()  # nothing written


def test_matrix_unit_with_auto_repeats_is_a_config_error_naming_unit_and_key(tmp_path):
    base = _auto_config(tmp_path, "mxauto")
    m = tmp_path / "m.yaml"
    m.write_text(f"name: m\nbase: {base}\naxes: {{gpu_type: [H200]}}\n")
    with pytest.raises(
        ConfigError, match=r"unit h200-\w+: schedule.repeats: auto is for a single nightly config"
    ) as ei:
        load_matrix(m)
    assert ei.value.exit_code == 2
    # a matrix that sets a number runs
    m.write_text(
        f"name: m\nbase: {base}\naxes: {{gpu_type: [H200]}}\nset: {{schedule.repeats: 3}}\n"
    )
    assert load_matrix(m).units[0].config.schedule.repeats == 3


def test_rounds_at_or_above_min_repeats_with_auto_say_why(tmp_path):
    def cfg(rounds, name):
        p = _auto_config(tmp_path, name)
        raw = yaml.safe_load(p.read_text())
        raw["suites"] = {"serving": {"rounds": rounds}}
        p.write_text(yaml.safe_dump(raw))
        return p

    with pytest.raises(
        ConfigError, match=r"suites.serving.rounds: round\(s\) \[3\] with schedule.repeats: auto"
    ) as ei:
        load_config(cfg([0, 3], "high"))
    assert "nightly.min_repeats = 3" in str(ei.value) and ei.value.exit_code == 2
    assert load_config(cfg([0, 2], "ok")).rounds_of("serving") == [0, 2]
