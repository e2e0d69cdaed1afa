"""The ground truth is self-consistent under every seed's conventions: faults and events inside the
window with subjects that exist, background pairs disjoint from job pairs, every landed record a
job pair or a background pair, steps that tile time and end where the DP traffic ends."""
from __future__ import annotations

import polars as pl

from fleetscope.sim import simulate


def _pairs(df: pl.DataFrame, a="src_ip", b="dst_ip") -> pl.DataFrame:
    return df.select(ip_a=pl.min_horizontal(a, b), ip_b=pl.max_horizontal(a, b))


def test_faults_and_events_lie_in_the_window_and_name_existing_subjects(many_seeds, faulty256):
    n_faults = 0
    for fleet in many_seeds + [faulty256]:
        lo, hi = fleet.window
        topo = fleet.topology()
        flows = fleet.flows()
        switches = set(flows["path"].explode().drop_nulls()) | set(topo["leaf"]) | (set(topo["spine"]) if "spine" in topo.columns else set())
        jobs = fleet.truth("jobs")
        f = fleet.truth("faults")
        n_faults += f.height
        assert (f["start_ns"] < hi).all() and (f["end_ns"] > lo).all() and (f["end_ns"] > f["start_ns"]).all()
        assert f["fault_id"].n_unique() == f.height
        for r in f.iter_rows(named=True):
            if r["scope"] in ("gpu", "link"):
                assert r["subject"] in set(topo["ip"]) and r["subject"] in set(jobs["ip"]), r
            elif r["scope"] == "switch":
                assert r["subject"] in switches, r
            elif r["scope"] == "host":
                assert r["subject"] in set(topo["host"]), r
            elif r["scope"] == "job":
                assert r["subject"] in set(jobs["job_id"]), r
            elif r["scope"] == "rack":
                assert "rack" not in topo.columns or r["subject"] in set(topo["rack"]), r
        e = fleet.truth("events")
        assert (e["start_ns"] < hi).all() and (e["end_ns"] >= lo).all() and set(e["job_id"]) <= set(jobs["job_id"])
    assert n_faults >= 12


def test_background_pairs_never_overlap_job_pairs_and_every_record_is_one_or_the_other(many_seeds, healthy256):
    for fleet in many_seeds + [healthy256]:
        pairs = fleet.truth("pairs").select("ip_a", "ip_b", "job_id", "comm_type")
        bg = fleet.truth("background")
        assert bg.height > 0 and set(bg["role"]) >= {"probe"}
        assert pairs.join(bg, on=["ip_a", "ip_b"], how="semi").height == 0
        seen = _pairs(fleet.flows()).unique()
        job_seen = seen.join(pairs, on=["ip_a", "ip_b"], how="semi")
        bg_seen = seen.join(bg, on=["ip_a", "ip_b"], how="semi")
        assert job_seen.height + bg_seen.height == seen.height
        # every labelled job pair shows in the records (records are lost at random, whole pairs are not)
        assert pairs.join(job_seen, on=["ip_a", "ip_b"], how="anti").height <= 0.01 * pairs.height
        # job pairs never cross jobs
        jobs = fleet.truth("jobs").select("ip", "job_id")
        j = pairs.join(jobs.rename({"ip": "ip_a", "job_id": "ja"}), on="ip_a").join(jobs.rename({"ip": "ip_b", "job_id": "jb"}), on="ip_b")
        assert j.height == pairs.height and (j["ja"] == j["jb"]).all() and (j["ja"] == j["job_id"]).all()


def test_observed_ips_are_those_with_job_traffic(many_seeds):
    for fleet in many_seeds:
        jobs = fleet.truth("jobs")
        pairs = fleet.truth("pairs")
        in_pairs = set(pairs["ip_a"]) | set(pairs["ip_b"])
        assert set(jobs.filter("observed")["ip"]) == in_pairs
        assert (jobs.filter("observed")["first_seen_ns"] <= jobs.filter("observed")["last_seen_ns"]).all()


def test_steps_tile_time_and_end_where_dp_traffic_ends(many_seeds):
    for fleet in many_seeds:
        steps = fleet.truth("steps")
        lo, hi = fleet.window
        assert steps.height > 0 and (steps["end_ns"] > steps["start_ns"]).all()
        assert (steps["start_ns"] >= lo).all() and (steps["end_ns"] < hi).all()
        s = steps.sort("job_id", "ip", "step").with_columns(pe=pl.col("end_ns").shift(1).over("job_id", "ip"),
                                                             ps=pl.col("step").shift(1).over("job_id", "ip"))
        cont = s.filter(pl.col("ps") == pl.col("step") - 1)
        assert (cont["start_ns"] == cont["pe"]).all()
        # an unobservable start is a first step after a launch, which starts at its compute start
        first = steps.filter(~pl.col("start_observed"))
        assert (first["start_ns"] == first["compute_start_ns"]).all()
        launched = set(fleet.truth("job_layout").filter(pl.col("launch_ns").is_not_null())["job_id"])
        assert set(first["job_id"]) <= launched
        # steps are DP-traffic ips only
        dp = fleet.truth("pairs").filter(pl.col("comm_type") == "DP")
        assert set(steps["ip"]) <= set(dp["ip_a"]) | set(dp["ip_b"])


def test_healthy_spec_injects_no_fault_but_benign_events_still_happen(tmp_path):
    n_events = 0
    for spec in ("", "none", "healthy"):
        s = simulate(tmp_path / (spec or "empty"), gpus=128, seed=11, faults=spec, captures=False,
                     conventions={"life": {"n_launch": 1, "n_checkpoint": 2, "n_dataloader_stall": 2, "n_finish": 1}})
        assert s["faults"] == []
        assert pl.read_csv(tmp_path / (spec or "empty") / "ground_truth" / "faults.csv").height == 0
        ev = pl.read_csv(tmp_path / (spec or "empty") / "ground_truth" / "events.csv")
        assert {"launch", "checkpoint_load", "first_step", "checkpoint_save", "dataloader_stall", "finish"} <= set(ev["kind"])
        n_events = ev.height
    assert n_events >= 6


def test_healthy_and_faulty_twins_share_jobs_and_conventions(healthy256, faulty256):
    a, b = healthy256.conventions, faulty256.conventions
    assert {k: v for k, v in a.items() if k != "jobs_drawn"} == {k: v for k, v in b.items() if k != "jobs_drawn"}
    la, lb = healthy256.truth("job_layout"), faulty256.truth("job_layout")
    cols = ["job_id", "tp", "pp", "dp", "dp_style", "channels", "qps", "start_ns"]
    assert la.select(cols).equals(lb.select(cols))
    assert healthy256.truth("jobs").select("job_id", "ip").equals(faulty256.truth("jobs").select("job_id", "ip"))
