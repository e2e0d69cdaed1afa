"""Shared inputs of the PRISM tests: the real StragglerAnalysis trace and simulated captures
(fleetscope.sim.capture, rendered once per session with their ground truth)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl
import pytest

from fleetscope.ingest.timings import read_timings

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real" / "straggler_analysis"


def simulated_capture(out: Path, scenario: str, seed: int = 1, n_steps: int = 12):
    """(timings, hw, truth rows, capture_id) of one simulated job with more steps than the
    scenario default, so that step-time distributions can be compared."""
    from fleetscope.sim.capture import render_capture, render_hw
    from fleetscope.sim.capture.scenarios import scenario_job_and_faults

    job, faults = scenario_job_and_faults(scenario, seed)
    job = dataclasses.replace(job, n_steps=n_steps)
    cap = f"cap-{scenario}-s{seed}"
    truth = render_capture(out, cap, job, faults, seed, traces=False, timings=True)
    t = read_timings(out / "timings" / cap)
    gpus = pl.DataFrame({"host": job.hosts, "gpu": job.gpus, "ip": job.ips})
    render_hw(out, gpus, faults, int(t["start_ns"].min()) - 10_000_000, int(t["end_ns"].max()) + 10_000_000, seed, 10_000_000)
    hw = pl.concat([pl.read_parquet(p) for p in sorted((out / "hw").glob("*.parquet"))])
    return t, hw, truth, cap


@pytest.fixture(scope="session")
def real_timings() -> pl.DataFrame:
    return read_timings(REAL)


@pytest.fixture(scope="session")
def sim_healthy(tmp_path_factory):
    return simulated_capture(tmp_path_factory.mktemp("healthy"), "healthy")


@pytest.fixture(scope="session")
def sim_slow_gpu(tmp_path_factory):
    return simulated_capture(tmp_path_factory.mktemp("slow_gpu"), "slow_gpu")


@pytest.fixture(scope="session")
def sim_healthy_pp4(tmp_path_factory):
    """A healthy 4-stage pipeline (TP2 x PP4 x DP2): its ranks start their steps at different
    times (stage 0 still runs the previous optimizer), which must not look like stragglers."""
    from fleetscope.sim.capture import render_capture
    from fleetscope.sim.capture.scenarios import T0, make_job

    out = tmp_path_factory.mktemp("healthy_pp4")
    job = make_job("job-healthy-pp4", 2, tp=2, pp=4, dp=2, start_ns=T0, n_steps=12, seed=2)
    render_capture(out, "cap-healthy-pp4", job, [], 2, traces=False, timings=True)
    return read_timings(out / "timings" / "cap-healthy-pp4")


@pytest.fixture(scope="session")
def derived():
    """Cases derived from the real trace (fleetscope.sim.derived), built once per session and
    keyed by (kind, seed, dp, balanced, n_steps): (timings, truth). The analysis gets only the
    timings; the truth is for the assertions."""
    from fleetscope.sim.derived import derive_case

    src = read_timings(REAL)
    cache = {}

    def get(kind: str, seed: int, dp: int = 4, balance: bool = True, n_steps: int = 40):
        key = (kind, seed, dp, balance, n_steps)
        if key not in cache:
            c = derive_case(src, kind, seed=seed, dp=dp, balance=balance, n_steps=n_steps)
            cache[key] = (c.timings, c.truth)
        return cache[key]

    return get
