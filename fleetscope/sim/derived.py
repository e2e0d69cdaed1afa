"""Straggler cases derived from a real per-op trace, with a truth the analysis never reads.

The recipe (the way the StragglerAnalysis artifact made its slowed-worker job, but on our
machine: we cannot run a 64-rank Megatron job, so we transform the real one we have):

1. Read the real trace's step structure (fleetscope.prism.structure): per rank, the ordered op
   slots of a step, which slots synchronize (pipeline send/recv pairs, DP collectives, the
   embedding all-reduce, the model-parallel grad-norm all-reduce), and every op's *intrinsic*
   duration and the untraced gap before it, per measured step.
2. Replicate the pipeline to `dp` data-parallel replicas (new replica d copies the ops of real
   replica d mod dp_real: the per-worker persistent effects come along) and resample the real
   noise: duration = the real op's typical (median over steps) x the per-step factor of its op
   type in one real step drawn for the new step (shared by every worker, as in the real trace
   where compute durations of all workers move together) x the op's residual (ratio to its
   typical over that real step's factor) in another real step drawn per (replica, step), which
   keeps the real residuals' within-replica correlations. Untraced gaps: those of the real op in
   the real step drawn for the new step.
3. Optionally rebalance the stages (`balance=True`): every compute op of a stage scaled so that
   its stage's mean equals the op's mean over stages (the real trace's last stage computes ~2x
   the others).
4. Inject the fault of the case kind:
   - ``healthy``: nothing;
   - ``slow_worker``: one worker (random stage and replica) computes `slow_factor` x slower from
     a random step of the first half on (forward, backward, optimizer);
   - ``seq_imbalance``: every (replica, step, microbatch) draws a sequence length L ~ lognormal
     (sigma `seq_sigma`); the compute of that microbatch on *every stage of that pipeline* is
     scaled by L**seq_alpha (attention makes cost super-linear), normalized to mean 1;
   - ``heavy_stage``: one random stage computes `stage_factor` x more on every replica;
   - ``slow_link``: every transfer over one pipeline link (a random stage pair of a random
     replica) takes `link_ms` longer.
5. Replay the dependency model with the new durations (waits for peers appear where they would)
   and write the records: an op's start is when its rank reached it, its end when it finished.

The truth returned next to the timings (which worker, from which step, which microbatch factors,
the ideal step time) is for scoring only. `truth["ideal_ns"]` is the paper's ideal (every op at
its typical duration, untraced gaps removed) computed on the case *without the injected excess*
for a slow worker (its extra time is not work the job needs) and *with* it for a heavy stage or
longer sequences (that work is real; the ideal spreads it evenly): compute ops at their mean per
op type, communication at its median per op type.

Because the records come from a replay of the same dependency model the analysis uses, replaying
them reproduces their step times exactly: that check is only meaningful on the real trace."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import yaml

from fleetscope.prism.structure import build_job_graph, is_comm_name, replay_job_graph
from fleetscope.prism.variability import scaled_slots, temporal_ratios

KINDS = ("healthy", "slow_worker", "seq_imbalance", "heavy_stage", "slow_link")
COMPUTE_SLOWED = ("forward-compute", "backward-compute", "optimizer")
SEQ_OPS = ("forward-compute", "backward-compute")
T0_NS = 1_700_000_000_000_000_000


@dataclass
class DerivedCase:
    capture_id: str
    kind: str
    timings: pl.DataFrame
    layout: dict
    truth: dict = field(default_factory=dict)


def typical_ideal_durations(names: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """The artifact's ideal durations of slots with names `names` ([n_slots]) from per-step
    intrinsic durations `dur` ([n_slots, n_steps]): compute at its mean per op type over every
    rank and step, communication at its median per op type."""
    out = np.zeros(len(names))
    for nm in np.unique(names):
        sel = names == nm
        out[sel] = np.median(dur[sel]) if is_comm_name(nm) else dur[sel].mean()
    return out


def derive_case(source: pl.DataFrame, kind: str, seed: int, dp: int = 4, n_steps: int = 40, balance: bool = True,
                slow_factor: float = 2.0, seq_sigma: float = 0.2, seq_alpha: float = 1.3, stage_factor: float = 1.5,
                link_ms: float = 30.0,
                capture_id: str | None = None) -> DerivedCase:
    """A case of `kind` (see the module doc) built from the op timings of one real capture."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rng = np.random.default_rng(seed)
    g = build_job_graph(source)
    if g.kind != "op":
        raise ValueError("derived cases need framework op rows (kind='op')")
    cap = capture_id or f"derived-{kind}-s{seed}"
    dp_src = int(g.dp_rank.max()) + 1
    n_st = int(g.stage.max()) + 1
    tp = int(g.tp_rank.max()) + 1

    # 1. the new job's structure: the reference step's rows replicated to dp replicas
    op = source.filter(pl.col("kind") == "op")
    ref = op.filter(pl.col("step") == int(g.steps[0]))
    rk = pl.DataFrame({"rank": g.ranks.astype(np.int64), "stage": g.stage, "dp_src": g.dp_rank, "tp": g.tp_rank})
    reps = []
    for d in range(dp):
        m = rk.filter(pl.col("dp_src") == d % dp_src).with_columns(
            new_rank=((pl.col("stage") * dp + d) * tp + pl.col("tp")).cast(pl.Int32), new_dp=pl.lit(d, dtype=pl.Int32))
        reps.append(ref.with_columns(pl.col("rank").cast(pl.Int64)).join(m.select("rank", "new_rank", "new_dp"), on="rank")
                    .with_columns(pl.col("new_rank").alias("rank"), pl.col("new_dp").alias("dp_rank")).drop("new_rank", "new_dp"))
    g2 = build_job_graph(pl.concat(reps, how="vertical_relaxed").with_columns(capture_id=pl.lit(cap)), cap)
    # each new slot's source slot: same stage / TP index / position, replica d mod dp_src
    src_rank = {((int(s) * dp + d) * tp + int(t)): int(r) for r, s, dsrc, t in rk.iter_rows()
                for d in range(dp) if d % dp_src == dsrc}
    key = g.slots.select(pl.col("rank").cast(pl.Int64), "pos", pl.col("slot").alias("src"))
    s2 = g2.slots.with_columns(src_r=pl.col("rank").cast(pl.Int64).replace_strict(src_rank))
    src = s2.join(key, left_on=["src_r", "pos"], right_on=["rank", "pos"], how="left").sort("slot")["src"].to_numpy()
    names2 = g2.slot_names()
    stage2 = g2.stage[g2.slot_rank]
    dp2 = g2.dp_rank[g2.slot_rank]

    # 2. resample the real noise: every new step takes the per-step factor of one real step for
    #    every worker (in the real trace compute durations of all workers move together from step
    #    to step, correlation 0.9-0.98), and each (replica, step) the residuals of its real replica
    #    in another real step drawn at random (their within-replica correlations kept)
    typ, ratio = temporal_ratios(g)
    scaled = scaled_slots(g, typ)
    names = g.slot_names()
    F = np.ones_like(ratio)
    for nm in np.unique(names):
        sel = (names == nm) & scaled
        if sel.any():
            F[names == nm] = np.median(ratio[sel], axis=0)
    Jg = rng.integers(0, g.dur.shape[1], n_steps)          # the real step whose per-step factor is shared
    Jr = rng.integers(0, g.dur.shape[1], (dp, n_steps))    # the real step each replica takes its residuals from
    jr = Jr[dp2]
    s_ = src[:, None]
    dur = np.where(scaled[s_], typ[s_] * F[s_, Jg[None, :]] * ratio[s_, jr] / F[s_, jr], g.dur[s_, jr])
    gap = g.gap[s_, Jg[None, :]]
    compute = ~np.array([is_comm_name(n) for n in names2])

    # 3. balanced stages: each compute op's stage mean brought to its mean over stages
    if balance:
        for nm in np.unique(names2[compute]):
            sel = compute & (names2 == nm)
            per_stage = {s: dur[sel & (stage2 == s)].mean() for s in np.unique(stage2[sel])}
            target = dur[sel].mean()
            for s, v in per_stage.items():
                if v > 0:
                    dur[sel & (stage2 == s)] *= target / v
    base = dur.copy()
    truth: dict = {"kind": kind, "seed": seed, "dp": dp, "pp": n_st, "tp": tp, "n_steps": n_steps, "balanced": balance}
    if not balance:  # the source's own imbalance stays: its heaviest stage (compute per step, measured here) is a true cause
        per_stage = {int(s): float(dur[compute & (stage2 == s)].sum()) for s in np.unique(stage2)}
        truth["source_heavy_stage"] = max(per_stage, key=per_stage.get)

    # 4. the fault
    mb2 = g2.slots["microbatch"].cast(pl.Float64).to_numpy()  # NaN: no microbatch
    if kind == "slow_worker":
        s_star, d_star = int(rng.integers(0, n_st)), int(rng.integers(0, dp))
        j0 = int(rng.integers(0, max(n_steps // 2, 1)))
        r_idx = int(np.flatnonzero((g2.stage == s_star) & (g2.dp_rank == d_star) & (g2.tp_rank == 0))[0])
        sel = (g2.slot_rank == r_idx) & np.isin(names2, COMPUTE_SLOWED)
        dur[sel, j0:] *= slow_factor
        truth.update(slow_rank=int(g2.ranks[r_idx]), slow_stage=s_star, slow_dp=d_star, slow_from_step=j0, slow_factor=slow_factor)
    elif kind == "seq_imbalance":
        n_mb = int(np.nanmax(mb2)) + 1
        L = np.exp(rng.normal(0.0, seq_sigma, (dp, n_steps, n_mb)))
        f = L ** seq_alpha
        f /= f.mean()
        sel = np.isin(names2, SEQ_OPS) & ~np.isnan(mb2)
        idx = np.flatnonzero(sel)
        dur[idx] *= f[dp2[idx], :, mb2[idx].astype(int)]
        truth.update(seq_sigma=seq_sigma, seq_alpha=seq_alpha,
                     seq_factors=pl.DataFrame({"dp_rank": np.repeat(np.arange(dp), n_steps * n_mb),
                                               "step": np.tile(np.repeat(np.arange(n_steps), n_mb), dp),
                                               "microbatch": np.tile(np.arange(n_mb), dp * n_steps), "factor": f.ravel()}))
    elif kind == "heavy_stage":
        s_star = int(rng.integers(0, n_st))
        dur[compute & (stage2 == s_star)] *= stage_factor
        truth.update(heavy_stage=s_star, stage_factor=stage_factor)
    elif kind == "slow_link":
        # every transfer over one pipeline link (stage s <-> s+1 of one replica) takes link_ms
        # longer in every step (both ends record it): a network fault, not a worker's
        s_star, d_star = int(rng.integers(0, n_st - 1)), int(rng.integers(0, dp))
        p2p = np.array([any(n in ("forward-send", "forward-recv", "backward-send", "backward-recv") for n in nm.split("+"))
                        for nm in names2])
        link = p2p & (dp2 == d_star) & np.isin(stage2, [s_star, s_star + 1])
        sl = g2.slots.select("slot", "group")
        grp = sl.filter(pl.Series(link))["group"].unique().to_list()
        # the groups that join the two stages (their members sit on both)
        both = [x for x in grp if set(stage2[g2.group_of == x]) == {s_star, s_star + 1}]
        sel = np.isin(g2.group_of, both)
        dur[sel] += link_ms * 1e6
        truth.update(link_stages=(s_star, s_star + 1), link_dp=d_star, link_ms=link_ms)
    # the ideal: the slow worker's excess is not work the job needs; longer sequences and a
    # heavier stage are (their work is spread evenly in the ideal)
    ideal_src = base if kind == "slow_worker" else dur
    di = typical_ideal_durations(names2, ideal_src)[:, None]
    truth["ideal_ns"] = float(replay_job_graph(g2, np.zeros((g2.n_slots, 1)), di)[0])

    # 5. replay and write the records
    arrive, _, end = replay_job_graph(g2, gap, dur, timeline=True)
    T = end.max(axis=0)
    step0 = T0_NS + np.concatenate([[0], np.cumsum(np.round(T).astype(np.int64) + 1_000_000)[:-1]])
    truth["step_ns"] = T
    sl = g2.slots.select("slot", "rank", "names", "microbatch", "stage", "dp_rank", "tp_rank").explode("names")
    si = sl["slot"].to_numpy()
    n = len(si)
    starts = (step0[None, :] + np.round(arrive[si]).astype(np.int64)).ravel()
    ends = (step0[None, :] + np.round(end[si]).astype(np.int64)).ravel()
    comp_name = sl["names"].is_in(list(SEQ_OPS)).to_numpy()
    t = pl.DataFrame({
        "capture_id": cap, "rank": np.repeat(sl["rank"].to_numpy(), n_steps).astype(np.int32),
        "kind": "op", "name": np.repeat(sl["names"].to_numpy(), n_steps),
        "issue_ns": starts, "start_ns": starts, "end_ns": ends, "duration_ns": ends - starts,
        "step": np.tile(np.arange(n_steps, dtype=np.int64), n),
        "stage": np.repeat(sl["stage"].to_numpy(), n_steps).astype(np.int32),
        "dp_rank": np.repeat(sl["dp_rank"].to_numpy(), n_steps).astype(np.int32),
        "tp_rank": np.repeat(sl["tp_rank"].to_numpy(), n_steps).astype(np.int32),
        "microbatch": pl.Series(np.repeat(np.where(comp_name, sl["microbatch"].fill_null(-1).to_numpy(), -1), n_steps)).cast(pl.Int32),
    }).with_columns(microbatch=pl.when(pl.col("microbatch") < 0).then(None).otherwise(pl.col("microbatch")),
                    model_chunk=pl.when(pl.col("name").is_in(list(SEQ_OPS))).then(pl.lit(0, dtype=pl.Int32)).otherwise(None),
                    source_file=pl.lit(f"{cap}.derived"))
    layout = {"dp": dp, "pp": n_st, "tp": tp, "vpp": 1, "world_size": dp * n_st * tp}
    return DerivedCase(cap, kind, t.sort("rank", "start_ns", "name"), layout, truth)


def write_straggler_format(case: DerivedCase, folder: Path | str) -> Path:
    """The case as the StragglerAnalysis artifact's files (trace-<cap>.parquet with times in
    seconds, meta-<cap>.yaml), to exercise that ingest path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    t = case.timings
    t0 = t.group_by("step").agg(pl.col("start_ns").min().alias("t0"))
    df = (t.join(t0, on="step").sort("rank", "step", "start_ns", "name")
          .with_columns(seq_id=pl.int_range(pl.len()).over("rank", "step", "name").cast(pl.Int32))
          .select(pl.col("dp_rank").cast(pl.Int8), pl.col("stage").cast(pl.Int8), pl.col("rank").cast(pl.Int16), "step",
                  pl.col("name").alias("optype"),
                  ((pl.col("start_ns") - pl.col("t0")) / 1e9).alias("start_ts"), ((pl.col("end_ns") - pl.col("start_ns")) / 1e9).alias("duration"),
                  "seq_id", pl.col("model_chunk").fill_null(-1).cast(pl.Int8).alias("mc"),
                  pl.when(pl.col("model_chunk").is_null()).then(-1).otherwise(pl.col("stage")).cast(pl.Int16).alias("gmc"),
                  pl.col("microbatch").fill_null(-1).cast(pl.Int8).alias("mb_id")))
    p = folder / f"trace-{case.capture_id}.parquet"
    df.write_parquet(p)
    lay = case.layout
    (folder / f"meta-{case.capture_id}.yaml").write_text(yaml.safe_dump(
        {"trial_name": case.capture_id, "run_id": 0, "dp_size": lay["dp"], "pp_size": lay["pp"], "tp_size": lay["tp"],
         "dsp_size": 1, "vpp_size": lay["vpp"], "world_size": lay["world_size"]}))
    return p
