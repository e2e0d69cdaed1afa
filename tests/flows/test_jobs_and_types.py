"""Job recognition and comm-type labels on hand-built fleets (tests/flows/synth.py), scored
against the fixture's own truth, which analyze_window never sees."""
import numpy as np
import polars as pl
import pytest

from fleetscope.flows import analyze_window
from fleetscope.sim.scoring import comm_type_accuracy, job_sets_exact
from tests.flows.synth import MS, S, Job, fleet


def _truth_frames(truths):
    jobs = pl.concat([pl.DataFrame({"job_id": [str(i)] * len(t["ips"]), "ip": t["ips"]}) for i, t in enumerate(truths)])
    pairs = pl.concat([pl.DataFrame([{"ip_a": a, "ip_b": b, "comm_type": c} for (a, b), c in t["pairs"].items()])
                       for t in truths])
    return jobs, pairs


def _run(jobs, n_steps=25, ws=3 * S, we=23 * S, **kw):
    flows, topo, truths = fleet(jobs, n_steps, **kw)
    out = analyze_window(flows, topo, ws, we)
    return out, truths, flows


def test_two_jobs_with_background_are_exact_and_typed():
    out, truths, _ = _run([Job(hosts=[0, 1, 2, 3], gpus=list(range(8)), dp=2, pp=2),
                           Job(hosts=[4, 5, 6, 7], gpus=[0, 1, 2, 3], dp=4, pp=1, period_ns=int(0.8 * S), phase_ns=300 * MS)])
    tj, tp = _truth_frames(truths)
    assert job_sets_exact(out["job_clusters"], tj) == (2, 2, 2)
    acc, n = comm_type_accuracy(out["comm_pairs"], tp)
    assert n == 48 and acc == 1.0
    bg = out["flow_background"]
    # storage traffic and the one-off flows between the two jobs are reported, not jobs
    assert set(bg["reason"]) == {"outside_topology", "aperiodic"}
    assert bg.filter(pl.col("reason") == "aperiodic").height == 2
    assert out["jobs"]["n_hosts"].sort().to_list() == [4, 4]


def test_tenant_with_two_small_jobs_on_the_same_hosts():
    # GPUs 0-3 and 4-7 of the same four hosts, different step periods: identical host sets, yet two jobs
    out, truths, _ = _run([Job(hosts=[0, 1, 2, 3], gpus=[0, 1, 2, 3], dp=2, pp=2, period_ns=int(1.1 * S)),
                           Job(hosts=[0, 1, 2, 3], gpus=[4, 5, 6, 7], dp=4, pp=1, period_ns=int(0.7 * S), phase_ns=123 * MS)])
    tj, _ = _truth_frames(truths)
    assert job_sets_exact(out["job_clusters"], tj) == (2, 2, 2)
    # the paper's rule alone (identical host sets -> one job) would have merged them
    assert out["job_clusters"].group_by("job_id").agg(pl.col("host").n_unique())["host"].to_list() == [4, 4]


def test_jobs_starting_and_stopping_inside_the_window():
    out, truths, _ = _run([Job(hosts=[0, 1, 2, 3], gpus=list(range(8)), dp=4, pp=1, t0_ns=9 * S),
                           Job(hosts=[4, 5, 6, 7], gpus=list(range(8)), dp=2, pp=2, t_end_ns=14 * S)], n_steps=30)
    tj, tp = _truth_frames(truths)
    assert job_sets_exact(out["job_clusters"], tj)[0] == 2
    assert comm_type_accuracy(out["comm_pairs"], tp)[0] == 1.0
    j = out["jobs"].sort("first_ns")
    assert j["last_ns"][0] < 14 * S + 1 * S  # the stopping job's traffic ends where it stopped
    assert j["first_ns"][1] >= 9 * S  # the late job appears when it starts


@pytest.mark.parametrize("case", ["equal_padded_buckets", "single_bucket"])
def test_size_count_fallbacks(case):
    buckets = [25 << 20] * 4 if case == "equal_padded_buckets" else [50 << 20]
    jobs = [Job(hosts=[0, 1, 2, 3], gpus=list(range(4)), dp=2, pp=2, buckets=buckets,
                channels=1 if case == "single_bucket" else 2)]
    out, truths, _ = _run(jobs)
    _, tp = _truth_frames(truths)
    cp = out["comm_pairs"]
    # the size count alone calls the DP pairs PP; the timing fallback recovers them
    assert comm_type_accuracy(cp, tp, "raw_type")[0] < 1.0
    assert comm_type_accuracy(cp, tp)[0] == 1.0
    assert (cp.filter(pl.col("comm_type") == "DP")["method"] != "size_count").all()


