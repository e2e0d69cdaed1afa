"""Stragglers as the what-if analysis defines them (Lin et al., "Understanding Stragglers in Large
Model Training Using What-if Analysis", OSDI'25; artifact ByteDance-Seed/StragglerAnalysis).

On the step structure of a capture (fleetscope.prism.structure: per rank the ordered op slots,
pipeline send/recv pairs, DP / embedding / model-parallel collectives, every op's intrinsic
duration with waits for peers removed) the dependency model is replayed with substituted
durations:

- measured: every op as measured, untraced gaps (launch delays, data loading) removed
  (the artifact's `step_t_nodelay`, T_ori);
- ideal: every op at its typical duration for its type, gaps removed (T_ideal). Communication:
  the median per op type of the transfer time (the artifact's choice). Compute: the work the op
  needs, spread evenly over the stages: per stage the lower median over its workers of each
  worker's mean (with two DP replicas the faster one: a slow worker does not move it, longer
  sequences do), then the mean over stages weighted by their op count (a stage-partitioning
  imbalance is spread out, as the artifact's mean over every worker does);
- S = mean T_ori / T_ideal (paper Eq. 1); attribution S_g: every op ideal except group g
  (an op type, a stage, a DP replica, a worker) as measured (Eq. 2 and 4);
- the characterization metrics as the artifact computes them: M_W = share of the slowdown that
  goes away when the top 3 % of workers (by min(S_dp, S_stage)) get ideal durations, M_S the same
  for the last stage (rem = (T_ori - T_fixed) / (T_ori - T_ideal)). Fixing a worker fixes its
  side of every transfer too (with_groups): a worker on a throttled host also moves data slowly;
- sequence-length imbalance (not in the artifact): microbatch effects shared by the stages of a
  pipeline (one sample is processed by every stage), measured as the intraclass correlation of
  the per-(step, replica, microbatch) compute ratios, and its share of the slowdown by replaying
  without those effects.

`no_stragglers` (the step_forecasts scenario, `ideal_with_gaps_ns` here) is the step the job
would show without its stragglers, comparable with measured steps and with a re-run without the
cause (no_straggler_steps): every op at its typical duration (means over steps: a step costs its
ops' tails too), with the step-to-step variation a healthy op shows, every launch delay at its
typical value per slot. A launch delay is the op's start minus the latest end of what it depends
on (the rank's earlier ops; for its first op, its own previous step), so waiting for peers is
never a delay; typical = mean over steps, then the lower median over the DP replicas of the same
stage position. What the causes found here do (a slow worker's ops and transfers, microbatch
effects) is taken out."""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from fleetscope.common import stage_imbalance
from fleetscope.prism.schemas import STRAGGLER_ATTRIBUTION, STRAGGLER_CAUSES, STRAGGLER_SUMMARY
from fleetscope.prism.structure import JobGraph, build_job_graph, is_comm_name, replay_job_graph

# verdict inputs (the thresholds the artifact uses where it has one)
SLOW_GROUP = 1.03        # the artifact decomposes a slowdown from 1.03 on; a group this slow alone matters
PEER_MARGIN = 0.02       # a worker's excess over twice its same-stage peers' (plus this) is its own
IMBALANCE = 1.10         # a stage's compute over the other stages' (median): partitioning imbalance
SEQ_ICC = 0.5            # share of the microbatch compute variance shared by a pipeline's stages
SEQ_SIGMA = 0.05         # and its size (std of the shared log factor)
TOP_WORKERS_PCT = 3      # the artifact's M_W fixes the top 3 % of workers
MAX_COLS = 2048          # replay columns per chunk (memory: n_slots x MAX_COLS x 4 B per array)
MAX_WORKERS = 256        # per-worker what-ifs on a larger job: the workers with the highest artifact score
SEQ_OPS = ("forward-compute", "backward-compute")


@dataclass
class StragglerAnalysis:
    graph: JobGraph
    ideal_dur: np.ndarray            # [n_slots] ns
    ideal_gap: np.ndarray            # [n_slots] ns, typical untraced gap (no_stragglers only)
    measured_ns: np.ndarray          # [n_steps]
    nodelay_ns: np.ndarray           # [n_steps] measured durations, gaps removed (T_ori)
    ideal_ns: float                  # T_ideal
    ideal_with_gaps_ns: float        # no_stragglers
    summary: pl.DataFrame            # straggler_summary
    attribution: pl.DataFrame        # straggler_attribution
    slowdown: pl.DataFrame           # straggler_slowdown
    causes: pl.DataFrame             # straggler_causes
    notes: list[str] = field(default_factory=list)
    expected_dur: np.ndarray | None = None  # [n_slots] ns, typical durations of no_stragglers (means: tails included)
    persistent_types: dict[str, float] = field(default_factory=dict)  # op type -> S_t with its ops at their medians, cause workers left out
    persistent_slowdown: float = 1.0  # every op at its own median over steps, over the ideal
    no_stragglers_steps: np.ndarray | None = None  # [n_steps] ns, the step without stragglers under each measured step's variation

    @property
    def S(self) -> float:
        return float(self.nodelay_ns.mean() / self.ideal_ns)

    def heatmap_png(self) -> bytes:
        return heatmap_png(self)

    def ideal_timeline(self, with_gaps: bool = False) -> dict:
        return ideal_timeline(self, with_gaps)


