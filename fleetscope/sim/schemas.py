"""Pandera schemas of the simulator's ground truth (CONTRACT 3, plus the files it adds) and of the
flow records it renders (CONTRACT 1.2 columns before each collector picks its file format).
The added truth files (events, background pairs, files) are not registered as warehouse tables."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import register

_nonneg = pa.Check.ge(0)

TRUTH_JOBS = register("sim_truth_jobs", pa.DataFrameSchema({
    "job_id": pa.Column(pl.Utf8),
    "ip": pa.Column(pl.Utf8, unique=True),   # a GPU belongs to at most one job
    "host": pa.Column(pl.Utf8),
    "gpu": pa.Column(pl.Utf8),
    "tenant": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32, _nonneg),
    "tp_rank": pa.Column(pl.Int32, _nonneg),
    "pp_stage": pa.Column(pl.Int32, _nonneg),
    "dp_rank": pa.Column(pl.Int32, _nonneg),
    # the ip carries job traffic inside the window (a NIC the job's channels avoid stays silent)
    "observed": pa.Column(pl.Boolean),
    "first_seen_ns": pa.Column(pl.Int64, nullable=True),
    "last_seen_ns": pa.Column(pl.Int64, nullable=True),
}, strict=True))

TRUTH_JOB_LAYOUT = register("sim_truth_job_layout", pa.DataFrameSchema({
    "job_id": pa.Column(pl.Utf8, unique=True),
    "tenant": pa.Column(pl.Utf8),
    "tp": pa.Column(pl.Int32, pa.Check.ge(1)),
    "pp": pa.Column(pl.Int32, pa.Check.ge(1)),
    "dp": pa.Column(pl.Int32, pa.Check.ge(1)),
    "n_microbatches": pa.Column(pl.Int32, pa.Check.ge(1)),
    "n_gpus": pa.Column(pl.Int32, pa.Check.ge(1)),
    "n_hosts": pa.Column(pl.Int32, pa.Check.ge(1)),
    "gpus_per_host": pa.Column(pl.Int32, pa.Check.ge(1)),
    "dp_style": pa.Column(pl.Utf8, pa.Check.isin(["ddp", "megatron", "zero", "fsdp"])),
    "overlap": pa.Column(pl.Boolean),
    "algo": pa.Column(pl.Utf8, pa.Check.isin(["ring", "tree", "auto"])),
    "n_buckets": pa.Column(pl.Int32, pa.Check.ge(1)),
    "channels": pa.Column(pl.Int32, pa.Check.ge(1)),
    "qps": pa.Column(pl.Int32, pa.Check.ge(1)),
    "p2p_channels": pa.Column(pl.Int32, pa.Check.ge(1)),
    "nic_slots": pa.Column(pl.Utf8),
    "cross_rail": pa.Column(pl.Boolean),
    "bidir": pa.Column(pl.Boolean),
    "act_bytes": pa.Column(pl.Int64, pa.Check.gt(0)),
    "grad_bytes": pa.Column(pl.Int64, pa.Check.gt(0)),
    "target_step_ns": pa.Column(pl.Int64),
    "start_ns": pa.Column(pl.Int64),
    "launch_ns": pa.Column(pl.Int64, nullable=True),
    "stop_ns": pa.Column(pl.Int64, nullable=True),
    "crash_ns": pa.Column(pl.Int64, nullable=True),
    "hang_ns": pa.Column(pl.Int64, nullable=True),
    "median_step_ns": pa.Column(pl.Int64, nullable=True),
    "variable_seq": pa.Column(pl.Boolean),      # PP activation sizes vary per microbatch
    "equal_buckets": pa.Column(pl.Boolean),     # one DP flow size per step
    "nic_overload": pa.Column(pl.Boolean),
    "transport": pa.Column(pl.Utf8, pa.Check.isin(["rdma", "tcp"])),
}, strict=True))

TRUTH_PAIRS = register("sim_truth_pairs", pa.DataFrameSchema({
    "ip_a": pa.Column(pl.Utf8),
    "ip_b": pa.Column(pl.Utf8),
    "job_id": pa.Column(pl.Utf8),
    "comm_type": pa.Column(pl.Utf8, pa.Check.isin(["DP", "PP"])),
    "n_flows": pa.Column(pl.Int64, pa.Check.gt(0)),
}, checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("ip_a") < pl.col("ip_b")), name="ip_a < ip_b")], strict=True,
    unique=["ip_a", "ip_b"]))

TRUTH_STEPS = register("sim_truth_steps", pa.DataFrameSchema({
    "job_id": pa.Column(pl.Utf8),
    "ip": pa.Column(pl.Utf8),
    "step": pa.Column(pl.Int64, _nonneg),
    "start_ns": pa.Column(pl.Int64),          # end of the previous step's DP traffic on this ip
    "end_ns": pa.Column(pl.Int64),            # end of this step's DP traffic on this ip
    "compute_start_ns": pa.Column(pl.Int64),  # when the job's step began (first forward)
    "start_observed": pa.Column(pl.Boolean),  # False: first step after a launch (starts at compute_start_ns)
}, checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("end_ns") > pl.col("start_ns")), name="end_ns > start_ns")],
    strict=True, unique=["job_id", "ip", "step"]))

TRUTH_FAULTS = register("sim_truth_faults", pa.DataFrameSchema({
    "fault_id": pa.Column(pl.Utf8, unique=True),
    "kind": pa.Column(pl.Utf8),
    "scope": pa.Column(pl.Utf8),
    "subject": pa.Column(pl.Utf8),
    "start_ns": pa.Column(pl.Int64),
    "end_ns": pa.Column(pl.Int64),
    "magnitude": pa.Column(pl.Float64, nullable=True),
    "job_id": pa.Column(pl.Utf8, nullable=True),
    "unit": pa.Column(pl.Utf8, nullable=True),
    "team": pa.Column(pl.Utf8, nullable=True),
    "ips": pa.Column(pl.Utf8, nullable=True),
    "hosts": pa.Column(pl.Utf8, nullable=True),
    "ranks": pa.Column(pl.Utf8, nullable=True),
    "affected_jobs": pa.Column(pl.Utf8, nullable=True),
    # mean step time of the job it hurts most, with / without this fault (1.0: no visible effect)
    "impact": pa.Column(pl.Float64, nullable=True),
    "source": pa.Column(pl.Utf8, nullable=True),     # fleet
    "captures": pa.Column(pl.Utf8, nullable=True),   # capture ids whose traces/timings show it ("|"-joined)
}, strict=False))

TRUTH_EVENTS = (pa.DataFrameSchema({
    "event_id": pa.Column(pl.Utf8, unique=True),
    "kind": pa.Column(pl.Utf8, pa.Check.isin(["launch", "checkpoint_load", "first_step", "checkpoint_save",
                                               "dataloader_stall", "finish", "crash"])),
    "job_id": pa.Column(pl.Utf8),
    "scope": pa.Column(pl.Utf8),
    "subject": pa.Column(pl.Utf8),
    "start_ns": pa.Column(pl.Int64),
    "end_ns": pa.Column(pl.Int64),
    "step": pa.Column(pl.Int64, nullable=True),
    "magnitude": pa.Column(pl.Float64, nullable=True),
    "note": pa.Column(pl.Utf8, nullable=True),
}, checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("end_ns") >= pl.col("start_ns")), name="end_ns >= start_ns")],
    strict=True))

TRUTH_BACKGROUND = (pa.DataFrameSchema({
    "ip_a": pa.Column(pl.Utf8),
    "ip_b": pa.Column(pl.Utf8),
    "role": pa.Column(pl.Utf8, pa.Check.isin(["storage", "checkpoint", "monitoring", "probe", "control"])),
    "job_id": pa.Column(pl.Utf8, nullable=True),    # control / checkpoint / storage traffic of this job
    "n_flows": pa.Column(pl.Int64, pa.Check.gt(0)),
}, checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("ip_a") < pl.col("ip_b")), name="ip_a < ip_b")],
    strict=True, unique=["ip_a", "ip_b", "role"]))

TRUTH_FILES = (pa.DataFrameSchema({
    "file": pa.Column(pl.Utf8, unique=True),
    "kind": pa.Column(pl.Utf8, pa.Check.isin(["flows", "topology"])),
    "collector": pa.Column(pl.Int64, nullable=True),
    "format": pa.Column(pl.Utf8, pa.Check.isin(["parquet", "csv", "csv.gz"])),
    "codec": pa.Column(pl.Utf8, nullable=True),
    "dialect": pa.Column(pl.Utf8, nullable=True),
    "time_columns": pa.Column(pl.Utf8, nullable=True),
    "path_style": pa.Column(pl.Utf8, nullable=True),
    "cutting": pa.Column(pl.Utf8, nullable=True),
    "n_records": pa.Column(pl.Int64, _nonneg),
    "first_start_ns": pa.Column(pl.Int64, nullable=True),
    "last_start_ns": pa.Column(pl.Int64, nullable=True),
    "role": pa.Column(pl.Utf8, pa.Check.isin(["regular", "late", "duplicate"])),
    "duplicate_of": pa.Column(pl.Utf8, nullable=True),
}, strict=True))

# the rendered records, before each collector picks its file format (duration vs end, list vs string path)
SIM_FLOWS = register("sim_rendered_flows", pa.DataFrameSchema({
    "start_ns": pa.Column(pl.Int64),
    "duration_ns": pa.Column(pl.Int64, _nonneg),
    "src_ip": pa.Column(pl.Utf8),
    "dst_ip": pa.Column(pl.Utf8),
    "bytes": pa.Column(pl.Int64, pa.Check.gt(0)),
    "packets": pa.Column(pl.Int64, pa.Check.gt(0)),
    "src_port": pa.Column(pl.Int64),
    "dst_port": pa.Column(pl.Int64),
    "src_qp": pa.Column(pl.Int64, nullable=True),
    "dst_qp": pa.Column(pl.Int64, nullable=True),
    "path": pa.Column(pl.Utf8),
}, strict=False))
