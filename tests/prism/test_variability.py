"""Variability models: the family that fits is chosen, parameters are recovered, real op
latencies are modelled with their heavy tails, and hardware samples explain simulated slowness."""
import json

import numpy as np
import polars as pl

from fleetscope.prism.schemas import HW_CORRELATION, VARIABILITY_MODELS
from fleetscope.prism.structure import build_job_graph
from fleetscope.prism.variability import fit_families, hw_correlation, select, variability_models


def test_lognormal_data_selects_lognormal_with_its_parameters():
    x = np.random.default_rng(3).lognormal(np.log(5e6), 0.05, 3000)
    fits = fit_families(x)
    d = fits[select(fits)][0]
    assert d.family in ("lognormal", "gamma")  # near-identical at this sigma; both pass KS
    ln = [f for f in fits if f[0].family == "lognormal"][0][0]
    assert abs(ln.params["mu"] - np.log(5e6)) < 0.005 and abs(ln.params["sigma"] - 0.05) < 0.005


def test_a_rare_slow_mode_selects_the_mixture():
    rng = np.random.default_rng(4)
    slow = rng.random(5000) < 0.04
    x = np.where(slow, rng.lognormal(np.log(1.6), 0.03, 5000), rng.lognormal(0.0, 0.02, 5000))
    fits = fit_families(x)
    d = fits[select(fits)][0]
    assert d.family == "mixture"
    assert abs(d.params["w_slow"] - 0.04) < 0.01 and abs(np.exp(d.params["mu_slow"]) - 1.6) < 0.02


def test_real_trace_models(real_timings):
    vm = variability_models(build_job_graph(real_timings))
    VARIABILITY_MODELS.validate(vm)
    per = vm.group_by("op_name", "dimension").agg(pl.col("selected").sum())
    assert (per["selected"] == 1).all()  # exactly one chosen family per op and dimension
    sel = vm.filter(pl.col("selected"))
    emb = sel.filter((pl.col("op_name") == "embedding-grads-all-reduce") & (pl.col("dimension") == "temporal")).row(0, named=True)
    # the embedding all-reduce is ~10 ms typically and ~25x slower in a few steps: a heavy tail
    assert emb["family"] != "normal" and emb["p99"] / emb["p50"] > 5
    fwd = sel.filter((pl.col("op_name") == "forward-compute") & (pl.col("dimension") == "spatial")).row(0, named=True)
    assert fwd["cv"] > 0.2  # the last stage's forward is twice the others': spatial spread
    json.loads(fwd["params"])


def test_hw_samples_explain_a_slow_gpu(sim_slow_gpu):
    t, hw, truth, cap = sim_slow_gpu
    hc = hw_correlation(t, hw, cap)
    HW_CORRELATION.validate(hc)
    row = hc.filter((pl.col("op_name") == "forward-compute") & (pl.col("metric") == "throttled")).row(0, named=True)
    # the slow GPU's samples carry throttle bits; its forward steps are the slow ones
    assert row["ratio_high"] > 1.3 * row["ratio_low"] and 0 < row["share_high"] < 0.2
    reasons = hc.filter((pl.col("op_name") == "forward-compute") & pl.col("metric").str.starts_with("throttle:"))
    assert reasons.height >= 1 and (reasons["ratio_high"] > reasons["ratio_low"]).all()  # Figure 4b: which NVML reason
    clk = hc.filter((pl.col("op_name") == "forward-compute") & (pl.col("metric") == "sm_clock_mhz")).row(0, named=True)
    assert clk["spearman_r"] < -0.1 and clk["p_value"] < 1e-3


def test_hw_correlation_without_hosts_is_empty_not_an_error(real_timings, sim_slow_gpu):
    hc = hw_correlation(real_timings, sim_slow_gpu[1])
    assert hc.height == 0 and set(hc.columns) == set(HW_CORRELATION.columns)


def test_kernel_models_from_real_profiler_traces():
    from pathlib import Path

    from fleetscope.prism.variability import kernel_variability_models, trace_kernel_executions
    from fleetscope.ingest.traces import read_trace

    hta = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real" / "hta"
    ev = pl.concat([read_trace(hta / "timeline_analysis__sampled_rank-0.json.gz", "hta").events,
                    read_trace(hta / "trace_filter__sampled_rank-1.json.gz", "hta").events], how="diagonal_relaxed")
    ex = trace_kernel_executions(ev)
    assert set(ex["step"].drop_nulls().unique()) == {551, 552}  # the two ProfilerStep annotations
    vm = kernel_variability_models(ev)
    VARIABILITY_MODELS.validate(vm)
    sel = vm.filter(pl.col("selected"))
    assert (sel.group_by("op_name", "dimension").len()["len"] == 1).all()
    nccl = sel.filter(pl.col("op_name").str.contains("nccl") & (pl.col("dimension") == "spatial"))
    assert nccl.height >= 1 and (nccl["n"] == 2).all()  # two ranks: one typical duration each
