"""Dagster resources: where the warehouse and the landing zone are, and analysis settings; and the
executor, chosen by configuration. Paths come from the environment (FLEETSCOPE_WAREHOUSE,
FLEETSCOPE_LANDING) so the CLI, the UI, the daemon and tests all point at the same files."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dagster import ConfigurableResource, ExecutorDefinition, in_process_executor, multiprocess_executor

from fleetscope.warehouse import Warehouse

DEFAULT_WAREHOUSE = "data/warehouse.duckdb"
DEFAULT_LANDING = "data/landing"
EXECUTORS = ("in_process", "multiprocess", "dask", "celery", "k8s")
WAREHOUSE_TAG = "fleetscope/warehouse"


def warehouse_path() -> str:
    return os.environ.get("FLEETSCOPE_WAREHOUSE", DEFAULT_WAREHOUSE)


def warehouse_id(path: str | Path | None = None) -> str:
    """The warehouse a run belongs to (its `fleetscope/warehouse` tag): the file's name and a hash of
    its absolute path. Warehouses sharing one Dagster instance tell their runs apart by it."""
    p = Path(path or warehouse_path()).resolve()
    return f"{p.stem[:40]}-{hashlib.sha1(str(p).encode()).hexdigest()[:10]}"


def landing_path() -> str:
    return os.environ.get("FLEETSCOPE_LANDING", DEFAULT_LANDING)


class WarehouseResource(ConfigurableResource):
    """The DuckDB warehouse (views) and its parquet tables. An empty path means
    FLEETSCOPE_WAREHOUSE at run time (so the CLI, UI, daemon and tests share one setting)."""
    path: str = ""

    def get(self) -> Warehouse:
        return Warehouse(self.path or warehouse_path())


class LandingResource(ConfigurableResource):
    """The landing folder; an empty path means FLEETSCOPE_LANDING at run time."""
    path: str = ""

    @property
    def root(self) -> Path:
        return Path(self.path or landing_path())


class AnalysisSettings(ConfigurableResource):
    """Knobs shared by the analyses (all have paper defaults)."""
    window_seconds: int = 60          # LLMPrism time window
    window_margin_seconds: int = 30   # flows read before a window so straddling steps are complete
    pair_history_seconds: int = 3600  # earlier windows whose pair rates are a pair's history (flow_pair_rates)
    k_sigma: float = 3.0


def default_resources() -> dict:
    return {
        "warehouse": WarehouseResource(),
        "landing": LandingResource(),
        "settings": AnalysisSettings(window_seconds=int(os.environ.get("FLEETSCOPE_WINDOW_SECONDS", "60"))),
    }


def executor_from_env(name: str | None = None) -> ExecutorDefinition | None:
    """The executor named by FLEETSCOPE_EXECUTOR (or `name`), configured from the environment
    (docs/SCALING.md); `in_process` when unset.

      in_process    every step in the run's process (the default)
      multiprocess  one process per step on the run's machine (max FLEETSCOPE_MAX_CONCURRENT)
      dask          each step a task on a Dask cluster (dagster-dask): the scheduler at
                    FLEETSCOPE_DASK_ADDRESS, else a LocalCluster of FLEETSCOPE_WORKERS processes per run
      celery        each step a Celery task on a worker fleet (needs dagster-celery==0.29.27)
      k8s           each step its own Kubernetes Job (needs dagster-k8s==0.29.27)"""
    name = (name or os.environ.get("FLEETSCOPE_EXECUTOR") or "in_process").strip().lower()
    if name == "in_process":
        # the default: a run's steps in the run's own process. Most runs are one partition of one to
        # a few steps; a process per step costs an import of the code location each (seconds), and
        # partitions already run side by side as separate runs
        return in_process_executor
    if name == "multiprocess":
        return multiprocess_executor.configured({"max_concurrent": int(os.environ.get("FLEETSCOPE_MAX_CONCURRENT", "4"))})
    if name == "dask":
        from fleetscope.resources.dask_executor import dask_executor_from_env
        return dask_executor_from_env()
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
