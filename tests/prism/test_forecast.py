"""step_forecasts, the PRISM scenarios and the straggler verdicts, on the real StragglerAnalysis
trace (known problem: the last pipeline stage is too long) and on simulated jobs whose ground
truth the code never sees."""
import json

import numpy as np
import polars as pl
import pytest

from fleetscope.prism.forecast import forecast_capture, step_forecasts
from fleetscope.prism.schemas import SCENARIO_DETAILS, STEP_FORECASTS
from tests.prism.conftest import REAL


@pytest.fixture(scope="module")
def real(real_timings):
    return forecast_capture(real_timings, seed=0)


@pytest.fixture(scope="module")
def healthy(sim_healthy):
    t, hw, _, cap = sim_healthy
    return forecast_capture(t, hw=hw, plots=False, n_samples=5000, scale_ranks=(65536,))


@pytest.fixture(scope="module")
def slow_gpu(sim_slow_gpu):
    t, hw, truth, cap = sim_slow_gpu
    return forecast_capture(t, hw=hw, plots=False, n_samples=5000, scale_ranks=(65536,)), truth


def _row(fc, scenario):
    return fc.filter(pl.col("scenario") == scenario).row(0, named=True)


def test_real_baseline_matches_the_measured_steps(real):
    STEP_FORECASTS.validate(real.step_forecasts)
    b = _row(real.step_forecasts, "baseline")
    assert b["n_measured"] == 32 and b["n_samples"] == 10_000 and b["n_ranks"] == 8
    assert abs(b["mean_error_pct"]) <= 1.0
    floor = json.loads(b["params"])["ks_noise_floor"]
    # with 32 measured steps a perfect model shows KS ~0.13; ours must be close to that
    assert 0.05 < floor < 0.25 and b["ks_vs_measured"] <= floor + 0.08


def test_real_no_stragglers_is_the_what_if_ideal(real):
    ns = _row(real.step_forecasts, "no_stragglers")
    meas = _row(real.step_forecasts, "baseline")["measured_mean_ns"]
    # one value per measured step (the step-to-step variation of healthy ops), their mean the
    # straggler_summary's: the two tables agree
    assert ns["n_samples"] == 32 and ns["p5_ns"] < ns["p95_ns"]
    assert 0.6 * meas < ns["mean_ns"] < 0.95 * meas
    assert ns["mean_ns"] == pytest.approx(real.stragglers.summary["ideal_with_gaps_ns"][0], rel=1e-9)
    # the artifact's ideal (its simulation removes untraced gaps; ours puts their typical value back)
    sa = json.loads((REAL / "result-ST.json").read_text())
    sa_ideal = float(np.mean(list(sa["step_t_noblk"].values()))) * 1e9
    assert abs(ns["mean_ns"] / sa_ideal - 1) < 0.05
    assert abs(json.loads(ns["params"])["ideal_without_gaps_ns"] / sa_ideal - 1) < 0.01


def test_real_stage_imbalance_goes_to_algorithm(real):
    v = real.verdicts
    job = v.filter(pl.col("scope") == "job").row(0, named=True)
    assert job["severity"] in ("warning", "critical") and job["team"] == "algorithm"
    st = v.filter(pl.col("scope") == "stage")
    assert st["subject"].to_list() == ["3"] and st["team"].to_list() == ["algorithm"]
    assert v.filter(pl.col("scope") == "rank").height == 0  # both DP replicas of stage 3: not a GPU


def test_real_scenarios(real):
    d = real.details
    SCENARIO_DETAILS.validate(d)
    assert set(d["scenario"].unique()) == {"slow_node_placement", "kernel_sensitivity", "attribution", "sync_group_size", "scale_slowdown"}
    stage = d.filter((pl.col("scenario") == "slow_node_placement") & pl.col("subject").str.starts_with("stage="))
    assert stage.filter(pl.col("rank_order") == 1)["subject"][0] == "stage=3"  # a slow GPU hurts most on the longest stage
    node = d.filter((pl.col("scenario") == "slow_node_placement") & pl.col("parameter").str.starts_with("tp=8"))
    sd = dict(zip(node["subject"].to_list(), node["slowdown"].to_list()))
    assert len(sd) == 5 and sd["node@stage=3"] > sd["node@stage=0"] >= 1.0 and sd["spread_over_tp_groups"] > sd["node@stage=0"]
    ks = d.filter((pl.col("scenario") == "kernel_sensitivity") & (pl.col("parameter") == "cv=0.2")).sort("rank_order")
    assert ks["subject"][0] in ("forward-compute", "backward-compute")  # compute is on the critical path
    assert ks["slowdown"][0] > ks.filter(pl.col("subject") == "optimizer-clip-main-grad")["slowdown"][0]
    sync = d.filter((pl.col("scenario") == "sync_group_size") & (pl.col("parameter") == "slowdown_q80"))
    q80 = dict(zip(sync["subject"].to_list(), sync["slowdown"].to_list()))
    assert q80["tp=1"] < q80["tp=8"] < q80["tp=72"]  # larger synchronous groups slow down more
    sc = d.filter((pl.col("scenario") == "scale_slowdown") & (pl.col("parameter") == "P(slowdown>=1.01)"))
    p = dict(zip(sc["subject"].to_list(), sc["probability"].to_list()))
    assert p["ranks=1024"] <= p["ranks=65536"] + 0.02
    assert _row(real.step_forecasts, "scale_65536ranks")["n_ranks"] == 65536
    assert "straggler_heatmap" in real.plots
    for name, png in real.plots.items():
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, name


def test_healthy_simulated_job(healthy):
    b = _row(healthy.step_forecasts, "baseline")
    assert abs(b["mean_error_pct"]) <= 1.0
    assert healthy.verdicts.filter(pl.col("severity").is_in(["warning", "critical"])).height == 0


def test_slow_gpu_is_found_and_sent_to_operations(slow_gpu):
    res, truth = slow_gpu
    bad_rank = str(truth[0]["rank"])
    v = res.verdicts
    ranks = v.filter(pl.col("scope") == "rank")
    assert ranks["subject"].to_list() == [bad_rank]  # its TP peer waits for it: not blamed
    assert ranks["team"][0] == "operations" and ranks["severity"][0] in ("warning", "critical")
    assert v.filter(pl.col("team") == "algorithm").height == 0
    assert abs(_row(res.step_forecasts, "baseline")["mean_error_pct"]) <= 1.5


def test_step_forecasts_per_capture_and_bad_input(real_timings):
    both = pl.concat([real_timings, real_timings.with_columns(capture_id=pl.lit("copy"))])
    fc = step_forecasts(both, n_samples=2000, scale_ranks=(), sync_sizes=(1, 8))
    assert set(fc["capture_id"]) == {"straggler_analysis", "copy"}
    with pytest.raises(ValueError, match="op' or 'kernel"):
        forecast_capture(real_timings.with_columns(kind=pl.lit("api")))


def test_healthy_four_stage_pipeline_raises_nothing(sim_healthy_pp4):
    res = forecast_capture(sim_healthy_pp4, plots=False, n_samples=3000, scale_ranks=(), sync_sizes=(1, 8))
    v = res.verdicts
    assert v.filter(pl.col("severity").is_in(["warning", "critical"])).height == 0
    job = v.filter(pl.col("scope") == "job").row(0, named=True)
    assert job["value"] < 1.05  # measured over no_stragglers: a healthy job is close to its ideal
