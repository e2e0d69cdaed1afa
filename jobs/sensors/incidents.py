"""incident_sensor: an incident request (landing/incidents/*.json, ingested by incident_analysis)
starts runs scoped to its job, hosts and time span (its flow windows and captures), then re-writes
its report when they finish."""
import json

from dagster import (AssetKey, AssetRecordsFilter, DagsterRunStatus, DefaultSensorStatus, RunRequest, RunsFilter,
                     SensorEvaluationContext, SensorResult, SkipReason, sensor)

from fleetscope.assets.partitions import flow_windows
from fleetscope.incidents import incident_scope
from fleetscope.jobs.jobs import capture_analysis, flow_window_analysis, incident_report_job
from fleetscope.jobs.sensors.settings import INTERVAL_S
from fleetscope.resources import warehouse_path
from fleetscope.warehouse import Warehouse

_FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


@sensor(name="incident_sensor", minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="An incident request (landing/incidents/*.json, ingested by incident_analysis) starts runs scoped to its job, "
                    "hosts and time span (its flow windows and captures), then re-writes its report when they finish.",
        jobs=[flow_window_analysis, capture_analysis, incident_report_job])
def incident_sensor(context: SensorEvaluationContext):
    state = json.loads(context.cursor) if context.cursor else {"after": 0, "pending": {}}
    recs = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("incidents"), after_storage_id=state["after"]), limit=100, ascending=True).records
    wh = Warehouse(warehouse_path())
    requests = []
    for rec in recs:
        state["after"] = max(state["after"], rec.storage_id)
        key = rec.partition_key
        req = wh.read("incidents", where=f"incident_id = '{key}'")
        if req.height:
            windows, caps = incident_scope(req.to_dicts()[0], context.instance.get_dynamic_partitions(flow_windows.name),
                                           wh.read("jobs", columns=["window_id", "job_id"]), wh.read("captures", columns=["capture_id", "job_id"]))
        else:
            windows, caps = [], []
        for w in windows:
            requests.append(RunRequest(run_key=f"incident:{key}:{rec.storage_id}:{w}", job_name=flow_window_analysis.name,
                                       partition_key=w, tags={"fleetscope/incident": key}))
        for c in caps:
            requests.append(RunRequest(run_key=f"incident:{key}:{rec.storage_id}:{c}", job_name=capture_analysis.name,
                                       partition_key=c, tags={"fleetscope/incident": key}))
        state["pending"][key] = rec.storage_id
    for key, sid in list(state["pending"].items()):
        runs = context.instance.get_runs(RunsFilter(tags={"fleetscope/incident": key}))
        if any(r.status not in _FINISHED for r in runs) or any(q.run_key.startswith(f"incident:{key}:") for q in requests):
            continue
        requests.append(RunRequest(run_key=f"incident-report:{key}:{sid}", job_name=incident_report_job.name, partition_key=key,
                                   tags={"fleetscope/trigger": "incident_sensor"}))
        del state["pending"][key]
    if not requests:
        return SensorResult(skip_reason=SkipReason("no new incidents"), cursor=json.dumps(state))
    return SensorResult(run_requests=requests, cursor=json.dumps(state))
