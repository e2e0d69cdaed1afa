"""XPUTimer aggregated metrics (section 5.2) over the normalized timings frame
(fleetscope.ingest.timings.read_timings; docs/CONTRACT.md 1.4 columns + capture_id), vectorized in polars:

- step_throughput / job_throughput: step time and rate per step and per capture (job);
- kernel_flops: per-kernel, per-shape achieved FLOP/s per rank, with the ratio to the other ranks;
- comm_instances / comm_bandwidth: bus bandwidth per collective instance and per group (nccl-tests
  convention: all-reduce bytes*2(n-1)/n/t, all-gather / reduce-scatter bytes*(n-1)/n/t, others bytes/t),
  timed from the start of the last-arriving rank to the last end, as XPUTimer does;
- issue_latencies: kernel start minus issue for communication kernels. With device timing (GPU
  events: start > issue) that is XPUTimer's definition; with wall-clock timing (CPU runs, where a
  collective starts the moment it is called) the effective start of a collective is when its last
  participant arrives, so latency = latest issue over the group's ranks - own issue ("arrival");
- void_percentages: V_inter = T_inter / T_step and V_minority = T_minority / (T_step - T_inter).
"""
from __future__ import annotations

import polars as pl

from fleetscope.common import P2P, bus_factor, collective_expr
from fleetscope.schemas.base import conform
from fleetscope.xputimer import schemas as S

_BARRIER = ("barrier",)


def _col(t: pl.DataFrame, name: str, dtype) -> pl.Expr:
    return pl.col(name) if name in t.columns else pl.lit(None, dtype=dtype).alias(name)


def prepare(t: pl.DataFrame) -> pl.DataFrame:
    """Add the derived columns the metrics share: duration, is_comm, collective (lower-case, e.g.
    `allreduce`, `send`), capture_id when absent. Rejects a frame without the required columns."""
    missing = {"rank", "kind", "name", "start_ns", "end_ns"} - set(t.columns)
    if missing:
        raise ValueError(f"timings frame lacks required column(s) {sorted(missing)} (docs/CONTRACT.md 1.4)")
    t = t.with_columns(
        _col(t, "capture_id", pl.Utf8).fill_null("capture"),
        _col(t, "issue_ns", pl.Int64).fill_null(pl.col("start_ns")).alias("issue_ns"),
        *[_col(t, c, dt) for c, dt in (("step", pl.Int64), ("bytes", pl.Int64), ("group", pl.Utf8),
                                       ("group_size", pl.Int32), ("flops", pl.Float64), ("shape", pl.Utf8),
                                       ("stream", pl.Int64), ("stage", pl.Int32), ("dp_rank", pl.Int32))
          if c not in t.columns],
    )
    # name rules on the distinct names only (a trace has 100s of kernel names over 100 Ks of rows;
    # the collective spelling rules are a chain of string tests)
    names = t.select(pl.col("name").unique().drop_nulls()).with_columns(
        comm=pl.col("name").str.to_lowercase().str.contains(r"^(nccl|rccl|gloo|hccl|mpi):"),
        coll=collective_expr(pl.col("name")))
    comm_name = pl.col("name").replace_strict(names["name"], names["comm"], default=False, return_dtype=pl.Boolean)
    coll_name = pl.col("name").replace_strict(names["name"], names["coll"], default=None, return_dtype=pl.Utf8)
    is_comm = (pl.col("kind") == "kernel") & (comm_name | pl.col("group").is_not_null())
    return t.with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        is_comm.alias("is_comm"),
        pl.when(is_comm).then(coll_name).otherwise(None).alias("collective"),
    )


# -- throughput ----------------------------------------------------------------------------------
def rank_steps(t: pl.DataFrame) -> pl.DataFrame:
    """Per capture, rank, step: the span from the first start to the last end of its rows."""
    t = prepare(t).filter(pl.col("step").is_not_null())
    return t.group_by("capture_id", "rank", "step").agg(
        pl.col("start_ns").min(), pl.col("end_ns").max()).with_columns(
        (pl.col("end_ns") - pl.col("start_ns")).alias("span_ns"))


def step_throughput(t: pl.DataFrame, samples_per_step: int | None = None) -> pl.DataFrame:
    rs = rank_steps(t)
    df = rs.group_by("capture_id", "step").agg(
        pl.len().alias("n_ranks"), pl.col("start_ns").min(), pl.col("end_ns").max(),
        # the longest span; of equal ones the lowest rank (the same capture names the same rank every run)
        pl.col("rank").sort_by(["span_ns", "rank"], descending=[False, True]).last().alias("slowest_rank"),
    ).with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("step_ns"))
    df = df.with_columns(
        (1e9 / pl.col("step_ns")).alias("steps_per_s"),
        (samples_per_step * 1e9 / pl.col("step_ns") if samples_per_step else pl.lit(None, pl.Float64)).alias("samples_per_s"),
    ).sort("capture_id", "step")
    return S.STEP_THROUGHPUT.validate(conform(df, S.STEP_THROUGHPUT))


