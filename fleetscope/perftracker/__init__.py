"""PerfTracker (critical path, behaviour patterns, localization) as plain functions over polars.

    analyze_capture(events=None, timings=None, hw=None, capture_id=None, layout=None, job_id=None) -> Analysis
    diagnose_trace_capture(events, capture_id, hw=None, timings=None, layout=None, job_id=None)
        -> (behavior_patterns, anomaly_verdicts)
    diagnose_op_capture(timings, capture_id, job_id=None) -> (behavior_patterns, anomaly_verdicts)

Building blocks: critical_path.classify_events / critical_pieces, patterns.behavior_patterns /
op_patterns, localize.localize (history: the job's earlier behavior_patterns) / stage_differential,
ranks.straggling_ranks, verdicts.patterns_verdicts (all three as anomaly_verdicts rows). EVENT_COLUMNS: the trace_events columns it reads. Schema:
schemas.BEHAVIOR_PATTERNS (the `behavior_patterns` table)."""
from fleetscope.perftracker.analyze import analyze_capture, diagnose_op_capture, diagnose_trace_capture  # noqa: F401
from fleetscope.perftracker.critical_path import EVENT_COLUMNS  # noqa: F401
from fleetscope.perftracker.ranks import straggling_ranks  # noqa: F401
from fleetscope.perftracker.verdicts import patterns_verdicts  # noqa: F401
from fleetscope.perftracker.localize import LocalizeConfig, localize, stage_differential  # noqa: F401
from fleetscope.perftracker.patterns import PatternConfig, behavior_patterns, op_patterns, workers_from_capture  # noqa: F401
from fleetscope.perftracker.schemas import BEHAVIOR_PATTERNS  # noqa: F401
