"""What makes a recorder output a valid landing folder with self-consistent ground truth.
Shared by the tests of the committed recordings and the end-to-end recorder test. It checks the
data's form and the truth's consistency with itself and with the capture, never an analysis."""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl

OP_NAMES = {"forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send", "backward-recv",
            "grads-all-reduce", "optimizer"}

FAULT_TYPES = {c: pl.Utf8 for c in ("fault_id", "kind", "scope", "subject", "job_id", "unit", "team", "ips", "hosts", "ranks",
                                    "affected_jobs", "source", "captures")} | {
    "start_ns": pl.Int64, "end_ns": pl.Int64, "magnitude": pl.Float64, "delay_ns": pl.Int64, "forward_ratio": pl.Float64, "impact": pl.Float64}


def load(root: Path) -> dict:
    gt, la = root / "ground_truth", root / "landing"
    rec = json.loads((gt / "recording.json").read_text())
    return {
        "rec": rec, "T0": rec["capture_start_ns"], "T1": rec["capture_end_ns"],
        "topo": pl.read_csv(la / "topology" / "topology.csv"),
        "flows": pl.concat([pl.read_parquet(p) for p in sorted((la / "flows").glob("*.parquet"))]),
        "jobs": pl.read_csv(gt / "jobs.csv"), "pairs": pl.read_csv(gt / "pairs.csv"),
        "other": pl.read_csv(gt / "pairs_other.csv"), "steps": pl.read_csv(gt / "steps.csv"),
        "faults": pl.read_csv(gt / "faults.csv", schema_overrides=FAULT_TYPES),
        "background": pl.read_csv(gt / "background.csv"), "captures": pl.read_csv(gt / "captures.csv"),
    }


def check_truth(d: dict) -> None:
    from fleetscope.sim import schemas as S

    T0, T1, topo, jobs = d["T0"], d["T1"], d["topo"], d["jobs"]
    S.TRUTH_JOBS.validate(jobs.with_columns(pl.col("rank", "tp_rank", "pp_stage", "dp_rank").cast(pl.Int32)))
    S.TRUTH_PAIRS.validate(d["pairs"])
    S.TRUTH_STEPS.validate(d["steps"])
    S.TRUTH_FAULTS.validate(d["faults"])
    assert T0 < T1
    # every job ip is a topology NIC; infrastructure addresses are not
    assert set(jobs["ip"]) <= set(topo["ip"]), set(jobs["ip"]) - set(topo["ip"])
    assert topo["ip"].is_unique().all()
    assert not set(d["background"]["ip"]) & set(topo["ip"])
    assert jobs.group_by("job_id").agg(n=pl.len(), r=pl.col("rank").n_unique()).filter(pl.col("n") != pl.col("r")).height == 0

    # pairs: both ends in one job, the type what the layout says, every DP/PP pair of the layout present
    lay = {r["ip"]: r for r in jobs.iter_rows(named=True)}
    for p in d["pairs"].iter_rows(named=True):
        a, b = lay[p["ip_a"]], lay[p["ip_b"]]
        assert a["job_id"] == b["job_id"] == p["job_id"], p
        want = "DP" if a["pp_stage"] == b["pp_stage"] else "PP" if a["dp_rank"] == b["dp_rank"] and abs(a["pp_stage"] - b["pp_stage"]) == 1 else None
        assert p["comm_type"] == want, (p, want)
    expect = set()
    for j, g in jobs.group_by("job_id"):
        rows = g.to_dicts()
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                if a["pp_stage"] == b["pp_stage"] or (a["dp_rank"] == b["dp_rank"] and abs(a["pp_stage"] - b["pp_stage"]) == 1):
                    expect.add((min(a["ip"], b["ip"]), max(a["ip"], b["ip"])))
    assert {(r["ip_a"], r["ip_b"]) for r in d["pairs"].iter_rows(named=True)} == expect
    for p in d["other"].iter_rows(named=True):
        assert lay[p["ip_a"]]["job_id"] == lay[p["ip_b"]]["job_id"] == p["job_id"] and p["comm_type"] == "other"

    # steps: per ip consecutive, increasing, contiguous (start = previous end), inside the capture
    st = d["steps"].sort("job_id", "ip", "step")
    assert set(st["ip"]) <= set(jobs["ip"])
    chk = st.with_columns(ds=pl.col("step").diff().over("ip"), pe=pl.col("end_ns").shift(1).over("ip"))
    assert (chk["end_ns"] > chk["start_ns"]).all() and (chk["compute_start_ns"] < chk["end_ns"]).all()
    assert chk.filter(pl.col("ds").is_not_null() & (pl.col("ds") != 1)).height == 0, "steps are not consecutive"
    assert chk.filter(pl.col("pe").is_not_null() & (pl.col("start_ns") != pl.col("pe"))).height == 0
    assert st["start_ns"].min() >= T0 and st["end_ns"].max() <= T1
    for job_id, g in st.group_by("job_id"):   # every rank of a job did the same steps
        assert g.group_by("ip").agg(pl.col("step").min()).n_unique("step") <= 2, job_id
        assert g["ip"].n_unique() == jobs.filter(pl.col("job_id") == job_id[0]).height

    # the fault: inside the recording, naming something that exists
    f = d["faults"]
    if d["rec"]["scenario"] == "healthy":
        assert f.height == 0
        assert not d["captures"]["shows_fault"].any()
        return
    assert f.height == 1
    r = f.row(0, named=True)
    assert T0 <= r["start_ns"] < r["end_ns"] <= T1, (T0, r["start_ns"], r["end_ns"], T1)
    if r["scope"] in ("gpu", "link"):
        assert r["subject"] in set(topo["ip"]) and r["job_id"] in set(jobs["job_id"])
        assert jobs.filter(pl.col("ip") == r["subject"])["job_id"].item() == r["job_id"]
        if r["ranks"] is not None:
            assert jobs.filter(pl.col("ip") == r["subject"])["rank"].item() == int(r["ranks"])
    else:
        assert r["scope"] == "switch" and r["subject"] in set(topo["spine"])
    assert set(r["affected_jobs"].split("|")) <= set(jobs["job_id"])
    shown = d["captures"].filter(pl.col("shows_fault"))
    assert shown.height >= 1 and set(shown["job_id"]) <= set(r["affected_jobs"].split("|"))
    assert set(r["captures"].split("|")) == set(shown["capture_id"])


