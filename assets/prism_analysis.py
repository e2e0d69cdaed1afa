"""PRISM over a capture's op-level timings: variability models, hw correlation, step-time
forecasts (baseline, no_stragglers and the what-if scenarios), CDF plots and verdicts."""
import base64

import polars as pl
from dagster import AssetExecutionContext, AssetSpec, AutomationCondition, MaterializeResult, MetadataValue, multi_asset

from fleetscope.assets._capture import capture_hw, capture_info
from fleetscope.assets._tables import write_table, write_verdicts
from fleetscope.assets.partitions import captures
from fleetscope.prism.forecast import forecast_capture
from fleetscope.prism.schemas import HW_CORRELATION, SCENARIO_DETAILS, STEP_FORECASTS, VARIABILITY_MODELS
from fleetscope.prism.structure import StructureError
from fleetscope.schemas.base import empty_frame
from fleetscope.resources import WarehouseResource

_DEPS = ["timings", "hw", "capture_index"]


@multi_asset(
    specs=[AssetSpec("variability_models", partitions_def=captures, group_name="prism", deps=_DEPS,
                     automation_condition=AutomationCondition.eager(), kinds={"duckdb"},
                     description="Per operation: latency distributions across ranks (spatial) and iterations (temporal), the fitted "
                                 "family with goodness of fit, quantiles; correlation with SM clock / power / throttling."),
           AssetSpec("step_forecasts", partitions_def=captures, group_name="prism", deps=_DEPS,
                     automation_condition=AutomationCondition.eager(), kinds={"duckdb"},
                     description="Predicted step-time distributions: baseline (vs measured, KS), no_stragglers (ideal), slow-node "
                                 "placement, sync group size, kernel sensitivity, scale-out; CDF plots."),
           AssetSpec("prism_verdicts", partitions_def=captures, group_name="prism", deps=_DEPS,
                     automation_condition=AutomationCondition.eager(), kinds={"duckdb"},
                     description="Jobs measurably slower than their no_stragglers forecast, attributed to op type, stage and rank.")],
    can_subset=False)
def prism_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    t = wh.read("timings", partitions=[key])
    res, note = None, None
    if t.filter(pl.col("kind") == "op").height == 0:
        note = "no op-level timings in this capture: PRISM needs per-op timings (tracer or StragglerAnalysis format)"
    else:
        try:
            res = forecast_capture(t, hw=capture_hw(wh, t, "start_ns", "end_ns"), capture_id=key, layout=info["layout"], job_id=info["job_id"])
        except StructureError as exc:
            note = f"step structure not recognizable: {exc}"
    frames = {"variability_models": (res.variability_models if res else empty_frame(VARIABILITY_MODELS), VARIABILITY_MODELS),
              "variability_hw_correlation": (res.hw_correlation if res else empty_frame(HW_CORRELATION), HW_CORRELATION),
              "step_forecasts": (res.step_forecasts if res else empty_frame(STEP_FORECASTS), STEP_FORECASTS),
              "step_forecast_details": (res.details if res else empty_frame(SCENARIO_DETAILS), SCENARIO_DETAILS)}
    mds = {}
    for name, (df, schema) in frames.items():
        _, mds[name] = write_table(wh, name, key, df, schema)
    vm = {**mds["variability_models"], **{k: v for k, v in mds["variability_hw_correlation"].items() if k != "dagster/row_count"}}
    if note:
        vm["note"] = MetadataValue.text(note)
    yield MaterializeResult(asset_key="variability_models", metadata=vm)
    fm = {**mds["step_forecasts"], **{k: v for k, v in mds["step_forecast_details"].items() if k != "dagster/row_count"}}
    if res is not None:
        fm["notes"] = MetadataValue.text("; ".join(res.notes) or "-")
        for name, png in res.plots.items():
            fm[f"plot/{name}"] = MetadataValue.md(f"![{name}](data:image/png;base64,{base64.b64encode(png).decode()})")
    yield MaterializeResult(asset_key="step_forecasts", metadata=fm)
    verdicts = res.verdicts if res is not None else None
    yield MaterializeResult(asset_key="prism_verdicts", metadata=write_verdicts(wh, "prism", key, verdicts, capture_id=key))


ASSETS = [prism_capture]
