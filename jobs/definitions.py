from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl

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

from fleetscope.assets import ALL_ASSETS, assets_partitioned_by, unpartitioned_assets
from fleetscope.assets.partitions import captures, flow_files, flow_windows, hw_files, incidents, topology_files
from fleetscope.registry import register_landing
from fleetscope.warehouse import Warehouse
from fleetscope.windows import day_of
from fleetscope.resources import landing_path, warehouse_path


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

incident_report_job = define_asset_job(
    "incident_report_job", selection=AssetSelection.assets("incident_report"), partitions_def=incidents,
    description="Re-write an incident's report once the analyses in its scope have run.") \
    if any("incident_report" in str(k) for a in ALL_ASSETS for k in a.keys) else None

ALL_JOBS = [j for j in list(JOB_FOR_SET.values()) + [fleet_analysis, incident_report_job] if j is not None]

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


def incident_scope(wh: Warehouse, incident_id: str, instance) -> tuple[list[str], list[str]]:
    """(flow windows, captures) an incident request needs: windows overlapping its time span (or
    every window of its job), and the captures of its job."""
    from fleetscope.windows import parse_window_id
    req = wh.read("incidents", where=f"incident_id = '{incident_id}'")
    if req.height == 0:
        return [], []
    r = req.to_dicts()[0]
    windows = []
    for w in instance.get_dynamic_partitions(flow_windows.name):
        ws, we = parse_window_id(w)
        if (r.get("from_ns") is None or we >= r["from_ns"]) and (r.get("to_ns") is None or ws <= r["to_ns"]):
            windows.append(w)
    if r.get("from_ns") is None and r.get("to_ns") is None and r.get("job_id"):
        seen = wh.read("jobs", where=f"job_id = '{r['job_id']}'")
        windows = sorted(set(seen["window_id"].to_list())) if seen.height else []
    caps = []
    if r.get("job_id"):
        caps = wh.read("captures", where=f"job_id = '{r['job_id']}'")["capture_id"].to_list()
    if r.get("capture"):
        caps.append(r["capture"])
    return sorted(set(windows)), sorted(set(caps))


@sensor(name="incident_sensor", minimum_interval_seconds=_SENSOR_INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="An incident request (landing/incidents/*.json, ingested by incident_analysis) starts runs scoped to its job, "
                    "hosts and time span (its flow windows and captures), then re-writes its report when they finish.",
        jobs=[j for j in (JOB_FOR_SET[flow_windows.name], JOB_FOR_SET[captures.name], incident_report_job) if j is not None])
def incident_sensor(context: SensorEvaluationContext):
    from dagster import DagsterRunStatus, RunsFilter
    state = json.loads(context.cursor) if context.cursor else {"after": 0, "pending": {}}
    recs = context.instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey("incident_inputs"), after_storage_id=state["after"]), limit=100, ascending=True).records
    wh = Warehouse(warehouse_path())
    requests = []
    for rec in recs:
        state["after"] = max(state["after"], rec.storage_id)
        key = rec.partition_key
        windows, caps = incident_scope(wh, key, context.instance)
        for w in windows:
            requests.append(RunRequest(run_key=f"incident:{key}:{rec.storage_id}:{w}", job_name="flow_window_analysis",
                                       partition_key=w, tags={"fleetscope/incident": key}))
        for c in caps:
            requests.append(RunRequest(run_key=f"incident:{key}:{rec.storage_id}:{c}", job_name="capture_analysis",
                                       partition_key=c, tags={"fleetscope/incident": key}))
        state["pending"][key] = rec.storage_id
    finished = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
    for key, sid in list(state["pending"].items()):
        runs = context.instance.get_runs(RunsFilter(tags={"fleetscope/incident": key}))
        if any(r.status not in finished for r in runs) or any(k.startswith(f"incident:{key}:") for k in (q.run_key for q in requests)):
            continue
        if incident_report_job is not None:
            requests.append(RunRequest(run_key=f"incident-report:{key}:{sid}", job_name="incident_report_job", partition_key=key,
                                       tags={"fleetscope/trigger": "incident_sensor"}))
        del state["pending"][key]
    if not requests:
        return SensorResult(skip_reason=SkipReason("no new incidents"), cursor=json.dumps(state))
    return SensorResult(run_requests=requests, cursor=json.dumps(state))


