"""The calibration's run-noise models (tools.calibration.model.run_shocks, ``--noise``):
each generator gives the spread, tail, outlier, drift or CV ratio its docstring states. Many
cells of one draw, no comparison (fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from tools.calibration import model

VS = list(model.VARIANTS)


def _shocks(seed=0, repeats=5000, **kw):
    m = model.Model(**kw)
    return model.run_shocks(np.random.default_rng(seed), m, VS, repeats)[:2]


def test_gaussian_draws_what_it_always_drew():
    rng = np.random.default_rng(7)
    s_d = rng.normal(0.0, 0.03, 4 * 6)
    s_p = 0.5 * s_d + math.sqrt(0.75) * rng.normal(0.0, 0.03, 4 * 6)
    got = model.run_shocks(np.random.default_rng(7), model.Model(), VS, 6)
    assert np.array_equal(got[0], s_d) and np.array_equal(got[1], s_p) and got[2] is None


@pytest.mark.parametrize("df", [3.0, 5.0])
def test_student_t_shocks_have_the_run_cv_and_the_t_tail(df):
    cv = 0.03
    s_d, s_p = _shocks(run_cv=cv, tail_df=df, repeats=25000)  # 100 000 cells
    scale = cv / math.sqrt(df / (df - 2))  # t * scale has sd cv
    # the median |shock| and the share beyond 3 sd are the scaled t's (scipy), not the normal's
    med = scale * sps.t.ppf(0.75, df)
    assert np.median(np.abs(s_d)) == pytest.approx(med, rel=0.02)
    assert np.median(np.abs(s_d)) < 0.95 * cv * sps.norm.ppf(0.75)
    tail = 2 * sps.t.sf(3 * cv / scale, df)
    assert np.mean(np.abs(s_d) > 3 * cv) == pytest.approx(tail, rel=0.15)
    assert tail > 3 * 2 * sps.norm.sf(3)
    if df == 5.0:  # finite fourth moment: the sample sd settles on the run CV
        assert np.std(s_d) == pytest.approx(cv, rel=0.03)
    assert np.corrcoef(s_d, s_p)[0, 1] == pytest.approx(0.5, abs=0.02)


def test_outlier_one_cell_slow_in_the_stated_share_of_runs():
    lo, hi = math.log1p(0.10), math.log1p(0.20)
    hits, sizes = 0, []
    for seed in range(2000):
        s_d, s_p = _shocks(seed=[seed, 1], repeats=8, run_cv=1e-12, outlier_p=0.2)
        big = np.flatnonzero(s_d > 1e-6)
        assert np.array_equal(big, np.flatnonzero(s_p > 1e-6)) and big.size <= 1
        if big.size:
            hits += 1
            sizes.append(float(s_d[big[0]]))
            assert s_p[big[0]] == pytest.approx(s_d[big[0]], abs=1e-9)
    assert hits / 2000 == pytest.approx(0.2, abs=0.03)  # binomial sd ~0.009
    assert lo <= min(sizes) and max(sizes) <= hi
    assert np.mean(sizes) == pytest.approx((lo + hi) / 2, abs=0.005)
    # the rest of the trial is the draw without the outlier
    plain = _shocks(seed=[3, 1], repeats=8)
    with_o = _shocks(seed=[3, 1], repeats=8, outlier_p=1.0)
    assert np.sum(~np.isclose(plain[0], with_o[0])) == 1
    # the trial records the abnormal cell: its times are the slow ones
    m = model.Model(run_cv=1e-12, req_cv=0.0, questions=10, outlier_p=1.0)
    tr = model.simulate(np.random.default_rng(4), m, 3, speedup={}, syncs={}, run_id="o")
    thr = {key: x["serving"][model.THR] for key, x in tr.metrics.items()}
    assert min(thr, key=thr.get) == tr.abnormal
    assert 1.10 <= max(thr.values()) / thr[tr.abnormal] <= 1.20


def test_drift_is_shared_by_the_arms_in_the_interleaved_order():
    n = 6
    s_d, s_p = _shocks(repeats=n, run_cv=1e-12, drift=0.005)
    pos = model.run_position(VS, n)
    assert sorted(pos) == list(range(len(VS) * n))
    # round 0 runs baseline, aa, patch-a, patch-b; round 1 the reverse
    by = {v: pos[i * n : (i + 1) * n] for i, v in enumerate(VS)}
    assert [int(by[v][0]) for v in VS] == [0, 1, 2, 3]
    assert [int(by[v][1]) for v in VS] == [7, 6, 5, 4]
    step = math.log1p(0.005)
    np.testing.assert_allclose(s_d, step * pos / len(VS), atol=1e-9)
    np.testing.assert_allclose(s_p, s_d, atol=1e-9)
    # a round's mean over the arms grows by the drift each round, and pairs of rounds balance
    # it between the arms
    rounds = s_d.reshape(len(VS), n).mean(axis=0)
    np.testing.assert_allclose(np.diff(rounds), step, rtol=1e-6)
    base = s_d[:n]
    d = s_d[3 * n : 4 * n] - base  # patch-b / baseline, per round
    assert d.sum() == pytest.approx(0.0, abs=1e-9)


def test_the_periodic_disturbance_slows_every_pth_cell_of_the_runs_order():
    n, slow = 4, math.log1p(0.10)
    for order, seed in (("interleaved", 0), ("randomized", 11)):
        m = model.Model(run_cv=1e-12, period=3, period_slow=0.10, order=order)
        s_d, s_p, _ = model.run_shocks(np.random.default_rng(0), m, VS, n, seed)
        pos = model.run_position(VS, n, order, seed)
        np.testing.assert_allclose(s_d, slow * (pos % 3 == 0), atol=1e-9)
        np.testing.assert_allclose(s_p, s_d, atol=1e-9)
    # interleaved, period 8 (two rounds of four): the baseline opens every even round, so it
    # alone is slowed (rounds 0 and 2); randomized slows two different variants in each block
    # of four rounds (a variant opens one round of a block)
    m = model.Model(run_cv=1e-12, period=8, period_slow=0.10)
    s_d = model.run_shocks(np.random.default_rng(0), m, VS, n)[0].reshape(len(VS), n)
    assert [round(float(x.sum() / slow), 6) for x in s_d] == [2.0, 0.0, 0.0, 0.0]
    hit = model.run_position(VS, 8, "randomized", 3).reshape(len(VS), 8) % 8 == 0
    for b in (0, 1):
        assert sorted(hit[:, 4 * b : 4 * b + 4].sum(axis=1).tolist()) == [0, 0, 1, 1]
    assert model.parse_noise(["period:3"]) == {"period": 3}
    for bad in ("period:0", "period:2.5"):
        with pytest.raises(ValueError, match="whole number of cells"):
            model.parse_noise([bad])


def test_unequal_noise_doubles_the_noisy_variants_run_cv():
    s_d, _ = _shocks(repeats=20000, run_cv=0.03, noisy_factor=2.0)
    sd = {v: np.std(s_d[i * 20000 : (i + 1) * 20000]) for i, v in enumerate(VS)}
    assert sd["patch-a"] == pytest.approx(0.06, rel=0.03)
    for v in ("baseline", "aa", "patch-b"):
        assert sd[v] == pytest.approx(0.03, rel=0.03)


def test_parse_noise_and_labels():
    assert model.parse_noise([]) == {} and model.parse_noise(["gauss"]) == {}
    got = model.parse_noise(["t:4", "outlier", "drift:0.01", "unequal"])
    assert got == {"tail_df": 4.0, "outlier_p": 0.2, "drift": 0.01, "noisy_factor": 2.0}
    assert model.Model().noise_label == "Gaussian"
    assert model.Model(**got).noise_label == (
        "Student t (4 df), one cell 10-20% slow in 20% of runs, drift +1%/round, patch-a run CV x2"
    )
    for bad in ("t:2", "laplace", "outlier:x", "outlier:1.5", "unequal:0"):
        with pytest.raises(ValueError):
            model.parse_noise([bad])


def test_rows_count_the_abnormal_cell_and_whether_the_report_names_it():
    from patchbench.analysis.comparison import CompareSettings
    from tools.calibration.trials import run_row

    m = model.Model(run_cv=0.01, questions=60, outlier_p=1.0, outlier_slow=(0.5, 0.6))
    c = run_row(m, 4, 3, 0, CompareSettings())
    assert c.abnormal == 6 and c.abnormal_named == 6  # 50 % slow: named in every report
    c = run_row(model.Model(questions=60), 4, 3, 0, CompareSettings())
    assert c.abnormal == 0 and c.abnormal_named == 0


def test_calibrate_refuses_bad_or_unused_noise(capsys):
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "calibrate.py"
    spec = importlib.util.spec_from_file_location("calibrate_noise_cli", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["calibrate_noise_cli"] = mod
    spec.loader.exec_module(mod)
    for argv in (["--noise", "bogus"], ["--noise", "t:1"], ["--sweep", "4", "--noise", "t"]):
        with pytest.raises(SystemExit) as e:
            mod.main(argv)
        assert e.value.code == 2
    assert "not to --mmmu-only or --sweep" in capsys.readouterr().err
