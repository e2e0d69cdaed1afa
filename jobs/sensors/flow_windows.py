"""flow_window_sensor: analyses every time window whose flows changed since its last analysis
(the windows each ingested flows partition touches; fleetscope.jobs.planner)."""
from dagster import DefaultSensorStatus, SensorEvaluationContext, sensor

from fleetscope.jobs.jobs import flow_window_analysis
from fleetscope.jobs.planner import WINDOW_JOB, sensor_result
from fleetscope.jobs.settings import INTERVAL_S


@sensor(name="flow_window_sensor", minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="Analyses every time window whose flows changed since its last analysis.", job=flow_window_analysis)
def flow_window_sensor(context: SensorEvaluationContext):
    return sensor_result(context, {WINDOW_JOB}, "flow_window_sensor")
