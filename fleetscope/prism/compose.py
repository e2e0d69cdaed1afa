"""Composition of op latency distributions into step-time distributions (PRISM III-C).

- serial work adds: the pmf of a sum is the convolution of the pmfs (`serial_sum`, FFT on a grid);
- ranks that synchronize take the maximum: the CDF of the max is the product of the CDFs
  (`parallel_max`, exact on a grid, heterogeneous ranks as (cdf, count) pairs);
- pipeline schedules (GPipe, 1F1B, interleaved 1F1B) by Monte Carlo over the schedule's
  max-plus recurrence with PP transfer times (`pipeline_end_times`), vectorized over samples;
- DP synchronization at the end: the product of the replicas' step CDFs.

`PipelineModel.from_graph` takes the per-stage structure (microbatches, schedule, per-stage
forward/backward durations, transfer time, the work before and after the pipeline) from a
capture's JobGraph; `step_distribution` runs the hierarchy above for any (tp, pp, dp) layout,
for example the same job at 65,536 ranks."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from fleetscope.prism.structure import JobGraph

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


# ---------------------------------------------------------------- grid algebra
def cdf_on_grid(samples: np.ndarray, grid: np.ndarray) -> np.ndarray:
    s = np.sort(np.asarray(samples, dtype=float))
    return np.searchsorted(s, grid, side="right") / len(s)


def serial_sum(pmfs: list[np.ndarray]) -> np.ndarray:
    """pmfs on grids with the same spacing, each starting at its own offset (the caller tracks
    offsets: the sum's grid starts at the sum of the offsets) -> pmf of the sum (FFT convolution)."""
    out = np.asarray(pmfs[0], dtype=float)
    for p in pmfs[1:]:
        n = len(out) + len(p) - 1
        nfft = 1 << (n - 1).bit_length()
        out = np.fft.irfft(np.fft.rfft(out, nfft) * np.fft.rfft(p, nfft), nfft)[:n]
        out = np.clip(out, 0, None)
    return out / out.sum()


def parallel_max(cdfs: list[np.ndarray], counts: list[int] | None = None) -> np.ndarray:
    """CDF of the max of independent variables given their CDFs on one grid: prod_i F_i^{n_i}
    (log space, so 65,536 factors stay exact)."""
    counts = counts or [1] * len(cdfs)
    logc = np.zeros_like(np.asarray(cdfs[0], dtype=float))
    with np.errstate(divide="ignore"):
        for c, n in zip(cdfs, counts):
            if n > 0:  # a class with no member does not constrain the max
                logc = logc + n * np.log(np.clip(c, 0, 1))
    return np.exp(logc)


def sample_from_cdf(grid: np.ndarray, cdf: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    """Inverse-CDF draws from a CDF tabulated on a grid (linear interpolation)."""
    c = np.maximum.accumulate(np.clip(cdf, 0, 1))
    u = rng.random(n) * c[-1]
    keep = np.concatenate([[True], np.diff(c) > 0])
    return np.interp(u, c[keep], grid[keep])


def max_of_iid_quantile(sorted_samples: np.ndarray, u: np.ndarray, k: int) -> np.ndarray:
    """Draws of the max of k iid copies of an (empirical) variable: Q(u^(1/k))."""
    x = u ** (1.0 / np.asarray(k, dtype=float)) * (len(sorted_samples) - 1)
    i = np.minimum(x.astype(np.int64), len(sorted_samples) - 2)
    lo = sorted_samples[i]
    return lo + (x - i) * (sorted_samples[i + 1] - lo)  # linear interpolation between order statistics


# ---------------------------------------------------------------- schedules
def schedule(kind: str, pp: int, m: int, vpp: int = 1) -> list[list[tuple[int, int, int]]]:
    """Per stage, its compute nodes in execution order as (is_backward, microbatch, chunk)."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {kind!r}; one of {SCHEDULES}")
    out = []
    for s in range(pp):
        if kind == "gpipe":
            out.append([(0, i, 0) for i in range(m)] + [(1, i, 0) for i in range(m)])
        elif kind == "1f1b" or vpp == 1:
            w = min(pp - s - 1, m)
            seq = [(0, i, 0) for i in range(w)]
            for i in range(m - w):
                seq += [(0, w + i, 0), (1, i, 0)]
            seq += [(1, i, 0) for i in range(m - w, m)]
            out.append(seq)
        else:  # Megatron interleaved 1F1B (microbatches in groups of pp per chunk)
            if m % pp:
                raise ValueError(f"interleaved 1F1B needs microbatches ({m}) to be a multiple of pp ({pp})")
            total = m * vpp

            def fwd(k):
                return (0, (k // (pp * vpp)) * pp + k % pp, (k // pp) % vpp)

            def bwd(k):
                return (1, (k // (pp * vpp)) * pp + k % pp, vpp - 1 - (k // pp) % vpp)
            w = min((pp - s - 1) * 2 + (vpp - 1) * pp, total)
            seq = [fwd(k) for k in range(w)]
            for i in range(total - w):
                seq += [fwd(w + i), bwd(i)]
            seq += [bwd(k) for k in range(total - w, total)]
            out.append(seq)
    return out


def _topo(sched, pp, vpp):
    """A global order of (stage, index) honoring stage order and cross-stage dependencies."""
    pos = {}
    for s, seq in enumerate(sched):
        for j, node in enumerate(seq):
            pos[(s,) + node] = j

    def dep(s, node):
        b, i, c = node
        if not b:
            if s > 0:
                return (s - 1, 0, i, c)
            return (pp - 1, 0, i, c - 1) if c > 0 else None
        if s < pp - 1:
            return (s + 1, 1, i, c)
        return (0, 1, i, c + 1) if c < vpp - 1 else (s, 0, i, c)
    head = [0] * pp
    done = set()
    order = []
    progress = True
    while progress:
        progress = False
        for s in range(pp):
            while head[s] < len(sched[s]):
                node = sched[s][head[s]]
                d = dep(s, node)
                if d is not None and d not in done:
                    break
                order.append((s, head[s], d, d is not None and d[0] != s))
                done.add((s,) + node)
                head[s] += 1
                progress = True
    if len(order) != sum(len(x) for x in sched):
        raise ValueError("pipeline schedule deadlocks (a node waits on one that never runs)")
    return order, pos


def pipeline_end_times(sched, durations, p2p, pp: int, vpp: int = 1, start: np.ndarray | None = None) -> np.ndarray:
    """Max-plus recurrence of a pipeline schedule over S samples at once.
    durations[s][j]: [S] duration of stage s's j-th node; p2p: [S] (or scalar) transfer time
    between neighbouring stages; start: [pp, S] when each stage can begin. Returns [pp, S]
    end time of each stage's last node: node start = max(previous node on the stage ends,
    its producer ends + p2p)."""
    order, pos = _topo(sched, pp, vpp)
    S = np.shape(durations[0][0])[0]
    ends = [[None] * len(seq) for seq in sched]
    last = [np.zeros(S) if start is None else start[s].copy() for s in range(pp)]
    for s, j, d, cross in order:
        t = last[s]
        if d is not None:
            e = ends[d[0]][pos[d]]
            t = np.maximum(t, e + p2p) if cross else np.maximum(t, e)
        e = t + durations[s][j]
        ends[s][j] = e
        last[s] = e
    return np.stack(last)


# ---------------------------------------------------------------- hierarchical model
@dataclass
class PipelineModel:
    """Per-stage typical durations (ns) and variability of a job, reusable at other layouts.

    X_fwd/X_bwd: sorted draws of one rank's duration ratio (spatial x temporal residual) for
    forward / backward compute; step_factor: [n_steps] iteration-level factor shared by every
    rank (what makes a whole step slow); pre/post: per stage, sorted draws (ns) of the work
    before the first forward and after the last backward (collectives, optimizer, gaps), as
    [ranks of the stage, measured steps] so a draw keeps the step of the shared factor."""
    pp: int
    microbatches: int
    vpp: int
    schedule: str
    tp: int
    dp: int
    fwd_ns: np.ndarray        # [pp]
    bwd_ns: np.ndarray        # [pp]
    p2p_ns: float
    X_fwd: np.ndarray
    X_bwd: np.ndarray
    step_factor: np.ndarray
    pre: list[np.ndarray]
    post: list[np.ndarray]
    slow_factor: dict = field(default_factory=dict)  # op kind -> ratio of its p95 to p50

    @property
    def n_ranks(self) -> int:
        return self.pp * self.tp * self.dp

    @classmethod
    def from_graph(cls, g: JobGraph, n_draws: int = 200_000, seed: int = 0) -> "PipelineModel":
        from fleetscope.prism.variability import fit_families, select
        names = g.slot_names()
        lay = g.layout
        pp, m, vpp = int(lay.get("pp", 1)), int(lay.get("microbatches", 1)), int(lay.get("vpp") or 1)
        sched = lay.get("schedule", "1f1b")
        if sched not in SCHEDULES:
            sched = "1f1b"
        stage = g.stage[g.slot_rank]
        rng = np.random.default_rng(seed)
        typ_slot = np.median(g.dur, axis=1)
        fwd, bwd, X, sfac = np.zeros(pp), np.zeros(pp), {}, np.ones(g.dur.shape[1])
        for kind, arr in (("forward-compute", fwd), ("backward-compute", bwd)):
            sel = names == kind
            if not sel.any():
                raise ValueError(f"capture {g.capture_id} has no {kind} ops: no pipeline to model")
            for s in range(pp):
                arr[s] = np.median(g.dur[sel & (stage == s)])
            # spatial: each rank's typical relative to its stage; temporal: residual after the
            # iteration-level factor shared by all ranks
            stage_typ = arr[stage[sel]]
            spatial = typ_slot[sel] / stage_typ
            ratio = g.dur[sel] / np.maximum(typ_slot[sel], 1)[:, None]
            f = np.median(ratio, axis=0)
            sfac = sfac * f if kind == "forward-compute" else sfac  # forward and backward move together
            resid = (ratio / f[None, :]).ravel()
            fr = fit_families(resid)
            d = fr[select(fr)][0]
            sp = spatial[rng.integers(0, len(spatial), n_draws)]
            X[kind] = np.sort(sp * d.sample(rng, n_draws))
        p2p_sel = np.isin(names, [n for n in np.unique(names) if ("send" in n or "recv" in n)])
        p2p = float(np.median(g.dur[p2p_sel])) if p2p_sel.any() else 0.0
        pre, post = [], []
        pos = g.slots["pos"].to_numpy()
        for s in range(pp):
            ranks = np.unique(g.slot_rank[stage == s])
            pres, posts = [], []
            for r in ranks:
                on = g.slot_rank == r
                comp = on & np.isin(names, ["forward-compute", "backward-compute"])
                if not comp.any():
                    continue
                first, lastp = pos[comp].min(), pos[comp].max()
                local = on & ~p2p_sel
                b = local & (pos < first)
                a = local & (pos > lastp)
                pres.append((g.gap[b] + g.dur[b]).sum(axis=0) + g.gap[comp & (pos == first)].sum(axis=0))
                posts.append((g.gap[a] + g.dur[a]).sum(axis=0))
            pre.append(np.stack(pres) if pres else np.zeros((1, g.dur.shape[1])))
            post.append(np.stack(posts) if posts else np.zeros((1, g.dur.shape[1])))
        slow = {k: float(np.quantile(v, 0.95) / np.quantile(v, 0.5)) for k, v in X.items()}
        return cls(pp, m, vpp, sched, int(lay.get("tp", 1)), int(lay.get("dp", 1)), fwd, bwd, p2p,
                   X["forward-compute"], X["backward-compute"], sfac, pre, post, slow)

    def at_layout(self, tp: int | None = None, pp: int | None = None, dp: int | None = None,
                  microbatches: int | None = None, schedule: str | None = None, vpp: int | None = None) -> "PipelineModel":
        """The same job at another layout. A different pp re-partitions the layers evenly: per
        stage work scales by old_pp/new_pp (mean per-stage durations), pre/post stay per stage."""
        new = replace(self)
        if pp is not None and pp != self.pp:
            k = self.pp / pp
            new.pp = pp
            new.fwd_ns = np.full(pp, self.fwd_ns.mean() * k)
            new.bwd_ns = np.full(pp, self.bwd_ns.mean() * k)
            new.pre = [self.pre[min(s, self.pp - 1)] if s == 0 else self.pre[min(1, self.pp - 1)] for s in range(pp)]
            new.post = [self.post[0]] + [self.post[min(1, self.pp - 1)]] * (pp - 1)
        for k, v in (("tp", tp), ("dp", dp), ("microbatches", microbatches), ("schedule", schedule), ("vpp", vpp)):
            if v is not None:
                setattr(new, k, v)
        return new


def replica_step_samples(model: PipelineModel, n: int, rng: np.random.Generator, factor_idx: np.ndarray,
                         slow: dict | None = None, variability: bool = True) -> np.ndarray:
    """One DP replica's step time (pipeline + its pre/post work), n samples, each with the shared
    iteration factor model.step_factor[factor_idx]. A TP group's op takes the max over its tp
    ranks (drawn exactly as Q(u^(1/tp))). slow: {(stage, tp_pos): factor} ranks of this replica
    that run every compute op `factor` times slower (slow-node placement)."""
    pp, m, vpp, tp = model.pp, model.microbatches, model.vpp, model.tp
    sched = schedule(model.schedule, pp, m, vpp)
    f = model.step_factor[factor_idx] if variability else np.ones(n)
    slow = slow or {}
    durs = []
    for s in range(pp):
        row = []
        n_slow = [k for (st, _), k in slow.items() if st == s]
        for b, _, _ in sched[s]:
            X = model.X_bwd if b else model.X_fwd
            base = (model.bwd_ns if b else model.fwd_ns)[s] / vpp
            if variability:
                x = max_of_iid_quantile(X, rng.random(n), tp - len(n_slow)) if tp > len(n_slow) else np.zeros(n)
                for k in n_slow:
                    x = np.maximum(x, k * X[rng.integers(0, len(X), n)])
            else:
                x = np.full(n, max([1.0] + n_slow))
            row.append(base * f * x)
        durs.append(row)
    if variability:  # a rank of the stage, in the same measured step as the shared factor
        pre = np.stack([p[rng.integers(0, p.shape[0], n), factor_idx] for p in model.pre])
        post = np.stack([p[rng.integers(0, p.shape[0], n), factor_idx] for p in model.post])
    else:
        pre = np.stack([np.full(n, np.median(p)) for p in model.pre])
        post = np.stack([np.full(n, np.median(p)) for p in model.post])
    ends = pipeline_end_times(sched, durs, model.p2p_ns, pp, vpp, start=pre)
    return (ends + post).max(axis=0)


def step_distribution(model: PipelineModel, n_samples: int = 10_000, n_pipeline: int = 100_000, seed: int = 0,
                      slow_replica: dict | None = None, grid_points: int = 4096) -> np.ndarray:
    """n_samples draws of the step time of the whole job (dp replicas of tp x pp ranks).

    Hierarchy (PRISM Table I): TP by exact max of iid ranks per op, PP by Monte Carlo of the
    schedule (n_pipeline replica samples), DP by the product of the replicas' CDFs on a grid,
    conditioned on the shared iteration factor (replicas are independent given it). A replica
    holding the slow ranks of `slow_replica` ({(stage, tp_pos): factor}) enters the product once."""
    rng = np.random.default_rng(seed)
    nf = len(model.step_factor)
    fi = np.arange(n_pipeline) % nf
    T = replica_step_samples(model, n_pipeline, rng, fi)
    Ts = replica_step_samples(model, n_pipeline, rng, fi, slow=slow_replica) if slow_replica else None
    lo, hi = T.min(), max(T.max(), Ts.max() if Ts is not None else 0)
    grid = np.linspace(lo, hi * 1.0001, grid_points)
    cdf = np.zeros(grid_points)
    for j in range(nf):
        sel = fi == j
        c = [cdf_on_grid(T[sel], grid)]
        k = [model.dp - (1 if Ts is not None else 0)]
        if Ts is not None:
            c.append(cdf_on_grid(Ts[sel], grid))
            k.append(1)
        cdf += parallel_max(c, k) / nf
    return sample_from_cdf(grid, cdf, rng, n_samples)
