"""Op rows derived from profiler traces (fleetscope.ingest.trace_timings.ops_from_trace_events)
against the op rows the ranks of the real recordings logged themselves during the same steps
(tests/data/recordings/*/landing: Kineto CPU traces of 3 steps per window and the tracer's
timings; the derivation never reads the latter).

    .venv/bin/python -m benchmarks.xputimer_trace_ops [--sim-seeds 10-12]

Ops are matched by (rank, step, name, order within the step). Prints per window: ops logged,
derived, missed, spurious, |duration error| median / p90 / max (ms), start error p90 (ms); then
the totals."""
from __future__ import annotations

import json
import time
from pathlib import Path

import polars as pl

REC = Path(__file__).resolve().parents[1] / "tests" / "data" / "recordings"
KEY = ["rank", "step", "name"]


def _nth(x, col):
    return x.sort("start_ns").with_columns(k=pl.int_range(pl.len()).over(KEY)).select(
        *KEY, "k", (pl.col("end_ns") - pl.col("start_ns")).alias(col), pl.col("start_ns").alias(col + "_s"))


def sim_gpu(seeds: list[int], scenarios: list[str]) -> None:
    """GPU traces: the simulator's Megatron-like captures (backward on the autograd engine's thread,
    tensor-parallel all-reduces inside the forward, python frames), derived op rows against the op
    timings the simulator wrote for the same steps: forward / backward microbatches found, and the
    relative duration error of each compute op (its span on the device)."""
    import tempfile

    from fleetscope.ingest.timings import read_timings
    from fleetscope.ingest.trace_timings import ops_from_trace_events
    from fleetscope.ingest.traces import read_capture
    from fleetscope.sim.capture.scenarios import scenario_capture

    comp = ["forward-compute", "backward-compute"]
    errs, tot = [], {"logged": 0, "derived": 0, "missed": 0, "spurious": 0}
    for scen in scenarios:
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp:
                landing, _ = scenario_capture(Path(tmp), scen, seed=seed)
                cap = next((landing / "traces").iterdir())
                ops = ops_from_trace_events(read_capture(cap)).filter(pl.col("name").is_in(comp))
                truth = read_timings(landing / "timings" / cap.name).filter(
                    (pl.col("kind") == "op") & pl.col("name").is_in(comp) & pl.col("step").is_in(ops["step"].unique().implode()))
            j = _nth(truth, "t").join(_nth(ops, "d"), on=[*KEY, "k"], how="full", coalesce=True)
            both = j.drop_nulls(["t", "d"]).with_columns(e=(pl.col("d") - pl.col("t")).abs() / pl.col("t"))
            row = {"logged": truth.height, "derived": ops.height, "missed": j["d"].null_count(), "spurious": j["t"].null_count()}
            for k in tot:
                tot[k] += row[k]
            errs.append(both["e"])
            print(f"sim {scen:18s} seed {seed:3d}  compute ops {row['logged']:4d} derived {row['derived']:4d} missed {row['missed']} "
                  f"spurious {row['spurious']}  |rel. dur err| median {both['e'].median() * 100:.1f} % p90 {both['e'].quantile(0.9) * 100:.1f} %")
    e = pl.concat(errs)
    print(f"\nGPU (simulator) total: {tot}; |relative duration error| median {e.median() * 100:.1f} %, p90 {e.quantile(0.9) * 100:.1f} %")


def main(argv=None):
    from fleetscope.ingest.timings import read_timings
    from fleetscope.ingest.trace_timings import ops_from_trace_events
    from fleetscope.ingest.traces import read_capture

    errs, tot = [], {"logged": 0, "derived": 0, "missed": 0, "spurious": 0}
    t_derive = 0.0
    for cap in sorted(p for p in REC.glob("*/landing/traces/*") if p.is_dir()):
        ev = read_capture(cap)
        layout = json.loads((cap / "capture.json").read_text()).get("parallel")
        t0 = time.perf_counter()
        ops = ops_from_trace_events(ev, layout)
        t_derive += time.perf_counter() - t0
        truth = read_timings(cap.parents[1] / "timings" / cap.name).filter(
            (pl.col("kind") == "op") & pl.col("step").is_in(ops["step"].unique().implode()))
        j = _nth(truth, "t").join(_nth(ops, "d"), on=[*KEY, "k"], how="full", coalesce=True)
        both = j.drop_nulls(["t", "d"]).with_columns(e=(pl.col("d") - pl.col("t")).abs() / 1e6,
                                                      se=(pl.col("d_s") - pl.col("t_s")).abs() / 1e6)
        row = {"logged": truth.height, "derived": ops.height, "missed": j["d"].null_count(), "spurious": j["t"].null_count()}
        for k in tot:
            tot[k] += row[k]
        errs.append(both["e"])
        print(f"{cap.parts[-4]:17s} {cap.name:28s} logged {row['logged']:4d} derived {row['derived']:4d} missed {row['missed']} "
              f"spurious {row['spurious']}  |dur err| ms median {both['e'].median():.2f} p90 {both['e'].quantile(0.9):.2f} "
              f"max {both['e'].max():.1f}  start err p90 {both['se'].quantile(0.9):.2f} ms")
    e = pl.concat(errs)
    print(f"\ntotal: {tot}; |duration error| over {e.len()} matched ops: median {e.median():.2f} ms, p90 {e.quantile(0.9):.2f} ms, "
          f"p99 {e.quantile(0.99):.2f} ms, max {e.max():.1f} ms; derivation {t_derive:.2f} s for all windows")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--sim-seeds", default="", help="also the simulator's GPU captures of these seeds (e.g. 10-12)")
    ap.add_argument("--sim-scenarios", default="healthy,slow_gpu,slow_stage_worker,gc_stall,cpu_bound_forward")
    a = ap.parse_args()
    main()
    if a.sim_seeds:
        lo, _, hi = a.sim_seeds.partition("-")
        sim_gpu(list(range(int(lo), int(hi or lo) + 1)), a.sim_scenarios.split(","))
