"""Named single-job scenarios for colleagues' validations: one landing folder with traces, timings,
hw samples (and stacks for a hang) plus the ground truth of what is wrong.

Where a fault sits (which GPU is slow, which host throttled, which ranks lost NVLink, which rank or
link hangs) is drawn from the seed: seeds are different cases, not the same ranks again. With
`history=N` the landing folder also holds N earlier healthy captures of the same job (other seeds,
earlier times): the job's history an analysis may learn its expectations from."""
from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path

import numpy as np
import polars as pl

from fleetscope.sim.capture.job import SCENARIOS, CaptureJob
from fleetscope.sim.capture.hang import render_hang
from fleetscope.sim.capture.hw import render_hw
from fleetscope.sim.capture.render import activity_frame, render_sim, simulate_job, truth_rows
from fleetscope.sim.capture.schemas import TRUTH
from fleetscope.schemas.base import conform

T0 = 1_763_712_000_000_000_000  # 2025-11-21T08:00Z
HW_PERIOD_NS = 10_000_000


def make_job(job_id: str, n_hosts: int, tp: int, pp: int, dp: int, start_ns: int, n_microbatches: int = 8,
             n_steps: int = 3, step_ns: int = 1_000_000_000, n_layers: int = 8, seed: int = 0) -> CaptureJob:
    n = tp * pp * dp
    if n != n_hosts * 8:
        raise ValueError(f"{n_hosts} hosts x 8 GPUs != tp*pp*dp = {n}")
    hosts = [f"h{r // 8:03d}" for r in range(n)]
    return CaptureJob(job_id=job_id, tp=tp, pp=pp, dp=dp, n_microbatches=n_microbatches, hosts=hosts,
                      gpus=[f"{h}/gpu{r % 8}" for r, h in enumerate(hosts)], ips=[f"10.0.{r // 8}.{r % 8 + 1}" for r in range(n)],
                      start_ns=start_ns, n_steps=n_steps, step_ns=step_ns, n_layers=n_layers, seed=seed)


def _fault(fid, kind, scope, subject, job, magnitude=None, **extra) -> dict:
    return {"fault_id": fid, "kind": kind, "scope": scope, "subject": subject, "start_ns": job.start_ns,
            "end_ns": job.start_ns + 3600 * 10**9, "magnitude": magnitude, "job_id": job.job_id, **extra}


EXTRA_SCENARIOS = ["hang_link", "healthy_zero"]


def scenario_job_and_faults(scenario: str, seed: int = 0) -> tuple[CaptureJob, list[dict]]:
    if scenario not in SCENARIOS + EXTRA_SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {SCENARIOS + EXTRA_SCENARIOS}")
    jid = f"job-{scenario.replace('_', '-')}"
    # a day per scenario (and an hour per seed): scenarios rendered into one landing folder do not
    # overlap in time, so their GPUs' hw samples (same host names) never mix
    start = T0 + (SCENARIOS + EXTRA_SCENARIOS).index(scenario) * 86_400_000_000_000 + seed * 3_600_000_000_000
    if scenario == "throttled_racks":
        job = make_job(jid, 4, tp=4, pp=2, dp=4, start_ns=start, seed=seed)
    elif scenario == "slow_stage_worker":
        # 4 stages of 8 workers each (tp2 x dp4): enough same-stage peers to tell one worker apart
        job = make_job(jid, 4, tp=2, pp=4, dp=4, start_ns=start, seed=seed)
    else:
        job = make_job(jid, 2, tp=2, pp=2, dp=4, start_ns=start, n_steps=2 if scenario.startswith("hang") else 3, seed=seed)
    if scenario == "healthy_zero":
        job.dp_mode = "zero"
    # fault places drawn from the seed (and the scenario's name, so scenarios differ too)
    rng = np.random.default_rng([seed, zlib.crc32(scenario.encode())])
    n = len(job.ips)
    f: list[dict] = []
    if scenario == "slow_gpu":
        f = [_fault("f-slow-gpu", "slow_gpu", "gpu", job.ips[int(rng.integers(n))], job, 1.6)]
    elif scenario == "throttled_racks":
        f = [_fault("f-throttle-rack", "throttled_racks", "host", str(rng.choice(sorted(set(job.hosts)))), job, 1.5)]
    elif scenario == "nvlink_down":
        f = [_fault(f"f-nvlink-{i}", "nvlink_down", "gpu", job.ips[int(r)], job) for i, r in enumerate(np.sort(rng.choice(n, 3, replace=False)))]
    elif scenario in ("slow_dataloader", "cpu_bound_forward", "gc_stall", "sync_in_forward", "misaligned_gemm"):
        f = [_fault(f"f-{scenario}", scenario, "job", job.job_id, job)]
    elif scenario == "slow_stage_worker":
        f = [_fault("f-slow-worker", "slow_stage_worker", "gpu", job.ips[int(rng.integers(n))], job, 1.5)]  # one worker of its stage
    return job, f


