"""PerfTracker (critical path, behaviour patterns, localization) as plain functions over polars.

    diagnose_trace_capture(events, capture_id, hw=None, timings=None, layout=None, job_id=None)
        -> (behavior_patterns, anomaly_verdicts)
    diagnose_op_capture(timings, capture_id, job_id=None) -> (behavior_patterns, anomaly_verdicts)

Building blocks: critical_path.classify_events / critical_pieces, patterns.behavior_patterns /
op_patterns, localize.localize / stage_imbalance / patterns_verdicts. Schema:
schemas.BEHAVIOR_PATTERNS (registered as `behavior_patterns`)."""
from fleetscope.perftracker.analyze import diagnose_op_capture, diagnose_trace_capture  # noqa: F401
from fleetscope.perftracker.localize import LocalizeConfig, localize, patterns_verdicts, stage_imbalance  # noqa: F401
from fleetscope.perftracker.patterns import PatternConfig, behavior_patterns, op_patterns, workers_from_capture  # noqa: F401
from fleetscope.perftracker.schemas import BEHAVIOR_PATTERNS  # noqa: F401
