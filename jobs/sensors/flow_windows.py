"""flow_window_sensor: when a flows partition lands, (re)analyse every time window it touched."""
from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from fleetscope.jobs.jobs import flow_window_analysis
from fleetscope.jobs.sensors.settings import INTERVAL_S
from fleetscope.jobs.windows import analysed_since, touched_windows


@sensor(name="flow_window_sensor", minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="When a flows partition lands, (re)analyses every time window it touched.", job=flow_window_analysis)
def flow_window_sensor(context: SensorEvaluationContext):
    windows, last = touched_windows(context.instance, after_storage_id=int(context.cursor) if context.cursor else 0)
    # windows analysed after their newest flows landed (e.g. by `fleetscope run` before the UI started) are done
    windows = {w: sid for w, sid in windows.items() if not analysed_since(context.instance, w, sid)}
    if not windows:
        return SensorResult(skip_reason=SkipReason("no new flow data to analyse"), cursor=str(last))
    # one run per window per batch of new flow data (the run key changes with the newest storage id)
    requests = [RunRequest(run_key=f"{w}:{sid}", partition_key=w, tags={"fleetscope/trigger": "flow_window_sensor"})
                for w, sid in sorted(windows.items())]
    return SensorResult(run_requests=requests, cursor=str(last))
