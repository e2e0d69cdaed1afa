"""Operations: hang diagnosis and the report of each incident request (incidents partitions), the
grouping of all verdicts into problems people act on, and the nightly fleet report (unpartitioned)."""
import base64
import datetime as dt
from pathlib import Path

import polars as pl
from dagster import (AllPartitionMapping, AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetDep, AssetExecutionContext,
                     MaterializeResult, MetadataValue, asset, multi_asset)

from fleetscope.assets._tables import analysis_specs, materialize_analysis, table_schema_metadata, table_spec, write_table
from fleetscope.findings.exports import job_timeline_trace
from fleetscope.assets.partitions import incidents
from fleetscope.findings.incidents import scoped_verdicts
from fleetscope.ingest.topology import latest_topology
from fleetscope.findings.problems import group_problems
from fleetscope.findings.reports import fleet_report, incident_report, md_table, problems_markdown
from fleetscope.resources import LandingResource, WarehouseResource
from fleetscope.tables import DECLARED, TABLES
from fleetscope.xputimer.schemas import DECLARED as XPUTIMER_TABLES
from fleetscope.xputimer import analyze_hang

_ALL = AllPartitionMapping()


def _md_with_images(md: str, plots: dict[str, bytes]) -> str:
    """The report as the UI shows it: images inlined as data URIs (the files sit beside the .md)."""
    for name, png in plots.items():
        md = md.replace(f"]({name})", f"](data:image/png;base64,{base64.b64encode(png).decode()})")
    return md


def _write_report(folder: Path, stem: str, md: str, plots: dict[str, bytes]) -> Path:
    for name, png in plots.items():
        (folder / f"{stem}-{name}").write_bytes(png)
        md = md.replace(f"]({name})", f"]({stem}-{name})")
    path = folder / f"{stem}.md"
    tmp = path.with_suffix(".md.tmp")
    tmp.write_text(md)
    tmp.replace(path)
    return path


HANG_TABLES = [t for t in XPUTIMER_TABLES if t.partitions == "incidents"]  # fleetscope/xputimer/schemas.py


@multi_asset(specs=analysis_specs(HANG_TABLES, "hang_verdicts", "Hang diagnosis from the stack dumps of every rank, their "
                                  "collective progress (Flight Recorder) and ring progress (XPUTimer): the culprit rank, a "
                                  "diverged program or the faulty link.",
                                  group="operations"),
             can_subset=False)
def hang_diagnosis(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource):
    wh = warehouse.get()
    key = context.partition_key
    req = wh.read("incidents", where=f"incident_id = '{key}'")
    result = analyze_hang(landing.root / "stacks" / key, job_id=req["job_id"][0] if req.height else None)
    yield from materialize_analysis(wh, key, result, HANG_TABLES, "hang_verdicts", "hang")


@asset(name="incident_report", partitions_def=incidents, group_name="operations", deps=["incidents", "hang_verdicts"], kinds={"duckdb"},
       description="The report of one incident request: its scope, timeline, verdicts grouped into problems, step times and plots "
                   "(markdown file beside the warehouse, shown here).")
