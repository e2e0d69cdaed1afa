"""Schemas of the ingested landing tables (docs/CONTRACT.md section 1), normalized."""
import ipaddress

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table


_ID = pa.Column(pl.Utf8)
_OPT_STR = dict(nullable=True)


def _is_address(v: str | None) -> bool:
    try:
        ipaddress.ip_address(v)
        return True
    except ValueError:
        return False


def _addresses(data) -> pl.LazyFrame:
    """Per row: the column parses as an IPv4 or IPv6 address (each distinct value parsed once)."""
    def ok(s: pl.Series) -> pl.Series:
        good = {v: _is_address(v) for v in s.unique().drop_nulls().to_list()}
        return s.replace_strict(good, default=False, return_dtype=pl.Boolean)
    return data.lazyframe.select(pl.col(data.key).map_batches(ok, return_dtype=pl.Boolean))


# an address that is not one (a name, a typo, a shifted column) is quarantined with this reason
_ADDRESS = pa.Check(_addresses, error="not an IPv4 or IPv6 address")

TOPOLOGY = pa.DataFrameSchema({
    "ip": pa.Column(pl.Utf8, [pa.Check.str_length(min_value=1), _ADDRESS]),
    "host": pa.Column(pl.Utf8, pa.Check.str_length(min_value=1)),
    "gpu": pa.Column(pl.Utf8, nullable=True),
    "leaf": pa.Column(pl.Utf8, nullable=True),
    "spine": pa.Column(pl.Utf8, nullable=True),
    "rail": pa.Column(pl.Int32, nullable=True),
    "rack": pa.Column(pl.Utf8, nullable=True),
    "pod": pa.Column(pl.Utf8, nullable=True),
    "source_file": pa.Column(pl.Utf8),
})

FLOWS = pa.DataFrameSchema({
    "start_ns": pa.Column(pl.Int64, pa.Check.ge(0)),
    "end_ns": pa.Column(pl.Int64),
    "duration_ns": pa.Column(pl.Int64, pa.Check.ge(0, error="duration must be >= 0 (end before start)")),
    "src_ip": pa.Column(pl.Utf8, [pa.Check.str_length(min_value=1), _ADDRESS]),
    "dst_ip": pa.Column(pl.Utf8, [pa.Check.str_length(min_value=1), _ADDRESS]),
    "bytes": pa.Column(pl.Int64, pa.Check.gt(0, error="bytes must be > 0")),
    "packets": pa.Column(pl.Int64, pa.Check.ge(0), nullable=True),
    "src_port": pa.Column(pl.Int32, nullable=True),
    "dst_port": pa.Column(pl.Int32, nullable=True),
    "src_qp": pa.Column(pl.Int64, nullable=True),
    "dst_qp": pa.Column(pl.Int64, nullable=True),
    "path": pa.Column(pl.List(pl.Utf8), nullable=True),
    "source_file": pa.Column(pl.Utf8),
})

TIMINGS = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32, pa.Check.ge(0)),
    "host": pa.Column(pl.Utf8, nullable=True),
    "kind": pa.Column(pl.Utf8, pa.Check.isin(["kernel", "api", "op"])),
    "name": pa.Column(pl.Utf8, pa.Check.str_length(min_value=1)),
    "issue_ns": pa.Column(pl.Int64),
    "start_ns": pa.Column(pl.Int64),
    "end_ns": pa.Column(pl.Int64),
    "duration_ns": pa.Column(pl.Int64, pa.Check.ge(0, error="duration must be >= 0 (end before start)")),
    "stream": pa.Column(pl.Int64, nullable=True),
    "flops": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "bytes": pa.Column(pl.Int64, pa.Check.ge(0), nullable=True),
    "group": pa.Column(pl.Utf8, nullable=True),
    "group_size": pa.Column(pl.Int32, pa.Check.ge(1), nullable=True),
    "shape": pa.Column(pl.Utf8, nullable=True),
    "step": pa.Column(pl.Int64, nullable=True),
    "stage": pa.Column(pl.Int32, nullable=True),
    "dp_rank": pa.Column(pl.Int32, nullable=True),
    "tp_rank": pa.Column(pl.Int32, nullable=True),
    "microbatch": pa.Column(pl.Int32, nullable=True),
    "model_chunk": pa.Column(pl.Int32, nullable=True),
    "source_file": pa.Column(pl.Utf8),
})

