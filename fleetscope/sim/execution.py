"""Execution model of one training job: what every rank does in every step, with exact times.

Per step (all steps and DP replicas at once, as numpy arrays):
- a 1F1B pipeline per DP replica, evaluated as a max-plus recurrence over the schedule's dependency
  graph: F(s,i) waits for F(s-1,i) plus the activation transfer, B(s,i) for B(s+1,i) plus the
  gradient transfer, and each stage runs its ops in 1F1B order;
- gradient buckets become ready during the last microbatch's backward (or all at its end without
  overlap); each DP group reduces them in order over its NCCL channels: rings (2(N-1)/N of the
  bucket per channel and hop) or double binary trees (the whole channel share up and down each
  edge); Megatron's distributed optimizer reduce-scatters, steps a shard and all-gathers; FSDP
  all-gathers each unit before its forward and backward and reduce-scatters it after the last
  backward;
- a ring is paced by its slowest hop: every hop's transfer of a bucket spans the ring's whole
  duration, only the time the link is actually busy differs (`busy`, which a per-message collector
  reveals and a per-bucket one hides), which is what real NCCL rings look like on the wire;
- a rank enters each collective on its own: a hop's first chunk (its sender's own share) leaves when
  its sending replica is ready, the rest once the last member entered (a late replica's hops start
  late, its peers' on time and then wait: what the real gloo recordings with a straggler show).

Faults change the execution: compute multipliers per GPU slow their pipeline slot (and through the
syncs the whole job); network faults lower the bandwidth of the flows crossing a NIC or switch
(through the pacing, the whole ring); a flapping link stalls the transfers crossing it while it is
down. Faults switch on per step (at the step's start time), found by a fixed-point iteration because
slower steps move later steps. Benign life events (slow first step, dataloader stalls, checkpoint
pauses, finish, crash) come from the JobSpec.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fleetscope.sim.fabric import NIC_BW, Fabric, flow_hash
from fleetscope.sim.faults import COMPUTE, NETWORK, Fault
from fleetscope.sim.jobs import AUTO_TREE_BYTES, BWD_RATIO, JobSpec, dp_plan, pp_pairs

LAUNCH_NS = 5_000        # kernel launch / doorbell before a flow's first packet
RING_ALPHA_NS = 6_000    # per ring step latency
BUCKET_GAP_NS = 15_000
PP_LAT_NS = 8_000
SOCKET_EFFICIENCY = 0.4  # NCCL's socket transport reaches a fraction of the NIC's RDMA bandwidth

KIND_PP, KIND_DP = 0, 1
FLOW_COLUMNS = ("k", "kind", "src", "dst", "fh", "start", "dur", "busy", "bytes")


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


def link_factor(fab: Fabric, faults: list[Fault], src: np.ndarray, dst: np.ndarray, active: np.ndarray,
                fhash: np.ndarray | None = None) -> np.ndarray:
    """Remaining bandwidth fraction per step and flow: shape (steps,) + src.shape."""
    out = np.ones((active.shape[0],) + src.shape)
    if not faults:
        return out
    ls = sp = ld = None
    for j, f in enumerate(faults):
        if f.kind == "degraded_nic":
            hit = (src == f.endpoint) | (dst == f.endpoint)
        elif f.kind == "congested_switch":
            if ls is None:
                ls, sp, ld = fab.path_switches(src.reshape(-1), dst.reshape(-1), None if fhash is None else fhash.reshape(-1))
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
    step_start: np.ndarray    # (K,) absolute compute start of each step
    step_end: np.ndarray      # (K,) absolute end of each step's DP traffic
    steps: np.ndarray         # (K,) step numbers
    complete: np.ndarray      # (K,) the step finished (not cut by a crash or a hang)
    flows: dict               # column -> array (flat), all steps (window filtering is later)
    hang_ns: int | None
    events: list[dict]


def _touches(f: Fault, job: JobSpec, job_idx: int) -> bool:
    if f.kind in NETWORK:
        return True                    # checked per flow
    if f.kind == "nic_overload":
        return False                   # changes the job's NIC mapping (JobSpec.nic_overload)
    if f.gpu_mask is not None and f.gpu_mask[job.gpus].any():
        return f.kind != "sync_in_forward" or f.job_idx == job_idx
    return False


def run_job(job: JobSpec, job_idx: int, fab: Fabric, faults: list[Fault], window: tuple[int, int], seed: int) -> JobRun:
    W0, W1 = window
    nominal = job.nominal_step_ns()
    end = W1
    pauses = sum(job.checkpoints.values()) + sum(job.stalls.values())
    K = max(2, int(np.ceil((end - job.start_ns - pauses) / (0.6 * nominal))) + 2)
    if job.stop_ns is not None:
        K = min(K, max(1, int((job.stop_ns - job.start_ns) // nominal) + 1))
    mine = [f for f in faults if _touches(f, job, job_idx)]
    hang = next((f for f in mine if f.kind == "hang"), None)

    step_start = job.start_ns + np.arange(K) * nominal
    active = None
    res = None
    for _ in range(6):
        new_active = np.stack([f.active(step_start) for f in mine], axis=1) if mine else np.zeros((K, 0), bool)
        if active is not None and np.array_equal(new_active, active) and not any(f.flaps for f in mine):
            break
        active = new_active
        res = _execute(job, job_idx, fab, mine, active, K, seed, step_start)
        new_start = job.start_ns + np.concatenate([[0], np.cumsum(res["step_dur"][:-1])]).astype(np.int64)
        if np.array_equal(new_start, step_start):
            break
        step_start = new_start
    flows = res["flows"]
    k = flows["k"]
    flows["start"] = flows["start"] + step_start[k]
    step_end = step_start + res["dp_end"].astype(np.int64)
    complete = np.ones(K, bool)
    cut = None
    hang_ns = None
    if hang is not None:
        after = step_start >= hang.start_ns
        if after.any():
            kh = int(np.argmax(after))
            hang_ns = int(step_start[kh] + 0.3 * res["first_ready"][kh])
            cut = hang_ns
    if job.crash_ns is not None:
        cut = job.crash_ns if cut is None else min(cut, job.crash_ns)
    if cut is not None:
        complete &= step_end <= cut
        keep = flows["start"] < cut
        flows = {c: v[keep] for c, v in flows.items()}
        over = flows["start"] + flows["dur"] > cut
        if over.any():                   # in flight when the job died: cut short
            frac = (cut - flows["start"][over]) / np.maximum(flows["dur"][over], 1)
            flows["bytes"][over] = np.maximum(1, (flows["bytes"][over] * frac).astype(np.int64))
            flows["dur"][over] = np.maximum(1, cut - flows["start"][over])
            flows["busy"][over] = np.minimum(flows["busy"][over], flows["dur"][over])
    flows["step"] = job.first_step + flows.pop("k")
    steps = job.first_step + np.arange(K)
    return JobRun(step_start=step_start, step_end=step_end, steps=steps, complete=complete, flows=flows,
                  hang_ns=hang_ns, events=_events(job, step_start, step_end, steps, complete, window))


def _events(job: JobSpec, step_start, step_end, steps, complete, window) -> list[dict]:
    """Benign life events with their true times (ground truth events.csv)."""
    W0, W1 = window
    ev = []

    def add(kind, start, end, step=None, magnitude=None, note=""):
        if end < W0 or start >= W1:
            return
        ev.append({"kind": kind, "job_id": job.job_id, "scope": "job", "subject": job.job_id, "start_ns": int(start),
                   "end_ns": int(end), "step": None if step is None else int(step),
                   "magnitude": None if magnitude is None else float(magnitude), "note": note})

    if job.launch_ns is not None:
        add("launch", job.launch_ns, job.launch_ns + min(job.ckpt_load_ns, 2_000_000_000), None, None, "rendezvous")
        add("checkpoint_load", job.launch_ns, job.start_ns, None, job.ckpt_load_ns / 1e9, "restore before the first step")
        add("first_step", step_start[0], step_end[0], steps[0], job.first_step_factor, "warm-up: slow first step")
    for k, pause in sorted(job.checkpoints.items()):
        if k < len(step_start) - 1 and complete[k]:
            add("checkpoint_save", step_end[k], step_start[k + 1], steps[k + 1], pause / 1e9, "pause after this step's update")
    for k, d in sorted(job.stalls.items()):
        if 0 < k < len(step_start) and complete[k - 1]:
            add("dataloader_stall", step_end[k - 1], step_start[k], steps[k], d / 1e9, "input pipeline stall")
    if job.stop_ns is not None:
        last = int(np.nonzero(complete)[0][-1]) if complete.any() else 0
        add("finish", step_end[last], step_end[last] + 1_000_000, steps[last], None, "training finished")
    if job.crash_ns is not None:
        add("crash", job.crash_ns, job.crash_ns + 1_000_000, None, None, "process exited mid-step")
    return ev


def _execute(job: JobSpec, job_idx: int, fab: Fabric, faults: list[Fault], active: np.ndarray, K: int,
             seed: int, step_start: np.ndarray) -> dict:
    P, T, D, m = job.pp, job.tp, job.dp, job.n_microbatches
    rng = np.random.default_rng([seed, 7, job_idx])        # same draws in every fixed-point pass
    net_idx = [i for i, f in enumerate(faults) if f.kind in ("degraded_nic", "congested_switch")]
    net = [faults[i] for i in net_idx]
    net_active = active[:, net_idx]
    t_ax, d_ax, s_ax = np.meshgrid(np.arange(T), np.arange(D), np.arange(P), indexing="ij")
    slot_gpus = job.rank_gpu(t_ax, d_ax, s_ax).transpose(1, 2, 0)      # (D, P, T)
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
        elif f.kind == "straggler":
            # a rank that falls behind by a varying amount every step (host contention, noisy neighbour)
            x = np.random.default_rng([seed, 9, job_idx, j]).lognormal(np.log(f.magnitude), 0.5, K)
            mult = np.where(a, mult * (1 + x)[:, None, None], mult)
        elif f.kind == "sync_in_forward":
            fwd_add += np.where(a, f.magnitude, 0.0)
        elif f.kind == "slow_dataloader":
            fwd_add += np.where(a & (np.arange(P) == 0)[None, None, :], f.magnitude, 0.0)
        elif f.kind == "gc_stall":
            gc_add += np.where(a & (gc_draw < f.p_step), f.magnitude, 0.0)
    fwd_add *= 1e9          # seconds -> ns
    gc_add *= 1e9
    if job.launch_ns is not None:
        mult[0] *= job.first_step_factor                   # warm-up: allocator, NCCL setup, compile
    common = rng.lognormal(0.0, 0.01, K)[:, None]           # step-to-step jitter (data, clocks)
    noise = rng.lognormal(0.0, 0.015, (2 * m * P, K, D))
    gc_mb = (np.arange(K) * 7 + job_idx) % m
    seq = np.ones((m, K))
    if job.variable_seq:
        seq = np.ceil(np.random.default_rng([seed, 8, job_idx]).uniform(0.3, 1.0, (m, K)) * 32) / 32
    compute_scale = 0.3 + 0.7 * seq

    cols: dict[str, list] = {c: [] for c in FLOW_COLUMNS}

    def emit(kind, src, dst, fh, start, dur, busy, nbytes, kk):
        """Records of one transfer pattern; fh (the 5-tuple hash) is computed on the small identity
        shape and broadcast like src and dst."""
        shape = np.broadcast_shapes(np.shape(src), np.shape(start), np.shape(kk), np.shape(dur), np.shape(fh))
        n = int(np.prod(shape))
        cols["k"].append(np.broadcast_to(kk, shape).reshape(-1).astype(np.int32))
        cols["kind"].append(np.full(n, kind, np.int8))
        cols["src"].append(np.broadcast_to(src, shape).reshape(-1).astype(np.int32))
        cols["dst"].append(np.broadcast_to(dst, shape).reshape(-1).astype(np.int32))
        cols["fh"].append(np.broadcast_to(fh.view(np.int64), shape).reshape(-1))
        cols["start"].append(np.broadcast_to(start, shape).reshape(-1).astype(np.int64))
        d = np.maximum(np.broadcast_to(dur, shape), 1).reshape(-1).astype(np.int64)
        cols["dur"].append(d)
        cols["busy"].append(np.minimum(np.maximum(np.broadcast_to(busy, shape).reshape(-1), 1), d).astype(np.int64))
        cols["bytes"].append(np.broadcast_to(nbytes, shape).reshape(-1).astype(np.int64))

    Q = job.qps
    kk = np.arange(K)
    # ---- p2p transfers: one activation per microbatch forward, one gradient backward -------------
    if P > 1:
        fsrc, fdst = pp_pairs(job)                                           # (D, P-1, T)
        pc = job.p2p_channels
        # transfers of one (d, hop) leave at once from every TP rank: with the NIC-overload fault
        # they share one NIC
        load = np.full((D, P - 1, T), float(T) if job.nic_overload else 1.0)   # a slot's TP ranks share one host
        X = pc * Q
        parts = np.arange(X)
        psrc = np.broadcast_to(fsrc[..., None], fsrc.shape + (X,))
        pdst = np.broadcast_to(fdst[..., None], fdst.shape + (X,))
        fac_f = link_factor(fab, net, psrc, pdst, net_active, flow_hash(psrc, pdst, parts // Q, parts % Q, KIND_PP))
        fac_b = link_factor(fab, net, pdst, psrc, net_active, flow_hash(pdst, psrc, parts // Q, parts % Q, KIND_PP))
        act = np.round(job.act_bytes * seq).astype(np.int64)                     # (m, K)
        a6 = act[:, :, None, None, None, None]
        ld = load[None, None, ..., None]
        dur_f = PP_LAT_NS + a6 * ld / (NIC_BW * fac_f[None]) * 1e9                # (m, K, D, P-1, T, X)
        dur_b = PP_LAT_NS + a6 * ld / (NIC_BW * fac_b[None]) * 1e9
        c_f = 2 * LAUNCH_NS + dur_f.max(axis=(4, 5))                             # (m, K, D, P-1)
        c_b = 2 * LAUNCH_NS + dur_b.max(axis=(4, 5))
    # ---- 1F1B max-plus recurrence ----------------------------------------------------------------
    fdur = np.empty((P, m, K, D))
    bdur = np.empty((P, m, K, D))
    for n, (s, b, i) in enumerate(one_f_one_b_order(P, m)):
        base = job.fwd_ns[s] * (BWD_RATIO if b else 1.0) * common * noise[n] * mult[:, :, s] * compute_scale[i][:, None]
        if b:
            bdur[s, i] = base
        else:
            fdur[s, i] = base + fwd_add[:, :, s] + np.where(gc_mb[:, None] == i, gc_add[:, :, s], 0.0)
    Fs, Fe, Bs, Be = one_f_one_b(fdur, bdur, c_f if P > 1 else None, c_b if P > 1 else None)

    if P > 1:
        # (P-1, m, K, D, T, X): split over p2p channels x queue pairs (equal parts, in parallel)
        src = fsrc.transpose(1, 0, 2)[:, None, None, :, :, None]
        dst = fdst.transpose(1, 0, 2)[:, None, None, :, :, None]
        df = dur_f.transpose(3, 0, 1, 2, 4, 5)
        db = dur_b.transpose(3, 0, 1, 2, 4, 5)
        k6 = kk[None, None, :, None, None, None]
        nb = np.maximum(1, act[None, :, :, None, None, None] // X)
        emit(KIND_PP, src, dst, flow_hash(src, dst, parts // Q, parts % Q, KIND_PP), Fe[:-1][..., None, None] + LAUNCH_NS,
             df, df, nb, k6)
        emit(KIND_PP, dst, src, flow_hash(dst, src, parts // Q, parts % Q, KIND_PP), Be[1:][..., None, None] + LAUNCH_NS,
             db, db, nb, k6)

    # ---- DP collectives --------------------------------------------------------------------------
    C = job.channels
    N = D
    sizes = job.buckets
    stage_end = np.zeros((K, P))
    first_ready = np.full(K, np.inf)
    # flapping links: down time inside each step (from the previous pass's step times)
    flap_stall = []
    nxt = np.concatenate([step_start[1:], [step_start[-1] + job.nominal_step_ns()]])
    for f in faults:
        if f.kind == "flapping_link" and f.flaps:
            st = np.zeros(K)
            for a, b in f.flaps:
                st += np.clip(np.minimum(nxt, b) - np.maximum(step_start, a), 0, None)
            if st.any():
                flap_stall.append((f.endpoint, st))

    bw = NIC_BW * (SOCKET_EFFICIENCY if job.transport == "tcp" else 1.0)

    def route(s, algo):
        """Everything about stage s's hops under one algorithm that does not depend on the bucket."""
        pl_ = dp_plan(job, s, algo)
        src, dst, phase = pl_["src"], pl_["dst"], pl_["phase"]          # (T, C, H)
        H = src.shape[2]
        tree = algo == "tree" and N // job.local >= 3
        # concurrent channels per NIC (tx and rx): the NIC's bandwidth is shared among them
        u_s, c_s = np.unique(src, return_counts=True)
        u_d, c_d = np.unique(dst, return_counts=True)
        load = np.maximum(c_s[np.searchsorted(u_s, src)], c_d[np.searchsorted(u_d, dst)])
        src_q = np.broadcast_to(src[..., None], src.shape + (Q,))
        dst_q = np.broadcast_to(dst[..., None], dst.shape + (Q,))
        ch_q = np.broadcast_to(np.arange(C)[None, :, None, None], src_q.shape)
        qp_q = np.broadcast_to(np.arange(Q), src_q.shape)
        fh = flow_hash(src_q, dst_q, ch_q, qp_q, KIND_DP).reshape(src_q.shape)
        stall = np.zeros((K, T, C, H))
        for e, st in flap_stall:
            hit = (src == e) | (dst == e)
            if hit.any():
                stall += st[:, None, None, None] * hit[None]
        return {"src_q": src_q, "dst_q": dst_q, "fh": fh, "bw_ch": bw / load, "phase": phase, "tree": tree,
                "src_d": pl_["src_d"],
                "depth": int(np.ceil(np.log2(N // job.local + 1))) if tree else 0, "stall": stall, "H": H,
                "fac": link_factor(fab, net, src_q, dst_q, net_active, fh)}               # (K, T, C, H, Q)

    for s in range(P):
        routes = {"ring": route(s, "ring")}
        if job.algo in ("tree", "auto"):
            routes["tree"] = route(s, "tree")
        state = {"first": True}

        def collective(ready_kd, prev_end, frac_wire, nbytes, alpha_steps, allreduce=False):
            """One collective on every TP group of stage s: records (K, T, C, H, Q); returns end (K, T).
            ready_kd: when each DP replica has the data (K, D); prev_end: the group's previous
            collective's end (K, T). A rank enters the collective on its own (gloo's sends go to the
            socket, NCCL's proxy posts its receives when the host enqueues): a hop's first chunk (its
            sender's own share, 1 / alpha_steps of its bytes) leaves when its sending replica is
            ready; the rest is the chunks its predecessors forward, which move once the last member
            entered, at the ring's pace (its slowest hop). An early hop's first chunk is its own
            record when the wait after it is longer than its transfer (a burst, then the link idles):
            a late replica's hops start late, its peers' start on time and wait, which is what the
            real gloo recordings with a straggler show."""
            start_kt = np.maximum(ready_kd.max(axis=1)[:, None], prev_end) + BUCKET_GAP_NS          # (K, T)
            algo = "ring"
            if allreduce and job.algo == "tree" or (job.algo == "auto" and allreduce and nbytes < AUTO_TREE_BYTES):
                algo = "tree"
            r = routes[algo]
            if r["tree"]:          # each channel's share goes up and down every tree edge
                frac_wire, alpha_steps = 1.0, 2 * r["depth"]
            bytes_ch = frac_wire * nbytes / C
            H = r["H"]
            own = bytes_ch / (r["bw_ch"][None, ..., None] * r["fac"]) * 1e9                # (K, T, C, H, Q)
            if state["first"] and flap_stall:
                own = own + r["stall"][..., None]
                state["first"] = False
            ring = own.max(axis=(3, 4)) + alpha_steps * RING_ALPHA_NS             # (K, T, C): paced by the slowest hop
            jit = rng.uniform(0, 4_000, (K, T, C, H, Q))
            hop_kt = np.maximum(ready_kd[:, r["src_d"]][:, None], prev_end[:, :, None, None]) + BUCKET_GAP_NS   # (K, T, C, H)
            if r["tree"]:       # a tree's broadcast half leaves once the reduction reached the root: after the last entered
                hop_kt = np.where(r["phase"][None, None, None, :] == 1, start_kt[:, :, None, None], hop_kt)
            fst = hop_kt[..., None] + LAUNCH_NS + jit                           # its first chunk
            gate = start_kt[:, :, None, None, None] + LAUNCH_NS + jit           # the ring's chunks
            end = start_kt[:, :, None, None, None] + LAUNCH_NS + ring[..., None, None] + rng.uniform(0, 3_000, (K, T, C, H, Q))
            if r["tree"]:       # the broadcast half trails the reduce half by the tree's depth
                off = r["phase"][None, None, None, :, None].astype(np.float64) * (r["depth"] * RING_ALPHA_NS)
                fst, gate, end = fst + off, gate + off, end + off
            nb = max(1, int(round(bytes_ch / Q)))
            steps = max(int(alpha_steps), 1)
            chunk_b = max(1, nb // steps)
            chunk_t = own / steps
            early = gate - fst > chunk_t
            main = np.where(early, gate, fst)
            # (a one-step collective, two members' all-gather: its own chunk is all it sends)
            keep = ~early if chunk_b >= nb else np.ones_like(early)
            emit(KIND_DP, np.broadcast_to(r["src_q"][None], early.shape)[keep], np.broadcast_to(r["dst_q"][None], early.shape)[keep],
                 np.broadcast_to(r["fh"][None], early.shape)[keep], main[keep], (end - main)[keep],
                 np.where(early, own - chunk_t, own)[keep], np.where(early, nb - chunk_b, nb)[keep],
                 np.broadcast_to(kk[:, None, None, None, None], early.shape)[keep])
            if early.any():
                shape = early.shape
                emit(KIND_DP, np.broadcast_to(r["src_q"][None], shape)[early], np.broadcast_to(r["dst_q"][None], shape)[early],
                     np.broadcast_to(r["fh"][None], shape)[early], fst[early], chunk_t[early], chunk_t[early], chunk_b,
                     np.broadcast_to(kk[:, None, None, None, None], shape)[early])
            return end.max(axis=(2, 3, 4))

        if job.dp_style == "fsdp":
            # per unit: all-gather before each forward and each backward, reduce-scatter after the
            # last microbatch's backward (no_sync on the others)
            U = len(sizes)
            prev_end = np.full((K, T), -np.inf)
            ag_f = (N - 1) / N
            for i in range(m):
                for u, nb in enumerate(sizes):
                    ready = Fs[s, i] + u / U * (Fe[s, i] - Fs[s, i])
                    first_ready = np.minimum(first_ready, ready.max(axis=1))
                    prev_end = collective(ready, prev_end, ag_f, nb, N - 1)
                for u, nb in enumerate(sizes[::-1]):
                    ready = Bs[s, i] + u / U * (Be[s, i] - Bs[s, i])
                    prev_end = collective(ready, prev_end, ag_f, nb, N - 1)
                    if i == m - 1:
                        ready = Bs[s, i] + (u + 1) / U * (Be[s, i] - Bs[s, i])
                        prev_end = collective(ready, prev_end, ag_f, nb, N - 1)
            stage_end[:, s] = prev_end.max(axis=1)
            continue
        bst, bd = Bs[s, m - 1], Be[s, m - 1] - Bs[s, m - 1]        # last backward of the stage (K, D)
        cum = np.cumsum(sizes) / sizes.sum()
        prev_end = np.full((K, T), -np.inf)
        if job.dp_style == "zero":
            wire, steps_a = (N - 1) / N, N - 1
        else:
            wire, steps_a = 2 * (N - 1) / N, 2 * (N - 1)
        for b, nb in enumerate(sizes):
            ready = bst + cum[b] * bd if job.overlap else Be[s, m - 1]
            first_ready = np.minimum(first_ready, ready.max(axis=1))
            prev_end = collective(ready, prev_end, wire, nb, steps_a, allreduce=job.dp_style != "zero")
        if job.dp_style == "zero":
            # sharded optimizer step, then all-gather of the updated parameters
            ag_ready = prev_end.max(axis=1) + job.optimizer_ns * max(0.25, 1.0 / D)
            prev_end = np.full((K, T), -np.inf)
            for nb in sizes:
                prev_end = collective(np.broadcast_to(ag_ready[:, None], (K, D)), prev_end, (N - 1) / N, nb, N - 1)
        stage_end[:, s] = prev_end.max(axis=1)
    gap = rng.uniform(2e6, 8e6, K)
    for k, pause in job.checkpoints.items():
        if 0 <= k < K:
            gap[k] += pause
    for k, d in job.stalls.items():
        if 1 <= k < K:
            gap[k - 1] += d
    opt = job.optimizer_ns if job.dp_style in ("ddp", "megatron") else job.optimizer_ns * 0.25
    dp_end = stage_end.max(axis=1)
    step_dur = dp_end + opt + gap
    flows = {c: np.concatenate(v) if v else np.zeros(0) for c, v in cols.items()}
    return {"step_dur": step_dur, "dp_end": dp_end, "flows": flows, "first_ready": first_ready}