def job_throughput(steps: pl.DataFrame, skip_first: int = 1) -> pl.DataFrame:
    """Per capture; the first `skip_first` steps (warm-up) are left out when there are enough."""
    df = steps.sort("step").group_by("capture_id").agg(
        pl.col("step_ns").slice(pl.when(pl.len() > 3 * skip_first).then(skip_first).otherwise(0)).alias("s"),
        pl.col("samples_per_s").median().alias("samples_per_s"), pl.col("n_ranks").max().alias("n_ranks"),
    ).with_columns(
        pl.col("s").list.len().cast(pl.Int64).alias("n_steps"),
        pl.col("s").list.median().cast(pl.Float64).alias("median_step_ns"),
        pl.col("s").list.eval(pl.element().quantile(0.95)).list.first().cast(pl.Float64).alias("p95_step_ns"),
    ).with_columns((1e9 / pl.col("median_step_ns")).alias("steps_per_s"))
    return S.JOB_THROUGHPUT.validate(conform(df, S.JOB_THROUGHPUT))


# -- FLOPS ---------------------------------------------------------------------------------------
def kernel_flops(t: pl.DataFrame) -> pl.DataFrame:
    t = prepare(t).filter((pl.col("kind") == "kernel") & pl.col("flops").is_not_null() & (pl.col("dur_ns") > 0)
                          & ~pl.col("is_comm"))
    t = t.with_columns((pl.col("flops") * 1e9 / pl.col("dur_ns")).alias("fps"), pl.col("shape").fill_null(""))
    df = t.group_by("capture_id", "rank", "name", "shape").agg(
        pl.len().cast(pl.Int64).alias("n"), pl.col("flops").median().alias("flops_per_call"),
        pl.col("fps").median().alias("median_flops_per_s"), pl.col("fps").quantile(0.1).alias("p10_flops_per_s"))
    df = df.with_columns(
        (pl.col("median_flops_per_s") / pl.col("median_flops_per_s").median().over("capture_id", "name", "shape"))
        .alias("ratio_to_ranks")).sort("capture_id", "name", "shape", "rank")
    return S.KERNEL_FLOPS.validate(conform(df, S.KERNEL_FLOPS))


# -- communication bandwidth ---------------------------------------------------------------------
def _sequenced_collectives(t: pl.DataFrame) -> pl.DataFrame:
    """Communication rows of group collectives (not p2p), each with `seq`: its index among the
    rank's calls in that group. Collectives in one group run in the same order on every rank, so
    (capture, group, seq) names one collective instance across ranks."""
    c = prepare(t).filter(pl.col("is_comm") & pl.col("group").is_not_null()
                          & ~pl.col("collective").is_in(P2P))
    return c.sort("issue_ns").with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).over("capture_id", "rank", "group").alias("seq"))


def comm_instances(t: pl.DataFrame) -> pl.DataFrame:
    c = _sequenced_collectives(t)
    inst = c.group_by("capture_id", "group", "seq").agg(
        pl.col("collective").first(), pl.len().cast(pl.Int64).alias("n_ranks"),
        pl.col("group_size").max().cast(pl.Int64), pl.col("bytes").max(),
        pl.col("start_ns").max().alias("start_ns"), pl.col("end_ns").max().alias("end_ns"),
        pl.col("rank").sort_by("start_ns").last().alias("last_rank"),
    ).with_columns((pl.col("end_ns") - pl.col("start_ns")).clip(lower_bound=0).alias("dur_ns"))
    gsize = pl.coalesce("group_size", "n_ranks")
    inst = inst.with_columns(
        pl.when(pl.col("dur_ns") > 0).then(pl.col("bytes") * 1e9 / pl.col("dur_ns")).alias("algbw_bps"),
    ).with_columns((pl.col("algbw_bps") * bus_factor(pl.col("collective"), gsize)).alias("busbw_bps"))
    # p2p: bytes over the transfer time on each side
    p2p = prepare(t).filter(pl.col("is_comm") & pl.col("collective").is_in(["send", "recv"])).sort("issue_ns")
    if p2p.height:
        p2p = p2p.with_columns(
            pl.int_range(pl.len(), dtype=pl.Int64).over("capture_id", "rank", "collective").alias("seq"),
            (pl.col("collective") + ":rank" + pl.col("rank").cast(pl.Utf8)).alias("group"),
        ).select("capture_id", "group", "seq", "collective", pl.lit(1, pl.Int64).alias("n_ranks"),
                 pl.lit(2, pl.Int64).alias("group_size"), "bytes", "start_ns", "end_ns",
                 pl.col("dur_ns").clip(lower_bound=0), pl.col("rank").alias("last_rank"))
        p2p = p2p.with_columns(pl.when(pl.col("dur_ns") > 0).then(pl.col("bytes") * 1e9 / pl.col("dur_ns")).alias("algbw_bps"))
        p2p = p2p.with_columns(pl.col("algbw_bps").alias("busbw_bps"))
        inst = pl.concat([conform(inst, S.COMM_INSTANCES), conform(p2p, S.COMM_INSTANCES)])
    inst = conform(inst, S.COMM_INSTANCES).sort("capture_id", "group", "seq")
    return S.COMM_INSTANCES.validate(inst)


