"""XPUTimer metrics on the real StragglerAnalysis trace (per-rank, per-stage) and the detectors on
the simulator's job scenarios (verdicts and teams against the ground truth).

    .venv/bin/python -m benchmarks.xputimer_detectors [--no-sim]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


import polars as pl

from fleetscope.ingest.timings import read_timings
from fleetscope.xputimer import detectors as D
from fleetscope.xputimer.hang import diagnose_all

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "real"
SCEN = ["healthy", "gc_stall", "sync_in_forward", "slow_dataloader", "slow_gpu", "misaligned_gemm", "hang"]


def straggler():
    t = read_timings(REAL / "straggler_analysis")
    t0 = time.perf_counter()
    out = D.analyze(t)
    dt = time.perf_counter() - t0
    sm = out["xputimer_stage_metrics"].select(
        "rank", "stage", "dp_rank", (pl.col("compute_ns_per_step") / 1e9).round(3).alias("compute_s_per_step"),
        (pl.col("comm_ns_per_step") / 1e9).round(3).alias("comm_s_per_step"), pl.col("compute_ratio_to_median").round(3))
    print("StragglerAnalysis trace-ST (8 ranks, DP2 x PP4), per rank and stage:")
    with pl.Config(tbl_rows=20, tbl_cols=10, tbl_width_chars=140):
        print(sm)
    jt = out["xputimer_job_throughput"]
    print(f"job: {jt['n_steps'][0]} steps, median step {jt['median_step_ns'][0] / 1e9:.3f} s; analyze() took {dt:.2f} s")
    for r in out["verdicts"].iter_rows(named=True):
        print(f"verdict [{r['severity']}/{r['team']}] {r['scope']} {r['subject']}: {r['explanation']}")


def sims():
    from fleetscope.sim.capture import scenario_capture

    with tempfile.TemporaryDirectory() as tmp:
        data = {}
        for sc in SCEN:
            landing, truth = scenario_capture(Path(tmp) / sc, sc, seed=2)
            (cap,) = [p for p in (landing / "timings").iterdir() if p.is_dir()]
            data[sc] = (landing, read_timings(cap), truth)
        print("\nsimulated scenarios (seed 2), history = the healthy scenario:")
        print(f"{'scenario':16s} {'truth (scope subject team)':44s} verdicts (warning/critical)")
        for sc in SCEN:
            landing, t, truth = data[sc]
            v = D.analyze(t, history=data["healthy"][1] if sc != "healthy" else None)["verdicts"]
            if sc == "hang":
                v = pl.concat([v, diagnose_all(landing / "stacks")[1]])
            bad = v.filter(pl.col("severity").is_in(["warning", "critical"]))
            tr = sorted({(x["scope"], x["subject"] if x["scope"] != "job" else "job", x["team"]) for x in truth})
            got = sorted({(r["scope"], r["subject"] if r["scope"] != "job" else "job", r["metric"], r["team"]) for r in bad.iter_rows(named=True)})
            print(f"{sc:16s} {str(tr)[:44]:44s} {got}")
            if sc != "healthy":
                truth_ranks = sorted({x['rank'] for x in truth})
                print(f"{'':16s} truth ranks {truth_ranks}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-sim", action="store_true")
    a = ap.parse_args()
    straggler()
    if not a.no_sim:
        sims()
