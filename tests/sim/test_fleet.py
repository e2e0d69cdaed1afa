"""The simulated fleet: docs/CONTRACT.mdcolumns, normalization variety, determinism, ground truth consistent
with the rendered flows and with the jobs' parallel layout."""
from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
import pytest

from fleetscope.sim import simulate


def _digest(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "summary.json"}


def test_same_seed_same_bytes_other_seed_other_fleet(healthy64, tmp_path):
    again = simulate(tmp_path / "again", gpus=64, seed=0, captures=False)
    assert _digest(healthy64.root) == _digest(tmp_path / "again")
    assert again["flow_records"] == healthy64.summary["flow_records"]
    other = simulate(tmp_path / "other", gpus=64, seed=1, captures=False)
    a = pl.read_csv(healthy64.truth_dir / "steps.csv")
    b = pl.read_csv(tmp_path / "other" / "ground_truth" / "steps.csv")
    assert other["flow_records"] != healthy64.summary["flow_records"] or not a.equals(b)


def test_topology_is_rail_optimized(healthy256):
    from fleetscope.ingest.topology import read_topology

    res = read_topology(healthy256.landing / "topology" / "topology.csv")     # the real ingestion accepts it
    assert res.rejected.height == 0 and res.kept.height == 256
    topo = pl.read_csv(healthy256.landing / "topology" / "topology.csv")
    assert topo.columns == ["ip", "host", "gpu", "leaf", "spine", "rail", "rack", "pod"]
    assert topo.height == 256 and topo["ip"].n_unique() == 256
    assert (topo.group_by("host").len()["len"] == 8).all()
    # one rail per leaf: every leaf serves one GPU index
    assert (topo.group_by("leaf").agg(pl.col("rail").n_unique())["rail"] == 1).all()
    assert (topo["gpu"].str.extract(r"gpu(\d)$").cast(pl.Int64) == topo["rail"]).all()


def test_flow_files_cover_every_normalization_case(healthy64):
    files = sorted(p.name for p in (healthy64.landing / "flows").iterdir())
    assert any(f.endswith(".parquet") for f in files) and any(f.endswith(".csv.gz") for f in files)
    schemas = {}
    for p in (healthy64.landing / "flows").glob("*.parquet"):
        schemas[p.name] = pl.read_parquet_schema(p)
    assert any("duration_ns" in s and "end_ns" not in s for s in schemas.values())
    assert any("end_ns" in s and "duration_ns" not in s for s in schemas.values())
    assert any(s["path"] == pl.List(pl.Utf8) for s in schemas.values())
    assert any(s["path"] == pl.Utf8 for s in schemas.values())
    f = healthy64.flows()     # read with the real ingestion code; it rejects nothing
    assert {"start_ns", "duration_ns", "end_ns", "src_ip", "dst_ip", "bytes", "packets", "dst_port", "src_qp", "dst_qp",
            "path"} <= set(f.columns)
    assert (f["bytes"] > 0).all() and (f["duration_ns"] >= 0).all() and (f["end_ns"] >= f["start_ns"]).all()
    rdma = f.filter(pl.col("dst_port") == 4791)
    assert rdma.height > 0.99 * f.height and rdma["src_qp"].null_count() == 0
    lo, hi = healthy64.window
    assert f["start_ns"].min() >= lo - 100_000 and f["start_ns"].max() < hi + 100_000


