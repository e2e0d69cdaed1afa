"""XPUTimer over a capture's timings: throughput, kernel FLOPS, bus bandwidth, issue latency, void
percentages, stage metrics, degradation (PerfTracker 4.1) and their verdicts."""
from dagster import AssetExecutionContext, multi_asset

from fleetscope.assets._capture import capture_frames, capture_info, job_history
from fleetscope.assets._tables import analysis_specs, materialize_analysis, table_of
from fleetscope.xputimer.schemas import DECLARED
from fleetscope.resources import WarehouseResource
from fleetscope.xputimer import analyze_capture

CAPTURE_TABLES = [t for t in DECLARED if t.partitions == "captures"]  # per capture; the hang tables are per incident (operations)


@multi_asset(specs=analysis_specs(CAPTURE_TABLES, "xputimer_verdicts", "XPUTimer verdicts (slow GPUs, misaligned shapes, slow "
                                  "collectives, issue stalls from GC or synchronization, void time, stage imbalance, "
                                  "degradation) routed to a team.", group="xputimer"),
             can_subset=False)
def xputimer_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    job = info["job_id"]
    t, _, notes = capture_frames(wh, key, info, ops="trace_only")  # a trace-only capture: its traces converted to timings
    # the job's own baseline: timings of its earlier captures
    result = analyze_capture(t, history=job_history(wh, key, job, info["start_ns"], "timings"), job_id=job)
    result.notes[:0] = notes
    if info["n_trace_files"] and table_of(result, "xputimer_step_throughput").height == 0:  # a trace-only capture it could not analyse: said loudly
        result.warnings.extend(n for n in result.notes if n not in result.warnings)
    yield from materialize_analysis(wh, key, result, CAPTURE_TABLES, "xputimer_verdicts", "xputimer", capture_id=key)


ASSETS = [xputimer_capture]
