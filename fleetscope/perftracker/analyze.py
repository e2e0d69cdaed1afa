"""One call per capture: patterns -> localization (peers, the job's history, configured boxes) ->
the straggling ranks -> verdicts. analyze_capture returns the Analysis (fleetscope.analysis) the
Dagster assets write; diagnose_* are its two sources."""
from __future__ import annotations

import polars as pl

from fleetscope.analysis import Analysis, skipped
from fleetscope.perftracker.localize import LocalizeConfig, localize, stage_differential
from fleetscope.perftracker.patterns import PatternConfig, behavior_patterns, op_patterns, workers_from_capture
from fleetscope.perftracker.ranks import straggling_ranks
from fleetscope.perftracker.verdicts import patterns_verdicts


def _finish(pats: pl.DataFrame, workers: pl.DataFrame | None, job_id: str | None, config: LocalizeConfig,
            history: pl.DataFrame | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    loc = localize(pats, config, history=history)
    ranks = straggling_ranks(loc, config, workers)
    if ranks.height:  # the straggler's own rows are explained by the rank verdict
        loc = loc.join(ranks.select("capture_id", "rank", _strag=pl.lit(True)), on=["capture_id", "rank"], how="left",
                       maintain_order="left").with_columns(
            reason=pl.when(pl.col("_strag").fill_null(False) & pl.col("abnormal").fill_null(False)).then(pl.lit("rank"))
            .otherwise(pl.col("reason"))).drop("_strag")
    return loc, patterns_verdicts(loc, stage_differential(loc, config), job_id=job_id, config=config, ranks=ranks)


def diagnose_trace_capture(events: pl.DataFrame, capture_id: str | None = None, hw: pl.DataFrame | None = None,
                           timings: pl.DataFrame | None = None, layout: dict | None = None, job_id: str | None = None,
                           window: tuple[int, int] | None = None, pattern_config: PatternConfig = PatternConfig(),
                           config: LocalizeConfig = LocalizeConfig(), history: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """trace_events of one capture (+ optional hw samples, the capture's timings for host/stage of
    each rank, its parallel layout, behavior_patterns of the job's earlier captures) ->
    (behavior_patterns, anomaly_verdicts)."""
    workers = workers_from_capture(events, timings, hw, layout)
    if hw is not None and hw.height and window is None:
        # hw files cover more than the capture: keep the samples inside the trace's time span
        end = pl.col("end_ns") if "end_ns" in events.columns else pl.col("ts_ns") + pl.col("dur_ns")
        span = events.select(pl.col("ts_ns").min().alias("a"), end.max().alias("b")).row(0)
        hw = hw.filter(pl.col("ts_ns").is_between(span[0] - 10**9, span[1] + 10**9))
    pats = behavior_patterns(events, capture_id, hw=hw, workers=workers, window=window, config=pattern_config)
    return _finish(pats, workers, job_id, config, history)


def diagnose_op_capture(timings: pl.DataFrame, capture_id: str | None = None, job_id: str | None = None,
                        pattern_config: PatternConfig = PatternConfig(), config: LocalizeConfig = LocalizeConfig(),
                        history: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Op-level timings (StragglerAnalysis format or kind=op rows) -> (behavior_patterns, verdicts),
    ops treated as functions; stage imbalance raised as stage verdicts for the algorithm team, a
    straggling rank as a rank verdict."""
    ops = timings.filter(pl.col("kind") == "op") if "kind" in timings.columns else timings
    pats = op_patterns(ops, capture_id, config=pattern_config)
    workers = None
    if "host" in ops.columns:
        workers = ops.group_by(pl.col("rank").cast(pl.Int32)).agg(pl.col("host").drop_nulls().mode().first().cast(pl.Utf8))
    return _finish(pats, workers, job_id, config, history)


def analyze_capture(events: pl.DataFrame | None = None, timings: pl.DataFrame | None = None, hw: pl.DataFrame | None = None,
                    capture_id: str | None = None, layout: dict | None = None, job_id: str | None = None,
                    history: pl.DataFrame | None = None, config: LocalizeConfig = LocalizeConfig()) -> Analysis:
    """A capture's profiler trace (preferred: functions, kernels, collectives) or, without one, its
    op-level timings -> behavior_patterns and the PerfTracker verdicts; the note says which source.
    history: behavior_patterns of the job's earlier captures (the expectation learned from the job)."""
    hist = history if history is not None and history.height else None
    if events is not None and events.height:
        pats, verdicts = diagnose_trace_capture(events, capture_id, hw=hw, timings=timings if timings is not None and timings.height else None,
                                                layout=layout, job_id=job_id, history=hist, config=config)
        source = "profiler trace" + (" + hw samples (mu from utilization)" if hw is not None and hw.height else "")
    elif timings is not None and "kind" in timings.columns and timings.filter(pl.col("kind") == "op").height:
        pats, verdicts = diagnose_op_capture(timings, capture_id, job_id=job_id, history=hist, config=config)
        source = "op-level timings"
    else:
        return skipped("no profiler trace and no op-level timings in this capture: nothing to localize")
    notes = [f"patterns from the {source}"]
    if hist is not None:
        notes.append(f"expectations from the job's history: {hist['capture_id'].n_unique()} earlier capture(s)")
    else:
        notes.append("no earlier capture of this job: expectations from same-stage peers only")
    if pats.height:
        notes.append(f"{int(pats['abnormal'].sum())} abnormal (function, worker) patterns of {pats.height}")
    return Analysis(tables={"behavior_patterns": pats}, verdicts=verdicts, notes=notes)
