"""Lumos over a capture's profiler traces: per-rank execution graphs, replay by simulation
(iteration times, breakdown, SM utilization), what-if predictions and their verdicts."""
from dagster import AssetExecutionContext, multi_asset

from fleetscope.assets._capture import capture_events, capture_info
from fleetscope.assets._tables import analysis_specs, materialize_analysis
from fleetscope.assets.partitions import captures
from fleetscope.resources import WarehouseResource
from fleetscope.traces import analyze_capture

TABLES = {
    "graph_tasks": "Execution-graph tasks per rank: CPU tasks on threads, GPU tasks on streams.",
    "graph_edges": "Execution-graph edges cpu_cpu, cpu_gpu, gpu_cpu, gpu_gpu and cross-rank collective links.",
    "trace_collectives": "Collectives seen in the traces (kind, size, group, duration) per rank.",
    "trace_iterations": "Iterations (ProfilerStep#) per rank with their spans.",
    "trace_syncs": "Host-device synchronization events per rank.",
    "replays": "Lumos replay per rank and iteration: actual vs simulated time, error, exposed compute / communication, "
               "overlap, idle. The simulated timeline is exported as a Chrome trace.",
    "replay_sm_util": "SM utilization per 1 ms, actual vs simulated.",
    "whatif": "What-if predictions (GEMMs 2x, attention 1.5x, sync removed, DP degree, PP re-partition, layers) "
              "re-simulated on the edited graph.",
}


@multi_asset(specs=analysis_specs(TABLES, "traces_verdicts", "Verdicts from the replay and what-ifs (GPU idle, exposed "
                                  "communication, costly synchronization).", partitions_def=captures, group="traces",
                                  deps=["trace_events", "captures"]),  # captures: the layout its what-ifs need
             can_subset=False)
def traces_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    result = analyze_capture(capture_events(wh, key), key, job_id=info["job_id"], export_replay=True,
                             parallel=info["layout"])
    yield from materialize_analysis(wh, key, result, TABLES, "traces_verdicts", "traces", capture_id=key, artifacts_on="replays")


ASSETS = [traces_capture]