def check_landing(root: Path, d: dict) -> None:
    la, T0, T1, jobs = root / "landing", d["T0"], d["T1"], d["jobs"]
    fl = d["flows"]
    assert {"start_ns", "end_ns", "src_ip", "dst_ip", "bytes"} <= set(fl.columns)
    assert (fl["bytes"] > 0).all() and (fl["end_ns"] >= fl["start_ns"]).all()
    assert fl["start_ns"].min() >= T0 - 1_000_000_000 and fl["end_ns"].max() <= T1 + 1_000_000_000
    # no traffic between jobs; every address is a job NIC or an infrastructure server
    known = set(jobs["ip"]) | set(d["background"]["ip"])
    assert set(fl["src_ip"]) | set(fl["dst_ip"]) <= known
    job_of = jobs.select("ip", "job_id")
    cross = (fl.join(job_of.rename({"ip": "src_ip", "job_id": "js"}), on="src_ip")
             .join(job_of.rename({"ip": "dst_ip", "job_id": "jd"}), on="dst_ip").filter(pl.col("js") != pl.col("jd")))
    assert cross.height == 0, cross.head()

    for cap in d["captures"].iter_rows(named=True):
        job = jobs.filter(pl.col("job_id") == cap["job_id"])
        world = job.height
        for kind in ("traces", "timings"):   # one capture id for a job window's traces and timings
            cj = json.loads((la / kind / cap["capture_id"] / "capture.json").read_text())
            assert cj["job_id"] == cap["job_id"]
            par = cj["parallel"]
            assert par["dp"] * par["pp"] * par["tp"] == world
            assert par["pp"] == job["pp_stage"].max() + 1
        files = sorted((la / "traces" / cap["capture_id"]).glob("*.json.gz"))
        assert len(files) == world == cap["trace_files"]
        ranks, steps = [], []
        for p in files:
            t = json.loads(gzip.decompress(p.read_bytes()))
            info = t["distributedInfo"]
            assert info["world_size"] == world and info["backend"] == "gloo"
            ranks.append(info["rank"])
            names = sorted(int(m.group(1)) for e in t["traceEvents"] if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name")))))
            steps.append(tuple(names))
        assert sorted(ranks) == list(range(world)), ranks
        first = cap["profile_step"]
        assert set(steps) == {tuple(range(first, first + cap["profile_steps"]))}, steps   # aligned across ranks
        tm = pl.concat([pl.read_parquet(p) for p in (la / "timings" / cap["capture_id"]).glob("*.parquet")], how="diagonal_relaxed")
        ops = tm.filter(pl.col("kind") == "op")
        assert set(ops["name"]) <= OP_NAMES and {"forward-compute", "backward-compute", "optimizer"} <= set(ops["name"])
        assert ops.select(pl.col("step", "stage", "dp_rank").null_count().sum()).row(0) == (0, 0, 0)
        assert sorted(ops["rank"].unique()) == list(range(world))
        assert ops["step"].min() >= cap["from_step"]
        per_mb = ops.filter(pl.col("name").is_in(["forward-compute", "backward-compute"]))
        assert per_mb["microbatch"].null_count() == 0
        for r in ops.filter(pl.col("name") == "forward-compute").group_by("rank", "step").len().iter_rows(named=True):
            assert r["len"] == int(par["pp"] > 1) * 3 + 1   # 4 microbatches for the pipeline job, 1 for DDP
        # the job's stages from the tracer rows match the truth's layout
        lay = ops.select("rank", "stage", "dp_rank").unique().sort("rank")
        want = job.select(rank=pl.col("rank").cast(pl.Int32), stage=pl.col("pp_stage").cast(pl.Int32),
                          dp_rank=pl.col("dp_rank").cast(pl.Int32)).sort("rank")
        assert lay.equals(want), (lay, want)


def check_recording(root: Path) -> dict:
    d = load(root)
    check_truth(d)
    check_landing(root, d)
    return d
