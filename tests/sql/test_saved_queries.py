"""The saved SRE queries in sql/ over a real warehouse: a simulated fleet (with a congested switch)
run through `fleetscope run`, two bad landed files for the quarantine, and planted partitions
made from the run's own frames (a job whose recent steps are 1.6x slower, a healthy copy,
switch / host / link verdicts spread over the week). Each query runs both through
`fleetscope sql NAME` and on the warehouse file with plain DuckDB (no fleetscope code), and its
answer is checked against what was planted or against the parquet files read independently."""
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
    """Jobs made of the real job's step rows, copied to earlier times (minutes before its real last
    minute, which stays where it is) with every step stretched by a factor:
      slow:      history at its normal pace, then SLOW_FACTOR slower now
      healthy:   normal pace throughout
      long_slow: normal for a while, then SLOW_FACTOR slower for most of its life (its median is slow)"""
    job = real["job_id"].unique().sort()[0]
    base = real.filter(pl.col("job_id") == job)
    plans = {
        "job-planted-slow": [(-30, 1.0), (-20, 1.0), (0, SLOW_FACTOR)],
        "job-planted-healthy": [(-30, 1.0), (-20, 1.0), (0, 1.0)],
        "job-planted-long-slow": [(-40, 1.0), (-30, 1.0), (-25, SLOW_FACTOR), (-20, SLOW_FACTOR), (-15, SLOW_FACTOR), (0, SLOW_FACTOR)],
    }
    parts = []
    for name, plan in plans.items():
        for k, (shift_min, factor) in enumerate(plan):
            shift = shift_min * 60 * 1_000_000_000
            dur = (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)
            parts.append(base.with_columns(
                pl.lit(name).alias("job_id"), pl.lit(f"w-planted-{k}").alias("window_id"),
                *(pl.col(c) + shift for c in ("start_ns", "dp_start_ns", "dp_end_ns")),
                (pl.col("start_ns") + shift + (dur * factor).round().cast(pl.Int64)).alias("end_ns")))
    return pl.concat(parts, how="vertical_relaxed"), {"slow": "job-planted-slow", "healthy": "job-planted-healthy",
                                                      "long_slow": "job-planted-long-slow", "real": job}


def _planted_verdicts(real: pl.DataFrame, t_now: int, topo: pl.DataFrame, crit_switch: str) -> pl.DataFrame:
    from fleetscope.verdicts import make_verdicts

    h0 = topo["host"].sort()[0]
    ips_h0 = topo.filter(pl.col("host") == h0)["ip"].sort().to_list()
    other_ip = ips_h0[-1]
    rows = []

    def v(scope, subject, severity, t, window, team="operations", detector="planted.detector", metric="planted_metric", job=None):
        rows.append(dict(detector=detector, scope=scope, subject=subject, job_id=job, start_ns=t - 5 * 1_000_000_000, end_ns=t,
                         metric=metric, value=0.5, baseline=1.0, severity=severity, team=team, window_id=window,
                         explanation=f"planted {scope} {subject} {severity}"))
    for d in (2, 4):  # a real leaf of the topology (the simulator's congested one)
        v("switch", crit_switch, "critical", t_now - d * DAY, f"w-sw-crit-{d}")
    v("switch", "leaf-planted-new", "warning", t_now - HOUR, "w-sw-new")  # only today: "new"
    for d in (1.5, 3, 5):
        v("switch", "leaf-planted-warn", "warning", t_now - int(d * DAY), f"w-sw-warn-{d}")
    v("switch", "leaf-planted-old", "critical", t_now - 10 * DAY, "w-sw-old")
    # a GPU of the first host, flagged 30 h and 3 days ago: recurring with the host's other findings, "gone" today
    v("gpu", other_ip, "warning", t_now - 30 * HOUR, "w-gpu-30h")
    v("gpu", other_ip, "warning", t_now - 3 * DAY, "w-gpu-3d")
    v("host", h0, "warning", t_now - int(2.5 * DAY), "w-host-2.5d")  # and the host itself: >= 3 findings whatever the detectors say
    # the real link verdicts, one day earlier and milder: "worse" today
    links = real.filter(pl.col("scope") == "link")
    for r in links.iter_rows(named=True):
        v("link", r["subject"], "warning", t_now - 30 * HOUR, "w-link-30h", team=r["team"], detector=r["detector"],
          metric=r["metric"], job=r["job_id"])
    # info findings never make a host recurring
    for k in range(3):
        v("host", "h-info-only", "info", t_now - k * DAY - HOUR, f"w-info-{k}")
    return make_verdicts(rows), {"host": h0, "gpu_ip": other_ip, "links": links["subject"].to_list()}


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

    from fleetscope.warehouse import Warehouse

    wh = Warehouse(warehouse)
    real_steps, real_verdicts = wh.read("step_timelines"), wh.read("anomaly_verdicts")
    assert real_steps.height and real_verdicts.height, "the simulated fleet produced no step timelines / verdicts"
    steps, jobs = _planted_steps(real_steps)
    wh.write_partition("step_timelines", "planted-jobs", steps)
    t_now = int(real_verdicts.select(pl.coalesce("end_ns", "start_ns").max()).item())
    topo = pl.read_csv(landing / "topology" / "topology.csv")  # the landed file, not the warehouse
    faults = pl.read_csv(out / "ground_truth" / "faults.csv")
    crit_switch = faults.filter(pl.col("kind") == "congested_switch")["subject"][0]
    verdicts, truth = _planted_verdicts(real_verdicts, t_now, topo, crit_switch)
    truth["real_switch_critical"] = real_verdicts.filter((pl.col("scope") == "switch") & (pl.col("severity") == "critical")) \
        .group_by("subject").len().rows()
    wh.write_partition("anomaly_verdicts", "planted-verdicts", verdicts)
    old = wh.read("rejected_records").head(1).with_columns(pl.lit("flows/three-days-old.csv").alias("source_file"),
                                                           (pl.col("detected_ns") - 3 * DAY).alias("detected_ns"))
    assert old.height == 1, "the bad landed files were not quarantined"
    wh.write_partition("rejected_records", "planted-old", old)
    wh.publish_views()
    return dict(tmp=tmp, warehouse=warehouse, env=env, wh=wh, jobs=jobs, truth=truth, bad=bad, topo=topo,
                crit_switch=crit_switch)


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
    assert df["job_id"][0] == jobs["slow"], df
    row = df.row(0, named=True)
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
    real = df.filter(pl.col("job_id") == jobs["real"]).row(0, named=True)
    assert real["usual_from"].startswith("all steps") and real["slowdown"] == pytest.approx(1.0, abs=1e-9)
    # a shorter recent window is honoured (SET VARIABLE in the same session)
    short = via_duckdb_file(fleet, "slow_jobs_now", "SET VARIABLE recent_minutes = 0.5;")
    assert short["recent_steps"].max() < df["recent_steps"].max()