def test_refinement_and_fallback_on_a_mixed_job():
    # job A has unambiguous DP pairs; job B uses equal buckets -> in-DP-phase fallback or duty cycle
    jobs = [Job(hosts=[0, 1, 2, 3], gpus=list(range(8)), dp=4, pp=1, buckets=[1 << 20, 8 << 20, 8 << 20]),
            Job(hosts=[4, 5, 6, 7], gpus=list(range(4)), dp=2, pp=2, buckets=[16 << 20] * 3, period_ns=int(1.3 * S))]
    out, truths, _ = _run(jobs)
    _, tp = _truth_frames(truths)
    assert comm_type_accuracy(out["comm_pairs"], tp)[0] == 1.0


def test_retransmission_splits_and_missing_flows():
    flows, topo, truths = fleet([Job(hosts=[0, 1, 2, 3], gpus=list(range(8)), dp=2, pp=2)], 25)
    rng = np.random.default_rng(3)
    n = flows.height
    # ~1 % of flows lost by the collector
    flows = flows.filter(pl.Series(rng.random(n) > 0.01))
    # ~2 % split in two by a retransmission (bytes and time divided at a random point)
    split = pl.Series(rng.random(flows.height) < 0.02)
    frac = pl.Series(rng.uniform(0.2, 0.8, flows.height))
    f = flows.with_columns(split=split, frac=frac)
    keep = f.filter(~pl.col("split"))
    s = f.filter(pl.col("split"))
    mid = (pl.col("start_ns") + (pl.col("end_ns") - pl.col("start_ns")) * pl.col("frac")).cast(pl.Int64)
    p1 = s.with_columns(end_ns=mid, bytes=(pl.col("bytes") * pl.col("frac")).cast(pl.Int64))
    p2 = s.with_columns(start_ns=pl.min_horizontal(mid + 30_000, pl.col("end_ns")), bytes=pl.col("bytes") - (pl.col("bytes") * pl.col("frac")).cast(pl.Int64))
    flows = pl.concat([keep, p1, p2]).drop("split", "frac", "duration_ns").sort("start_ns")
    out = analyze_window(flows, topo, 3 * S, 23 * S)
    tj, tp = _truth_frames(truths)
    assert job_sets_exact(out["job_clusters"], tj)[0] == 1
    assert comm_type_accuracy(out["comm_pairs"], tp)[0] == 1.0


def test_rendezvous_inside_a_job_is_other():
    flows, topo, truths = fleet([Job(hosts=[0, 1, 2, 3], gpus=list(range(8)), dp=2, pp=2)], 25, background=False)
    # a TCP-store style exchange between two ranks that have no DP/PP traffic together
    a, b = "10.0.0.0", "10.0.3.7"
    rv = pl.DataFrame({"start_ns": [3 * S + 1000, 3 * S + 50_000, 4 * S], "end_ns": [3 * S + 2000, 3 * S + 51_000, 4 * S + 900],
                       "src_ip": [a, b, a], "dst_ip": [b, a, b], "bytes": [311, 95, 17]})
    out = analyze_window(pl.concat([flows.drop("duration_ns", "source_file"), rv], how="diagonal"), topo, 3 * S, 23 * S)
    row = out["comm_pairs"].filter((pl.col("ip_a") == a) & (pl.col("ip_b") == b))
    assert row["comm_type"].to_list() == ["other"] and row["method"].to_list() == ["aperiodic"]


def test_bad_input_raises_clear_errors():
    flows, topo, _ = fleet([Job(hosts=[0, 1], gpus=[0], dp=2, pp=1)], 5, background=False)
    with pytest.raises(ValueError, match="end_ns or duration_ns"):
        analyze_window(flows.drop("end_ns", "duration_ns"), topo, 0, 5 * S)
    with pytest.raises(ValueError, match="bad_bytes"):
        analyze_window(flows.with_columns(bytes=pl.lit(0)), topo, 0, 5 * S)
    with pytest.raises(ValueError, match="topology lacks"):
        analyze_window(flows, topo.drop("host"), 0, 5 * S)
    with pytest.raises(ValueError, match="empty window"):
        analyze_window(flows, topo, 5 * S, 5 * S)


