"""Multi-tenant job mix, placement, parallel layout and per-job communication conventions.

Rank order is Megatron's default (tp fastest, then dp, then pp): rank = t + TP*(d + DP*s). A
stage holds whole hosts (TP*DP is a multiple of the GPUs the job uses per host) and a DP group
spans >= 2 hosts, so PP and DP traffic cross the network and TP never does.

How DP traffic reaches the wire follows NCCL: each DP group's collective runs over C channels, each
its own ring (or double binary tree) over the group's hosts; a channel leaves a host through the NIC
of one of the group's local members (rail-aligned, or entering the next host on another rail when
cross-rail rings are allowed), and each channel's connection is split over Q queue pairs
(NCCL_IB_QPS_PER_CONNECTION), each its own 5-tuple. When a DP group's channels use fewer NICs
than the group has local members (NCCL_IB_HCA or a low channel count), the other NICs carry no DP
traffic: with PP = 1 they are silent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetscope.sim.fabric import GPUS_PER_HOST, NIC_BW, Fabric

NS = 1_000_000_000
BWD_RATIO = 2.0
MAX_BUCKETS = 40
AUTO_TREE_BYTES = 16 << 20


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
    gpu_offset: int             # first GPU index the job uses on each host
    fwd_ns: np.ndarray          # forward time per microbatch per stage (ns); backward = BWD_RATIO x
    act_bytes: int              # PP activation per microbatch per TP shard
    grad_bytes: int             # gradient buffer per rank (bytes)
    dp_style: str               # ddp | megatron | zero | fsdp
    buckets: np.ndarray         # bytes per bucket (fsdp: per unit), in reduction order
    channels: int               # NCCL channels per DP group (each a ring / tree)
    optimizer_ns: int
    start_ns: int               # compute start of its first simulated step (may precede the window)
    first_step: int
    overlap: bool = True        # buckets reduced while the backward runs
    algo: str = "ring"          # ring | tree | auto (trees below AUTO_TREE_BYTES per call, rings above)
    qps: int = 1                # queue pairs per connection
    nic_slots: tuple = (0,)     # local member indices whose NICs carry the DP channels
    cross_rail: bool = False
    bidir: bool = False
    p2p_channels: int = 1
    variable_seq: bool = False  # PP activations vary per microbatch (variable sequence lengths)
    equal_buckets: bool = False  # padded buckets of one size: one DP flow size per step
    target_step_ns: int = 0
    # life inside the window
    launch_ns: int | None = None       # launched inside the window (rendezvous, checkpoint load, slow first step)
    ckpt_load_ns: int = 0
    first_step_factor: float = 1.0
    stop_ns: int | None = None         # finishes: no step starts after this (index fixed from the nominal step)
    crash_ns: int | None = None        # crashes: nothing after this, the step in flight never completes
    checkpoints: dict = field(default_factory=dict)   # step index -> pause after it (ns)
    stalls: dict = field(default_factory=dict)        # step index -> dataloader stall before it (ns)
    nic_overload: bool = False         # fault: every channel of a host through one NIC
    transport: str = "rdma"            # rdma (RoCEv2) | tcp (NCCL socket transport: TCP connections, no QPs)
    extra: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def local(self) -> int:
        """DP members of one group per host."""
        return self.gpus_per_host // self.tp

    @property
    def hosts(self) -> np.ndarray:
        return np.unique(self.gpus // GPUS_PER_HOST)

    def rank_gpu(self, t, d, s):
        return self.gpus[np.asarray(t) + self.tp * (np.asarray(d) + self.dp * np.asarray(s))]

    def nominal_step_ns(self) -> float:
        f = float(self.fwd_ns.max())
        return (self.n_microbatches + self.pp - 1) * (1 + BWD_RATIO) * f + self.optimizer_ns + 5e6

    def nic_of(self, gpu: np.ndarray) -> np.ndarray:
        """The NIC a GPU's inter-host traffic leaves through (its own, or with the NIC-overload fault
        the first NIC the job has on that host)."""
        gpu = np.asarray(gpu)
        if not self.nic_overload:
            return gpu
        return (gpu // GPUS_PER_HOST) * GPUS_PER_HOST + self.gpu_offset


def dp_plan(job: JobSpec, s: int, algo: str | None = None) -> dict:
    """Inter-host hops of stage s's DP collectives: src/dst NICs of shape (T, C, H) (H hops per
    channel), the DP replica of each hop's sending GPU (src_d, (C, H): its first bytes leave when that
    replica is ready), the hop's phase (tree: 0 up, 1 down) and the member GPUs per (T, n_hosts, local).
    algo: ring or tree (default: the job's; `auto` jobs use both, by collective size)."""
    algo = algo or ("ring" if job.algo == "auto" else job.algo)
    T, D, L, C = job.tp, job.dp, job.local, job.channels
    n_h = D // L
    t, d = np.meshgrid(np.arange(T), np.arange(D), indexing="ij")
    members = job.rank_gpu(t, d, s).reshape(T, n_h, L)            # (T, host in ring order, local member)
    slots = np.asarray(job.nic_slots)
    c = np.arange(C)
    e_out = slots[c % len(slots)]
    e_in = slots[(c + 1) % len(slots)] if (job.cross_rail and len(slots) > 1) else e_out
    if algo == "tree" and n_h >= 3:
        i = np.arange(1, n_h)
        par = (i - 1) // 2
        # tree A on the host order, tree B on the mirrored order (NCCL's double binary tree)
        child = np.stack([i, n_h - 1 - i])                         # (2, E)
        parent = np.stack([par, n_h - 1 - par])
        tr = c % 2
        ch_child, ch_par = child[tr], parent[tr]                   # (C, E)
        up_src = members[:, ch_child, e_out[:, None]]              # (T, C, E)
        up_dst = members[:, ch_par, e_in[:, None]]
        src = np.concatenate([up_src, up_dst], axis=2)
        dst = np.concatenate([up_dst, up_src], axis=2)
        src_d = np.concatenate([ch_child * L + e_out[:, None], ch_par * L + e_in[:, None]], axis=1)
        E = n_h - 1
        phase = np.concatenate([np.zeros(E, np.int8), np.ones(E, np.int8)])
    else:
        h = np.arange(n_h)
        nxt = np.where((c % 2 == 1)[:, None] & job.bidir, (h - 1) % n_h, (h + 1) % n_h)   # (C, n_h)
        src = members[:, np.broadcast_to(h, (C, n_h)), e_out[:, None]]                 # (T, C, n_h)
        dst = members[:, nxt, e_in[:, None]]
        src_d = np.broadcast_to(h, (C, n_h)) * L + e_out[:, None]
        phase = np.zeros(n_h, np.int8)
    return {"src": job.nic_of(src), "dst": job.nic_of(dst), "src_d": src_d, "phase": phase, "members": members}


def pp_pairs(job: JobSpec) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) NICs of the forward activation hop s -> s+1, shape (D, P-1, T)."""
    T, D, P = job.tp, job.dp, job.pp
    t, d, s = np.meshgrid(np.arange(T), np.arange(D), np.arange(P), indexing="ij")
    slot = job.rank_gpu(t, d, s).transpose(1, 2, 0)                    # (D, P, T)
    return job.nic_of(slot[:, :-1, :]), job.nic_of(slot[:, 1:, :])


def _buckets(style: str, grad_bytes: int, dp: int, cap_mb: int = 25, single: bool = False) -> np.ndarray:
    """Bucket sizes in reduction order. Big models raise the cap (users set bucket_cap_mb so a step
    has at most MAX_BUCKETS of them)."""
    if single:
        return np.array([grad_bytes], dtype=np.int64)
    if style == "ddp":      # PyTorch DDP: a first 1 MiB bucket, then bucket_cap_mb ones, then the remainder
        first, cap = 1 << 20, max(int(cap_mb) << 20, grad_bytes // MAX_BUCKETS)
    else:                   # Megatron: max(4e7, 1e6*dp) fp32 gradients per bucket
        first, cap = None, max(int(max(4e7, 1e6 * dp)) * 4, grad_bytes // MAX_BUCKETS)
    sizes = []
    left = grad_bytes
    if first:
        sizes.append(first)
        left -= first
    while left > 0:
        sizes.append(min(cap, left))
        left -= cap
    return np.array(sizes, dtype=np.int64)


def _config(n_hosts: int, gph: int, rng: np.random.Generator, tp_w: dict) -> tuple[int, int, int]:
    """(tp, pp, dp) for a job on n_hosts hosts using gph GPUs each."""
    tps = [int(k) for k in tp_w if gph % int(k) == 0 and int(k) <= gph]
    w = np.array([tp_w[str(k)] for k in tps], float)
    tp = int(rng.choice(tps, p=w / w.sum()))
    pps = [p for p in range(1, 17) if n_hosts % p == 0 and n_hosts // p >= 2]
    if len(pps) > 1 and n_hosts >= 4:
        wp = np.array([0.35 if p == 1 else 1.0 for p in pps])
        pp = int(rng.choice(pps, p=wp / wp.sum()))
    else:
        pp = int(rng.choice(pps))
    dp = (n_hosts // pp) * gph // tp
    return tp, pp, dp


def make_job(job_id: str, tenant: str, hosts: np.ndarray, gph: int, gpu_offset: int, rng: np.random.Generator,
             window: tuple[int, int], jc: dict | None = None, cfg: tuple[int, int, int] | None = None) -> JobSpec:
    """One job with its layout and communication conventions drawn from `jc` (conventions' jobs section)."""
    if jc is None:
        from fleetscope.sim.conventions import draw_conventions
        jc = draw_conventions(0, 64)["jobs"]
    tp, pp, dp = cfg or _config(len(hosts), gph, rng, jc["tp_weights"])
    gpus = (np.asarray(hosts)[:, None] * GPUS_PER_HOST + gpu_offset + np.arange(gph)[None, :]).reshape(-1)
    world = len(hosts) * gph
    L = gph // tp
    # step time: 0.3 s to 10 s, bigger jobs train bigger models
    lo, hi = (0.3, 3.0) if world <= 32 else ((0.8, 6.0) if world < 256 else (2.0, 10.0))
    target = float(np.exp(rng.uniform(np.log(lo), np.log(hi)))) * NS
    m = int(rng.choice([1, 2, 4, 8])) if pp == 1 else int(rng.choice([max(4, 2 * pp), max(8, 2 * pp), max(16, 2 * pp)]))
    opt = float(rng.uniform(0.01, 0.04)) * target
    f0 = max(2e6, (0.85 * target - opt) / ((m + pp - 1) * (1 + BWD_RATIO)))
    fwd = f0 * rng.uniform(0.98, 1.02, pp)
    fwd[0] *= 1.03
    fwd[-1] *= 1.08          # the loss head
    # DP style: DDP for small jobs, Megatron (optionally with its distributed optimizer), FSDP without PP
    u = rng.random()
    if pp == 1 and u < jc["fsdp_share"]:
        style = "fsdp"
    elif world <= 64 and rng.random() < 0.6:
        style = "ddp"
    else:
        style = "zero" if rng.random() < jc["zero_share"] else "megatron"
    n_h = dp // L
    # NICs the DP channels use: every local member's, or only some of them (NCCL_IB_HCA / few channels)
    if L > 1 and rng.random() < jc["restricted_nic_share"]:
        n_used = int(rng.integers(1, L))
    else:
        n_used = L
    slots = tuple(sorted(rng.choice(L, size=n_used, replace=False).tolist())) if n_used < L else tuple(range(L))
    cpn = int(rng.choice(jc["channels_per_nic"]))
    channels = cpn * n_used
    # gradient volume: the DP collectives take 1-30 % of the step at full bandwidth (pure-DP and FSDP
    # jobs of big models near the top, TP/PP-heavy jobs near the bottom)
    comm_frac = float(np.exp(rng.uniform(np.log(0.01), np.log(0.3))))
    per_step = 2.0 if style != "fsdp" else (2 * m + 1) * 0.5
    grad = int(np.clip(comm_frac * target / NS * NIC_BW * n_used / per_step, 40e6, 12e9))
    single = style == "megatron" and rng.random() < jc["megatron_single_bucket_share"]
    cap_mb = int(rng.choice(jc["ddp_bucket_mb"]))
    if style == "fsdp":
        units = int(rng.choice([4, 8, 16]))
        buckets = np.full(units, max(1, grad // units), dtype=np.int64)
    else:
        buckets = _buckets(style, grad, dp, cap_mb, single)
    equal = False
    if style in ("megatron", "zero") and not single and rng.random() < jc["padded_bucket_share"]:
        cap = max(int(max(4e7, 1e6 * dp)) * 4, grad // MAX_BUCKETS)
        k = max(2, int(round(grad / cap)))
        grad, buckets, equal = k * cap, np.full(k, cap, dtype=np.int64), True
    # NCCL's algorithm: rings; double binary trees (NCCL_ALGO=Tree); or its own choice per call
    # (trees for small all-reduces, rings for big ones)
    algo = "ring"
    if n_h >= 4 and style in ("ddp", "megatron") and rng.random() < jc["tree_share"]:
        algo = str(rng.choice(["tree", "auto"]))
    seq = int(rng.choice([2048, 4096, 8192]))
    hidden = int(rng.choice([2048, 4096, 5120, 8192]))
    mbs = int(rng.choice([1, 1, 2]))
    j = JobSpec(
        job_id=job_id, tenant=tenant, tp=tp, pp=pp, dp=dp, n_microbatches=m, gpus=gpus, gpus_per_host=gph,
        gpu_offset=gpu_offset, fwd_ns=fwd.astype(np.float64), act_bytes=int(mbs * seq * hidden * 2 // tp),
        grad_bytes=int(buckets.sum()), dp_style=style, buckets=buckets, channels=channels,
        optimizer_ns=int(opt), start_ns=0, first_step=int(rng.integers(100, 20000)),
        overlap=not single, algo=algo, qps=int(rng.choice(jc["qps_per_connection"])), nic_slots=slots,
        cross_rail=bool(len(slots) > 1 and rng.random() < jc["cross_rail_share"]),
        bidir=bool(rng.random() < jc["bidir_share"]), p2p_channels=int(rng.choice(jc["p2p_channels"])),
        variable_seq=bool(pp > 1 and rng.random() < jc["variable_seq_share"]), equal_buckets=equal,
        target_step_ns=int(target), transport="tcp" if rng.random() < jc.get("tcp_share", 0.0) else "rdma",
    )
    j.start_ns = int(window[0] - rng.uniform(0.2, 1.0) * j.nominal_step_ns())
    return j


_SIZES = np.array([2, 3, 4, 4, 6, 8, 8, 12, 16, 16, 24, 32, 48, 64, 96, 128, 256])


def place_jobs(fab: Fabric, n_jobs: int | None, rng: np.random.Generator, window: tuple[int, int],
               conv: dict | None = None, hard_cases: bool = False) -> tuple[list[JobSpec], np.ndarray]:
    """A multi-tenant mix drawn per seed. Returns (jobs, idle host indices)."""
    if conv is None:
        from fleetscope.sim.conventions import draw_conventions
        conv = draw_conventions(0, fab.n_gpus)
    jc, lc = conv["jobs"], conv["life"]
    H = fab.n_hosts
    if n_jobs is not None and n_jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {n_jobs}")
    n_idle = max(1, int(round(rng.uniform(0.03, 0.08) * H))) if H >= 4 else 0
    idle = np.sort(rng.choice(H, size=n_idle, replace=False)) if n_idle else np.array([], dtype=np.int64)
    free = np.setdiff1d(np.arange(H), idle)
    if jc.get("placement", "contiguous") == "fragmented" and free.size > 8:
        # a scheduler that fills holes: blocks of 1-4 hosts in shuffled order
        blocks = np.split(free, np.cumsum(rng.integers(1, 5, free.size))[:-1])
        blocks = [b for b in blocks if b.size]
        order = rng.permutation(len(blocks))
        free = np.concatenate([blocks[i] for i in order])
    jobs: list[JobSpec] = []
    specs: list[tuple] = []    # (hosts, gph, offset, tenant, cfg)
    pos = 0
    want_pair = lc["shared_host_pair"] and H >= 8 and (n_jobs is None or n_jobs >= 3)
    if want_pair and len(free) >= 6:
        k = int(rng.choice([2, 4]))
        start = int(rng.integers(0, max(1, len(free) - k - 2)))
        hosts = free[start:start + k]
        free = np.concatenate([free[:start], free[start + k:]])
        tenant = "tenant-a"
        # one tenant, two jobs on the same hosts, split by GPU (0-3 and 4-7)
        specs.append((hosts, 4, 0, tenant, None))
        specs.append((hosts, 4, 4, tenant, None))
    rest = len(free)
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
        # leave a few hosts unused (drained, reserved)
        if len(sizes) > 3 and rng.random() < 0.5:
            sizes.pop(int(rng.integers(0, len(sizes))))
    else:
        k = n_jobs - len(specs)
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
    for s in sizes:
        hosts = np.sort(free[pos:pos + s])
        pos += s
        tenant = f"tenant-{chr(ord('b') + int(rng.integers(0, n_tenants)) % 25)}"
        specs.append((hosts, GPUS_PER_HOST, 0, tenant, None))
    # jobs in host order, named in that order (the names never reach the landing folder)
    specs.sort(key=lambda x: (int(x[0].min()), x[2]))
    for i, (hosts, gph, off, tenant, cfg) in enumerate(specs):
        jobs.append(make_job(f"job-{i:03d}", tenant, hosts, gph, off, rng, window, jc, cfg))
    used = np.concatenate([j.hosts for j in jobs]) if jobs else np.array([], dtype=np.int64)
    unused = np.setdiff1d(np.arange(H), used)
    draw_life(jobs, rng, window, lc)
    if hard_cases and jobs:
        _make_hard(jobs)
    return jobs, np.sort(unused).astype(np.int64)


def draw_life(jobs: list[JobSpec], rng: np.random.Generator, window: tuple[int, int], lc: dict) -> None:
    """Benign events inside the window: launches (after a checkpoint load, with a slow first step),
    finishes, crashes, checkpoint save pauses and dataloader stalls, on randomly chosen jobs."""
    if not jobs:
        return
    W0, W1 = window
    span = W1 - W0
    order = [int(i) for i in rng.permutation(len(jobs))]
    used: set[int] = set()

    def take(n):
        out = [i for i in order if i not in used][:n]
        used.update(out)
        return out

    for i in take(int(lc["n_launch"])):
        j = jobs[i]
        j.launch_ns = int(W0 + rng.uniform(0.05, 0.4) * span)
        j.ckpt_load_ns = int(min(rng.uniform(2, 15) * NS, 0.15 * span))
        j.start_ns = j.launch_ns + j.ckpt_load_ns
        j.first_step = 0 if rng.random() < 0.5 else int(rng.integers(1000, 50000))   # fresh, or resumed from a checkpoint
        j.first_step_factor = float(rng.uniform(*lc["first_step_factor"]))
    for i in take(int(lc["n_finish"])):
        jobs[i].stop_ns = int(W0 + rng.uniform(0.5, 0.9) * span)
    for i in take(int(lc["n_crash"])):
        jobs[i].crash_ns = int(W0 + rng.uniform(0.4, 0.9) * span)
    # checkpoints and stalls may hit any job, including those above
    for _ in range(int(lc["n_checkpoint"])):
        j = jobs[int(rng.integers(0, len(jobs)))]
        t = W0 + rng.uniform(0.15, 0.8) * span
        k = int(max(1, (t - j.start_ns) // j.nominal_step_ns()))
        j.checkpoints[k] = int(min(rng.uniform(1.5, 12) * NS, 0.2 * span))
    for _ in range(int(lc["n_dataloader_stall"])):
        j = jobs[int(rng.integers(0, len(jobs)))]
        t = W0 + rng.uniform(0.1, 0.9) * span
        k = int(max(1, (t - j.start_ns) // j.nominal_step_ns()))
        j.stalls[k] = int(rng.uniform(0.3, 3.0) * NS)


def _make_hard(jobs: list[JobSpec]) -> None:
    """The cases where LLMPrism's "distinct flow sizes per step" rule fails (DESIGN.md): a pipelined
    job with variable sequence lengths (its PP pairs see many sizes) and a job whose gradient
    buffer is padded into equal buckets (its DP pairs see one size per step)."""
    order = sorted(range(len(jobs)), key=lambda i: (jobs[i].tenant == "tenant-a", i))
    var = next((i for i in order if jobs[i].pp > 1), None)
    if var is not None:
        jobs[var].variable_seq = True
    eq = next((i for i in order if i != var and jobs[i].dp_style != "fsdp"), None)
    if eq is not None:
        j = jobs[eq]
        cap = int(max(4e7, 1e6 * j.dp)) * 4 if j.dp_style != "ddp" else 25 << 20
        k = max(2, int(round(j.grad_bytes / cap)))
        j.grad_bytes, j.buckets, j.equal_buckets, j.overlap = k * cap, np.full(k, cap, dtype=np.int64), True, True


def records_per_minute(j: JobSpec, msg_factor: float = 1.0) -> float:
    """Rough count of flow records the job's traffic makes per minute (for the record budget)."""
    T, P, D, L, C, Q, m = j.tp, j.pp, j.dp, j.local, j.channels, j.qps, j.n_microbatches
    n_h = D // L
    hops = 2 * (n_h - 1) if (j.algo in ("tree", "auto") and n_h >= 3) else n_h
    if j.dp_style == "fsdp":
        n_coll = len(j.buckets) * (2 * m + 1)
    else:
        n_coll = len(j.buckets) * (2 if j.dp_style == "zero" else 1)
    dp = n_coll * hops * C * Q * T * P * msg_factor
    pp = 2 * m * (P - 1) * D * T * j.p2p_channels * Q
    return (dp + pp) * 60e9 / max(j.nominal_step_ns(), 1.0)
