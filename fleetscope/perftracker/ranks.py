"""The straggling rank: a worker whose own work is slower than its same-stage peers'.

A rank's critical path splits into its own work (compute, memory operations, CPU functions: what
it does itself) and communication (collectives, which include waiting for slower peers). A rank
that does the same work as the other ranks of its pipeline stage but takes longer for it is a
straggler (a slow GPU or host, a throttled clock, a noisy neighbour); the ranks that wait for it
(its pipeline successors in send/recv, its data-parallel peers in all-reduce) show the delay as
communication time, a consequence, not a cause. Both trace patterns and op-level timings patterns
work: their functions carry the same categories.

Per rank: own_ns = sum of beta x window over its non-communication functions. Peers: the other
ranks of the same capture and stage (every rank when the stage is unknown). Reference: the peers'
median (leave-one-out); noise: their robust sigma (fleetscope.common) when there are 3 or more.
A straggler exceeds the reference by min_impact of its window (materiality) and, with 3 or more peers,
by rank_k robust sigmas and rank_min_ratio; with fewer peers (no noise estimate) by rank_min_ratio_few_peers.
"""
from __future__ import annotations

import polars as pl

from fleetscope.common import robust_sigma
from fleetscope.perftracker.localize import LocalizeConfig

# Python code (user code) rather than operators, runtime calls or annotations: a file in the name
_USER_CODE = r"\.py\b"


