"""DP / PP labels from how a pair's two directions move: an exchange's two ends START together, a
pipeline hop's activation and gradient do not (inside one job the two kinds split on it where
their overlaps do not), and where they start together significantly LESS often
than chance the pair is a pipeline hop whatever its overlap; a weak hop inside a job is the job's traffic. The simulator
seeds are fleets whose conventions the rules were not drawn from; their truth is scored, never read."""
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from benchmarks.flows_accuracy import run_folder, simulated
from fleetscope.flows.comm_types import direction_features

MS = 1_000_000


def _flows(rows):
    return pl.DataFrame(rows, schema={"pid": pl.Int64, "src_ip": pl.Utf8, "ip_a": pl.Utf8,
                                      "start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row")


def _pair(pid, n, period, a_off, a_dur, b_off, b_dur, rng):
    rows = []
    for k in range(n):
        t = k * period + int(rng.integers(0, period // 20))
        rows.append((pid, "10.0.0.1", "10.0.0.1", t + a_off, t + a_off + a_dur))
        rows.append((pid, "10.0.0.2", "10.0.0.1", t + b_off, t + b_off + b_dur))
    return rows


def test_an_exchange_starts_both_ways_together_a_pipeline_hop_does_not():
    rng = np.random.default_rng(3)
    period = 200 * MS
    # 1: a two-rank exchange: both ends send at once, one end's chunk takes 4x longer (overlap
    #    of the short direction full, of the long one a quarter: below half on average)
    # 2: a pipeline hop whose long activation streams while the gradient comes back (overlaps,
    #    never starts with it)
    rows = _pair(1, 120, period, 0, 40 * MS, 1 * MS, 10 * MS, rng) + \
        _pair(2, 120, period, 0, 60 * MS, 30 * MS, 10 * MS, rng)
    f = _flows(rows)
    d = direction_features(f, pl.DataFrame({"pid": [1, 2], "period_ns": [float(period)] * 2})).sort("pid")
    ex, pp = d.row(0, named=True), d.row(1, named=True)
    assert ex["start_co"] > 0.9 and ex["start_co_chance"] < 0.3, ex
    assert pp["start_co"] < 0.05 and pp["overlap"] > 0.9, pp


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pair_timing")


def _job_pairs(r, job):
    t = r["_truth"]["pairs"].filter(pl.col("job_id") == job).select("ip_a", "ip_b", true="comm_type")
    got = r["_tables"]["comm_pairs"].select("window_id", "ip_a", "ip_b", "comm_type", "method")
    return t.join(got, on=["ip_a", "ip_b"], how="left")


@pytest.mark.parametrize("seed,job,why,at_most", [
    # ZeRO PP2 with 256 MB activations streaming while gradients return, overlap 0.6: 16 of 32 were DP;
    # three pairs' starts avoid the other direction's too weakly to pass the window's bar: they stay DP
    (2217, "job-001", "pipeline hops overlapping more than half", 3),
    # ZeRO TP4 x PP2 x DP2 whose pipeline hops overlap half the time (0.48-0.55) and start together
    # about as often as chance (z 4-6), its exchanges 0.88: no two-fold gap in the overlap, so all 32
    # pairs were DP (and its steps were microbatches: 59,757 for 3,968); the start coincidence
    # splits them (0.04-0.07 against 0.87-0.89), the job's structure bears it out
    (2230, "job-001", "pipeline hops overlapping about half", 0),
    # DDP TP4 x DP4 whose two-rank exchanges start together at two levels (0.26-0.33 and 0.57-0.64)
    # while overlapping alike (0.53-0.66): no two kinds of hop; the start split made 5 of 8 PP
    (2203, "job-003", "exchanges whose starts spread in two levels", 0),
    # DDP whose light tree hops carry 1/2000 of the ring's bytes: 80 of 192 were not job traffic
    (2209, "job-000", "weak hops inside the job", 0),
    # DDP TP8 x PP2 x DP2 whose pipeline gradients come back in three flows per activation (as many
    # bytes each way, a third of the flows): the flow count made 12 of 16 pipeline hops one-way
    # collectives, and the structure then made the 16 exchanges (overlap 0.97) pipeline hops
    (2366, "job-000", "pipeline hops whose gradients travel in more flows", 0),
])
def test_the_pairs_of_a_simulated_job_get_their_true_labels(data, seed, job, why, at_most):
    r = run_folder(simulated(data, seed, 64, 2, ""))
    j = _job_pairs(r, job)
    assert j.height >= 16, why
    wrong = j.filter(pl.col("comm_type").is_null() | (pl.col("comm_type") != pl.col("true")))
    assert wrong.height <= at_most, (why, j.height, wrong.group_by("true", "comm_type", "method").len().rows())


@pytest.mark.parametrize("seed,job,methods", [
    # FSDP TP4 x DP2 over TCP: each two-rank group all-gathers every unit in forward and backward,
    # so its link is busy nine tenths of the time and any shift of one direction overlaps the other
    # as often as the real alignment does (overlap z about 0): the overlap settles nothing and the
    # size count (one size) made all four groups PP. Both ends still start each exchange together
    # (z 8-9 against the shifted chance): a collective hop
    (2296, "job-001", {"starts_together"}),
    # FSDP TP4 x DP2 over RDMA: four of its two-rank groups overlap 0.38-0.50, above chance (z 13-19)
    # but under half, and start together far more often than chance (z 9-12). With no overlap level
    # from the window's jobs, under half was read as a 1F1B pipeline hop meeting its gradient now
    # and then: 6 of 8 PP
    (2369, "job-002", {"both_ways_together", "starts_together"}),
])
def test_a_two_rank_fsdp_group_is_dp_by_its_starts(data, seed, job, methods):
    r = run_folder(simulated(data, seed, 64, 2, ""))
    j = _job_pairs(r, job)
    assert j.height >= 8 and (j["true"] == "DP").all()
    wrong = j.filter(pl.col("comm_type").is_null() | (pl.col("comm_type") != pl.col("true")))
    assert wrong.height == 0, wrong.group_by("true", "comm_type", "method").len().rows()
    assert set(j["method"]) <= methods, set(j["method"])