HW = pa.DataFrameSchema({
    "ts_ns": pa.Column(pl.Int64, pa.Check.ge(0)),
    "host": pa.Column(pl.Utf8),
    "gpu": pa.Column(pl.Utf8),
    "sm_clock_mhz": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "sm_clock_max_mhz": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "power_w": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "power_limit_w": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "temp_c": pa.Column(pl.Float64, nullable=True),
    "util_gpu_pct": pa.Column(pl.Float64, pa.Check.in_range(0, 100), nullable=True),
    "util_mem_pct": pa.Column(pl.Float64, pa.Check.in_range(0, 100), nullable=True),
    "throttle_reasons": pa.Column(pl.Int64, pa.Check.ge(0), nullable=True),
    "pcie_tx_bps": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "pcie_rx_bps": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "nvlink_tx_bps": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "nvlink_rx_bps": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "nic_tx_bps": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "nic_rx_bps": pa.Column(pl.Float64, pa.Check.ge(0), nullable=True),
    "sm_active_pct": pa.Column(pl.Float64, pa.Check.in_range(0, 100), nullable=True),
    "cpu_util_pct": pa.Column(pl.Float64, pa.Check.in_range(0, 100), nullable=True),
    "source_file": pa.Column(pl.Utf8),
})

# Capture-level layout when known (capture.json "parallel" or StragglerAnalysis meta yaml).
CAPTURES = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "job_id": pa.Column(pl.Utf8, nullable=True),
    "note": pa.Column(pl.Utf8, nullable=True),
    "dp": pa.Column(pl.Int32, nullable=True),
    "pp": pa.Column(pl.Int32, nullable=True),
    "tp": pa.Column(pl.Int32, nullable=True),
    "vpp": pa.Column(pl.Int32, nullable=True),
    "world_size": pa.Column(pl.Int32, nullable=True),
    "n_trace_files": pa.Column(pl.Int32),
    "n_timing_files": pa.Column(pl.Int32),
    "start_ns": pa.Column(pl.Int64, nullable=True),  # first trace event / timing row: orders a job's captures
    "end_ns": pa.Column(pl.Int64, nullable=True),
    # additions (issue 23): where dp / pp / tp / world_size came from (capture.json, the traces' process
    # groups, their send/recv peers and collectives, ...), and what the traces cannot give, in words
    "layout_source": pa.Column(pl.Utf8, nullable=True),
    "notes": pa.Column(pl.Utf8, nullable=True),
})

# one row per ingested profiler trace file: what the file says about its rank and the job (Kineto's
# distributedInfo: world size, backend and the process groups the rank belongs to, as JSON)
TRACE_FILES = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32, pa.Check.ge(0)),
    "source_file": pa.Column(pl.Utf8),
    "rank_source": pa.Column(pl.Utf8),                 # distributedInfo, file_name, single_process, argument
    "world_size": pa.Column(pl.Int32, nullable=True),
    "backend": pa.Column(pl.Utf8, nullable=True),
    "pg_config": pa.Column(pl.Utf8, nullable=True),    # distributedInfo.pg_config as JSON (pg_name, pg_desc, pg_size, ranks)
    "host_name": pa.Column(pl.Utf8, nullable=True),    # Kineto's host_name, when the trace carries it
    "is_gpu": pa.Column(pl.Boolean),
    "n_events": pa.Column(pl.Int64),
}, unique=["capture_id", "rank"])

STACKS = pa.DataFrameSchema({
    "incident_id": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32, pa.Check.ge(0)),
    "text": pa.Column(pl.Utf8),
    "n_frames": pa.Column(pl.Int32),
    "source_file": pa.Column(pl.Utf8),
})

COLLECTIVE_PROGRESS = pa.DataFrameSchema({   # fr_rank<R>.json / Flight Recorder dumps (fleetscope.ingest.flight_recorder)
    "incident_id": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32, pa.Check.ge(0)),
    "pg": pa.Column(pl.Utf8), "pg_desc": pa.Column(pl.Utf8, nullable=True),
    "seq": pa.Column(pl.Int64), "is_p2p": pa.Column(pl.Boolean), "peer": pa.Column(pl.Int32, nullable=True),
    "collective": pa.Column(pl.Utf8), "sizes": pa.Column(pl.Utf8, nullable=True), "state": pa.Column(pl.Utf8, nullable=True),
    "created_ns": pa.Column(pl.Int64, nullable=True), "completed_ns": pa.Column(pl.Int64, nullable=True),
    "source": pa.Column(pl.Utf8), "source_file": pa.Column(pl.Utf8),
})

RING = pa.DataFrameSchema({
    "incident_id": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32, pa.Check.ge(0)),
    "peer": pa.Column(pl.Int32, pa.Check.ge(0)),
    "channel": pa.Column(pl.Int32, nullable=True),
    "step": pa.Column(pl.Int64, pa.Check.ge(0)),
    "source_file": pa.Column(pl.Utf8),
})

INCIDENTS = pa.DataFrameSchema({
    "incident_id": pa.Column(pl.Utf8),
    "kind": pa.Column(pl.Utf8, pa.Check.isin(["slow", "hang"])),
    "job_id": pa.Column(pl.Utf8, nullable=True),
    "ips": pa.Column(pl.List(pl.Utf8), nullable=True),
    "hosts": pa.Column(pl.List(pl.Utf8), nullable=True),
    "capture": pa.Column(pl.Utf8, nullable=True),
    "from_ns": pa.Column(pl.Int64, nullable=True),
    "to_ns": pa.Column(pl.Int64, nullable=True),
    "note": pa.Column(pl.Utf8, nullable=True),
    "source_file": pa.Column(pl.Utf8),
})

