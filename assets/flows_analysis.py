"""LLMPrism over one time window of flows (flow_windows partitions): jobs, job_clusters,
comm_pairs, step_timelines, flow_background and flow verdicts, plus a Perfetto trace per job."""

from dagster import (AllPartitionMapping, AssetDep, AssetExecutionContext, AssetSpec, MaterializeResult,
                     MetadataValue, multi_asset)

from fleetscope.assets._tables import write_table, write_verdicts
from fleetscope.assets.partitions import flow_windows
from fleetscope.flows.config import FlowConfig
from fleetscope.flows.timelines import export_perfetto
from fleetscope.ingest.topology import latest_topology
from fleetscope.flows.window import FLOW_BACKGROUND, analyze_window
from fleetscope.flows.schemas import COMM_PAIRS, JOB_CLUSTERS, JOBS, STEP_TIMELINES
from fleetscope.windows import parse_window_id
from fleetscope.resources import AnalysisSettings, WarehouseResource

_ALL = AllPartitionMapping()
_DEPS = [AssetDep("flows", partition_mapping=_ALL), AssetDep("topology", partition_mapping=_ALL)]
OUTPUTS = {
    "jobs": JOBS, "job_clusters": JOB_CLUSTERS, "comm_pairs": COMM_PAIRS, "step_timelines": STEP_TIMELINES,
    "flow_background": FLOW_BACKGROUND,
}
_DESC = {
    "jobs": "Training jobs recognized from flows alone (union-find over communicating NICs, same-host-set merge).",
    "job_clusters": "Which GPU address (ip) and host belongs to which job, per window.",
    "comm_pairs": "DP / PP / other label of every communicating GPU pair, with the evidence (LLMPrism Algorithm 2).",
    "step_timelines": "Reconstructed step boundaries per GPU address (step ends where its DP traffic ends).",
    "flow_background": "Traffic that is not a job's (outside the topology or aperiodic): evidence, not dropped.",
    "flow_verdicts": "Flow-based verdicts: slow steps, slow DP groups, degraded switches and NICs (k-sigma, robust).",
}


def read_window_inputs(wh, window_key: str, margin_s: int):
    start, end = parse_window_id(window_key)
    flows = wh.read("flows", where=f"start_ns >= {start - margin_s * 1_000_000_000} AND start_ns < {end}")
    topo = latest_topology(wh.read("topology"))
    return flows, topo, start, end


@multi_asset(
    specs=[AssetSpec(name, partitions_def=flow_windows, group_name="flows_llmprism", deps=_DEPS,
                     kinds={"duckdb", "parquet"}, description=_DESC[name]) for name in [*OUTPUTS, "flow_verdicts"]],
    can_subset=False,
)
def llmprism_window(context: AssetExecutionContext, warehouse: WarehouseResource, settings: AnalysisSettings):
    wh = warehouse.get()
    key = context.partition_key
    flows, topo, start, end = read_window_inputs(wh, key, settings.window_margin_seconds)
    context.log.info(f"window {key}: {flows.height} flows (with a {settings.window_margin_seconds} s margin), {topo.height} topology rows")
    timings: dict = {}
    cfg = FlowConfig(k_sigma=settings.k_sigma)
    if flows.height == 0 or topo.height == 0:
        tables = {}
    else:
        tables = analyze_window(flows, topo, start, end, config=cfg, window_id=key, timings=timings)
    stage_md = {f"seconds/{k}": MetadataValue.float(round(v, 3)) for k, v in timings.items()}
    for name, schema in OUTPUTS.items():
        df = tables.get(name)
        if df is None:
            from fleetscope.schemas.base import empty_frame
            df = empty_frame(schema)
        _, md = write_table(wh, name, key, df, schema)
        if name == "jobs" and df.height:
            md["jobs"] = MetadataValue.json(df.select("job_id", "n_gpus", "n_hosts").to_dicts())
        if name == "step_timelines" and df.height:
            exports = _export_timelines(wh, key, tables, topo)
            md["perfetto_traces"] = MetadataValue.json(exports)
            md.update(stage_md)
        yield MaterializeResult(asset_key=name, metadata=md)
    yield MaterializeResult(asset_key="flow_verdicts", metadata=write_verdicts(wh, "flows", key, tables.get("anomaly_verdicts")))


def _export_timelines(wh, key: str, tables: dict, topo) -> dict:
    """One Perfetto/Chrome trace per job, next to the warehouse (open in ui.perfetto.dev)."""
    out_dir = wh.exports_dir("perfetto", key)
    paths = {}
    for job in tables["step_timelines"]["job_id"].unique().sort().to_list():
        try:
            p = export_perfetto(tables["step_timelines"], tables["_ip_flows"], job, out_dir / f"{job}.json", topology=topo)
            paths[job] = str(p)
        except ValueError:
            continue
    return paths


ASSETS = [llmprism_window]