@sensor(name="critical_verdict_sensor", minimum_interval_seconds=max(_SENSOR_INTERVAL_S, 60), default_status=DefaultSensorStatus.RUNNING,
        description="A new critical verdict about a job files an incident request (landing/incidents/auto-*.json): the "
                    "landing and incident sensors then run its scoped analyses and write its report.")
def critical_verdict_sensor(context: SensorEvaluationContext):
    seen = set(json.loads(context.cursor)) if context.cursor else None
    wh = Warehouse(warehouse_path())
    if not wh.has_table("anomaly_verdicts"):
        return SkipReason("no verdicts yet")
    crit = wh.read("anomaly_verdicts", where="severity = 'critical' AND job_id IS NOT NULL",
                   columns=["verdict_id", "job_id", "start_ns", "end_ns", "explanation"])
    ids = set(crit["verdict_id"].to_list())
    if seen is None:  # first evaluation: today's state is the baseline, file only what is new from now on
        return SensorResult(skip_reason=SkipReason(f"baseline of {len(ids)} critical verdicts"), cursor=json.dumps(sorted(ids)))
    new = crit.filter(~pl.col("verdict_id").is_in(list(seen)))
    folder = Path(landing_path()) / "incidents"
    for r in new.unique("job_id").iter_rows(named=True):
        folder.mkdir(parents=True, exist_ok=True)
        req = {"kind": "slow", "job_id": r["job_id"], "from_ns": r["start_ns"], "to_ns": r["end_ns"],
               "note": f"filed by critical_verdict_sensor for verdict {r['verdict_id']}: {r['explanation'][:200]}"}
        tmp = folder / f".auto-{r['verdict_id']}.json.tmp"
        tmp.write_text(json.dumps(req))
        tmp.rename(folder / f"auto-{r['verdict_id']}.json")
    return SensorResult(skip_reason=SkipReason(f"{new.height} new critical verdicts filed as incidents") if new.height == 0 else None,
                        cursor=json.dumps(sorted(ids | seen)[-20000:]))


@sensor(name="degradation_sensor", minimum_interval_seconds=_SENSOR_INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="PerfTracker 4.1's loop: a job whose iterations degraded (xputimer_degradations) gets a profiling request "
                    "(landing/requests/<job>.json); its collectors record a short torch.profiler window into landing/traces/, "
                    "which the landing sensor then ingests and the per-capture analyses localize.")
def degradation_sensor(context: SensorEvaluationContext):
    from fleetscope.xputimer.degradation import write_profile_request
    seen = set(json.loads(context.cursor)) if context.cursor else set()
    wh = Warehouse(warehouse_path())
    if not wh.has_table("xputimer_degradations"):
        return SkipReason("no degradation results yet")
    deg = wh.read("xputimer_degradations", where="kind = 'degraded'")
    if deg.height == 0:
        return SensorResult(skip_reason=SkipReason("no degraded jobs"), cursor=json.dumps(sorted(seen)))
    first = deg.sort("at_ns").group_by("capture_id", maintain_order=True).first()
    caps = wh.read("captures")
    job_of = dict(zip(caps["capture_id"].to_list(), caps["job_id"].to_list())) if caps.height else {}
    filed = []
    for r in first.iter_rows(named=True):
        key = f"{r['capture_id']}:{r['at_ns']}"
        if key in seen:
            continue
        job = job_of.get(r["capture_id"]) or r["capture_id"]
        path = write_profile_request(landing_path(), job, r)
        filed.append(str(path))
        seen.add(key)
    cursor = json.dumps(sorted(seen)[-20000:])
    if not filed:
        return SensorResult(skip_reason=SkipReason("no new degradations"), cursor=cursor)
    context.log.info(f"profiling requested: {filed}")
    return SensorResult(skip_reason=SkipReason(f"filed {len(filed)} profiling request(s): {', '.join(filed)}"), cursor=cursor)


ALL_SENSORS = [landing_sensor, incident_sensor, critical_verdict_sensor, degradation_sensor] + ([flow_window_sensor] if JOB_FOR_SET[flow_windows.name] is not None else [])
