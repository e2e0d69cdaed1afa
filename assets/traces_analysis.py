"""Lumos over a capture's profiler traces: per-rank execution graphs, replay by simulation
(iteration times, breakdown, SM utilization), what-if predictions and their verdicts."""
from dagster import AssetExecutionContext, AssetSpec, AutomationCondition, MaterializeResult, MetadataValue, multi_asset

from fleetscope.assets._capture import capture_info
from fleetscope.assets._tables import write_table, write_verdicts
from fleetscope.assets.partitions import captures
from fleetscope.schemas.base import TABLES, empty_frame
from fleetscope.traces.analyze import analyze_capture
from fleetscope.resources import WarehouseResource

GROUPS = {
    "execution_graphs": ["graph_tasks", "graph_edges", "trace_collectives", "trace_iterations", "trace_syncs"],
    "replays": ["replays", "replay_sm_util"],
    "whatif": ["whatif"],
}
_DESC = {
    "execution_graphs": "Per-rank execution graphs (CPU tasks on threads, GPU tasks on streams) with typed edges cpu_cpu, cpu_gpu, "
                        "gpu_cpu, gpu_gpu and cross-rank collective links; plus collectives, iterations and sync events.",
    "replays": "Lumos replay per rank and iteration: actual vs simulated time, error, exposed compute / communication, overlap, "
               "idle; SM utilization per 1 ms actual vs simulated. The simulated timeline is exported as a Chrome trace.",
    "whatif": "What-if predictions (GEMMs 2x, attention 1.5x, sync removed, DP degree, PP re-partition, layers) re-simulated "
              "on the edited graph.",
    "trace_verdicts": "Verdicts from the replay and what-ifs (GPU idle, exposed communication, costly synchronization).",
}


@multi_asset(
    specs=[AssetSpec(name, partitions_def=captures, group_name="traces_lumos", deps=["trace_events"], kinds={"duckdb"},
                     automation_condition=AutomationCondition.eager(), description=_DESC[name])
           for name in [*GROUPS, "trace_verdicts"]],
    can_subset=False)
def lumos_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    ev = wh.read("trace_events", partitions=[key])
    out, note = {}, None
    chrome = wh.exports_dir("replays") / f"{key}-simulated.json"
    if ev.height == 0:
        note = "no profiler traces in this capture"
    else:
        try:
            out = analyze_capture(ev, key, job_id=info["job_id"], chrome_trace_path=chrome)
        except ValueError as exc:
            note = f"could not analyse: {exc}"
    for asset_name, tables in GROUPS.items():
        md = {}
        for t in tables:
            df = out.get(t, empty_frame(TABLES[t]))
            _, tmd = write_table(wh, t, key, df, TABLES[t])
            md.update({k: v for k, v in tmd.items() if k != "dagster/row_count"})
        md["dagster/row_count"] = md[f"{tables[0]}/rows"]
        if note:
            md["note"] = MetadataValue.text(note)
        if asset_name == "replays" and out.get("replays") is not None and out["replays"].height:
            r = out["replays"]
            md["mean_abs_error_pct"] = MetadataValue.float(round(float(r["error_pct"].abs().mean()), 3))
            md["simulated_chrome_trace"] = MetadataValue.path(str(chrome))
        yield MaterializeResult(asset_key=asset_name, metadata=md)
    yield MaterializeResult(asset_key="trace_verdicts",
                            metadata=write_verdicts(wh, "lumos", key, out.get("anomaly_verdicts"), capture_id=key))


ASSETS = [lumos_capture]
