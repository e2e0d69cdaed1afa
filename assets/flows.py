"""LLMPrism over one time window of flows (flow_windows partitions): jobs, job_clusters, comm_pairs,
step_timelines, flow_background and the flow verdicts. (One Perfetto timeline per job across every
window is written with the fleet health page.)"""
from dagster import AllPartitionMapping, AssetDep, AssetExecutionContext, MetadataValue, multi_asset

from fleetscope.assets._tables import analysis_specs, materialize_analysis, table_of
from fleetscope.flows import FlowConfig, analyze_window
from fleetscope.flows.network import prior_suspects
from fleetscope.ingest.topology import latest_topology
from fleetscope.flows.schemas import DECLARED
from fleetscope.resources import AnalysisSettings, WarehouseResource
from fleetscope.ingest.windows import parse_window_id

_ALL = AllPartitionMapping()


def read_window_inputs(wh, window_key: str, margin_s: int):
    start, end = parse_window_id(window_key)
    flows = wh.read("flows", where=f"start_ns >= {start - margin_s * 1_000_000_000} AND start_ns < {end}")
    topo = latest_topology(wh.read("topology"))
    return flows, topo, start, end


def read_pair_history(wh, start: int, history_s: int):
    """flow_pair_rates of the windows that began in the history_s before `start` (none yet: None; a
    window analysed before its predecessors simply has less history)."""
    if not wh.has_table("flow_pair_rates"):
        return None
    return wh.read("flow_pair_rates", where=f"window_start_ns >= {start - history_s * 1_000_000_000} AND window_start_ns < {start}")


def read_prior_suspects(wh, start: int, history_s: int) -> set[str]:
    """The NICs, switches and hosts the flow verdicts of the windows in the history_s before `start`
    named (fleetscope.flows.network.prior_suspects)."""
    if not wh.has_table("anomaly_verdicts"):
        return set()
    lo = start - history_s * 1_000_000_000
    return prior_suspects(wh.read("anomaly_verdicts", where=f"start_ns >= {lo} AND start_ns < {start} AND detector LIKE 'flows.%'"))


@multi_asset(specs=analysis_specs(DECLARED, "flows_verdicts", "Flow-based verdicts: slow steps, slow DP groups, degraded "
                                  "switches and NICs (k-sigma, robust).", group="flows", eager=False,
                                  # every partition of the files (its window's flows), not the declared reads' own
                                  # partitions; flow_pair_rates and the prior suspects are its own earlier windows,
                                  # no dependency
                                  deps=[AssetDep("flows", partition_mapping=_ALL), AssetDep("topology", partition_mapping=_ALL)]),
             can_subset=False)
def flows_window(context: AssetExecutionContext, warehouse: WarehouseResource, settings: AnalysisSettings):
    wh = warehouse.get()
    key = context.partition_key
    flows, topo, start, end = read_window_inputs(wh, key, settings.window_margin_seconds)
    context.log.info(f"window {key}: {flows.height} flows (with a {settings.window_margin_seconds} s margin), {topo.height} topology rows")
    seconds: dict = {}
    history = read_pair_history(wh, start, settings.pair_history_seconds)
    result = analyze_window(flows, topo, start, end, config=FlowConfig(k_sigma=settings.k_sigma), window_id=key,
                            timings=seconds, history=history,
                            suspects=read_prior_suspects(wh, start, settings.pair_history_seconds))
    jobs = table_of(result, "jobs")
    extra = {"jobs": {"jobs": MetadataValue.json(jobs.select("job_id", "n_gpus", "n_hosts").to_dicts())} if jobs.height else {},
             "step_timelines": {f"seconds/{k}": MetadataValue.float(round(v, 3)) for k, v in seconds.items()}}
    yield from materialize_analysis(wh, key, result, DECLARED, "flows_verdicts", "flows", extra=extra)


ASSETS = [flows_window]
