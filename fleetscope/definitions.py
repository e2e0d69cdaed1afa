"""The fleetscope code location: every asset, check, job, sensor and schedule, gathered
explicitly, with the resources and the executor chosen by configuration (FLEETSCOPE_* environment
variables; docs/SCALING.md). `fleetscope ui`, `dagster dev -m fleetscope.definitions` and a
deployment's code server (`dagster api grpc -m fleetscope.definitions`) load this module."""
from dagster import Definitions

from fleetscope.assets import ALL_ASSET_CHECKS, ALL_ASSETS
from fleetscope.jobs import ALL_JOBS, ALL_SCHEDULES, ALL_SENSORS
from fleetscope.resources import default_resources, executor_from_env

defs = Definitions(
    assets=ALL_ASSETS,
    asset_checks=ALL_ASSET_CHECKS,
    jobs=ALL_JOBS,
    sensors=ALL_SENSORS,
    schedules=ALL_SCHEDULES,
    resources=default_resources(),
)
if (_executor := executor_from_env()) is not None:  # in_process unless FLEETSCOPE_EXECUTOR says otherwise (docs/SCALING.md)
    defs = Definitions.merge(defs, Definitions(executor=_executor))
