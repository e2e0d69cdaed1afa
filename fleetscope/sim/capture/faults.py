"""Which ranks / GPUs a fault row touches, and what it does to them.

Fault rows look like faults.csv rows (fault_id, kind, scope, subject, start_ns, end_ns, magnitude,
optional job_id, ips, hosts, ranks, mode). A fault touches a job when its subject (or its ips / hosts /
ranks lists) names one of the job's ips, gpus, hosts, racks, or the job itself, and its time span
overlaps the capture. The per-rank effects are returned as plain numpy arrays the execution model uses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# kind -> team that owns the fix (XPUTimer Table 1, PerfTracker section 6)
TEAMS = {
    "slow_gpu": "operations",
    "throttled_racks": "operations",
    "nvlink_down": "operations",
    "slow_stage_worker": "operations",
    "hang": "operations",
    "slow_dataloader": "algorithm",
    "cpu_bound_forward": "algorithm",
    "gc_stall": "algorithm",
    "sync_in_forward": "algorithm",
    "misaligned_gemm": "algorithm",
}
CAPTURE_KINDS = set(TEAMS)
# the fleet simulator's network faults do not change what happens inside one GPU's trace
IGNORED_KINDS = {"congested_switch", "degraded_nic", "none", ""}

# default magnitudes (used when the row has none): slowdown factors or seconds
DEFAULT_MAGNITUDE = {
    "slow_gpu": 1.6,            # compute kernels take 1.6x
    "throttled_racks": 1.5,
    "slow_stage_worker": 1.5,
    "nvlink_down": 1.0,         # PCIe instead of NVLink: the bandwidth ratio does the work
    "slow_dataloader": 0.04,    # seconds per dataloader next()
    "cpu_bound_forward": 0.02,  # seconds of CPU work per forward call
    "gc_stall": 0.25,           # seconds per GC pause
    "sync_in_forward": 1.6e-3,  # seconds of Python work per forward microbatch, after the unnecessary synchronizes
    "misaligned_gemm": 1.0,
    "hang": 1.0,
}


def _as_list(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, float) and np.isnan(v):
        return []
    if isinstance(v, (list, tuple, np.ndarray)):
        return [str(x) for x in v]
    s = str(v).strip()
    if not s:
        return []
    for sep in ("|", ",", ";", " "):
        if sep in s:
            return [x.strip() for x in s.split(sep) if x.strip()]
    return [s]


@dataclass
class RankEffects:
    """Per-rank multipliers / extra seconds (arrays indexed by rank)."""
    world: int
    compute_factor: np.ndarray = field(init=False)
    throttled: np.ndarray = field(init=False)       # hardware throttle visible in NVML
    nvlink_down: np.ndarray = field(init=False)
    dataloader_s: np.ndarray = field(init=False)
    forward_cpu_s: np.ndarray = field(init=False)
    gc_pause_s: float = 0.0
    gc_ranks: np.ndarray = field(init=False)
    sync_in_forward_s: float = 0.0
    misaligned: bool = False
    hang: dict | None = None
    applied: list[tuple[dict, np.ndarray]] = field(default_factory=list)  # (fault, affected rank mask)

    def __post_init__(self):
        n = self.world
        self.compute_factor = np.ones(n)
        self.throttled = np.zeros(n, bool)
        self.nvlink_down = np.zeros(n, bool)
        self.dataloader_s = np.zeros(n)
        self.forward_cpu_s = np.zeros(n)
        self.gc_ranks = np.zeros(n, bool)


def fault_mask(fault: dict, job, racks: list[str] | None = None) -> np.ndarray:
    """Boolean mask over the job's ranks of what the fault's subject / lists name."""
    n = len(job.ips)
    names = set(_as_list(fault.get("subject"))) | set(_as_list(fault.get("ips"))) | set(_as_list(fault.get("hosts")))
    mask = np.zeros(n, bool)
    if fault.get("job_id") == job.job_id and str(fault.get("scope", "job")) == "job":
        mask[:] = True
    if job.job_id in names:
        mask[:] = True
    ips = np.array(job.ips)
    gpus = np.array(job.gpus)
    hosts = np.array(job.hosts)
    rk = np.array(racks) if racks is not None else hosts
    for nm in names:
        mask |= (ips == nm) | (gpus == nm) | (hosts == nm) | (rk == nm)
    for r in _as_list(fault.get("ranks")):
        try:
            i = int(float(r))
        except ValueError:
            continue
        if 0 <= i < n:
            mask[i] = True
    return mask


def resolve(job, faults: list[dict], window: tuple[int, int], rng: np.random.Generator,
            racks: list[str] | None = None) -> RankEffects:
    """Faults overlapping the capture window and touching the job -> per-rank effects."""
    n = len(job.ips)
    eff = RankEffects(n)
    for f in faults:
        kind = str(f.get("kind", "")).strip()
        if kind in IGNORED_KINDS:
            continue
        if kind not in CAPTURE_KINDS:
            raise ValueError(f"unknown fault kind {kind!r} in fault {f.get('fault_id')!r}; known: {sorted(CAPTURE_KINDS)}")
        s, e = f.get("start_ns"), f.get("end_ns")
        if s is not None and e is not None and not (int(s) < window[1] and int(e) > window[0]):
            continue
        mask = fault_mask(f, job, racks)
        if not mask.any():
            continue
        mag = f.get("magnitude")
        mag = DEFAULT_MAGNITUDE[kind] if mag is None or (isinstance(mag, float) and np.isnan(mag)) else float(mag)
        if kind in ("slow_gpu", "throttled_racks", "slow_stage_worker"):
            eff.compute_factor[mask] *= max(mag, 1.0)
            if kind != "slow_stage_worker":
                eff.throttled |= mask
        elif kind == "nvlink_down":
            eff.nvlink_down |= mask
        elif kind == "slow_dataloader":
            eff.dataloader_s[mask] += mag
        elif kind == "cpu_bound_forward":
            eff.forward_cpu_s[mask] += mag
        elif kind == "gc_stall":
            eff.gc_pause_s = max(eff.gc_pause_s, mag)
            if mask.all() and str(f.get("scope", "job")) == "job" and not _as_list(f.get("ranks")):
                # "random workers": a seeded quarter of the job
                pick = rng.choice(n, size=max(1, n // 4), replace=False)
                mask = np.zeros(n, bool)
                mask[pick] = True
            eff.gc_ranks |= mask
        elif kind == "sync_in_forward":
            eff.sync_in_forward_s = max(eff.sync_in_forward_s, mag)
        elif kind == "misaligned_gemm":
            eff.misaligned = True
        elif kind == "hang":
            eff.hang = dict(f)
        eff.applied.append((f, mask))
    return eff