def test_every_flow_is_a_job_pair_or_background(healthy256):
    fl = healthy256, healthy256.flows()
    fleet, f = fl
    jobs = fleet.truth("jobs").select("ip", "job_id")
    bg = set(fleet.truth("background")["ip"].to_list())
    pairs = fleet.truth("pairs")
    f = f.join(jobs.rename({"ip": "src_ip", "job_id": "js"}), on="src_ip", how="left") \
         .join(jobs.rename({"ip": "dst_ip", "job_id": "jd"}), on="dst_ip", how="left")
    is_bg = pl.col("src_ip").is_in(list(bg)) | pl.col("dst_ip").is_in(list(bg))
    background = f.filter(is_bg)
    job_flows = f.filter(~is_bg)
    assert background.height > 0
    # no flow between a GPU and anything unknown; job flows never cross jobs
    assert job_flows["js"].null_count() == 0 and job_flows["jd"].null_count() == 0
    assert (job_flows["js"] == job_flows["jd"]).all()
    # every job flow is a labelled pair, and every labelled pair shows up in the flows
    jp = job_flows.select(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"), job_id="js").unique()
    assert jp.join(pairs, on=["ip_a", "ip_b", "job_id"], how="anti").height == 0
    assert pairs.join(jp, on=["ip_a", "ip_b", "job_id"], how="anti").height == 0
    # background traffic is aperiodic: inter-arrival gaps vary like a Poisson process
    gaps = np.diff(np.sort(background["start_ns"].to_numpy()))
    assert gaps.std() / gaps.mean() > 0.5


def test_pair_labels_follow_the_parallel_layout(healthy256):
    jobs = healthy256.truth("jobs")
    layout = healthy256.truth("job_layout")
    topo = pl.read_csv(healthy256.landing / "topology" / "topology.csv").select("ip", "rail")
    p = healthy256.truth("pairs")
    cols = ["ip", "host", "pp_stage", "dp_rank", "tp_rank"]
    p = (p.join(jobs.select(cols).rename({c: c + "_a" for c in cols}), left_on="ip_a", right_on="ip_a")
          .join(jobs.select(cols).rename({c: c + "_b" for c in cols}), left_on="ip_b", right_on="ip_b")
          .join(topo.rename({"ip": "ip_a", "rail": "rail_a"}), on="ip_a").join(topo.rename({"ip": "ip_b", "rail": "rail_b"}), on="ip_b"))
    assert (p["host_a"] != p["host_b"]).all()                     # TP (and NVLink hops) never leave a host
    dp, pp = p.filter(pl.col("comm_type") == "DP"), p.filter(pl.col("comm_type") == "PP")
    assert dp.height > 0 and pp.height > 0
    assert ((dp["pp_stage_a"] == dp["pp_stage_b"]) & (dp["tp_rank_a"] == dp["tp_rank_b"]) & (dp["dp_rank_a"] != dp["dp_rank_b"])).all()
    assert ((pp["dp_rank_a"] == pp["dp_rank_b"]) & (pp["tp_rank_a"] == pp["tp_rank_b"])
            & ((pp["pp_stage_a"] - pp["pp_stage_b"]).abs() == 1)).all()
    # a well-placed job's DP traffic stays on one rail
    assert (dp["rail_a"] == dp["rail_b"]).all()
    # every job with PP > 1 has PP pairs, every job has DP pairs
    for row in layout.iter_rows(named=True):
        jp = p.filter(pl.col("job_id") == row["job_id"])
        assert (jp["comm_type"] == "DP").any(), row["job_id"]
        assert (jp["comm_type"] == "PP").any() == (row["pp"] > 1), row["job_id"]


def test_pp_flows_have_one_size_per_pair_and_dp_several(healthy256):
    f = healthy256.flows()
    p = healthy256.truth("pairs")
    f = f.select(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"), bytes="bytes", file="file")
    sizes = f.join(p, on=["ip_a", "ip_b"]).group_by("ip_a", "ip_b", "comm_type").agg(pl.col("bytes").mode().first().alias("mode"),
                                                                                      pl.col("bytes").n_unique().alias("n"))
    # PP: the dominant size is constant (only retransmission splits differ); DP: buckets of different sizes
    pp = sizes.filter(pl.col("comm_type") == "PP")
    dp = sizes.filter(pl.col("comm_type") == "DP")
    assert (dp["n"] >= 2).all()
    per_pair = f.join(p.filter(pl.col("comm_type") == "PP"), on=["ip_a", "ip_b"]).join(pp.select("ip_a", "ip_b", "mode"), on=["ip_a", "ip_b"])
    assert (per_pair["bytes"] == per_pair["mode"]).mean() > 0.98


def test_step_ends_are_the_end_of_dp_traffic(healthy256):
    steps = healthy256.truth("steps")
    layout = healthy256.truth("job_layout")
    assert steps.height > 0 and set(steps["job_id"]) == set(layout["job_id"])
    assert (steps["end_ns"] > steps["start_ns"]).all()
    # consecutive steps on an ip tile time: a step starts where the previous one ended
    s = steps.sort("job_id", "ip", "step").with_columns(pe=pl.col("end_ns").shift(1).over("job_id", "ip"),
                                                         ps=pl.col("step").shift(1).over("job_id", "ip"))
    cont = s.filter(pl.col("ps") == pl.col("step") - 1)
    assert cont.height > 0.8 * s.height and (cont["start_ns"] == cont["pe"]).all()
    # the landed DP flows of each ip end at the truth's step end (up to collector clock skew and
    # the ~1% of records the collectors lose)
    p = healthy256.truth("pairs").filter(pl.col("comm_type") == "DP")
    f = healthy256.flows().select("src_ip", "dst_ip", "end_ns")
    f = f.join(p.select(src_ip="ip_a", dst_ip="ip_b"), on=["src_ip", "dst_ip"], how="semi").vstack(
        f.join(p.select(src_ip="ip_b", dst_ip="ip_a"), on=["src_ip", "dst_ip"], how="semi"))
    ends = pl.concat([f.select(ip="src_ip", end_ns="end_ns"), f.select(ip="dst_ip", end_ns="end_ns")]).sort("end_ns")
    m = steps.sort("end_ns").join_asof(ends.rename({"end_ns": "flow_end"}), left_on="end_ns", right_on="flow_end",
                                        by="ip", strategy="nearest")
    err = (m["flow_end"] - m["end_ns"]).abs()
    assert (err <= 120_000).mean() > 0.97
    assert err.median() > 0          # the collectors' clocks are skewed: landed times are not the truth
    # step durations are seconds with jitter, and stable on a healthy fleet
    d = steps.with_columns(d=pl.col("end_ns") - pl.col("start_ns")).group_by("job_id").agg(
        med=pl.col("d").median(), cv=pl.col("d").std() / pl.col("d").mean())
    assert (d["med"] > 0.5e9).all() and (d["med"] < 30e9).all()
    assert (d["cv"] > 0.001).all() and (d["cv"] < 0.05).all()


def test_fleet_mix_is_multi_tenant_with_idle_hosts_and_jobs_starting_and_stopping(healthy256):
    lay = healthy256.truth("job_layout")
    jobs = healthy256.truth("jobs")
    topo = pl.read_csv(healthy256.landing / "topology" / "topology.csv")
    assert healthy256.summary["idle_hosts"] >= 1
    assert topo["host"].n_unique() > jobs["host"].n_unique()          # idle hosts
    assert lay["tenant"].n_unique() >= 2 and lay["n_gpus"].n_unique() >= 3
    # one tenant runs two small jobs on the same hosts, on different GPUs
    shared = jobs.group_by("host").agg(pl.col("job_id").n_unique().alias("n"), pl.col("tenant").n_unique().alias("t"))
    assert shared.filter((pl.col("n") == 2) & (pl.col("t") == 1)).height >= 1
    assert jobs["ip"].n_unique() == jobs.height
    lo, hi = healthy256.window
    assert (lay["start_ns"] > lo).any() and (lay["stop_ns"].drop_nulls() < hi).any()
    assert set(lay["dp_style"]) >= {"megatron"} and lay["n_buckets"].min() >= 2
    # a job that stops has no steps after its stop
    st = healthy256.truth("steps")
    for r in lay.filter(pl.col("stop_ns").is_not_null()).iter_rows(named=True):
        assert st.filter((pl.col("job_id") == r["job_id"]) & (pl.col("start_ns") > r["stop_ns"] + 30e9)).height == 0


def test_collector_noise(healthy256):
    s = healthy256.summary
    ratio = s["flow_records"] / (s["flows_modelled"] + s["background_flows"])
    assert 0.98 < ratio < 1.0                     # ~1% lost, ~0.5% split in two
    f = healthy256.flows()
    # retransmission splits: the same 5-tuple twice within a flow's duration
    k = f.sort("start_ns").with_columns(prev_end=pl.col("end_ns").shift(1).over("src_ip", "dst_ip", "src_qp"))
    assert k.filter((pl.col("start_ns") - pl.col("prev_end")).is_between(0, 300_000)).height > 0


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
    assert pl.read_csv(tmp_path / "landing" / "topology" / "topology.csv").height == 128
    names = {p.name for p in (tmp_path / "landing" / "flows").iterdir()}
    assert len(names) == s["flow_files"] + 1


def test_hard_cases_break_the_distinct_sizes_rule_but_not_the_truth(tmp_path):
    """hard_cases=True: a job with variable sequence lengths (many PP sizes) and one with equal
    padded buckets (one DP size per step); the labels stay what the layout says."""
    simulate(tmp_path, gpus=128, seed=2, captures=False, hard_cases=True)
    lay = pl.read_csv(tmp_path / "ground_truth" / "job_layout.csv")
    var = lay.filter(pl.col("variable_seq"))["job_id"].to_list()
    eq = lay.filter(pl.col("equal_buckets"))["job_id"].to_list()
    assert len(var) == 1 and len(eq) == 1 and var != eq
    steps = pl.read_csv(tmp_path / "ground_truth" / "steps.csv")
    pairs = pl.read_csv(tmp_path / "ground_truth" / "pairs.csv")
    from fleetscope.ingest.flows import read_flows
    f = pl.concat([read_flows(p).kept.select("start_ns", "src_ip", "dst_ip", "bytes")
                   for p in sorted((tmp_path / "landing" / "flows").iterdir())])
    f = f.with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip")).join(
        pairs, on=["ip_a", "ip_b"])
    # steps of the first ip_a by truth: sizes per (pair, step) of the equal-bucket job's DP pairs
    s = steps.filter(pl.col("job_id") == eq[0]).select(ip_a="ip", step="step", lo="start_ns", hi="end_ns")
    d = f.filter((pl.col("job_id") == eq[0]) & (pl.col("comm_type") == "DP")).join(s, on="ip_a").filter(
        (pl.col("start_ns") > pl.col("lo")) & (pl.col("start_ns") <= pl.col("hi")))
    per_step = d.group_by("ip_a", "ip_b", "step").agg(pl.col("bytes").mode().len().alias("n_modes"),
                                                      (pl.col("bytes").value_counts().struct.field("count").max()
                                                       / pl.len()).alias("share"))
    assert per_step.height > 0 and per_step["share"].median() > 0.95        # one size (but retransmission splits)
    pp = f.filter((pl.col("job_id") == var[0]) & (pl.col("comm_type") == "PP"))
    assert pp.group_by("ip_a", "ip_b").agg(pl.col("bytes").n_unique())["bytes"].min() >= 8
    other = f.filter((pl.col("job_id") != var[0]) & (pl.col("comm_type") == "PP"))
    share = other.group_by("ip_a", "ip_b").agg((pl.col("bytes").value_counts().struct.field("count").max() / pl.len()).alias("s"))
    assert share["s"].min() > 0.97


def test_every_job_gpu_talks_on_the_network(healthy256):
    """Job recognition works from flows only: every GPU of a job is in some pair of that job."""
    jobs = healthy256.truth("jobs").select("job_id", "ip")
    p = healthy256.truth("pairs")
    seen = pl.concat([p.select("job_id", ip="ip_a"), p.select("job_id", ip="ip_b")]).unique()
    assert jobs.join(seen, on=["job_id", "ip"], how="anti").height == 0


def test_window_start_and_minutes_give_one_file_per_collector_per_minute(tmp_path):
    t0 = 1_800_000_000_000_000_000
    s = simulate(tmp_path, gpus=64, minutes=2.5, start_ns=t0, seed=5, captures=False)
    assert s["window"] == [t0, t0 + 150_000_000_000]
    names = sorted(p.name for p in (tmp_path / "landing" / "flows").iterdir())
    minutes = {n.split("-")[-1].split(".")[0] for n in names}
    collectors = {n.split("-")[1] for n in names}
    assert len(minutes) == 3 and len(names) == len(minutes) * len(collectors)
    steps = pl.read_csv(tmp_path / "ground_truth" / "steps.csv")
    assert steps["start_ns"].min() >= t0 and steps["end_ns"].max() < t0 + 150_000_000_000
