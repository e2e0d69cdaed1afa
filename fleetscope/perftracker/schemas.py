"""Schemas of the tables fleetscope.perftracker writes (registered with fleetscope.schemas)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table, conform

CATEGORIES = ["compute", "memory", "collective", "python"]
MU_SOURCES = ["hw_alg1", "hw_nearest", "trace_bytes", "trace_speed", "none"]
DIMENSIONS = ["beta", "mu", "sigma"]

_unit = pa.Check.in_range(0.0, 1.0)

BEHAVIOR_PATTERNS = pa.DataFrameSchema(
    {
        # docs/CONTRACT.mdcolumns
        "capture_id": pa.Column(pl.Utf8),
        "rank": pa.Column(pl.Int32),
        "function": pa.Column(pl.Utf8),  # kernel / op name, or the full call stack of a CPU function
        "category": pa.Column(pl.Utf8, pa.Check.isin(CATEGORIES)),
        "beta": pa.Column(pl.Float64, _unit),  # share of the window on the critical path
        "mu": pa.Column(pl.Float64, _unit, nullable=True),  # mean utilization of the bounding resource
        "sigma": pa.Column(pl.Float64, _unit, nullable=True),  # its standard deviation
        "d_exp": pa.Column(pl.Float64, pa.Check.ge(0.0), nullable=True),  # distance from the expected box
        "d_diff": pa.Column(pl.Int64, pa.Check.ge(0), nullable=True),  # sampled peers that differ by > theta
        "abnormal": pa.Column(pl.Boolean, nullable=True),
        # additions
        "stage": pa.Column(pl.Int32, nullable=True),  # pipeline stage when known
        "function_name": pa.Column(pl.Utf8, nullable=True),  # leaf of the call stack
        "resource": pa.Column(pl.Utf8, nullable=True),  # sm, memory, cpu, nvlink, nic, link (trace bandwidth)
        "mu_source": pa.Column(pl.Utf8, pa.Check.isin(MU_SOURCES), nullable=True),
        "n_exec": pa.Column(pl.Int64, pa.Check.ge(0), nullable=True),
        "crit_ns": pa.Column(pl.Int64, pa.Check.ge(0), nullable=True),  # critical time before Algorithm 1
        "window_ns": pa.Column(pl.Int64, pa.Check.ge(0), nullable=True),
        "peer_stage": pa.Column(pl.Int32, nullable=True),  # peers = workers of this stage (null: all workers)
        "n_peers": pa.Column(pl.Int64, nullable=True),  # |S|, the sampled peers
        "d_diff_threshold": pa.Column(pl.Float64, nullable=True),  # median + k MAD of the group
        "diff_dim": pa.Column(pl.Utf8, nullable=True),  # dimension farthest from the group median
        "diff_delta": pa.Column(pl.Float64, nullable=True),  # that dimension minus the group median (raw)
        "diff_material": pa.Column(pl.Boolean, nullable=True),  # beta or mu differs by >= 0.75 theta (normalized)
        "exp_dim": pa.Column(pl.Utf8, nullable=True),  # dimension farthest outside the expected box
        "reason": pa.Column(pl.Utf8, nullable=True),  # expectation / differential / both / stage_imbalance / rank
        "container": pa.Column(pl.Boolean, nullable=True),  # an annotation or wrapper: its exclusive time is untraced work
        "expected_source": pa.Column(pl.Utf8, nullable=True),  # where an expectation came from: config / history
        "expected_beta_hi": pa.Column(pl.Float64, nullable=True),  # the highest beta expected (config box or job history)
        "impact": pa.Column(pl.Float64, nullable=True),  # share of the window the finding costs (materiality)
    },
    # one row per (capture_id, rank, function) by construction (group_by); not re-checked here
    # because pandera's uniqueness check costs seconds per million rows
    strict=False,
)


def finish_patterns(df: pl.DataFrame) -> pl.DataFrame:
    """Conform to BEHAVIOR_PATTERNS (missing optional columns become null) and validate."""
    return BEHAVIOR_PATTERNS.validate(conform(df, BEHAVIOR_PATTERNS))


DECLARED = (
    Table("behavior_patterns", BEHAVIOR_PATTERNS, "PerfTracker behaviour pattern (beta, mu, sigma) of every function on every "
          "worker, distances from expectation and from peers (stage-aware), abnormal flag.", "captures",
          ("trace_events", "timings", "hw", "captures")),
)
