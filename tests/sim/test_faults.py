"""Each injected fault changes the execution where it should, and only there. The faulty fleet and
its healthy twin share the seed (same jobs, same hosts, same compute noise)."""
from __future__ import annotations

import polars as pl
import pytest

from fleetscope.sim.faults import KINDS, parse_spec


def _step_med(fleet, job_id, lo=None, hi=None, stat="median") -> float:
    s = fleet.truth("steps").filter(pl.col("job_id") == job_id)
    if lo is not None:
        s = s.filter(pl.col("start_ns") >= lo)
    if hi is not None:
        s = s.filter(pl.col("end_ns") < hi)
    d = s["end_ns"] - s["start_ns"]
    return float(d.median() if stat == "median" else d.mean())


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
    # docs/CONTRACT.mdscopes / subjects: an ip for gpu and link, a switch id, a host name
    topo = pl.read_csv(faulty256.landing / "topology" / "topology.csv")
    for r in f.iter_rows(named=True):
        if r["scope"] in ("gpu", "link"):
            assert r["subject"] in set(topo["ip"]), r
        elif r["scope"] == "switch":
            assert r["subject"] in set(topo["leaf"]) | set(topo["spine"]), r
        elif r["scope"] == "host":
            assert r["subject"] in set(topo["host"]), r
        elif r["scope"] == "rack":
            assert r["subject"] in set(topo["rack"]), r


@pytest.mark.parametrize("kind,min_ratio", [("slow_gpu", 1.15), ("nvlink_down", 1.08), ("throttled_racks", 1.06),
                                            ("slow_dataloader", 1.04), ("gc_stall", 1.02)])
def test_compute_faults_slow_the_job_once_they_start(healthy256, faulty256, kind, min_ratio):
    r = _fault(faulty256, kind)
    job = r["job_id"] or r["affected_jobs"].split("|")[0]
    stat = "mean" if kind == "gc_stall" else "median"       # GC pauses hit some steps, not all
    during = _step_med(faulty256, job, lo=r["start_ns"], stat=stat)
    twin = _step_med(healthy256, job, lo=r["start_ns"], stat=stat)
    before = _step_med(faulty256, job, hi=r["start_ns"])
    twin_before = _step_med(healthy256, job, hi=r["start_ns"])
    assert during / twin >= min_ratio, (kind, during, twin)
    assert abs(before / twin_before - 1) < 0.01            # nothing changes before it starts


def test_sync_in_forward_slows_its_job_all_along_and_no_other(healthy64, tmp_path):
    from fleetscope.sim import simulate

    simulate(tmp_path, gpus=64, seed=0, faults="sync_in_forward:1", captures=False)

    class F:
        truth = staticmethod(lambda name: pl.read_csv(tmp_path / "ground_truth" / f"{name}.csv"))

    r = _fault(F, "sync_in_forward")
    lo, hi = healthy64.window
    assert r["start_ns"] < lo and r["end_ns"] > hi                     # a code bug: there all along
    assert _step_med(F, r["job_id"]) / _step_med(healthy64, r["job_id"]) > 1.005
    others = set(healthy64.truth("job_layout")["job_id"]) - {r["job_id"]}
    assert others
    for j in others:
        assert _step_med(F, j) == pytest.approx(_step_med(healthy64, j), rel=1e-12)


def _bandwidth_ratio(fleet, hit: pl.Expr, r: dict) -> float:
    """Median over DP pairs crossing the fault of (bandwidth while active / bandwidth otherwise)."""
    p = fleet.truth("pairs").filter(pl.col("comm_type") == "DP")
    f = fleet.flows().with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"),
                                   path_s=pl.col("path").list.join(">"))
    f = f.join(p.select("ip_a", "ip_b"), on=["ip_a", "ip_b"], how="semi").filter(hit).filter(pl.col("bytes") > 1_000_000)
    f = f.with_columns(bw=pl.col("bytes") / pl.col("duration_ns"),
                       on=(pl.col("start_ns") >= r["start_ns"]) & (pl.col("start_ns") < r["end_ns"]))
    g = f.group_by("src_ip", "dst_ip", "src_qp", "bytes").agg(
        a=pl.col("bw").filter(pl.col("on")).median(), b=pl.col("bw").filter(~pl.col("on")).median()).drop_nulls()
    assert g.height >= 3
    return float((g["a"] / g["b"]).median())


def test_congested_switch_lowers_the_bandwidth_of_dp_flows_through_it(healthy256, faulty256):
    r = _fault(faulty256, "congested_switch")
    hit = pl.col("path_s").str.contains(r["subject"] + "(>|$)")
    ratio = _bandwidth_ratio(faulty256, hit, r)
    assert ratio == pytest.approx(r["magnitude"], rel=0.05)
    assert 0.4 <= ratio <= 0.7                           # 30-60 % slower: realistic and detectable
    # flows elsewhere keep their bandwidth
    assert _bandwidth_ratio(faulty256, ~hit, r) == pytest.approx(1.0, abs=0.02)
    assert _bandwidth_ratio(healthy256, hit, r) == pytest.approx(1.0, abs=0.02)


def test_degraded_nic_lowers_its_flows_bandwidth_only(faulty256):
    r = _fault(faulty256, "degraded_nic")
    ip = r["subject"]
    mine = (pl.col("src_ip") == ip) | (pl.col("dst_ip") == ip)
    assert _bandwidth_ratio(faulty256, mine, r) == pytest.approx(r["magnitude"], rel=0.05)
    # its DP group's other ring hops are not degraded themselves
    other = ~mine & pl.col("src_ip").is_in(faulty256.truth("jobs").filter(pl.col("job_id") == r["job_id"])["ip"].implode())
    assert _bandwidth_ratio(faulty256, other, r) > 0.95


def test_hang_stops_the_job(faulty256, healthy256):
    r = _fault(faulty256, "hang")
    job = r["job_id"]
    ips = faulty256.truth("jobs").filter(pl.col("job_id") == job)["ip"]
    f = faulty256.flows().filter(pl.col("src_ip").is_in(ips.implode()) & pl.col("dst_ip").is_in(ips.implode()))
    assert f["start_ns"].max() < r["start_ns"] + 100_000      # nothing after the hang (but skew)
    assert f.filter(pl.col("start_ns") < r["start_ns"] - 1_000_000_000).height > 0
    steps = faulty256.truth("steps").filter(pl.col("job_id") == job)
    assert steps["end_ns"].max() < r["start_ns"]
    assert healthy256.truth("steps").filter((pl.col("job_id") == job) & (pl.col("end_ns") > r["start_ns"])).height > 0


def test_fault_spec_parsing():
    assert parse_spec("") == [] and parse_spec("none") == [] and parse_spec(None) == []
    assert parse_spec("slow_gpu, congested_switch:2") == [("slow_gpu", 1), ("congested_switch", 2)]
    with pytest.raises(ValueError, match="known kinds"):
        parse_spec("slow:1")