def comm_bandwidth(inst: pl.DataFrame) -> pl.DataFrame:
    df = inst.filter(~pl.col("collective").is_in(_BARRIER) & (pl.col("bytes") > 0)).group_by(
        "capture_id", "group", "collective", "bytes").agg(
        pl.col("group_size").max(), pl.len().cast(pl.Int64).alias("n"),
        pl.col("busbw_bps").median().alias("median_busbw_bps"), pl.col("busbw_bps").quantile(0.1).alias("p10_busbw_bps"),
        pl.col("dur_ns").median().cast(pl.Float64).alias("median_dur_ns")).sort("capture_id", "group", "collective", "bytes")
    return S.COMM_BANDWIDTH.validate(conform(df, S.COMM_BANDWIDTH))


# -- issue latency -------------------------------------------------------------------------------
def issue_latencies(t: pl.DataFrame, mode: str | None = None) -> pl.DataFrame:
    """One row per communication kernel (barriers excluded) with its issue latency, and that
    latency as a fraction of the capture's median step time (comparable across jobs and runs).
    mode: 'device' (start - issue), 'arrival' (latest issue in the instance - own issue) or None to
    choose per capture: device when any communication kernel started later than it was issued."""
    c = _sequenced_collectives(t).filter(~pl.col("collective").is_in(_BARRIER))
    if c.height == 0:
        return S.ISSUE_LATENCY.validate(conform(pl.DataFrame(), S.ISSUE_LATENCY))
    dev = (pl.col("start_ns") > pl.col("issue_ns")).any().over("capture_id")
    chosen = pl.lit(mode) if mode else pl.when(dev).then(pl.lit("device")).otherwise(pl.lit("arrival"))
    c = c.with_columns(chosen.alias("mode"),
                       pl.col("issue_ns").max().over("capture_id", "group", "seq").alias("_last_issue"))
    c = c.with_columns(pl.when(pl.col("mode") == "device").then(pl.col("start_ns") - pl.col("issue_ns"))
                       .otherwise(pl.col("_last_issue") - pl.col("issue_ns")).clip(lower_bound=0).alias("latency_ns"))
    med = rank_steps(t).group_by("capture_id").agg(pl.col("span_ns").median().alias("_med"))
    c = c.join(med, on="capture_id", how="left").with_columns(
        (pl.col("latency_ns") / pl.col("_med")).alias("latency_frac"))
    return S.ISSUE_LATENCY.validate(conform(c.sort("capture_id", "rank", "issue_ns"), S.ISSUE_LATENCY))


