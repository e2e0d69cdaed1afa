"""Pandera schemas of the PRISM tables (registered for the warehouse)."""
from __future__ import annotations

import pandera.polars as pa
import polars as pl

from fleetscope.schemas.base import Table


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

# ---------------------------------------------------------------- stragglers (what-if analysis, prism/stragglers.py)
# one row per capture: measured, the ideal, the slowdown S and the characterization metrics
STRAGGLER_SUMMARY = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "n_ranks": pa.Column(pl.Int64, pa.Check.ge(1)),
    "n_steps": pa.Column(pl.Int64, pa.Check.ge(1)),
    "n_stages": pa.Column(pl.Int64, pa.Check.ge(1)),
    "n_dp": pa.Column(pl.Int64, pa.Check.ge(1)),
    "measured_mean_ns": pa.Column(pl.Float64, pa.Check.ge(0)),
    "nodelay_mean_ns": pa.Column(pl.Float64, pa.Check.ge(0)),     # replay of the measured durations, untraced gaps removed (T_ori)
    "ideal_ns": pa.Column(pl.Float64, pa.Check.gt(0)),            # every op typical, gaps removed (T_ideal)
    "ideal_with_gaps_ns": pa.Column(pl.Float64, pa.Check.gt(0)),  # no_stragglers: typical ops with a healthy op's variation and
                                                                  # typical launch delays (step_forecasts.no_stragglers' mean)
    "slowdown": pa.Column(pl.Float64),                            # S = nodelay_mean / ideal (paper Eq. 1)
    "measured_slowdown": pa.Column(pl.Float64),                   # measured_mean / ideal_with_gaps
    "launch_slowdown": pa.Column(pl.Float64),                     # measured_mean / nodelay_mean
    "replay_max_error": pa.Column(pl.Float64, pa.Check.ge(0)),    # |replay of measured durations and gaps / measured - 1|, max over steps
    "mw": pa.Column(pl.Float64),                                  # M_W: share of the slowdown removed by fixing the top 3 % workers
    "mw_added": pa.Column(pl.Float64),                            # the same workers alone added to the ideal
    "mw_workers": pa.Column(pl.Utf8),                             # JSON list of those ranks
    "ms": pa.Column(pl.Float64),                                  # M_S: share removed by fixing the last stage
    "ms_added": pa.Column(pl.Float64),
    "ms_stage": pa.Column(pl.Int64),                              # the last stage
    "ms_slowest": pa.Column(pl.Float64),                          # share removed by fixing the slowest stage (by S_stage)
    "slowest_stage": pa.Column(pl.Int64),
    "mseq": pa.Column(pl.Float64),                                # share removed without the microbatch effects shared along a pipeline
    "mseq_added": pa.Column(pl.Float64),
    "seq_icc": pa.Column(pl.Float64, nullable=True),              # share of microbatch compute variance shared by a pipeline's stages
    "seq_sigma": pa.Column(pl.Float64, nullable=True),            # size of that shared effect (std of its log)
}, strict=True)

# what-if attribution: every op ideal except one group as measured (slowdown, share_added), and
# every op as measured except that group ideal (fixed_step_ns, share_removed)
STRAGGLER_ATTRIBUTION = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "dimension": pa.Column(pl.Utf8, pa.Check.isin(["op_type", "stage", "dp_rank", "worker"])),
    "subject": pa.Column(pl.Utf8),                 # op type / stage / DP rank / rank
    "rank": pa.Column(pl.Int64, nullable=True),
    "stage": pa.Column(pl.Int64, nullable=True),
    "dp_rank": pa.Column(pl.Int64, nullable=True),
    "tp_rank": pa.Column(pl.Int64, nullable=True),
    "n_ops": pa.Column(pl.Int64, pa.Check.ge(0)),  # op slots of one step in the group
    "slowdown": pa.Column(pl.Float64),             # S_g: mean step with only the group as measured / ideal
    "share_added": pa.Column(pl.Float64),          # (S_g T_ideal - T_ideal) / (T_ori - T_ideal)
    "fixed_step_ns": pa.Column(pl.Float64),        # mean step with only the group ideal
    "share_removed": pa.Column(pl.Float64),        # (T_ori - fixed) / (T_ori - T_ideal)
}, strict=True)

# per step and worker: the step with only that worker as measured, over the ideal (the heatmap)
STRAGGLER_SLOWDOWN = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "step": pa.Column(pl.Int64),
    "rank": pa.Column(pl.Int64),
    "stage": pa.Column(pl.Int64),
    "dp_rank": pa.Column(pl.Int64),
    "tp_rank": pa.Column(pl.Int64),
    "slowdown": pa.Column(pl.Float64),       # only this worker as measured / ideal
    "step_slowdown": pa.Column(pl.Float64),  # every worker as measured (gaps removed) / ideal
    "measured_ns": pa.Column(pl.Float64),    # the step as measured
}, strict=True)

# verdict inputs: which worker / stage / data effect explains the slowdown, with its share
STRAGGLER_CAUSES = pa.DataFrameSchema({
    "capture_id": pa.Column(pl.Utf8),
    "cause": pa.Column(pl.Utf8, pa.Check.isin(["worker", "stage_partitioning", "sequence_length"])),
    "subject": pa.Column(pl.Utf8),
    "rank": pa.Column(pl.Int64, nullable=True),
    "stage": pa.Column(pl.Int64, nullable=True),
    "dp_rank": pa.Column(pl.Int64, nullable=True),
    "slowdown": pa.Column(pl.Float64),                # the cause alone on the ideal step
    "share_of_slowdown": pa.Column(pl.Float64),       # fraction of (T_ori - T_ideal) removed when it is fixed
    "share_added": pa.Column(pl.Float64),             # fraction added when only it is put on the ideal
    "team": pa.Column(pl.Utf8, pa.Check.isin(["algorithm", "infrastructure", "operations"])),
    "evidence": pa.Column(pl.Utf8),                   # JSON
}, strict=True)


_READS = ("timings", "trace_events", "hw", "captures")
DECLARED = (
    Table("variability_models", VARIABILITY_MODELS, "Per operation: latency distributions across ranks (spatial) and iterations "
          "(temporal), the fitted family with goodness of fit, quantiles.", "captures", _READS),
    Table("variability_hw_correlation", HW_CORRELATION, "Correlation of op latencies with SM clock / power / throttling samples.",
          "captures", _READS),
    Table("step_forecasts", STEP_FORECASTS, "Predicted step-time distributions: baseline (vs measured, KS), no_stragglers (ideal), "
          "slow-node placement, scale-out; CDF plots.", "captures", _READS),
    Table("step_forecast_details", SCENARIO_DETAILS, "The scenario sweeps behind the forecasts (placement, sync group size, kernel "
          "sensitivity, attribution).", "captures", _READS),
    Table("straggler_summary", STRAGGLER_SUMMARY, "What-if straggler analysis per capture: measured vs ideal step (every op at its "
          "typical duration), slowdown S, and the share fixing the slowest workers (M_W) or the last stage (M_S) removes.",
          "captures", _READS),
    Table("straggler_attribution", STRAGGLER_ATTRIBUTION, "Slowdown attributed by operation type, stage, data-parallel replica and "
          "worker.", "captures", _READS),
    Table("straggler_slowdown", STRAGGLER_SLOWDOWN, "Slowdown of every step on every worker (the heatmap's data).", "captures", _READS),
    Table("straggler_causes", STRAGGLER_CAUSES, "The causes found (individual worker, stage partitioning, sequence length), each "
          "with its share of the slowdown and the team that can fix it.", "captures", _READS),
)
