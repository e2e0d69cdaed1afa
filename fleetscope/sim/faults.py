"""Fault injection for the fleet simulator: parse the spec, draw places, times and magnitudes.

Spec: comma-separated `kind[:count]`, e.g. "congested_switch:1,degraded_nic:1,slow_gpu:1";
`random[:n]` draws n kinds (per seed) from the faults flow records can show; "", "none" or
"healthy" give a healthy fleet (benign events such as launches, checkpoints, dataloader stalls and
finishes still happen: they are not faults).

Places and times are drawn per seed: any job (not the biggest first), any GPU or NIC of it, a leaf
or a spine carrying its traffic; a fault may start anywhere in the window, end inside it or last
past it, or be there all along (a misconfiguration, a card that was slow before the window).

magnitude (column `unit` says which):
- factor   slow_gpu, throttled_racks, nvlink_down: compute time multiplier of the GPUs it touches;
           straggler: mean extra compute share of its rank (varies step to step)
- bw_frac  congested_switch, degraded_nic: remaining bandwidth fraction of flows crossing it
- seconds  gc_stall (per pause), slow_dataloader (per dataloader next()), sync_in_forward (per
           forward microbatch), flapping_link (total time the link was down)
- nics     nic_overload: NICs per host the job's traffic goes through (1)
- none     hang (the rank stops; the job makes no progress afterwards)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetscope.sim.fabric import GPUS_PER_HOST, HOSTS_PER_RACK, Fabric, mix
from fleetscope.sim.jobs import JobSpec, dp_plan, pp_pairs

KINDS = {
    # kind: (scope, unit, team)
    "slow_gpu": ("gpu", "factor", "operations"),
    "congested_switch": ("switch", "bw_frac", "operations"),
    "degraded_nic": ("link", "bw_frac", "operations"),
    "flapping_link": ("link", "seconds", "operations"),
    "straggler": ("gpu", "factor", "operations"),
    "nic_overload": ("job", "nics", "algorithm"),
    "nvlink_down": ("host", "factor", "operations"),
    "gc_stall": ("gpu", "seconds", "algorithm"),
    "sync_in_forward": ("job", "seconds", "algorithm"),
    "slow_dataloader": ("host", "seconds", "algorithm"),
    "hang": ("gpu", "none", "operations"),
    "throttled_racks": ("rack", "factor", "operations"),
}
NETWORK = {"congested_switch", "degraded_nic", "flapping_link"}
COMPUTE = {"slow_gpu", "nvlink_down", "throttled_racks"}
# what `random` draws from: faults whose effect shows in flow records
FLOW_KINDS = ["congested_switch", "degraded_nic", "slow_gpu", "straggler", "flapping_link", "nic_overload"]
HEALTHY = ("", "none", "healthy")


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
    gpu_mask: np.ndarray | None = None     # compute / dataloader / gc / straggler: GPUs touched
    endpoint: int | None = None            # degraded_nic, flapping_link
    switch: int | None = None              # congested_switch
    p_step: float = 1.0                    # gc_stall: share of steps with a pause
    ranks: list[int] = field(default_factory=list)  # ranks of job_id the fault names
    flaps: list[tuple[int, int]] = field(default_factory=list)   # flapping_link: down intervals
    retrans_mult: float = 1.0              # degraded_nic by errors: more retransmission splits

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
    if spec.lower() in HEALTHY:
        return []
    out = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        kind, _, cnt = part.partition(":")
        kind = kind.strip()
        if kind not in KINDS and kind != "random":
            raise ValueError(f"unknown fault kind {kind!r} in --faults {spec!r}; known kinds: random, "
                             f"{', '.join(sorted(KINDS))}")
        try:
            n = int(cnt) if cnt.strip() else 1
        except ValueError:
            raise ValueError(f"fault count must be an integer in {part!r} (e.g. {kind}:1)") from None
        if n < 0:
            raise ValueError(f"fault count must be >= 0 in {part!r}")
        out.append((kind, n))
    return out


def _expand_random(want: list[tuple[str, int]], rng: np.random.Generator) -> list[tuple[str, int]]:
    out = []
    for kind, n in want:
        if kind != "random":
            out.append((kind, n))
            continue
        kinds = list(rng.permutation(FLOW_KINDS))
        while len(kinds) < n:
            kinds += list(rng.permutation(FLOW_KINDS))
        out += [(str(k), 1) for k in kinds[:n]]
    return out


def _window_time(rng: np.random.Generator, window: tuple[int, int], all_along_p: float = 0.0) -> tuple[int, int]:
    W0, W1 = window
    span = W1 - W0
    if rng.random() < all_along_p:
        return int(W0 - rng.uniform(0.1, 1.0) * span), W1 + 1
    start = int(W0 + rng.uniform(0.1, 0.6) * span)
    end = W1 + 1 if rng.random() < 0.4 else int(min(W1 + 1, start + rng.uniform(0.3, 0.9) * span))
    return start, max(end, start + int(0.15 * span))


def _live(job: JobSpec, window: tuple[int, int]) -> tuple[int, int]:
    """The part of the window the job runs in: from its first step when it launches inside the window,
    to its stop or crash. A fault on the job's GPU, NIC or switch is drawn there: a switch congested only
    after the one job crossing it had crashed carries no traffic to congest (demo seed 671's spine: no
    job affected, nothing any measurement could name)."""
    lo = job.start_ns if job.launch_ns is not None else window[0]
    hi = min(x for x in (job.stop_ns, job.crash_ns, window[1]) if x is not None)
    return (int(lo), int(hi)) if hi > lo else window


def choose_faults(spec: str | None, jobs: list[JobSpec], fab: Fabric, rng: np.random.Generator,
                  window: tuple[int, int]) -> list[Fault]:
    """Draw a subject, a time span and a magnitude for each requested fault. Each fault goes to a
    different job where possible (jobs running through the whole window first, in random order)."""
    want = _expand_random(parse_spec(spec), rng)
    # a hang ends its job's traffic: place it first, and keep the other faults off its job where possible
    want = [w for w in want if w[0] == "hang"] + [w for w in want if w[0] != "hang"]
    if not want:
        return []
    if not jobs:
        raise ValueError(f"faults {spec!r} need a job to act on, but a fleet of {fab.n_hosts} host(s) has none "
                         f"(a job needs >= 2 hosts)")
    W0, W1 = window
    hosts = fab.host_name
    whole = [i for i, j in enumerate(jobs) if j.launch_ns is None and j.stop_ns is None and j.crash_ns is None]
    rest = [i for i in range(len(jobs)) if i not in whole]
    pref = [int(i) for i in rng.permutation(whole)] + [int(i) for i in rng.permutation(rest)] if rest else \
        [int(i) for i in rng.permutation(whole)]
    used: list[int] = []
    faults: list[Fault] = []
    switches_used: set[int] = set()

    hung: set[int] = set()

    def next_job(ok=lambda j: True) -> int:
        for i in pref:
            if i not in used and ok(jobs[i]):
                used.append(i)
                return i
        cand = [i for i in pref if ok(jobs[i]) and i not in hung] or [i for i in pref if ok(jobs[i])] or pref
        return cand[len(faults) % len(cand)]

    for kind, count in want:
        for _ in range(count):
            fid = f"F{len(faults):03d}"
            scope = KINDS[kind][0]
            ji = next_job((lambda j: j.nic_overload is False) if kind == "nic_overload" else (lambda j: True))
            job = jobs[ji]
            start, end = _window_time(rng, _live(job, window), 0.2 if kind in ("slow_gpu", "degraded_nic", "straggler") else 0.0)
            g_mask = np.zeros(fab.n_gpus, bool)
            f = Fault(fid, kind, scope, "", start, end, 0.0, job_idx=ji, job_id=job.job_id)
            if kind == "hang":
                hung.add(ji)
            if kind in ("slow_gpu", "straggler", "gc_stall", "hang"):
                g = int(rng.choice(job.gpus))
                g_mask[g] = True
                f.ranks = [int(np.nonzero(job.gpus == g)[0][0])]
                f.subject = str(fab.ip[g])
                f.ips = [f.subject]   # not hosts: that would name every GPU of the host
                if kind == "slow_gpu":
                    f.magnitude = round(float(rng.uniform(1.15, 1.5)), 3)
                elif kind == "straggler":
                    f.magnitude = round(float(rng.uniform(0.1, 0.35)), 3)
                elif kind == "gc_stall":
                    f.magnitude, f.p_step = round(float(rng.uniform(0.2, 0.35)), 3), 0.5
                else:
                    f.magnitude = 0.0
            elif kind == "nvlink_down":
                h = int(rng.choice(job.hosts))
                g_mask[h * GPUS_PER_HOST:(h + 1) * GPUS_PER_HOST] = True
                f.subject, f.magnitude, f.hosts = str(hosts[h]), 1.25, [str(hosts[h])]
            elif kind == "throttled_racks":
                h = int(rng.choice(job.hosts))
                r = h // HOSTS_PER_RACK
                hs = np.arange(r * HOSTS_PER_RACK, min((r + 1) * HOSTS_PER_RACK, fab.n_hosts))
                for x in hs:
                    g_mask[x * GPUS_PER_HOST:(x + 1) * GPUS_PER_HOST] = True
                f.subject, f.magnitude, f.hosts = f"rack{r:03d}", round(float(rng.uniform(1.2, 1.35)), 3), [str(hosts[x]) for x in hs]
                f.job_id = None   # a rack can hold several jobs
            elif kind == "sync_in_forward":
                g_mask[job.gpus] = True
                f.subject, f.magnitude, f.start_ns, f.end_ns = job.job_id, 0.004, W0 - 1, W1 + 1   # a code bug: there all along
            elif kind == "slow_dataloader":
                g0 = job.rank_gpu(np.arange(job.tp), 0, 0)     # first stage, first DP replica
                h = int(g0[0] // GPUS_PER_HOST)
                g_mask[h * GPUS_PER_HOST:(h + 1) * GPUS_PER_HOST] = True
                f.subject, f.magnitude, f.hosts = str(hosts[h]), 0.04, [str(hosts[h])]
            elif kind == "nic_overload":
                # a launch config (NCCL_IB_HCA naming one device): every channel of a host through one NIC
                job.nic_overload = True
                nics = np.unique(job.nic_of(job.gpus))
                f.subject, f.magnitude, f.ips = job.job_id, 1.0, [str(fab.ip[n]) for n in nics]
                f.start_ns, f.end_ns = min(job.start_ns, W0) - 1, W1 + 1
            elif kind in ("degraded_nic", "flapping_link"):
                nics = _busy_nics(job)
                e = int(rng.choice(nics))
                f.endpoint, f.subject, f.ips = e, str(fab.ip[e]), [str(fab.ip[e])]
                if kind == "degraded_nic":
                    if rng.random() < 0.5:       # link trained down (400 -> 200 or 100 Gb/s)
                        f.magnitude = float(rng.choice([0.25, 0.5]))
                    else:                        # bit errors: lower goodput and retransmissions
                        f.magnitude = round(float(rng.uniform(0.3, 0.6)), 3)
                        f.retrans_mult = float(rng.uniform(5, 20))
                else:
                    n = int(rng.integers(2, 7))
                    t0 = np.sort(rng.uniform(f.start_ns, min(f.end_ns, W1), n))
                    d = rng.uniform(0.2e9, 2e9, n)
                    f.flaps = [(int(a), int(a + b)) for a, b in zip(t0, d)]
                    f.magnitude = round(float(d.sum() / 1e9), 3)
            elif kind == "congested_switch":
                sw = _busy_switch(job, fab, rng, switches_used)
                switches_used.add(sw)
                f.switch, f.subject = sw, str(fab.switch_name[sw])
                f.magnitude = round(float(rng.uniform(0.3, 0.6)), 3)
                f.job_id = None   # every job crossing it is hit; affected_jobs lists them
            f.gpu_mask = g_mask if g_mask.any() else None
            faults.append(f)
    return faults


def _busy_nics(job: JobSpec) -> np.ndarray:
    """NICs carrying the job's DP (or PP) traffic."""
    nics = [dp_plan(job, s)["src"].reshape(-1) for s in range(job.pp)]
    if job.pp > 1:
        nics.append(pp_pairs(job)[0].reshape(-1))
    return np.unique(np.concatenate(nics))


