"""The nightly schedules: re-analyse yesterday's flow windows with the current code and settings,
then rebuild the fleet-wide problems and report."""
import datetime as dt

from dagster import DefaultScheduleStatus, RunRequest, ScheduleEvaluationContext, schedule

from fleetscope.jobs.jobs import fleet_analysis, flow_window_analysis
from fleetscope.jobs.planner import flow_windows, window_seconds
from fleetscope.resources import WAREHOUSE_TAG, warehouse_id, warehouse_path
from fleetscope.warehouse import Warehouse
from fleetscope.ingest.windows import day_of


def _yesterday(context: ScheduleEvaluationContext) -> str:
    return (context.scheduled_execution_time - dt.timedelta(days=1)).strftime("%Y%m%d")


@schedule(name="nightly_window_schedule", cron_schedule="30 1 * * *", execution_timezone="UTC", job=flow_window_analysis,
          default_status=DefaultScheduleStatus.RUNNING,
          description="Every night: re-analyse every flow window of yesterday (UTC) with the current code and settings.")
def nightly_window_schedule(context: ScheduleEvaluationContext):
    day = _yesterday(context)
    # this warehouse's windows (its flows say which), not every window of a Dagster instance it may share
    windows = [w for w in sorted(flow_windows(Warehouse(warehouse_path()), window_seconds())) if day_of(w) == day]
    new = [w for w in windows if not context.instance.has_dynamic_partition("flow_windows", w)]
    if new:
        context.instance.add_dynamic_partitions("flow_windows", new)
    return [RunRequest(run_key=f"nightly:{day}:{w}", partition_key=w,
                       tags={"fleetscope/trigger": "nightly", WAREHOUSE_TAG: warehouse_id()}) for w in windows]


@schedule(name="nightly_fleet_schedule", cron_schedule="0 2 * * *", execution_timezone="UTC", job=fleet_analysis,
          default_status=DefaultScheduleStatus.RUNNING,
          description="Every night: the fleet analysis job (fleet-wide problems and the nightly report).")
def nightly_fleet_schedule(context: ScheduleEvaluationContext):
    day = _yesterday(context)
    return [RunRequest(run_key=f"nightly:{day}:fleet", tags={"fleetscope/trigger": "nightly", "fleetscope/day": day,
                                                             WAREHOUSE_TAG: warehouse_id()})]


ALL_SCHEDULES = [nightly_window_schedule, nightly_fleet_schedule]
