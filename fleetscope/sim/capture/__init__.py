"""Job-level captures of the ground-truth simulator: PyTorch-profiler traces, lightweight-tracer
timings, NVML hardware samples and hang stack dumps of one simulated training job, with faults that
change the execution (see model.py) and ground-truth rows saying which rank / function / team.

Public API (called by the fleet simulator and by colleagues' validations):
    CaptureJob, render_capture, render_hw, render_hang, scenario_capture, SCENARIOS
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class CaptureJob:
    job_id: str
    tp: int
    pp: int
    dp: int
    n_microbatches: int
    hosts: list[str]          # per rank, rank order
    gpus: list[str]           # per rank
    ips: list[str]            # per rank
    start_ns: int
    n_steps: int
    step_ns: int              # typical step time
    n_layers: int = 8
    seed: int = 0
    dp_mode: str = "allreduce"  # "allreduce" (DDP buckets) or "zero" (distributed optimizer: reduce-scatter + all-gather)


def render_capture(landing_dir: Path, capture_id: str, job: CaptureJob, faults: list[dict], seed: int,
                   traces: bool = True, timings: bool = True, trace_ranks: list[int] | None = None) -> list[dict]:
    """Simulate the job's steps under the faults that touch it and write
    landing/traces/<capture_id>/rank<R>.json.gz (+capture.json) and landing/timings/<capture_id>/rank<R>.parquet.
    Returns ground-truth rows (one per fault and affected rank; schema `sim_capture_truth`)."""
    from fleetscope.sim.capture.render import render_sim, simulate_job, truth_rows

    _check_job(job)
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

    _check_job(job)
    return _r(landing_dir, incident_id, job, fault, seed)


def scenario_capture(out_dir, scenario: str, seed: int = 0, history: int = 0):
    """Render one job with a named scenario (see SCENARIOS; fault places drawn from the seed), plus
    `history` earlier healthy captures of the same job; returns (landing_dir, truth_rows)."""
    from fleetscope.sim.capture.scenarios import scenario_capture as _s

    return _s(out_dir, scenario, seed, history=history)


def _check_job(job: CaptureJob) -> None:
    n = job.tp * job.pp * job.dp
    for name in ("hosts", "gpus", "ips"):
        if len(getattr(job, name)) != n:
            raise ValueError(f"CaptureJob {job.job_id}: {name} has {len(getattr(job, name))} entries, tp*pp*dp = {n}")
    if getattr(job, "dp_mode", "allreduce") not in ("allreduce", "zero"):
        raise ValueError(f"CaptureJob {job.job_id}: dp_mode must be 'allreduce' or 'zero', got {job.dp_mode!r}")
    if min(job.tp, job.pp, job.dp, job.n_microbatches, job.n_steps) < 1 or job.step_ns <= 0:
        raise ValueError(f"CaptureJob {job.job_id}: tp, pp, dp, n_microbatches, n_steps must be >= 1 and step_ns > 0")


SCENARIOS = ["healthy", "slow_gpu", "throttled_racks", "nvlink_down", "slow_dataloader", "cpu_bound_forward", "gc_stall",
             "sync_in_forward", "slow_stage_worker", "misaligned_gemm", "hang"]
