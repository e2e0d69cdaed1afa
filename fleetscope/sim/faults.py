"""Fault injection for the fleet simulator: parse the spec, pick subjects, describe the effect.

Spec: comma-separated `kind[:count]`, e.g. "congested_switch:1,degraded_nic:1,slow_gpu:1";
"" or "none" for a healthy fleet.

magnitude (column `unit` says which):
- factor   slow_gpu, throttled_racks, nvlink_down: compute time multiplier of the GPUs it touches
- bw_frac  congested_switch, degraded_nic: remaining bandwidth fraction of flows crossing it
- seconds  gc_stall (per pause), slow_dataloader (per dataloader next(), one per microbatch on
           the first stage), sync_in_forward (per forward microbatch)
- none     hang (the rank stops; the job makes no progress afterwards)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetscope.sim.fabric import GPUS_PER_HOST, HOSTS_PER_RACK, Fabric
from fleetscope.sim.jobs import JobSpec, dp_rings

KINDS = {
    # kind: (scope, unit, team)
    "slow_gpu": ("gpu", "factor", "operations"),
    "congested_switch": ("switch", "bw_frac", "operations"),
    "degraded_nic": ("link", "bw_frac", "operations"),
    "nvlink_down": ("host", "factor", "operations"),
    "gc_stall": ("gpu", "seconds", "algorithm"),
    "sync_in_forward": ("job", "seconds", "algorithm"),
    "slow_dataloader": ("host", "seconds", "algorithm"),
    "hang": ("gpu", "none", "operations"),
    "throttled_racks": ("rack", "factor", "operations"),
}
NETWORK = {"congested_switch", "degraded_nic"}
COMPUTE = {"slow_gpu", "nvlink_down", "throttled_racks"}


@dataclass
class Fault:
    fault_id: str
    kind: str
    scope: str
    subject: str
    start_ns: int
    end_ns: int
    magnitude: float
    job_idx: int | None = None
    job_id: str | None = None
    ips: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    gpu_mask: np.ndarray | None = None     # compute / dataloader / gc: GPUs touched
    endpoint: int | None = None            # degraded_nic
    switch: int | None = None              # congested_switch
    p_step: float = 1.0                    # gc_stall: share of steps with a pause
    ranks: list[int] = field(default_factory=list)  # ranks of job_id the fault names

    def row(self) -> dict:
        scope, unit, team = KINDS[self.kind]
        return {"fault_id": self.fault_id, "kind": self.kind, "scope": self.scope, "subject": self.subject,
                "start_ns": int(self.start_ns), "end_ns": int(self.end_ns), "magnitude": float(self.magnitude),
                "job_id": self.job_id, "unit": unit, "team": team,
                "ips": "|".join(self.ips) if self.ips else None, "hosts": "|".join(self.hosts) if self.hosts else None,
                "ranks": "|".join(map(str, self.ranks)) if self.ranks else None}

    def active(self, t: np.ndarray) -> np.ndarray:
        return (t >= self.start_ns) & (t < self.end_ns)


def parse_spec(spec: str | None) -> list[tuple[str, int]]:
    spec = (spec or "").strip()
    if spec.lower() in ("", "none"):
        return []
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        kind, _, cnt = part.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r} in --faults {spec!r}; known kinds: {', '.join(sorted(KINDS))}")
        try:
            n = int(cnt) if cnt.strip() else 1
        except ValueError:
            raise ValueError(f"fault count must be an integer in {part!r} (e.g. {kind}:1)") from None
        if n < 0:
            raise ValueError(f"fault count must be >= 0 in {part!r}")
        out.append((kind, n))
    return out


def choose_faults(spec: str | None, jobs: list[JobSpec], fab: Fabric, rng: np.random.Generator,
                  window: tuple[int, int]) -> list[Fault]:
    """Pick a subject for each requested fault. Each fault goes to a different job where possible
    (largest jobs first, jobs that stop or start late last) so detectors can tell them apart."""
    want = parse_spec(spec)
    if not want:
        return []
    if not jobs:
        raise ValueError(f"faults {spec!r} need a job to act on, but a fleet of {fab.n_hosts} host(s) has none "
                         f"(a job needs >= 2 hosts)")
    W0, W1 = window
    span = W1 - W0
    hosts = fab.host_name
    # jobs that run the whole window and have a DP ring of >= 3 hosts are the clearest subjects
    pref = sorted(range(len(jobs)), key=lambda i: (jobs[i].stop_ns is not None or jobs[i].start_ns > W0,
                                                   jobs[i].dp < 3, -jobs[i].world, i))
    used: list[int] = []
    faults: list[Fault] = []

    def next_job() -> int:
        for i in pref:
            if i not in used:
                used.append(i)
                return i
        return pref[len(faults) % len(pref)]

    for kind, count in want:
        for _ in range(count):
            fid = f"F{len(faults):03d}"
            scope = KINDS[kind][0]
            ji = next_job()
            job = jobs[ji]
            start = int(W0 + rng.uniform(0.3, 0.4) * span)
            end = W1 + 1
            g_mask = np.zeros(fab.n_gpus, bool)
            f = Fault(fid, kind, scope, "", start, end, 0.0, job_idx=ji, job_id=job.job_id)
            if kind == "slow_gpu":
                g = int(rng.choice(job.gpus))
                g_mask[g] = True
                f.ranks = [int(np.nonzero(job.gpus == g)[0][0])]
                f.subject, f.magnitude = str(fab.ip[g]), round(float(rng.uniform(1.3, 1.5)), 3)
                f.ips = [f.subject]   # not hosts: that would name every GPU of the host
            elif kind == "nvlink_down":
                h = int(rng.choice(np.unique(job.gpus // GPUS_PER_HOST)))
                g_mask[h * GPUS_PER_HOST:(h + 1) * GPUS_PER_HOST] = True
                f.subject, f.magnitude, f.hosts = str(hosts[h]), 1.25, [str(hosts[h])]
            elif kind == "throttled_racks":
                h = int(rng.choice(np.unique(job.gpus // GPUS_PER_HOST)))
                r = h // HOSTS_PER_RACK
                hs = np.arange(r * HOSTS_PER_RACK, min((r + 1) * HOSTS_PER_RACK, fab.n_hosts))
                for x in hs:
                    g_mask[x * GPUS_PER_HOST:(x + 1) * GPUS_PER_HOST] = True
                f.subject, f.magnitude, f.hosts = f"rack{r:03d}", round(float(rng.uniform(1.2, 1.35)), 3), [str(hosts[x]) for x in hs]
                f.job_id = None   # a rack can hold several jobs
            elif kind == "gc_stall":
                g = int(rng.choice(job.gpus))
                g_mask[g] = True
                rank = int(np.nonzero(job.gpus == g)[0][0])
                f.subject, f.magnitude, f.p_step = str(fab.ip[g]), round(float(rng.uniform(0.2, 0.35)), 3), 0.5
                f.ips = [f.subject]   # not hosts: that would name every GPU of the host
                f.ranks = [rank]
            elif kind == "sync_in_forward":
                g_mask[job.gpus] = True
                f.subject, f.magnitude, f.start_ns = job.job_id, 0.004, W0 - 1   # a code bug: there all along
            elif kind == "slow_dataloader":
                g0 = job.rank_gpu(np.arange(job.tp), 0, 0)     # first stage, first DP replica
                h = int(g0[0] // GPUS_PER_HOST)
                g_mask[h * GPUS_PER_HOST:(h + 1) * GPUS_PER_HOST] = True
                f.subject, f.magnitude, f.hosts = str(hosts[h]), 0.04, [str(hosts[h])]
            elif kind == "hang":
                g = int(rng.choice(job.gpus))
                g_mask[g] = True
                f.subject, f.magnitude = str(fab.ip[g]), 0.0
                f.ranks = [int(np.nonzero(job.gpus == g)[0][0])]
                f.ips = [f.subject]   # not hosts: that would name every GPU of the host
            elif kind == "degraded_nic":
                src, dst = dp_rings(job)
                e = int(rng.choice(src.reshape(-1)))
                f.endpoint, f.subject, f.magnitude = e, str(fab.ip[e]), round(float(rng.uniform(0.3, 0.5)), 3)
                f.ips = [f.subject]
                f.end_ns = int(W0 + rng.uniform(0.8, 0.9) * span)
            elif kind == "congested_switch":
                src, dst = dp_rings(job)
                ls, sp, ld = fab.path_switches(src.reshape(-1), dst.reshape(-1))
                cand = sp[sp >= 0]
                if cand.size == 0:
                    cand = ls
                vals, cnt = np.unique(cand, return_counts=True)
                sw = int(vals[np.argmax(cnt)])          # the switch most of its DP hops cross
                f.switch, f.subject = sw, str(fab.switch_name[sw])
                f.magnitude = round(float(rng.uniform(0.45, 0.6)), 3)
                f.end_ns = int(W0 + rng.uniform(0.8, 0.9) * span)
                f.job_id = None   # every job crossing it is hit; affected_jobs lists them
            f.gpu_mask = g_mask if g_mask.any() else None
            faults.append(f)
    return faults
