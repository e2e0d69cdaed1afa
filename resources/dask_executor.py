"""Dagster's Dask executor (dagster-dask), with its submit loop redone for two reasons found here:

1. dagster-dask names a step's task `<job>.<step>`; Dask treats tasks of one name as one task, so two
   runs of the same job at once on one cluster (two flow windows, two captures) would share a single
   task and one of them would get the other's result. Here a task's name carries its run id.
2. Dask 2025+ walks every tuple among a task's arguments to find nested tasks; a partitioned run's
   DagsterRun holds Dagster records that refuse iteration ("Iteration is not allowed on `@record`
   KeyRangesPartitionsSubset"), so dagster-dask 0.29.27 fails every partitioned run on it. Here the
   Dagster objects travel inside the task's function (a functools.partial) and only the futures of
   the steps it depends on are arguments.

Everything else (the step function run on a worker, `existing` and `local` clusters, resource
requirements from step tags) is dagster-dask's own."""
from __future__ import annotations

import functools
import os
import sys

import dask.distributed
from dask.sizeof import sizeof
from dagster import _check as check, executor, multiple_process_executor_requirements
from dagster._core.errors import raise_execution_interrupts
from dagster._core.events import DagsterEvent
from dagster._utils import iterate_with_context
from dagster_dask.executor import DaskExecutor, dask_executor as _dagster_dask_executor
from dagster_dask.executor import get_dask_resource_requirements, query_on_dask_worker

from fleetscope.common import sigterm_default


@sizeof.register(DagsterEvent)
def _sizeof_event(event) -> int:
    # Dask sizes a task's result by walking it; Dagster's records refuse iteration (noisy warnings)
    return sys.getsizeof(event)


class TerminableChildren(dask.distributed.WorkerPlugin):
    """A worker whose SIGTERM is ignored (a cluster started after an in-process Dagster run in a
    process that ignores SIGINT: fleetscope.common.sigterm_default) passes that on to every process it
    starts, and Dagster's log tailers of each step (`tail -F`, stopped with SIGTERM) then never stop.
    The plugin gives the workers SIGTERM's default back (setup runs on the worker's main thread)."""

    name = "fleetscope-terminable-children"

    def setup(self, worker):
        sigterm_default()


def step_on_worker(dependencies, **kwargs):
    """dagster-dask's step function, reached through this module so a worker that unpickles it
    imports the sizeof above."""
    return query_on_dask_worker(dependencies, **kwargs)


class RunScopedDaskExecutor(DaskExecutor):
    def execute(self, plan_context, execution_plan):
        if self.cluster_type not in ("existing", "local"):
            raise ValueError(f"fleetscope's dask executor runs on an existing scheduler or a LocalCluster, not {self.cluster_type!r}")
        instance = plan_context.instance
        if not instance.is_persistent:
            raise ValueError("Dask execution requires a persistent DagsterInstance (DAGSTER_HOME)")
        name = f"{plan_context.job_name}[{plan_context.run_id[:8]}]"
        if self.cluster_type == "existing":
            cluster = self.cluster_configuration["address"]
        else:
            cluster = dask.distributed.LocalCluster(**self.build_dict(name))
        step = functools.partial(step_on_worker, recon_job=plan_context.reconstructable_job,
                                 dagster_run=plan_context.dagster_run, run_config=plan_context.run_config,
                                 instance_ref=instance.get_ref(), known_state=execution_plan.known_state)
        with dask.distributed.Client(cluster) as client:
            client.register_plugin(TerminableChildren())
            futures, by_step = [], {}
            for level in execution_plan.get_steps_to_execute_by_level():
                for s in level:
                    deps = [by_step[k] for i in s.step_inputs for k in i.dependency_keys]
                    f = client.submit(functools.partial(step, step_keys=[s.key]), deps, key=f"{name}.{s.key}",
                                      resources=get_dask_resource_requirements(s.tags))
                    futures.append(f)
                    by_step[s.key] = f
            for _, result in iterate_with_context(raise_execution_interrupts,
                                                  dask.distributed.as_completed(futures, with_results=True)):
                for event in result:
                    yield check.inst(event, DagsterEvent)


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