def test_a_service_host_of_the_topology_reading_every_step_from_a_job_is_not_a_member_of_it():
    # the topology lists a storage server with no GPU named (ingestion defaults its gpu to its address)
    # beside GPUs that have one; it streams the job's input to one GPU every step, in time with the steps
    job = Job(hosts=[0, 1, 2, 3], gpus=[0, 1], dp=4, pp=1)
    flows, topo, truths = fleet([job], 25, background=False)
    t0 = int(flows["start_ns"].min())
    reads = pl.DataFrame({"start_ns": [t0 + k * job.period_ns + 5 * MS for k in range(25)]}).with_columns(
        end_ns=pl.col("start_ns") + 40 * MS, src_ip=pl.lit("172.20.0.2"), dst_ip=pl.lit("10.0.0.0"),
        bytes=pl.lit(256 << 20, dtype=pl.Int64), path=pl.lit(None, dtype=pl.List(pl.Utf8)))
    flows = pl.concat([flows, reads.with_columns(source_file=pl.lit("synth"),
                                                 duration_ns=pl.col("end_ns") - pl.col("start_ns")).select(flows.columns)
                       .cast(flows.schema)]).sort("start_ns")
    topo = pl.concat([topo, pl.DataFrame({"ip": ["172.20.0.2"], "host": ["stor-001"], "gpu": ["172.20.0.2"]})],
                     how="diagonal_relaxed")
    out = analyze_window(flows, topo, 3 * S, 23 * S)
    members = set(out["job_clusters"]["ip"].to_list())
    assert members == set(truths[0]["ips"])
    assert "172.20.0.2" not in set(out["comm_pairs"].filter(pl.col("comm_type").is_in(["DP", "PP"]))
                                   .select(pl.concat_list("ip_a", "ip_b").explode()).to_series().to_list())


