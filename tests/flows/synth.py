"""Small hand-built flow fixtures for the algorithm cases (not the fleet simulator): a rail-optimized
topology and jobs with PP x DP layouts whose flows follow DESIGN.md's traffic notes, with the
ground truth kept apart from what the code under test receives."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

S = 1_000_000_000
MS = 1_000_000


def topology(n_hosts: int = 8, gpus: int = 8, hosts_per_leaf: int = 4) -> pl.DataFrame:
    rows = []
    for h in range(n_hosts):
        for g in range(gpus):
            rows.append({"ip": f"10.0.{h}.{g}", "host": f"h{h:02d}", "gpu": f"h{h:02d}/gpu{g}",
                         "leaf": f"leaf-g{h // hosts_per_leaf}-r{g}", "spine": f"spine{g % 2}", "rail": g,
                         "rack": f"rack{h // hosts_per_leaf}", "pod": "pod0"})
    return pl.DataFrame(rows)


@dataclass
class Job:
    hosts: list[int]
    gpus: list[int]
    dp: int
    pp: int
    period_ns: int = 1 * S
    buckets: list[int] = field(default_factory=lambda: [1 << 20, 25 << 20, 25 << 20, 17 << 20])
    channels: int = 2
    n_micro: int = 8
    pp_bytes: int = 4 << 20
    t0_ns: int = 0
    t_end_ns: int | None = None
    phase_ns: int = 0
    slow_ip: str | None = None  # straggler GPU: its compute takes slow_factor longer in slow steps
    slow_factor: float = 1.5
    slow_steps: tuple[int, int] = (0, 0)


def _ip(h: int, g: int) -> str:
    return f"10.0.{h}.{g}"


def job_flows(job: Job, n_steps: int, rng: np.random.Generator, topo: pl.DataFrame,
              bw: float = 12.5e9, slow_links: dict | None = None) -> tuple[pl.DataFrame, dict]:
    """Flows of one job for n_steps steps and its truth {ips, pairs, steps}."""
    assert len(job.hosts) == job.dp * job.pp
    leaf = dict(zip(topo["ip"].to_list(), topo["leaf"].to_list()))
    spine = dict(zip(topo["ip"].to_list(), topo["spine"].to_list()))
    slow_links = slow_links or {}
    rows, steps, pairs = [], [], {}
    P = job.period_ns
    for g in job.gpus:
        grid = [[job.hosts[s * job.dp + d] for d in range(job.dp)] for s in range(job.pp)]
        for s in range(job.pp):
            for d in range(job.dp):
                a = _ip(grid[s][d], g)
                if s + 1 < job.pp:
                    b = _ip(grid[s + 1][d], g)
                    pairs[tuple(sorted((a, b)))] = "PP"
                if job.dp > 1:
                    b = _ip(grid[s][(d + 1) % job.dp], g)
                    if a != b:
                        pairs[tuple(sorted((a, b)))] = "DP"
    ips = sorted({ip for p in pairs for ip in p})

    def path(a, b):
        return [leaf[a]] if leaf[a] == leaf[b] else [leaf[a], spine[a], leaf[b]]

    def dur(a, b, size):
        f = 1.0
        for sw in path(a, b):
            f = max(f, slow_links.get(sw, 1.0))
        f = max(f, slow_links.get(a, 1.0), slow_links.get(b, 1.0))
        return int(size / bw * 1e9 * f)

    prev_end = {ip: None for ip in ips}
    for k in range(n_steps):
        base = job.t0_ns + job.phase_ns + k * P
        if job.t_end_ns is not None and base + P > job.t_end_ns:
            break
        slow = job.slow_ip is not None and job.slow_steps[0] <= k < job.slow_steps[1]
        extra = int((job.slow_factor - 1) * 0.6 * P) if slow else 0
        jit = int(rng.normal(0, 0.002 * P))
        # PP: one activation forward and one gradient backward per microbatch, spread over compute
        for g in job.gpus:
            for s in range(job.pp - 1):
                for d in range(job.dp):
                    a, b = _ip(job.hosts[s * job.dp + d], g), _ip(job.hosts[(s + 1) * job.dp + d], g)
                    for m in range(job.n_micro):
                        tf = base + int((0.05 + 0.25 * (m + s) / (job.n_micro + job.pp)) * P) + jit
                        tb = base + int((0.35 + 0.25 * (m + job.pp - s) / (job.n_micro + job.pp)) * P) + jit
                        rows.append((tf, tf + dur(a, b, job.pp_bytes), a, b, job.pp_bytes))
                        rows.append((tb, tb + dur(b, a, job.pp_bytes), b, a, job.pp_bytes))
        # DP: ring all-reduce per bucket at the end of the step, one flow per channel and bucket
        dp_t = base + int(0.70 * P) + extra + jit
        step_end = {}
        for g in job.gpus:
            for s in range(job.pp):
                ring = [_ip(job.hosts[s * job.dp + d], g) for d in range(job.dp)]
                if job.dp == 1:
                    continue
                t = dp_t
                for bucket in job.buckets:
                    size = int(2 * (job.dp - 1) / job.dp * bucket / job.channels)
                    longest = 0
                    for d in range(job.dp):
                        a, b = ring[d], ring[(d + 1) % job.dp]
                        for c in range(job.channels):
                            st = t + c * 2000
                            du = dur(a, b, size)
                            rows.append((st, st + du, a, b, size))
                            longest = max(longest, du + c * 2000)
                    t += longest + 20_000
                for ip in ring:
                    step_end[ip] = t - 20_000
        for ip in ips:
            e = step_end.get(ip)
            if e is None:
                continue
            st = prev_end[ip] if prev_end[ip] is not None else base
            steps.append({"ip": ip, "step": k, "start_ns": st, "end_ns": e})
            prev_end[ip] = e
    df = pl.DataFrame(rows, schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "src_ip": pl.Utf8, "dst_ip": pl.Utf8,
                                    "bytes": pl.Int64}, orient="row")
    df = df.with_columns(path=pl.struct("src_ip", "dst_ip").map_elements(
        lambda r: path(r["src_ip"], r["dst_ip"]), return_dtype=pl.List(pl.Utf8)))
    return df, {"ips": ips, "pairs": pairs, "steps": pl.DataFrame(steps)}


def fleet(jobs: list[Job], n_steps: int, seed: int = 0, n_hosts: int = 8, background: bool = True,
          slow_links: dict | None = None) -> tuple[pl.DataFrame, pl.DataFrame, list[dict]]:
    rng = np.random.default_rng(seed)
    topo = topology(n_hosts)
    frames, truths = [], []
    for j in jobs:
        f, t = job_flows(j, n_steps, rng, topo, slow_links=slow_links)
        frames.append(f)
        truths.append(t)
    flows = pl.concat(frames)
    if background:
        span = int(flows["end_ns"].max())
        n = 40
        st = np.sort(rng.integers(0, span, n))
        bg = pl.DataFrame({
            "start_ns": st, "end_ns": st + rng.integers(1 * MS, 50 * MS, n),
            # storage / checkpoint / monitoring endpoints outside the topology
            "src_ip": [f"10.0.{rng.integers(0, n_hosts)}.{rng.integers(0, 8)}" for _ in range(n)],
            "dst_ip": [f"172.16.0.{rng.integers(1, 4)}" for _ in range(n)],
            "bytes": rng.integers(1000, 1 << 26, n),
        }).with_columns(path=pl.lit(None, dtype=pl.List(pl.Utf8)))
        # one-off (aperiodic) flows between GPUs of different jobs must not merge them
        ips = [t["ips"] for t in truths]
        one_off = []
        if len(ips) >= 2:
            for i in range(2):
                s0 = int(rng.integers(0, span))
                one_off.append((s0, s0 + 5 * MS, ips[0][i], ips[1][i], 4096))
        bg2 = pl.DataFrame(one_off, schema={"start_ns": pl.Int64, "end_ns": pl.Int64, "src_ip": pl.Utf8,
                                            "dst_ip": pl.Utf8, "bytes": pl.Int64}, orient="row").with_columns(
            path=pl.lit(None, dtype=pl.List(pl.Utf8)))
        flows = pl.concat([flows, bg.cast(flows.schema), bg2.cast(flows.schema)])
    flows = flows.sort("start_ns").with_columns(source_file=pl.lit("synth"),
                                                duration_ns=pl.col("end_ns") - pl.col("start_ns"))
    return flows, topo, truths
