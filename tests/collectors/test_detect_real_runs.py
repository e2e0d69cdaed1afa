"""XPUTimer metrics and detectors on the real CPU training runs: each injected fault is known to
the test (it chose it), never to the code under test."""
from __future__ import annotations

import polars as pl

from fleetscope.ingest.timings import read_timings
from fleetscope.xputimer import detectors as D
from fleetscope.xputimer import metrics as M
from fleetscope.xputimer.degradation import detect_degradation

WORLD = 4


def _t(landing, cap):
    return read_timings(landing / "timings" / cap)


def _bad(v):
    return v.filter(pl.col("severity").is_in(["warning", "critical"]))


def test_healthy_run_raises_nothing(real_runs):
    landing, _ = real_runs
    out = D.analyze(_t(landing, "healthy_b"), history=_t(landing, "healthy_a"), job_id="demo")
    assert _bad(out["verdicts"]).height == 0, out["verdicts"]["explanation"].to_list()
    # PerfTracker 4.1 with its defaults: never 'blocked' on a healthy run (degraded is info only)
    from fleetscope.xputimer.degradation import degradation_verdicts
    _, deg = detect_degradation(_t(landing, "healthy_b"))
    assert deg.filter(pl.col("kind") == "blocked").height == 0
    assert _bad(degradation_verdicts(deg, "demo")).height == 0
    # and the tables are there with sensible contents
    assert out["xputimer_step_throughput"].height == 30
    assert out["xputimer_job_throughput"]["steps_per_s"][0] > 1


def test_collective_instances_match_across_ranks(real_runs):
    landing, _ = real_runs
    ci = M.comm_instances(_t(landing, "healthy_a"))
    assert ci.height == 30 * 7 and (ci["n_ranks"] == WORLD).all()
    bw = M.comm_bandwidth(ci)
    assert sorted(bw["bytes"].to_list()) == [256 * 4, 256 * 256 * 4]
    # nccl-tests convention: busbw = algbw * 2(n-1)/n for all-reduce
    assert ((ci["busbw_bps"] / ci["algbw_bps"] - 2 * (WORLD - 1) / WORLD).abs() < 1e-9).all()


def test_gc_stall_goes_to_algorithm_on_rank_1(real_runs):
    """The GC pauses come from the training script's own heap (demo_train's --gc-heap): the script is
    where they are fixed (detectors.TEAM_FOR_CAUSE)."""
    landing, _ = real_runs
    out = D.analyze(_t(landing, "gc"), history=_t(landing, "healthy_a"), job_id="demo")
    bad = _bad(out["verdicts"])
    assert bad.height >= 1
    assert set(bad["team"].to_list()) == {"algorithm"}
    assert ("rank", "1") in bad.select("scope", "subject").rows()


def test_unnecessary_sync_flagged_by_issue_latency(real_runs):
    """The sync run is flagged: one issue-latency verdict, to the algorithm team, and nothing else.
    Robust by design rather than by a weaker check: the injected fault aligns the ranks through the
    whole forward (8 synchronizations), the history is the two healthy runs made just before it,
    and the latencies are fractions of each run's median step (a machine that is slower overall
    shifts nothing). The healthy run against the other healthy run is the control: its shift must
    stay below the sync run's (not half of it: at load 5 on this 2-core box two healthy runs differed
    by KS 0.08 while the sync run's was 0.15, p 2e-11; the verdict below is the property)."""
    landing, _ = real_runs
    hist = pl.concat([_t(landing, "healthy_a"), _t(landing, "healthy_b")])
    out = D.analyze(_t(landing, "sync"), history=hist, job_id="demo")
    ks_sync, p_sync = out["xputimer_issue_latency_summary"].select("ks_vs_history", "p_value").row(0)
    base = D.analyze(_t(landing, "healthy_b"), history=_t(landing, "healthy_a"), job_id="demo")
    ks_healthy = base["xputimer_issue_latency_summary"]["ks_vs_history"][0]
    assert p_sync < 1e-6 and ks_sync > ks_healthy, (ks_sync, p_sync, ks_healthy)
    bad = _bad(out["verdicts"])
    assert bad.select("metric", "team").rows() == [("issue_latency_ks_sync", "algorithm")], bad


def test_slow_dataloader_v_inter_and_degradation(real_runs):
    landing, _ = real_runs
    t = _t(landing, "slowdl")
    out = D.analyze(t, history=_t(landing, "healthy_a"), job_id="demo")
    bad = _bad(out["verdicts"])
    assert "algorithm" in bad["team"].to_list()
    assert {"v_inter", "issue_latency_ks_dataloader"} & set(bad["metric"].to_list())
    # PerfTracker 4.1: the iteration sequence is found and the slowdown from batch 16 is flagged
    # the paper's 5 % needs a quiet machine: on this shared 2-core box healthy steps vary 2-3x
    # (mean/min up to 2.5 measured), so here the threshold is mean > 3.5 x min and the stall 500 ms
    its, deg = detect_degradation(t, threshold=2.5)
    assert its.filter(pl.col("rank") == 0).height >= 40 - 12
    d = deg.filter(pl.col("kind") == "degraded")
    assert set(d["rank"].to_list()) == set(range(WORLD))
    # not before the fault: the first slow batch is the 16th, fetched at the start of step 15
    fault = t.filter((pl.col("name") == "dataloader.next") & (pl.col("step") == 15)).select("rank", pl.col("start_ns").alias("f"))
    assert d.join(fault, on="rank").select((pl.col("at_ns") >= pl.col("f")).all()).item()
    _, deg_h = detect_degradation(_t(landing, "healthy_a"), threshold=2.5)
    assert deg_h.filter(pl.col("kind") == "degraded").height == 0


def test_pipeline_run_send_recv_and_stage_imbalance(tmp_path):
    """2 pipeline stages x 2 DP ranks, 4 microbatches; stage 1 holds 6 of 8 layers."""
    from fleetscope.collectors import demo_train

    demo_train.run(["--world", "4", "--pp", "2", "--stage-layers", "2,6", "--steps", "15", "--hidden", "256",
                    "--batch", "32", "--landing", str(tmp_path), "--capture", "pp", "--job-id", "pp"])
    t = read_timings(tmp_path / "timings" / "pp")
    # the layout the job gave the tracer: stage = rank // 2, dp_rank = rank % 2
    lay = t.select("rank", "stage", "dp_rank").unique().sort("rank")
    assert lay.rows() == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    # activations / gradients between stages: one send and one recv per microbatch per rank, 8 x 256 fp32
    p2p = t.filter(pl.col("name").is_in(["gloo:Send", "gloo:Recv"])).group_by("rank", "name").agg(pl.len(), pl.col("bytes").unique())
    assert (p2p["len"] == 15 * 4).all() and p2p["bytes"].explode().unique().to_list() == [8 * 256 * 4]
    # the DP all-reduces run in each stage's own group: 2 groups of 2 ranks
    ar = t.filter(pl.col("name") == "gloo:AllReduce")
    assert ar["group"].n_unique() == 2 and (ar["group_size"] == 2).all()
    ci = M.comm_instances(t).filter(pl.col("collective") == "allreduce")
    assert (ci["n_ranks"] == 2).all()
    out = D.analyze(t, job_id="pp")
    bad = _bad(out["verdicts"])
    assert bad.select("scope", "subject", "team").rows() == [("stage", "1", "algorithm")]
