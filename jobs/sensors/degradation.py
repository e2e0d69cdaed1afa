"""degradation_sensor: PerfTracker 4.1's loop. A job whose iterations degraded
(xputimer_degradations) gets a profiling request (landing/requests/<job>.json); its collectors
record a short torch.profiler window into landing/traces/, which the landing sensor then ingests
and the per-capture analyses localize."""
import json

from dagster import DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from fleetscope.jobs.sensors.settings import INTERVAL_S
from fleetscope.resources import landing_path, warehouse_path
from fleetscope.warehouse import Warehouse
from fleetscope.xputimer.degradation import write_profile_request


@sensor(name="degradation_sensor", minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="PerfTracker 4.1's loop: a job whose iterations degraded (xputimer_degradations) gets a profiling request "
                    "(landing/requests/<job>.json); its collectors record a short torch.profiler window into landing/traces/, "
                    "which the landing sensor then ingests and the per-capture analyses localize.")
def degradation_sensor(context: SensorEvaluationContext):
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
        filed.append(str(write_profile_request(landing_path(), job, r)))
        seen.add(key)
    cursor = json.dumps(sorted(seen)[-20000:])
    if not filed:
        return SensorResult(skip_reason=SkipReason("no new degradations"), cursor=cursor)
    context.log.info(f"profiling requested: {filed}")
    return SensorResult(skip_reason=SkipReason(f"filed {len(filed)} profiling request(s): {', '.join(filed)}"), cursor=cursor)
