"""Dagster's Dask executor (dagster-dask), one change: every task of a run is named after the run.

dagster-dask names a step's task `<job>.<step>`; Dask treats tasks of one name as one task, so two
runs of the same job at once on one cluster (two flow windows, two captures) would share a single
task and one of them would get the other's result. Here the job name the executor sees carries the
run id, so each run's tasks are its own; nothing else differs from dagster-dask."""
from __future__ import annotations

import copy
import os

from dagster import executor, multiple_process_executor_requirements
from dagster_dask.executor import DaskExecutor, dask_executor as _dagster_dask_executor


class RunScopedDaskExecutor(DaskExecutor):
    def execute(self, plan_context, execution_plan):
        scoped = copy.copy(plan_context)
        base = type(plan_context)
        run_job = f"{plan_context.job_name}[{plan_context.run_id[:8]}]"
        scoped.__class__ = type("RunScopedContext", (base,), {"job_name": property(lambda self: run_job)})
        yield from super().execute(scoped, execution_plan)


@executor(name="dask", config_schema=_dagster_dask_executor.config_schema, requirements=multiple_process_executor_requirements())
def run_scoped_dask_executor(init_context):
    ((cluster_type, cluster_configuration),) = init_context.executor_config["cluster"].items()
    return RunScopedDaskExecutor(cluster_type, cluster_configuration)


def cluster_config(address: str | None = None, workers: int | None = None) -> dict:
    """`cluster` config: an existing scheduler when an address is given, else a LocalCluster of
    `workers` single-threaded processes (Dagster steps are not thread-safe)."""
    if address:
        return {"existing": {"address": address}}
    return {"local": {"n_workers": int(workers or 2), "threads_per_worker": 1, "processes": True}}


def dask_executor_from_env():
    return run_scoped_dask_executor.configured({"cluster": cluster_config(
        os.environ.get("FLEETSCOPE_DASK_ADDRESS"), int(os.environ.get("FLEETSCOPE_WORKERS", "2")))})
