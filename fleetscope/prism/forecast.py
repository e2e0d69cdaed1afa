"""Step-time forecasts (docs/CONTRACT.mdstep_forecasts) and the PRISM what-if scenarios, per capture.

The Monte Carlo model of a capture (`StepModel`) samples every op slot of the step structure
(fleetscope.prism.structure) as

    duration = typical(slot) x iteration_factor(op, step) x residual(op)

- typical: the slot's median over steps on its rank (spatial: ranks differ persistently);
- iteration_factor: the median ratio of all slots of that op in one measured step, drawn as one
  measured step per sample for every op together (the part of temporal variation that every
  rank shares, e.g. a network-wide slow all-reduce; correlated across ops);
- residual: per slot, from the family fitted for that op (variability.py); a synchronizing group
  draws one residual for all its members (a collective has one transfer time).
Gaps (untraced time before an op: data loading, launch delays) are those of the drawn measured
step, like the iteration factor: they are per-iteration events (a dataloader stall, a warm-up
step) rather than per-op noise.

Scenarios: `baseline` (as measured, with KS distance and mean error against the measured
steps), `no_stragglers` (every op at the typical value of its op type over all ranks and steps:
no slow rank, no slow stage, no slow iteration; untraced gaps at their slot's median), `slow_node_worst`, and
`scale_<N>ranks`; the sweeps behind them go to step_forecast_details."""
from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from scipy import stats

from fleetscope.common import stage_imbalance as stage_compute_imbalance
from fleetscope.prism.compose import PipelineModel, replica_step_samples, step_distribution
from fleetscope.prism.schemas import SCENARIO_DETAILS, STEP_FORECASTS
from fleetscope.prism.structure import JobGraph, build_job_graph, replay_job_graph
from fleetscope.prism.variability import Dist, fit_families, hw_correlation, scaled_slots, select, temporal_ratios, variability_models
from fleetscope.verdicts import make_verdicts

MAX_PLACEMENTS = 256   # per-rank what-ifs evaluated at most (larger jobs: a representative / suspect subset)
IRREGULAR_SPREAD = 3.0  # a slot whose residual IQR exceeds this many times its op's median IQR is erratic


@dataclass
class StepModel:
    graph: JobGraph
    typ: np.ndarray                 # [n_slots] ns
    factor: np.ndarray              # [n_slots, n_steps] iteration factor of the slot's op
    resid: dict[str, Dist]          # op name -> residual model
    name_typ: dict[str, float]      # op name -> typical duration over all ranks and steps
    name_gap: dict[str, float]      # op name -> typical gap before it
    scaled: np.ndarray              # [n_slots] bool: sampled as typical x factor x residual (else replayed)
    draw_key: np.ndarray            # [n_slots] slots with one key share one residual draw
    own: np.ndarray                 # [n_slots] erratic slots: residual from their own measured steps
    res_all: np.ndarray             # [n_slots, n_steps] measured residuals (ratio / iteration factor)


def fit_step_model(g: JobGraph) -> StepModel:
    typ, ratio = temporal_ratios(g)
    names = g.slot_names()
    # a collective has one transfer time: its members share the ratio
    for m in g.group_members:
        if len(m) > 1:
            ratio[m] = ratio[m].mean(axis=0)
    factor = np.ones_like(ratio)
    resid = {}
    scaled = scaled_slots(g, typ)
    own = np.zeros(len(typ), dtype=bool)
    res_all = np.ones_like(ratio)
    for nm in np.unique(names):
        sel = names == nm
        pos = sel & scaled
        if pos.any():
            factor[sel] = np.median(ratio[pos], axis=0)
            res_all[pos] = ratio[pos] / factor[pos]
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
    name_typ = {nm: float(np.median(g.dur[names == nm])) for nm in np.unique(names)}
    name_gap = {nm: float(np.median(g.gap[names == nm])) for nm in np.unique(names)}
    # one residual per collective (one transfer time), and one per op of a TP group: TP ranks
    # synchronize inside every layer, so an op lasts as long on all of them
    sl = g.slots
    local_key = (sl["stage"].cast(pl.Utf8) + "|" + sl["dp_rank"].cast(pl.Utf8) + "|" + sl["name"] + "|" + sl["occ"].cast(pl.Utf8)).to_numpy()
    comm = g.group_is_comm[g.group_of]
    keys = np.where(comm, np.char.add("g", g.group_of.astype(str)), np.char.add("l", local_key.astype(str)))
    _, draw_key = np.unique(keys, return_inverse=True)
    return StepModel(g, typ, factor, resid, name_typ, name_gap, scaled, draw_key, own, res_all)


