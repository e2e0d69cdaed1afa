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
    summary = simulate(out, gpus=64, minutes=1.0, faults="congested_switch:1,slow_gpu:1", seed=3, captures=True)
    assert summary["captures"], "the simulator rendered no capture: the end-to-end run would not cover the capture analyses"
    return out


@pytest.fixture(scope="module")
def ran(simulated, tmp_path_factory):
    """`fleetscope run` on the simulated landing folder (with an incident request), once for the module."""
    tmp = tmp_path_factory.mktemp("run")
    warehouse, home = tmp / "wh" / "warehouse.duckdb", tmp / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    landing = simulated / "landing"
    (landing / "incidents").mkdir(exist_ok=True)
    req = landing / "incidents" / "tenant-complaint.json"
    req.write_text(json.dumps({"kind": "slow", "note": "steps slower since noon"}))
    os.utime(req, (time.time() - 60,) * 2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env.update(DAGSTER_HOME=str(home))
    p = subprocess.run(FLEETSCOPE + ["run", "--landing", str(landing), "--warehouse", str(warehouse), "--settle-seconds", "0"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return dict(landing=landing, warehouse=warehouse, home=home, stdout=p.stdout, wh=Warehouse(warehouse))


@pytest.mark.slow
def test_every_capture_goes_through_every_capture_analysis(ran):
    landing, wh = ran["landing"], ran["wh"]
    caps = [d.name for d in (landing / "timings").iterdir()] if (landing / "timings").is_dir() else []
    assert caps
    for table in ("timings", "xputimer_step_throughput", "xputimer_stage_metrics", "behavior_patterns",
                  "step_forecasts", "variability_models", "straggler_summary"):
        have = set(wh.read(table, columns=["capture_id"])["capture_id"].to_list())
        assert set(caps) <= have, f"{table}: no rows for capture(s) {sorted(set(caps) - have)}"
    traced = [d.name for d in (landing / "traces").iterdir()] if (landing / "traces").is_dir() else []
    for table in ("trace_events", "graph_tasks", "replays", "whatif"):
        have = set(wh.read(table, columns=["capture_id"])["capture_id"].to_list())
        assert set(traced) <= have, f"{table}: no rows for traced capture(s) {sorted(set(traced) - have)}"
    forecasts = wh.read("step_forecasts").filter(pl.col("scenario") == "baseline")
    assert (forecasts["ks_vs_measured"] < 0.5).all(), forecasts  # the forecast describes the measured steps


@pytest.mark.slow
def test_run_names_the_congested_switch(simulated, ran):
    truth = pl.read_csv(simulated / "ground_truth" / "faults.csv")
    switch = truth.filter(pl.col("kind") == "congested_switch")["subject"][0]
    v = ran["wh"].read("anomaly_verdicts")
    sw = v.filter((pl.col("scope") == "switch") & (pl.col("severity") != "info"))
    assert sw.height and set(sw["subject"]) == {switch}, v.select("scope", "subject", "metric")


@pytest.mark.slow
def test_run_names_the_slow_gpu_first_and_writes_reports(simulated, ran, monkeypatch):
    warehouse, wh = ran["warehouse"], ran["wh"]
    assert "0 failed" in ran["stdout"] and "where to look" in ran["stdout"]
    truth = pl.read_csv(simulated / "ground_truth" / "faults.csv")
    gpu = truth.filter(pl.col("kind") == "slow_gpu").row(0, named=True)
    host = pl.read_csv(simulated / "ground_truth" / "jobs.csv").filter(pl.col("ip") == gpu["subject"])["gpu"][0]
    # a problem names the slow GPU's machine and device, for operations, and it is the first the
    # fleet health page shows
    problems = wh.read("problems")
    mine = problems.filter(pl.col("ip") == gpu["subject"])
    assert mine.height == 1 and mine.row(0, named=True)["gpu"] == host and mine["team"][0] == "operations", problems.select("title")
    page = next((warehouse.parent / "warehouse.exports" / "reports").glob("fleet-health-*.md")).read_text()
    assert page.split("### ", 1)[1].split("\n", 1)[0].startswith(f"CRITICAL: GPU {host}"), page[:2000]
    jobs = wh.read("jobs")
    truth_jobs = pl.read_csv(simulated / "ground_truth" / "jobs.csv")
    assert jobs["job_id"].n_unique() == truth_jobs["job_id"].n_unique()
    # the incident request produced its report naming the GPU
    reports = warehouse.parent / "warehouse.exports" / "reports"
    inc = [p for p in reports.glob("incident-tenant-complaint*.md")]
    assert inc and host in inc[0].read_text()
    # the fleet report with its plots
    fleet = sorted(reports.glob("fleet-*.md"))
    assert fleet and "Open problems" in fleet[0].read_text()
    assert len(list(reports.glob("fleet-*-*.png"))) >= 2
    assert wh.read("problems").height >= 1
    # the runs are in the Dagster instance the UI reads
    with DagsterInstance.from_config(str(ran["home"])) as instance:
        assert len(instance.get_runs()) >= 5
    # the nightly schedules ask for yesterday's windows (of the warehouse the code location serves) and the fleet report
    monkeypatch.setenv("FLEETSCOPE_WAREHOUSE", str(warehouse))
    from fleetscope.definitions import defs
    from fleetscope.jobs import ALL_SCHEDULES
    sched = {s.name: s for s in ALL_SCHEDULES}
    windows = jobs["window_id"].unique().to_list()
    day = dt.datetime.strptime(windows[0].split("-", 1)[1][:8], "%Y%m%d").replace(tzinfo=dt.timezone.utc)
    with DagsterInstance.from_config(str(ran["home"])) as instance:
        ctx = build_schedule_context(instance=instance, repository_def=defs.get_repository_def(), scheduled_execution_time=day + dt.timedelta(days=1, hours=1, minutes=30))
        reqs = sched["nightly_window_schedule"].evaluate_tick(ctx).run_requests
        assert sorted(r.partition_key for r in reqs) == sorted(windows)
        ctx = build_schedule_context(instance=instance, repository_def=defs.get_repository_def(), scheduled_execution_time=day + dt.timedelta(days=2, hours=2))
        assert sched["nightly_window_schedule"].evaluate_tick(ctx).run_requests == []
        assert len(sched["nightly_fleet_schedule"].evaluate_tick(ctx).run_requests) == 1


def test_score_warehouse_scores_the_run_against_the_truth(simulated, ran):
    """The simulator's scoring API over a warehouse (docs/SIMULATOR.md) gives what scoring its
    tables gives, and sees the run's jobs and its congested switch."""
    from fleetscope.sim.scoring import score_tables, score_warehouse

    s = score_warehouse(ran["warehouse"], simulated / "ground_truth")
    wh = ran["wh"]
    direct = score_tables({n: wh.read(n) for n in ("job_clusters", "comm_pairs", "step_timelines", "anomaly_verdicts")},
                          simulated / "ground_truth")
    def same(a, b):
        if isinstance(a, pl.DataFrame):
            return a.equals(b)
        return a == b or (a != a and b != b)  # NaN scores (nothing to score) are the same too

    assert s.keys() == direct.keys() and all(same(s[k], direct[k]) for k in s)
    assert s["jobs_exact"] > 0 and s["faults"] == 2 and s["faults_exact"] >= 1, s


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