def straggling_ranks(patterns: pl.DataFrame, config=None, workers: pl.DataFrame | None = None) -> pl.DataFrame:
    """behavior_patterns (one capture or several) -> one row per straggling rank: capture_id, rank,
    stage, host, own_ns, ref_ns, ratio, excess_ns, window_ns, impact (excess / window), n_peers,
    peers (their ranks), top (list of {function, category, container, excess_ns} where the excess
    sits), user_code_share (share of the excess in one user-code Python function), waiting (ranks
    whose communication share exceeds the straggler's by min_impact: they wait for it)."""
    config = config or LocalizeConfig()
    schema = {"capture_id": pl.Utf8, "rank": pl.Int32, "stage": pl.Int32, "host": pl.Utf8, "own_ns": pl.Float64, "ref_ns": pl.Float64,
              "ratio": pl.Float64, "excess_ns": pl.Float64, "window_ns": pl.Int64, "impact": pl.Float64, "n_peers": pl.Int64,
              "peers": pl.List(pl.Int32), "top": pl.List(pl.Struct({"function": pl.Utf8, "category": pl.Utf8, "container": pl.Boolean,
                                                                   "excess_ns": pl.Float64})),
              "user_code_share": pl.Float64, "waiting": pl.List(pl.Int32), "wait_share": pl.Float64, "others_wait_share": pl.Float64}
    if patterns.height == 0 or "window_ns" not in patterns.columns:
        return pl.DataFrame(schema=schema)
    p = patterns.with_columns(
        stage=(pl.col("stage") if "stage" in patterns.columns else pl.lit(None)).cast(pl.Int32),
        d=pl.col("beta") * pl.col("window_ns").cast(pl.Float64),
        own=pl.col("category") != "collective",
    )
    per = p.group_by("capture_id", "rank").agg(
        stage=pl.col("stage").drop_nulls().first(), window_ns=pl.col("window_ns").max(),
        own_ns=pl.col("d").filter("own").sum(), wait_ns=pl.col("d").filter(~pl.col("own")).sum(),
    ).with_columns(pl.col("rank").cast(pl.Int32), grp=pl.struct("capture_id", "stage"))
    # leave-one-out peers: every other rank of the same capture and stage (a stage has few ranks
    # next to a whole job; very large stages are summarized with the rank included)
    size = per.group_by("grp").agg(n=pl.len())
    per = per.join(size, on="grp")
    small = per.filter(pl.col("n") <= 64)
    loo = small.select("grp", "rank").join(small.select("grp", pl.col("rank").alias("peer"), pl.col("own_ns").alias("peer_own")), on="grp") \
        .filter(pl.col("rank") != pl.col("peer")).group_by("grp", "rank").agg(
            ref_ns=pl.col("peer_own").median(), sig=robust_sigma(pl.col("peer_own")), n_peers=pl.len(), peers=pl.col("peer").sort())
    big = per.filter(pl.col("n") > 64).with_columns(
        ref_ns=pl.col("own_ns").median().over("grp"), sig=robust_sigma(pl.col("own_ns")).over("grp"),
        n_peers=(pl.col("n") - 1).cast(pl.UInt32), peers=pl.lit(None, pl.List(pl.Int32)))
    per = pl.concat([per.join(loo, on=["grp", "rank"], how="inner"),
                     big.select(*per.columns, "ref_ns", "sig", "n_peers", "peers")], how="vertical_relaxed")
    if per.height == 0:
        return pl.DataFrame(schema=schema)
    excess = pl.col("own_ns") - pl.col("ref_ns")
    noise_ok = (pl.col("n_peers") < 3) | (excess >= config.rank_k * pl.max_horizontal(pl.col("sig"), 0.01 * pl.col("ref_ns")))
    # without 3 peers there is no noise estimate: a larger ratio stands in for it
    min_ratio = pl.when(pl.col("n_peers") < 3).then(config.rank_min_ratio_few_peers).otherwise(config.rank_min_ratio)
    flagged = per.with_columns(excess_ns=excess, ratio=pl.col("own_ns") / pl.col("ref_ns"),
                               impact=excess / pl.col("window_ns").cast(pl.Float64)).filter(
        (pl.col("ref_ns") > 0) & (pl.col("ratio") >= min_ratio) & (pl.col("impact") >= config.min_impact) & noise_ok)
    if flagged.height == 0:
        return pl.DataFrame(schema=schema)
    # where the excess sits: per function, the straggler's time minus the median over its stage's
    # non-straggling ranks (a rank without the function counts as 0; at most 256 of them per stage)
    strag = flagged.select("capture_id", "rank", "stage")
    normal = per.join(strag, on=["capture_id", "rank"], how="anti").select("capture_id", "rank", "stage")
    normal = normal.sort("rank").group_by("capture_id", "stage", maintain_order=True).head(256)
    fn = p.select("capture_id", pl.col("rank").cast(pl.Int32), "stage", "function", "function_name", "category",
                  (pl.col("container") if "container" in p.columns else pl.lit(None, pl.Boolean)).alias("container"), "d")
    mine = fn.join(strag, on=["capture_id", "rank", "stage"], how="semi", nulls_equal=True).filter(pl.col("category") != "collective")
    cells = normal.join(mine.select("capture_id", "stage", "function").unique(), on=["capture_id", "stage"], nulls_equal=True)
    typical = cells.join(fn.select("capture_id", "rank", "stage", "function", "d"), on=["capture_id", "rank", "stage", "function"],
                         how="left", nulls_equal=True).group_by("capture_id", "stage", "function").agg(typ=pl.col("d").fill_null(0.0).median())
    ex = mine.join(typical, on=["capture_id", "stage", "function"], how="left", nulls_equal=True).with_columns(
        excess_ns=pl.col("d") - pl.col("typ").fill_null(0.0)).filter(pl.col("excess_ns") > 0)
    ex = ex.with_columns(user=(pl.col("category") == "python") & ~pl.col("container").fill_null(False)
                         & pl.col("function_name").fill_null(pl.col("function")).str.contains(_USER_CODE))
    top = ex.sort("excess_ns", descending=True).group_by("capture_id", "rank", maintain_order=True).agg(
        top=pl.struct(pl.col("function_name").fill_null(pl.col("function")).alias("function"), "category", "container",
                      "excess_ns").head(5),
        pos=pl.col("excess_ns").sum(), user_max=pl.col("excess_ns").filter("user").max())
    top = top.with_columns(user_code_share=(pl.col("user_max").fill_null(0.0) / pl.col("pos")).fill_nan(0.0)).drop("pos", "user_max")
    # who waits for it: ranks of the capture (not stragglers) whose communication share is higher
    share = per.select("capture_id", "rank", ws=pl.col("wait_ns") / pl.col("window_ns").cast(pl.Float64))
    flagged = flagged.join(share, on=["capture_id", "rank"]).rename({"ws": "wait_share"})
    others = share.join(strag, on=["capture_id", "rank"], how="anti")
    waits = flagged.select("capture_id", "rank", "wait_share").join(
        others.rename({"rank": "other", "ws": "other_ws"}), on="capture_id").filter(
        pl.col("other_ws") >= pl.col("wait_share") + config.min_impact).group_by("capture_id", "rank").agg(
        waiting=pl.col("other").sort(), others_wait_share=pl.col("other_ws").median())
    out = flagged.join(top, on=["capture_id", "rank"], how="left").join(waits, on=["capture_id", "rank"], how="left")
    if workers is not None and "host" in workers.columns:
        out = out.join(workers.select(pl.col("rank").cast(pl.Int32), pl.col("host").cast(pl.Utf8)).unique("rank"), on="rank", how="left")
    else:
        out = out.with_columns(host=pl.lit(None, pl.Utf8))
    return out.with_columns(waiting=pl.col("waiting").fill_null(pl.lit([], pl.List(pl.Int32)))).select(list(schema)).cast(
        {k: v for k, v in schema.items() if k not in ("top",)}).sort("capture_id", "rank")
