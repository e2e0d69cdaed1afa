"""Execution model of one training job: what every rank does in every step, with exact times.

Per step (all steps and DP replicas at once, as numpy arrays of shape (steps, dp)):
- 1F1B pipeline per DP replica, evaluated as a max-plus recurrence over the schedule's dependency
  graph: F(s,i) waits for F(s-1,i) plus the p2p latency (activation transfer), B(s,i) waits for
  B(s+1,i) plus the gradient transfer, and each stage runs its ops in 1F1B order.
- gradient buckets become ready during the last microbatch's backward; each DP group (one per
  stage and TP rank) all-reduces them in order as a rail-aligned ring, one flow per ring hop per
  NCCL channel (2(N-1)/N of the bucket), or ZeRO: reduce-scatter ((N-1)/N), optimizer, all-gather.
- a job-wide barrier (Megatron's global grad-norm all-reduce + optimizer) ends the step.

Faults change the execution: compute multipliers per GPU slow their pipeline slot (and through the
syncs the whole job); network faults lower the bandwidth of flows crossing a NIC or switch, which
lengthens the flows and therefore the collectives and p2p waits. Faults switch on per step (at the
step's start time), found by a fixed-point iteration because slower steps move later steps.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fleetscope.sim.fabric import Fabric
from fleetscope.sim.faults import COMPUTE, NETWORK, Fault
from fleetscope.sim.jobs import JobSpec, dp_rings

NIC_BW = 42.5e9          # achievable bytes/s per 400 Gb/s RDMA NIC and direction
LAUNCH_NS = 5_000        # kernel launch / doorbell before a flow's first packet
RING_ALPHA_NS = 6_000    # per ring step latency
BUCKET_GAP_NS = 15_000
PP_LAT_NS = 8_000

KIND_PP, KIND_DP = 0, 1


@lru_cache(maxsize=64)
def one_f_one_b_order(p: int, m: int) -> tuple[tuple[int, int, int], ...]:
    """All (stage, is_backward, microbatch) ops in an order that respects every dependency."""
    per_stage = []
    for s in range(p):
        w = min(p - s - 1, m)
        ops = [(0, i) for i in range(w)]
        for i in range(m - w):
            ops += [(0, w + i), (1, i)]
        ops += [(1, i) for i in range(m - w, m)]
        per_stage.append(ops)
    done: set[tuple[int, int, int]] = set()
    ptr = [0] * p
    order: list[tuple[int, int, int]] = []
    total = 2 * m * p
    while len(order) < total:
        moved = False
        for s in range(p):
            while ptr[s] < len(per_stage[s]):
                b, i = per_stage[s][ptr[s]]
                dep = (s - 1, 0, i) if (b == 0 and s > 0) else ((s + 1, 1, i) if (b == 1 and s < p - 1) else None)
                if dep is not None and dep not in done:
                    break
                order.append((s, b, i))
                done.add((s, b, i))
                ptr[s] += 1
                moved = True
        if not moved:  # pragma: no cover - 1F1B is deadlock free
            raise RuntimeError("1F1B schedule deadlocked")
    return tuple(order)


def link_factor(fab: Fabric, faults: list[Fault], src: np.ndarray, dst: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Remaining bandwidth fraction per step and flow: shape (steps,) + src.shape."""
    out = np.ones((active.shape[0],) + src.shape)
    if not faults:
        return out
    ls, sp, ld = fab.path_switches(src.reshape(-1), dst.reshape(-1))
    for j, f in enumerate(faults):
        if f.kind == "degraded_nic":
            hit = (src == f.endpoint) | (dst == f.endpoint)
        elif f.kind == "congested_switch":
            hit = ((ls == f.switch) | (sp == f.switch) | (ld == f.switch)).reshape(src.shape)
        else:
            continue
        if hit.any():
            a = active[:, j].reshape((-1,) + (1,) * src.ndim)
            out = np.where(a & hit[None], out * f.magnitude, out)
    return out


