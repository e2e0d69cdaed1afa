"""PRISM's entry point: a capture's op-level timings -> the Analysis (fleetscope.analysis) with the
variability models, their hardware correlates, the step forecasts and scenario sweeps, the
straggler verdicts and the CDF plots (artifacts `prism/<capture>/<plot>.png`)."""
from __future__ import annotations

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
    cap = res.graph.capture_id
    return Analysis(
        tables={"variability_models": res.variability_models, "variability_hw_correlation": res.hw_correlation,
                "step_forecasts": res.step_forecasts, "step_forecast_details": res.details},
        verdicts=res.verdicts, notes=list(res.notes),
        artifacts={f"prism/{cap}/{name}.png": png for name, png in res.plots.items()})
