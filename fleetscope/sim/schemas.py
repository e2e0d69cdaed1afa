"""Pandera schemas of the simulator's ground truth (docs/CONTRACT.md 3) and of the flow records it renders
(docs/CONTRACT.md 1.2 columns before the per-collector format split)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl


_nonneg = pa.Check.ge(0)

TRUTH_JOBS = pa.DataFrameSchema({
    "job_id": pa.Column(pl.Utf8),
    "ip": pa.Column(pl.Utf8, unique=True),   # a GPU belongs to at most one job
    "host": pa.Column(pl.Utf8),
    "gpu": pa.Column(pl.Utf8),
    "tenant": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int32, _nonneg),
    "tp_rank": pa.Column(pl.Int32, _nonneg),
    "pp_stage": pa.Column(pl.Int32, _nonneg),
    "dp_rank": pa.Column(pl.Int32, _nonneg),
}, strict=True)

TRUTH_JOB_LAYOUT = pa.DataFrameSchema({
    "job_id": pa.Column(pl.Utf8, unique=True),
    "tenant": pa.Column(pl.Utf8),
    "tp": pa.Column(pl.Int32, pa.Check.ge(1)),
    "pp": pa.Column(pl.Int32, pa.Check.ge(1)),
    "dp": pa.Column(pl.Int32, pa.Check.ge(1)),
    "n_microbatches": pa.Column(pl.Int32, pa.Check.ge(1)),
    "n_gpus": pa.Column(pl.Int32, pa.Check.ge(1)),
    "n_hosts": pa.Column(pl.Int32, pa.Check.ge(1)),
    "dp_style": pa.Column(pl.Utf8, pa.Check.isin(["ddp", "megatron", "zero"])),
    "n_buckets": pa.Column(pl.Int32, pa.Check.ge(1)),
    "channels": pa.Column(pl.Int32, pa.Check.ge(1)),
    "act_bytes": pa.Column(pl.Int64, pa.Check.gt(0)),
    "grad_bytes": pa.Column(pl.Int64, pa.Check.gt(0)),
    "start_ns": pa.Column(pl.Int64),
    "stop_ns": pa.Column(pl.Int64, nullable=True),
    "hang_ns": pa.Column(pl.Int64, nullable=True),
    "median_step_ns": pa.Column(pl.Int64, nullable=True),
    "variable_seq": pa.Column(pl.Boolean),      # hard case: PP activation sizes vary per microbatch
    "equal_buckets": pa.Column(pl.Boolean),     # hard case: one DP flow size per step
}, strict=True)

TRUTH_PAIRS = pa.DataFrameSchema({
    "ip_a": pa.Column(pl.Utf8),
    "ip_b": pa.Column(pl.Utf8),
    "job_id": pa.Column(pl.Utf8),
    "comm_type": pa.Column(pl.Utf8, pa.Check.isin(["DP", "PP"])),
    "n_flows": pa.Column(pl.Int64, pa.Check.gt(0)),
}, checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("ip_a") < pl.col("ip_b")), name="ip_a < ip_b")], strict=True,
    unique=["ip_a", "ip_b"])

TRUTH_STEPS = pa.DataFrameSchema({
    "job_id": pa.Column(pl.Utf8),
    "ip": pa.Column(pl.Utf8),
    "step": pa.Column(pl.Int64, _nonneg),
    "start_ns": pa.Column(pl.Int64),          # end of the previous step's DP traffic on this ip
    "end_ns": pa.Column(pl.Int64),            # end of this step's DP traffic on this ip
    "compute_start_ns": pa.Column(pl.Int64),  # when the job's step began (first forward)
}, checks=[pa.Check(lambda d: d.lazyframe.select(pl.col("end_ns") > pl.col("start_ns")), name="end_ns > start_ns")],
    strict=True, unique=["job_id", "ip", "step"])

TRUTH_FAULTS = pa.DataFrameSchema({
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
    "source": pa.Column(pl.Utf8, nullable=True),     # fleet
    "captures": pa.Column(pl.Utf8, nullable=True),   # capture ids whose traces/timings show it ("|"-joined)
}, strict=False)

# the rendered records, before each collector picks its file format (duration vs end, list vs string path)
SIM_FLOWS = pa.DataFrameSchema({
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
}, strict=False)
