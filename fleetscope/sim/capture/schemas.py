"""Schemas of what the capture renderer writes: docs/CONTRACT.md 1.4 timings files, 1.5 hw samples (landing
formats, validated before writing, not warehouse tables) and the ground-truth rows it returns
(registered as `sim_capture_truth`)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl


_nn = dict(nullable=True)

TIMINGS_OUT = pa.DataFrameSchema(
    {
        "rank": pa.Column(pl.Int32, pa.Check.ge(0)),
        "host": pa.Column(pl.Utf8, **_nn),
        "kind": pa.Column(pl.Utf8, pa.Check.isin(["kernel", "api", "op"])),
        "name": pa.Column(pl.Utf8),
        "issue_ns": pa.Column(pl.Int64),
        "start_ns": pa.Column(pl.Int64),
        "end_ns": pa.Column(pl.Int64),
        "stream": pa.Column(pl.Int64, **_nn),
        "flops": pa.Column(pl.Float64, **_nn),
        "bytes": pa.Column(pl.Int64, **_nn),
        "group": pa.Column(pl.Utf8, **_nn),
        "group_size": pa.Column(pl.Int32, **_nn),
        "shape": pa.Column(pl.Utf8, **_nn),
        "step": pa.Column(pl.Int64, **_nn),
        "stage": pa.Column(pl.Int32, **_nn),
        "dp_rank": pa.Column(pl.Int32, **_nn),
        "tp_rank": pa.Column(pl.Int32, **_nn),
        "microbatch": pa.Column(pl.Int32, **_nn),
        "model_chunk": pa.Column(pl.Int32, **_nn),
    },
    checks=[pa.Check(lambda df: df.lazyframe.select(pl.col("end_ns") >= pl.col("start_ns")), error="end_ns before start_ns"),
            pa.Check(lambda df: df.lazyframe.select(pl.col("issue_ns") <= pl.col("start_ns")), error="issued after start")],
    strict=True,
)

HW_OUT = pa.DataFrameSchema(
    {
        "ts_ns": pa.Column(pl.Int64),
        "host": pa.Column(pl.Utf8),
        "gpu": pa.Column(pl.Utf8),
        "sm_clock_mhz": pa.Column(pl.Float64, pa.Check.in_range(0, 3000)),
        "sm_clock_max_mhz": pa.Column(pl.Float64),
        "power_w": pa.Column(pl.Float64, pa.Check.ge(0)),
        "power_limit_w": pa.Column(pl.Float64),
        "temp_c": pa.Column(pl.Float64),
        "util_gpu_pct": pa.Column(pl.Float64, pa.Check.in_range(0, 100)),
        "util_mem_pct": pa.Column(pl.Float64, pa.Check.in_range(0, 100)),
        "throttle_reasons": pa.Column(pl.Int64, pa.Check.ge(0)),
        "pcie_tx_bps": pa.Column(pl.Float64, pa.Check.ge(0)),
        "pcie_rx_bps": pa.Column(pl.Float64, pa.Check.ge(0)),
        "nvlink_tx_bps": pa.Column(pl.Float64, pa.Check.ge(0)),
        "nvlink_rx_bps": pa.Column(pl.Float64, pa.Check.ge(0)),
        "nic_tx_bps": pa.Column(pl.Float64, pa.Check.ge(0)),
        "nic_rx_bps": pa.Column(pl.Float64, pa.Check.ge(0)),
    },
    strict=True,
)

TRUTH = pa.DataFrameSchema(
    {
        "fault_id": pa.Column(pl.Utf8),
        "kind": pa.Column(pl.Utf8),
        "scope": pa.Column(pl.Utf8),
        "subject": pa.Column(pl.Utf8),
        "start_ns": pa.Column(pl.Int64),
        "end_ns": pa.Column(pl.Int64),
        "magnitude": pa.Column(pl.Float64, **_nn),
        "capture_id": pa.Column(pl.Utf8),
        "job_id": pa.Column(pl.Utf8),
        "rank": pa.Column(pl.Int32, **_nn),
        "host": pa.Column(pl.Utf8, **_nn),
        "gpu": pa.Column(pl.Utf8, **_nn),
        "ip": pa.Column(pl.Utf8, **_nn),
        "stage": pa.Column(pl.Int32, **_nn),
        "dp_rank": pa.Column(pl.Int32, **_nn),
        "tp_rank": pa.Column(pl.Int32, **_nn),
        "function": pa.Column(pl.Utf8, **_nn),
        "kernel": pa.Column(pl.Utf8, **_nn),
        "team": pa.Column(pl.Utf8, pa.Check.isin(["algorithm", "infrastructure", "operations"])),
        "expected": pa.Column(pl.Utf8, **_nn),
        "mode": pa.Column(pl.Utf8, pa.Check.isin(["rank", "link"]), **_nn),  # hang only
    },
    strict=False,
)