def sample_durations(sm: StepModel, n: int, rng: np.random.Generator, only: np.ndarray | None = None):
    """[n_slots, n] sampled (gap, dur); with `only` (bool per slot) the other slots stay at
    their typical duration and median gap."""
    g = sm.graph
    names = g.slot_names()
    J = rng.integers(0, g.dur.shape[1], n)
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
        draws = d.sample(rng, (len(ug), n))[inv]
        o = sm.own[idx]
        if o.any():  # erratic slots: a residual of their own, from a random measured step
            jo = rng.integers(0, g.dur.shape[1], (int(o.sum()), n))
            draws[o] = np.take_along_axis(sm.res_all[idx[o]], jo, axis=1)
        dur[idx] = sm.typ[idx, None] * sm.factor[idx][:, J] * draws
    gap = g.gap[:, J]  # untraced time (data loading, launch delays) of the same measured step
    if only is not None:
        gap[~only] = np.median(g.gap[~only], axis=1)[:, None]
    return gap, dur


def ideal_columns(sm: StepModel, typical: str = "median") -> tuple[np.ndarray, np.ndarray]:
    """(gap, dur) columns with every op at the typical value of its op type over all ranks and
    steps: `median` (the default: a slow stage or rank does not move it) or `mean` (what
    StragglerAnalysis averages, so part of a slow stage stays in its ideal); every gap at its
    slot's median over steps."""
    g = sm.graph
    names = g.slot_names()
    if typical == "median":
        dur = np.array([sm.name_typ[n] for n in names])[:, None]
    elif typical == "mean":
        m = {n: float(g.dur[names == n].mean()) for n in np.unique(names)}
        dur = np.array([m[n] for n in names])[:, None]
    else:
        raise ValueError(f"typical must be 'median' or 'mean', got {typical!r}")
    # gaps are not operations: each keeps its own typical value (the first op's gap is how far
    # into the step window a rank starts, e.g. while its previous step's optimizer still runs)
    gap = np.median(g.gap, axis=1)[:, None]
    return gap, dur


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


def attribution(sm: StepModel) -> tuple[float, float, list[dict]]:
    """StragglerAnalysis-style decomposition: start from the ideal (every op at its typical
    value), give one group of slots (an op type, a stage, a rank) back its measured durations
    and gaps, replay every measured step, and report mean step / ideal step."""
    g = sm.graph
    gi, di = ideal_columns(sm)
    ideal = float(replay_job_graph(g, gi, di)[0])
    S = g.dur.shape[1]
    names = g.slot_names()
    groups = [("op", nm, names == nm) for nm in np.unique(names)]
    groups += [("stage", int(s), g.stage[g.slot_rank] == s) for s in np.unique(g.stage)]
    ranks = np.arange(g.n_ranks)
    if g.n_ranks > MAX_PLACEMENTS:  # large job: the ranks whose own ops exceed their stage's most
        own = np.array([(g.dur[g.slot_rank == r] + g.gap[g.slot_rank == r]).sum(axis=0).mean() for r in ranks])
        stage_med = np.array([np.median(own[g.stage == g.stage[r]]) for r in ranks])
        ranks = np.sort(np.argsort(-(own / np.maximum(stage_med, 1)))[:MAX_PLACEMENTS])
    groups += [("rank", int(g.ranks[r]), g.slot_rank == r) for r in ranks]
    rows = []
    for kind, subj, sel in groups:
        gap = np.repeat(gi, S, axis=1)
        dur = np.repeat(di, S, axis=1)
        gap[sel], dur[sel] = g.gap[sel], g.dur[sel]
        T = replay_job_graph(g, gap, dur)
        rows.append(_detail(g.capture_id, "attribution", f"{kind}:{subj}", "restore measured", T, T.mean() / ideal))
    return ideal, float(g.measured_step_ns.mean()), rows


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
SLOW_JOB = 1.10       # measured / no_stragglers that makes a job slow (StragglerAnalysis uses 1.1)
SLOW_GROUP = 1.03     # a group whose measured durations alone slow the ideal step this much
IMBALANCE = 1.10      # a stage's typical compute over the other stages' median


