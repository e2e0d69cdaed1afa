"""The simulated job (its parallel layout, hosts, GPUs and addresses, step time) and the named
capture scenarios: what the renderers and the scenario builder share."""
from __future__ import annotations

from dataclasses import dataclass


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



def check_job(job: CaptureJob) -> None:
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
