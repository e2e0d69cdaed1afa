"""Step-time forecasts (docs/CONTRACT.md step_forecasts) and the PRISM what-if scenarios, per capture.

The variability model of a capture (`StepModel`) decomposes every op slot of the step structure
(fleetscope.prism.structure) as

    duration = typical(slot) x step_factor(op, step) x worker(rank, step) x microbatch(replica, mb) x residual

- typical: the slot's median over steps on its rank (per-worker persistent effects, and the
  microbatch position);
- step_factor: the median ratio of all slots of that op in one measured step (what every rank
  shares in a step, e.g. clocks or a network-wide slow all-reduce);
- worker: per rank and step, the median of its compute ops' remaining log ratio (a worker slowed
  from some step on is slow on all its ops in those steps);
- microbatch: per pipeline replica and microbatch, the median over the stages of the forward /
  backward compute's remaining log ratio (one sample is processed by every stage: sequence length
  moves all of them), shrunk to the variance it has beyond the noise of estimating it;
- residual: per slot, from the family fitted for that op (variability.py).

The `baseline` forecast (sample_baseline) draws whole measured steps, every op's deviation and
launch delay together, and recombines per pipeline replica the microbatch effects of a measured
(replica, step) drawn on its own. On real machines the ops of one step move together, from a
step slow everywhere to a burst of load that slows every rank at the same moment; drawing ops
(or workers, or stages) apart inflates the max over ranks (measured on real gloo jobs: +1.4 to
+8 % on the mean, benchmarks/prism_real_cases.py, docs/figures/prism.md). The per-op families and
effects drive the scenarios (`slow_node_worst`, kernel sensitivity, the hierarchical model).
`heldout_check` fits the baseline on the first half of the measured steps and scores it on the
second half, next to how far the two halves are apart.

Scenarios: `baseline` (as measured, with KS distance and mean error against the measured
steps), `no_stragglers` (fleetscope.prism.stragglers: every op at its typical duration with a
healthy op's step-to-step variation, launch delays at their typical values, one value per
measured step), `slow_node_worst`, and `scale_<N>ranks`; the sweeps behind them go to
step_forecast_details."""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy import stats

from fleetscope.prism.compose import PipelineModel, replica_step_samples, step_distribution
from fleetscope.prism.schemas import SCENARIO_DETAILS, STEP_FORECASTS
from fleetscope.prism.stragglers import SEQ_OPS, SLOW_GROUP, StragglerAnalysis, analyze_stragglers, op_types, slot_is_comm
from fleetscope.prism.structure import JobGraph, build_job_graph, replay_job_graph, subset_steps
from fleetscope.prism.variability import Dist, fit_families, hw_correlation, scaled_slots, select, temporal_ratios, variability_models
from fleetscope.findings.verdicts import make_verdicts

MAX_PLACEMENTS = 256   # per-rank what-ifs evaluated at most (larger jobs: a representative / suspect subset)
IRREGULAR_SPREAD = 3.0  # a slot whose residual IQR exceeds this many times its op's median IQR is erratic


@dataclass
class StepModel:
    graph: JobGraph
    typ: np.ndarray                 # [n_slots] ns
    factor: np.ndarray              # [n_slots, n_steps] iteration factor of the slot's op
    resid: dict[str, Dist]          # op name -> residual model
    scaled: np.ndarray              # [n_slots] bool: sampled as typical x effects x residual (else replayed)
    draw_key: np.ndarray            # [n_slots] slots with one key share one residual draw
    own: np.ndarray                 # [n_slots] erratic slots: residual from their own measured steps
    res_all: np.ndarray             # [n_slots, n_steps] measured residuals (effects removed)
    worker_eff: np.ndarray          # [n_ranks, n_steps] log effect per worker and step on its compute
    worker_slots: np.ndarray        # [n_slots] bool: compute slots of workers with an effect
    replica: np.ndarray             # [n_ranks] pipeline replica (DP rank x TP index) of each rank
    mb_slots: np.ndarray            # slot indices that carry a microbatch effect
    mb_rep: np.ndarray              # their pipeline replica
    mb_idx: np.ndarray              # their microbatch index
    mb_eff: np.ndarray              # [n_replicas, n_microbatches, n_steps] measured shared log effect of each microbatch
    res_scale: np.ndarray           # [n_slots] exponent on a slot's residual draw (1: independent residuals)


BACKFIT_ROUNDS = 3
MIN_EFFECT_SD = 0.02  # a worker or microbatch effect (std of its log) below this is residual noise


def _group_median(values: np.ndarray, gid: np.ndarray, n_groups: int) -> np.ndarray:
    """[n_groups, n_steps] median over the rows of each group, per column (step); NaN rows ignored."""
    S = values.shape[1]
    df = pl.DataFrame({"g": np.repeat(gid, S), "j": np.tile(np.arange(S), len(gid)), "v": values.ravel()}).drop_nans()
    m = df.group_by("g", "j").agg(pl.col("v").median())
    out = np.zeros((n_groups, S))
    out[m["g"].to_numpy(), m["j"].to_numpy()] = m["v"].to_numpy()
    return out


def _split_half_shrink(eff: np.ndarray, dev: np.ndarray, gid: np.ndarray, n_groups: int, half: np.ndarray,
                       pooled: bool) -> np.ndarray:
    """eff [n_groups, n_steps] (a median over each group's rows of dev) scaled around its mean to
    the variance that its group's two halves (`half`, bool per row) share: the covariance of
    their medians over steps is the variance of the true effect (their noises are independent),
    while eff's own variance also holds the noise of estimating it from a few ops. Per group, or
    over all groups with pooled."""
    a = _group_median(np.where(half[:, None], dev, np.nan), gid, n_groups)
    b = _group_median(np.where(~half[:, None], dev, np.nan), gid, n_groups)
    has = np.bincount(gid[half], minlength=n_groups) & np.bincount(gid[~half], minlength=n_groups) > 0
    mu = eff.mean(axis=1, keepdims=True)
    if pooled:
        if not has.any():
            return np.zeros_like(eff)
        ac, bc = a[has] - a[has].mean(), b[has] - b[has].mean()
        cov, v = float((ac * bc).mean()), float(eff[has].var())
        f = np.sqrt(max(cov, 0.0) / v) if v > 0 else 0.0
        m0 = float(eff[has].mean())
        return m0 + min(f, 1.0) * (eff - m0)
    ac, bc = a - a.mean(axis=1, keepdims=True), b - b.mean(axis=1, keepdims=True)
    cov = (ac * bc).mean(axis=1)
    v = eff.var(axis=1)
    f = np.where(has & (v > 0), np.sqrt(np.clip(cov, 0.0, None) / np.where(v > 0, v, 1.0)), 0.0)
    return mu + np.minimum(f, 1.0)[:, None] * (eff - mu)


