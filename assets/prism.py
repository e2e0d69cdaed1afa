"""PRISM over a capture's op-level timings: variability models, hw correlation, step-time
forecasts (baseline, no_stragglers and the what-if scenarios), CDF plots and verdicts."""
from dagster import AssetExecutionContext, multi_asset

from fleetscope.assets._capture import capture_frames, capture_hw, capture_info
from fleetscope.assets._tables import analysis_specs, materialize_analysis, table_of
from fleetscope.prism import analyze_capture
from fleetscope.prism.schemas import DECLARED
from fleetscope.resources import WarehouseResource


@multi_asset(specs=analysis_specs(DECLARED, "prism_verdicts", "Jobs measurably slower than their no_stragglers forecast, "
                                  "attributed to op type, stage and rank.", group="prism"),
             can_subset=False)
def prism_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    # op rows from the traces when the timings have none; the traces' kernels for kernel-level models
    t, ev, notes = capture_frames(wh, key, info, ops="missing", traces=True)
    result = analyze_capture(t, hw=capture_hw(wh, t, "start_ns", "end_ns") if t.height else None, capture_id=key,
                             layout=info["layout"], job_id=info["job_id"], trace_events=ev)
    result.notes[:0] = notes
    if info["n_trace_files"] and table_of(result, "step_forecasts").height == 0:  # a trace-only capture it could not analyse: said loudly
        result.warnings.extend(n for n in result.notes if n not in result.warnings)
    yield from materialize_analysis(wh, key, result, DECLARED, "prism_verdicts", "prism", capture_id=key, artifacts_on="step_forecasts")


ASSETS = [prism_capture]
