"""incident_sensor: re-writes an incident's report when a verdict in its scope (its flow windows
and captures, or its own hang diagnosis) changed after the report was written."""
from dagster import DefaultSensorStatus, SensorEvaluationContext, sensor

from fleetscope.jobs.jobs import incident_report_job
from fleetscope.jobs.planner import REPORT_JOB, sensor_result
from fleetscope.jobs.settings import ANSWERS_INTERVAL_S


@sensor(name="incident_sensor", minimum_interval_seconds=ANSWERS_INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="Re-writes an incident's report when a verdict in its scope (its flow windows and captures, or its own "
                    "hang diagnosis) changed after the report was written (debounced with the problems).",
        job=incident_report_job)
def incident_sensor(context: SensorEvaluationContext):
    return sensor_result(context, {REPORT_JOB}, "incident_sensor")