# -- void percentages ----------------------------------------------------------------------------
def void_percentages(t: pl.DataFrame, loader_api: str = "dataloader.next") -> pl.DataFrame:
    """Per capture, rank, step (steps delimited by the first data-loader call of each step):

    T_inter = start of the first kernel *issued* after the loader call - end of the last kernel
    *issued* before it. Issue order, not device times: on a GPU the kernels queued before the
    loader call may still be running when the CPU calls it, so the kernel that last *ended* before
    the call is not the one preceding it (XPUTimer: "the last kernel preceding the dataloader and
    the first kernel following the same dataloader").
    T_minority = idle gaps between consecutive compute kernels of one stream where the second was
    already issued when the first ended (the device ran something untraced meanwhile);
    T_traced = the traced compute kernels' busy time in the step, what T_minority is judged against
    (the detector's threshold is relative to what was traced, void_rows)."""
    t = prepare(t)
    dl = (t.filter((pl.col("kind") == "api") & (pl.col("name") == loader_api) & pl.col("step").is_not_null())
          .group_by("capture_id", "rank", "step").agg(pl.col("start_ns").min().alias("dl_start"),
                                                       pl.col("end_ns").min().alias("dl_end")))
    if dl.height == 0:
        return S.VOID.validate(conform(pl.DataFrame(), S.VOID))
    dl = dl.sort("capture_id", "rank", "step").with_columns(
        pl.col("dl_start").shift(-1).over("capture_id", "rank").alias("next_dl"))
    k = t.filter(pl.col("kind") == "kernel").sort("issue_ns")
    prev = k.select("capture_id", "rank", pl.col("issue_ns").alias("_pi"), pl.col("end_ns").alias("k_end"))
    nxt = k.select("capture_id", "rank", pl.col("issue_ns").alias("_ni"), pl.col("start_ns").alias("k_start"))
    dl = dl.sort("dl_start").join_asof(prev, left_on="dl_start", right_on="_pi", by=["capture_id", "rank"], strategy="backward",
                                       check_sortedness=False)
    dl = dl.sort("dl_end").join_asof(nxt, left_on="dl_end", right_on="_ni", by=["capture_id", "rank"], strategy="forward",
                                     check_sortedness=False)
    dl = dl.with_columns((pl.col("next_dl") - pl.col("dl_start")).alias("t_step_ns"),
                         (pl.col("k_start") - pl.col("k_end")).clip(lower_bound=0).alias("t_inter_ns"))
    # minority: per stream, gaps whose next kernel was issued before the gap began
    comp = k.filter(~pl.col("is_comm") & pl.col("step").is_not_null()).with_columns(pl.col("stream").fill_null(-1)).sort("start_ns")
    comp = comp.with_columns(pl.col("end_ns").shift(1).over("capture_id", "rank", "stream", "step").alias("prev_end"))
    gaps = comp.filter(pl.col("prev_end").is_not_null() & (pl.col("issue_ns") <= pl.col("prev_end"))).with_columns(
        (pl.col("start_ns") - pl.col("prev_end")).clip(lower_bound=0).alias("gap"))
    mino = gaps.group_by("capture_id", "rank", "step").agg(pl.col("gap").sum().alias("t_minority_ns"))
    traced = comp.group_by("capture_id", "rank", "step").agg(pl.col("dur_ns").clip(lower_bound=0).sum().alias("t_traced_ns"))
    df = dl.join(mino, on=["capture_id", "rank", "step"], how="left").join(traced, on=["capture_id", "rank", "step"], how="left")
    df = df.with_columns(pl.col("t_minority_ns").fill_null(0), pl.col("t_traced_ns").fill_null(0))
    df = df.filter(pl.col("t_step_ns").is_not_null() & (pl.col("t_step_ns") > 0)).with_columns(
        pl.col("t_inter_ns").fill_null(0).clip(upper_bound=pl.col("t_step_ns")))
    df = df.with_columns((pl.col("t_inter_ns") / pl.col("t_step_ns")).alias("v_inter"),
                         pl.when(pl.col("t_step_ns") > pl.col("t_inter_ns"))
                         .then(pl.col("t_minority_ns") / (pl.col("t_step_ns") - pl.col("t_inter_ns"))).otherwise(0.0)
                         .alias("v_minority")).sort("capture_id", "rank", "step")
    return S.VOID.validate(conform(df, S.VOID))


# -- pipeline stages (op timings such as Megatron's / StragglerAnalysis) ---------------------------
def stage_metrics(t: pl.DataFrame) -> pl.DataFrame:
    """Per capture and rank: compute and communication time per step (op rows named *-compute, or
    non-communication kernels), the step span, and compute relative to the median rank."""
    t = prepare(t).filter(pl.col("step").is_not_null())
    lname = pl.col("name").str.to_lowercase()
    is_compute = pl.when(pl.col("kind") == "op").then(lname.str.contains("compute")).otherwise(
        (pl.col("kind") == "kernel") & ~pl.col("is_comm"))
    is_comm_op = pl.when(pl.col("kind") == "op").then(lname.str.contains(r"send|recv|reduce|gather|all-")).otherwise(pl.col("is_comm"))
    per = t.group_by("capture_id", "rank", "step").agg(
        pl.col("dur_ns").filter(is_compute).sum().alias("c"), pl.col("dur_ns").filter(is_comm_op).sum().alias("m"),
        (pl.col("end_ns").max() - pl.col("start_ns").min()).alias("span"),
        pl.col("stage").drop_nulls().first(), pl.col("dp_rank").drop_nulls().first())
    df = per.group_by("capture_id", "rank").agg(
        pl.col("stage").first(), pl.col("dp_rank").first(), pl.len().cast(pl.Int64).alias("n_steps"),
        pl.col("c").mean().alias("compute_ns_per_step"), pl.col("m").mean().alias("comm_ns_per_step"),
        pl.col("span").mean().alias("step_span_ns"))
    df = df.with_columns((pl.col("compute_ns_per_step") / pl.col("compute_ns_per_step").median().over("capture_id"))
                         .alias("compute_ratio_to_median")).sort("capture_id", "rank")
    return S.STAGE_METRICS.validate(conform(df, S.STAGE_METRICS))
