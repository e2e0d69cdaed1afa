"""The what-if straggler analysis (fleetscope.prism.stragglers) against the StragglerAnalysis
artifact's own results on the real trace ST (result-ST.json, ms-ST.json, mw-ST.json), and on
cases derived from that trace whose truth (which worker, from which step, which microbatch
factors, the ideal) the analysis never sees (fleetscope.sim.derived)."""
import json

import numpy as np
import polars as pl
import pytest

from fleetscope.ingest.timings import read_timings
from fleetscope.prism.forecast import fit_step_model, ks_distance, ks_noise_floor, sample_step_times, straggler_verdicts
from fleetscope.prism.schemas import STRAGGLER_ATTRIBUTION, STRAGGLER_CAUSES, STRAGGLER_SLOWDOWN, STRAGGLER_SUMMARY
from fleetscope.prism.stragglers import analyze_stragglers
from fleetscope.prism.structure import build_job_graph, replay_job_graph
from fleetscope.sim.derived import DerivedCase, write_straggler_format

from tests.prism.conftest import REAL

IDEAL_TOL_ARTIFACT = 0.01  # our ideal vs the artifact's on ST (measured: 0.03 %)
IDEAL_TOL_TRUTH = 0.02     # vs the ideal known by construction on derived cases


@pytest.fixture(scope="module")
def st(real_timings):
    return analyze_stragglers(real_timings)


@pytest.fixture(scope="module")
def sa_result():
    return {k: json.loads((REAL / f"{k}-ST.json").read_text()) for k in ("result", "ms", "mw")}


def _att(a, dim):
    return {r["subject"]: r["slowdown"] for r in a.attribution.filter(pl.col("dimension") == dim).iter_rows(named=True)}


def test_replay_agrees_with_the_artifacts_simulator_on_st(real_timings, sa_result):
    g = build_job_graph(real_timings)
    # measured durations and gaps give back the measured steps ...
    assert np.abs(replay_job_graph(g, g.gap, g.dur) / g.measured_step_ns - 1).max() < 1e-4
    # ... and without the untraced gaps the artifact's own simulation of the same trace (step_t_nodelay)
    nodelay = replay_job_graph(g, np.zeros((g.n_slots, 1)), g.dur) / 1e9
    sa = np.array([sa_result["result"]["step_t_nodelay"][str(s)] for s in g.steps])
    assert np.abs(nodelay / sa - 1).max() < 0.005


def test_st_ideal_slowdown_and_attribution_match_the_artifact(st, sa_result):
    res, ms, mw = sa_result["result"], sa_result["ms"], sa_result["mw"]
    for schema, frame in ((STRAGGLER_SUMMARY, st.summary), (STRAGGLER_ATTRIBUTION, st.attribution),
                          (STRAGGLER_SLOWDOWN, st.slowdown), (STRAGGLER_CAUSES, st.causes)):
        schema.validate(frame)
    sa_ideal = float(np.mean(list(res["step_t_noblk"].values()))) * 1e9
    assert abs(st.ideal_ns / sa_ideal - 1) < IDEAL_TOL_ARTIFACT
    assert abs(st.S / res["blocking_slowdown"] - 1) < 0.01
    for dim, key in (("stage", "blocking_decompose_by_stage"), ("dp_rank", "blocking_decompose_by_dp_rank")):
        ours = _att(st, dim)
        for k, v in res[key].items():
            assert abs(ours[k] / v - 1) < 0.01, (dim, k, ours[k], v)
    ours = _att(st, "op_type")
    for k in ("forward-compute", "backward-compute", "grads-reduce-scatter", "optimizer"):
        assert abs(ours[k] / res["blocking_decompose_by_optype"][k] - 1) < 0.01, k
    s = st.summary.row(0, named=True)
    assert abs(s["ms"] - ms["Ms"]) < 0.05 and abs(s["mw"] - mw["Mw"]) < 0.05
    assert json.loads(s["mw_workers"]) == [7]  # the artifact's top worker: stage 3, dp 1 (score 1.178)


