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


def analyze_capture(timings: pl.DataFrame, hw: pl.DataFrame | None = None, capture_id: str | None = None,
                    layout: dict | None = None, job_id: str | None = None, plots: bool = True) -> Analysis:
    if "kind" not in timings.columns or timings.filter(pl.col("kind") == "op").height == 0:
        return skipped("no op-level timings in this capture: PRISM needs per-op timings (tracer or StragglerAnalysis format)")
    try:
        res = forecast_capture(timings, hw=hw, capture_id=capture_id, layout=layout, job_id=job_id, plots=plots)
    except StructureError as exc:
        return skipped(f"step structure not recognizable: {exc}")
    cap, sa = res.graph.capture_id, res.stragglers
    tables = {"variability_models": res.variability_models, "variability_hw_correlation": res.hw_correlation,
              "step_forecasts": res.step_forecasts, "step_forecast_details": res.details}
    artifacts = {f"prism/{cap}/{name}.png": png for name, png in res.plots.items()}
    if sa is not None:
        tables.update(straggler_summary=sa.summary, straggler_attribution=sa.attribution,
                      straggler_slowdown=sa.slowdown, straggler_causes=sa.causes)
        artifacts[f"prism/{cap}/ideal_timeline.json"] = json.dumps(sa.ideal_timeline()).encode()
    return Analysis(tables=tables, verdicts=res.verdicts, notes=list(res.notes), artifacts=artifacts)
