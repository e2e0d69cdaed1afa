"""One call per capture: patterns -> localization -> verdicts. analyze_capture returns the
Analysis (fleetscope.analysis) the Dagster assets write; diagnose_* are its two sources."""
from __future__ import annotations

import polars as pl

from fleetscope.analysis import Analysis, skipped
from fleetscope.perftracker.localize import OP_LEVEL_EXPECTED, LocalizeConfig, localize, patterns_verdicts, stage_differential
from fleetscope.perftracker.patterns import PatternConfig, behavior_patterns, op_patterns, workers_from_capture


def diagnose_trace_capture(events: pl.DataFrame, capture_id: str | None = None, hw: pl.DataFrame | None = None,
                           timings: pl.DataFrame | None = None, layout: dict | None = None, job_id: str | None = None,
                           window: tuple[int, int] | None = None, pattern_config: PatternConfig = PatternConfig(),
                           config: LocalizeConfig = LocalizeConfig()) -> tuple[pl.DataFrame, pl.DataFrame]:
    """trace_events of one capture (+ optional hw samples, the capture's timings for host/stage of
    each rank, its parallel layout) -> (behavior_patterns, anomaly_verdicts)."""
    workers = workers_from_capture(events, timings, hw, layout)
    if hw is not None and hw.height and window is None:
        # hw files cover more than the capture: keep the samples inside the trace's time span
        end = pl.col("end_ns") if "end_ns" in events.columns else pl.col("ts_ns") + pl.col("dur_ns")
        span = events.select(pl.col("ts_ns").min().alias("a"), end.max().alias("b")).row(0)
        hw = hw.filter(pl.col("ts_ns").is_between(span[0] - 10**9, span[1] + 10**9))
    pats = behavior_patterns(events, capture_id, hw=hw, workers=workers, window=window, config=pattern_config)
    loc = localize(pats, config)
    return loc, patterns_verdicts(loc, stage_differential(loc, config), job_id=job_id, config=config)


def diagnose_op_capture(timings: pl.DataFrame, capture_id: str | None = None, job_id: str | None = None,
                        pattern_config: PatternConfig = PatternConfig(),
                        config: LocalizeConfig = LocalizeConfig(expected=OP_LEVEL_EXPECTED)) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Op-level timings (StragglerAnalysis format or kind=op rows) -> (behavior_patterns, verdicts),
    ops treated as functions; stage imbalance raised as stage verdicts for the algorithm team."""
    ops = timings.filter(pl.col("kind") == "op") if "kind" in timings.columns else timings
    pats = op_patterns(ops, capture_id, config=pattern_config)
    loc = localize(pats, config)
    return loc, patterns_verdicts(loc, stage_differential(loc, config), job_id=job_id, config=config)


def analyze_capture(events: pl.DataFrame | None = None, timings: pl.DataFrame | None = None, hw: pl.DataFrame | None = None,
                    capture_id: str | None = None, layout: dict | None = None, job_id: str | None = None) -> Analysis:
    """A capture's profiler trace (preferred: functions, kernels, collectives) or, without one, its
    op-level timings -> behavior_patterns and the PerfTracker verdicts; the note says which source."""
    if events is not None and events.height:
        pats, verdicts = diagnose_trace_capture(events, capture_id, hw=hw, timings=timings if timings is not None and timings.height else None,
                                                layout=layout, job_id=job_id)
        source = "profiler trace" + (" + hw samples (mu from utilization)" if hw is not None and hw.height else "")
    elif timings is not None and "kind" in timings.columns and timings.filter(pl.col("kind") == "op").height:
        pats, verdicts = diagnose_op_capture(timings, capture_id, job_id=job_id)
        source = "op-level timings"
    else:
        return skipped("no profiler trace and no op-level timings in this capture: nothing to localize")
    notes = [f"patterns from the {source}"]
    if pats.height:
        notes.append(f"{int(pats['abnormal'].sum())} abnormal (function, worker) patterns of {pats.height}")
    return Analysis(tables={"behavior_patterns": pats}, verdicts=verdicts, notes=notes)
