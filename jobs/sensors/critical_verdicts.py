"""critical_verdict_sensor: a critical problem files an incident request for its job
(landing/incidents/<job or host>-critical-<problem>.json), once, when the answers are built from complete inputs;
the landing sensor then ingests it, and its analyses and report follow (fleetscope.jobs.planner)."""
from dagster import DefaultSensorStatus, SensorEvaluationContext, sensor

from fleetscope.jobs.planner import sensor_result
from fleetscope.jobs.settings import ANSWERS_INTERVAL_S


@sensor(name="critical_verdict_sensor", minimum_interval_seconds=ANSWERS_INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="A critical problem files an incident request for its job (landing/incidents/<job or host>-critical-<problem>.json), once: "
                    "the landing sensor then ingests it, and its analyses and report follow.")
def critical_verdict_sensor(context: SensorEvaluationContext):
    return sensor_result(context, set(), "critical_verdict_sensor", file_requests=True)