def fit_step_model(g: JobGraph) -> StepModel:
    """duration = typical(slot) x step factor(op, step) x worker effect(rank, step) x microbatch
    effect(replica, microbatch) x residual (module doc). The worker and microbatch effects are
    separated by backfitting medians (a slow worker does not look like a long microbatch: the
    median over a microbatch's stages ignores it; a long microbatch does not look like a slow
    worker: the median over a worker's compute ops ignores it)."""
    typ, ratio = temporal_ratios(g)
    names = g.slot_names()
    # a collective has one transfer time: its members share the ratio
    for m in g.group_members:
        if len(m) > 1:
            ratio[m] = ratio[m].mean(axis=0)
    scaled = scaled_slots(g, typ)
    lr = np.log(np.where(scaled[:, None], np.maximum(ratio, 1e-9), 1.0))
    a = np.zeros_like(lr)
    for nm in np.unique(names):
        pos = (names == nm) & scaled
        if pos.any():
            a[names == nm] = np.median(lr[pos], axis=0)
    e = lr - a
    # worker (per step) and microbatch effects on compute
    comp = scaled & ~slot_is_comm(g)
    replica = np.unique(np.stack([g.dp_rank, g.tp_rank], axis=1), axis=0, return_inverse=True)[1].ravel()
    mbv = g.slots["microbatch"].cast(pl.Float64).to_numpy()
    mb_sel = comp & np.isin(names, SEQ_OPS) & ~np.isnan(mbv)
    mb_slots = np.flatnonzero(mb_sel)
    use_mb = len(np.unique(g.stage)) >= 2 and len(mb_slots) >= 4
    if use_mb:
        mb_group = np.unique(np.stack([replica[g.slot_rank[mb_slots]], mbv[mb_slots].astype(np.int64)], axis=1),
                             axis=0, return_inverse=True)[1].ravel()
    else:
        mb_slots, mb_group = mb_slots[:0], np.zeros(0, dtype=np.int64)
    w_slots = np.flatnonzero(comp)
    w = np.zeros((g.n_ranks, lr.shape[1]))
    mfx = np.zeros((max(int(mb_group.max()) + 1, 1) if len(mb_group) else 1, lr.shape[1]))
    for _ in range(BACKFIT_ROUNDS):
        if use_mb:
            mfx = _group_median(e[mb_slots] - w[g.slot_rank[mb_slots]], mb_group, mfx.shape[0])
        em = e.copy()
        em[mb_slots] -= mfx[mb_group]
        if len(w_slots):
            w = _group_median(em[w_slots], g.slot_rank[w_slots], g.n_ranks)
    # an effect estimated from k noisy ops carries part of their noise; sampled next to a residual
    # of its own that noise would count twice (on a whole pipeline, k times): shrink each effect
    # to the variance its two halves share
    if use_mb:  # halves: the pipeline's first and last stages
        st = g.stage[g.slot_rank[mb_slots]]
        mfx = _split_half_shrink(mfx, e[mb_slots] - w[g.slot_rank[mb_slots]], mb_group, mfx.shape[0],
                                 st <= np.median(np.unique(g.stage)), pooled=True)
    if len(w_slots):  # halves: a worker's forward and its other compute ops
        em = e.copy()
        em[mb_slots] -= mfx[mb_group]
        w = _split_half_shrink(w, em[w_slots], g.slot_rank[w_slots], g.n_ranks, names[w_slots] == "forward-compute", pooled=False)
    # effects smaller than MIN_EFFECT_SD are left to the residuals: sampled as blocks they would
    # only replay the measured steps' noise
    if use_mb and mfx.std() < MIN_EFFECT_SD:
        use_mb = False
        mfx[:] = 0.0
    w[w.std(axis=1) < MIN_EFFECT_SD] = 0.0
    # residuals around the shrunk effects (around the raw ones their per-worker sums would lose
    # the noise the shrinking gave back to them)
    e_res = e.copy()
    e_res[mb_slots] -= mfx[mb_group]
    e_res[w_slots] -= w[g.slot_rank[w_slots]]
    res_all = np.exp(e_res)
    factor = np.exp(a)
    # the residuals of one worker's compute ops are not independent (a timer that ends one op
    # late starts the next one late: on the real trace the per-step total of a worker varies less
    # than the sum of its ops' variances). Scale each worker's residual draws so that its per-step
    # total varies as measured: total variance = that of its effects + that of its residuals.
    eff_all = np.zeros_like(e)
    eff_all[mb_slots] += mfx[mb_group]
    eff_all[w_slots] += w[g.slot_rank[w_slots]]
    res_scale = np.ones(len(typ))
    for r in range(g.n_ranks):
        c = w_slots[g.slot_rank[w_slots] == r]
        if len(c) >= 2:
            sv = float(e_res[c].var(axis=1).sum())
            target = float(e[c].sum(axis=0).var() - eff_all[c].sum(axis=0).var())
            if sv > 0:
                res_scale[c] = np.sqrt(np.clip(target / sv, 1 / 16, 4.0))
    resid = {}
    own = np.zeros(len(typ), dtype=bool)
    for nm in np.unique(names):
        pos = (names == nm) & scaled
        if pos.any():
            # slots far more erratic than their siblings (a receive that sometimes queues
            # behind other traffic) keep their own residuals instead of widening the pool
            q75, q25 = np.percentile(res_all[pos], [75, 25], axis=1)
            spread = q75 - q25
            odd = spread > max(IRREGULAR_SPREAD * np.median(spread), 0.01)
            own[np.flatnonzero(pos)[odd]] = True
            pool = pos & ~own
            fits = fit_families(res_all[pool].ravel() if pool.any() else res_all[pos].ravel())
            resid[nm] = fits[select(fits)][0]
        else:
            resid[nm] = Dist("constant", {"value": 1.0})
    # one residual per collective (one transfer time), and one per op of a TP group: TP ranks
    # synchronize inside every layer, so an op lasts as long on all of them
    sl = g.slots
    local_key = (sl["stage"].cast(pl.Utf8) + "|" + sl["dp_rank"].cast(pl.Utf8) + "|" + sl["name"] + "|" + sl["occ"].cast(pl.Utf8)).to_numpy()
    comm = g.group_is_comm[g.group_of]
    keys = np.where(comm, np.char.add("g", g.group_of.astype(str)), np.char.add("l", local_key.astype(str)))
    _, draw_key = np.unique(keys, return_inverse=True)
    if not use_mb:
        mb_slots, mb_group = mb_slots[:0], mb_group[:0]
    mb_rep = replica[g.slot_rank[mb_slots]]
    mb_idx = mbv[mb_slots].astype(np.int64) if use_mb else np.zeros(0, dtype=np.int64)
    mb_eff = np.zeros((int(replica.max()) + 1, int(mb_idx.max()) + 1 if len(mb_idx) else 1, lr.shape[1]))
    if use_mb:
        first = np.unique(mb_group, return_index=True)[1]
        mb_eff[mb_rep[first], mb_idx[first]] = mfx
    return StepModel(g, typ, factor, resid, scaled, draw_key, own, res_all, w, comp & (w.std(axis=1) > 0)[g.slot_rank], replica,
                     mb_slots, mb_rep, mb_idx, mb_eff, res_scale)


