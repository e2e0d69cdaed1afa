"""Pandera schemas of the tables fleetscope.traces produces (registered with fleetscope.schemas)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import register

CATS = ["cpu_op", "python_function", "user_annotation", "gpu_user_annotation", "cuda_runtime", "cuda_driver",
        "kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "other"]


def _c(dtype, nullable=False, *checks):
    return pa.Column(dtype, list(checks) or None, nullable=nullable)


# docs/ARCHITECTURE.md "Shared table: trace_events"; the columns after pg_name are fleetscope.traces
# additions (nullable) that the execution graph needs.
TRACE_EVENTS = register(
    "trace_events",
    pa.DataFrameSchema(
        {
            "capture_id": _c(pl.Utf8),
            "rank": _c(pl.Int32, False, pa.Check.ge(0)),
            "source_file": _c(pl.Utf8),
            "event_id": _c(pl.Int64, False, pa.Check.ge(0)),
            "cat": _c(pl.Utf8, False, pa.Check.isin(CATS)),
            "name": _c(pl.Utf8),
            "pid": _c(pl.Utf8, True),
            "tid": _c(pl.Utf8, True),
            "ts_ns": _c(pl.Int64),
            "dur_ns": _c(pl.Int64, False, pa.Check.ge(0)),
            "end_ns": _c(pl.Int64),
            "device": _c(pl.Int32, True),
            "stream": _c(pl.Int64, True),
            "correlation": _c(pl.Int64, True),
            "external_id": _c(pl.Int64, True),
            "is_comm": _c(pl.Boolean),
            "collective": _c(pl.Utf8, True),
            "msg_bytes": _c(pl.Int64, True),
            "group_size": _c(pl.Int32, True),
            "group_ranks": _c(pl.Utf8, True),
            "pg_name": _c(pl.Utf8, True),
            # additions
            "ph": _c(pl.Utf8, True),  # X (complete) or i (instant)
            "sequence_number": _c(pl.Int64, True),  # autograd sequence number (fwd op <-> bwd op)
            "fwd_thread_id": _c(pl.Int64, True),
            "sync_kind": _c(pl.Utf8, True),  # cuda_sync: Stream Sync, Event Sync, Context Sync, Wait Event
            "wait_on_stream": _c(pl.Int64, True),
            "wait_on_event_corr": _c(pl.Int64, True),  # correlation of the cudaEventRecord waited on
            "out_msg_bytes": _c(pl.Int64, True),
            "dtype": _c(pl.Utf8, True),
        },
        strict=False,
    ),
)

# NCCL/RCCL/gloo collective metadata, one row per communication kernel or collective op.
TRACE_COLLECTIVES = register(
    "trace_collectives",
    pa.DataFrameSchema(
        {
            "capture_id": _c(pl.Utf8),
            "rank": _c(pl.Int32),
            "event_id": _c(pl.Int64),
            "cat": _c(pl.Utf8),
            "name": _c(pl.Utf8),
            "ts_ns": _c(pl.Int64),
            "dur_ns": _c(pl.Int64),
            "stream": _c(pl.Int64, True),
            "collective": _c(pl.Utf8, True),
            "msg_bytes": _c(pl.Int64, True),
            "out_msg_bytes": _c(pl.Int64, True),
            "dtype": _c(pl.Utf8, True),
            "group_size": _c(pl.Int32, True),
            "group_ranks": _c(pl.Utf8, True),
            "pg_name": _c(pl.Utf8, True),
            "seq": _c(pl.Int64),  # n-th collective of this (rank, pg, stream/op level) in time order
        },
        strict=False,
    ),
)

# ProfilerStep#N annotations: iterations
TRACE_ITERATIONS = register(
    "trace_iterations",
    pa.DataFrameSchema(
        {
            "capture_id": _c(pl.Utf8),
            "rank": _c(pl.Int32),
            "iteration": _c(pl.Int64),
            "start_ns": _c(pl.Int64),
            "end_ns": _c(pl.Int64),
            "dur_ns": _c(pl.Int64, False, pa.Check.ge(0)),
        },
        strict=False,
    ),
)

# synchronization events (cuda_sync category and the synchronizing runtime calls)
TRACE_SYNCS = register(
    "trace_syncs",
    pa.DataFrameSchema(
        {
            "capture_id": _c(pl.Utf8),
            "rank": _c(pl.Int32),
            "event_id": _c(pl.Int64),
            "source": _c(pl.Utf8, False, pa.Check.isin(["cuda_sync", "cuda_runtime"])),
            "kind": _c(pl.Utf8, False, pa.Check.isin(["stream_sync", "context_sync", "event_sync", "stream_wait_event", "event_record", "other"])),
            "name": _c(pl.Utf8),
            "ts_ns": _c(pl.Int64),
            "end_ns": _c(pl.Int64),
            "stream": _c(pl.Int64, True),
            "correlation": _c(pl.Int64, True),
            "wait_on_stream": _c(pl.Int64, True),
            "wait_on_event_corr": _c(pl.Int64, True),
        },
        strict=False,
    ),
)
