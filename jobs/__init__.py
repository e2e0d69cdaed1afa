"""Jobs, sensors and schedules: how assets get materialized without a person clicking.

- landing_sensor: registers new / changed landed files as dynamic partitions and requests the
  ingestion run for each (cursor: the size:mtime of every file seen, kept by Dagster across restarts).
- flow_window_sensor: a flows partition that touched windows -> (re)analyse those windows.
- derived capture assets carry AutomationCondition.eager(): they rerun when their inputs change,
  through Dagster's default automation sensor (on by default).
- nightly_fleet_schedule: re-analyses yesterday's windows and rebuilds the fleet report."""
from fleetscope.jobs.definitions import ALL_JOBS, ALL_SCHEDULES, ALL_SENSORS  # noqa: F401
