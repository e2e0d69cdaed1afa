"""landing_sensor: registers new or changed landed files (landed_files, content-hashed) and
requests what the planner says is due from them: ingestion of topology, flows and hw files, the
analysis of each capture, and each incident request (fleetscope.jobs.planner)."""
from dagster import DefaultSensorStatus, SensorEvaluationContext, sensor

from fleetscope.jobs.jobs import JOB_FOR_SET, flow_window_analysis
from fleetscope.jobs.planner import CAPTURE_JOB, INCIDENT_JOB, INGEST_JOBS, sensor_result
from fleetscope.jobs.settings import INTERVAL_S


@sensor(name="landing_sensor", minimum_interval_seconds=INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="Registers new or changed files in the landing folder (content-hashed, in landed_files) and requests their "
                    "ingestion, each capture's analysis and each incident request's, in the planner's order.",
        jobs=[j for j in JOB_FOR_SET.values() if j is not flow_window_analysis])
def landing_sensor(context: SensorEvaluationContext):
    return sensor_result(context, {*INGEST_JOBS.values(), CAPTURE_JOB, INCIDENT_JOB}, "landing_sensor", register=True)
