"""Communication-type labels (LLMPrism IV-B, Algorithm 2) with fallbacks.

1. size count: per pair and step, the number of distinct flow sizes; mode 1 means PP, else DP.
2. timing fallback for pairs the size count calls PP (equal padded buckets, a single bucket):
   DP when most of their flows fall inside the endpoints' DP phases found from unambiguous DP
   pairs; in a job with no unambiguous DP pair, DP when the pair's traffic is one short burst per
   job step (spans <= fallback_span of a step, and not split into many more steps than the job
   has): a collective is a burst, PP sends follow the microbatches through forward and backward.
3. DP transitivity (connected components of the DP graph): a PP label between two ips of one DP
   component becomes DP (refined).
Aperiodic pairs inside a job (rendezvous, barriers, control) are `other`.
Retransmission splits and missing flows only touch a few steps; the mode over steps absorbs them."""
from __future__ import annotations

import numpy as np
import polars as pl
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from fleetscope.flows.config import FlowConfig


def _dp_phases(seg_flows: pl.DataFrame, dp_pairs: pl.DataFrame) -> pl.DataFrame:
    """Per ip and pair-step of unambiguous DP pairs: [phase_start, phase_end]."""
    f = seg_flows.join(dp_pairs.select("pid"), on="pid")
    ph = f.group_by("pid", "seg").agg(ip_a=pl.col("ip_a").first(), ip_b=pl.col("ip_b").first(), ps=pl.col("start_ns").min(), pe=pl.col("end_ns").max())
    return pl.concat([ph.select(ip="ip_a", ps="ps", pe="pe"), ph.select(ip="ip_b", ps="ps", pe="pe")]).sort("ip", "ps")