def sample_durations(sm: StepModel, n: int, rng: np.random.Generator, only: np.ndarray | None = None):
    """[n_slots, n] sampled (gap, dur); with `only` (bool per slot) the other slots stay at
    their typical duration and median gap. Per sample: one measured step for the step factors,
    every worker's effect (a worker slow from some step on is slow on all its ops, and workers
    that slow down together stay together) and the untraced gaps (per-iteration events); per
    pipeline replica the microbatch effects of one measured (replica, step); a residual per slot
    (per collective)."""
    g = sm.graph
    names = g.slot_names()
    S = g.dur.shape[1]
    J = rng.integers(0, S, n)
    eff = np.log(sm.factor[:, J])
    if sm.worker_slots.any():
        ws = np.flatnonzero(sm.worker_slots)
        eff[ws] += sm.worker_eff[g.slot_rank[ws]][:, J]
    if len(sm.mb_slots):
        # a replica's microbatches take the effects of one measured (replica, step) together:
        # neighbouring microbatches of a step are not independent (timer hand-offs make them
        # anti-correlated on the real trace; a batch of long sequences makes them all long)
        n_rep, _, S_mb = sm.mb_eff.shape
        kr = rng.integers(0, n_rep, (n_rep, n))
        kj = rng.integers(0, S_mb, (n_rep, n))
        eff[sm.mb_slots] += sm.mb_eff[kr[sm.mb_rep], sm.mb_idx[:, None], kj[sm.mb_rep]]
    dur = np.repeat(sm.typ[:, None], n, axis=1)
    for nm, d in sm.resid.items():
        sel = names == nm
        if only is not None:
            sel = sel & only
        raw = np.flatnonzero(sel & ~sm.scaled)  # tiny slots: their own measured value in the drawn step
        dur[raw] = g.dur[raw][:, J]
        idx = np.flatnonzero(sel & sm.scaled)
        if not len(idx):
            continue
        ug, inv = np.unique(sm.draw_key[idx], return_inverse=True)
        draws = d.sample(rng, (len(ug), n))[inv] ** sm.res_scale[idx, None]
        o = sm.own[idx]
        if o.any():  # erratic slots: a residual of their own, from a random measured step
            jo = rng.integers(0, S, (int(o.sum()), n))
            draws[o] = np.take_along_axis(sm.res_all[idx[o]], jo, axis=1)
        dur[idx] = sm.typ[idx, None] * np.exp(eff[idx]) * draws
    gap = g.gap[:, J]  # untraced time (data loading, launch delays) of the same measured step
    if only is not None:
        gap[~only] = np.median(g.gap[~only], axis=1)[:, None]
    return gap, dur


def sample_baseline(sm: StepModel, n: int, rng: np.random.Generator):
    """[n_slots, n] (gap, dur) of the baseline forecast: each sample is one measured step (its
    step-wide factors, every worker's state, every op's deviation and launch delay, together:
    on real machines the ops of one step move together, from a whole step slow everywhere to a
    burst of load that slows every rank at the same moment, and drawing them apart inflates the
    max over ranks), with the microbatch effects of each pipeline replica swapped for those of a
    measured (replica, step) drawn on its own: a batch's sequence lengths are independent of the
    machine's state, and each microbatch's effect moves its ops on every stage together."""
    g = sm.graph
    J = rng.integers(0, g.dur.shape[1], n)
    dur = g.dur[:, J]
    if len(sm.mb_slots):
        n_rep, _, S_mb = sm.mb_eff.shape
        kr = rng.integers(0, n_rep, (n_rep, n))
        kj = rng.integers(0, S_mb, (n_rep, n))
        own = sm.mb_eff[sm.mb_rep, sm.mb_idx][:, J]
        new = sm.mb_eff[kr[sm.mb_rep], sm.mb_idx[:, None], kj[sm.mb_rep]]
        dur[sm.mb_slots] *= np.exp(new - own)
    return g.gap[:, J], dur


def sample_step_times(sm: StepModel, n: int, rng: np.random.Generator, chunk: int = 2000) -> np.ndarray:
    """n step times of the baseline forecast (sample_baseline), replayed in chunks (bounded memory)."""
    return np.concatenate([replay_job_graph(sm.graph, *sample_baseline(sm, min(chunk, n - a), rng))
                           for a in range(0, n, chunk)])