def one_f_one_b(fdur: np.ndarray, bdur: np.ndarray, c_f: np.ndarray | None, c_b: np.ndarray | None):
    """Max-plus recurrence of a 1F1B pipeline step.

    fdur, bdur: (P, m, ...) forward / backward durations per stage and microbatch (any trailing
    batch shape, e.g. steps x DP replicas); c_f[..., s]: latency of the activation hop s -> s+1,
    c_b[..., s]: of the gradient hop s+1 -> s (trailing shape + (P-1,)). Returns start and end
    times (Fs, Fe, Bs, Be), each (P, m, ...), relative to the step start (time 0 on every stage):
        F(s,i) = max(prev op on s, F(s-1,i) end + c_f[s-1]),  B(s,i) = max(prev op on s, B(s+1,i) end + c_b[s]).
    With c = 0 and constant f, b the makespan is the closed form (m+p-1)(f+b); with c > 0 it is not."""
    P, m = fdur.shape[:2]
    Fs, Fe, Bs, Be = (np.zeros_like(fdur) for _ in range(4))
    prev = np.zeros((P,) + fdur.shape[2:])
    # latencies may also differ per microbatch (variable sequence lengths): a leading (m,) axis
    per_mb = c_f is not None and c_f.ndim == fdur.ndim
    for s, b, i in one_f_one_b_order(P, m):
        if b == 0:
            dep = (c_f[i] if per_mb else c_f)[..., s - 1] + Fe[s - 1, i] if s > 0 else 0.0
            st = np.maximum(prev[s], dep)
            Fs[s, i], Fe[s, i] = st, st + fdur[s, i]
            prev[s] = Fe[s, i]
        else:
            dep = (c_b[i] if per_mb else c_b)[..., s] + Be[s + 1, i] if s < P - 1 else 0.0
            st = np.maximum(prev[s], dep)
            Bs[s, i], Be[s, i] = st, st + bdur[s, i]
            prev[s] = Be[s, i]
    return Fs, Fe, Bs, Be


@dataclass
class JobRun:
    step_start: np.ndarray    # (K,) absolute start of each step
    steps: np.ndarray         # (K,) step numbers
    flows: dict               # column -> array (flat), all steps (window filtering is later)
    hang_ns: int | None


def run_job(job: JobSpec, job_idx: int, fab: Fabric, faults: list[Fault], window: tuple[int, int], seed: int) -> JobRun:
    W0, W1 = window
    nominal = job.nominal_step_ns()
    end = W1 if job.stop_ns is None else min(W1, job.stop_ns)
    K = max(1, int(np.ceil((end - job.start_ns) / (0.6 * nominal))) + 2)
    P, T, D = job.pp, job.tp, job.dp
    R = job.rank_gpu(*np.meshgrid(np.arange(T), np.arange(D), np.arange(P), indexing="ij"))  # (T, D, P)
    slot_gpus = R.transpose(1, 2, 0)                        # (D, P, T)
    ring_src, ring_dst = dp_rings(job)                      # (P, T, NH)
    NH = ring_src.shape[2]
    mine = [f for f in faults if _touches(f, job, job_idx, fab)]
    net = [f for f in mine if f.kind in NETWORK]
    hang = next((f for f in mine if f.kind == "hang"), None)

    step_start = job.start_ns + np.arange(K) * nominal
    active = None
    for _ in range(6):
        new_active = np.stack([f.active(step_start) for f in mine], axis=1) if mine else np.zeros((K, 0), bool)
        if active is not None and np.array_equal(new_active, active):
            break
        active = new_active
        res = _execute(job, job_idx, fab, mine, net, active, K, R, slot_gpus, ring_src, ring_dst, NH, seed)
        step_start = job.start_ns + np.concatenate([[0], np.cumsum(res["step_dur"][:-1])]).astype(np.int64)
    flows = res["flows"]
    k = flows["k"]
    flows["start"] = flows["start"] + step_start[k]
    keep = step_start[k] < end          # no step starts after the job stopped
    hang_ns = None
    if hang is not None:
        kh = int(np.argmax(step_start >= hang.start_ns)) if (step_start >= hang.start_ns).any() else None
        if kh is not None:
            hang_ns = int(step_start[kh] + 0.3 * res["first_ready"][kh])
            keep &= flows["start"] < hang_ns
    flows = {c: v[keep] for c, v in flows.items()}
    flows["step"] = job.first_step + flows.pop("k")
    return JobRun(step_start=step_start, steps=job.first_step + np.arange(K), flows=flows, hang_ns=hang_ns)


def _touches(f: Fault, job: JobSpec, job_idx: int, fab: Fabric) -> bool:
    if f.kind in NETWORK:
        return True                    # checked per flow by link_factor
    if f.gpu_mask is not None and f.gpu_mask[job.gpus].any():
        return f.kind != "sync_in_forward" or f.job_idx == job_idx
    return False


