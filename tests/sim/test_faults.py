"""Each injected fault changes the execution where it should, and only there. The faulty fleet and its
healthy twin share the seed (same jobs, same hosts, same conventions, same compute noise)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fleetscope.sim import simulate
from fleetscope.sim.faults import FLOW_KINDS, KINDS, parse_spec
from tests.sim.conftest import Fleet


def _steps(fleet, job_id, lo=None, hi=None) -> pl.Series:
    s = fleet.truth("steps").filter(pl.col("job_id") == job_id)
    if lo is not None:
        s = s.filter(pl.col("start_ns") >= lo)
    if hi is not None:
        s = s.filter(pl.col("end_ns") < hi)
    return s["end_ns"] - s["start_ns"]


def _fault(fleet, kind) -> dict:
    rows = fleet.truth("faults").filter(pl.col("kind") == kind)
    assert rows.height == 1, kind
    return rows.row(0, named=True)


def test_healthy_fleet_has_no_faults_and_the_faulty_one_lists_each(healthy256, faulty256):
    assert healthy256.truth("faults").height == 0
    f = faulty256.truth("faults")
    assert set(f["kind"]) == set(KINDS)
    assert f["fault_id"].n_unique() == f.height
    assert (f["end_ns"] > f["start_ns"]).all()
    # every fault but the hang shows in its job's step times: impact = mean step with / without it
    shown = f.filter(pl.col("kind") != "hang")
    assert (shown["impact"] >= 1.0).all() and (shown["impact"] > 1.02).mean() > 0.6


@pytest.mark.parametrize("kind", ["slow_gpu", "straggler", "nvlink_down", "throttled_racks", "slow_dataloader",
                                  "congested_switch", "degraded_nic", "flapping_link", "nic_overload"])
def test_a_fault_slows_a_job_it_touches_once_it_starts(healthy256, faulty256, kind):
    r = _fault(faulty256, kind)
    hung = _fault(faulty256, "hang")["job_id"]
    jobs = [j for j in (r["affected_jobs"] or r["job_id"] or "").split("|") if j and j != hung]
    assert jobs
    lo, hi = faulty256.window
    ratios = []
    for j in jobs:
        # the same steps in both fleets (step numbers are the same; a hang may cut the faulty one short)
        a = faulty256.truth("steps").filter((pl.col("job_id") == j) & (pl.col("start_ns") >= max(r["start_ns"], lo))
                                            & (pl.col("end_ns") < r["end_ns"]))
        b = healthy256.truth("steps").filter(pl.col("job_id") == j)
        m = a.join(b, on=["ip", "step"], suffix="_h")
        if m.height:
            ratios.append(float(((m["end_ns"] - m["start_ns"]).sum()) / (m["end_ns_h"] - m["start_ns_h"]).sum()))
    assert ratios and max(ratios) > 1.005, (kind, ratios)


def test_nothing_changes_before_a_fault_starts_and_other_jobs_never_change(tmp_path, healthy64):
    simulate(tmp_path, gpus=64, seed=0, faults="slow_gpu:1", captures=False)
    f = Fleet(tmp_path, {})
    r = _fault(f, "slow_gpu")
    lo, _ = healthy64.window
    if r["start_ns"] > lo:
        a, b = _steps(f, r["job_id"], hi=r["start_ns"]), _steps(healthy64, r["job_id"], hi=r["start_ns"])
        assert a.len() == b.len() and (a == b).all()
    assert _steps(f, r["job_id"], lo=r["start_ns"]).mean() > 1.05 * _steps(healthy64, r["job_id"], lo=r["start_ns"]).mean()
    for j in set(healthy64.truth("job_layout")["job_id"]) - {r["job_id"]}:
        a, b = _steps(f, j), _steps(healthy64, j)
        assert a.len() == b.len() and (a == b).all(), j


def test_sync_in_forward_is_there_all_along(faulty256):
    r = _fault(faulty256, "sync_in_forward")
    lo, hi = faulty256.window
    assert r["start_ns"] < lo and r["end_ns"] > hi                     # a code bug: there all along
    assert r["scope"] == "job" and r["subject"] == r["job_id"]


def test_degraded_nic_slows_its_rings_records_but_not_the_jobs_other_rings(healthy256, faulty256):
    r = _fault(faulty256, "degraded_nic")
    ip = r["subject"]
    lo, hi = max(r["start_ns"], faulty256.window[0]), r["end_ns"]
    pairs = faulty256.truth("pairs").filter((pl.col("job_id") == r["job_id"]) & (pl.col("comm_type") == "DP"))

    def busy_bw(fleet, sel):
        f = fleet.flows().filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi) & (pl.col("bytes") > 100_000))
        f = f.with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"))
        f = f.join(sel.select("ip_a", "ip_b"), on=["ip_a", "ip_b"], how="semi")
        return float((f["bytes"] / f["duration_ns"].clip(1)).median()) if f.height else float("nan")

    mine = pairs.filter((pl.col("ip_a") == ip) | (pl.col("ip_b") == ip))
    assert mine.height, "this seed's degraded NIC carries no DP traffic: pick a seed whose fault sits on a DP ring"
    # the landed records through the NIC move fewer bytes per second than in the healthy twin
    assert busy_bw(faulty256, mine) < 0.9 * busy_bw(healthy256, mine)
    # a ring on another rail of the same job is not paced by it
    rail = faulty256.truth("jobs").with_columns(rail=pl.col("gpu").str.extract(r"gpu(\d+)$"))
    my_rail = rail.filter(pl.col("ip") == ip)["rail"][0]
    other_ips = rail.filter((pl.col("job_id") == r["job_id"]) & (pl.col("rail") != my_rail))["ip"]
    other = pairs.filter(pl.col("ip_a").is_in(other_ips.implode()) & pl.col("ip_b").is_in(other_ips.implode()))
    if other.height:
        assert busy_bw(faulty256, other) == pytest.approx(busy_bw(healthy256, other), rel=0.1)


def test_nic_overload_puts_a_hosts_traffic_on_one_nic(faulty256):
    r = _fault(faulty256, "nic_overload")
    jobs = faulty256.truth("jobs").filter(pl.col("job_id") == r["job_id"])
    seen = jobs.filter("observed")
    assert seen.group_by("host").len()["len"].max() == 1
    assert set(seen["ip"]) == set(r["ips"].split("|"))
    assert r["start_ns"] < faulty256.window[0]


def test_flapping_link_stalls_the_steps_it_hits(healthy256, faulty256):
    r = _fault(faulty256, "flapping_link")
    a = faulty256.truth("steps").filter(pl.col("job_id") == r["job_id"]).with_columns(d=pl.col("end_ns") - pl.col("start_ns"))
    b = healthy256.truth("steps").filter(pl.col("job_id") == r["job_id"]).with_columns(d=pl.col("end_ns") - pl.col("start_ns"))
    ratio = a.group_by("step").agg(pl.col("d").median()).join(b.group_by("step").agg(pl.col("d").median()), on="step")
    ratio = (ratio["d"] / ratio["d_right"]).to_numpy()
    assert ratio.max() > 1.05 and np.median(ratio) < ratio.max()


def test_hang_stops_the_job(faulty256, healthy256):
    r = _fault(faulty256, "hang")
    job = r["job_id"]
    ips = faulty256.truth("jobs").filter(pl.col("job_id") == job)["ip"]
    pairs = faulty256.truth("pairs").filter(pl.col("job_id") == job)
    f = faulty256.flows().with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"))
    f = f.join(pairs.select("ip_a", "ip_b"), on=["ip_a", "ip_b"], how="semi")
    assert f.height == 0 or f["start_ns"].max() < r["start_ns"] + 200_000      # nothing after the hang (but skew)
    steps = faulty256.truth("steps").filter(pl.col("job_id") == job)
    assert steps.height == 0 or steps["end_ns"].max() < r["start_ns"]
    assert healthy256.truth("steps").filter((pl.col("job_id") == job) & (pl.col("end_ns") > r["start_ns"])).height > 0
    assert ips.len() > 0


def test_random_faults_are_drawn_per_seed(tmp_path):
    kinds, subjects, starts = set(), set(), []
    for seed in range(6):
        s = simulate(tmp_path / str(seed), gpus=128, seed=seed, faults="random:2", minutes=0.5, captures=False)
        f = pl.read_csv(tmp_path / str(seed) / "ground_truth" / "faults.csv")
        assert f.height == 2 and set(f["kind"]) <= set(FLOW_KINDS)
        kinds |= set(f["kind"])
        subjects |= set(f["subject"])
        starts += ((f["start_ns"] - s["window"][0]) / (s["window"][1] - s["window"][0])).to_list()
    assert len(kinds) >= 4 and len(subjects) >= 10
    assert max(starts) - min(starts) > 0.3


def test_fault_spec_parsing():
    assert parse_spec("") == [] and parse_spec("none") == [] and parse_spec(None) == [] and parse_spec("healthy") == []
    assert parse_spec("slow_gpu, congested_switch:2") == [("slow_gpu", 1), ("congested_switch", 2)]
    assert parse_spec("random:3") == [("random", 3)]
    with pytest.raises(ValueError, match="known kinds"):
        parse_spec("slow:1")


def test_a_congested_switch_or_degraded_nic_slows_the_background_transfers_through_it():
    """Storage reads and checkpoints crossing a faulty element while it is active move at its
    remaining bandwidth, like the jobs' flows; transfers elsewhere, before its start, and latency-bound
    probes keep their drawn durations."""
    from fleetscope.sim.background import KIND_PROBE, KIND_STORAGE, slowed_by_faults
    from fleetscope.sim.fabric import build_fabric, flow_hash
    from fleetscope.sim.faults import Fault

    fab = build_fabric(64, seed=0)
    storage = fab.n_gpus                       # the first storage server
    nic = np.array([0, 0, 0, 8, 0])            # GPU NICs (0 and 8 on different hosts)
    kind = np.array([KIND_STORAGE, KIND_STORAGE, KIND_PROBE, KIND_STORAGE, KIND_STORAGE], dtype=np.int8)
    start = np.array([5, 5, 5, 5, 1], dtype=np.int64) * 1_000_000_000
    src = np.full(5, storage, dtype=np.int32)
    bg = {"job": np.zeros(5, np.int32), "kind": kind, "step": np.full(5, -1), "src": src, "dst": nic.astype(np.int32),
          "fh": flow_hash(src, nic, 0, 0, kind).view(np.int64), "start": start,
          "dur": np.full(5, 1_000_000, dtype=np.int64), "busy": np.full(5, 1_000_000, dtype=np.int64),
          "bytes": np.full(5, 10_000_000, dtype=np.int64)}
    f = Fault("F0", "degraded_nic", "link", "x", 2_000_000_000, 9_000_000_000, 0.25, endpoint=0)
    out = slowed_by_faults(bg, fab, [f])
    # through NIC 0 while active: 4x longer; the probe, NIC 8 and the read before the onset unchanged
    assert out["dur"].tolist() == [4_000_000, 4_000_000, 1_000_000, 1_000_000, 1_000_000]
    leaf = int(fab.leaf[0])
    g = Fault("F1", "congested_switch", "switch", "s", 0, 9_000_000_000, 0.5, switch=leaf)
    out = slowed_by_faults(bg, fab, [g])
    crosses = fab.leaf[nic] == leaf
    assert (out["dur"][(kind == KIND_STORAGE) & crosses] == 2_000_000).all()
    assert (out["dur"][(kind == KIND_STORAGE) & ~crosses] == 1_000_000).all()


def test_a_down_link_holds_every_transfer_crossing_it_and_nothing_else():
    from fleetscope.sim.faults import Fault, held_while_down

    S = 1_000_000_000
    f = Fault(fault_id="F0", kind="flapping_link", scope="link", subject="n7", start_ns=0, end_ns=100 * S,
              magnitude=1.5)
    f.endpoint, f.flaps = 7, [(10 * S, 11 * S), (12 * S, 12 * S + S // 2)]
    # in flight at the first flap; starting inside it; held by the first into the second; another link's
    start = np.array([9 * S + S // 2, 10 * S + S // 4, 9 * S + S // 2, 9 * S + S // 2, 20 * S])
    dur = np.array([S, S // 10, 2 * S, S, S // 10])
    src, dst = np.array([7, 3, 3, 4, 7]), np.array([3, 7, 7, 5, 3])
    got = held_while_down(start, dur, src, dst, [f])
    assert got[0] == dur[0] + S                          # held for the whole first flap
    assert got[1] == dur[1] + 3 * S // 4                 # waits from its start to the link's return
    assert got[2] == dur[2] + S + S // 2                 # held by the first flap into the second, held again
    assert got[3] == dur[3] and got[4] == dur[4]         # another link's; after the flaps


def test_a_fault_on_a_job_that_stops_or_crashes_begins_while_the_job_still_runs():
    """Demo seed 671: a spine congested only after the one job crossing it had crashed carried nothing to
    congest (no job affected). Each fault is drawn in the part of the window its job runs in: over many
    seeds of fleets with jobs that stop, crash or launch late, every fault overlaps the span from its job's
    first step in the window to its stop or crash."""
    from fleetscope.sim.conventions import draw_conventions
    from fleetscope.sim.faults import choose_faults
    from fleetscope.sim.fabric import build_fabric
    from fleetscope.sim.jobs import place_jobs

    W0 = 1_795_262_400_000_000_000
    window = (W0, W0 + 120_000_000_000)
    checked = 0
    for seed in range(120):
        conv = draw_conventions(seed, 64, None)
        fab = build_fabric(64, conv, seed)
        jobs, _ = place_jobs(fab, None, np.random.default_rng([seed, 1]), window, conv)
        for f in choose_faults("congested_switch:2,degraded_nic:1,slow_gpu:1", jobs, fab, np.random.default_rng([seed, 2]), window):
            j = jobs[f.job_idx]
            end = min(x for x in (j.stop_ns, j.crash_ns, window[1]) if x is not None)
            if end < window[1] or j.launch_ns is not None:
                checked += 1
                first = j.start_ns if j.launch_ns is not None else window[0]
                assert f.start_ns < end and f.end_ns > first, (seed, f.kind, f.subject)
    assert checked >= 100