def _cadenced(period_ns: int, n_steps: int, offset_ns: int = 0, jitter_ns: int = 0, seed: int = 0):
    """Flow starts (chunks every 25 ms on one clock-wide grid: the transport's pacing) over the last
    900 ms of each step, and the step ends, of one cluster."""
    rng = np.random.default_rng(seed)
    ends = offset_ns + period_ns * np.arange(1, n_steps + 1) + rng.integers(-jitter_ns, jitter_ns + 1, n_steps)
    grid = 25 * MS
    starts = np.concatenate([np.arange((e - 900 * MS) // grid * grid + grid, e, grid) for e in ends])
    return starts, ends


def test_two_jobs_whose_steps_drift_apart_stay_two_one_jobs_clusters_at_an_offset_are_one():
    # clusters on the same hosts that the flow starts could not tell apart (in the simulator, seed 2204,
    # both jobs' chunks moved at one cadence, which is all the starts' autocorrelation saw): their step
    # ends decide. b is another job (its own step period), c a replica of a's job ending its steps
    # 80 ms before a's, give or take 20 ms
    from fleetscope.flows.config import FlowConfig
    from fleetscope.flows.jobs import step_phase_locked

    n = 50
    ends = [_cadenced(int(1.113 * S), n)[1], _cadenced(int(1.259 * S), n, offset_ns=400 * MS)[1],
            _cadenced(int(1.113 * S), n, offset_ns=-80 * MS, jitter_ns=20 * MS, seed=1)[1]]
    ev = pl.concat([pl.DataFrame({"cluster_id": [i] * n, "t": e}, schema={"cluster_id": pl.Int64, "t": pl.Int64})
                    for i, e in enumerate(ends)])
    cand = pl.DataFrame({"a": [0, 0, 1], "b": [1, 2, 2]}, schema={"a": pl.Int64, "b": pl.Int64})
    assert step_phase_locked(cand, ev, FlowConfig()).rows() == [(0, 2)]


def test_clusters_of_a_job_of_long_steps_lock_in_few_cycles_among_a_fleets_candidates():
    # a job of 5 s steps shows five cycles in a window's worth of step ends: its clusters keep their
    # offset to a few hundredths of a cycle, a lump Rayleigh's test cannot clear among a fleet's 60
    # candidates (p 0.002) but the scan test does; a neighbour of 5.6 s steps on the same hosts does not
    from fleetscope.flows.config import FlowConfig
    from fleetscope.flows.jobs import phase_lock_p, step_phase_locked

    n = 6
    ends = [_cadenced(5 * S, n, jitter_ns=20 * MS)[1], _cadenced(int(5.6 * S), n, offset_ns=1300 * MS, jitter_ns=20 * MS, seed=2)[1],
            _cadenced(5 * S, n, offset_ns=-300 * MS, jitter_ns=20 * MS, seed=1)[1]]
    ev = pl.concat([pl.DataFrame({"cluster_id": [i] * n, "t": e}, schema={"cluster_id": pl.Int64, "t": pl.Int64})
                    for i, e in enumerate(ends)])
    # the fleet's other candidate pairs (clusters with no step ends here) count in the Bonferroni bar
    cand = pl.DataFrame({"a": [0, 0, 1] + list(range(10, 67)), "b": [1, 2, 2] + list(range(100, 157))},
                        schema={"a": pl.Int64, "b": pl.Int64})
    assert step_phase_locked(cand, ev, FlowConfig()).rows() == [(0, 2)]
    rng = np.random.default_rng(0)
    # uniform phases are not significant, whatever their number
    assert min(phase_lock_p(rng.uniform(size=k)) for k in (5, 20, 200)) > 0.01


def test_a_pair_left_whole_by_the_step_split_ends_a_step_once_per_cycle_of_its_period():
    # one burst per 5 s step of ten messages 200 ms apart, and no other gap level: cut by its period
    # (period_cycles) the pair ends one step per burst, wherever the cut falls in the window
    from fleetscope.flows.jobs import period_cycles

    starts = np.concatenate([k * 5 * S + 700 * MS + np.arange(10) * 200 * MS for k in range(8)])
    f = pl.DataFrame({"pid": pl.Series([7] * len(starts), dtype=pl.Int64), "start_ns": starts, "end_ns": starts + 50 * MS,
                      "seg": pl.Series([0] * len(starts), dtype=pl.Int64)})
    other = f.with_columns(pid=pl.lit(8, dtype=pl.Int64))
    out = period_cycles(pl.concat([f, other]), pl.DataFrame({"pid": [7, 8], "repeat_period_ns": [5.0 * S, None]}))
    cut = out.filter(pl.col("pid") == 7).group_by("seg").agg(n=pl.len(), t0=pl.col("start_ns").min()).sort("seg")
    assert cut["n"].to_list() == [10] * 8 and np.allclose(np.diff(cut["t0"].to_numpy()), 5 * S)
    assert out.filter(pl.col("pid") == 8)["seg"].unique().to_list() == [0]  # no period: left as it was


def _pair_flows(starts_ns, dur_ns, nbytes, ip_a="10.0.0.1", ip_b="10.0.1.1"):
    s = np.asarray(starts_ns, dtype=np.int64)
    return pl.DataFrame({"pid": pl.Series([1] * len(s), dtype=pl.Int64), "ip_a": ip_a, "ip_b": ip_b, "src_ip": ip_a, "dst_ip": ip_b,
                         "start_ns": s, "end_ns": s + dur_ns, "bytes": [nbytes] * len(s)})


def test_a_pair_moving_one_burst_of_parallel_channels_per_step_is_job_traffic_an_episode_of_copies_is_not():
    # four channels of one bucket each step (2.4 GB, 114 ms), then 760 ms of compute: every gap the
    # split can see is a step gap, so it sees one level and no step; the pair still repeats every step
    from fleetscope.flows.config import FlowConfig
    from fleetscope.flows.jobs import pair_summary
    from fleetscope.flows.prepare import segment

    cfg = FlowConfig()
    steps = np.arange(70) * 874 * MS
    dp = _pair_flows(np.repeat(steps, 4) + np.tile(np.arange(4) * 5_000, 70), 114 * MS, 2_430_343_494)
    # ... while the same GPU's one episode of equal storage writes, however regular inside, is not
    # traffic that repeats for as long as the GPU works
    ckpt = _pair_flows(30 * S + np.arange(12) * 50 * MS, 20 * MS, 8 << 20, ip_b="10.0.9.9").with_columns(pid=pl.lit(2, dtype=pl.Int64))
    p = pair_summary(segment(pl.concat([dp, ckpt]), ["pid"], cfg.split), cfg).sort("pid")
    assert p["n_steps"].to_list() == [1, 1]
    assert p["periodic"].to_list() == [True, False]
