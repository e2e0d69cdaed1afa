"""Replay speed on a synthetic execution graph of about 1 million tasks (target: at most 10 s).

The graph looks like a training step repeated: one CPU thread launching kernels round-robin on
4 streams (launch edges, thread order, stream order), an event record/wait between two streams
every 50 launches, a stream synchronize every 1000 launches, and 8 ranks whose communication
kernels form collectives across ranks.

    .venv/bin/python -m benchmarks.traces_replay_speed [--tasks 1000000] [--repeat 3]"""
from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl

from fleetscope.traces.replay import simulate_graph  # noqa: E402


def synthetic(n_tasks: int, ranks: int = 8, streams: int = 4, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    per_rank = n_tasks // ranks
    launches = per_rank // 2
    tasks, edges = [], []
    base = 0
    for r in range(ranks):
        cpu = base + 2 * np.arange(launches)  # task ids: launch i -> 2i, its kernel -> 2i+1
        gpu = cpu + 1
        stream = np.arange(launches) % streams
        cpu_dur = rng.integers(2_000, 8_000, launches)
        gap = rng.integers(1_000, 4_000, launches)
        kdur = rng.integers(5_000, 40_000, launches)
        cpu_ts = np.cumsum(cpu_dur + gap)
        k_ts = cpu_ts + 5_000
        is_comm = (np.arange(launches) % 97) == 0
        is_sync = (np.arange(launches) % 1000) == 999
        tasks.append(pl.DataFrame({
            "task_id": np.concatenate([cpu, gpu]),
            "rank": np.full(2 * launches, r, np.int32),
            "sim_dur_ns": np.concatenate([cpu_dur, kdur]),
            "sim_start_ref": np.concatenate([cpu_ts, k_ts]),
            "wait_ref": np.concatenate([np.where(is_sync, cpu_ts + 1, 0), np.zeros(launches, np.int64)]),
        }).with_columns(wait_ref=pl.col("wait_ref").replace(0, None)).with_columns(coll_group=pl.when(pl.col("task_id") % 2 == 1).then(
            pl.when(pl.lit(pl.Series(np.concatenate([np.zeros(launches, bool), is_comm])))).then(
                pl.concat_str([pl.lit("c"), ((pl.col("task_id") - base) // 2).cast(pl.Utf8)])))))
        e = [
            (cpu[:-1], cpu[1:], "cpu_cpu", gap[1:]),  # thread order
            (cpu, gpu, "cpu_gpu", np.full(launches, 3_000)),  # launch
        ]
        for s in range(streams):  # stream order
            g = gpu[stream == s]
            e.append((g[:-1], g[1:], "gpu_gpu", np.full(g.size - 1, 1_000)))
        w = np.flatnonzero((np.arange(launches) % 50 == 0) & (np.arange(launches) + 1 < launches))
        e.append((gpu[w], gpu[w + 1], "gpu_gpu", np.zeros(w.size, np.int64)))  # event wait
        sy = np.flatnonzero(is_sync)
        e.append((gpu[sy - 1], cpu[sy], "gpu_cpu", np.zeros(sy.size, np.int64)))  # sync waits for the previous kernel
        for s_, d_, t_, l_ in e:
            edges.append(pl.DataFrame({"src": s_.astype(np.int64), "dst": d_.astype(np.int64), "edge_type": t_, "lag_ns": l_.astype(np.int64)}))
        base += 2 * launches
    t = pl.concat(tasks).sort("task_id")
    return t, pl.concat(edges)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    t0 = time.perf_counter()
    tasks, edges = synthetic(a.tasks)
    print(f"synthetic graph: {tasks.height} tasks, {edges.height} edges, "
          f"{tasks['coll_group'].n_unique() - 1} collectives across 8 ranks (built in {time.perf_counter() - t0:.1f} s)")
    # a trace's timestamps respect its dependencies; give the synthetic graph such timestamps by
    # simulating it once from arbitrary ones (this needs the Kahn-order fallback)
    t = time.perf_counter()
    first = simulate_graph(tasks, edges)
    print(f"  first simulation from inconsistent timestamps (Kahn order fallback: {first.order_fallback}): {time.perf_counter() - t:.2f} s")
    tasks = tasks.with_columns(sim_start_ref=pl.Series(first.start),
                               wait_ref=pl.when(pl.col("wait_ref").is_not_null()).then(pl.Series(first.end) - pl.col("sim_dur_ns")))
    best = None
    for _ in range(a.repeat):
        t = time.perf_counter()
        sim = simulate_graph(tasks, edges)
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
        print(f"  simulate: {dt:.2f} s (order fallback: {sim.order_fallback})")
    span = (sim.end.max() - sim.start.min()) / 1e9
    print(f"RESULT {tasks.height} tasks simulated in {best:.2f} s (best of {a.repeat}); target <= 10 s: "
          f"{'met' if best <= 10 else 'NOT met'}; simulated span {span:.2f} s")


if __name__ == "__main__":
    main()
