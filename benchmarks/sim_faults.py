"""How much each simulated fault changes the data: a faulty fleet against its healthy twin (same
seed: same jobs, hosts and compute noise), measured on the ground truth and the landed flows.

    .venv/bin/python -m benchmarks.sim_faults [--gpus 256] [--seed 3]
"""
from __future__ import annotations

import argparse
import glob
import tempfile
from pathlib import Path

import polars as pl

from fleetscope.sim import simulate

ALL = ("congested_switch:1,degraded_nic:1,slow_gpu:1,nvlink_down:1,gc_stall:1,sync_in_forward:1,"
       "slow_dataloader:1,hang:1,throttled_racks:1")


def _flows(root: Path) -> pl.DataFrame:
    parts = []
    for p in glob.glob(str(root / "landing" / "flows" / "*")):
        df = pl.read_parquet(p) if p.endswith(".parquet") else pl.read_csv(p)
        if "duration_ns" not in df.columns:
            df = df.with_columns(duration_ns=pl.col("end_ns") - pl.col("start_ns"))
        if df.schema["path"] != pl.Utf8:
            df = df.with_columns(pl.col("path").list.join(">"))
        parts.append(df.select("start_ns", "duration_ns", "src_ip", "dst_ip", "bytes", "src_qp", "path"))
    return pl.concat(parts)


def _steps(root: Path, job: str, lo=None, stat="median") -> float:
    s = pl.read_csv(root / "ground_truth" / "steps.csv").filter(pl.col("job_id") == job)
    if lo is not None:
        s = s.filter(pl.col("start_ns") >= lo)
    d = s["end_ns"] - s["start_ns"]
    return float(d.median() if stat == "median" else d.mean())


def _bw_ratio(flows: pl.DataFrame, pairs: pl.DataFrame, hit: pl.Expr, r: dict) -> float:
    f = flows.with_columns(ip_a=pl.min_horizontal("src_ip", "dst_ip"), ip_b=pl.max_horizontal("src_ip", "dst_ip"))
    f = f.join(pairs.filter(pl.col("comm_type") == "DP").select("ip_a", "ip_b"), on=["ip_a", "ip_b"], how="semi")
    f = f.filter(hit & (pl.col("bytes") > 1_000_000)).with_columns(
        bw=pl.col("bytes") / pl.col("duration_ns"), on=(pl.col("start_ns") >= r["start_ns"]) & (pl.col("start_ns") < r["end_ns"]))
    g = f.group_by("src_ip", "dst_ip", "src_qp", "bytes").agg(
        a=pl.col("bw").filter(pl.col("on")).median(), b=pl.col("bw").filter(~pl.col("on")).median()).drop_nulls()
    return float((g["a"] / g["b"]).median())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=256)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        h, f = Path(tmp) / "healthy", Path(tmp) / "faulty"
        simulate(h, gpus=a.gpus, seed=a.seed, captures=False)
        simulate(f, gpus=a.gpus, seed=a.seed, faults=ALL, captures=False)
        faults = pl.read_csv(f / "ground_truth" / "faults.csv")
        pairs = pl.read_csv(f / "ground_truth" / "pairs.csv")
        flows = _flows(f)
        print(f"{'kind':<17} {'subject':<12} {'magnitude':>9}  effect")
        for r in faults.iter_rows(named=True):
            job = r["job_id"] or (r["affected_jobs"] or "").split("|")[0]
            if r["kind"] == "congested_switch":
                hit = pl.col("path").str.contains(r["subject"] + "(>|$)")
                eff = (f"DP bandwidth through it while active / otherwise = {_bw_ratio(flows, pairs, hit, r):.3f}; "
                       f"elsewhere {_bw_ratio(flows, pairs, ~hit, r):.3f}; jobs crossing it: {r['affected_jobs']}")
            elif r["kind"] == "degraded_nic":
                hit = (pl.col("src_ip") == r["subject"]) | (pl.col("dst_ip") == r["subject"])
                eff = f"its DP flows' bandwidth while active / otherwise = {_bw_ratio(flows, pairs, hit, r):.3f} ({job})"
            elif r["kind"] == "hang":
                last = pl.read_csv(f / "ground_truth" / "steps.csv").filter(pl.col("job_id") == job)["end_ns"].max()
                eff = f"{job}: last step ends {(r['start_ns'] - last) / 1e9:.2f} s before the hang; no flows after it"
            else:
                stat = "mean" if r["kind"] == "gc_stall" else "median"
                ratio = _steps(f, job, r["start_ns"], stat) / _steps(h, job, r["start_ns"], stat)
                eff = f"{job}: {stat} step time vs healthy twin = {ratio:.3f}"
            print(f"{r['kind']:<17} {r['subject']:<12} {r['magnitude']:>9}  {eff}")


if __name__ == "__main__":
    main()
