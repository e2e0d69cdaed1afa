"""Rendering speed and output size of fleetscope.sim.capture.

    .venv/bin/python -m benchmarks.sim_capture_speed

Prints, per job size: seconds to simulate + render (traces of 2 ranks, timings of every rank),
timings rows, bytes written, peak RSS; then render_hw over a fleet (GPUs x 1-s samples for a minute)."""
from __future__ import annotations

import resource
import shutil
import tempfile
import time
from pathlib import Path

import polars as pl

from fleetscope.sim.capture import render_capture, render_hw
from fleetscope.sim.capture.scenarios import T0, make_job


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="simcap_speed_"))
    print(f"{'job':28} {'ranks':>5} {'secs':>6} {'timing rows':>11} {'MB':>6} {'peak RSS MB':>11}")
    for tp, pp, dp in ((2, 2, 4), (8, 2, 4), (8, 4, 16)):
        n = tp * pp * dp
        job = make_job(f"j{n}", n // 8, tp=tp, pp=pp, dp=dp, start_ns=T0, n_microbatches=8, n_steps=3)
        out = tmp / job.job_id
        t = time.perf_counter()
        render_capture(out, "cap", job, [], 0, trace_ranks=[0, n - 1])
        secs = time.perf_counter() - t
        rows = pl.scan_parquet(str(out / "timings" / "cap" / "*.parquet")).select(pl.len()).collect().item()
        mb = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 1e6
        print(f"tp{tp} pp{pp} dp{dp} {'(3 steps, 8 mb)':14} {n:5d} {secs:6.1f} {rows:11,d} {mb:6.1f} {rss_mb():11.0f}")
    for n_gpus in (2048, 16384):
        gpus = pl.DataFrame({"host": [f"h{i // 8:05d}" for i in range(n_gpus)], "gpu": [f"h{i // 8:05d}/gpu{i % 8}" for i in range(n_gpus)],
                             "ip": [f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(n_gpus)]})
        faults = [{"fault_id": "f1", "kind": "throttled_racks", "scope": "host", "subject": "h00003", "start_ns": T0,
                   "end_ns": T0 + 60 * 10**9, "magnitude": 1.5}]
        t = time.perf_counter()
        render_hw(tmp / "hw", gpus, faults, T0, T0 + 60 * 10**9, 0, 1_000_000_000)
        secs = time.perf_counter() - t
        print(f"render_hw {n_gpus:6d} GPUs x 60 samples: {secs:5.2f} s, {n_gpus * 60:,d} rows, peak RSS {rss_mb():.0f} MB")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
