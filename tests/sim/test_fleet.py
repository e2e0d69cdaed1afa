"""The simulated fleet: determinism, a realistic multi-tenant mix, pair labels that follow the
parallel layout, records whose times and sizes follow the execution, whatever the seed's conventions."""
from __future__ import annotations

import hashlib

import polars as pl
import pytest

from fleetscope.sim import simulate
from tests.sim.conftest import Fleet
from tests.sim.contract import flows_per_contract


def _digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "summary.json"}


def test_same_seed_same_bytes_other_seed_other_fleet(healthy64, tmp_path):
    again = simulate(tmp_path / "again", gpus=64, seed=0, captures=False)
    assert _digest(healthy64.root) == _digest(tmp_path / "again")
    assert again["flow_records"] == healthy64.summary["flow_records"]
    simulate(tmp_path / "other", gpus=64, seed=1, captures=False)
    assert _digest(tmp_path / "other") != _digest(healthy64.root)


def test_topology_is_rail_optimized(healthy256):
    topo = healthy256.topology()
    bgh = healthy256.truth("background_hosts")
    gpus = topo.filter(~pl.col("ip").is_in(bgh["ip"].implode()))
    assert gpus.height == 256 and gpus["ip"].n_unique() == 256
    assert (gpus.group_by("host").len()["len"] == 8).all()
    if "rail" in gpus.columns:
        # one rail per leaf: every leaf serves one GPU index
        assert (gpus.group_by("leaf").agg(pl.col("rail").n_unique())["rail"] == 1).all()


def test_pair_labels_follow_the_parallel_layout(many_seeds, healthy256):
    for fleet in many_seeds + [healthy256]:
        jobs = fleet.truth("jobs")
        layout = fleet.truth("job_layout")
        p = fleet.truth("pairs")
        cols = ["ip", "host", "pp_stage", "dp_rank", "tp_rank"]
        p = (p.join(jobs.select(cols).rename({c: c + "_a" for c in cols}), left_on="ip_a", right_on="ip_a")
              .join(jobs.select(cols).rename({c: c + "_b" for c in cols}), left_on="ip_b", right_on="ip_b")
              .join(layout.select("job_id", "nic_overload", "pp"), on="job_id"))
        assert (p["host_a"] != p["host_b"]).all()                     # TP (and NVLink hops) never leave a host
        regular = p.filter(~pl.col("nic_overload"))
        dp, pp = regular.filter(pl.col("comm_type") == "DP"), regular.filter(pl.col("comm_type") == "PP")
        assert dp.height > 0
        assert ((dp["pp_stage_a"] == dp["pp_stage_b"]) & (dp["tp_rank_a"] == dp["tp_rank_b"]) & (dp["dp_rank_a"] != dp["dp_rank_b"])).all()
        assert ((pp["dp_rank_a"] == pp["dp_rank_b"]) & (pp["tp_rank_a"] == pp["tp_rank_b"])
                & ((pp["pp_stage_a"] - pp["pp_stage_b"]).abs() == 1)).all()
        for row in layout.iter_rows(named=True):
            jp = p.filter(pl.col("job_id") == row["job_id"])
            assert (jp["comm_type"] == "DP").any(), row["job_id"]
            assert (jp["comm_type"] == "PP").any() == (row["pp"] > 1), row["job_id"]


def test_rail_aligned_rings_stay_on_one_rail(healthy256):
    lay = healthy256.truth("job_layout").filter(~pl.col("cross_rail") & ~pl.col("nic_overload"))
    jobs = healthy256.truth("jobs").with_columns(rail=pl.col("gpu").str.extract(r"gpu(\d+)$").cast(pl.Int64))
    p = healthy256.truth("pairs").filter((pl.col("comm_type") == "DP") & pl.col("job_id").is_in(lay["job_id"].implode()))
    p = p.join(jobs.select(ip_a="ip", ra="rail"), on="ip_a").join(jobs.select(ip_b="ip", rb="rail"), on="ip_b")
    assert p.height > 0 and (p["ra"] == p["rb"]).all()


