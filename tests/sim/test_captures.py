"""The fleet simulator hands sampled jobs to the capture renderer (fleetscope.sim.capture, a
colleague's package) with the faults that touch them; its ground truth lands beside faults.csv."""
from __future__ import annotations

import json

import polars as pl

from fleetscope.sim import simulate



def test_captures_show_the_fleet_faults_on_the_right_ranks(tmp_path):
    s = simulate(tmp_path, gpus=64, seed=0, faults="slow_gpu:1,hang:1")
    landing, truth = tmp_path / "landing", tmp_path / "ground_truth"
    faults = pl.read_csv(truth / "faults.csv")
    slow = faults.filter(pl.col("kind") == "slow_gpu").row(0, named=True)
    hang = faults.filter(pl.col("kind") == "hang").row(0, named=True)
    assert slow["captures"], "the slow GPU's job was captured while the fault was active"
    cid = slow["captures"]
    assert cid.startswith(slow["job_id"]) and cid in s["captures"]
    cap = json.loads((landing / "traces" / cid / "capture.json").read_text())
    assert cap["job_id"] == slow["job_id"] and cap["start_ns"] >= slow["start_ns"]
    layout = pl.read_csv(truth / "job_layout.csv").filter(pl.col("job_id") == slow["job_id"]).row(0, named=True)
    assert cap["parallel"]["pp"] == layout["pp"] and cap["parallel"]["dp"] == layout["dp"]
    assert len(list((landing / "timings" / cid).glob("rank*"))) == layout["n_gpus"]
    assert 1 <= len(list((landing / "traces" / cid).glob("rank*.json.gz"))) <= 4
    ct = pl.read_csv(truth / "capture_faults.csv")
    rows = ct.filter(pl.col("fault_id") == slow["fault_id"])
    assert rows.height >= 1 and set(rows["ip"]) == {slow["subject"]}        # only the slow GPU's rank
    # the hung job: stack dumps of every rank and an incident
    inc = [p for p in s["captures"] if p.startswith(f"hang-{hang['job_id']}")]
    assert inc and (landing / "incidents" / f"{inc[0]}.json").exists()
    n = pl.read_csv(truth / "jobs.csv").filter(pl.col("job_id") == hang["job_id"]).height
    assert len(list((landing / "stacks" / inc[0]).glob("rank*.txt"))) == n
    assert list((landing / "hw").glob("*"))
