"""degradation_sensor: PerfTracker 4.1's loop. A job whose iterations degraded
(xputimer_degradations) gets a profiling request (landing/requests/<job>.json); its collectors
record a short torch.profiler window into landing/traces/, which the landing sensor then ingests
and the per-capture analyses localize. A job blocked right now (no event for longer than its
bound, measured against the current time, and not stopped) gets a hang incident and a stack
request, so the hang is diagnosed without a human."""
import json
import time

from dagster import DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from fleetscope.jobs import settings
from fleetscope.jobs.settings import INTERVAL_S
from fleetscope.resources import landing_path, warehouse_path
from fleetscope.warehouse import Warehouse
from fleetscope.xputimer.degradation import blocked_jobs, write_hang_incident, write_profile_request


@sensor(name="degradation_sensor", minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="PerfTracker 4.1's loop: a job whose iterations degraded (xputimer_degradations) gets a profiling request "
                    "(landing/requests/<job>.json); its collectors record a short torch.profiler window into landing/traces/, "
                    "which the landing sensor then ingests and the per-capture analyses localize. A job blocked right now (silent "
                    "past its bound against the current time, not stopped) gets a hang incident and a stack request.")
def degradation_sensor(context: SensorEvaluationContext):
    state = json.loads(context.cursor) if context.cursor else []
    seen = set(state if isinstance(state, list) else state.get("seen", []))
    wh = Warehouse(warehouse_path())
    filed = _blocked_now(wh, seen, context)
    if wh.has_table("xputimer_degradations"):
        deg = wh.read("xputimer_degradations", where="kind = 'degraded'")
    else:
        deg = None
    if deg is not None and deg.height:
        first = deg.sort("at_ns").group_by("capture_id", maintain_order=True).first()
        caps = wh.read("captures")
        job_of = dict(zip(caps["capture_id"].to_list(), caps["job_id"].to_list())) if caps.height else {}
        for r in first.iter_rows(named=True):
            key = f"{r['capture_id']}:{r['at_ns']}"
            if key in seen:
                continue
            job = job_of.get(r["capture_id"]) or r["capture_id"]
            filed.append(str(write_profile_request(landing_path(), job, r)))
            seen.add(key)
    cursor = json.dumps(sorted(seen)[-20000:])
    if not filed:
        return SensorResult(skip_reason=SkipReason("no new degradations or blocked jobs"), cursor=cursor)
    context.log.info(f"filed: {filed}")
    return SensorResult(skip_reason=SkipReason(f"filed {len(filed)} request(s): {', '.join(filed)}"), cursor=cursor)


def _blocked_now(wh: Warehouse, seen: set, context) -> list[str]:
    """Jobs blocked right now (fleetscope.xputimer.degradation.blocked_jobs against time.time_ns())
    -> a hang incident and a stack request each, once per silence (keyed by its last event)."""
    if not (wh.has_table("timings") and wh.has_table("captures")):
        return []
    last = wh.sql("SELECT c.job_id, t.capture_id, t.rank, max(t.end_ns) AS last_ns, "
                  "arg_max(t.name, t.end_ns) = 'tracer.stop' AS stopped "
                  "FROM timings t JOIN captures c USING (capture_id) WHERE c.job_id IS NOT NULL GROUP BY 1, 2, 3")
    its = wh.read("xputimer_iterations") if wh.has_table("xputimer_iterations") else None
    filed = []
    for r in blocked_jobs(last, its, time.time_ns(), min_idle_ns=int(settings.BLOCKED_MIN_IDLE_S * 1e9)).iter_rows(named=True):
        key = f"blocked:{r['job_id']}:{r['last_ns']}"
        if key in seen:
            continue
        inc = write_hang_incident(landing_path(), r["job_id"], r["capture_id"], r["last_ns"],
                                  f"fleetscope degradation_sensor: no event from ranks {r['ranks_running']} of job "
                                  f"{r['job_id']} for {r['idle_ns'] / 1e9:.0f} s (mean iteration "
                                  f"{(r['mean_iteration_ns'] or 0) / 1e9:.2f} s) and the job did not stop: blocked now")
        context.log.info(f"blocked job {r['job_id']}: hang incident {inc} filed, stacks requested")
        filed.append(inc)
        seen.add(key)
    return filed
