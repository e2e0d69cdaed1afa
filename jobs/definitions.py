from __future__ import annotations

import json
import os

from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    AssetRecordsFilter,
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    RunRequest,
    ScheduleEvaluationContext,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    schedule,
    sensor,
)

from assets import ALL_ASSETS, assets_partitioned_by, unpartitioned_assets
from assets.partitions import captures, flow_files, flow_windows, hw_files, incidents, topology_files
from fleetscope.registry import register_landing
from fleetscope.warehouse import Warehouse
from fleetscope.windows import day_of
from resources import landing_path, warehouse_path


def _job(name: str, pdef, description: str):
    keys = [k for a in assets_partitioned_by(pdef) for k in a.keys]
    if not keys:
        return None
    return define_asset_job(name, selection=AssetSelection.assets(*keys), partitions_def=pdef, description=description)


JOB_FOR_SET = {
    topology_files.name: _job("ingest_topology", topology_files, "Ingest one landed topology snapshot."),
    flow_files.name: _job("ingest_flows", flow_files, "Ingest one landed flow file and register the windows it touches."),
    hw_files.name: _job("ingest_hw", hw_files, "Ingest one landed file of GPU hardware samples."),
    captures.name: _job("capture_analysis", captures, "Ingest a capture's traces and timings and run every per-capture analysis."),
    incidents.name: _job("incident_analysis", incidents, "Ingest an incident request / stack dumps and analyse it."),
    flow_windows.name: _job("flow_window_analysis", flow_windows, "LLMPrism analyses of one time window of flows."),
}
_fleet_keys = [k for a in unpartitioned_assets() for k in a.keys]
fleet_analysis = define_asset_job("fleet_analysis", selection=AssetSelection.assets(*_fleet_keys),
                                  description="Fleet-wide summaries and reports over everything analysed.") if _fleet_keys else None

ALL_JOBS = [j for j in list(JOB_FOR_SET.values()) + [fleet_analysis] if j is not None]

# Files are read where the code location runs; the sensor uses the same environment as the CLI.
_SENSOR_SETTLE_S = float(os.environ.get("FLEETSCOPE_SETTLE_SECONDS", "5"))
_SENSOR_INTERVAL_S = int(os.environ.get("FLEETSCOPE_SENSOR_INTERVAL_SECONDS", "30"))


@sensor(name="landing_sensor", minimum_interval_seconds=_SENSOR_INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="Registers new or changed files in the landing folder (content-hashed dynamic partitions) and requests their ingestion runs.",
        jobs=[j for j in JOB_FOR_SET.values() if j is not None and j.name != "flow_window_analysis"])
def landing_sensor(context: SensorEvaluationContext):
    known = json.loads(context.cursor) if context.cursor else {}
    wh = Warehouse(warehouse_path())
    wh.init()
    reg = register_landing(landing_path(), wh, settle_s=_SENSOR_SETTLE_S, known_signatures=known)
    requests, adds = [], []
    for pset, keys in reg.to_run.items():
        job = JOB_FOR_SET.get(pset)
        if job is None:
            continue
        new = [k for k in keys if not context.instance.has_dynamic_partition(pset, k)]
        if new:
            adds.append(AddDynamicPartitionsRequest(partitions_def_name=pset, partition_keys=new))
        for k in keys:
            sig = "|".join(sorted(v for p, v in reg.signatures.items() if k in p or p.endswith(k)))
            requests.append(RunRequest(run_key=f"{pset}:{k}:{hash(sig) & 0xffffffff:x}", job_name=job.name, partition_key=k,
                                       tags={"fleetscope/trigger": "landing_sensor"}))
    cursor = json.dumps({**known, **reg.signatures}, sort_keys=True)
    if not requests and not adds:
        msg = "no new landed files"
        if reg.deferred:
            msg += f"; {len(reg.deferred)} still being written"
        return SensorResult(skip_reason=SkipReason(msg), cursor=cursor)
    if reg.duplicates:
        context.log.info(f"{len(reg.duplicates)} duplicate file(s) quarantined: {reg.duplicates[:5]}")
    return SensorResult(run_requests=requests, dynamic_partitions_requests=adds, cursor=cursor)


@sensor(name="flow_window_sensor", minimum_interval_seconds=_SENSOR_INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="When a flows partition lands, (re)analyses every time window it touched.",
        job_name="flow_window_analysis")
def flow_window_sensor(context: SensorEvaluationContext):
    if JOB_FOR_SET[flow_windows.name] is None:
        return SkipReason("no window analyses defined")
    after = int(context.cursor) if context.cursor else 0
    result = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("flows"), after_storage_id=after), limit=200, ascending=True)
    requests, last = {}, after
    for rec in result.records:
        last = max(last, rec.storage_id)
        md = rec.asset_materialization.metadata if rec.asset_materialization else {}
        windows = md.get("windows").value if "windows" in md else []
        for w in windows or []:
            # one run per window per batch of new flow data (run_key changes with the newest storage id)
            requests[w] = RunRequest(run_key=f"{w}:{rec.storage_id}", partition_key=w,
                                     tags={"fleetscope/trigger": "flow_window_sensor"})
    if not requests:
        return SensorResult(skip_reason=SkipReason("no new flow data"), cursor=str(last))
    return SensorResult(run_requests=list(requests.values()), cursor=str(last))


def _yesterday(context: ScheduleEvaluationContext) -> str:
    import datetime as dt
    return (context.scheduled_execution_time - dt.timedelta(days=1)).strftime("%Y%m%d")


def _nightly_windows(context: ScheduleEvaluationContext):
    day = _yesterday(context)
    return [RunRequest(run_key=f"nightly:{day}:{w}", partition_key=w, tags={"fleetscope/trigger": "nightly"})
            for w in context.instance.get_dynamic_partitions(flow_windows.name) if day_of(w) == day]


def _nightly_fleet(context: ScheduleEvaluationContext):
    day = _yesterday(context)
    return [RunRequest(run_key=f"nightly:{day}:fleet", tags={"fleetscope/trigger": "nightly", "fleetscope/day": day})]


ALL_SCHEDULES = []
if JOB_FOR_SET[flow_windows.name] is not None:
    ALL_SCHEDULES.append(schedule(
        name="nightly_window_schedule", cron_schedule="30 1 * * *", execution_timezone="UTC",
        job=JOB_FOR_SET[flow_windows.name], default_status=DefaultScheduleStatus.RUNNING,
        description="Every night: re-analyse every flow window of yesterday (UTC) with the current code and settings.")(_nightly_windows))
if fleet_analysis is not None:
    ALL_SCHEDULES.append(schedule(
        name="nightly_fleet_schedule", cron_schedule="0 2 * * *", execution_timezone="UTC",
        job=fleet_analysis, default_status=DefaultScheduleStatus.RUNNING,
        description="Every night: the fleet analysis job (fleet-wide summaries and the nightly report).")(_nightly_fleet))


ALL_SENSORS = [landing_sensor] + ([flow_window_sensor] if JOB_FOR_SET[flow_windows.name] is not None else [])
