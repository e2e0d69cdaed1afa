"""Jobs (jobs.py), sensors (sensors/, one per file) and schedules (schedules.py): how assets get
materialized without a person clicking; runner.py is `fleetscope run`."""
from fleetscope.jobs.jobs import ALL_JOBS  # noqa: F401
from fleetscope.jobs.schedules import ALL_SCHEDULES  # noqa: F401
from fleetscope.jobs.sensors import ALL_SENSORS  # noqa: F401