def _busy_switch(job: JobSpec, fab: Fabric, rng: np.random.Generator, avoid: set[int]) -> int:
    """A leaf or a spine the job's DP traffic crosses (weighted by how many hops cross it)."""
    src = np.concatenate([dp_plan(job, s)["src"].reshape(-1) for s in range(job.pp)])
    dst = np.concatenate([dp_plan(job, s)["dst"].reshape(-1) for s in range(job.pp)])
    fh = mix(src, dst, np.arange(src.size) % 7)
    ls, sp, ld = fab.path_switches(src, dst, fh)
    spines = sp[sp >= 0]
    leaves = np.concatenate([ls, ld[ld >= 0]])
    pick_spine = spines.size > 0 and rng.random() < 0.5
    cand = spines if pick_spine else leaves
    vals, cnt = np.unique(cand, return_counts=True)
    keep = ~np.isin(vals, list(avoid)) if avoid else np.ones(vals.size, bool)
    if keep.any():
        vals, cnt = vals[keep], cnt[keep]
    return int(rng.choice(vals, p=cnt / cnt.sum()))


def held_while_down(start: np.ndarray, dur: np.ndarray, src: np.ndarray, dst: np.ndarray, faults: list) -> np.ndarray:
    """Durations of transfers (start, dur in ns; src, dst endpoints) once every flapping link has held
    them: a link that is down moves nothing, so a transfer crossing it that is in flight (or starts)
    while it is down finishes that much later, whatever it carries (a pipeline hop's activation, a
    storage read). The DP collectives' stall is modelled in execution (it paces their rings)."""
    dur = np.asarray(dur, dtype=np.int64).copy()
    start = np.asarray(start, dtype=np.int64)
    for f in faults:
        if f.kind != "flapping_link" or not f.flaps:
            continue
        on = (src == f.endpoint) | (dst == f.endpoint)
        for a, b in sorted(f.flaps):          # in time order: a transfer held by one may run into the next
            hit = on & (start < b) & (start + dur > a)
            dur = np.where(hit, dur + (b - np.maximum(start, a)), dur)
    return dur
