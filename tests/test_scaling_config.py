"""Scaling past one machine, in config (docs/SCALING.md): the real definitions load with another
executor, a job resolved with it runs through that executor in a real Dagster instance, and the
example deployment files (deploy/) are valid Dagster configuration.

celery / k8s: their executors are only loaded (no broker or cluster here), and only where
dagster-celery / dagster-k8s 0.29.27 are installed; they are not platform requirements (they pull
in celery, kombu, kubernetes, google-auth, ...), so the tests skip with that reason otherwise."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus, execute_job
from dagster._core.definitions.reconstruct import ReconstructableRepository

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
TOPOLOGY_ROWS = 6


def _load_definitions(monkeypatch, executor: str | None = None):
    """A fresh copy of fleetscope/definitions.py (it builds `defs` at import, from the env)."""
    if executor is None:
        monkeypatch.delenv("FLEETSCOPE_EXECUTOR", raising=False)
    else:
        monkeypatch.setenv("FLEETSCOPE_EXECUTOR", executor)
    import fleetscope.definitions
    spec = importlib.util.spec_from_file_location(f"fleetscope_defs_{executor}", fleetscope.definitions.__file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_definitions_load_with_a_configured_multiprocess_executor(monkeypatch):
    from fleetscope.definitions import defs as base

    monkeypatch.setenv("FLEETSCOPE_MAX_CONCURRENT", "3")
    scaled = _load_definitions(monkeypatch, "multiprocess").defs
    scaled.validate_loadable(scaled)  # raises when anything does not resolve
    repo = scaled.get_repository_def()
    base_repo = base.get_repository_def()
    # the same code location: every asset, job, sensor and schedule
    assert set(repo.asset_graph.get_all_asset_keys()) == set(base_repo.asset_graph.get_all_asset_keys())
    assert {j.name for j in repo.get_all_jobs()} == {j.name for j in base_repo.get_all_jobs()}
    assert {s.name for s in repo.sensor_defs} == {s.name for s in base_repo.sensor_defs}
    assert {s.name for s in repo.schedule_defs} == {s.name for s in base_repo.schedule_defs}
    # every job now runs through the configured executor
    for job in repo.get_all_jobs():
        assert job.executor_def.name == "multiprocess", (job.name, job.executor_def.name)
    job = scaled.resolve_job_def("ingest_topology")
    assert job.executor_def.name == "multiprocess"
    # without FLEETSCOPE_EXECUTOR every job runs its steps in the run's process
    assert all(j.executor_def.name == "in_process" for j in base_repo.get_all_jobs())
    # and the Dask executor (dagster-dask, docs/SCALING.md) resolves every job the same way
    dask = _load_definitions(monkeypatch, "dask").defs
    dask.validate_loadable(dask)
    assert all(j.executor_def.name == "dask" for j in dask.get_repository_def().get_all_jobs())


def test_unknown_executor_name_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="FLEETSCOPE_EXECUTOR='spark' is not one of in_process, multiprocess, dask, celery, k8s"):
        _load_definitions(monkeypatch, "spark")


@pytest.mark.slow
def test_a_job_runs_through_the_multiprocess_executor_in_a_real_instance(tmp_path, monkeypatch):
    """ingest_topology on a tiny landing, launched with execute_job (not in-process): the step runs
    in a child process of the multiprocess executor, recorded in a real (sqlite) instance."""
    landing, warehouse, home = tmp_path / "landing", tmp_path / "wh" / "warehouse.duckdb", tmp_path / "dagster_home"
    (landing / "topology").mkdir(parents=True)
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    rows = [{"ip": f"10.9.0.{i}", "host": f"h{i // 2}", "gpu": f"h{i // 2}/gpu{i % 2}", "leaf": "leaf-a"} for i in range(TOPOLOGY_ROWS)]
    pl.DataFrame(rows).write_csv(landing / "topology" / "topo.csv")
    old = time.time() - 60
    os.utime(landing / "topology" / "topo.csv", (old, old))
    for k, v in {"FLEETSCOPE_LANDING": str(landing), "FLEETSCOPE_WAREHOUSE": str(warehouse), "DAGSTER_HOME": str(home),
                 "FLEETSCOPE_EXECUTOR": "multiprocess", "FLEETSCOPE_MAX_CONCURRENT": "2"}.items():
        monkeypatch.setenv(k, v)
    # the run and its steps import the code location afresh, with FLEETSCOPE_EXECUTOR set
    monkeypatch.delitem(sys.modules, "fleetscope.definitions", raising=False)

    from fleetscope.ingest.registry import register_landing
    from fleetscope.warehouse import Warehouse

    wh = Warehouse(warehouse)
    wh.init()
    reg = register_landing(landing, wh, settle_s=0)
    keys = reg.to_run.get("topology_files", [])
    assert len(keys) == 1, reg.to_run
    recon = ReconstructableRepository.for_module("fleetscope.definitions", "defs")
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("topology_files", keys)
        result = execute_job(recon.get_reconstructable_job("ingest_topology"), instance=instance,
                             tags={"dagster/partition": keys[0], "fleetscope/trigger": "test"})
        assert result.success, [e.message for e in result.all_events if e.is_failure]
        run = instance.get_run_by_id(result.run_id)
        assert run.status == DagsterRunStatus.SUCCESS
        messages = [e.message or "" for e in instance.all_logs(result.run_id)]
        assert any("Executing steps using multiprocess executor" in m for m in messages), messages[:10]
        assert any("Launching subprocess" in m for m in messages)
        step_pids = {e.dagster_event.pid for e in instance.all_logs(result.run_id)
                     if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"}
        assert step_pids and os.getpid() not in step_pids  # the step ran in a child process
    got = wh.read("topology")
    assert got.height == TOPOLOGY_ROWS and sorted(got["ip"].to_list()) == sorted(r["ip"] for r in rows)


def _dagster_instance_schema_errors(doc: dict) -> list[str]:
    from dagster._config import validate_config
    from dagster._core.instance.config import dagster_instance_config_schema

    res = validate_config(dagster_instance_config_schema(), doc)
    return [e.message for e in res.errors or []]


def test_deploy_instance_config_is_valid_dagster_config():
    doc = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    assert _dagster_instance_schema_errors(doc) == []
    assert "postgres" in doc["storage"], "the distributed instance keeps its storage in Postgres"
    assert doc["run_launcher"]["class"] == "K8sRunLauncher"
    # the repo's single-machine instance file validates against the same schema (a broken schema check would fail here)
    assert _dagster_instance_schema_errors(yaml.safe_load((REPO / "dagster.yaml").read_text())) == []
    assert _dagster_instance_schema_errors({"storage": {"postgres": {"postgres_db": 5}}, "nonsense": 1})


def test_deploy_postgres_storage_config_matches_dagster_postgres():
    pytest.importorskip("dagster_postgres", reason="dagster-postgres==0.29.27 is not installed (not a platform requirement)")
    from dagster._config import validate_config
    from dagster_postgres import DagsterPostgresStorage

    block = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())["storage"]["postgres"]
    res = validate_config(DagsterPostgresStorage.config_type(), block)
    assert res.success, [e.message for e in res.errors]


def test_deploy_workspace_points_at_the_code_location():
    doc = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
    entries = doc["load_from"]
    assert entries and "grpc_server" in entries[0]
    assert entries[0]["grpc_server"]["location_name"] == "fleetscope"
    # the code server and the commented single-machine alternative name the installed module
    text = (DEPLOY / "workspace.yaml").read_text()
    assert "module_name: fleetscope.definitions" in text and "-m fleetscope.definitions" in text
    assert importlib.util.find_spec("fleetscope.definitions") is not None


@pytest.mark.parametrize("name,module,attr", [("celery", "dagster_celery", "celery_executor"),
                                              ("k8s", "dagster_k8s", "k8s_job_executor")])
def test_definitions_load_with_celery_or_k8s_executor(monkeypatch, name, module, attr):
    pytest.importorskip(module, reason=f"{module.replace('_', '-')}==0.29.27 is not installed (it pulls in "
                                       f"{'celery, kombu, billiard, amqp' if name == 'celery' else 'kubernetes, google-auth'}; see docs/SCALING.md)")
    monkeypatch.setenv("FLEETSCOPE_CELERY_BROKER", "pyamqp://guest@localhost//")
    monkeypatch.setenv("FLEETSCOPE_CELERY_BACKEND", "rpc://")
    mod = _load_definitions(monkeypatch, name)
    mod.defs.validate_loadable(mod.defs)
    expected = getattr(importlib.import_module(module), attr).name
    jobs = mod.defs.get_repository_def().get_all_jobs()
    assert jobs and all(j.executor_def.name == expected for j in jobs), {j.name: j.executor_def.name for j in jobs}

