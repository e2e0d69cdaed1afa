"""The fleetscope Dagster code location: every asset, job, sensor and schedule, gathered
explicitly. `dagster dev` / `fleetscope ui` load this module from the repository root."""
from dagster import Definitions

from fleetscope.assets import ALL_ASSET_CHECKS, ALL_ASSETS
from fleetscope.jobs import ALL_JOBS, ALL_SCHEDULES, ALL_SENSORS
from fleetscope.resources import default_resources

defs = Definitions(
    assets=ALL_ASSETS,
    asset_checks=ALL_ASSET_CHECKS,
    jobs=ALL_JOBS,
    sensors=ALL_SENSORS,
    schedules=ALL_SCHEDULES,
    resources=default_resources(),
)
