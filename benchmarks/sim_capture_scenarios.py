"""Render every scenario of fleetscope.sim.capture and print what each fault changed, measured from
the rendered landing files (timings parquet and hw samples) against the healthy run of the same seed.

    .venv/bin/python -m benchmarks.sim_capture_scenarios [--seed 0] [--out /tmp/simcap]
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import polars as pl

from fleetscope.sim.capture import SCENARIOS, scenario_capture


def summarize(landing: Path) -> dict:
    t = pl.read_parquet(sorted((landing / "timings").glob("*/rank*.parquet")))
    hw = pl.read_parquet(sorted((landing / "hw").glob("*.parquet")))
    k = t.with_columns(d=(pl.col("end_ns") - pl.col("start_ns")))
    steps = k.filter((pl.col("kind") == "op") & (pl.col("name") == "optimizer")).group_by("step").agg(pl.col("end_ns").max())
    step_ns = steps.sort("step")["end_ns"].diff().drop_nulls()
    gemm = k.filter(pl.col("name") == "gemm")
    by_rank_gemm = gemm.group_by("rank").agg((pl.col("flops").sum() / pl.col("d").sum() * 1e9 / 1e12).alias("tflops"))
    ar = k.filter(pl.col("name") == "nccl:AllReduce").group_by("rank").agg(pl.col("d").mean() / 1e3)
    api = k.filter(pl.col("kind") == "api").group_by("name").agg(pl.col("d").max() / 1e6, pl.len())
    return {
        "step_ms": float(step_ns.mean() / 1e6) if step_ns.len() else float("nan"),
        "gemm_tflops_min": float(by_rank_gemm["tflops"].min()), "gemm_tflops_median": float(by_rank_gemm["tflops"].median()),
        "allreduce_us_max": float(ar["d"].max()) if ar.height else 0.0, "allreduce_us_median": float(ar["d"].median()) if ar.height else 0.0,
        "api_max_ms": {r["name"]: round(r["d"], 2) for r in api.to_dicts()},
        "sync_calls": int(api.filter(pl.col("name") == "cuda.synchronize")["len"].sum()),
        "sm_clock_min": float(hw["sm_clock_mhz"].min()), "throttled_gpus": int(hw.filter(pl.col("throttle_reasons") > 0)["gpu"].n_unique()),
        "nvlink_zero_gpus": int(hw.group_by("gpu").agg(pl.col("nvlink_tx_bps").max()).filter(pl.col("nvlink_tx_bps") == 0).height),
        "pcie_max_gbps": float(hw["pcie_tx_bps"].max() / 1e9),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/simcap_bench")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args()
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    print(f"{'scenario':18} {'secs':>5} {'MB':>5} {'step_ms':>8} {'gemmTF min/med':>15} {'AR us med/max':>16} {'smclk':>6} {'thr':>4} {'nvl0':>4} {'pcieGB':>6} truth(ranks,team)  api max ms")
    for sc in a.scenarios.split(","):
        t = time.perf_counter()
        landing, truth = scenario_capture(out / sc, sc, a.seed)
        secs = time.perf_counter() - t
        mb = sum(f.stat().st_size for f in landing.rglob("*") if f.is_file()) / 1e6
        s = summarize(landing)
        teams = sorted({r["team"] for r in truth})
        ranks = sorted({r["rank"] for r in truth if r.get("rank") is not None})
        print(f"{sc:18} {secs:5.1f} {mb:5.1f} {s['step_ms']:8.1f} {s['gemm_tflops_min']:7.0f}/{s['gemm_tflops_median']:<7.0f} "
              f"{s['allreduce_us_median']:7.0f}/{s['allreduce_us_max']:<8.0f} {s['sm_clock_min']:6.0f} {s['throttled_gpus']:4d} "
              f"{s['nvlink_zero_gpus']:4d} {s['pcie_max_gbps']:6.1f} {str(ranks[:6]) + ('..' if len(ranks) > 6 else '')},{teams}  {s['api_max_ms']}")


if __name__ == "__main__":
    main()
