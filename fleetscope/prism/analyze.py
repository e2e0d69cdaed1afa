"""PRISM's entry point: a capture's op-level timings -> the Analysis (fleetscope.analysis) with the
variability models, their hardware correlates, the step forecasts and scenario sweeps, the what-if
straggler analysis (summary, attribution, step x worker slowdown, causes), the verdicts, the plots
(artifacts `prism/<capture>/<plot>.png`) and the ideal step as a Perfetto trace
(`prism/<capture>/ideal_timeline.json`)."""
from __future__ import annotations

import json

import polars as pl

from fleetscope.analysis import Analysis, skipped
from fleetscope.prism.forecast import forecast_capture
from fleetscope.prism.structure import StructureError
from fleetscope.prism.variability import kernel_variability_models


def analyze_capture(timings: pl.DataFrame, hw: pl.DataFrame | None = None, capture_id: str | None = None,
                    layout: dict | None = None, job_id: str | None = None, plots: bool = True,
                    trace_events: pl.DataFrame | None = None) -> Analysis:
    """trace_events: the capture's profiler traces, when it has any: their GPU kernels get latency
    models too (variability.kernel_variability_models), beside the op-level ones."""
    kernels = None
    if trace_events is not None and trace_events.height and (trace_events["cat"] == "kernel").any():
        kernels = kernel_variability_models(trace_events)
    if "kind" not in timings.columns or timings.filter(pl.col("kind") == "op").height == 0:
        note = "no op-level timings in this capture: PRISM needs per-op timings (tracer or StragglerAnalysis format)"
        if kernels is not None and kernels.height:
            return Analysis(tables={"variability_models": kernels}, notes=[note + "; kernel latency models from its traces only"])
        return skipped(note)
    try:
        res = forecast_capture(timings, hw=hw, capture_id=capture_id, layout=layout, job_id=job_id, plots=plots)
    except StructureError as exc:
        if kernels is not None and kernels.height:
            return Analysis(tables={"variability_models": kernels}, notes=[f"step structure not recognizable: {exc}"])
        return skipped(f"step structure not recognizable: {exc}")
    cap, sa = res.graph.capture_id, res.stragglers
    models = res.variability_models if kernels is None or not kernels.height else \
        pl.concat([res.variability_models, kernels.with_columns(capture_id=pl.lit(cap))], how="vertical_relaxed")
    tables = {"variability_models": models, "variability_hw_correlation": res.hw_correlation,
              "step_forecasts": res.step_forecasts, "step_forecast_details": res.details}
    artifacts = {f"prism/{cap}/{name}.png": png for name, png in res.plots.items()}
    if sa is not None:
        tables.update(straggler_summary=sa.summary, straggler_attribution=sa.attribution,
                      straggler_slowdown=sa.slowdown, straggler_causes=sa.causes)
        artifacts[f"prism/{cap}/ideal_timeline.json"] = json.dumps(sa.ideal_timeline()).encode()
    return Analysis(tables=tables, verdicts=res.verdicts, notes=list(res.notes), artifacts=artifacts)
