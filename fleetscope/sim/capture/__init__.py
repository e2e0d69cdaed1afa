"""Job-level captures of the ground-truth simulator: PyTorch-profiler traces, lightweight-tracer
timings, NVML hardware samples and hang stack dumps of one simulated training job, with faults that
change the execution (see model.py) and ground-truth rows saying which rank / function / team.

Public API (called by the fleet simulator and by colleagues' validations):
    CaptureJob, render_capture, render_hw, render_hang, scenario_capture, SCENARIOS
"""
from __future__ import annotations

from pathlib import Path

from fleetscope.sim.capture.job import SCENARIOS, CaptureJob, check_job  # noqa: F401  (the public API)


def render_capture(landing_dir: Path, capture_id: str, job: CaptureJob, faults: list[dict], seed: int,
                   traces: bool = True, timings: bool = True, trace_ranks: list[int] | None = None) -> list[dict]:
    """Simulate the job's steps under the faults that touch it and write
    landing/traces/<capture_id>/rank<R>.json.gz (+capture.json) and landing/timings/<capture_id>/rank<R>.parquet.
    Returns ground-truth rows (one per fault and affected rank; schema `sim_capture_truth`)."""
    from fleetscope.sim.capture.render import render_sim, simulate_job, truth_rows

    check_job(job)
    sim = simulate_job(job, faults, seed)
    start, end = render_sim(Path(landing_dir), capture_id, sim, traces, timings, trace_ranks)
    return truth_rows(sim, capture_id, sim.eff, (start, end))


def render_hw(landing_dir: Path, gpus, faults: list[dict], start_ns: int, end_ns: int, seed: int,
              period_ns: int = 1_000_000_000) -> None:
    """NVML-style samples (docs/CONTRACT.md 1.5) for the GPUs (polars frame host, gpu, ip) into landing/hw/."""
    from fleetscope.sim.capture.hw import render_hw as _r

    _r(landing_dir, gpus, faults, start_ns, end_ns, seed, period_ns)


def render_hang(landing_dir: Path, incident_id: str, job: CaptureJob, fault: dict, seed: int) -> list[dict]:
    """Stack dumps (landing/stacks/<incident>/rank<R>.txt, ring.json) and landing/incidents/<incident>.json."""
    from fleetscope.sim.capture.hang import render_hang as _r

    check_job(job)
    return _r(landing_dir, incident_id, job, fault, seed)


def scenario_capture(out_dir, scenario: str, seed: int = 0, history: int = 0):
    """Render one job with a named scenario (see SCENARIOS; fault places drawn from the seed), plus
    `history` earlier healthy captures of the same job; returns (landing_dir, truth_rows)."""
    from fleetscope.sim.capture.scenarios import scenario_capture as _s

    return _s(out_dir, scenario, seed, history=history)