def test_silent_nics_are_jobs_gpus_the_channels_avoid(tmp_path):
    s = simulate(tmp_path, gpus=128, seed=5, captures=False,
                 conventions={"jobs": {"restricted_nic_share": 1.0, "tp_weights": {"8": 0.0, "4": 0.0, "2": 0.0, "1": 1.0}}})
    f = Fleet(tmp_path, s)
    lay = f.truth("job_layout")
    jobs = f.truth("jobs")
    silent = jobs.filter(~pl.col("observed"))
    assert silent.height > 0
    # only jobs whose DP channels use fewer NICs than the group has members, and without PP traffic
    j = lay.filter(pl.col("job_id").is_in(silent["job_id"].implode()))
    assert (j["pp"] == 1).all()
    assert (j["nic_slots"].str.split("|").list.len() < j["gpus_per_host"] // j["tp"]).all()


def test_pp_records_keep_one_size_per_pair_unless_sequence_lengths_vary(tmp_path):
    s = simulate(tmp_path, gpus=128, seed=2, captures=False, hard_cases=True,
                 conventions={"collectors": {"cutting": "bucket", "mirror": "ingress"}})
    f = Fleet(tmp_path, s)
    lay = f.truth("job_layout")
    var = lay.filter(pl.col("variable_seq"))["job_id"].to_list()
    eq = lay.filter(pl.col("equal_buckets"))["job_id"].to_list()
    assert len(var) == 1 and len(eq) == 1 and var != eq
    pairs = f.truth("pairs")
    rec = f.flows().with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip")).join(
        pairs, on=["ip_a", "ip_b"])
    pp = rec.filter(pl.col("comm_type") == "PP")
    share = pp.group_by("ip_a", "ip_b", "job_id").agg((pl.col("bytes").value_counts().struct.field("count").max() / pl.len()).alias("s"),
                                                      pl.col("bytes").n_unique().alias("n"))
    assert share.filter(pl.col("job_id") == var[0])["n"].min() >= 8
    assert share.filter(pl.col("job_id") != var[0])["s"].min() > 0.95       # one size (but retransmission splits)


def test_step_ends_are_where_the_landed_dp_records_end(many_seeds):
    for fleet in many_seeds:
        steps = fleet.truth("steps")
        cc = fleet.conventions["collectors"]
        lo, hi = fleet.window
        skew = cc["skew_max_ns"] + cc["drift_ppm_max"] * 1e-6 * (hi - lo)    # the collectors' clocks
        p = fleet.truth("pairs").filter(pl.col("comm_type") == "DP")
        f = fleet.flows().select("src_ip", "dst_ip", "end_ns")
        f = f.with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip")).join(
            p.select("ip_a", "ip_b"), on=["ip_a", "ip_b"], how="semi")
        ends = pl.concat([f.select(ip="src_ip", end_ns="end_ns"), f.select(ip="dst_ip", end_ns="end_ns")]).sort("end_ns")
        m = steps.sort("end_ns").join_asof(ends.rename({"end_ns": "flow_end"}), left_on="end_ns", right_on="flow_end",
                                            by="ip", strategy="nearest")
        err = (m["flow_end"] - m["end_ns"]).abs()
        assert (err <= skew + 30_000).mean() > 0.95, cc["cutting"]


def test_step_times_span_fast_and_slow_jobs(healthy256, many_seeds):
    med = pl.concat([f.truth("job_layout").select("median_step_ns") for f in many_seeds + [healthy256]])["median_step_ns"].drop_nulls()
    assert med.min() < 1.2e9 and med.max() > 2.5e9
    d = healthy256.truth("steps").with_columns(d=pl.col("end_ns") - pl.col("start_ns")).group_by("job_id").agg(
        cv=pl.col("d").std() / pl.col("d").mean(), med=pl.col("d").median())
    assert (d["med"] > 0.2e9).all() and (d["med"] < 30e9).all()
    assert (d["cv"] > 0.001).all()


def test_fleet_mix_is_multi_tenant_with_idle_hosts(many_seeds, healthy256):
    pairs_seen = 0
    for fleet in many_seeds + [healthy256]:
        lay = fleet.truth("job_layout")
        jobs = fleet.truth("jobs")
        assert fleet.summary["idle_hosts"] >= 1
        assert jobs["ip"].n_unique() == jobs.height
        shared = jobs.group_by("host").agg(pl.col("job_id").n_unique().alias("n"), pl.col("tenant").n_unique().alias("t"))
        has_pair = shared.filter((pl.col("n") == 2) & (pl.col("t") == 1)).height >= 1
        assert has_pair == (fleet.conventions["life"]["shared_host_pair"] and lay.height >= 3)
        pairs_seen += has_pair
        # a job that finishes or crashes has no steps after it
        st = fleet.truth("steps")
        for r in lay.filter(pl.col("crash_ns").is_not_null()).iter_rows(named=True):
            assert st.filter((pl.col("job_id") == r["job_id"]) & (pl.col("end_ns") > r["crash_ns"])).height == 0
        for r in lay.filter(pl.col("launch_ns").is_not_null()).iter_rows(named=True):
            assert st.filter((pl.col("job_id") == r["job_id"]) & (pl.col("start_ns") < r["start_ns"])).height == 0
    assert pairs_seen >= 1


def test_collector_loss_and_retransmission_splits(tmp_path):
    s = simulate(tmp_path, gpus=128, seed=4, captures=False,
                 conventions={"collectors": {"cutting": "bucket", "mirror": "ingress", "loss_rate": 0.02, "retrans_rate": 0.01}})
    ratio = s["flow_records"] / (s["flows_modelled"] + s["background_flows"])
    assert 0.98 - 0.01 < ratio < 0.98 + 0.02
    f = Fleet(tmp_path, s).flows()
    if "src_qp" in f.columns:
        k = f.sort("start_ns").with_columns(prev_end=pl.col("end_ns").shift(1).over("src_ip", "dst_ip", "src_qp"))
        assert k.filter((pl.col("start_ns") - pl.col("prev_end")).is_between(0, 300_000)).height > 0