def incident_report_asset(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    wh = warehouse.get()
    key = context.partition_key
    req_df = wh.read("incidents", where=f"incident_id = '{key}'")
    req = req_df.drop("source_file").to_dicts()[0] if req_df.height else {"incident_id": key, "kind": "hang"}
    req["incident_id"] = key
    jc, topo = wh.read("job_clusters"), latest_topology(wh.read("topology"))
    v = scoped_verdicts(wh.read("anomaly_verdicts"), req, jc, topo)
    inc, _ = group_problems(v, topo, jc, wh.read("capture_ranks"))
    lo, hi = req.get("from_ns"), req.get("to_ns")
    time_sql = " AND ".join(x for x in [f"end_ns >= {lo}" if lo is not None else "", f"start_ns <= {hi}" if hi is not None else ""] if x)
    steps = wh.read("step_timelines", where=" AND ".join(x for x in [f"job_id = '{req['job_id']}'" if req.get("job_id") else "", time_sql] if x) or None) \
        if req.get("job_id") or time_sql else wh.read("step_timelines")
    ips = jc.filter(pl.col("job_id") == req.get("job_id"))["ip"].to_list() if req.get("job_id") else (req.get("ips") or [])
    flows = wh.read("flows", where=(f"src_ip IN ({','.join(repr(i) for i in ips)})" + (f" AND {time_sql}" if time_sql else ""))) if ips else wh.read("flows", where=time_sql or "false")
    caps = wh.read("captures", where=f"job_id = '{req['job_id']}'")["capture_id"].to_list() if req.get("job_id") else ([req["capture"]] if req.get("capture") else [])
    timings = wh.read("timings", partitions=caps) if caps else wh.read("timings", where="false")
    md, plots = incident_report(req, v, inc, steps, flows, timings)
    path = _write_report(wh.exports_dir("reports"), f"incident-{key}", md, plots)
    context.log.info(f"incident report: {path}")
    return MaterializeResult(metadata={
        "report": MetadataValue.md(_md_with_images(md, plots)), "report_path": MetadataValue.path(str(path)),
        "verdicts_in_scope": MetadataValue.int(v.height), "problems": MetadataValue.int(inc.height),
        "dagster/row_count": MetadataValue.int(v.height)})


VERDICT_ASSETS = ("flows_verdicts", "traces_verdicts", "perftracker_verdicts", "xputimer_verdicts", "prism_verdicts", "hang_verdicts")
_SEVERITIES = ("critical", "warning", "info")


_MORE = "_{n} more: `fleetscope sql` has them all_"


@asset(name="anomaly_verdicts", group_name="operations", kinds={"duckdb", "parquet"},
       deps=[AssetDep(k, partition_mapping=_ALL) for k in VERDICT_ASSETS], description=DECLARED["anomaly_verdicts"].description)
def anomaly_verdicts_asset(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    wh = warehouse.get()
    v = wh.read("anomaly_verdicts")
    bad = v.filter(pl.col("severity") != "info").sort(pl.col("severity").replace_strict({"critical": 0, "warning": 1}, default=2),
                                                      "start_ns")
    counts = v.group_by("severity", "team").len().sort("severity", "team") if v.height else v.head(0)
    return MaterializeResult(metadata={
        "dagster/row_count": MetadataValue.int(v.height),
        "dagster/column_schema": MetadataValue.table_schema(table_schema_metadata(TABLES["anomaly_verdicts"])),
        "by_severity": MetadataValue.json({s: int((v["severity"] == s).sum()) for s in _SEVERITIES} if v.height else {}),
        "by_severity_and_team": MetadataValue.md(md_table(counts, ["severity", "team", "len"], n=50, more=_MORE)),
        "warning_and_critical": MetadataValue.md(md_table(bad.with_columns(
            when=pl.from_epoch("start_ns", time_unit="ns").dt.strftime("%Y-%m-%d %H:%M:%S")),
            ["when", "severity", "team", "detector", "scope", "subject", "explanation"], n=200, more=_MORE)),
    })


@multi_asset(specs=[table_spec("problems", group="operations", deps=["anomaly_verdicts"]),
                    table_spec("problem_members", group="operations", deps=["problems"])],
             check_specs=[AssetCheckSpec("no_critical_problems", asset="problems",
                                         description="Fails while a critical problem is open: the catalog shows red where the fleet is sick."),
                          AssetCheckSpec("no_warning_problems", asset="problems",
                                         description="Warns while a warning-level problem is open.")],
             can_subset=False)
def problems_asset(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    v = wh.read("anomaly_verdicts")
    problems, members = group_problems(v, latest_topology(wh.read("topology")), wh.read("job_clusters"), wh.read("capture_ranks"))
    _, md = write_table(wh, "problems", "all", problems)
    md["verdicts"] = MetadataValue.int(v.height)
    md["by_team"] = MetadataValue.json(dict(problems.group_by("team").len().iter_rows()) if problems.height else {})
    md["problems"] = MetadataValue.md(problems_markdown(problems.head(30)))
    yield MaterializeResult(asset_key="problems", metadata=md)
    yield MaterializeResult(asset_key="problem_members", metadata=write_table(wh, "problem_members", "all", members)[1])
    for name, sev, level in (("no_critical_problems", "critical", AssetCheckSeverity.ERROR),
                             ("no_warning_problems", "warning", AssetCheckSeverity.WARN)):
        open_ = problems.filter(pl.col("severity") == sev)
        yield AssetCheckResult(check_name=name, asset_key="problems", passed=open_.height == 0, severity=level,
                               description=("; ".join(open_["title"].head(5).to_list()) if open_.height else f"no {sev} problem"),
                               metadata={"open": MetadataValue.int(open_.height),
                                         "titles": MetadataValue.md("\n".join(f"- [{r['team']}] {r['title']}" for r in
                                                                               open_.head(20).iter_rows(named=True)) or "_none_")})


def _data_day(wh) -> str:
    """The day (UTC) of the newest data: a report about yesterday's fleet is named after yesterday."""
    newest = [wh.sql(f"SELECT max({c}) AS t FROM {t}")["t"][0] for t, c in (("step_timelines", "end_ns"), ("anomaly_verdicts", "end_ns"),
                                                                           ("timings", "end_ns")) if wh.has_table(t)]
    newest = [x for x in newest if x is not None]
    when = dt.datetime.fromtimestamp(max(newest) / 1e9, tz=dt.timezone.utc) if newest else dt.datetime.now(dt.timezone.utc)
    return when.strftime("%Y%m%d")


@asset(name="fleet_health", group_name="operations", deps=["problems"], kinds={"duckdb"},
       description="The fleet health page: open problems by severity and team with what to do and their evidence, jobs with "
                   "their step-time trends and problem markers, switches and hosts that recur, and links to each job's "
                   "Perfetto timeline (written beside the warehouse; rebuilt nightly and on every run).")
def fleet_health_asset(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    wh = warehouse.get()
    day = context.run.tags.get("fleetscope/day") or _data_day(wh)
    steps, problems = wh.read("step_timelines"), wh.read("problems")
    topo = latest_topology(wh.read("topology"))
    links = _job_timelines(wh, steps, problems, topo)
    flows = wh.read("flows", columns=["start_ns", "duration_ns", "bytes", "path"])
    md, plots = fleet_report(day, wh.read("jobs"), steps, wh.read("anomaly_verdicts"), problems,
                             flows, wh.read("timings", where="kind = 'kernel'"), topo, links=links)
    path = _write_report(wh.exports_dir("reports"), f"fleet-health-{day}", md, plots)
    plot_md = {f"plot/{n}": MetadataValue.path(str(path.parent / f"fleet-health-{day}-{n}")) for n in plots}
    return MaterializeResult(metadata={"report": MetadataValue.md(_md_with_images(md, plots)),
                                       "report_path": MetadataValue.path(str(path)), **plot_md,
                                       "open_problems": MetadataValue.int(problems.height),
                                       "critical": MetadataValue.int(int((problems["severity"] == "critical").sum()) if problems.height else 0),
                                       "dagster/row_count": MetadataValue.int(problems.height)})


def _job_timelines(wh, steps: pl.DataFrame, problems: pl.DataFrame, topo: pl.DataFrame) -> dict[str, list[str]]:
    """One Perfetto trace per job across every window, with the problems about it marked; returns
    problem_id -> links for the report."""
    folder = wh.exports_dir("perfetto", "jobs")
    per_job: dict[str, str] = {}
    marks = problems.with_columns(job=pl.col("job_ids").str.split(",")).explode("job") if problems.height else problems
    for job in steps["job_id"].unique().sort().to_list() if steps.height else []:
        found = marks.filter(pl.col("job") == job).select("start_ns", "end_ns", "severity", "title", "team", "problem_id", "ip") \
            if marks.height else None
        try:
            data = job_timeline_trace(job, steps, found, topo)
        except ValueError:
            continue
        target = folder / f"{job}.json"
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(data)
        tmp.replace(target)
        per_job[job] = str(target)
    out: dict[str, list[str]] = {}
    for r in problems.iter_rows(named=True) if problems.height else []:
        for job in (r["job_ids"] or "").split(","):
            if job in per_job:
                out.setdefault(r["problem_id"], []).append(f"timeline of job {job} (open in ui.perfetto.dev): `{per_job[job]}`")
                out[r["problem_id"]].append(f"its steps: `fleetscope sql job_timeline --var job_id={job}`")
    return out


ASSETS = [hang_diagnosis, incident_report_asset, anomaly_verdicts_asset, problems_asset, fleet_health_asset]
