"""The jobs: one per dynamic partition set (every asset partitioned by it), the fleet-wide job and
the incident report job. Sensors, schedules and `fleetscope run` launch these."""
from dagster import AssetSelection, define_asset_job

from fleetscope.assets import assets_partitioned_by, unpartitioned_assets
from fleetscope.assets.partitions import captures, flow_files, flow_windows, hw_files, incidents, topology_files
from fleetscope.resources import WAREHOUSE_TAG, warehouse_id

# a run launched by hand (the UI's Materialize) belongs to the warehouse this code location serves;
# the planner's runs carry the tag themselves (fleetscope.jobs.planner)
_TAGS = {WAREHOUSE_TAG: warehouse_id()}


def _partition_job(name: str, pdef, description: str):
    keys = [k for a in assets_partitioned_by(pdef) for k in a.keys]
    return define_asset_job(name, selection=AssetSelection.assets(*keys), partitions_def=pdef, description=description, tags=_TAGS)


ingest_topology = _partition_job("ingest_topology", topology_files, "Ingest one landed topology snapshot.")
ingest_flows = _partition_job("ingest_flows", flow_files, "Ingest one landed flow file and register the windows it touches.")
ingest_hw = _partition_job("ingest_hw", hw_files, "Ingest one landed file of GPU hardware samples.")
capture_analysis = _partition_job("capture_analysis", captures, "Ingest a capture's traces and timings and run every per-capture analysis.")
incident_analysis = _partition_job("incident_analysis", incidents, "Ingest an incident request / stack dumps and analyse it.")
flow_window_analysis = _partition_job("flow_window_analysis", flow_windows, "LLMPrism analyses of one time window of flows.")
fleet_analysis = define_asset_job("fleet_analysis", selection=AssetSelection.assets(*[k for a in unpartitioned_assets() for k in a.keys]),
                                  description="Fleet-wide summaries and reports over everything analysed.", tags=_TAGS)
incident_report_job = define_asset_job("incident_report_job", selection=AssetSelection.assets("incident_report"), partitions_def=incidents,
                                       description="Re-write an incident's report once the analyses in its scope have run.", tags=_TAGS)

# partition set -> the job that materializes one of its partitions
JOB_FOR_SET = {topology_files.name: ingest_topology, flow_files.name: ingest_flows, hw_files.name: ingest_hw,
               captures.name: capture_analysis, incidents.name: incident_analysis, flow_windows.name: flow_window_analysis}
ALL_JOBS = [*JOB_FOR_SET.values(), fleet_analysis, incident_report_job]
