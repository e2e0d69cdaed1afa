"""PRISM: latency variability models and step-time forecasts with straggler what-ifs.

- analyze.analyze_capture(timings, hw=...) -> Analysis: what the Dagster assets write;
- structure.build_job_graph(timings) -> JobGraph: the per-rank op structure of a capture's steps,
  intrinsic op durations (waits removed) and an exact vectorized replay;
- variability.variability_models(graph) / kernel_variability_models(trace_events) /
  hw_correlation(timings, hw): fitted latency distributions and their hardware correlates;
- compose: serial sums, max of synchronizing ranks, pipeline schedules, the hierarchical
  TP x PP x DP model for large scales;
- forecast.forecast_capture(timings, hw=...) -> PrismResult: step_forecasts, the scenario
  sweeps (step_forecast_details), verdicts and CDF plots;
- stragglers.analyze_stragglers(timings | graph) -> StragglerAnalysis: the what-if analysis of
  "Understanding Stragglers in Large Model Training" (ideal step, S, attribution by op type /
  stage / DP replica / worker, M_W, M_S, sequence-length effects, verdict inputs, heatmap,
  ideal timeline).
"""
from fleetscope.prism.analyze import analyze_capture  # noqa: F401
from fleetscope.prism.forecast import PrismResult, forecast_capture, step_forecasts  # noqa: F401
from fleetscope.prism.schemas import HW_CORRELATION, SCENARIO_DETAILS, STEP_FORECASTS, VARIABILITY_MODELS  # noqa: F401
from fleetscope.prism.schemas import STRAGGLER_ATTRIBUTION, STRAGGLER_CAUSES, STRAGGLER_SLOWDOWN, STRAGGLER_SUMMARY  # noqa: F401
from fleetscope.prism.stragglers import StragglerAnalysis, analyze_stragglers  # noqa: F401
from fleetscope.prism.structure import JobGraph, StructureError, build_job_graph, replay_job_graph  # noqa: F401
from fleetscope.prism.variability import hw_correlation, kernel_variability_models, variability_models  # noqa: F401