def scenario_capture(out_dir, scenario: str, seed: int = 0, history: int = 0) -> tuple[Path, list[dict]]:
    """Render the scenario's capture (and, with history=N, N earlier healthy captures of the same job)
    into out_dir/landing; the truth goes to out_dir/ground_truth (capture_faults.csv, capture_job.json).
    Returns (landing, truth rows of the scenario's capture)."""
    out_dir = Path(out_dir)
    landing = out_dir / "landing"
    job, faults = scenario_job_and_faults(scenario, seed)
    capture_id = f"{job.job_id}-s{seed}"
    for i in range(history):
        # the same job, healthy, an hour per capture earlier, its own noise
        past = dataclasses.replace(job, start_ns=job.start_ns - (history - i) * 3_600_000_000_000)
        _render(landing, f"{job.job_id}-h{i}-s{seed}", past, [], seed * 1000 + 100 + i)  # (sorts before the capture)
    sim, start, end = _render(landing, capture_id, job, faults, seed)
    truth = truth_rows(sim, capture_id, sim.eff, (start, end))
    if scenario.startswith("hang"):
        mode = "link" if scenario == "hang_link" else "rank"
        # the hung rank, or the two ends of the faulty link, drawn from the seed
        a, b = (int(r) for r in np.random.default_rng([seed, zlib.crc32(scenario.encode()), 1]).choice(len(job.ips), 2, replace=False))
        subject = f"{job.ips[a]}-{job.ips[b]}" if mode == "link" else job.ips[a]
        hf = {"fault_id": "f-hang", "kind": "hang", "scope": "link" if mode == "link" else "gpu", "subject": subject,
              "start_ns": end, "end_ns": end + 600_000_000_000, "magnitude": None, "job_id": job.job_id, "mode": mode}
        truth += render_hang(landing, f"incident-{job.job_id}-s{seed}", job, hf, seed)
    gt = out_dir / "ground_truth"
    gt.mkdir(parents=True, exist_ok=True)
    if truth:
        conform(pl.DataFrame(truth, infer_schema_length=None), TRUTH).write_csv(gt / "capture_faults.csv")
    else:
        (gt / "capture_faults.csv").write_text(",".join(TRUTH.columns) + "\n")
    (gt / "capture_job.json").write_text(json.dumps({"capture_id": capture_id, "scenario": scenario, "job_id": job.job_id,
                                                     "tp": job.tp, "pp": job.pp, "dp": job.dp, "ips": job.ips, "hosts": job.hosts,
                                                     "gpus": job.gpus, "start_ns": start, "end_ns": end,
                                                     "history": [f"{job.job_id}-h{i}-s{seed}" for i in range(history)]}, indent=1))
    return landing, truth


def _render(landing: Path, capture_id: str, job: CaptureJob, faults: list[dict], seed: int):
    sim = simulate_job(job, faults, seed)
    start, end = render_sim(landing, capture_id, sim, traces=True, timings=True, trace_ranks=None)
    gpus = pl.DataFrame({"host": job.hosts, "gpu": job.gpus, "ip": job.ips})
    render_hw(landing, gpus, faults, start - start % HW_PERIOD_NS, end, seed, HW_PERIOD_NS, activity=activity_frame(sim),
              name=f"hw-{capture_id}.parquet")
    return sim, start, end
