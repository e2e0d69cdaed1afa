"""The PRISM scenarios (step_forecasts rows and step_forecast_details sweeps) and the straggler
verdicts for the real StragglerAnalysis trace and a simulated job with a slow GPU; the CDF plots
are written to a folder (default /tmp/prism_plots).

    .venv/bin/python -m benchmarks.prism_scenarios [plot_dir]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import polars as pl

from benchmarks.prism_common import real_timings, simulated  # noqa: E402
from fleetscope.prism.forecast import forecast_capture  # noqa: E402


def show(title: str, t: pl.DataFrame, out: Path) -> None:
    t0 = time.perf_counter()
    r = forecast_capture(t)
    print(f"\n=== {title} ({time.perf_counter() - t0:.1f} s) ===")
    with pl.Config(tbl_cols=20, tbl_rows=60, tbl_width_chars=220, fmt_str_lengths=90, float_precision=4):
        print(r.step_forecasts.select("scenario", "n_ranks", (pl.col("mean_ns", "p5_ns", "p50_ns", "p95_ns") / 1e9),
                                      "ks_vs_measured", "mean_error_pct"))
        d = r.details
        print(d.filter((pl.col("scenario") == "slow_node_placement") & ~pl.col("subject").str.starts_with("rank="))
              .select("subject", "slowdown", "rank_order"))
        print(d.filter((pl.col("scenario") == "kernel_sensitivity") & (pl.col("parameter").is_in(["cv=0.2", "measured"])))
              .sort("parameter", "rank_order").select("parameter", "subject", "slowdown", "rank_order").head(12))
        print(d.filter(pl.col("scenario") == "sync_group_size").select("subject", "parameter", "slowdown", "probability"))
        print(d.filter(pl.col("scenario") == "scale_slowdown").select("subject", "parameter", "slowdown", "probability"))
        print(r.verdicts.select("scope", "subject", "severity", "team", "value", "explanation"))
    out.mkdir(parents=True, exist_ok=True)
    for k, png in r.plots.items():
        (out / f"{r.graph.capture_id}-{k}.png").write_bytes(png)


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/prism_plots")
    show("real: StragglerAnalysis trace-ST", real_timings(), out)
    t, truth = simulated("slow_gpu")
    print(f"\n(simulated slow_gpu ground truth: rank {truth[0]['rank']}, team {truth[0]['team']})")
    show("sim: slow_gpu", t, out)


if __name__ == "__main__":
    main()
