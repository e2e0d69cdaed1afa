"""Pandera schemas of the tables fleetscope.traces produces (listed in fleetscope.tables)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table


def _c(dtype, nullable=False, *checks):
    return pa.Column(dtype, list(checks) or None, nullable=nullable)


# NCCL/RCCL/gloo collective metadata, one row per communication kernel or collective op.
TRACE_COLLECTIVES = pa.DataFrameSchema(
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
)

# ProfilerStep#N annotations: iterations
TRACE_ITERATIONS = pa.DataFrameSchema(
    {
        "capture_id": _c(pl.Utf8),
        "rank": _c(pl.Int32),
        "iteration": _c(pl.Int64),
        "start_ns": _c(pl.Int64),
        "end_ns": _c(pl.Int64),
        "dur_ns": _c(pl.Int64, False, pa.Check.ge(0)),
    },
    strict=False,
)

# synchronization events (cuda_sync category and the synchronizing runtime calls)
TRACE_SYNCS = pa.DataFrameSchema(
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
)

KINDS = ["cpu", "gpu"]
ROLES = ["cpu_op", "runtime", "stream_sync", "context_sync", "event_sync", "event_record", "stream_wait",
         "compute", "comm", "memcpy", "memset"]
EDGE_TYPES = ["cpu_cpu", "cpu_gpu", "gpu_cpu", "gpu_gpu", "collective"]
EDGE_SUBTYPES = ["thread_order", "inter_thread", "launch", "stream_sync", "context_sync", "event_sync", "blocking_copy",
                 "stream_order", "event_wait", "inferred_wait", "peer", "comm_issue", "comm_wait", "comm_order"]

# Lumos execution graph: one row per task (CPU leaf event on a thread, GPU op on a stream)
GRAPH_TASKS = pa.DataFrameSchema(
    {
        "capture_id": _c(pl.Utf8),
        "rank": _c(pl.Int32),
        "task_id": _c(pl.Int64, False, pa.Check.ge(0)),
        "event_id": _c(pl.Int64),  # trace_events.event_id of the rank
        "kind": _c(pl.Utf8, False, pa.Check.isin(KINDS)),
        "processor": _c(pl.Utf8),  # thread:<pid>:<tid> or stream:<device>:<stream>
        "cat": _c(pl.Utf8),
        "name": _c(pl.Utf8),
        "role": _c(pl.Utf8, False, pa.Check.isin(ROLES)),
        "ts_ns": _c(pl.Int64),
        "dur_ns": _c(pl.Int64, False, pa.Check.ge(0)),
        "end_ns": _c(pl.Int64),
        "sim_dur_ns": _c(pl.Int64, False, pa.Check.ge(0)),  # duration the simulator uses (see graph.py)
        "sim_start_ref": _c(pl.Int64),  # start the simulator should reproduce for this task
        "wait_ref": _c(pl.Int64, True),  # synchronizing calls: when their wait ended in the trace
        "iteration": _c(pl.Int64, True),
        "pid": _c(pl.Utf8, True),
        "tid": _c(pl.Utf8, True),
        "device": _c(pl.Int32, True),
        "stream": _c(pl.Int64, True),
        "correlation": _c(pl.Int64, True),
        "is_comm": _c(pl.Boolean),
        "collective": _c(pl.Utf8, True),
        "msg_bytes": _c(pl.Int64, True),
        "out_msg_bytes": _c(pl.Int64, True),
        "group_size": _c(pl.Int32, True),
        "pg_name": _c(pl.Utf8, True),
        "coll_seq": _c(pl.Int64, True),
        "coll_group": _c(pl.Utf8, True),  # same value on every rank taking part in one collective
        "in_layer": _c(pl.Boolean, True),  # part of a repeated model layer (forward or backward), see graph.py
        "layer": _c(pl.Int32, True),  # the layer's number where its span names one (layers.3)
        "layer_pass": _c(pl.Utf8, True, pa.Check.isin(["fwd", "bwd"])),
        "host": _c(pl.Utf8, True),  # from Kineto's default file name <host>_<pid>.<ms>.pt.trace.json, else null
    },
    strict=False,
    unique=["task_id"],
)

GRAPH_EDGES = pa.DataFrameSchema(
    {
        "capture_id": _c(pl.Utf8),
        "rank": _c(pl.Int32),  # rank of dst
        "src_rank": _c(pl.Int32),
        "src": _c(pl.Int64),
        "dst": _c(pl.Int64),
        "edge_type": _c(pl.Utf8, False, pa.Check.isin(EDGE_TYPES)),
        "subtype": _c(pl.Utf8, False, pa.Check.isin(EDGE_SUBTYPES)),
        "lag_ns": _c(pl.Int64),  # model: dst may start lag_ns after src ends (typical delay of the edge type)
        "lag_calibrated_ns": _c(pl.Int64),  # exact where the edge bound dst in the trace
        "lag_typical_ns": _c(pl.Int64),  # typical delay everywhere, even where no dependency explains a delay
        "slack_ns": _c(pl.Int64, True),  # observed dst start - src end
        "binding": _c(pl.Boolean, True),  # this edge determined dst's start in the trace
        "from_start": _c(pl.Boolean),  # lag counts from src's start (a blocking copy's launch)
    },
    strict=False,
)

# docs/CONTRACT.mdreplays (+ iteration, + the same breakdown measured on the trace)
REPLAYS = pa.DataFrameSchema(
    {
        "capture_id": _c(pl.Utf8),
        "rank": _c(pl.Int32),
        "iteration": _c(pl.Int64, True),
        "actual_ns": _c(pl.Int64, False, pa.Check.ge(0)),
        "simulated_ns": _c(pl.Int64),
        "error_pct": _c(pl.Float64, False, pa.Check.ge(0)),
        "exposed_compute_ns": _c(pl.Int64),
        "exposed_comm_ns": _c(pl.Int64),
        "overlap_ns": _c(pl.Int64),
        "idle_ns": _c(pl.Int64),
        "actual_exposed_compute_ns": _c(pl.Int64, True),
        "actual_exposed_comm_ns": _c(pl.Int64, True),
        "actual_overlap_ns": _c(pl.Int64, True),
        "actual_idle_ns": _c(pl.Int64, True),
    },
    strict=False,
)

# share of each 1 ms bucket with any kernel running, measured and replayed
REPLAY_SM_UTIL = pa.DataFrameSchema(
    {
        "capture_id": _c(pl.Utf8),
        "rank": _c(pl.Int32),
        "bucket": _c(pl.Int64),
        "bucket_start_ns": _c(pl.Int64),  # from the start of the rank's first kernel
        "actual_util": _c(pl.Float64, False, pa.Check.in_range(0, 1.0000001)),
        "simulated_util": _c(pl.Float64, False, pa.Check.in_range(0, 1.0000001)),
    },
    strict=False,
)

# what-if predictions (Lumos 3.4)
WHATIF = pa.DataFrameSchema(
    {
        "capture_id": _c(pl.Utf8),
        "scenario": _c(pl.Utf8),
        "parameters": _c(pl.Utf8),  # JSON
        "predicted_ns": _c(pl.Int64),
        "baseline_ns": _c(pl.Int64),
        "speedup": _c(pl.Float64),
        "rank": _c(pl.Int32, True),  # null: the whole capture (slowest rank)
    },
    strict=False,
)


_READS = ("trace_events", "captures")  # captures: the layout its what-ifs need
DECLARED = (
    Table("graph_tasks", GRAPH_TASKS, "Execution-graph tasks per rank: CPU tasks on threads, GPU tasks on streams.", "captures", _READS),
    Table("graph_edges", GRAPH_EDGES, "Execution-graph edges cpu_cpu, cpu_gpu, gpu_cpu, gpu_gpu and cross-rank collective links.",
          "captures", _READS),
    Table("trace_collectives", TRACE_COLLECTIVES, "Collectives seen in the traces (kind, size, group, duration) per rank.", "captures", _READS),
    Table("trace_iterations", TRACE_ITERATIONS, "Iterations (ProfilerStep#) per rank with their spans.", "captures", _READS),
    Table("trace_syncs", TRACE_SYNCS, "Host-device synchronization events per rank.", "captures", _READS),
    Table("replays", REPLAYS, "Lumos replay per rank and iteration: actual vs simulated time, error, exposed compute / "
          "communication, overlap, idle. The simulated timeline is exported as a Chrome trace.", "captures", _READS),
    Table("replay_sm_util", REPLAY_SM_UTIL, "SM utilization per 1 ms, actual vs simulated.", "captures", _READS),
    Table("whatif", WHATIF, "What-if predictions (GEMMs 2x, attention 1.5x, sync removed, DP degree, PP re-partition, layers) "
          "re-simulated on the edited graph.", "captures", _READS),
)
