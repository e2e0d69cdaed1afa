"""The saved SRE queries in sql/ over a real warehouse: a simulated fleet run through `fleetscope
run`, two bad landed files for the quarantine, and planted partitions made from the run's own
frames (a job whose recent steps are 1.6x slower, a healthy copy) plus verdicts spread over the
week. The detectors' own verdicts are taken out before planting, so every expected count and
label comes from what this test planted, never from what a detector happened to say. Each query
runs both through `fleetscope sql NAME` and on the warehouse file with plain DuckDB (no fleetscope
code), and its answer is checked against what was planted or against the files read independently."""
from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import polars as pl
import pytest

REPO = Path(__file__).resolve().parents[2]
SQL = REPO / "sql"
QUERIES = ["slow_jobs_now", "worst_switches_week", "recurring_hosts", "job_timeline", "changed_since_yesterday",
           "rejected_today", "verdicts_by_team"]
DAY = 86_400_000_000_000
HOUR = 3_600_000_000_000
SLOW_FACTOR = 1.6
pytestmark = pytest.mark.slow


def _env(tmp: Path, warehouse: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env.update(DAGSTER_HOME=str(tmp / "dagster_home"), PYTHONPATH=str(REPO), FLEETSCOPE_WAREHOUSE=str(warehouse))
    return env


def run_cli(*args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "fleetscope.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert res.returncode == 0, f"fleetscope {' '.join(args)} -> {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _bad_landing_files(landing: Path, t0: int) -> dict:
    """A flow CSV with two bad rows among good ones and a truncated gzip: what quarantine must show."""
    rows = ["start_ns,duration_ns,src_ip,dst_ip,bytes"]
    rows += [f"{t0 + i * 1000},5000,10.99.0.1,10.99.0.2,4096" for i in range(3)]
    rows += [f"{t0 + 9000},-5,10.99.0.1,10.99.0.2,4096", f"{t0 + 9500},5000,10.99.0.1,10.99.0.2,-1"]
    (landing / "flows" / "collector-bad-rows.csv").write_text("\n".join(rows) + "\n")
    blob = io.BytesIO()
    with gzip.GzipFile(fileobj=blob, mode="wb") as gz:
        gz.write(("\n".join(rows[:4]) + "\n").encode() * 50)
    (landing / "flows" / "collector-truncated.csv.gz").write_bytes(blob.getvalue()[: len(blob.getvalue()) // 2])
    return {"flows/collector-bad-rows.csv": 2, "flows/collector-truncated.csv.gz": None}


def _planted_steps(real: pl.DataFrame) -> tuple[pl.DataFrame, dict]:
    """Jobs of 4 GPUs with regular 2 s steps, 30 of them per segment, placed minutes before
    the real run's last step (which stays the newest), every step stretched by a factor:
      slow:      history at its normal pace, then SLOW_FACTOR slower now
      healthy:   normal pace throughout
      long_slow: normal for a while, then SLOW_FACTOR slower for most of its life (its median is slow)
    Made here, not copied from what the flow analysis reconstructed, so the expected answers do
    not depend on a detector."""
    t_end = int(real["end_ns"].max()) - 60 * 1_000_000_000
    plans = {
        "job-planted-slow": [(-30, 1.0), (-20, 1.0), (0, SLOW_FACTOR)],
        "job-planted-healthy": [(-30, 1.0), (-20, 1.0), (0, 1.0)],
        "job-planted-long-slow": [(-40, 1.0), (-30, 1.0), (-25, SLOW_FACTOR), (-20, SLOW_FACTOR), (-15, SLOW_FACTOR), (0, SLOW_FACTOR)],
    }
    rows = []
    for j, (name, plan) in enumerate(plans.items()):
        ips = [f"10.250.{j}.{g}" for g in range(4)]
        for k, (shift_min, factor) in enumerate(plan):
            dur = int(2_000_000_000 * factor)
            t0 = t_end + shift_min * 60 * 1_000_000_000 - 60 * 1_000_000_000
            for s in range(30):  # the same number of steps in every segment, each stretched by the factor
                start = t0 + s * dur
                for ip in ips:
                    rows.append(dict(window_id=f"w-planted-{k}", job_id=name, ip=ip, step=s, job_step=s, start_ns=start,
                                     end_ns=start + dur, dp_start_ns=start + dur - dur // 10, dp_end_ns=start + dur,
                                     start_observed=True, dp_bytes=1 << 20, n_dp_flows=4, n_pp_flows=0, boundary_source="DP"))
    return pl.DataFrame(rows), {"slow": "job-planted-slow", "healthy": "job-planted-healthy",
                                "long_slow": "job-planted-long-slow", "real": real["job_id"].unique().sort()[0]}


def _planted_verdicts(t_now: int, topo: pl.DataFrame, crit_switch: str) -> tuple[pl.DataFrame, dict]:
    from fleetscope.findings.verdicts import make_verdicts

    h0 = topo["host"].sort()[0]
    ips_h0 = topo.filter(pl.col("host") == h0)["ip"].sort().to_list()
    other_ip = ips_h0[-1]
    link_ips = topo.filter(pl.col("host") != h0)["ip"].sort().to_list()[:2]
    rows = []

    def v(scope, subject, severity, t, window, team="operations", detector="planted.detector", metric="planted_metric", job=None):
        rows.append(dict(detector=detector, scope=scope, subject=subject, job_id=job, start_ns=t - 5 * 1_000_000_000, end_ns=t,
                         metric=metric, value=0.5, baseline=1.0, severity=severity, team=team, window_id=window,
                         explanation=f"planted {scope} {subject} {severity}"))
    for d in (2, 4):  # a real leaf of the topology: critical twice this week
        v("switch", crit_switch, "critical", t_now - d * DAY, f"w-sw-crit-{d}")
    v("switch", crit_switch, "warning", t_now - HOUR, "w-sw-crit-today")  # and a warning today: "new" today
    v("switch", "leaf-planted-new", "warning", t_now - HOUR, "w-sw-new")  # only today: "new"
    for d in (1.5, 3, 5):
        v("switch", "leaf-planted-warn", "warning", t_now - int(d * DAY), f"w-sw-warn-{d}")
    v("switch", "leaf-planted-2d", "critical", t_now - int(2.5 * DAY), "w-sw-2d")  # older than the two days compared
    v("switch", "leaf-planted-old", "critical", t_now - 10 * DAY, "w-sw-old")
    # a GPU of the first host, flagged 30 h and 3 days ago: recurring with the host's other findings, "gone" today
    v("gpu", other_ip, "warning", t_now - 30 * HOUR, "w-gpu-30h")
    v("gpu", other_ip, "warning", t_now - 3 * DAY, "w-gpu-3d")
    v("host", h0, "warning", t_now - int(2.5 * DAY), "w-host-2.5d")  # and the host itself: >= 3 findings
    # links: mild yesterday, critical today: "worse"; a link only yesterday and better today
    for ip in link_ips:
        v("link", ip, "warning", t_now - 30 * HOUR, "w-link-30h", detector="planted.link", metric="link_metric")
        v("link", ip, "critical", t_now - HOUR, "w-link-now", detector="planted.link", metric="link_metric")
    # info findings never make a host recurring
    for k in range(3):
        v("host", "h-info-only", "info", t_now - k * DAY - HOUR, f"w-info-{k}")
    # teams: a known mix (algorithm / infrastructure findings today)
    v("function", "planted_fn", "warning", t_now - HOUR, "w-fn", team="algorithm")
    v("kernel", "planted_kernel", "critical", t_now - HOUR, "w-k", team="infrastructure")
    return make_verdicts(rows), {"host": h0, "gpu_ip": other_ip, "links": link_ips}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sqlfleet")
    out, warehouse = tmp / "sim", tmp / "wh" / "warehouse.duckdb"
    env = _env(tmp, warehouse)
    run_cli("simulate", "--out", str(out), "--gpus", "16", "--minutes", "1", "--faults", "congested_switch:1", env=env)
    landing = out / "landing"
    t0 = pl.read_csv(out / "ground_truth" / "steps.csv")["start_ns"].min()
    bad = _bad_landing_files(landing, int(t0))
    run_cli("run", "--landing", str(landing), "--warehouse", str(warehouse), "--settle-seconds", "0", env=env)

    from fleetscope.schemas.base import conform
    from fleetscope.warehouse import Warehouse

    wh = Warehouse(warehouse)
    real_steps = wh.read("step_timelines")
    assert real_steps.height, "the simulated fleet produced no step timelines"
    steps, jobs = _planted_steps(real_steps)
    from fleetscope.tables import TABLES
    wh.write_partition("step_timelines", "planted-jobs", TABLES["step_timelines"].validate(conform(steps, TABLES["step_timelines"])))
    t_now = int(real_steps["end_ns"].max())
    for part in wh.partitions("anomaly_verdicts"):  # the detectors' verdicts out: every verdict below is planted
        wh.delete_partition("anomaly_verdicts", part)
    topo = _landed_topology(landing)  # the landed file, not the warehouse
    leaves = topo["leaf"].drop_nulls().unique().sort()
    crit_switch = leaves[0]
    verdicts, truth = _planted_verdicts(t_now, topo, crit_switch)
    wh.write_partition("anomaly_verdicts", "planted-verdicts", verdicts)
    old = wh.read("rejected_records").head(1).with_columns(pl.lit("flows/three-days-old.csv").alias("source_file"),
                                                           (pl.col("detected_ns") - 3 * DAY).alias("detected_ns"))
    assert old.height == 1, "the bad landed files were not quarantined"
    wh.write_partition("rejected_records", "planted-old", old)
    wh.publish_views()
    return dict(tmp=tmp, warehouse=warehouse, env=env, wh=wh, jobs=jobs, truth=truth, bad=bad, topo=topo,
                crit_switch=crit_switch, planted=verdicts)


def _landed_topology(landing: Path) -> pl.DataFrame:
    """The topology as landed (any dialect the simulator drew), read with polars, not fleetscope."""
    f = sorted((landing / "topology").iterdir())[0]
    df = pl.read_parquet(f) if f.suffix == ".parquet" else pl.read_csv(f, infer_schema_length=0)
    return df.rename({c: c.strip().strip('"').lstrip("\ufeff") for c in df.columns})


def sql_cli(fleet, *args: str) -> tuple[int, str, str]:
    """`fleetscope sql ...` through the CLI's own entry point, in this process (a subprocess per
    query would spend most of its time importing): exit code, stdout, stderr."""
    from fleetscope.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("FLEETSCOPE_WAREHOUSE")
    os.environ["FLEETSCOPE_WAREHOUSE"] = fleet["env"]["FLEETSCOPE_WAREHOUSE"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["sql", *args])
            except SystemExit as exc:
                code = exc.code
    finally:
        if old is None:
            os.environ.pop("FLEETSCOPE_WAREHOUSE", None)
        else:
            os.environ["FLEETSCOPE_WAREHOUSE"] = old
    return code, out.getvalue(), err.getvalue()


def via_cli(fleet, name: str, sql_prefix: str = "") -> pl.DataFrame:
    query = name if not sql_prefix else sql_prefix + (SQL / f"{name}.sql").read_text()
    code, out, err = sql_cli(fleet, query, "--format", "csv")
    assert code == 0, f"fleetscope sql {name}: {code}\n{err}"
    return pl.read_csv(io.StringIO(out), infer_schema_length=None) if out.strip() else pl.DataFrame()


def via_duckdb_file(fleet, name: str, sql_prefix: str = "") -> pl.DataFrame:
    """Plain DuckDB on the warehouse file, read-only: the views in the file, no fleetscope code."""
    with duckdb.connect(str(fleet["warehouse"]), read_only=True) as con:
        if sql_prefix:
            con.execute(sql_prefix)
        return pl.from_arrow(con.sql((SQL / f"{name}.sql").read_text()).fetch_arrow_table())


def _same(a: pl.DataFrame, b: pl.DataFrame) -> None:
    assert a.columns == b.columns, (a.columns, b.columns)
    assert a.height == b.height
    # through CSV on both sides (the CLI prints CSV): same text for every cell
    ca = pl.read_csv(io.StringIO(a.write_csv()), infer_schema_length=0) if a.height else a
    cb = pl.read_csv(io.StringIO(b.write_csv()), infer_schema_length=0) if b.height else b
    assert ca.equals(cb), f"\n{ca}\n{cb}"


def test_every_saved_query_exists_says_what_it_answers_and_runs_both_ways(fleet):
    assert sorted(p.stem for p in SQL.glob("*.sql")) == sorted(QUERIES)
    for name in QUERIES:
        text = (SQL / f"{name}.sql").read_text()
        assert text.startswith(f"-- {name}: "), f"{name}.sql must start with a comment saying what it answers"
        _same(via_cli(fleet, name), via_duckdb_file(fleet, name))


def test_slow_jobs_now_ranks_the_planted_slow_job_first(fleet):
    df = via_duckdb_file(fleet, "slow_jobs_now")
    jobs = fleet["jobs"]
    planted = df.filter(pl.col("job_id").str.starts_with("job-planted"))
    assert planted["job_id"][0] == jobs["slow"], df
    row = planted.row(0, named=True)
    assert row["slowdown"] == pytest.approx(SLOW_FACTOR, abs=0.05)
    assert row["usual_from"] == "steps before the recent window"
    healthy = df.filter(pl.col("job_id") == jobs["healthy"]).row(0, named=True)
    assert healthy["slowdown"] == pytest.approx(1.0, abs=0.05)
    # slow for most of its life: its own median is the slow pace, the 25th percentile is not
    long_slow = df.filter(pl.col("job_id") == jobs["long_slow"]).row(0, named=True)
    assert long_slow["slowdown"] == pytest.approx(1.0, abs=0.05)
    assert long_slow["vs_own_p25"] == pytest.approx(SLOW_FACTOR, abs=0.05)
    assert healthy["vs_own_p25"] == pytest.approx(1.0, abs=0.05)
    order = df["job_id"].to_list()
    assert order.index(jobs["long_slow"]) < order.index(jobs["healthy"])
    # a run of one minute still has a history: its recent window is its last third, not 10 minutes
    real = df.filter(pl.col("job_id") == jobs["real"]).row(0, named=True)
    steps = fleet["wh"].read("step_timelines").filter(pl.col("job_id") == jobs["real"]).unique(["ip", "start_ns", "end_ns"])
    per_gpu = steps.height / steps["ip"].n_unique()
    assert real["usual_from"] == "steps before the recent window"
    assert 0 < real["recent_steps"] < per_gpu, (real, per_gpu)  # recent steps, and earlier ones as its history
    # a shorter recent window is honoured (SET VARIABLE in the same session)
    short = via_duckdb_file(fleet, "slow_jobs_now", "SET VARIABLE recent_minutes = 0.5;")
    slow_short = short.filter(pl.col("job_id") == jobs["slow"])["recent_steps"][0]
    assert slow_short < row["recent_steps"], (slow_short, row["recent_steps"])


def test_worst_switches_week_orders_by_severity_and_drops_older_findings(fleet):
    df = via_cli(fleet, "worst_switches_week")
    order = df["switch"].to_list()
    assert "leaf-planted-old" not in order  # 10 days ago
    crit = df.filter(pl.col("switch") == fleet["crit_switch"]).row(0, named=True)
    assert (crit["critical"], crit["warning"], crit["verdicts"]) == (2, 1, 3)
    assert order[0] == fleet["crit_switch"]  # two criticals: first
    assert order.index("leaf-planted-2d") < order.index("leaf-planted-warn") < order.index("leaf-planted-new")
    warn = df.filter(pl.col("switch") == "leaf-planted-warn").row(0, named=True)
    assert (warn["critical"], warn["warning"], warn["verdicts"], warn["windows"]) == (0, 3, 3, 3)
    topo = fleet["topo"]  # hosts cabled to the switch, from the landed topology file
    expected_hosts = topo.filter(pl.col("leaf") == fleet["crit_switch"])["host"].n_unique()
    assert expected_hosts > 0 and crit["hosts_below"] == expected_hosts
    assert df.filter(pl.col("switch") == "leaf-planted-warn")["hosts_below"][0] is None


def test_recurring_hosts_maps_gpus_and_links_to_hosts(fleet):
    df = via_duckdb_file(fleet, "recurring_hosts")
    truth = fleet["truth"]
    assert "h-info-only" not in df["host"].to_list()  # info verdicts do not count
    h0 = df.filter(pl.col("host") == truth["host"])
    assert h0.height == 1, df
    r = h0.row(0, named=True)
    assert r["occurrences"] >= 3
    assert truth["gpu_ip"] in r["ips"]
    gpu = fleet["topo"].filter(pl.col("ip") == truth["gpu_ip"])["gpu"][0]
    assert gpu in r["gpus"]
    assert df["occurrences"].is_sorted(descending=True)
    stricter = via_duckdb_file(fleet, "recurring_hosts", "SET VARIABLE min_occurrences = 100;")
    assert stricter.height == 0


def test_job_timeline_defaults_to_the_newest_job_and_takes_a_job_id(fleet):
    steps = fleet["wh"].read("step_timelines").unique(["job_id", "ip", "start_ns", "end_ns"])
    newest = steps.sort("end_ns", "job_id")["job_id"][-1]  # ties: the highest job id, as the query does
    df = via_cli(fleet, "job_timeline")
    assert set(df["job_id"]) == {newest}
    job = fleet["jobs"]["real"]
    prefix = f"SET VARIABLE job_id = '{job}';"
    a, b = via_cli(fleet, "job_timeline", prefix), via_duckdb_file(fleet, "job_timeline", prefix)
    _same(a, b)
    mine = steps.filter(pl.col("job_id") == job)
    per_step = mine.group_by("window_id", "step").agg(((pl.col("end_ns") - pl.col("start_ns")).median() / 1e6).round(2).alias("ms"),
                                                      pl.col("start_ns").min()).sort("start_ns")
    assert b.height == per_step.height
    assert b["step_ms"].to_list() == pytest.approx(per_step["ms"].to_list(), abs=0.011)
    assert b["start_time"].is_sorted()
    code, _, err = sql_cli(fleet, "SET VARIABLE job_id = 'no-such-job'; " + (SQL / "job_timeline.sql").read_text())
    assert code == 2 and "job_id no-such-job is not in step_timelines" in err


def test_changed_since_yesterday_labels_new_worse_and_gone(fleet):
    df = via_duckdb_file(fleet, "changed_since_yesterday")
    label = {(r["scope"], r["subject"]): r["change"] for r in df.iter_rows(named=True)}
    truth = fleet["truth"]
    for ip in truth["links"]:
        assert label.get(("link", ip)) == "worse", (ip, label)
    assert label.get(("gpu", truth["gpu_ip"])) == "gone"
    assert label.get(("switch", "leaf-planted-new")) == "new"
    assert label.get(("switch", "leaf-planted-warn")) == "gone"  # its newest finding is 1.5 days old
    assert ("switch", "leaf-planted-2d") not in label  # 2.5 days old: outside the two days compared
    assert ("switch", "leaf-planted-old") not in label
    order = [r for r in df["change"].to_list()]
    rank = {"new": 0, "worse": 1, "gone": 2, "better": 3}
    assert [rank[c] for c in order] == sorted(rank[c] for c in order)


def test_rejected_today_lists_the_bad_files(fleet):
    df = via_cli(fleet, "rejected_today")
    by_file = {r["source_file"]: r for r in df.iter_rows(named=True)}
    assert "flows/three-days-old.csv" not in by_file
    for f, n in fleet["bad"].items():
        assert f in by_file, (f, list(by_file))
        if n is None:
            assert by_file[f]["whole_file_rejected"] in (True, "true")
        else:
            assert by_file[f]["rows_rejected"] == n and by_file[f]["first_bad_row"] == 4
    longer = via_duckdb_file(fleet, "rejected_today", "SET VARIABLE hours = 100;")
    assert "flows/three-days-old.csv" in longer["source_file"].to_list()


def test_verdicts_by_team_counts_what_was_planted(fleet):
    df = via_cli(fleet, "verdicts_by_team")
    planted = fleet["planted"]  # the only verdicts in the warehouse
    want = planted.group_by("team", "severity").len().sort("team", "severity")
    got = df.select("team", "severity", pl.col("verdicts").alias("len")).sort("team", "severity")
    assert got.cast({"len": pl.UInt32}).equals(want.cast({"len": pl.UInt32})), f"\n{got}\n{want}"
    assert ("infrastructure", "critical") in set(got.select("team", "severity").iter_rows())


def test_cli_errors_unknown_query_and_missing_warehouse(fleet, tmp_path):
    res = run_cli("sql", "no_such_query", env=fleet["env"], check=False)
    assert res.returncode == 2
    assert "unknown saved query 'no_such_query'" in res.stderr and "slow_jobs_now" in res.stderr
    code, _, err = sql_cli(fleet, "slow_jobs_now", "--warehouse", str(tmp_path / "nowhere" / "warehouse.duckdb"))
    assert code == 2 and "has no tables yet" in err
    # and the installed command itself, end to end, on the real warehouse
    res = run_cli("sql", "verdicts_by_team", "--format", "csv", env=fleet["env"])
    assert res.stdout.startswith("team,severity,verdicts")


def _duckdb_cli() -> str | None:
    venv_cli = Path(sys.executable).parent / "duckdb"  # duckdb-cli from the test extra
    cand = os.environ.get("FLEETSCOPE_DUCKDB_CLI") or (str(venv_cli) if venv_cli.exists() else shutil.which("duckdb"))
    return cand if cand and os.access(cand, os.X_OK) else None


def test_saved_queries_in_the_duckdb_cli(fleet, tmp_path):
    """The duckdb command-line shell itself (when one is installed): the same files via `.read`-style stdin."""
    cli = _duckdb_cli()
    if cli is None:
        pytest.skip("no duckdb CLI binary (install one matching the duckdb library, or set FLEETSCOPE_DUCKDB_CLI)")
    target = fleet["warehouse"]  # written in a storage format the PyPI duckdb CLI reads
    for name in QUERIES:
        res = subprocess.run([cli, "-readonly", "-csv", str(target)], input=(SQL / f"{name}.sql").read_text(),
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"{name} in the duckdb CLI: {res.stderr}"
        got = pl.read_csv(io.StringIO(res.stdout), infer_schema_length=0, null_values=["NULL"]) if res.stdout.strip() else pl.DataFrame()
        want = via_duckdb_file(fleet, name)
        if want.height == 0:
            assert got.height == 0, (name, got)
            continue
        assert got.columns == want.columns, (name, got.columns, want.columns)
        # every cell: the shell's text parsed back to the column's type (it prints timestamps its own way)
        def typed(c, dt):
            if isinstance(dt, pl.Datetime):
                return pl.col(c).str.to_datetime(time_unit=dt.time_unit)
            if dt == pl.Boolean:
                return pl.col(c).replace_strict({"true": True, "false": False}, default=None, return_dtype=pl.Boolean)
            return pl.col(c).cast(dt)
        parsed = got.select([typed(c, dt) for c, dt in want.schema.items()])
        assert parsed.equals(want), f"{name}:\n{parsed}\n{want}"


def test_long_sql_text_with_a_variable_runs_through_the_cli(fleet):
    """The documented way to pass a variable to a saved query from the shell:
    fleetscope sql "SET VARIABLE recent_minutes = 1; $(cat sql/slow_jobs_now.sql)" """
    code, out, err = sql_cli(fleet, "SET VARIABLE recent_minutes = 1; " + (SQL / "slow_jobs_now.sql").read_text(), "--format", "csv")
    assert code == 0, err
    assert pl.read_csv(io.StringIO(out)).height >= 1
