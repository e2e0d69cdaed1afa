"""Lumos over a capture's profiler traces: per-rank execution graphs, replay by simulation
(iteration times, breakdown, SM utilization), what-if predictions and their verdicts."""
from dagster import AssetExecutionContext, multi_asset

from fleetscope.assets._capture import capture_events, capture_info
from fleetscope.assets._tables import analysis_specs, materialize_analysis
from fleetscope.traces.schemas import DECLARED
from fleetscope.resources import WarehouseResource
from fleetscope.traces import analyze_capture


@multi_asset(specs=analysis_specs(DECLARED, "traces_verdicts", "Verdicts from the replay and what-ifs (GPU idle, exposed "
                                  "communication, costly synchronization).", group="traces"),
             can_subset=False)
def traces_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    result = analyze_capture(capture_events(wh, key), key, job_id=info["job_id"], export_replay=True,
                             parallel=info["layout"])
    yield from materialize_analysis(wh, key, result, DECLARED, "traces_verdicts", "traces", capture_id=key, artifacts_on="replays")


ASSETS = [traces_capture]
