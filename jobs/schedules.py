"""The nightly schedules: re-analyse yesterday's flow windows with the current code and settings,
then rebuild the fleet-wide problems and report."""
import datetime as dt

from dagster import DefaultScheduleStatus, RunRequest, ScheduleEvaluationContext, schedule

from fleetscope.assets.partitions import flow_windows
from fleetscope.jobs.jobs import fleet_analysis, flow_window_analysis
from fleetscope.windows import day_of


def _yesterday(context: ScheduleEvaluationContext) -> str:
    return (context.scheduled_execution_time - dt.timedelta(days=1)).strftime("%Y%m%d")


@schedule(name="nightly_window_schedule", cron_schedule="30 1 * * *", execution_timezone="UTC", job=flow_window_analysis,
          default_status=DefaultScheduleStatus.RUNNING,
          description="Every night: re-analyse every flow window of yesterday (UTC) with the current code and settings.")
def nightly_window_schedule(context: ScheduleEvaluationContext):
    day = _yesterday(context)
    return [RunRequest(run_key=f"nightly:{day}:{w}", partition_key=w, tags={"fleetscope/trigger": "nightly"})
            for w in context.instance.get_dynamic_partitions(flow_windows.name) if day_of(w) == day]


@schedule(name="nightly_fleet_schedule", cron_schedule="0 2 * * *", execution_timezone="UTC", job=fleet_analysis,
          default_status=DefaultScheduleStatus.RUNNING,
          description="Every night: the fleet analysis job (fleet-wide problems and the nightly report).")
def nightly_fleet_schedule(context: ScheduleEvaluationContext):
    day = _yesterday(context)
    return [RunRequest(run_key=f"nightly:{day}:fleet", tags={"fleetscope/trigger": "nightly", "fleetscope/day": day})]


ALL_SCHEDULES = [nightly_window_schedule, nightly_fleet_schedule]
