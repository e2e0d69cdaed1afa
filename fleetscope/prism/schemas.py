"""Pandera schemas of the PRISM tables (registered for the warehouse)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl


_DIMS = ["temporal", "spatial"]

VARIABILITY_MODELS = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "op_name": pa.Column(pl.Utf8),
    "dimension": pa.Column(pl.Utf8, pa.Check.isin(_DIMS)),
    "unit": pa.Column(pl.Utf8, pa.Check.isin(["ratio", "ns"])),   # temporal: ratio to the slot's typical duration
    "family": pa.Column(pl.Utf8, pa.Check.isin(["constant", "normal", "lognormal", "gamma", "mixture", "empirical"])),
    "selected": pa.Column(pl.Boolean),
    "n": pa.Column(pl.Int64, pa.Check.ge(1)),
    "mean": pa.Column(pl.Float64),
    "std": pa.Column(pl.Float64, pa.Check.ge(0)),
    "cv": pa.Column(pl.Float64, nullable=True),
    "p5": pa.Column(pl.Float64), "p50": pa.Column(pl.Float64), "p95": pa.Column(pl.Float64), "p99": pa.Column(pl.Float64),
    "ks_stat": pa.Column(pl.Float64, pa.Check.in_range(0, 1)),
    "ks_pvalue": pa.Column(pl.Float64, pa.Check.in_range(0, 1)),
    "aic": pa.Column(pl.Float64, nullable=True),
    "params": pa.Column(pl.Utf8),  # JSON of the family's parameters
}, strict=True)

HW_CORRELATION = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "op_name": pa.Column(pl.Utf8),
    "metric": pa.Column(pl.Utf8, pa.Check.isin(["sm_clock_mhz", "power_w", "temp_c", "throttled", "throttle:sw_power_cap",
                                                "throttle:hw_slowdown", "throttle:sw_thermal", "throttle:hw_thermal",
                                                "throttle:hw_power_brake"])),
    "n": pa.Column(pl.Int64, pa.Check.ge(1)),
    "spearman_r": pa.Column(pl.Float64, pa.Check.in_range(-1, 1), nullable=True),
    "p_value": pa.Column(pl.Float64, nullable=True),
    "ratio_low": pa.Column(pl.Float64, nullable=True),   # mean duration ratio, metric <= its median / not throttled
    "ratio_high": pa.Column(pl.Float64, nullable=True),  # metric > median / throttled
    "share_high": pa.Column(pl.Float64, pa.Check.in_range(0, 1), nullable=True),
}, strict=True)

STEP_FORECASTS = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "scenario": pa.Column(pl.Utf8),
    "n_ranks": pa.Column(pl.Int64, pa.Check.ge(1)),
    "mean_ns": pa.Column(pl.Float64, pa.Check.ge(0)),
    "p5_ns": pa.Column(pl.Float64, pa.Check.ge(0)),
    "p50_ns": pa.Column(pl.Float64, pa.Check.ge(0)),
    "p95_ns": pa.Column(pl.Float64, pa.Check.ge(0)),
    "ks_vs_measured": pa.Column(pl.Float64, pa.Check.in_range(0, 1), nullable=True),
    # additions: mean error vs the measured steps, how many samples / measured steps, scenario knobs
    "mean_error_pct": pa.Column(pl.Float64, nullable=True),
    "measured_mean_ns": pa.Column(pl.Float64, nullable=True),
    "n_samples": pa.Column(pl.Int64, pa.Check.ge(1)),
    "n_measured": pa.Column(pl.Int64, nullable=True),
    "params": pa.Column(pl.Utf8, nullable=True),
}, strict=True)

# the scenario sweeps behind the named what-ifs (one row per point of a sweep)
SCENARIO_DETAILS = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "scenario": pa.Column(pl.Utf8, pa.Check.isin(["slow_node_placement", "sync_group_size", "kernel_sensitivity", "scale_slowdown", "attribution"])),
    "subject": pa.Column(pl.Utf8),          # stage / TP position / group size / op name / rank count
    "parameter": pa.Column(pl.Utf8, nullable=True),
    "mean_ns": pa.Column(pl.Float64, nullable=True),
    "p50_ns": pa.Column(pl.Float64, nullable=True),
    "p95_ns": pa.Column(pl.Float64, nullable=True),
    "slowdown": pa.Column(pl.Float64, nullable=True),     # vs the scenario's reference
    "probability": pa.Column(pl.Float64, pa.Check.in_range(0, 1), nullable=True),
    "rank_order": pa.Column(pl.Int64, nullable=True),     # 1 = hurts most
}, strict=True)
