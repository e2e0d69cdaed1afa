"""Speed of the step-time forecast of a 65,536-rank job (TP8 x PP8 x DP1024, 16 microbatches,
1F1B), 10,000 Monte Carlo step samples, with the op latency distributions of the real
StragglerAnalysis trace. numpy only. Target: at most 10 s.

    .venv/bin/python -m benchmarks.prism_speed
"""
from __future__ import annotations

import time

import numpy as np

from benchmarks.prism_common import real_timings  # noqa: E402
from fleetscope.prism.compose import PipelineModel, step_distribution  # noqa: E402
from fleetscope.prism.structure import build_job_graph  # noqa: E402


def main() -> None:
    pm = PipelineModel.from_graph(build_job_graph(real_timings()))
    big = pm.at_layout(tp=8, pp=8, dp=1024, microbatches=16, schedule="1f1b")
    assert big.n_ranks == 65_536
    for n_pipeline in (100_000, 200_000):
        times = []
        for rep in range(3):
            t0 = time.perf_counter()
            T = step_distribution(big, n_samples=10_000, n_pipeline=n_pipeline, seed=rep)
            times.append(time.perf_counter() - t0)
        p5, p50, p95 = np.percentile(T, [5, 50, 95]) / 1e9
        print(f"65,536 ranks, 10,000 samples, {n_pipeline:,} pipeline-replica samples: "
              f"{min(times):.2f} s best / {np.median(times):.2f} s median of 3; step p5/p50/p95 {p5:.3f}/{p50:.3f}/{p95:.3f} s")
    for sched, v in (("gpipe", 1), ("interleaved_1f1b", 2)):
        m = pm.at_layout(tp=8, pp=8, dp=1024, microbatches=16, schedule=sched, vpp=v)
        t0 = time.perf_counter()
        T = step_distribution(m, n_samples=10_000, n_pipeline=100_000)
        print(f"  {sched:17s} (vpp={v}): {time.perf_counter() - t0:.2f} s, step p50 {np.median(T) / 1e9:.3f} s")


if __name__ == "__main__":
    main()
