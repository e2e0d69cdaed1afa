"""The fleetscope code location for a deployment past one machine: exactly the assets, checks,
jobs, sensors, schedules and resources of definitions.py, with the executor chosen by
FLEETSCOPE_EXECUTOR (docs/SCALING.md):

  multiprocess (default)  one process per step on the run's machine (max FLEETSCOPE_MAX_CONCURRENT)
  celery                  each step is a Celery task on a worker fleet (needs dagster-celery==0.29.27)
  k8s                     each step is its own Kubernetes Job (needs dagster-k8s==0.29.27)

Load it with deploy/workspace.yaml (`dagster-webserver -w deploy/workspace.yaml`, `dagster-daemon run
-w deploy/workspace.yaml`) or `dagster dev -f deploy/distributed_definitions.py -d .`. Nothing in
the assets changes: they read and write parquet partitions through the warehouse resource, so the
warehouse path (FLEETSCOPE_WAREHOUSE) must be storage every step can reach (a shared volume, or
s3:// / gs:// parquet as docs/SCALING.md explains)."""
from __future__ import annotations

import os

from dagster import Definitions, ExecutorDefinition, multiprocess_executor

EXECUTORS = ("multiprocess", "celery", "k8s")


def executor_from_env(name: str | None = None) -> ExecutorDefinition:
    """The executor named by FLEETSCOPE_EXECUTOR (or `name`), configured from the environment."""
    name = (name or os.environ.get("FLEETSCOPE_EXECUTOR") or "multiprocess").strip().lower()
    if name == "multiprocess":
        return multiprocess_executor.configured({"max_concurrent": int(os.environ.get("FLEETSCOPE_MAX_CONCURRENT", "4"))})
    if name == "celery":
        try:
            from dagster_celery import celery_executor
        except ImportError as exc:
            raise RuntimeError("FLEETSCOPE_EXECUTOR=celery needs dagster-celery==0.29.27 (pip install dagster-celery==0.29.27)") from exc
        return celery_executor.configured({
            "broker": {"env": "FLEETSCOPE_CELERY_BROKER"},    # e.g. pyamqp://guest@rabbitmq:5672//
            "backend": {"env": "FLEETSCOPE_CELERY_BACKEND"},  # e.g. redis://redis:6379/0 or rpc://
            "include": ["dagster_celery.tasks"],
        })
    if name == "k8s":
        try:
            from dagster_k8s import k8s_job_executor
        except ImportError as exc:
            raise RuntimeError("FLEETSCOPE_EXECUTOR=k8s needs dagster-k8s==0.29.27 (pip install dagster-k8s==0.29.27)") from exc
        return k8s_job_executor.configured({
            "job_namespace": os.environ.get("FLEETSCOPE_K8S_NAMESPACE", "fleetscope"),
            "max_concurrent": int(os.environ.get("FLEETSCOPE_MAX_CONCURRENT", "16")),
            # every step pod sees the same warehouse settings as the run that launched it
            "env_vars": ["FLEETSCOPE_WAREHOUSE", "FLEETSCOPE_LANDING", "FLEETSCOPE_WINDOW_SECONDS"],
            "step_k8s_config": {"container_config": {"resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}},
        })
    raise ValueError(f"FLEETSCOPE_EXECUTOR={name!r} is not one of {', '.join(EXECUTORS)}")


def build_definitions(executor: ExecutorDefinition) -> Definitions:
    """definitions.defs with another executor for every job (asset jobs are resolved against it)."""
    from fleetscope.definitions import defs as base

    return Definitions(
        assets=list(base.assets or []),
        asset_checks=list(base.asset_checks or []),
        jobs=list(base.jobs or []),
        sensors=list(base.sensors or []),
        schedules=list(base.schedules or []),
        resources=dict(base.resources or {}),
        executor=executor,
    )


defs = build_definitions(executor_from_env())
