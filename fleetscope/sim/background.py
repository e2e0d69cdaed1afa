"""Traffic on the GPU NICs that is not training communication (ground truth background.csv):

- storage: dataloader reads from storage servers, Poisson in time, heavy-tailed sizes;
- checkpoint: writes of every rank (or of each shard's DP rank 0) to several storage servers during
  a checkpoint save, and reads of the same sizes while a launching job restores its checkpoint;
- probe: pingmesh-style probes between every GPU NIC and a monitoring server, and between each NIC
  and a few other GPU NICs (any job's, or an idle host's), periodic with jitter;
- monitoring: metric scrapes from the monitoring servers to each host's first NIC;
- control: rendezvous (TCP store) between a job's first rank and every host's first rank at launch,
  and the elastic agent's periodic heartbeats.

All of it is aperiodic or tiny or both, and none of it is DP or PP traffic: a DP/PP label on one of
these pairs is a false label. Pairs that also carry job traffic are dropped from the background
(simulate.py), so background pairs never overlap job pairs.
"""
from __future__ import annotations

import numpy as np

from fleetscope.sim.fabric import GPUS_PER_HOST, Fabric, flow_hash
from fleetscope.sim.jobs import NS, JobSpec

KIND_STORAGE, KIND_MONITOR, KIND_PROBE, KIND_CONTROL, KIND_CHECKPOINT = 2, 3, 4, 5, 6
ROLE = {KIND_STORAGE: "storage", KIND_MONITOR: "monitoring", KIND_PROBE: "probe", KIND_CONTROL: "control",
        KIND_CHECKPOINT: "checkpoint"}
COLUMNS = ("job", "kind", "step", "src", "dst", "fh", "start", "dur", "busy", "bytes")


class _Acc:
    def __init__(self):
        self.parts = {c: [] for c in COLUMNS}

    def add(self, kind, src, dst, start, dur, nbytes, job=-1, ch=0):
        src = np.asarray(src)
        n = src.size
        if n == 0:
            return
        dur = np.maximum(np.broadcast_to(np.asarray(dur, dtype=np.float64), (n,)), 1).astype(np.int64)
        self.parts["job"].append(np.broadcast_to(np.asarray(job, np.int32), (n,)))
        self.parts["kind"].append(np.full(n, kind, np.int8))
        self.parts["step"].append(np.full(n, -1, np.int64))
        self.parts["src"].append(src.astype(np.int32).reshape(-1))
        self.parts["dst"].append(np.broadcast_to(np.asarray(dst), (n,)).astype(np.int32))
        self.parts["fh"].append(flow_hash(src.reshape(-1), np.broadcast_to(np.asarray(dst), (n,)), ch, 0, kind).view(np.int64))
        self.parts["start"].append(np.broadcast_to(np.asarray(start), (n,)).astype(np.int64))
        self.parts["dur"].append(dur)
        self.parts["busy"].append(dur)
        self.parts["bytes"].append(np.maximum(1, np.broadcast_to(np.asarray(nbytes), (n,))).astype(np.int64))

    def frame(self) -> dict:
        return {c: (np.concatenate(v) if v else np.zeros(0, np.int64)) for c, v in self.parts.items()}


def _alive(job: JobSpec, run, window) -> tuple[int, int]:
    W0, W1 = window
    a = job.launch_ns if job.launch_ns is not None else W0
    b = W1
    if job.crash_ns is not None:
        b = min(b, job.crash_ns)
    if job.stop_ns is not None and run is not None and run.complete.any():
        b = min(b, int(run.step_end[np.nonzero(run.complete)[0][-1]]) + 1_000_000_000)
    return int(max(a, W0)), int(max(min(b, W1), a))


