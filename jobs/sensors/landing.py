"""landing_sensor: registers new or changed landed files as dynamic partitions and requests their
ingestion runs. Its cursor (size:mtime of every file seen) lives in the Dagster instance, so it
survives restarts."""
import json

from dagster import AddDynamicPartitionsRequest, DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from fleetscope.jobs.jobs import JOB_FOR_SET, flow_window_analysis
from fleetscope.jobs.sensors.settings import INTERVAL_S, SETTLE_S
from fleetscope.registry import register_landing
from fleetscope.resources import landing_path, warehouse_path
from fleetscope.warehouse import Warehouse


@sensor(name="landing_sensor", minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="Registers new or changed files in the landing folder (content-hashed dynamic partitions) and requests their ingestion runs.",
        jobs=[j for j in JOB_FOR_SET.values() if j is not flow_window_analysis])
def landing_sensor(context: SensorEvaluationContext):
    known = json.loads(context.cursor) if context.cursor else {}
    wh = Warehouse(warehouse_path())
    wh.init()
    reg = register_landing(landing_path(), wh, settle_s=SETTLE_S, known_signatures=known)
    requests, adds = [], []
    for pset, keys in reg.to_run.items():
        job = JOB_FOR_SET[pset]
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
