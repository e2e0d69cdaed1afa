"""The landing sensor and the schedules against a real Dagster instance (sqlite storage in a
temporary DAGSTER_HOME), and the sensor driven by a real dagster-daemon that is restarted."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, build_sensor_context

from tests.paths import REPO
from fleetscope.definitions import defs
from fleetscope.jobs.sensors import landing_sensor


def _flow_file(path: Path, t0: int, n: int = 4):
    pl.DataFrame({"start_ns": [t0 + i for i in range(n)], "duration_ns": [10] * n, "src_ip": ["10.0.0.1"] * n,
                  "dst_ip": ["10.0.0.2"] * n, "bytes": [100] * n}).write_parquet(path)
    old = time.time() - 60
    os.utime(path, (old, old))


def _evaluate(instance, cursor):
    ctx = build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
    return landing_sensor(ctx)


def test_landing_sensor_requests_what_is_due_once(fleet_env):
    """Its requests come from the planner: registered files not ingested since; the same state asks
    for the same run keys (the daemon launches each once); once ingested, nothing; a new file, one."""
    landing, warehouse, home = fleet_env
    (landing / "flows").mkdir()
    (landing / "topology").mkdir()
    _flow_file(landing / "flows" / "a.parquet", 1_700_000_000_000_000_000)
    _flow_file(landing / "flows" / "a_same_content.parquet", 1_700_000_000_000_000_000)
    (landing / "topology" / "topo.csv").write_text("ip,host\n10.0.0.1,h1\n10.0.0.2,h2\n")
    os.utime(landing / "topology" / "topo.csv", (time.time() - 60,) * 2)
    with DagsterInstance.get() as instance:
        res = _evaluate(instance, None)
        jobs = sorted((r.job_name, r.partition_key.split("-")[0]) for r in res.run_requests)
        assert jobs == [("ingest_flows", "a"), ("ingest_topology", "topo")]  # the duplicate is not requested
        added = {r.partitions_def_name: list(r.partition_keys) for r in res.dynamic_partitions_requests}
        assert set(added) == {"flow_files", "topology_files"}
        for name, keys in added.items():
            instance.add_dynamic_partitions(name, keys)
        assert sorted(r.run_key for r in _evaluate(instance, None).run_requests) == sorted(r.run_key for r in res.run_requests)
        for r in res.run_requests:  # as the daemon would launch them
            assert defs.resolve_job_def(r.job_name).execute_in_process(instance=instance, partition_key=r.partition_key,
                                                                      tags=r.tags).success
        assert not _evaluate(instance, None).run_requests
        # a new file: exactly one request
        _flow_file(landing / "flows" / "b.parquet", 1_700_000_100_000_000_000)
        assert [r.partition_key.split("-")[0] for r in _evaluate(instance, None).run_requests] == ["b"]


def _start_daemon(env):
    return subprocess.Popen([sys.executable, "-m", "dagster", "dev", "-m", "fleetscope.definitions",
                             "-h", "127.0.0.1", "-p", str(_free_port())],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_runs(instance, n, timeout=180):
    t0 = time.time()
    while time.time() - t0 < timeout:
        runs = instance.get_runs(RunsFilter(tags={"fleetscope/trigger": "landing_sensor"}))
        done = [r for r in runs if r.status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE)]
        if len(done) >= n and len(done) == len(runs):
            return runs
        time.sleep(2)
    raise AssertionError(f"expected {n} finished sensor runs, have {[(r.job_name, r.status) for r in instance.get_runs()]}")


@pytest.mark.slow
def test_daemon_runs_the_sensor_and_its_cursor_survives_a_restart(fleet_env):
    landing, warehouse, home = fleet_env
    (landing / "flows").mkdir()
    _flow_file(landing / "flows" / "first.parquet", 1_700_000_000_000_000_000)
    env = {**os.environ, "FLEETSCOPE_SENSOR_INTERVAL_SECONDS": "3", "FLEETSCOPE_SETTLE_SECONDS": "1",
           "PYTHONPATH": str(REPO)}
    proc = _start_daemon(env)
    try:
        with DagsterInstance.get() as instance:
            runs = _wait_runs(instance, 1)
            assert [r.status for r in runs] == [DagsterRunStatus.SUCCESS]
    finally:
        _stop(proc)
    _flow_file(landing / "flows" / "second.parquet", 1_700_000_200_000_000_000)
    proc = _start_daemon(env)
    try:
        with DagsterInstance.get() as instance:
            runs = _wait_runs(instance, 2)
            time.sleep(8)  # a few more ticks: the old file must not be requested again
            runs = instance.get_runs(RunsFilter(tags={"fleetscope/trigger": "landing_sensor"}))
            keys = sorted(r.tags.get("dagster/partition", "").split("-")[0] for r in runs)
            assert keys == ["first", "second"], keys
            assert all(r.status == DagsterRunStatus.SUCCESS for r in runs)
    finally:
        _stop(proc)
    from fleetscope.warehouse import Warehouse
    assert Warehouse(warehouse).read("flows").height == 8


def test_degradation_sensor_files_a_profiling_request_once(fleet_env):
    """The closed loop of PerfTracker 4.1: a degraded job gets a request file its collectors serve."""
    import json as _json
    from fleetscope.tables import TABLES
    from fleetscope.warehouse import Warehouse
    from fleetscope.jobs.sensors import degradation_sensor
    landing, warehouse, _ = fleet_env
    wh = Warehouse(warehouse)
    wh.init()
    deg = pl.DataFrame([dict(capture_id="cap-7", rank=0, kind="degraded", at_ns=1_700_000_000_000_000_000, iteration=61,
                             recent_mean_ns=1_100_000_000, recent_min_ns=1_000_000_000, ratio=1.1, idle_ns=None)])
    from fleetscope.schemas.base import conform
    wh.write_partition("xputimer_degradations", "cap-7", conform(deg, TABLES["xputimer_degradations"]))
    wh.write_partition("captures", "cap-7", conform(pl.DataFrame([dict(capture_id="cap-7", job_id="job-42",
                                                                       n_trace_files=0, n_timing_files=4)]), TABLES["captures"]))
    with DagsterInstance.get() as instance:
        ctx = build_sensor_context(instance=instance, cursor=None, definitions=defs)
        res = degradation_sensor(ctx)
        req = landing / "requests" / "job-42.json"
        assert req.exists()
        body = _json.loads(req.read_text())
        assert body["kind"] == "profile" and body["steps"] >= 1 and "degraded" in body["note"]
        req.unlink()
        res2 = degradation_sensor(build_sensor_context(instance=instance, cursor=res.cursor, definitions=defs))
        assert not req.exists() and not res2.run_requests  # the same degradation is not requested twice


def test_flow_window_sensor_leaves_windows_the_run_already_analysed(fleet_env):
    """`fleetscope run` analyses every window; the UI's sensor starting afterwards (no cursor) must not
    run them again, and must run a window when new flows land in it."""
    from fleetscope.jobs.runner import run_all
    from fleetscope.jobs.sensors import flow_window_sensor
    landing, warehouse, _ = fleet_env
    (landing / "flows").mkdir()
    (landing / "topology").mkdir()
    (landing / "topology" / "topo.csv").write_text("ip,host\n10.0.0.1,h1\n10.0.0.2,h2\n")
    os.utime(landing / "topology" / "topo.csv", (time.time() - 60,) * 2)
    _flow_file(landing / "flows" / "a.parquet", 1_700_000_000_000_000_000)
    report = run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    assert not report.failed and any(j == "flow_window_analysis" for j, *_ in report.runs)
    with DagsterInstance.get() as instance:
        res = flow_window_sensor(build_sensor_context(instance=instance, cursor=None, definitions=defs))
        assert not res.run_requests, [r.partition_key for r in res.run_requests]
        # new flows in another minute: ingested (as the landing sensor's run would), then exactly that window
        _flow_file(landing / "flows" / "b.parquet", 1_700_000_300_000_000_000)
        from fleetscope.ingest.registry import register_landing
        from fleetscope.warehouse import Warehouse
        reg = register_landing(landing, Warehouse(warehouse), settle_s=0)
        key = reg.to_run["flow_files"][0]
        instance.add_dynamic_partitions("flow_files", [key])
        from fleetscope.resources import WAREHOUSE_TAG, warehouse_id
        assert defs.resolve_job_def("ingest_flows").execute_in_process(instance=instance, partition_key=key,
                                                                      tags={WAREHOUSE_TAG: warehouse_id()}).success
        res2 = flow_window_sensor(build_sensor_context(instance=instance, cursor=res.cursor, definitions=defs))
        assert [r.partition_key for r in res2.run_requests] == ["w60s-20231114T221800Z"]