def stage_imbalance(sm: StepModel) -> dict[int, float]:
    """Per stage: how much longer its typical forward/backward compute is than the other stages'
    (fleetscope.common.stage_imbalance: on the stage's least loaded replica, so one slow GPU does
    not make a stage look imbalanced)."""
    g = sm.graph
    names = g.slot_names()
    compute = np.isin(names, ["forward-compute", "backward-compute"])
    if not compute.any():
        return {int(s): 1.0 for s in np.unique(g.stage)}
    per_rank = pl.DataFrame({"rank": g.slot_rank[compute], "typ": sm.typ[compute]}).group_by("rank").agg(
        pl.col("typ").sum().alias("compute_ns"))
    ranks = per_rank["rank"].to_numpy()
    per_rank = per_rank.with_columns(stage=pl.Series(g.stage[ranks]).cast(pl.Int32), dp_rank=pl.Series(g.dp_rank[ranks]).cast(pl.Int32))
    st = stage_compute_imbalance(per_rank, value="compute_ns")
    return {int(s): (float(r) if r is not None else 1.0) for s, r in zip(st["stage"], st["ratio"])}


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


def straggler_verdicts(sm: StepModel, ideal: float, measured_mean: float, attrib: list[dict], job_id: str | None = None,
                       kernel_ns: dict[int, float] | None = None) -> pl.DataFrame:
    """Verdicts where the measured steps are far slower than no_stragglers, attributed by op type,
    stage and rank. A stage whose compute is consistently longer on all its TP groups is a
    stage-partitioning imbalance (team algorithm); a rank slower than the same stage's ranks in
    other DP replicas is a hardware suspect (operations; within a TP group the one with more
    compute-kernel time when kernel rows exist, since its TP peers only wait for it); slow
    collectives / p2p go to operations, other ops to infrastructure. Below SLOW_JOB nothing
    above info is raised."""
    g = sm.graph
    cap = g.capture_id
    S = measured_mean / ideal
    slow = S >= SLOW_JOB
    sev = (lambda x: "critical" if slow and x >= 1.25 else "warning" if slow and x >= 1.05 else "info")
    names = g.slot_names()
    imb = stage_imbalance(sm)
    imb_stages = [s for s, v in imb.items() if v >= IMBALANCE and len(imb) > 1]
    att = {r["subject"]: r["slowdown"] for r in attrib}
    rows = []
    # ranks slower than the same stage's ranks in other DP replicas
    suspects = []
    for r in range(g.n_ranks):
        x = att.get(f"rank:{g.ranks[r]}", 1.0)
        peers = [att.get(f"rank:{g.ranks[q]}", 1.0) for q in range(g.n_ranks)
                 if g.stage[q] == g.stage[r] and g.dp_rank[q] != g.dp_rank[r]]
        if x >= SLOW_GROUP and (not peers or x - max(peers) >= 0.02) and g.stage[r] not in imb_stages:
            suspects.append((r, x, max(peers) if peers else 1.0))
    if kernel_ns:
        kept = []
        for r, x, base in suspects:
            tpg = [q for q, _, _ in suspects if g.stage[q] == g.stage[r] and g.dp_rank[q] == g.dp_rank[r]]
            stage_k = [kernel_ns.get(int(g.ranks[q])) for q in range(g.n_ranks) if g.stage[q] == g.stage[r]]
            stage_k = [v for v in stage_k if v is not None]
            kr = kernel_ns.get(int(g.ranks[r]))
            if len(tpg) > 1 and kr is not None and stage_k and kr < 1.05 * float(np.median(stage_k)):
                continue  # its compute kernels are normal: it waits for a TP peer
            kept.append((r, x, base))
        suspects = kept
    for r, x, base in suspects:
        kr = (kernel_ns or {}).get(int(g.ranks[r]))
        rows.append({"detector": "prism.attribution", "scope": "rank", "subject": str(g.ranks[r]), "job_id": job_id, "capture_id": cap,
                     "metric": "slowdown_if_only_this_rank_as_measured", "value": x, "baseline": base,
                     "severity": sev(x), "team": "operations",
                     "explanation": f"rank {g.ranks[r]} (stage {g.stage[r]}, dp {g.dp_rank[r]}, tp {g.tp_rank[r]}) alone slows the ideal step "
                                    f"{x:.2f}x while the same stage in other DP replicas reaches {base:.2f}x: a slow GPU or host"
                                    + (f"; its compute kernels take {kr / 1e6:.0f} ms per step" if kr else ""),
                     "evidence": json.dumps({"compute_kernel_ns": kr})})
    for s in sorted(imb):
        x = att.get(f"stage:{s}", 1.0)
        if x < SLOW_GROUP or (s not in imb_stages and suspects):  # other stages mostly wait for a slow rank
            continue
        is_imb = s in imb_stages
        rows.append({"detector": "prism.attribution", "scope": "stage", "subject": str(s), "job_id": job_id, "capture_id": cap,
                     "metric": "slowdown_if_only_this_stage_as_measured", "value": x, "baseline": 1.0, "severity": sev(x),
                     "team": "algorithm" if is_imb else "operations",
                     "explanation": (f"stage {s} alone slows the ideal step {x:.2f}x: its forward/backward compute is {imb[s]:.2f}x "
                                     "the other stages' on every TP group: stage-partitioning imbalance, rebalance the layers"
                                     if is_imb else f"stage {s} alone slows the ideal step {x:.2f}x without a compute imbalance: look at its hosts and links"),
                     "evidence": json.dumps({"compute_ratio_vs_other_stages": imb[s]})})
    for nm in np.unique(names):
        x = att.get(f"op:{nm}", 1.0)
        if x < SLOW_GROUP:
            continue
        is_comm = bool(g.group_is_comm[g.group_of[names == nm]].any())
        compute = nm in ("forward-compute", "backward-compute")
        team = "operations" if is_comm or (compute and suspects and not imb_stages) else ("algorithm" if imb_stages and compute else "infrastructure")
        rows.append({"detector": "prism.attribution", "scope": "kernel" if g.kind == "kernel" else "function", "subject": nm,
                     "job_id": job_id, "capture_id": cap, "metric": "slowdown_if_only_this_op_as_measured", "value": x, "baseline": 1.0,
                     "severity": sev(x), "team": team,
                     "explanation": f"{nm} as measured alone slows the ideal step {x:.2f}x"
                                    + (f" (its excess sits on imbalanced stage(s) {imb_stages})" if team == "algorithm" and compute else "")
                                    + (f" (on the slow rank(s) {[int(g.ranks[r]) for r, _, _ in suspects]})" if compute and suspects and not imb_stages else "")})
    top = sorted(((v, k) for k, v in att.items()), reverse=True)[:3]
    job = {"detector": "prism.no_stragglers", "scope": "job", "subject": cap, "job_id": job_id, "capture_id": cap,
           "metric": "measured_over_no_stragglers", "value": S, "baseline": 1.0,
           "severity": "critical" if S >= 1.25 else "warning" if slow else "info",
           "team": "algorithm" if imb_stages else "operations" if suspects or S >= SLOW_JOB else "infrastructure",
           "explanation": f"measured steps average {measured_mean / 1e9:.3f} s vs {ideal / 1e9:.3f} s with every op at its typical duration "
                          f"({S:.2f}x); largest contributors: " + ", ".join(f"{k} {v:.2f}x" for v, k in top),
           "evidence": json.dumps({"attribution": {k: round(v, 4) for k, v in att.items()}})}
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
    gap, dur = sample_durations(sm, n_samples, rng)
    base = replay_job_graph(g, gap, dur)
    gi, di = ideal_columns(sm)
    ideal = float(replay_job_graph(g, gi, di)[0])
    floor = ks_noise_floor(base, len(meas), rng)
    rows = [_row(cap, "baseline", g.n_ranks, base, meas, {"ks_noise_floor": floor}),
            _row(cap, "no_stragglers", g.n_ranks, np.array([ideal]), meas, {"typical": "median per op type over ranks and steps"})]
    details = []
    details += slow_node_placement(sm)
    details += kernel_sensitivity(sm, seed=seed)
    ideal2, mmean, att = attribution(sm)
    details += att
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
    verdicts = straggler_verdicts(sm, ideal, mmean, att, job_id, compute_kernel_ns(timings.filter(pl.col("capture_id") == cap)
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
    return PrismResult(g, vm, hwc, fc, det, verdicts, png, {"baseline": base, "measured": meas}, notes)


def step_forecasts(timings: pl.DataFrame, **kw) -> pl.DataFrame:
    """The step_forecasts table for every capture in the timings frame."""
    frames = [forecast_capture(t, capture_id=str(c), plots=False, **kw).step_forecasts
              for (c,), t in timings.group_by("capture_id", maintain_order=True)]
    return pl.concat(frames)