def test_mirroring_both_ends_exports_each_flow_twice_with_two_clocks(tmp_path):
    quiet = {"cutting": "bucket", "loss_rate": 0.0, "retrans_rate": 0.0, "per_collector": {"time_resolution_ns": 1}}
    a = simulate(tmp_path / "a", gpus=64, seed=6, captures=False, conventions={"collectors": quiet | {"mirror": "ingress"}})
    b = simulate(tmp_path / "b", gpus=64, seed=6, captures=False, conventions={"collectors": quiet | {"mirror": "both"}})
    assert a["flow_records"] == a["flows_modelled"] + a["background_flows"]
    assert b["flow_records"] == 2 * (b["flows_modelled"] + b["background_flows"])
    f = Fleet(tmp_path / "b", b).flows()
    twice = f.group_by("src_ip", "dst_ip", "bytes", "duration_ns").agg(pl.col("start_ns").n_unique().alias("clocks"), pl.len())
    assert (twice["len"] % 2 == 0).mean() > 0.99 and (twice["clocks"] > 1).any()


def test_jobs_on_the_socket_transport_show_tcp_records_without_queue_pairs(tmp_path):
    every = ["packets", "src_port", "dst_port", "src_qp", "dst_qp"]
    s = simulate(tmp_path, gpus=64, seed=8, captures=False,
                 conventions={"jobs": {"tcp_share": 1.0}, "collectors": {"per_collector": {"optional_columns": every}}})
    f = Fleet(tmp_path, s)
    pairs = f.truth("pairs")
    assert set(f.truth("job_layout")["transport"]) == {"tcp"}
    rec = f.flows().with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip")).join(
        pairs, on=["ip_a", "ip_b"], how="semi")
    assert rec.height > 0 and rec["src_qp"].null_count() == rec.height and (rec["dst_port"] != 4791).all()
    # a peer listens on one port: every connection to an ip uses it
    assert (rec.group_by("dst_ip").agg(pl.col("dst_port").n_unique())["dst_port"] == 1).all()


def test_bad_arguments_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="multiple of 8"):
        simulate(tmp_path / "a", gpus=60)
    with pytest.raises(ValueError, match="unknown fault kind 'melted_gpu'"):
        simulate(tmp_path / "b", gpus=64, faults="melted_gpu:1")
    with pytest.raises(ValueError, match="count must be an integer"):
        simulate(tmp_path / "c", gpus=64, faults="slow_gpu:x")
    with pytest.raises(ValueError, match="minutes"):
        simulate(tmp_path / "d", gpus=64, minutes=0)
    (tmp_path / "e" / "landing").mkdir(parents=True)
    (tmp_path / "e" / "landing" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        simulate(tmp_path / "e", gpus=64)
    assert (tmp_path / "e" / "landing" / "keep.txt").exists()


def test_rerun_into_a_previous_simulation_replaces_it(tmp_path):
    simulate(tmp_path, gpus=64, seed=0, faults="slow_gpu:1", captures=False)
    (tmp_path / "landing" / "flows" / "mine.txt").write_text("a user's file")
    s = simulate(tmp_path, gpus=128, seed=1, jobs=3, captures=False)
    assert (tmp_path / "landing" / "flows" / "mine.txt").exists()           # never deletes what it did not write
    assert s["jobs"] == 3 and pl.read_csv(tmp_path / "ground_truth" / "faults.csv").height == 0
    names = {p.name for p in (tmp_path / "landing" / "flows").iterdir()}
    assert len(names) == s["flow_files"] + 1
    topo = Fleet(tmp_path, s).topology()
    assert topo.filter(pl.col("ip").is_in(pl.read_csv(tmp_path / "ground_truth" / "jobs.csv")["ip"].implode())).height > 0


def test_window_start_and_minutes(tmp_path):
    t0 = 1_800_000_000_000_000_000
    s = simulate(tmp_path, gpus=64, minutes=2.5, start_ns=t0, seed=5, captures=False)
    assert s["window"] == [t0, t0 + 150_000_000_000]
    f = Fleet(tmp_path, s)
    files = f.files()
    # every collector's files together cover the window (periods of its own length)
    for (c,), g in files.group_by("collector"):
        assert g["first_start_ns"].min() < t0 + 30e9 and g["last_start_ns"].max() > t0 + 120e9
    steps = f.truth("steps")
    assert steps["start_ns"].min() >= t0 and steps["end_ns"].max() < t0 + 150_000_000_000
    recs = pl.concat([flows_per_contract(tmp_path / "landing" / p) for p in files["file"]], how="diagonal_relaxed")
    assert recs["start_ns"].min() >= t0 - 200_000 and recs["start_ns"].max() < t0 + 150_000_000_000 + 200_000