def heldout_check(g: JobGraph, n: int = 10_000, seed: int = 0) -> dict:
    """The baseline forecast fitted on the first half of the measured steps and scored on the
    second half (KS distance, mean error), next to what a perfect model would show against that
    many steps (noise floor) and how far the two halves' own distributions are apart (the
    machine's drift: no model fitted on the first half can be closer than that on average)."""
    S = len(g.steps)
    h = S // 2
    if h < 2:
        return {}
    g1, g2 = subset_steps(g, np.arange(h)), subset_steps(g, np.arange(h, S))
    rng = np.random.default_rng(seed)
    T = sample_step_times(fit_step_model(g1), n, rng)
    m1, m2 = g1.measured_step_ns, g2.measured_step_ns
    return {"heldout_ks": ks_distance(T, m2), "heldout_mean_error_pct": float(100 * (T.mean() / m2.mean() - 1)),
            "heldout_ks_noise_floor": ks_noise_floor(T, len(m2), rng), "halves_ks": ks_distance(m1, m2),
            "halves_mean_diff_pct": float(100 * (m1.mean() / m2.mean() - 1)), "n_fit": h, "n_scored": S - h}


def ks_distance(pred: np.ndarray, measured: np.ndarray) -> float:
    return float(stats.ks_2samp(pred, measured).statistic)


def ks_noise_floor(pred: np.ndarray, n_measured: int, rng: np.random.Generator, reps: int = 200) -> float:
    """Median KS distance between the prediction and n_measured draws from the prediction itself:
    the KS a perfect model would show against that few measured steps (one-sample KS against the
    prediction's empirical CDF, vectorized over the repetitions)."""
    srt = np.sort(pred)
    draws = np.sort(rng.choice(srt, (reps, n_measured)), axis=1)
    F = np.searchsorted(srt, draws, side="right") / len(srt)
    Fl = np.searchsorted(srt, draws, side="left") / len(srt)
    k = np.arange(1, n_measured + 1) / n_measured
    d = np.maximum(np.abs(k - F), np.abs(Fl - (k - 1 / n_measured))).max(axis=1)
    return float(np.median(d))


def _row(cap, scenario, n_ranks, x, measured=None, params=None, n_samples=None):
    x = np.asarray(x, dtype=float)
    r = {"capture_id": cap, "scenario": scenario, "n_ranks": int(n_ranks), "mean_ns": float(x.mean()),
         "p5_ns": float(np.percentile(x, 5)), "p50_ns": float(np.percentile(x, 50)), "p95_ns": float(np.percentile(x, 95)),
         "ks_vs_measured": None, "mean_error_pct": None, "measured_mean_ns": None,
         "n_samples": int(n_samples or len(x)), "n_measured": None, "params": json.dumps(params) if params else None}
    if measured is not None:
        r.update(ks_vs_measured=ks_distance(x, measured), mean_error_pct=float(100 * (x.mean() / measured.mean() - 1)),
                 measured_mean_ns=float(measured.mean()), n_measured=len(measured))
    return r


def _detail(cap, scenario, subject, parameter=None, x=None, slowdown=None, probability=None, rank_order=None):
    r = {"capture_id": cap, "scenario": scenario, "subject": str(subject), "parameter": parameter,
         "mean_ns": None, "p50_ns": None, "p95_ns": None, "slowdown": None if slowdown is None else float(slowdown),
         "probability": None if probability is None else float(probability), "rank_order": rank_order}
    if x is not None:
        x = np.atleast_1d(np.asarray(x, dtype=float))
        r.update(mean_ns=float(x.mean()), p50_ns=float(np.percentile(x, 50)), p95_ns=float(np.percentile(x, 95)))
    return r


# ---------------------------------------------------------------- scenarios on the capture's structure
def slow_node_placement(sm: StepModel, slow_factor: float | None = None) -> list[dict]:
    """PRISM use case I on the capture itself: everything at its typical (p50) duration, one GPU
    (rank) at the p95 of its ops' temporal models (or `slow_factor` times slower); the step time
    for every placement, and per stage and TP position the mean over the placements there."""
    g = sm.graph
    names = g.slot_names()
    gap0, dur0 = np.median(g.gap, axis=1)[:, None], sm.typ[:, None]
    base = float(replay_job_graph(g, gap0, dur0)[0])
    compute = ~g.group_is_comm[g.group_of]
    k = np.ones(g.n_slots)
    for nm, d in sm.resid.items():
        sel = names == nm
        k[sel] = slow_factor if slow_factor else float(np.quantile(sm.factor[sel], 0.95) * d.ppf(0.95) / max(d.ppf(0.5), 1e-12))
    # every rank of a small job; for a large one each (stage, TP position) once (first DP replica)
    cand = np.arange(g.n_ranks)
    if g.n_ranks > MAX_PLACEMENTS:
        _, first = np.unique(np.stack([g.stage, g.tp_rank]), axis=1, return_index=True)
        cand = np.sort(first)[:MAX_PLACEMENTS]
    cols = np.repeat(dur0, len(cand), axis=1)
    for j, r in enumerate(cand):
        sel = (g.slot_rank == r) & compute
        cols[sel, j] *= k[sel]
    T = replay_job_graph(g, np.repeat(gap0, len(cand), axis=1), cols)
    cap = g.capture_id
    rows = []
    rk = {int(j): i + 1 for i, j in enumerate(np.argsort(-T))}
    for j, r in enumerate(cand):
        rows.append(_detail(cap, "slow_node_placement", f"rank={g.ranks[r]},stage={g.stage[r]},dp={g.dp_rank[r]},tp={g.tp_rank[r]}",
                            "p95_vs_p50" if not slow_factor else f"factor={slow_factor}", T[j], T[j] / base, rank_order=rk[j]))
    for key, arr in (("stage", g.stage[cand]), ("tp", g.tp_rank[cand])):
        u = np.unique(arr)
        if len(u) < 2:
            continue
        means = np.array([T[arr == v].mean() for v in u])
        ro = {int(v): i + 1 for i, v in enumerate(u[np.argsort(-means)])}
        for v, mval in zip(u, means):
            rows.append(_detail(cap, "slow_node_placement", f"{key}={v}", "mean over placements", mval, mval / base, rank_order=ro[int(v)]))
    return rows