def background_flows(fab: Fabric, jobs: list[JobSpec], runs: list, window: tuple[int, int], bc: dict, lc: dict,
                     rng: np.random.Generator) -> dict:
    W0, W1 = window
    span = W1 - W0
    acc = _Acc()
    storage = fab.n_gpus + np.arange(fab.n_storage)
    monitors = fab.n_gpus + fab.n_storage + np.arange(fab.n_monitors)
    events = [e for r in runs for e in r.events] if runs else []
    for ji, (j, r) in enumerate(zip(jobs, runs)):
        a, b = _alive(j, r, window)
        if b <= a:
            continue
        hosts = j.hosts
        # dataloader reads: per host, Poisson arrivals
        lam = bc["storage_reads_per_host_min"] * (b - a) / 60e9
        n = rng.poisson(lam * hosts.size)
        if n:
            h = rng.choice(hosts, n)
            nic = h * GPUS_PER_HOST + j.gpu_offset + rng.integers(0, j.gpus_per_host, n)
            size = np.clip(rng.lognormal(np.log(bc["storage_read_mb"] * 1e6), 1.0, n), 64e3, 4e9)
            acc.add(KIND_STORAGE, rng.choice(storage, n), nic, rng.uniform(a, b, n), size / rng.uniform(3e9, 12e9, n) * 1e9,
                    size, ji)
        # elastic agent heartbeats and, at launch, the rendezvous: rank 0's NIC <-> each host's first NIC
        lead = hosts * GPUS_PER_HOST + j.gpu_offset
        r0 = int(j.gpus[0])
        lead = lead[lead != r0]
        if lead.size:
            period = bc["control_heartbeat_s"] * NS
            t = np.arange(a + rng.uniform(0, period), b, period)
            if t.size:
                tt = np.repeat(t, lead.size) + rng.uniform(0, 50e6, t.size * lead.size)
                ll = np.tile(lead, t.size)
                acc.add(KIND_CONTROL, ll, r0, tt, rng.uniform(20e3, 300e3, ll.size), rng.integers(120, 600, ll.size), ji, 1)
                acc.add(KIND_CONTROL, np.full(ll.size, r0), ll, tt + 300e3, rng.uniform(20e3, 300e3, ll.size),
                        rng.integers(80, 300, ll.size), ji, 1)
            if j.launch_ns is not None:
                k = 6
                tt = j.launch_ns + np.sort(rng.uniform(0, 2e9, (lead.size, k)), axis=1).reshape(-1)
                ll = np.repeat(lead, k)
                acc.add(KIND_CONTROL, ll, r0, tt, rng.uniform(10e3, 500e3, ll.size), rng.integers(200, 20000, ll.size), ji, 1)
                acc.add(KIND_CONTROL, np.full(ll.size, r0), ll, tt + 200e3, rng.uniform(10e3, 500e3, ll.size),
                        rng.integers(100, 8000, ll.size), ji, 1)
    # checkpoints: writes at saves (and at a finish), reads at a launch's restore
    ids = [j.job_id for j in jobs]
    for e in events:
        if e["kind"] not in ("checkpoint_save", "checkpoint_load", "finish"):
            continue
        ji = ids.index(e["job_id"])
        j = jobs[ji]
        if e["kind"] == "finish" and rng.random() < 0.5:
            continue
        if lc["checkpoint_writers"] == "dp_rank0":
            t, s = np.meshgrid(np.arange(j.tp), np.arange(j.pp), indexing="ij")
            writers = j.nic_of(j.rank_gpu(t, 0, s)).reshape(-1)
            per = j.grad_bytes * rng.uniform(6, 12)
        else:
            writers = j.nic_of(j.gpus)
            per = j.grad_bytes * rng.uniform(2, 4)
        per = float(min(per, 8e9))
        stripes = int(rng.integers(2, 5))
        w = np.repeat(writers, stripes)
        srv = rng.choice(storage, w.size)
        length = max(e["end_ns"] - e["start_ns"], 500_000_000)
        dur = rng.uniform(0.5, 1.2, w.size) * length
        st = e["start_ns"] + rng.uniform(0, 0.05, w.size) * length
        if e["kind"] == "checkpoint_load":
            acc.add(KIND_CHECKPOINT, srv, w, st, dur, per / stripes, ji)
        else:
            acc.add(KIND_CHECKPOINT, w, srv, st, dur, per / stripes, ji)
    # pingmesh: every GPU NIC <-> a monitoring server, and <-> a few GPU peers
    G = fab.n_gpus
    period = bc["probe_period_s"] * NS
    nper = int(span // period)
    if nper > 0 and G:
        phase = rng.uniform(0, period, G)
        t = (W0 + phase[None, :] + np.arange(nper)[:, None] * period + rng.uniform(0, 5e6, (nper, G))).reshape(-1)
        nic = np.tile(np.arange(G), nper)
        mon = monitors[nic % monitors.size]
        small = bc["probe_bytes"]
        keep = t < W1
        acc.add(KIND_PROBE, nic[keep], mon[keep], t[keep], rng.uniform(2e3, 30e3, keep.sum()), small, -1, 2)
        acc.add(KIND_PROBE, mon[keep], nic[keep], t[keep] + 10e3, rng.uniform(2e3, 30e3, keep.sum()), small, -1, 2)
        for p in range(int(bc["probe_peers"])):
            peer = (np.arange(G) + rng.integers(GPUS_PER_HOST, max(GPUS_PER_HOST + 1, G), G)) % G
            ok = (peer // GPUS_PER_HOST) != (np.arange(G) // GPUS_PER_HOST)
            tp = (t + 50e3 * (p + 1)).reshape(nper, G)[:, ok].reshape(-1)
            a_ = np.tile(np.arange(G)[ok], nper)
            b_ = np.tile(peer[ok], nper)
            keep = tp < W1
            acc.add(KIND_PROBE, a_[keep], b_[keep], tp[keep], rng.uniform(2e3, 40e3, keep.sum()), small, -1, 3 + p)
            acc.add(KIND_PROBE, b_[keep], a_[keep], tp[keep] + 8e3, rng.uniform(2e3, 40e3, keep.sum()), small, -1, 3 + p)
    # metric scrapes to each host's first NIC (when the monitoring network is the RDMA one)
    if bc["monitor_on_gpu_nics"] and fab.n_hosts:
        mp = bc["monitor_period_s"] * NS
        nm = int(span // mp)
        if nm > 0:
            hosts = np.arange(fab.n_hosts)
            phase = rng.uniform(0, mp, hosts.size)
            t = (W0 + phase[None, :] + np.arange(nm)[:, None] * mp).reshape(-1)
            h = np.tile(hosts, nm)
            keep = t < W1
            acc.add(KIND_MONITOR, monitors[h[keep] % monitors.size], h[keep] * GPUS_PER_HOST, t[keep],
                    rng.uniform(5e4, 5e5, keep.sum()), rng.integers(2_000, 60_000, keep.sum()), -1, 1)
    return acc.frame()


def slowed_by_faults(bg: dict, fab: Fabric, faults: list) -> dict:
    """The bulk background transfers (storage reads, checkpoints) crossing a degraded NIC or a congested
    switch while it is active move at its remaining bandwidth, as the jobs' flows do
    (execution.link_factor, the same ECMP paths): a congested switch slows every flow through it, not
    only the training jobs'. Probes, heartbeats and scrapes are latency-bound and stay as drawn."""
    from fleetscope.sim.execution import link_factor

    net = [f for f in faults if f.kind in ("degraded_nic", "congested_switch")]
    if not net or len(bg["src"]) == 0:
        return bg
    bulk = np.isin(bg["kind"], [KIND_STORAGE, KIND_CHECKPOINT])
    src, dst = bg["src"].astype(np.int64), bg["dst"].astype(np.int64)
    fh = bg["fh"].view(np.uint64)
    dur = bg["dur"].astype(np.float64)
    for f in net:
        fac = link_factor(fab, [f], src, dst, np.ones((1, 1), dtype=bool), fh)[0]
        hit = bulk & f.active(bg["start"]) & (fac < 1)
        dur = np.where(hit, dur / np.where(fac > 0, fac, 1.0), dur)
    out = dict(bg)
    out["dur"] = np.maximum(dur, 1).astype(np.int64)
    out["busy"] = out["dur"].copy()
    return out