def test_worst_switches_week_orders_by_severity_and_drops_older_findings(fleet):
    df = via_cli(fleet, "worst_switches_week")
    order = df["switch"].to_list()
    assert "leaf-planted-old" not in order  # 10 days ago
    real_crit = dict(fleet["truth"]["real_switch_critical"])  # switch verdicts of the real run (window of today)
    crit = df.filter(pl.col("switch") == fleet["crit_switch"]).row(0, named=True)
    assert crit["critical"] == 2 + real_crit.get(fleet["crit_switch"], 0)
    assert order[0] == max([fleet["crit_switch"], *real_crit], key=lambda s: (2 if s == fleet["crit_switch"] else 0) + real_crit.get(s, 0))
    for sw in real_crit:
        assert order.index(sw) < order.index("leaf-planted-warn")
    assert order.index(fleet["crit_switch"]) < order.index("leaf-planted-warn") < order.index("leaf-planted-new")
    warn = df.filter(pl.col("switch") == "leaf-planted-warn").row(0, named=True)
    assert (warn["critical"], warn["warning"], warn["verdicts"], warn["windows"]) == (0, 3, 3, 3)
    topo = fleet["topo"]  # hosts cabled to the switch, from the landed topology file
    expected_hosts = topo.filter((pl.col("leaf") == fleet["crit_switch"]) | (pl.col("spine") == fleet["crit_switch"]))["host"].n_unique()
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
    for subj, _ in fleet["truth"]["real_switch_critical"]:  # the real run's switch findings are new today
        assert label.get(("switch", subj)) == "new"
    assert label.get(("switch", "leaf-planted-warn")) == "gone"  # its newest finding is 1.5 days old
    assert ("switch", "leaf-planted-crit") not in label  # 2 days and older: outside the two days compared
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


def test_verdicts_by_team_matches_the_verdict_table(fleet):
    df = via_cli(fleet, "verdicts_by_team")
    v = fleet["wh"].read("anomaly_verdicts")
    truth = v.group_by("team", "severity").len().sort("team", "severity")
    got = df.select("team", "severity", pl.col("verdicts").alias("len")).sort("team", "severity")
    assert got.cast({"len": pl.UInt32}).equals(truth.cast({"len": pl.UInt32})), f"\n{got}\n{truth}"


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
        got = pl.read_csv(io.StringIO(res.stdout), infer_schema_length=0) if res.stdout.strip() else pl.DataFrame()
        want = via_duckdb_file(fleet, name)
        assert got.height == want.height and (got.height == 0 or got.columns == want.columns), (name, got, want)


def test_long_sql_text_with_a_variable_runs_through_the_cli(fleet):
    """The documented way to pass a variable to a saved query from the shell:
    fleetscope sql "SET VARIABLE recent_minutes = 1; $(cat sql/slow_jobs_now.sql)" """
    code, out, err = sql_cli(fleet, "SET VARIABLE recent_minutes = 1; " + (SQL / "slow_jobs_now.sql").read_text(), "--format", "csv")
    assert code == 0, err
    assert pl.read_csv(io.StringIO(out)).height >= 1