# ---------------------------------------------------------------- the ideal
def slot_is_comm(g: JobGraph) -> np.ndarray:
    """Communication slots (a collective or p2p by name, or synchronizing with another rank)."""
    return np.array([is_comm_name(n) for n in g.slot_names()]) | g.group_is_comm[g.group_of]


def _lower_median(col: str) -> pl.Expr:
    """The lower of the two middle values (the median of an odd count): with two DP replicas the
    faster one, so that one slow worker never sets what is typical for its stage."""
    return pl.col(col).sort().get((pl.len() - 1) // 2)


def ideal_durations(g: JobGraph, expected: bool = False) -> np.ndarray:
    """[n_slots] typical durations (module doc). Compute: per stage the lower median over its
    workers of each worker's mean over steps, spread over the stages (their mean weighted by op
    count). Communication: each slot's median over steps (`ideal_ns`), or with `expected` its mean
    (no_stragglers: the mean of a transfer, tails included, is what a step costs on average), then
    the lower median over the op type's slots: a slot that only the slow worker makes slow is not
    typical. (The artifact's median over every slot and step together sits between the two modes
    when the slow worker's collective holds half of the slots: a throttled worker of a PP2 x DP4 gloo
    job, whose stage's all-reduce all four members wait on, put ideal_ns 17 % above the re-run
    without it.)"""
    names = g.slot_names()
    comm = slot_is_comm(g)
    out = np.zeros(g.n_slots)
    if comm.any():
        if expected:
            per = pl.DataFrame({"name": names[comm], "mean": g.dur[comm].mean(axis=1)}).group_by("name").agg(_lower_median("mean"))
            m = dict(per.iter_rows())
            out[comm] = np.array([m[n] for n in names[comm]])
        else:
            per = pl.DataFrame({"name": names[comm], "med": np.median(g.dur[comm], axis=1)}).group_by("name").agg(_lower_median("med"))
            m = dict(per.iter_rows())
            out[comm] = np.array([m[n] for n in names[comm]])
    if (~comm).any():
        st = pl.DataFrame({"name": names, "rank": g.slot_rank, "stage": g.stage[g.slot_rank],
                           "mean": g.dur.mean(axis=1)}).filter(pl.Series(~comm))
        per_worker = st.group_by("name", "stage", "rank").agg(pl.col("mean").mean(), pl.len().alias("n"))
        per_stage = per_worker.group_by("name", "stage").agg(_lower_median("mean"), pl.col("n").sum())
        typ = per_stage.group_by("name").agg(((pl.col("mean") * pl.col("n")).sum() / pl.col("n").sum()).alias("typ"))
        m = dict(typ.iter_rows())
        sel = ~comm
        out[sel] = np.array([m[n] for n in names[sel]])
    return out


def _local_first(g: JobGraph) -> np.ndarray | None:
    """[n_ranks] each rank's typical launch delay of its first op, measured from its own previous
    step's end (structure: first_local_gap), or None where the capture holds no two consecutive
    steps of every rank."""
    fl = g.first_local_gap
    if fl is None or np.isnan(fl).all(axis=1).any():
        return None
    return np.nanmean(fl, axis=1)


def typical_gaps(g: JobGraph) -> np.ndarray:
    """[n_slots] each slot's typical launch delay: its mean over steps (what it adds to a step on
    average), then the lower median over the DP replicas holding the same stage position (one
    worker's slow data loading or throttled host is not typical). A delay is measured from the
    latest end of what the op depends on (structure.py), so time spent waiting for peers is not
    in it; a rank's first op from its own previous step's end where that step was captured (the
    step's own start skew then comes from the replay, no_straggler_steps)."""
    mean = g.gap.mean(axis=1)
    lf = _local_first(g)
    if lf is not None:
        mean[g.first_slot] = lf
    sl = g.slots.select("stage", "tp_rank", "pos").with_columns(mean=pl.Series(mean))
    return sl.with_columns(_lower_median("mean").over("stage", "tp_rank", "pos"))["mean"].to_numpy()


def no_straggler_steps(g: JobGraph, typical: np.ndarray, gaps: np.ndarray, cause_ranks: list[int],
                       mbe: dict | None, rounds: int = 4) -> np.ndarray:
    """[n_steps] the step without stragglers, once per measured step: every op at its typical
    duration (`typical`: means, tails included) times the variation it shows in that step
    relative to its own mean (a busy machine's wake-ups, a slow transfer: what a healthy re-run
    shows too, and what makes a step's max over ranks longer than the max of typical ops), launch
    delays at their typical values. What is a straggler's goes: a worker named as a cause, and
    every op it synchronizes with, takes the variation of its twin in another DP replica (same
    stage, TP index and position) that no cause touches; microbatch effects shared along a
    pipeline (sequence lengths) are divided out. Where the capture holds consecutive steps, each
    rank starts the step where the same what-if step ended on it (plus its own first delay): the
    order in which ranks leave a step is replayed, not taken from the measured steps, whose
    stragglers set it. The mean is `no_stragglers`."""
    mean = g.dur.mean(axis=1, keepdims=True)
    nu = np.where(mean > 0, g.dur / np.where(mean > 0, mean, 1.0), 1.0)
    if mbe is not None:
        e = mbe["effect"]
        nu[mbe["idx"]] /= np.exp(e - np.log(np.mean(np.exp(e))))
    if cause_ranks:
        m = with_groups(g, np.isin(g.ranks[g.slot_rank], cause_ranks))
        sl = g.slots.select("slot", "stage", "tp_rank", "pos", "dp_rank").with_columns(hit=pl.Series(m))
        twins = (sl.filter(pl.col("hit")).join(sl.filter(~pl.col("hit")).select("stage", "tp_rank", "pos", pl.col("dp_rank").alias("d2"),
                                                                             pl.col("slot").alias("twin")),
                                             on=["stage", "tp_rank", "pos"])
                 .sort("d2").group_by("slot").agg(pl.col("twin").first()))
        if twins.height:
            nu[twins["slot"].to_numpy()] = nu[twins["twin"].to_numpy()]
    typical = typical.copy()
    if cause_ranks:
        # ops that synchronize with a cause worker and have no untouched twin (a collective of
        # the worker's whole stage, or of every rank): the same op of the untouched groups of
        # that op type (another stage's all-reduce) gives their typical and variation; where
        # every group is touched (a collective over every rank) this capture shows the op only
        # with the straggler in it: its median over steps, without variation.
        alone = m.copy()
        if twins.height:
            alone[twins["slot"].to_numpy()] = False
        names = g.slot_names()
        for nm in np.unique(names[alone]):
            sel = alone & (names == nm)
            clean = np.flatnonzero((names == nm) & ~m)
            if len(clean):
                ref = clean[np.argsort(mean[clean, 0])[(len(clean) - 1) // 2]]   # the lower median of their means
                typical[sel] = mean[ref, 0]
                nu[sel] = nu[ref]
            else:
                med = pl.DataFrame({"g": g.group_of[sel], "m": np.median(g.dur[sel], axis=1)}).group_by("g").agg(_lower_median("m"))
                gm = dict(med.iter_rows())
                typical[sel] = np.array([gm[x] for x in g.group_of[sel]])
                nu[sel] = 1.0
    dur = typical[:, None] * nu
    gp = np.repeat(gaps[:, None], dur.shape[1], axis=1)
    if _local_first(g) is None:
        return replay_job_graph(g, gp, dur)
    local = gaps[g.first_slot][:, None]
    for _ in range(rounds):
        end = replay_job_graph(g, gp, dur, per_rank=True)      # [n_ranks, n_steps] from the step's start
        nxt = end + local                                        # where each rank starts the next step
        gp[g.first_slot] = nxt - nxt.min(axis=0)
    return replay_job_graph(g, gp, dur)


# ---------------------------------------------------------------- what-if replays
def whatif(g: JobGraph, masks: list[np.ndarray], base: np.ndarray, alt: np.ndarray) -> np.ndarray:
    """[len(masks), n_steps] step times: durations `base` except the slots of each mask at
    `alt` (both [n_slots, n_steps] or [n_slots, 1]), untraced gaps removed. Replayed in chunks of
    columns so that memory stays bounded on large captures."""
    S = g.dur.shape[1]
    # float32: the replay is bound by memory traffic; 24 bits of mantissa keep a 100 s step to ~10 us
    base = np.broadcast_to(base.astype(np.float32), (g.n_slots, S))
    alt = np.broadcast_to(alt.astype(np.float32), (g.n_slots, S))
    out = np.empty((len(masks), S))
    per = max(1, MAX_COLS // S)
    zero = np.zeros((g.n_slots, 1), dtype=np.float32)
    for a in range(0, len(masks), per):
        chunk = masks[a:a + per]
        cols = np.empty((g.n_slots, len(chunk) * S), dtype=np.float32)
        for k, m in enumerate(chunk):
            np.copyto(cols[:, k * S:(k + 1) * S], base)
            cols[m, k * S:(k + 1) * S] = alt[m]
        out[a:a + len(chunk)] = replay_job_graph(g, zero, cols).reshape(len(chunk), S)
    return out


def with_groups(g: JobGraph, mask: np.ndarray) -> np.ndarray:
    """The slots of `mask` and every slot that synchronizes with one of them: fixing a worker
    fixes its side of each transfer and collective too (a worker on a throttled host also moves
    its data slowly, and its peers' records of those transfers last as long)."""
    comm = g.group_is_comm[g.group_of] & mask
    if not comm.any():
        return mask
    return mask | np.isin(g.group_of, np.unique(g.group_of[comm]))


def _rem_add(t_ori: float, t_ideal: float, t_fix: float, t_add: float) -> tuple[float, float]:
    d = t_ori - t_ideal
    if d <= 0:
        return 0.0, 0.0
    return (t_ori - t_fix) / d, (t_add - t_ideal) / d


def op_types(name: str) -> list[str]:
    """Attribution groups of a slot: its op name; pipeline p2p ops merged per direction as the
    artifact does (a fused send/recv belongs to both directions)."""
    parts = name.split("+")
    out = set()
    for p in parts:
        if p in ("forward-send", "forward-recv"):
            out.add("forward-pp-comm")
        elif p in ("backward-send", "backward-recv"):
            out.add("backward-pp-comm")
        else:
            out.add(p)
    return sorted(out)


# ---------------------------------------------------------------- sequence-length imbalance
def microbatch_effects(g: JobGraph) -> dict | None:
    """Per (step, DP replica, TP index, microbatch): the log compute factor shared by the stages
    of that pipeline, its intraclass correlation and size. x = log(duration / the slot's mean
    over steps) minus the step's median over all compute slots (a step when everything is slow is
    not a microbatch effect); the shared effect of a microbatch is the median of x over the
    pipeline's stages and forward/backward (robust to one slow worker). None when the capture has
    no per-microbatch compute."""
    names = g.slot_names()
    mb = g.slots["microbatch"].cast(pl.Float64).to_numpy()
    sel = np.isin(names, SEQ_OPS) & ~np.isnan(mb)
    if sel.sum() < 4 or len(np.unique(g.stage)) < 2:
        return None
    idx = np.flatnonzero(sel)
    d = np.maximum(g.dur[idx], 1.0)
    x = np.log(d) - np.log(d.mean(axis=1, keepdims=True))
    x = x - np.median(x, axis=0, keepdims=True)
    n_steps = x.shape[1]
    key = np.stack([g.dp_rank[g.slot_rank[idx]], g.tp_rank[g.slot_rank[idx]], mb[idx].astype(np.int64)], axis=1)
    gid = np.unique(key, axis=0, return_inverse=True)[1].ravel()
    n_g = int(gid.max()) + 1
    # groups: (step, replica, tp, microbatch); observations: that microbatch's compute on every stage
    G = (gid[:, None] * n_steps + np.arange(n_steps)[None, :]).ravel()
    X = x.ravel()
    k = np.bincount(G, minlength=n_g * n_steps)
    gm = np.bincount(G, weights=X, minlength=n_g * n_steps) / np.maximum(k, 1)
    ok = k >= 2
    if ok.sum() < 2:
        return None
    msw = float(((X - gm[G]) ** 2).sum() / max(len(X) - ok.sum(), 1))
    kbar = float(k[ok].mean())
    msb = float(kbar * gm[ok].var(ddof=1))
    var_b = max((msb - msw) / kbar, 0.0)
    icc = var_b / (var_b + msw) if var_b + msw > 0 else 0.0
    med = pl.DataFrame({"G": G, "x": X}).group_by("G").agg(pl.col("x").median()).sort("G")
    m = np.zeros(n_g * n_steps)
    m[med["G"].to_numpy()] = med["x"].to_numpy()
    effect = m.reshape(n_g, n_steps)[gid]          # [len(idx), n_steps] the shared log factor of each slot
    return {"idx": idx, "effect": effect, "icc": float(icc), "sigma": float(math.sqrt(var_b)), "n_groups": int(ok.sum())}


# ---------------------------------------------------------------- one capture
def analyze_stragglers(graph_or_timings: JobGraph | pl.DataFrame, capture_id: str | None = None,
                       layout: dict | None = None) -> StragglerAnalysis:
    """The what-if analysis of one capture (module doc) as polars frames (schemas in
    fleetscope.prism.schemas) plus the arrays behind them."""
    g = graph_or_timings if isinstance(graph_or_timings, JobGraph) else build_job_graph(graph_or_timings, capture_id, layout)
    cap = g.capture_id
    S_steps = g.dur.shape[1]
    di = ideal_durations(g)[:, None]
    de = ideal_durations(g, expected=True)[:, None]
    gi = typical_gaps(g)[:, None]
    zero = np.zeros((g.n_slots, 1))
    measured = g.measured_step_ns
    replay_err = float(np.abs(replay_job_graph(g, g.gap, g.dur) / measured - 1).max())
    nodelay = replay_job_graph(g, zero, g.dur)
    t_ideal = float(replay_job_graph(g, zero, di)[0])
    t_ori = float(nodelay.mean())
    S = t_ori / t_ideal
    notes = list(g.notes)
    if replay_err > 0.01:
        notes.append(f"replaying the measured durations misses the measured step times by up to {100 * replay_err:.1f} %: "
                     "the what-ifs are approximate on this capture")

    names = g.slot_names()
    slot_stage = g.stage[g.slot_rank]
    slot_dp = g.dp_rank[g.slot_rank]
    # groups: op types, stages, DP replicas, then workers (each rank; on a large job the
    # MAX_WORKERS with the highest min(S_dp, S_stage), the artifact's worker score)
    types = sorted({t for n in np.unique(names) for t in op_types(n)})
    type_of = {n: set(op_types(n)) for n in np.unique(names)}
    groups: list[tuple[str, str, np.ndarray, dict]] = []
    for t in types:
        groups.append(("op_type", t, np.array([t in type_of[n] for n in names]), {}))
    for s in np.unique(g.stage):
        groups.append(("stage", str(int(s)), slot_stage == s, {"stage": int(s)}))
    for d in np.unique(g.dp_rank):
        groups.append(("dp_rank", str(int(d)), slot_dp == d, {"dp_rank": int(d)}))
    masks = [m for _, _, m, _ in groups]
    T_add = whatif(g, masks, di, g.dur)   # only the group as measured
    T_fix = whatif(g, masks, g.dur, di)   # only the group ideal
    s_stage = {int(ctx["stage"]): float(ta.mean() / t_ideal) for (dim, _, _, ctx), ta in zip(groups, T_add) if dim == "stage"}
    s_dp = {int(ctx["dp_rank"]): float(ta.mean() / t_ideal) for (dim, _, _, ctx), ta in zip(groups, T_add) if dim == "dp_rank"}
    score = np.array([min(s_dp[int(g.dp_rank[r])], s_stage[int(g.stage[r])]) for r in range(g.n_ranks)])
    by_score = sorted(range(g.n_ranks), key=lambda r: (-score[r], int(g.ranks[r])))
    workers = sorted(by_score[:MAX_WORKERS])
    if len(workers) < g.n_ranks:
        notes.append(f"per-worker what-ifs for the {len(workers)} of {g.n_ranks} workers with the highest min(S_dp, S_stage)")
    wgroups = [("worker", str(int(g.ranks[r])), g.slot_rank == r,
                {"rank": int(g.ranks[r]), "stage": int(g.stage[r]), "dp_rank": int(g.dp_rank[r]), "tp_rank": int(g.tp_rank[r])})
               for r in workers]
    wmasks = [m for _, _, m, _ in wgroups]
    groups += wgroups
    T_add = np.concatenate([T_add, whatif(g, wmasks, di, g.dur)])
    T_fix = np.concatenate([T_fix, whatif(g, [with_groups(g, m) for m in wmasks], g.dur, di)])
    att_rows = []
    for (dim, subj, m, ctx), ta, tf in zip(groups, T_add, T_fix):
        rem, add = _rem_add(t_ori, t_ideal, float(tf.mean()), float(ta.mean()))
        att_rows.append({"capture_id": cap, "dimension": dim, "subject": subj, "rank": ctx.get("rank"), "stage": ctx.get("stage"),
                         "dp_rank": ctx.get("dp_rank"), "tp_rank": ctx.get("tp_rank"), "n_ops": int(m.sum()),
                         "slowdown": float(ta.mean() / t_ideal), "share_added": add,
                         "fixed_step_ns": float(tf.mean()), "share_removed": rem})
    att = pl.DataFrame(att_rows, schema={c: col.dtype.type for c, col in STRAGGLER_ATTRIBUTION.columns.items()})

    # per step x worker: the worker alone as measured
    Tw = T_add[len(groups) - len(wgroups):]          # [n_workers, n_steps]
    wr = np.array(workers, dtype=np.int64)
    sl_rows = pl.DataFrame({
        "capture_id": cap, "step": np.tile(g.steps.astype(np.int64), len(wr)),
        "rank": np.repeat(g.ranks[wr].astype(np.int64), S_steps), "stage": np.repeat(g.stage[wr], S_steps).astype(np.int64),
        "dp_rank": np.repeat(g.dp_rank[wr], S_steps).astype(np.int64), "tp_rank": np.repeat(g.tp_rank[wr], S_steps).astype(np.int64),
        "slowdown": (Tw / t_ideal).ravel(), "step_slowdown": np.tile(nodelay / t_ideal, len(wr)),
        "measured_ns": np.tile(measured.astype(np.float64), len(wr))})

    # M_W (the artifact): fix the top 3 % of workers by min(S_dp, S_stage); M_S: fix the last stage
    n_top = max(1, math.ceil(g.n_ranks * TOP_WORKERS_PCT / 100))
    top = by_score[:n_top]
    m_top = with_groups(g, np.isin(g.slot_rank, top))
    last = int(g.stage.max())
    slowest = max(s_stage, key=s_stage.get)
    m_last, m_slowest = slot_stage == last, slot_stage == slowest
    mbe = microbatch_effects(g)
    fix_masks = [m_top, m_last, m_slowest]
    Tf = whatif(g, fix_masks, g.dur, di)
    Ta = whatif(g, fix_masks, di, g.dur)
    mw = _rem_add(t_ori, t_ideal, float(Tf[0].mean()), float(Ta[0].mean()))
    ms = _rem_add(t_ori, t_ideal, float(Tf[1].mean()), float(Ta[1].mean()))
    ms_slowest = _rem_add(t_ori, t_ideal, float(Tf[2].mean()), float(Ta[2].mean()))
    mseq = (0.0, 0.0)
    if mbe is not None:
        # the measured job without its microbatch effects (mean work kept)
        e = mbe["effect"]
        c = float(np.log(np.mean(np.exp(e))))
        dur_noseq = g.dur.copy()
        dur_noseq[mbe["idx"]] = g.dur[mbe["idx"]] * np.exp(-(e - c))
        t_noseq = float(replay_job_graph(g, zero, dur_noseq).mean())
        # and the ideal with only them (every other op typical)
        dur_seqonly = np.repeat(di, S_steps, axis=1)
        dur_seqonly[mbe["idx"]] = di[mbe["idx"]] * np.exp(e - c)
        t_seqonly = float(replay_job_graph(g, zero, dur_seqonly).mean())
        mseq = _rem_add(t_ori, t_ideal, t_noseq, t_seqonly)

    # compute alone as measured, for the workers slower than their peers (and those peers):
    # the evidence of a slow worker (straggler_causes)
    w_att = att.filter(pl.col("dimension") == "worker")
    above = (w_att.join(_peer_median(w_att, "slowdown"), on="rank", how="left").with_columns(pl.col("peer").fill_null(1.0))
             .filter((pl.col("slowdown") >= SLOW_GROUP) & (pl.col("slowdown") - pl.col("peer") >= PEER_MARGIN)))
    probe = above.select("stage", "tp_rank").unique().join(w_att.select("rank", "stage", "tp_rank"), on=["stage", "tp_rank"])["rank"].to_list()
    compute_alone: dict[int, float] = {}
    if probe and S >= SLOW_GROUP:
        comp = ~slot_is_comm(g)
        Tc = whatif(g, [comp & (g.ranks[g.slot_rank] == r) for r in probe], di, g.dur)
        compute_alone = {int(r): float(tc.mean() / t_ideal) for r, tc in zip(probe, Tc)}
    causes = straggler_causes(g, att, S, di, mbe, mseq, t_ori, t_ideal, compute_alone)
    # op types that slow the ideal step: is any of their ops *persistently* slow (its median over
    # steps above the type's typical), leaving out the workers named as causes and their
    # transfers (a worker on a throttled host moves its data slowly too)? An op type that only
    # varies from step to step, as transfers on a busy machine do, is not a fault of its own.
    persistent: dict[str, float] = {}
    wk = causes.filter(pl.col("cause") == "worker")["rank"].to_list()
    m_w = with_groups(g, np.isin(g.ranks[g.slot_rank], wk)) if wk else np.zeros(g.n_slots, dtype=bool)
    slow_types = [(r["subject"], m) for (dim, _, m, _), r in zip(groups, att.iter_rows(named=True))
                  if dim == "op_type" and r["slowdown"] >= SLOW_GROUP]
    med = np.median(g.dur, axis=1)[:, None]
    if slow_types:
        Tp = whatif(g, [m & ~m_w for _, m in slow_types], di, med)
        persistent = {t: float(tp.mean() / t_ideal) for (t, _), tp in zip(slow_types, Tp)}
    # the whole step with every op at its own median: what persists once step-to-step variation is gone
    s_pers = float(replay_job_graph(g, zero, med)[0]) / t_ideal
    ns_steps = no_straggler_steps(g, de[:, 0], gi[:, 0], wk, mbe)
    t_ideal_gaps = float(ns_steps.mean())
    summary = pl.DataFrame([{
        "capture_id": cap, "n_ranks": g.n_ranks, "n_steps": S_steps, "n_stages": int(g.stage.max()) + 1,
        "n_dp": int(g.dp_rank.max()) + 1, "measured_mean_ns": float(measured.mean()), "nodelay_mean_ns": t_ori,
        "ideal_ns": t_ideal, "ideal_with_gaps_ns": t_ideal_gaps, "slowdown": S, "measured_slowdown": float(measured.mean() / t_ideal_gaps),
        "launch_slowdown": float(measured.mean() / t_ori), "replay_max_error": replay_err,
        "mw": mw[0], "mw_added": mw[1], "mw_workers": json.dumps([int(g.ranks[r]) for r in top]),
        "ms": ms[0], "ms_added": ms[1], "ms_stage": last, "ms_slowest": ms_slowest[0], "slowest_stage": int(slowest),
        "mseq": mseq[0], "mseq_added": mseq[1], "seq_icc": None if mbe is None else mbe["icc"],
        "seq_sigma": None if mbe is None else mbe["sigma"],
    }], schema={c: col.dtype.type for c, col in STRAGGLER_SUMMARY.columns.items()})
    return StragglerAnalysis(g, di[:, 0], gi[:, 0], measured, nodelay, t_ideal, t_ideal_gaps,
                             summary, att, sl_rows, causes, notes, de[:, 0], persistent, s_pers, ns_steps)  # built with the schemas' dtypes; the assets validate on write


def stage_compute_ratio(g: JobGraph) -> dict[int, float]:
    """Per stage: its compute per step over the other stages' (fleetscope.common.stage_imbalance:
    on the stage's least loaded DP replica, so one slow worker never makes its stage look
    imbalanced). A rank's compute per step is the sum of its compute ops' mean durations."""
    comm = slot_is_comm(g)
    df = pl.DataFrame({"r": g.slot_rank, "mean": g.dur.mean(axis=1)}).filter(pl.Series(~comm))
    if df.height == 0:
        return {int(s): 1.0 for s in np.unique(g.stage)}
    per_rank = df.group_by("r").agg(pl.col("mean").sum().alias("compute_ns"))
    r = per_rank["r"].to_numpy()
    per_rank = per_rank.with_columns(rank=pl.Series(r, dtype=pl.Int32), stage=pl.Series(g.stage[r]).cast(pl.Int32),
                                     dp_rank=pl.Series(g.dp_rank[r]).cast(pl.Int32))
    st = stage_imbalance(per_rank, value="compute_ns")
    return {int(s): (float(v) if v is not None else 1.0) for s, v in zip(st["stage"], st["ratio"])}


def _peer_median(w: pl.DataFrame, col: str) -> pl.DataFrame:
    """Per worker (rank): the median of `col` over its peers, the same stage and TP index in the
    other DP replicas."""
    return (w.select("rank", "stage", "tp_rank", "dp_rank")
            .join(w.select("stage", "tp_rank", pl.col("dp_rank").alias("_d"), pl.col(col).alias("_s")), on=["stage", "tp_rank"])
            .filter(pl.col("dp_rank") != pl.col("_d")).group_by("rank").agg(pl.col("_s").median().alias("peer")))


def straggler_causes(g: JobGraph, att: pl.DataFrame, S: float, di: np.ndarray, mbe: dict | None,
                     mseq: tuple[float, float], t_ori: float, t_ideal: float,
                     compute_alone: dict[int, float] | None = None) -> pl.DataFrame:
    """Verdict inputs (straggler_causes): individually slow workers (their compute alone as
    measured, `compute_alone`, slows the ideal step by SLOW_GROUP and by more than twice their
    same-stage peers' in other DP replicas), stages slow in every DP replica whose compute exceeds the balanced stage by
    IMBALANCE (partitioning imbalance), and
    sequence-length imbalance (microbatch effects shared along the pipeline). Each row carries its
    slowdown alone (S_g) and its share of the slowdown: the fraction removed when it is fixed."""
    cap = g.capture_id
    w = att.filter(pl.col("dimension") == "worker")
    compute_alone = compute_alone or {}
    rows: list[dict] = []
    slow_w = []
    empty = pl.DataFrame(rows, schema={c: col.dtype.type for c, col in STRAGGLER_CAUSES.columns.items()})
    if S < SLOW_GROUP:  # no straggling to explain (shares of a ~0 slowdown are noise)
        return STRAGGLER_CAUSES.validate(empty)
    # a slow worker computes slowly: its compute alone as measured (every other op ideal) slows
    # the ideal step, by more than twice what its peers' compute does (the same stage and TP
    # index in the other DP replicas). Compute only: a collective it shares with its peers is as
    # slow for them (a throttled host stalls the whole all-reduce), and the two ends of a slow
    # link are slow only in their transfers.
    wc = w.join(pl.DataFrame({"rank": list(compute_alone), "sc": list(compute_alone.values())},
                             schema={"rank": pl.Int64, "sc": pl.Float64}), on="rank", how="inner")
    cand = (wc.join(_peer_median(wc, "sc"), on="rank", how="left").with_columns(pl.col("peer").fill_null(1.0))
            .filter((pl.col("sc") >= SLOW_GROUP)
                    & (pl.col("sc") - 1 >= 2 * (pl.col("peer") - 1).clip(lower_bound=0) + PEER_MARGIN)).sort("rank"))
    for r in cand.iter_rows(named=True):
        slow_w.append((r, float(r["peer"])))
    ratio = stage_compute_ratio(g)
    for r, peer in slow_w:
        rows.append({"capture_id": cap, "cause": "worker", "subject": f"rank {r['rank']}", "rank": r["rank"], "stage": r["stage"],
                     "dp_rank": r["dp_rank"], "slowdown": r["slowdown"], "share_of_slowdown": r["share_removed"],
                     "share_added": r["share_added"], "team": "operations",
                     "evidence": json.dumps({"peer_median_slowdown": peer, "compute_alone_slowdown": r["sc"],
                                             "tp_rank": r["tp_rank"], "job_slowdown": S})})
    for r in att.filter(pl.col("dimension") == "stage").iter_rows(named=True):
        s = r["stage"]
        ws = w.filter(pl.col("stage") == s)
        floor = float(ws["slowdown"].min()) if ws.height else 1.0
        # slow in every DP replica, and because it computes more than the balanced stage (a stage
        # slow everywhere for another reason shows in the op-type attribution instead)
        if r["slowdown"] < SLOW_GROUP or floor < SLOW_GROUP or ratio.get(s, 1.0) < IMBALANCE:
            continue
        rows.append({"capture_id": cap, "cause": "stage_partitioning", "subject": f"stage {s}", "rank": None,
                     "stage": s, "dp_rank": None, "slowdown": r["slowdown"], "share_of_slowdown": r["share_removed"],
                     "share_added": r["share_added"], "team": "algorithm",
                     "evidence": json.dumps({"compute_vs_balanced_stage": ratio.get(s, 1.0), "min_worker_slowdown": floor,
                                             "job_slowdown": S})})
    if mbe is not None and mbe["icc"] >= SEQ_ICC and mbe["sigma"] >= SEQ_SIGMA:
        rows.append({"capture_id": cap, "cause": "sequence_length", "subject": "microbatches", "rank": None, "stage": None,
                     "dp_rank": None, "slowdown": float(1 + mseq[1] * (S - 1)), "share_of_slowdown": mseq[0],
                     "share_added": mseq[1], "team": "algorithm",
                     "evidence": json.dumps({"icc": mbe["icc"], "sigma_log": mbe["sigma"], "n_microbatches": mbe["n_groups"],
                                             "job_slowdown": S})})
    return STRAGGLER_CAUSES.validate(pl.DataFrame(rows, schema={c: col.dtype.type for c, col in STRAGGLER_CAUSES.columns.items()}))


# ---------------------------------------------------------------- artifacts
def heatmap_png(a: StragglerAnalysis) -> bytes:
    """Two panels (PNG bytes): each worker's slowdown alone as measured on the stage x DP grid
    (the artifact's Figure 14), and the same per step (step x worker)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    g = a.graph
    sl = a.slowdown.sort("stage", "dp_rank", "tp_rank", "rank", "step")
    workers = sl.select("rank", "stage", "dp_rank", "tp_rank").unique(maintain_order=True)
    steps = np.sort(sl["step"].unique().to_numpy())
    M = sl["slowdown"].to_numpy().reshape(workers.height, len(steps))
    wmean = a.attribution.filter(pl.col("dimension") == "worker")
    n_st, n_dp = int(g.stage.max()) + 1, int(g.dp_rank.max()) + 1
    grid = np.ones((n_st, n_dp))
    for r in wmean.iter_rows(named=True):
        grid[r["stage"], r["dp_rank"]] = max(grid[r["stage"], r["dp_rank"]], r["slowdown"])
    vmax = max(1.5, float(np.nanmax(M)))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, max(3.0, min(0.08 * workers.height + 2, 14))), dpi=100,
                                   gridspec_kw={"width_ratios": [max(n_dp, 2), max(len(steps) // 2, 4)]})
    im = ax0.imshow(grid, cmap="Reds", vmin=1.0, vmax=vmax, aspect="auto")
    if n_st * n_dp <= 64:
        for s in range(n_st):
            for d in range(n_dp):
                ax0.text(d, s, f"{grid[s, d]:.2f}", ha="center", va="center", fontsize=7)
    ax0.set_xlabel("DP rank")
    ax0.set_ylabel("PP stage")
    ax0.set_title("worker alone as measured / ideal", fontsize=9)
    ax1.imshow(M, cmap="Reds", vmin=1.0, vmax=vmax, aspect="auto", interpolation="nearest")
    lab = [f"s{s}/d{d}" + (f"/t{t}" if g.tp_rank.max() > 0 else "") for _, s, d, t in workers.iter_rows()]
    every = max(1, len(lab) // 40)
    ax1.set_yticks(range(0, len(lab), every), lab[::every], fontsize=6)
    sev = max(1, len(steps) // 20)
    ax1.set_xticks(range(0, len(steps), sev), [str(x) for x in steps[::sev]], fontsize=6, rotation=90)
    ax1.set_xlabel("step")
    ax1.set_title(f"{g.capture_id}: per-step slowdown per worker (S = {a.S:.2f})", fontsize=9)
    fig.colorbar(im, ax=[ax0, ax1], fraction=0.03)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def ideal_timeline(a: StragglerAnalysis, with_gaps: bool = False) -> dict:
    """The ideal step as a Chrome / Perfetto trace (JSON object): one track per rank (a second
    one for collectives that run beside other work), timestamps in integer microseconds from the
    ideal step's start (`otherData.origin`), each op a complete slice preceded by a `wait` slice
    when it waits for its peers; slices on one track never overlap."""
    g = a.graph
    gap = a.ideal_gap[:, None] if with_gaps else np.zeros((g.n_slots, 1))
    dur = a.expected_dur if with_gaps and a.expected_dur is not None else a.ideal_dur
    arrive, start, end = replay_job_graph(g, gap, dur[:, None], timeline=True)
    arr_us = np.floor(arrive[:, 0] / 1000).astype(np.int64)
    st_us = np.floor(start[:, 0] / 1000).astype(np.int64)
    en_us = np.floor(end[:, 0] / 1000).astype(np.int64)
    names = g.slot_names()
    mb = g.slots["microbatch"].to_list()
    events = []
    for r in range(g.n_ranks):
        idx = np.flatnonzero(g.slot_rank == r)
        idx = idx[np.lexsort((en_us[idx], arr_us[idx]))]
        lanes: list[int] = []                 # per lane: end of its last slice
        for i in idx:
            lane = next((k for k, e in enumerate(lanes) if e <= arr_us[i]), None)
            if lane is None:
                lanes.append(0)
                lane = len(lanes) - 1
            lanes[lane] = int(en_us[i])
            tid = int(g.ranks[r]) * 16 + lane
            if st_us[i] > arr_us[i]:
                events.append({"name": "wait", "cat": "wait", "ph": "X", "pid": 0, "tid": tid, "ts": int(arr_us[i]),
                               "dur": int(st_us[i] - arr_us[i]), "args": {"for": names[i]}})
            events.append({"name": names[i], "cat": ",".join(op_types(names[i])), "ph": "X", "pid": 0, "tid": tid,
                           "ts": int(st_us[i]), "dur": int(en_us[i] - st_us[i]),
                           "args": {"microbatch": mb[i], "stage": int(g.stage[r]), "dp_rank": int(g.dp_rank[r])}})
        for lane in range(len(lanes)):
            tid = int(g.ranks[r]) * 16 + lane
            label = f"rank {int(g.ranks[r])} (stage {int(g.stage[r])}, dp {int(g.dp_rank[r])}, tp {int(g.tp_rank[r])})" + (f" overlap {lane}" if lane else "")
            events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": label}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}})
    events.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{g.capture_id}: ideal step"}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"origin": "start of the ideal step (0 us)", "capture_id": g.capture_id,
                          "ideal_step_us": int(np.floor((a.ideal_with_gaps_ns if with_gaps else a.ideal_ns) / 1000)),
                          "untraced_gaps": "typical" if with_gaps else "removed"}}