REJECTED = pa.DataFrameSchema({
    "source_file": pa.Column(pl.Utf8),
    "source_kind": pa.Column(pl.Utf8),
    "row_number": pa.Column(pl.Int64, nullable=True),  # 1-based data row; null for a whole-file rejection
    "reason": pa.Column(pl.Utf8, pa.Check.str_length(min_value=1)),
    "partition_key": pa.Column(pl.Utf8, nullable=True),
    "content_sha256": pa.Column(pl.Utf8, nullable=True),
    "detected_ns": pa.Column(pl.Int64),
})

LANDED = pa.DataFrameSchema({
    "path": pa.Column(pl.Utf8),
    "kind": pa.Column(pl.Utf8),
    "partition_key": pa.Column(pl.Utf8),
    "content_sha256": pa.Column(pl.Utf8),
    "size_bytes": pa.Column(pl.Int64, pa.Check.ge(0)),
    "mtime_ns": pa.Column(pl.Int64),
    "partition_set": pa.Column(pl.Utf8),
    "status": pa.Column(pl.Utf8, pa.Check.isin(["registered", "duplicate"])),
    "duplicate_of": pa.Column(pl.Utf8, nullable=True),
    "registered_ns": pa.Column(pl.Int64),
})


def _c(dtype, nullable=False, *checks):
    return pa.Column(dtype, list(checks) or None, nullable=nullable)


# profiler event categories, normalized by fleetscope.ingest.traces
TRACE_CATEGORIES = ["cpu_op", "python_function", "user_annotation", "gpu_user_annotation", "cuda_runtime", "cuda_driver",
                    "kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "other"]


# docs/CONTRACT.md 2.1 "trace_events"; the columns after pg_name are fleetscope.traces
# additions (nullable) that the execution graph needs.
TRACE_EVENTS = pa.DataFrameSchema(
    {
        "capture_id": _c(pl.Utf8),
        "rank": _c(pl.Int32, False, pa.Check.ge(0)),
        "source_file": _c(pl.Utf8),
        "event_id": _c(pl.Int64, False, pa.Check.ge(0)),
        "cat": _c(pl.Utf8, False, pa.Check.isin(TRACE_CATEGORIES)),
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
    "weight_bytes": _c(pl.Int64, True),  # linear / conv / embedding / norm operators: bytes of the parameters they read
    "peer": _c(pl.Int32, True),  # point-to-point peer: Kineto's "Dst Rank" / "Src Rank" (global), else c10d::send / recv_'s argument (its group's rank)
    },
    strict=False,
)


DECLARED = (
    Table("topology", TOPOLOGY, "Cluster topology snapshots (docs/CONTRACT.md 1.1), one partition per landed file.",
          "topology_files"),
    Table("flows", FLOWS, "Switch-mirrored flow records (docs/CONTRACT.md 1.2), normalized; shows the time windows it touches "
          "(the planner analyses them).", "flow_files"),
    Table("timings", TIMINGS, "Lightweight tracer timings and StragglerAnalysis per-op traces of a capture (docs/CONTRACT.md 1.4).",
          "captures"),
    Table("hw", HW, "GPU hardware samples (docs/CONTRACT.md 1.5), one partition per landed file.", "hw_files"),
    Table("captures", CAPTURES, "One row per capture: job id, parallel layout (capture.json or StragglerAnalysis meta), file counts.",
          "captures", ("timings", "trace_events", "trace_files")),
    Table("stacks", STACKS, "Stack dumps of every rank taken during a hang (docs/CONTRACT.md 1.6).", "incidents"),
    Table("ring_progress", RING, "The loop step each ring connection reached inside a hung collective (ring.json).", "incidents"),
    Table("collective_progress", COLLECTIVE_PROGRESS, "Each rank's recent collectives during a hang (PyTorch Flight Recorder dumps "
          "or the fleetscope tracer's progress, fr_rank<R>.json).", "incidents"),
    Table("incidents", INCIDENTS, "Incident requests (docs/CONTRACT.md 1.7): what an SRE or a sensor asked to look at.", "incidents"),
    Table("rejected_records", REJECTED, "Every row and file ingestion refused, with the reason (each ingest asset writes its slice).",
          "slices"),
    Table("landed_files", LANDED, "Every landed file, identified by content: its partition, size, hash (the landing registration "
          "writes it; no asset).", "slices"),
    Table("trace_events", TRACE_EVENTS, "PyTorch profiler traces of a capture parsed into trace_events (one row per event, per rank).",
          "captures"),
    Table("trace_files", TRACE_FILES, "One row per trace file: its rank and what its distributedInfo says about the job (world size, "
          "backend, the process groups the rank belongs to).", "captures"),
)
