"""PerfTracker over a capture: behaviour patterns per (function, worker) from the profiler trace
(or op-level timings when there is no trace), localization and verdicts."""
from dagster import AssetExecutionContext, multi_asset

from fleetscope.assets._capture import capture_events, capture_hw, capture_info, job_history
from fleetscope.assets._tables import analysis_specs, materialize_analysis
from fleetscope.perftracker import EVENT_COLUMNS, analyze_capture
from fleetscope.perftracker.schemas import DECLARED
from fleetscope.resources import WarehouseResource


@multi_asset(specs=analysis_specs(DECLARED, "perftracker_verdicts", "The abnormal functions and the workers they are abnormal "
                                  "on, how they differ, and the team.", group="perftracker"),
             can_subset=False)
def perftracker_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    events, timings = capture_events(wh, key, EVENT_COLUMNS), wh.read("timings", partitions=[key])
    hw = capture_hw(wh, events, "ts_ns", "end_ns") if events.height else None
    history = job_history(wh, key, info["job_id"], info["start_ns"], "behavior_patterns")  # expectations learned from the job
    result = analyze_capture(events, timings, hw=hw, capture_id=key, layout=info["layout"], job_id=info["job_id"], history=history)
    yield from materialize_analysis(wh, key, result, DECLARED, "perftracker_verdicts", "perftracker", capture_id=key)


ASSETS = [perftracker_capture]