def _execute(job, job_idx, fab, faults, net, active, K, R, slot_gpus, ring_src, ring_dst, NH, seed) -> dict:
    P, T, D, m = job.pp, job.tp, job.dp, job.n_microbatches
    rng = np.random.default_rng([seed, 7, job_idx])        # same draws in every fixed-point pass
    net_active = active[:, [i for i, f in enumerate(faults) if f.kind in NETWORK]]   # network faults' columns
    # ---- compute durations and fault effects per (step, dp replica, stage) ---------------------
    mult = np.ones((K, D, P))
    fwd_add = np.zeros((K, D, P))
    gc_add = np.zeros((K, D, P))
    gc_draw = rng.random((K, D, P))
    for j, f in enumerate(faults):
        if f.gpu_mask is None:
            continue
        slot = f.gpu_mask[slot_gpus].any(axis=2)            # (D, P)
        a = active[:, j][:, None, None] & slot[None]
        if f.kind in COMPUTE:
            mult = np.where(a, mult * f.magnitude, mult)
        elif f.kind == "sync_in_forward":
            fwd_add += np.where(a, f.magnitude, 0.0)
        elif f.kind == "slow_dataloader":
            # one dataloader next() per microbatch on the first stage
            fwd_add += np.where(a & (np.arange(P) == 0)[None, None, :], f.magnitude, 0.0)
        elif f.kind == "gc_stall":
            gc_add += np.where(a & (gc_draw < f.p_step), f.magnitude, 0.0)
    fwd_add *= 1e9          # seconds -> ns
    gc_add *= 1e9
    common = rng.lognormal(0.0, 0.01, K)[:, None]           # step-to-step jitter (data, clocks)
    noise = rng.lognormal(0.0, 0.015, (2 * m * P, K, D))
    gc_mb = (np.arange(K) * 7 + job_idx) % m               # microbatch whose forward the pause hits
    # sequence length of each microbatch relative to the longest (variable-length jobs only; own
    # generator so the other jobs' draws do not move)
    seq = np.ones((m, K))
    if job.variable_seq:
        seq = np.ceil(np.random.default_rng([seed, 8, job_idx]).uniform(0.3, 1.0, (m, K)) * 32) / 32
    compute_scale = 0.3 + 0.7 * seq                            # attention + MLP work grows with length

    # ---- p2p transfers: duration of each TP shard's activation / gradient per hop ----------------
    if P > 1:
        fsrc, fdst = slot_gpus[:, :-1, :], slot_gpus[:, 1:, :]         # (D, P-1, T)
        fac_f = link_factor(fab, net, fsrc, fdst, net_active)               # (K, D, P-1, T)
        fac_b = link_factor(fab, net, fdst, fsrc, net_active)
        act = np.round(job.act_bytes * seq).astype(np.int64)             # (m, K)
        a5 = act[:, :, None, None, None]
        dur_f = PP_LAT_NS + a5 / (NIC_BW * fac_f[None]) * 1e9             # (m, K, D, P-1, T)
        dur_b = PP_LAT_NS + a5 / (NIC_BW * fac_b[None]) * 1e9
        c_f = 2 * LAUNCH_NS + dur_f.max(axis=4)                        # (m, K, D, P-1)
        c_b = 2 * LAUNCH_NS + dur_b.max(axis=4)
    # ---- 1F1B max-plus recurrence ----------------------------------------------------------------
    fdur = np.empty((P, m, K, D))
    bdur = np.empty((P, m, K, D))
    for n, (s, b, i) in enumerate(one_f_one_b_order(P, m)):
        base = job.fwd_ns[s] * (2.0 if b else 1.0) * common * noise[n] * mult[:, :, s] * compute_scale[i][:, None]
        if b:
            bdur[s, i] = base
        else:
            fdur[s, i] = base + fwd_add[:, :, s] + np.where(gc_mb[:, None] == i, gc_add[:, :, s], 0.0)
    Fs, Fe, Bs, Be = one_f_one_b(fdur, bdur, c_f if P > 1 else None, c_b if P > 1 else None)

    cols: dict[str, list] = {c: [] for c in ("k", "kind", "src", "dst", "start", "dur", "bytes", "ch")}

    def emit(kind, src, dst, start, dur, nbytes, ch, kk):
        shape = np.broadcast_shapes(np.shape(src), np.shape(start), np.shape(kk))
        cols["k"].append(np.broadcast_to(kk, shape).reshape(-1).astype(np.int32))
        cols["kind"].append(np.full(int(np.prod(shape)), kind, np.int8))
        cols["src"].append(np.broadcast_to(src, shape).reshape(-1).astype(np.int32))
        cols["dst"].append(np.broadcast_to(dst, shape).reshape(-1).astype(np.int32))
        cols["start"].append(np.broadcast_to(start, shape).reshape(-1).astype(np.int64))
        cols["dur"].append(np.broadcast_to(np.maximum(dur, 1), shape).reshape(-1).astype(np.int64))
        cols["bytes"].append(np.broadcast_to(nbytes, shape).reshape(-1).astype(np.int64))
        cols["ch"].append(np.broadcast_to(ch, shape).reshape(-1).astype(np.int8))

    kk = np.arange(K)
    if P > 1:
        # (P-1, m, K, D, T): one activation per microbatch forward, one gradient backward
        src = fsrc.transpose(1, 0, 2)[:, None, None, :, :]
        dst = fdst.transpose(1, 0, 2)[:, None, None, :, :]
        df = dur_f.transpose(3, 0, 1, 2, 4)
        db = dur_b.transpose(3, 0, 1, 2, 4)
        k5 = kk[None, None, :, None, None]
        nb = act[None, :, :, None, None]
        emit(KIND_PP, src, dst, Fe[:-1][..., None] + LAUNCH_NS, df, nb, 0, k5)
        emit(KIND_PP, dst, src, Be[1:][..., None] + LAUNCH_NS, db, nb, 0, k5)

    # ---- DP collectives --------------------------------------------------------------------------
    C = job.channels
    bw_ch = NIC_BW / C
    fac_dp = link_factor(fab, net, ring_src, ring_dst, net_active)          # (K, P, T, NH)
    N = D
    sizes = job.buckets
    cum = np.cumsum(sizes) / sizes.sum()
    stage_end = np.zeros((K, P))
    first_ready = np.full(K, np.inf)

    def collective(s, ready, frac_wire, nbytes_bucket, prev_end):
        """One bucket on every TP group of stage s: flows (K, T, NH, C); returns end (K, T)."""
        start = np.maximum(ready[:, None], prev_end) + BUCKET_GAP_NS                  # (K, T)
        hop_bytes = max(1, int(round(frac_wire * nbytes_bucket / C)))
        jit = rng.uniform(0, 4_000, (K, T, NH, C))
        fst = start[:, :, None, None] + LAUNCH_NS + jit
        fdur = (hop_bytes / (bw_ch * fac_dp[:, s][..., None]) * 1e9 * rng.lognormal(0, 0.004, (K, T, NH, C))
                + 2 * (N - 1) * RING_ALPHA_NS)
        emit(KIND_DP, ring_src[s][None, :, :, None], ring_dst[s][None, :, :, None], fst, fdur, hop_bytes,
             np.arange(C)[None, None, None, :], kk[:, None, None, None])
        return (fst + fdur).max(axis=(2, 3))

    for s in range(P):
        bst, bdur = Bs[s, m - 1], Be[s, m - 1] - Bs[s, m - 1]      # last backward of the stage (K, D)
        prev_end = np.full((K, T), -np.inf)
        wire = 2 * (N - 1) / N if job.dp_style != "zero" else (N - 1) / N
        for b, nb in enumerate(sizes):
            ready = (bst + cum[b] * bdur).max(axis=1)               # every member must have the bucket
            if b == 0:
                first_ready = np.minimum(first_ready, ready)
            prev_end = collective(s, ready, wire, nb, prev_end)
        if job.dp_style == "zero":
            # sharded optimizer, then all-gather of the updated parameters
            ag_ready = prev_end.max(axis=1) + job.optimizer_ns * max(0.25, 1.0 / D)   # sharded step
            prev_end = np.full((K, T), -np.inf)
            for nb in sizes:
                prev_end = collective(s, ag_ready, (N - 1) / N, nb, prev_end)
        stage_end[:, s] = prev_end.max(axis=1)
    gap = rng.uniform(2e6, 8e6, K)
    opt = 0 if job.dp_style == "zero" else job.optimizer_ns
    step_dur = stage_end.max(axis=1) + opt + gap
    flows = {c: np.concatenate(v) if v else np.zeros(0) for c, v in cols.items()}
    return {"step_dur": step_dur, "flows": flows, "first_ready": first_ready}
