"""The whole platform on a simulated fleet: CLI run through Dagster, verdicts against the
simulator's ground truth (never read by the analyses), an incident request and its report, the
nightly fleet report, the schedules and the CLI's errors."""
import datetime as dt
import json
import os
import subprocess
import sys
import time

import polars as pl
import pytest
from dagster import DagsterInstance, build_schedule_context

from tests.paths import REPO
from fleetscope.warehouse import Warehouse

FLEETSCOPE = [sys.executable, "-m", "fleetscope.cli"]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from fleetscope.sim import simulate
    out = tmp_path_factory.mktemp("fleet")
    simulate(out, gpus=64, minutes=1.0, faults="congested_switch:1", seed=3, captures=False)
    return out


@pytest.mark.slow
def test_run_finds_the_injected_fault_and_writes_reports(simulated, fleet_env):
    _, warehouse, home = fleet_env
    landing = simulated / "landing"
    truth = pl.read_csv(simulated / "ground_truth" / "faults.csv")
    switch = truth.filter(pl.col("kind") == "congested_switch")["subject"][0]
    (landing / "incidents").mkdir(exist_ok=True)
    req = landing / "incidents" / "tenant-complaint.json"
    req.write_text(json.dumps({"kind": "slow", "note": "steps slower since noon"}))
    os.utime(req, (time.time() - 60,) * 2)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(FLEETSCOPE + ["run", "--landing", str(landing), "--warehouse", str(warehouse), "--settle-seconds", "0"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "0 failed" in p.stdout and "where to look" in p.stdout
    wh = Warehouse(warehouse)
    v = wh.read("anomaly_verdicts")
    sw = v.filter((pl.col("scope") == "switch") & (pl.col("severity") != "info"))
    assert switch in sw["subject"].to_list(), v.select("scope", "subject", "metric")
    assert set(sw["team"]) == {"operations"}
    jobs = wh.read("jobs")
    truth_jobs = pl.read_csv(simulated / "ground_truth" / "jobs.csv")
    assert jobs["job_id"].n_unique() == truth_jobs["job_id"].n_unique()
    # the incident request produced its report naming the switch
    reports = warehouse.parent / "warehouse.exports" / "reports"
    inc = [p for p in reports.glob("incident-tenant-complaint*.md")]
    assert inc and switch in inc[0].read_text()
    # the fleet report with its plots
    fleet = sorted(reports.glob("fleet-*.md"))
    assert fleet and "Worst verdicts by team" in fleet[0].read_text()
    assert len(list(reports.glob("fleet-*-*.png"))) >= 2
    assert wh.read("problems").height >= 1
    # the runs are in the Dagster instance the UI reads
    with DagsterInstance.get() as instance:
        assert len(instance.get_runs()) >= 5
    # the nightly schedules ask for yesterday's windows and the fleet report
    from fleetscope.definitions import defs
    from fleetscope.jobs import ALL_SCHEDULES
    sched = {s.name: s for s in ALL_SCHEDULES}
    windows = jobs["window_id"].unique().to_list()
    day = dt.datetime.strptime(windows[0].split("-", 1)[1][:8], "%Y%m%d").replace(tzinfo=dt.timezone.utc)
    with DagsterInstance.get() as instance:
        ctx = build_schedule_context(instance=instance, repository_def=defs.get_repository_def(), scheduled_execution_time=day + dt.timedelta(days=1, hours=1, minutes=30))
        reqs = sched["nightly_window_schedule"].evaluate_tick(ctx).run_requests
        assert sorted(r.partition_key for r in reqs) == sorted(windows)
        ctx = build_schedule_context(instance=instance, repository_def=defs.get_repository_def(), scheduled_execution_time=day + dt.timedelta(days=2, hours=2))
        assert sched["nightly_window_schedule"].evaluate_tick(ctx).run_requests == []
        assert len(sched["nightly_fleet_schedule"].evaluate_tick(ctx).run_requests) == 1


def test_cli_errors_are_clear(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run(FLEETSCOPE + ["run", "--landing", str(tmp_path / "nope"), "--warehouse", str(tmp_path / "w.duckdb")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "landing folder" in p.stderr and "does not exist" in p.stderr
    (tmp_path / "landing").mkdir()
    (tmp_path / "bad.duckdb").write_text("this is not a database")
    p = subprocess.run(FLEETSCOPE + ["run", "--landing", str(tmp_path / "landing"), "--warehouse", str(tmp_path / "bad.duckdb")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "not a readable DuckDB file" in p.stderr
    p = subprocess.run(FLEETSCOPE + ["sql", "no_such_query", "--warehouse", str(tmp_path / "bad.duckdb")],
                       capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "no tables yet" in p.stderr
