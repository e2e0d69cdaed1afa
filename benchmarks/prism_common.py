"""Inputs shared by the PRISM benchmarks: the real StragglerAnalysis capture and simulated jobs
rendered with fleetscope.sim.capture (more steps than the scenario default)."""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import polars as pl

from fleetscope.ingest.timings import read_timings

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "real" / "straggler_analysis"


def real_timings() -> pl.DataFrame:
    return read_timings(REAL)


def simulated(scenario: str, seed: int = 1, n_steps: int = 40, out: Path | None = None):
    """(timings, ground truth rows) of one simulated job."""
    from fleetscope.sim.capture import render_capture
    from fleetscope.sim.capture.scenarios import scenario_job_and_faults

    out = out or Path(tempfile.mkdtemp(prefix=f"prism-{scenario}-"))
    job, faults = scenario_job_and_faults(scenario, seed)
    job = dataclasses.replace(job, n_steps=n_steps)
    cap = f"sim-{scenario}-s{seed}"
    truth = render_capture(out, cap, job, faults, seed, traces=False, timings=True)
    return read_timings(out / "timings" / cap), truth