def test_st_names_the_imbalanced_stage_and_no_worker(st):
    c = st.causes
    assert c["cause"].to_list() == ["stage_partitioning"] and c["stage"].to_list() == [3] and c["team"][0] == "algorithm"
    assert c["share_of_slowdown"][0] > 0.8
    v = straggler_verdicts(st)
    assert v.filter(pl.col("scope") == "stage")["subject"].to_list() == ["3"]
    assert v.filter(pl.col("scope") == "rank").height == 0
    assert v.filter(pl.col("scope") == "job")["severity"][0] == "warning"


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_one_slow_worker_is_named_and_no_stage_is_blamed(derived, seed):
    t, truth = derived("slow_worker", seed)
    a = analyze_stragglers(t)
    assert abs(a.ideal_ns / truth["ideal_ns"] - 1) < IDEAL_TOL_TRUTH
    c = a.causes
    assert c["cause"].to_list() == ["worker"] and c["rank"].to_list() == [truth["slow_rank"]]
    assert c["share_of_slowdown"][0] > 0.5
    assert a.summary["mw"][0] > 0.5 and json.loads(a.summary["mw_workers"][0]) == [truth["slow_rank"]]
    v = straggler_verdicts(a)
    ranks = v.filter(pl.col("scope") == "rank")
    assert ranks["subject"].to_list() == [str(truth["slow_rank"])] and ranks["team"][0] == "operations"
    assert ranks["severity"][0] in ("warning", "critical")
    assert v.filter(pl.col("scope") == "stage").height == 0
    assert v.filter(pl.col("team") == "algorithm").height == 0


def test_slow_worker_on_the_real_imbalanced_pipeline(derived):
    """The real trace's stage 3 stays imbalanced: both the worker and stage 3 are named, the
    worker's own stage only when it is stage 3."""
    t, truth = derived("slow_worker", 14, balance=False)
    a = analyze_stragglers(t)
    c = a.causes
    assert set(c.filter(pl.col("cause") == "worker")["rank"].to_list()) == {truth["slow_rank"]}
    assert c.filter(pl.col("cause") == "stage_partitioning")["stage"].to_list() == [truth["source_heavy_stage"]]


@pytest.mark.parametrize("seed", [11, 12])
def test_sequence_length_imbalance_is_recognized(derived, seed):
    t, truth = derived("seq_imbalance", seed, dp=16)
    a = analyze_stragglers(t)
    assert abs(a.ideal_ns / truth["ideal_ns"] - 1) < IDEAL_TOL_TRUTH
    c = a.causes
    assert c["cause"].to_list() == ["sequence_length"] and c["team"][0] == "algorithm"
    assert c["share_of_slowdown"][0] > 0.3
    v = straggler_verdicts(a)
    seq = v.filter(pl.col("metric") == "sequence_length_imbalance")
    assert seq.height == 1 and seq["severity"][0] in ("warning", "critical")
    assert v.filter(pl.col("scope").is_in(["rank", "stage"])).height == 0


def test_a_heavier_stage_is_named(derived):
    t, truth = derived("heavy_stage", 13)  # stage factor 1.5 on a balanced pipeline
    a = analyze_stragglers(t)
    assert abs(a.ideal_ns / truth["ideal_ns"] - 1) < IDEAL_TOL_TRUTH
    assert a.S > 1.0  # the case slows the job ...
    assert a.causes.filter(pl.col("cause") == "stage_partitioning")["stage"].to_list() == [truth["heavy_stage"]]  # ... and is named
    assert a.causes.filter(pl.col("cause") == "worker").height == 0


@pytest.mark.parametrize("seed,dp", [(11, 4), (12, 8), (13, 16)])
def test_a_healthy_job_raises_nothing(derived, seed, dp):
    t, truth = derived("healthy", seed, dp=dp)
    a = analyze_stragglers(t)
    assert abs(a.ideal_ns / truth["ideal_ns"] - 1) < IDEAL_TOL_TRUTH
    assert a.S < 1.10
    v = straggler_verdicts(a)
    assert v.filter(pl.col("severity").is_in(["warning", "critical"])).height == 0


