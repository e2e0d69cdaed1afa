"""Pandera schemas of the XPUTimer-style metric tables (registered; writers conform + validate)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table


_S = pa.Column(pl.Utf8)
_SN = pa.Column(pl.Utf8, nullable=True)
_I = pa.Column(pl.Int64)
_IN = pa.Column(pl.Int64, nullable=True)
_F = pa.Column(pl.Float64, nullable=True)
_R = pa.Column(pl.Int32, pa.Check.ge(0))


def _nn(dtype=pl.Float64):
    return pa.Column(dtype, pa.Check.ge(0), nullable=True)


STEP_THROUGHPUT = pa.DataFrameSchema({
    "capture_id": _S, "step": _I, "n_ranks": pa.Column(pl.Int64, pa.Check.ge(1)),
    "start_ns": _I, "end_ns": _I, "step_ns": pa.Column(pl.Int64, pa.Check.ge(0)),
    "steps_per_s": _nn(), "samples_per_s": _nn(),
    "slowest_rank": pa.Column(pl.Int32, nullable=True),
}, unique=["capture_id", "step"])

JOB_THROUGHPUT = pa.DataFrameSchema({
    "capture_id": _S, "n_steps": _I, "n_ranks": _I,
    "median_step_ns": _nn(), "p95_step_ns": _nn(), "steps_per_s": _nn(), "samples_per_s": _nn(),
}, unique=["capture_id"])

KERNEL_FLOPS = pa.DataFrameSchema({
    "capture_id": _S, "rank": _R, "name": _S, "shape": _SN,
    "n": pa.Column(pl.Int64, pa.Check.ge(1)), "flops_per_call": _nn(),
    "median_flops_per_s": _nn(), "p10_flops_per_s": _nn(),
    "ratio_to_ranks": _F,        # this rank's median / median over ranks of the same kernel+shape
}, unique=["capture_id", "rank", "name", "shape"])

COMM_INSTANCES = pa.DataFrameSchema({
    "capture_id": _S, "group": _S, "seq": _I, "collective": _S,
    "n_ranks": _I, "group_size": pa.Column(pl.Int64, nullable=True), "bytes": _nn(pl.Int64),
    "start_ns": _I, "end_ns": _I, "dur_ns": _nn(pl.Int64),
    "algbw_bps": _nn(), "busbw_bps": _nn(), "last_rank": pa.Column(pl.Int32, nullable=True),
}, unique=["capture_id", "group", "seq"])

COMM_BANDWIDTH = pa.DataFrameSchema({
    "capture_id": _S, "group": _S, "collective": _S, "group_size": pa.Column(pl.Int64, nullable=True),
    "bytes": _nn(pl.Int64), "n": _I, "median_busbw_bps": _nn(), "p10_busbw_bps": _nn(), "median_dur_ns": _nn(),
}, unique=["capture_id", "group", "collective", "bytes"])

ISSUE_LATENCY = pa.DataFrameSchema({
    "capture_id": _S, "rank": _R, "step": _IN, "name": _S, "group": _SN, "seq": _IN,
    "issue_ns": _I, "latency_ns": _nn(pl.Int64), "latency_frac": _nn(),
    "mode": pa.Column(pl.Utf8, pa.Check.isin(["device", "arrival"])),
})

ISSUE_LATENCY_SUMMARY = pa.DataFrameSchema({
    "capture_id": _S, "mode": _S, "n": _I,
    "p10": _nn(), "p25": _nn(), "p50": _nn(), "p75": _nn(), "p90": _nn(),  # of latency_frac
    "ks_vs_history": _F, "p_value": _F,
}, unique=["capture_id"])

VOID = pa.DataFrameSchema({
    "capture_id": _S, "rank": _R, "step": _I, "t_step_ns": pa.Column(pl.Int64, pa.Check.gt(0)),
    "t_inter_ns": _nn(pl.Int64), "t_minority_ns": _nn(pl.Int64), "v_inter": _nn(), "v_minority": _nn(),
    "t_traced_ns": _nn(pl.Int64),   # traced compute kernels' busy time in the step (T_minority is judged against it)
}, unique=["capture_id", "rank", "step"])

STAGE_METRICS = pa.DataFrameSchema({
    "capture_id": _S, "rank": _R, "stage": pa.Column(pl.Int32, nullable=True), "dp_rank": pa.Column(pl.Int32, nullable=True),
    "n_steps": _I, "compute_ns_per_step": _nn(), "comm_ns_per_step": _nn(), "step_span_ns": _nn(),
    "compute_ratio_to_median": _F,
}, unique=["capture_id", "rank"])

ITERATIONS = pa.DataFrameSchema({
    "capture_id": _S, "rank": _R, "iteration": _I, "start_ns": _I, "end_ns": _I,
    "dur_ns": pa.Column(pl.Int64, pa.Check.ge(0)),
})

DEGRADATIONS = pa.DataFrameSchema({
    "capture_id": _S, "rank": _R, "kind": pa.Column(pl.Utf8, pa.Check.isin(["degraded", "blocked"])),
    "at_ns": _I, "iteration": _IN, "recent_mean_ns": _nn(), "recent_min_ns": _nn(), "ratio": _F,
    "idle_ns": _IN,
})

HANG_RANKS = pa.DataFrameSchema({
    "incident": _S, "rank": _R, "in_collective": pa.Column(pl.Boolean), "collective": _SN,
    "top_function": _SN, "frames": _I, "culprit": pa.Column(pl.Boolean),
}, unique=["incident", "rank"])

HANG_COLLECTIVES = pa.DataFrameSchema({
    "incident": _S, "process_group": _S, "group_desc": _SN, "group_size": _IN, "is_p2p": pa.Column(pl.Boolean),
    "seq": _I, "collective": _S,
    "problem": pa.Column(pl.Utf8, pa.Check.isin(["missing_ranks", "collective_type_mismatch", "size_mismatch",
                                                 "not_completed", "none"])),
    "ranks": _S,            # JSON list: the ranks the problem names (missing, mismatched, not completed)
    "ranks_present": _S,    # JSON list: the ranks that issued that collective
    "issued_ns": _IN, "source": _S,
})


_READS = ("timings", "trace_events", "captures")
_HANG_READS = ("incidents", "stacks", "ring_progress", "collective_progress")
DECLARED = (
    Table("xputimer_step_throughput", STEP_THROUGHPUT, "Samples (or steps) per second per rank and step.", "captures", _READS),
    Table("xputimer_job_throughput", JOB_THROUGHPUT, "Throughput of the whole capture.", "captures", _READS),
    Table("xputimer_kernel_flops", KERNEL_FLOPS, "Achieved FLOP/s per compute kernel shape and rank, against the other ranks and "
          "shape expectations.", "captures", _READS),
    Table("xputimer_comm_instances", COMM_INSTANCES, "Each collective instance across ranks: its effective start (last rank in), "
          "duration, bus bandwidth.", "captures", _READS),
    Table("xputimer_comm_bandwidth", COMM_BANDWIDTH, "Bus bandwidth per process group, collective and message size.", "captures", _READS),
    Table("xputimer_issue_latency", ISSUE_LATENCY, "Kernel issue latency (GPU start minus CPU launch) samples.", "captures", _READS),
    Table("xputimer_issue_latency_summary", ISSUE_LATENCY_SUMMARY, "Issue-latency distribution per capture, against the job's "
          "own history (KS).", "captures", _READS),
    Table("xputimer_void", VOID, "Void percentages: V_inter (between steps) and V_minority (untraced kernels).", "captures", _READS),
    Table("xputimer_stage_metrics", STAGE_METRICS, "Compute and communication per step per rank and pipeline stage.", "captures", _READS),
    Table("xputimer_iterations", ITERATIONS, "Iterations found from the repeating API sequence (PerfTracker 4.1).", "captures", _READS),
    Table("xputimer_degradations", DEGRADATIONS, "Iterations slower than the recent shortest by more than 5 %, or a blocked job.",
          "captures", _READS),
    Table("xputimer_hang_ranks", HANG_RANKS, "Per rank of a hung job: its main thread's top frame, whether it waits in a "
          "collective, and the culprit.", "incidents", _HANG_READS),
    Table("xputimer_hang_collectives", HANG_COLLECTIVES, "Per process group of a hung job: the first collective not the same on "
          "every member (ranks missing from it, a different collective or sizes, not completed).", "incidents", _HANG_READS),
)
