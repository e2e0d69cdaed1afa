"""Derived trace tables from trace_events: collectives (NCCL metadata), iterations (ProfilerStep#N)
and synchronization events."""
from __future__ import annotations

import polars as pl

from fleetscope.schemas.base import conform
from fleetscope.traces.schemas import TRACE_COLLECTIVES, TRACE_ITERATIONS, TRACE_SYNCS

_STEP_RX = r"^ProfilerStep#(\d+)$"


def trace_collectives(events: pl.DataFrame) -> pl.DataFrame:
    """One row per communication kernel, or per collective op on ranks without GPU kernels (gloo):
    collective, message size (nelems x dtype size), group, process group, and its sequence number
    within (rank, process group or stream, collective) in time order."""
    comm = events.filter(pl.col("is_comm"))
    has_kernel = comm.filter(pl.col("cat") == "kernel").select("rank").unique().with_columns(_k=pl.lit(True))
    comm = comm.join(has_kernel, on="rank", how="left").filter(
        pl.when(pl.col("_k").fill_null(False)).then(pl.col("cat") == "kernel")
        # CPU-only ranks: the outermost collective ops (gloo:all_reduce annotations, c10d ops)
        .otherwise(pl.col("collective").is_not_null() & (pl.col("cat") == "user_annotation") | (pl.col("cat") == "cpu_op")
                   & pl.col("msg_bytes").is_not_null()))
    key = pl.coalesce(pl.col("pg_name"), pl.lit("stream") + pl.col("stream").cast(pl.Utf8), pl.lit("cpu"))
    comm = comm.sort(["rank", "ts_ns"]).with_columns(
        seq=pl.int_range(pl.len()).over(["rank", key, pl.col("collective").fill_null("?")]).cast(pl.Int64))
    return TRACE_COLLECTIVES.validate(conform(comm, TRACE_COLLECTIVES))


def trace_iterations(events: pl.DataFrame) -> pl.DataFrame:
    """ProfilerStep#N annotations per rank: the step's CPU span (start, end of the annotation)."""
    st = events.filter((pl.col("cat") == "user_annotation") & pl.col("name").str.contains(_STEP_RX)).select(
        "capture_id", "rank", iteration=pl.col("name").str.extract(_STEP_RX, 1).cast(pl.Int64),
        start_ns=pl.col("ts_ns"), end_ns=pl.col("end_ns"), dur_ns=pl.col("dur_ns"))
    st = st.sort(["rank", "start_ns"]).unique(["rank", "iteration"], keep="first", maintain_order=True)
    return TRACE_ITERATIONS.validate(conform(st, TRACE_ITERATIONS))


_KIND = {"Stream Sync": "stream_sync", "Context Sync": "context_sync", "Event Sync": "event_sync",
         "Stream Wait Event": "stream_wait_event"}


def trace_syncs(events: pl.DataFrame) -> pl.DataFrame:
    """cuda_sync events (the profiler's view of synchronizations), plus the synchronizing runtime
    calls of traces that have no cuda_sync events."""
    cs = events.filter(pl.col("cat") == "cuda_sync").select(
        "capture_id", "rank", "event_id", "name", "ts_ns", "end_ns", "correlation", "wait_on_stream", "wait_on_event_corr",
        source=pl.lit("cuda_sync"), kind=pl.col("sync_kind").replace_strict(_KIND, default="other"),
        stream=pl.when(pl.col("stream") >= 0).then(pl.col("stream")))
    name = pl.col("name").str.replace(r"^(cuda|hip)", "")
    rt = events.filter((pl.col("cat") == "cuda_runtime") & name.str.contains(
        r"^(StreamSynchronize|DeviceSynchronize|EventSynchronize|StreamWaitEvent|EventRecord)$")).select(
        "capture_id", "rank", "event_id", "name", "ts_ns", "end_ns", "correlation",
        source=pl.lit("cuda_runtime"),
        kind=pl.when(name == "StreamSynchronize").then(pl.lit("stream_sync"))
        .when(name == "DeviceSynchronize").then(pl.lit("context_sync"))
        .when(name == "EventSynchronize").then(pl.lit("event_sync"))
        .when(name == "StreamWaitEvent").then(pl.lit("stream_wait_event"))
        .otherwise(pl.lit("event_record")))
    out = pl.concat([cs, rt], how="diagonal_relaxed")
    return TRACE_SYNCS.validate(conform(out, TRACE_SYNCS))