def kernel_sensitivity(sm: StepModel, n: int = 2000, cvs=(0.05, 0.1, 0.2, 0.4), seed: int = 0) -> list[dict]:
    """PRISM use case III: every op at its typical duration except one op type, whose slots get
    a normal variation of coefficient cv around their typical value (and, as `measured`, its own
    fitted variability); the change of the p95 step time ranks which op's variance matters most."""
    g = sm.graph
    rng = np.random.default_rng(seed)
    names = g.slot_names()
    gap0, dur0 = np.median(g.gap, axis=1)[:, None], sm.typ[:, None]
    base = float(replay_job_graph(g, gap0, dur0)[0])
    res = []
    for nm in np.unique(names):
        sel = names == nm
        if sm.typ[sel].max() <= 0:
            continue
        idx = np.flatnonzero(sel)
        ug, inv = np.unique(sm.draw_key[idx], return_inverse=True)
        for cv in cvs:
            dur = np.repeat(dur0, n, axis=1)
            z = rng.standard_normal((len(ug), n))[inv]
            dur[idx] = np.maximum(sm.typ[idx, None] * (1 + cv * z), 0)
            T = replay_job_graph(g, np.repeat(gap0, n, axis=1), dur)
            res.append((nm, f"cv={cv}", T))
        gap, dur = sample_durations(sm, n, rng, only=sel)
        res.append((nm, "measured", replay_job_graph(g, np.repeat(gap0, n, axis=1), dur)))
    rows = []
    for param in sorted({p for _, p, _ in res}):
        pts = [(nm, T) for nm, p, T in res if p == param]
        p95 = np.array([np.percentile(T, 95) for _, T in pts])
        ro = {pts[i][0]: j + 1 for j, i in enumerate(np.argsort(-p95))}
        for (nm, T), q in zip(pts, p95):
            rows.append(_detail(g.capture_id, "kernel_sensitivity", nm, param, T, q / base, rank_order=ro[nm]))
    return rows


def attribution_details(sa: StragglerAnalysis) -> list[dict]:
    """step_forecast_details rows of the what-if attribution (fleetscope.prism.stragglers): every
    op at its typical duration except one group (an op type, a stage, a DP replica, a rank) as
    measured; slowdown = its mean step over the ideal step."""
    pre = {"op_type": "op", "stage": "stage", "dp_rank": "dp", "worker": "rank"}
    return [_detail(sa.graph.capture_id, "attribution", f"{pre[r['dimension']]}:{r['subject']}", "restore measured",
                    np.array([r["slowdown"] * sa.ideal_ns]), r["slowdown"])
            for r in sa.attribution.iter_rows(named=True)]


# ---------------------------------------------------------------- scenarios on the hierarchical model
def sync_group_size(pm: PipelineModel, sizes=(1, 8, 16, 72), slow_rate: float = 0.1, slow_factor: float | None = None,
                    n: int = 20_000, seed: int = 0, cap: str = "") -> tuple[list[dict], dict]:
    """PRISM use case II: the capture's pipeline with synchronous (TP) groups of each size, every
    GPU slow with probability slow_rate (its ops at p95: slow_factor, default from the data).
    Step time relative to the same layout without variation; returns detail rows and the
    per-size slowdown samples (for the plot)."""
    rng = np.random.default_rng(seed)
    k = slow_factor or max(pm.slow_factor.values())
    rows, curves = [], {}
    for size in sizes:
        m = pm.at_layout(tp=size, dp=1)
        ref = replica_step_samples(m, 1, rng, np.zeros(1, dtype=int), variability=False)[0]
        T = _replica_with_slow_rate(m, n, rng, slow_rate, k)
        sd = T / ref
        curves[size] = sd
        for q in (0.5, 0.8, 0.95):
            rows.append(_detail(cap, "sync_group_size", f"tp={size}", f"slowdown_q{int(q * 100)}", T, float(np.quantile(sd, q))))
        for thr in (1.02, 1.05):
            rows.append(_detail(cap, "sync_group_size", f"tp={size}", f"P(slowdown>={thr})", None, None, float((sd >= thr).mean())))
    return rows, curves


