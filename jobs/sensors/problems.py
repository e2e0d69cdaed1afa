"""problems_sensor: the answers, live. When a verdict changes (a window, capture or incident
analysed), rebuild problems, problem_members and the fleet health page (fleet_analysis), debounced:
once the verdicts were quiet a while, at most ANSWERS_MAX_WAIT_S after the first change. The
`no_critical_problems` check runs with it, so the catalog turns red as soon as a critical problem exists."""
from dagster import DefaultSensorStatus, SensorEvaluationContext, sensor

from fleetscope.jobs.jobs import fleet_analysis
from fleetscope.jobs.planner import FLEET_JOB, sensor_result
from fleetscope.jobs.settings import ANSWERS_INTERVAL_S


@sensor(name="problems_sensor", minimum_interval_seconds=ANSWERS_INTERVAL_S, default_status=DefaultSensorStatus.RUNNING,
        description="When verdicts change, rebuilds problems, problem_members and the fleet health page (debounced; the "
                    "no_critical_problems check turns red with it). The nightly schedule remains the full rebuild.",
        job=fleet_analysis)
def problems_sensor(context: SensorEvaluationContext):
    return sensor_result(context, {FLEET_JOB}, "problems_sensor")
