"""Communication-type labels of a job's pairs (LLMPrism IV-B, Algorithm 2, made robust).

The paper counts distinct flow sizes per step (one size: PP, several: DP). That fails whenever a
pipeline's activations vary with the sequence length, or a job pads its gradient buckets to one
size, or reduces a single bucket. What does not vary is how the two kinds of traffic move:

- a collective hop (ring or tree all-reduce, reduce-scatter, all-gather) either runs one way (a
  ring's hop carries one direction) or both ways at once (two ranks exchanging their halves, or
  channels of opposite direction): the two directions overlap in time;
- a pipeline hop carries activations forward and gradients back, in turn: both directions, and they
  rarely overlap (the gradient of a microbatch comes back after the next stages computed it).

So per pair: the share of its data flows in its minority direction (`dir_share`) and the share of
its flows that overlap a flow of the other direction (`overlap`). One-way or overlapping: DP;
two-way and taking turns: PP; in between, the size count decides. The size-count label stays as
`raw_type` (evidence). Pairs inside a job that are not job traffic are `other`: aperiodic ones
(rendezvous, barriers, stores), ones carrying a negligible share of their ends' traffic (probes,
heartbeats, control messages every few seconds): what jobs.job_edges did not take as job traffic.
DP groups are the connected components of the DP pairs."""
from __future__ import annotations

import numpy as np
import polars as pl
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from fleetscope.flows.config import FlowConfig


def direction_features(seg_flows: pl.DataFrame, pids: pl.DataFrame, max_flows: int = 400) -> pl.DataFrame:
    """Per pair (pid): dir_share (minority direction's share of its data flows) and overlap (share
    of an evenly spread sample of its flows that overlap a flow of the other direction)."""
    f = seg_flows.join(pids.select("pid"), on="pid").select(
        "pid", "start_ns", "end_ns", ab=pl.col("src_ip") == pl.col("ip_a"))
    cnt = f.group_by("pid").agg(n=pl.len(), n_ab=pl.col("ab").sum())
    # a sample is enough for a share and keeps this linear in flows
    s = f.with_columns(k=pl.int_range(pl.len()).over("pid"), n=pl.len().over("pid")).filter(
        pl.col("k") % (pl.col("n") // max_flows).clip(lower_bound=1) == 0).drop("k", "n")
    hits = []
    for d in (True, False):
        a = s.filter(pl.col("ab") == d).sort("pid", "end_ns")
        b = f.filter(pl.col("ab") != d).select("pid", bs="start_ns", be="end_ns").sort("pid", "bs")
        # the latest flow of the other direction starting before this one ends: does it reach into it?
        j = a.join_asof(b, left_on="end_ns", right_on="bs", by="pid", strategy="backward", check_sortedness=False)
        hits.append(j.select("pid", ov=(pl.col("be") >= pl.col("start_ns")).fill_null(False)))
    ov = pl.concat(hits).group_by("pid").agg(overlap=pl.col("ov").mean())
    return cnt.join(ov, on="pid", how="left").select(
        "pid", dir_share=(pl.min_horizontal(pl.col("n_ab"), pl.col("n") - pl.col("n_ab")) / pl.col("n")).cast(pl.Float64),
        overlap=pl.col("overlap").fill_null(0.0))


def classify_pairs(pairs: pl.DataFrame, job_pairs: pl.DataFrame, seg_flows: pl.DataFrame,
                   cfg: FlowConfig, edges: pl.DataFrame | None = None) -> pl.DataFrame:
    """pairs (pair_summary) x job_pairs -> ip_a, ip_b, job_id, comm_type, raw_type, method,
    refined, dp_group, n_flows, bytes, n_steps, mode_distinct_sizes, dir_share, overlap.
    edges: the pairs that made the jobs (jobs.job_edges); job traffic is one of them."""
    p = pairs.join(job_pairs, on=["ip_a", "ip_b"])
    is_edge = pl.lit(True) if edges is None else pl.col("pid").is_in(edges["pid"].implode())
    p = p.with_columns(edge=is_edge & pl.col("periodic"))
    p = p.with_columns(
        raw_type=pl.when(~pl.col("periodic")).then(pl.lit("other"))
        .when(pl.col("mode_distinct_sizes") == 1).then(pl.lit("PP")).otherwise(pl.lit("DP")),
        job_traffic=pl.col("edge"),
    )
    df = direction_features(seg_flows, p.filter("job_traffic"), ) if p.height else pl.DataFrame(
        schema={"pid": pl.Int64, "dir_share": pl.Float64, "overlap": pl.Float64})
    p = p.join(df, on="pid", how="left")
    one_way = pl.col("dir_share") < cfg.one_way_share
    together = pl.col("overlap") >= cfg.dp_overlap
    in_turn = (pl.col("dir_share") >= cfg.two_way_share) & (pl.col("overlap") < cfg.pp_overlap)
    p = p.with_columns(
        comm_type=pl.when(~pl.col("job_traffic")).then(pl.lit("other"))
        .when(one_way | together).then(pl.lit("DP"))
        .when(in_turn).then(pl.lit("PP"))
        .otherwise(pl.col("raw_type")),
        method=pl.when(~pl.col("periodic")).then(pl.lit("aperiodic"))
        .when(~pl.col("job_traffic")).then(pl.lit("not_job_traffic"))
        .when(one_way).then(pl.lit("one_way"))
        .when(together).then(pl.lit("both_ways_together"))
        .when(in_turn).then(pl.lit("both_ways_in_turn"))
        .otherwise(pl.lit("size_count")),
        refined=pl.lit(False),
    )
    # DP groups: connected components of the DP pairs
    ips = pl.concat([p["ip_a"], p["ip_b"]]).unique().sort()
    idx = pl.DataFrame({"ip": ips, "i": np.arange(ips.len())})
    p = p.join(idx.rename({"ip": "ip_a", "i": "a"}), on="ip_a").join(idx.rename({"ip": "ip_b", "i": "b"}), on="ip_b")
    dp = p.filter(pl.col("comm_type") == "DP")
    n = ips.len()
    if n:
        g = coo_matrix((np.ones(dp.height), (dp["a"].to_numpy(), dp["b"].to_numpy())), shape=(n, n))
        comp_s = pl.Series(connected_components(g, directed=False)[1], dtype=pl.Int64)
        p = p.with_columns(dp_group=pl.when(pl.col("comm_type") == "DP").then(
            pl.col("a").map_batches(lambda s: comp_s.gather(s), return_dtype=pl.Int64)))
    else:
        p = p.with_columns(dp_group=pl.lit(None, dtype=pl.Int64))
    return p.select("pid", "ip_a", "ip_b", "job_id", "comm_type", "n_flows", "bytes", "n_steps", "mode_distinct_sizes",
                    "raw_type", "method", "refined", "dp_group", "dir_share", "overlap").sort("job_id", "ip_a", "ip_b")