def tp_node_placement(pm: PipelineModel, tp: int = 8, slow_factor: float | None = None, n: int = 5000,
                      n_pipeline: int = 20_000, seed: int = 0, cap: str = "") -> list[dict]:
    """PRISM Figure 9 on the capture's pipeline at TP `tp` (one DP replica): a node of `tp` slow
    GPUs (every op slow_factor times slower, default the data's p95/p50) placed on each pipeline
    stage, versus the same number of slow GPUs spread over the TP groups of all stages. Slowdown
    of the mean step against no slow GPU; rank_order 1 = the placement that hurts most."""
    k = slow_factor or max(pm.slow_factor.values())
    m = pm.at_layout(tp=tp, dp=1)
    ref = step_distribution(m, n, n_pipeline, seed).mean()
    cases = [(f"node@stage={s}", {(s, t): k for t in range(tp)}) for s in range(m.pp)]
    cases.append(("spread_over_tp_groups", {(i % m.pp, i // m.pp): k for i in range(tp)}))
    res = [(name, step_distribution(m, n, n_pipeline, seed, slow_replica=sl)) for name, sl in cases]
    order = {name: i + 1 for i, (name, _) in enumerate(sorted(res, key=lambda r: -r[1].mean()))}
    return [_detail(cap, "slow_node_placement", name, f"tp={tp},factor={k:.3f}", T, T.mean() / ref, rank_order=order[name])
            for name, T in res]


def _replica_with_slow_rate(m: PipelineModel, n, rng, rate, k):
    """Like replica_step_samples, with per-sample Binomial(tp, rate) slow GPUs in every stage."""
    from fleetscope.prism.compose import max_of_iid_quantile, pipeline_end_times, schedule
    sched = schedule(m.schedule, m.pp, m.microbatches, m.vpp)
    fi = rng.integers(0, len(m.step_factor), n)
    f = m.step_factor[fi]
    durs = []
    for s in range(m.pp):
        ns = rng.binomial(m.tp, rate, n)
        nf = m.tp - ns
        row = []
        for b, _, _ in sched[s]:
            X = m.X_bwd if b else m.X_fwd
            base = (m.bwd_ns if b else m.fwd_ns)[s] / m.vpp
            a = np.where(nf > 0, max_of_iid_quantile(X, rng.random(n), np.maximum(nf, 1)), 0)
            c = np.where(ns > 0, k * max_of_iid_quantile(X, rng.random(n), np.maximum(ns, 1)), 0)
            row.append(base * f * np.maximum(a, c))
        durs.append(row)
    pre = np.stack([p[rng.integers(0, p.shape[0], n), fi] for p in m.pre])
    post = np.stack([p[rng.integers(0, p.shape[0], n), fi] for p in m.post])
    return (pipeline_end_times(sched, durs, m.p2p_ns, m.pp, m.vpp, start=pre) + post).max(axis=0)


def scale_slowdown(pm: PipelineModel, ranks=(1024, 8192, 65536), n: int = 10_000, n_pipeline: int = 50_000,
                   seed: int = 0, cap: str = "") -> tuple[list[dict], dict]:
    """PRISM use case IV: the same job (tp, pp, per-stage work, variability) with dp grown to N
    ranks; the probability of each slowdown against the job at its own size (median step)."""
    own = step_distribution(pm, n, n_pipeline, seed)
    ref = float(np.median(own))
    rows, curves = [], {pm.n_ranks: own}
    for N in ranks:
        dp = N // (pm.tp * pm.pp)
        if dp < 1 or dp * pm.tp * pm.pp != N:
            continue
        T = step_distribution(pm.at_layout(dp=dp), n, n_pipeline, seed)
        curves[N] = T
        sd = T / ref
        rows.append(_detail(cap, "scale_slowdown", f"ranks={N}", "median slowdown", T, float(np.median(sd))))
        for thr in (1.01, 1.02, 1.05, 1.10):
            rows.append(_detail(cap, "scale_slowdown", f"ranks={N}", f"P(slowdown>={thr})", None, None, float((sd >= thr).mean())))
    return rows, curves


# ---------------------------------------------------------------- verdicts
SLOW_JOB = 1.10       # S (measured over ideal) that makes a job slow (StragglerAnalysis uses 1.1)
KERNEL_NORMAL = 1.05  # a rank whose compute kernels take less than this times its stage's median is not the slow GPU


def compute_kernel_ns(timings: pl.DataFrame) -> dict[int, float]:
    """Per rank: non-communication kernel time per step (median over steps), when the timings
    carry kernel rows; evidence for which GPU of a TP group is the slow one (its peers wait in
    NCCL kernels, it computes longer)."""
    if "kind" not in timings.columns:
        return {}
    k = timings.filter((pl.col("kind") == "kernel") & ~pl.col("name").str.to_lowercase().str.starts_with("nccl") & pl.col("step").is_not_null())
    if k.height == 0:
        return {}
    per = k.group_by("rank", "step").agg(pl.col("duration_ns").sum()).group_by("rank").agg(pl.col("duration_ns").median())
    return {int(r): float(v) for r, v in per.iter_rows()}


def _share(x: float) -> str:
    """A share of the slowdown for a sentence (fixing a heavy stage can overshoot the ideal, > 100 %)."""
    return "all" if x >= 0.995 else f"{100 * max(x, 0.0):.0f} %"


def straggler_verdicts(sa: StragglerAnalysis, job_id: str | None = None, kernel_ns: dict[int, float] | None = None) -> pl.DataFrame:
    """Verdicts from the what-if analysis' causes (straggler_causes), each with its share of the
    slowdown: an individually slow worker is a `rank` verdict for operations (its stage gets no
    verdict: the other DP replicas of that stage are fine); a stage slow in every DP replica
    because it computes more than the balanced stage is a `stage` verdict for algorithm
    (partitioning imbalance); microbatch compute that varies together along the pipeline is a
    sequence-length imbalance for algorithm. Op types that slow the ideal step and no cause
    explains go to operations (communication) or infrastructure (compute). Below SLOW_JOB nothing
    above info is raised."""
    g = sa.graph
    cap = g.capture_id
    sm_row = sa.summary.row(0, named=True)
    S = sm_row["slowdown"]
    # slow: S above SLOW_JOB for a reason that persists (a cause, or an op persistently slower than
    # its typical); a job whose steps only vary (a busy machine's transfers and wake-ups) is not
    slow = S >= SLOW_JOB and (sa.causes.height > 0 or sa.persistent_slowdown >= SLOW_JOB
                              or any(v >= SLOW_GROUP for v in sa.persistent_types.values()))

    def sev(share: float, alone: float) -> str:
        if not slow:
            return "info"
        if S >= 1.25 and share >= 0.5:
            return "critical"
        return "warning" if share >= 0.2 or alone >= 1.05 else "info"

    causes = sa.causes
    workers = causes.filter(pl.col("cause") == "worker")
    if kernel_ns and workers.height > 1:
        # TP peers of a slow GPU wait for it inside every layer and look as slow: the one whose
        # compute kernels are normal is only waiting
        tp_groups = workers.group_by("stage", "dp_rank").len().filter(pl.col("len") > 1)
        drop = []
        for r in workers.join(tp_groups.select("stage", "dp_rank"), on=["stage", "dp_rank"]).iter_rows(named=True):
            stage_k = [kernel_ns.get(int(q)) for q in g.ranks[g.stage == r["stage"]]]
            stage_k = [v for v in stage_k if v is not None]
            kr = kernel_ns.get(int(r["rank"]))
            if kr is not None and stage_k and kr < KERNEL_NORMAL * float(np.median(stage_k)):
                drop.append(r["rank"])
        causes = causes.filter(~((pl.col("cause") == "worker") & pl.col("rank").is_in(drop)))
    rows = []
    for c in causes.iter_rows(named=True):
        ev = json.loads(c["evidence"])
        share = c["share_of_slowdown"]
        base = {"detector": "prism.stragglers", "job_id": job_id, "capture_id": cap, "value": c["slowdown"],
                "severity": sev(share, c["slowdown"]), "team": c["team"]}
        if c["cause"] == "worker":
            kr = (kernel_ns or {}).get(int(c["rank"]))
            ev["compute_kernel_ns"] = kr
            rows.append({**base, "scope": "rank", "subject": str(c["rank"]), "metric": "slowdown_if_only_this_worker_as_measured",
                         "baseline": ev["peer_median_slowdown"],
                         "explanation": f"rank {c['rank']} (stage {c['stage']}, dp {c['dp_rank']}) alone slows the ideal step {c['slowdown']:.2f}x "
                                        f"(its compute alone {ev.get('compute_alone_slowdown', c['slowdown']):.2f}x, while the same stage's compute "
                                        f"in the other DP replicas reaches {ev['peer_median_slowdown']:.2f}x); fixing it "
                                        f"removes {_share(share)} of the slowdown ({S:.2f}x): a slow GPU or host"
                                        + (f"; its compute kernels take {kr / 1e6:.0f} ms per step" if kr else ""),
                         "evidence": json.dumps(ev)})
        elif c["cause"] == "stage_partitioning":
            rows.append({**base, "scope": "stage", "subject": str(c["stage"]), "metric": "slowdown_if_only_this_stage_as_measured",
                         "baseline": 1.0,
                         "explanation": f"stage {c['stage']} is slow in every DP replica (each of its workers alone slows the ideal step "
                                        f">= {ev['min_worker_slowdown']:.2f}x) and computes {ev['compute_vs_balanced_stage']:.2f}x the balanced "
                                        f"stage: stage-partitioning imbalance, rebalance the layers; balancing it removes {_share(share)} "
                                        f"of the slowdown ({S:.2f}x)",
                         "evidence": json.dumps(ev)})
        else:
            rows.append({**base, "scope": "job", "subject": cap, "metric": "sequence_length_imbalance", "baseline": 1.0,
                         "explanation": f"microbatch compute varies together across the stages of each pipeline ({100 * ev['icc']:.0f} % of its "
                                        f"variance shared, typical factor x{np.exp(ev['sigma_log']):.2f}): sequence-length imbalance; "
                                        f"equal-work microbatches remove {_share(share)} of the slowdown ({S:.2f}x): balance tokens per "
                                        "microbatch (packing, length-aware batching)",
                         "evidence": json.dumps(ev)})
    # op types that slow the ideal step: explained by a cause (compute) or not
    names = g.slot_names()
    comm_types = {t for n in np.unique(names[slot_is_comm(g)]) for t in op_types(n)}
    explained = causes.height > 0
    for r in sa.attribution.filter((pl.col("dimension") == "op_type") & (pl.col("slowdown") >= SLOW_GROUP)).iter_rows(named=True):
        t = r["subject"]
        is_comm = t in comm_types
        pers = sa.persistent_types.get(t)
        if pers is not None and pers < SLOW_GROUP:
            # no op of this type is persistently slow (beyond the workers named above): it varies
            # from step to step, which the ideal's typical durations leave out
            sv, team = "info", "operations" if is_comm else "infrastructure"
            why = (f" (with each op at its own median it slows the ideal step only {pers:.2f}x"
                   + (f", the transfers of rank(s) {', '.join(str(x) for x in workers['rank'].to_list())} left out" if workers.height else "")
                   + ": step-to-step variation, not a slow op)")
        elif not is_comm and explained:
            sv, team = "info", causes.sort("share_of_slowdown", descending=True)["team"][0]
            why = " (explained by the " + ", ".join(sorted(set(causes["cause"].to_list()))).replace("_", " ") + " verdicts)"
        else:
            sv, team, why = sev(r["share_added"], r["slowdown"]), "operations" if is_comm else "infrastructure", ""
        rows.append({"detector": "prism.stragglers", "scope": "kernel" if g.kind == "kernel" else "function", "subject": t,
                     "job_id": job_id, "capture_id": cap, "metric": "slowdown_if_only_this_op_as_measured", "value": r["slowdown"],
                     "baseline": 1.0, "severity": sv, "team": team,
                     "explanation": f"{t} as measured alone slows the ideal step {r['slowdown']:.2f}x ({100 * r['share_added']:.0f} % of the slowdown)" + why})
    top = causes.sort("share_of_slowdown", descending=True)
    team = top["team"][0] if top.height else ("operations" if slow else "infrastructure")
    att = sa.attribution.filter(pl.col("dimension").is_in(["op_type", "stage"])).sort("slowdown", descending=True).head(3)
    job = {"detector": "prism.no_stragglers", "scope": "job", "subject": cap, "job_id": job_id, "capture_id": cap,
           "metric": "slowdown_over_ideal", "value": S, "baseline": 1.0,
           "severity": ("critical" if S >= 1.25 else "warning") if slow else "info", "team": team,
           "explanation": f"steps average {sa.nodelay_ns.mean() / 1e9:.3f} s (untraced gaps removed; {sm_row['measured_mean_ns'] / 1e9:.3f} s "
                          f"measured) vs {sa.ideal_ns / 1e9:.3f} s with every op at its typical duration: S = {S:.2f}; "
                          + ("causes: " + ", ".join(f"{c['subject']} ({c['cause'].replace('_', ' ')}, {_share(c['share_of_slowdown'])})"
                                                    for c in top.iter_rows(named=True)) if top.height else
                             "largest contributors: " + ", ".join(f"{r['dimension']} {r['subject']} {r['slowdown']:.2f}x" for r in att.iter_rows(named=True))),
           "evidence": json.dumps({**{k: sm_row[k] for k in ("mw", "ms", "mseq", "measured_slowdown", "launch_slowdown", "ideal_ns",
                                                           "ideal_with_gaps_ns")}, "persistent_slowdown": sa.persistent_slowdown})}
    return make_verdicts([job] + rows)


# ---------------------------------------------------------------- plots
def cdf_plot(curves: dict[str, np.ndarray], title: str, xlabel: str = "step time (s)", scale: float = 1e-9,
             vlines: dict[str, float] | None = None) -> bytes:
    """Empirical CDFs as a PNG (matplotlib Agg), for the asset's metadata."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    q = np.linspace(0, 1, 501)
    for label, x in curves.items():
        x = np.asarray(x, dtype=float) * scale
        if len(x) > 501:  # draw 501 quantiles: the same curve, a fraction of the points
            ax.plot(np.quantile(x, q), q, label=label)
        else:
            x = np.sort(x)
            ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", label=label)
    for label, v in (vlines or {}).items():
        ax.axvline(v * scale, ls="--", lw=1, color="gray")
        ax.text(v * scale, 0.02, label, rotation=90, fontsize=7, va="bottom")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("cumulative probability")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


# ---------------------------------------------------------------- one call per capture
@dataclass
class PrismResult:
    graph: JobGraph
    variability_models: pl.DataFrame
    hw_correlation: pl.DataFrame
    step_forecasts: pl.DataFrame
    details: pl.DataFrame
    verdicts: pl.DataFrame
    plots: dict[str, bytes] = field(default_factory=dict)
    samples: dict[str, np.ndarray] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stragglers: StragglerAnalysis | None = None  # the what-if analysis (its frames, heatmap, ideal timeline)


def forecast_capture(timings: pl.DataFrame, hw: pl.DataFrame | None = None, capture_id: str | None = None,
                     layout: dict | None = None, n_samples: int = 10_000, seed: int = 0,
                     scale_ranks=(1024, 8192, 65536), sync_sizes=(1, 8, 16, 72), job_id: str | None = None,
                     plots: bool = True) -> PrismResult:
    """Everything PRISM gives for one capture: variability models, hw correlation, step
    forecasts (baseline, no_stragglers, slow_node_worst, scale_<N>ranks), the scenario sweeps,
    verdicts and CDF plots (PNG bytes)."""
    g = build_job_graph(timings, capture_id, layout)
    cap = g.capture_id
    rng = np.random.default_rng(seed)
    sm = fit_step_model(g)
    meas = g.measured_step_ns
    base = sample_step_times(sm, n_samples, rng)
    sa = analyze_stragglers(g)
    ideal = sa.ideal_with_gaps_ns
    floor = ks_noise_floor(base, len(meas), rng)
    rows = [_row(cap, "baseline", g.n_ranks, base, meas, {"ks_noise_floor": floor, **heldout_check(g, min(n_samples, 10_000), seed)}),
            _row(cap, "no_stragglers", g.n_ranks, sa.no_stragglers_steps, meas,
                 {"typical": "what-if: every op at its typical duration (compute at its stage-balanced typical work, "
                             "communication at its typical transfer) with the step-to-step variation a healthy op shows, "
                             "launch delays at their typical values, the causes' own effects removed; one value per measured "
                             "step, their mean = straggler_summary.ideal_with_gaps_ns",
                  "ideal_without_gaps_ns": sa.ideal_ns, "slowdown": sa.S})]
    details = []
    details += slow_node_placement(sm)
    details += kernel_sensitivity(sm, seed=seed)
    details += attribution_details(sa)
    worst = max((d for d in details if d["scenario"] == "slow_node_placement" and d["subject"].startswith("rank=")),
                key=lambda d: d["slowdown"])
    rows.append({**_row(cap, "slow_node_worst", g.n_ranks, np.array([worst["mean_ns"]])),
                 "params": json.dumps({"placement": worst["subject"], "slowdown": worst["slowdown"]})})
    curves_sync, curves_scale = {}, {}
    notes = list(g.notes)
    try:
        pm = PipelineModel.from_graph(g, seed=seed)
        details += tp_node_placement(pm, seed=seed, cap=cap)
        r1, curves_sync = sync_group_size(pm, sync_sizes, seed=seed, cap=cap)
        r2, curves_scale = scale_slowdown(pm, scale_ranks, n=n_samples, seed=seed, cap=cap)
        details += r1 + r2
        for N, T in curves_scale.items():
            if N != pm.n_ranks:
                rows.append(_row(cap, f"scale_{N}ranks", N, T, params={"tp": pm.tp, "pp": pm.pp, "dp": N // (pm.tp * pm.pp),
                                                                       "reference_median_ns": float(np.median(curves_scale[pm.n_ranks]))}))
    except ValueError as exc:  # no pipeline (no forward/backward ops): the capture-level scenarios still stand
        notes.append(f"pipeline scenarios skipped: {exc}")
    fc = STEP_FORECASTS.validate(pl.DataFrame(rows, schema={c: col.dtype.type for c, col in STEP_FORECASTS.columns.items()}))
    det = SCENARIO_DETAILS.validate(pl.DataFrame(details, schema={c: col.dtype.type for c, col in SCENARIO_DETAILS.columns.items()}))
    verdicts = straggler_verdicts(sa, job_id, compute_kernel_ns(timings.filter(pl.col("capture_id") == cap)
                                                                if "capture_id" in timings.columns else timings))
    vm = variability_models(g)
    hwc = hw_correlation(timings, hw, cap) if hw is not None else hw_correlation(timings.head(0), pl.DataFrame(), cap)
    png = {}
    if plots:
        png["step_cdf"] = cdf_plot({"measured": meas, "baseline forecast": base}, f"{cap}: step time",
                                   vlines={"no_stragglers": ideal})
        if curves_sync:
            png["sync_group_cdf"] = cdf_plot({f"TP={k}": v for k, v in curves_sync.items()}, f"{cap}: slowdown vs synchronous group size",
                                             xlabel="normalized slowdown", scale=1.0)
        if curves_scale:
            png["scale_cdf"] = cdf_plot({f"{k} ranks": v for k, v in curves_scale.items()}, f"{cap}: step time at scale")
        png["straggler_heatmap"] = sa.heatmap_png()
    return PrismResult(g, vm, hwc, fc, det, verdicts, png, {"baseline": base, "measured": meas}, notes + sa.notes[len(g.notes):], sa)


def step_forecasts(timings: pl.DataFrame, **kw) -> pl.DataFrame:
    """The step_forecasts table for every capture in the timings frame."""
    frames = [forecast_capture(t, capture_id=str(c), plots=False, **kw).step_forecasts
              for (c,), t in timings.group_by("capture_id", maintain_order=True)]
    return pl.concat(frames)