def _in_phase_fraction(seg_flows: pl.DataFrame, cand: pl.DataFrame, phases: pl.DataFrame,
                       max_flows: int = 64) -> pl.DataFrame:
    """Fraction of each candidate pair's flows lying inside a DP phase of either endpoint."""
    f = seg_flows.join(cand.select("pid"), on="pid").select("pid", "ip_a", "ip_b", "start_ns", "end_ns")
    # an evenly spread sample of each pair's flows is enough for a share (and keeps this linear)
    f = f.with_columns(k=pl.int_range(pl.len()).over("pid"), n=pl.len().over("pid")).filter(
        pl.col("k") % (pl.col("n") // max_flows).clip(lower_bound=1) == 0).drop("k", "n")
    f = f.with_row_index("fid")
    hit = []
    for end_col in ("ip_a", "ip_b"):
        x = f.with_columns(ip=pl.col(end_col)).sort("ip", "start_ns")
        # merged phases can overlap; the latest phase starting before the flow is the candidate
        j = x.join_asof(phases, left_on="start_ns", right_on="ps", by="ip", strategy="backward", check_sortedness=False)
        hit.append(j.select("fid", has=pl.col("pe").is_not_null(),
                            inside=(pl.col("pe").is_not_null() & (pl.col("end_ns") <= pl.col("pe") + 1_000_000))))
    h = pl.concat(hit).group_by("fid").agg(pl.col("inside").any(), pl.col("has").any())
    # null when neither endpoint has a known DP phase: the caller then uses the standalone rule
    return f.join(h, on="fid").group_by("pid").agg(
        in_dp=pl.when(pl.col("has").any()).then(pl.col("inside").sum() / pl.col("has").sum().clip(lower_bound=1)))


def classify_pairs(pairs: pl.DataFrame, job_pairs: pl.DataFrame, seg_flows: pl.DataFrame,
                   cfg: FlowConfig) -> pl.DataFrame:
    """pairs (pair_summary) x job_pairs -> ip_a, ip_b, job_id, comm_type, raw_type, method,
    refined, dp_group, n_flows, bytes, n_steps, mode_distinct_sizes."""
    p = pairs.join(job_pairs, on=["ip_a", "ip_b"])
    p = p.with_columns(
        raw_type=pl.when(~pl.col("periodic")).then(pl.lit("other"))
        .when(pl.col("mode_distinct_sizes") == 1).then(pl.lit("PP")).otherwise(pl.lit("DP")),
    ).with_columns(
        method=pl.when(pl.col("raw_type") == "other").then(pl.lit("aperiodic")).otherwise(pl.lit("size_count")),
        comm_type=pl.col("raw_type"),
    )

    # timing fallback for size-ambiguous pairs
    cand = p.filter(pl.col("raw_type") == "PP")
    if cand.height:
        sure = p.filter(pl.col("raw_type") == "DP")
        phases = _dp_phases(seg_flows, sure) if sure.height else None
        frac = _in_phase_fraction(seg_flows, cand, phases) if phases is not None and phases.height else \
            cand.select("pid", in_dp=pl.lit(None, dtype=pl.Float64))
        jobs_with_dp = sure["job_id"].unique()
        # the job's step count: the most common number of steps among its periodic pairs (every DP
        # pair has it; PP pairs split anywhere from one to many segments per step)
        p = p.with_columns(job_steps=pl.col("n_steps").filter(pl.col("periodic")).mode().max().over("job_id"))
        # a DP pair is split into about the job's steps (a PP pair often into many more), and the
        # fallback needs a few steps of evidence (a pair whose split found 2-3 steps is undecided)
        once_per_step = (pl.col("n_steps") <= 1.5 * pl.col("job_steps")) & (pl.col("n_steps") >= 4)
        p = p.join(frac, on="pid", how="left").with_columns(
            fb=(pl.col("raw_type") == "PP") & once_per_step
            & pl.when(pl.col("job_id").is_in(jobs_with_dp.implode()) & pl.col("in_dp").is_not_null())
            .then(pl.col("in_dp") >= cfg.fallback_in_dp_phase)
            .otherwise(pl.col("span_frac").fill_null(1.0) <= cfg.fallback_span)
        ).with_columns(
            comm_type=pl.when("fb").then(pl.lit("DP")).otherwise("comm_type"),
            method=pl.when("fb").then(pl.lit("timing_fallback")).otherwise("method"),
        ).drop("fb", "in_dp")

    # DP transitivity: connected components of the DP graph (per job: ips are unique to a job)
    ips = pl.concat([p["ip_a"], p["ip_b"]]).unique().sort()
    idx = pl.DataFrame({"ip": ips, "i": np.arange(ips.len())})
    p = p.join(idx.rename({"ip": "ip_a", "i": "a"}), on="ip_a").join(idx.rename({"ip": "ip_b", "i": "b"}), on="ip_b")
    dp = p.filter(pl.col("comm_type") == "DP")
    # propagate only from DP labels resting on several steps: a pair whose split found a few
    # steps can carry a wrong label, and transitivity would spread it over a whole stage
    dp_edges = dp.filter((pl.col("n_steps") >= cfg.min_edge_steps) & (pl.col("method") == "size_count"))
    n = ips.len()
    if n:
        g = coo_matrix((np.ones(dp_edges.height), (dp_edges["a"].to_numpy(), dp_edges["b"].to_numpy())), shape=(n, n))
        _, comp = connected_components(g, directed=False)
    else:
        comp = np.zeros(0, dtype=np.int64)
    comp_s = pl.Series(comp, dtype=pl.Int64)
    p = p.with_columns(ca=pl.col("a").map_batches(lambda s: comp_s.gather(s), return_dtype=pl.Int64),
                       cb=pl.col("b").map_batches(lambda s: comp_s.gather(s), return_dtype=pl.Int64))
    in_dp_comp = pl.col("ip_a").is_in(pl.concat([dp_edges["ip_a"], dp_edges["ip_b"]]).implode())
    p = p.with_columns(refined=(pl.col("comm_type") == "PP") & (pl.col("ca") == pl.col("cb")) & in_dp_comp)
    p = p.with_columns(
        comm_type=pl.when("refined").then(pl.lit("DP")).otherwise("comm_type"),
        method=pl.when("refined").then(pl.lit("transitivity")).otherwise("method"),
    )
    # DP groups: connected components of all final DP pairs
    dp = p.filter(pl.col("comm_type") == "DP")
    if n:
        g = coo_matrix((np.ones(dp.height), (dp["a"].to_numpy(), dp["b"].to_numpy())), shape=(n, n))
        comp_s = pl.Series(connected_components(g, directed=False)[1], dtype=pl.Int64)
    p = p.with_columns(dp_group=pl.when(pl.col("comm_type") == "DP").then(
        pl.col("a").map_batches(lambda s: comp_s.gather(s), return_dtype=pl.Int64)))
    return p.select("pid", "ip_a", "ip_b", "job_id", "comm_type", "n_flows", "bytes", "n_steps", "mode_distinct_sizes",
                    "raw_type", "method", "refined", "dp_group").sort("job_id", "ip_a", "ip_b")