def test_heatmap_and_ideal_timeline(st):
    png = st.heatmap_png()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    tl = st.ideal_timeline()
    json.dumps(tl)
    ev = [e for e in tl["traceEvents"] if e["ph"] == "X"]
    assert all(isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0 for e in ev)
    assert "origin" in tl["otherData"]
    g = st.graph
    assert {e["tid"] // 16 for e in ev} == set(g.ranks.tolist())  # one track (or more) per rank
    by_tid = {}
    for e in ev:
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():  # slices of one track never overlap
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert max(e for s in by_tid.values() for _, e in s) == tl["otherData"]["ideal_step_us"]
    # the ideal step is the stage-balanced one: every stage's forward takes the same time
    fwd = {e["args"]["stage"]: e["dur"] for e in ev if e["name"] == "forward-compute"}
    assert max(fwd.values()) - min(fwd.values()) <= 1  # integer microseconds


def test_the_artifacts_format_gives_the_same_analysis(derived, tmp_path):
    t, truth = derived("slow_worker", 11)
    case = DerivedCase("sa-format-case", "slow_worker", t, {"dp": 4, "pp": 4, "tp": 1, "vpp": 1, "world_size": 16}, truth)
    write_straggler_format(case, tmp_path)
    t2 = read_timings(tmp_path)
    a1, a2 = analyze_stragglers(t), analyze_stragglers(t2)
    assert abs(a1.S / a2.S - 1) < 1e-4 and abs(a1.ideal_ns / a2.ideal_ns - 1) < 1e-4
    assert a2.causes["rank"].to_list() == [truth["slow_rank"]]


@pytest.mark.parametrize("kind,dp", [("slow_worker", 4), ("seq_imbalance", 8)])
def test_baseline_forecast_has_the_right_variability_structure(derived, kind, dp):
    """With 200 measured steps (KS noise floor ~0.06) the forecast of the measured job matches
    its step-time distribution: a worker slow in some steps is slow on all its ops in those
    steps, a long microbatch is long on every stage (independent draws miss both by 10-30 %)."""
    t, _ = derived(kind, 21, dp=dp, n_steps=200)
    g = build_job_graph(t)
    rng = np.random.default_rng(0)
    T = sample_step_times(fit_step_model(g), 6000, rng)
    meas = g.measured_step_ns
    floor = ks_noise_floor(T, len(meas), rng)
    assert abs(T.mean() / meas.mean() - 1) < 0.01
    assert ks_distance(T, meas) < max(0.12, floor + 0.06)


def test_a_large_job_limits_per_worker_what_ifs_and_still_names_the_worker(derived, monkeypatch):
    import fleetscope.prism.stragglers as st_mod
    monkeypatch.setattr(st_mod, "MAX_WORKERS", 16)
    t, truth = derived("slow_worker", 15, dp=32)
    a = analyze_stragglers(t)
    assert a.attribution.filter(pl.col("dimension") == "worker").height == 16
    assert any("16 of 128 workers" in n for n in a.notes)
    assert a.causes.filter(pl.col("cause") == "worker")["rank"].to_list() == [truth["slow_rank"]]


def test_a_slow_link_is_not_a_slow_worker(real_timings):
    """Every transfer over one pipeline link 120 ms longer (both of its ends record it): the
    analysis must not blame either end as a slow worker (their compute is normal) and sends the
    persistently slow transfers to operations."""
    from fleetscope.sim.derived import derive_case

    c = derive_case(real_timings, "slow_link", seed=13, dp=4, link_ms=120)
    a = analyze_stragglers(c.timings)
    assert a.causes.filter(pl.col("cause") == "worker").height == 0
    v = straggler_verdicts(a)
    loud = v.filter(pl.col("severity").is_in(["warning", "critical"]))
    assert loud.filter(pl.col("scope").is_in(["rank", "stage"])).height == 0
    comm = loud.filter(pl.col("subject").is_in(["forward-pp-comm", "backward-pp-comm"]))
    assert comm.height >= 1 and set(comm["team"]) == {"operations"}
    assert min(a.persistent_types[t] for t in comm["subject"]) >= 1.03
