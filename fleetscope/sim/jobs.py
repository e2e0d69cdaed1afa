"""Multi-tenant job mix, placement and parallel layout of the simulated fleet.

Rank order is Megatron's default (tp fastest, then dp, then pp): rank = t + TP*(d + DP*s). Every
config keeps a stage on whole hosts (TP*DP is a multiple of the GPUs the job uses per host) and
spreads a DP group over >= 2 hosts, so PP and DP traffic cross the network and TP never does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetscope.sim.fabric import GPUS_PER_HOST, Fabric

NS = 1_000_000_000


@dataclass
class JobSpec:
    job_id: str
    tenant: str
    tp: int
    pp: int
    dp: int
    n_microbatches: int
    gpus: np.ndarray            # global GPU index per rank, rank order
    gpus_per_host: int          # GPUs the job uses on each of its hosts
    fwd_ns: np.ndarray          # forward time per microbatch per stage (ns); backward = 2x
    act_bytes: int              # PP activation per microbatch per TP shard
    grad_bytes: int             # gradient buffer per rank (bytes)
    dp_style: str               # ddp | megatron | zero
    buckets: np.ndarray         # bytes per bucket, in reduction order
    channels: int               # NCCL channels = QPs per ring hop
    optimizer_ns: int
    start_ns: int               # start of its first simulated step (may precede the window)
    stop_ns: int | None         # no step starts after this
    first_step: int
    variable_seq: bool = False  # PP activations vary per microbatch (variable sequence lengths)
    equal_buckets: bool = False  # padded buckets of one size: one DP flow size per step
    extra: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank_gpu(self, t, d, s):
        return self.gpus[np.asarray(t) + self.tp * (np.asarray(d) + self.dp * np.asarray(s))]

    def nominal_step_ns(self) -> float:
        f = float(self.fwd_ns.max())
        return (self.n_microbatches + self.pp - 1) * 3 * f + self.optimizer_ns + 0.15 * NS


def dp_rings(job: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """Network hops of every DP ring: (src, dst) GPU arrays of shape (pp, tp, n_hops).

    Rail-aligned ring: inside a host the ring walks the job's local DP members over NVLink, in
    alternating direction per host, so each network hop joins the same local GPU index (one
    rail) of two hosts."""
    T, D, P = job.tp, job.dp, job.pp
    local = job.gpus_per_host // T                      # DP members of one group per host
    n_h = D // local
    t, d, s = np.meshgrid(np.arange(T), np.arange(D), np.arange(P), indexing="ij")
    members = job.rank_gpu(t, d, s).transpose(2, 0, 1)  # (P, T, D)
    m = members.reshape(P, T, n_h, local).copy()
    m[:, :, 1::2, :] = m[:, :, 1::2, ::-1]
    ring = m.reshape(P, T, D)
    nxt = np.roll(ring, -1, axis=2)
    cross = (ring // GPUS_PER_HOST) != (nxt // GPUS_PER_HOST)
    n_hops = int(cross[0, 0].sum())
    src = ring[cross].reshape(P, T, n_hops)
    dst = nxt[cross].reshape(P, T, n_hops)
    return src, dst


def _buckets(style: str, grad_bytes: int, dp: int) -> np.ndarray:
    if style == "ddp":      # PyTorch DDP: a first small bucket, then 25 MB ones, then the remainder
        first, cap = 1 << 20, 25 << 20
    else:                   # Megatron: max(4e7, 1e6*dp) fp32 gradients per bucket
        first, cap = None, int(max(4e7, 1e6 * dp)) * 4
    sizes = []
    left = grad_bytes
    if first:
        sizes.append(first)
        left -= first
    while left > 0:
        sizes.append(min(cap, left))
        left -= cap
    return np.array(sizes, dtype=np.int64)


def _config(n_hosts: int, gph: int, rng: np.random.Generator) -> tuple[int, int, int]:
    """(tp, pp, dp) for a job on n_hosts hosts using gph GPUs each."""
    # TP 8 or 4: with TP 2 on 8-GPU hosts the middle DP members of a host would have no network traffic
    tp = int(rng.choice([8, 4], p=[0.65, 0.35])) if gph == GPUS_PER_HOST else gph // 2
    pps = [p for p in range(1, 9) if n_hosts % p == 0 and n_hosts // p >= 2]
    pp = int(rng.choice(pps[1:] if len(pps) > 1 and n_hosts >= 4 else pps))
    dp = (n_hosts // pp) * gph // tp
    return tp, pp, dp


def make_job(job_id: str, tenant: str, hosts: np.ndarray, gph: int, gpu_offset: int, rng: np.random.Generator,
             window: tuple[int, int], cfg: tuple[int, int, int] | None = None, late: bool = False,
             stop: bool = False, first_step: int | None = None) -> JobSpec:
    tp, pp, dp = cfg or _config(len(hosts), gph, rng)
    gpus = (hosts[:, None] * GPUS_PER_HOST + gpu_offset + np.arange(gph)[None, :]).reshape(-1)
    m = int(rng.choice([4, 8])) if pp == 1 else int(rng.choice([max(8, 2 * pp), max(12, 2 * pp), max(16, 2 * pp)]))
    world = len(hosts) * gph
    # bigger jobs train bigger models: longer per-microbatch compute, steps of several seconds
    f0 = rng.uniform(60e6, 140e6) * (1 + 0.25 * np.log2(max(1.0, world / 64)))
    fwd = f0 * rng.uniform(0.98, 1.02, pp)
    fwd[0] *= 1.03
    fwd[-1] *= 1.08          # the loss head
    small = len(hosts) * gph <= 32
    style = "ddp" if small and rng.random() < 0.7 else str(rng.choice(["megatron", "megatron", "zero"]))
    params = rng.uniform(50e6, 150e6) if style == "ddp" else rng.uniform(150e6, 350e6)
    grad = int(params * (2 if style == "ddp" else 4))
    span = window[1] - window[0]
    j = JobSpec(
        job_id=job_id, tenant=tenant, tp=tp, pp=pp, dp=dp, n_microbatches=m, gpus=gpus, gpus_per_host=gph,
        fwd_ns=fwd.astype(np.float64), act_bytes=int(1 * 4096 * int(rng.choice([4096, 5120, 8192])) * 2 // tp),
        grad_bytes=grad, dp_style=style, buckets=_buckets(style, grad, dp), channels=int(rng.choice([2, 4], p=[0.85, 0.15])),
        optimizer_ns=int(rng.uniform(20e6, 60e6)), start_ns=0, stop_ns=None,
        first_step=int(first_step if first_step is not None else rng.integers(100, 20000)),
    )
    step = j.nominal_step_ns()
    j.start_ns = int(window[0] + rng.uniform(0.1, 0.35) * span) if late else int(window[0] - rng.uniform(0.2, 1.0) * step)
    if late:
        j.first_step = 0
    if stop:
        j.stop_ns = int(window[0] + rng.uniform(0.6, 0.85) * span)
    return j


_SIZES = np.array([2, 3, 4, 4, 6, 8, 8, 12, 16, 16, 24, 32, 48, 64, 96, 128, 256])


def place_jobs(fab: Fabric, n_jobs: int | None, rng: np.random.Generator, window: tuple[int, int],
               hard_cases: bool = False) -> tuple[list[JobSpec], np.ndarray]:
    """A deterministic multi-tenant mix. Returns (jobs, idle host indices)."""
    H = fab.n_hosts
    if n_jobs is not None and n_jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {n_jobs}")
    n_idle = max(1, int(round(0.06 * H))) if H >= 4 else 0
    order = np.arange(H)
    # idle hosts scattered over the fleet
    idle = np.sort(rng.choice(H, size=n_idle, replace=False)) if n_idle else np.array([], dtype=np.int64)
    free = order[~np.isin(order, idle)]
    jobs: list[JobSpec] = []
    pos = 0
    want_pair = H >= 8 and (n_jobs is None or n_jobs >= 3)
    if want_pair and len(free) >= 6:
        hosts = free[:4]
        # one tenant, two small jobs on the same four hosts (GPUs 0-3 and 4-7)
        jobs.append(make_job("job-000", "tenant-a", hosts, 4, 0, rng, window, cfg=(2, 2, 4)))
        jobs.append(make_job("job-001", "tenant-a", hosts, 4, 4, rng, window, cfg=(4, 2, 2)))
        pos = 4
    rest = len(free) - pos
    if n_jobs is None:
        sizes = []
        left = rest
        cap = max(2, rest // 4) if rest >= 16 else rest
        while left >= 2:
            cand = _SIZES[(_SIZES <= min(left, cap))]
            s = int(rng.choice(cand))
            if left - s == 1:
                s += 1
            sizes.append(s)
            left -= s
    else:
        k = n_jobs - len(jobs)
        if k <= 0:
            sizes = []
        else:
            if rest < 2 * k:
                raise ValueError(f"{n_jobs} jobs do not fit on {H} hosts (each job needs >= 2 hosts)")
            w = rng.dirichlet(np.ones(k) * 2.0)
            sizes = np.maximum(2, np.floor(w * rest)).astype(int)
            while sizes.sum() > rest:
                sizes[np.argmax(sizes)] -= 1
            sizes = list(sizes)
    n_tenants = max(2, len(sizes) // 2)
    n0 = len(jobs)
    late_i = 1 if len(sizes) >= 3 else -1
    stop_i = 2 if len(sizes) >= 3 else -1
    for i, s in enumerate(sizes):
        hosts = free[pos:pos + s]
        pos += s
        tenant = f"tenant-{chr(ord('b') + int(rng.integers(0, n_tenants)) % 25)}"
        jobs.append(make_job(f"job-{n0 + i:03d}", tenant, hosts, GPUS_PER_HOST, 0, rng, window,
                             late=(i == late_i), stop=(i == stop_i)))
    unused = free[pos:]
    if hard_cases and jobs:
        _make_hard(jobs)
    return jobs, np.sort(np.concatenate([idle, unused])).astype(np.int64)


def _make_hard(jobs: list[JobSpec]) -> None:
    """The cases where LLMPrism's "distinct flow sizes per step" rule fails (DESIGN.md): a pipelined
    job with variable sequence lengths (its PP pairs see many sizes) and a job whose gradient
    buffer is padded into equal buckets (its DP pairs see one size per step)."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].tenant == "tenant-a", i))   # tenant pair last
    var = next((i for i in order if jobs[i].pp > 1), None)
    if var is not None:
        jobs[var].variable_seq = True
    eq = next((i for i in order if i != var), None)
    if eq is not None:
        j = jobs[eq]
        cap = int(max(4e7, 1e6 * j.dp)) * 4 if j.dp_style != "ddp" else 25 << 20
        k = max(2, int(round(j.grad_bytes / cap)))
        j.grad_bytes, j.buckets, j.equal_buckets = k * cap, np.full(k, cap, dtype=np.int64), True
