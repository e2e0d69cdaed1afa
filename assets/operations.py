"""Operations: hang diagnosis and the report of each incident (incidents partitions), the grouping
of all verdicts into problems people act on, and the nightly fleet report (unpartitioned)."""
import base64
import datetime as dt
from pathlib import Path

import polars as pl
from dagster import (AllPartitionMapping, AssetDep, AssetExecutionContext, AutomationCondition, MaterializeResult,
                     MetadataValue, asset)

from fleetscope.assets._tables import preview, write_table, write_verdicts
from fleetscope.assets.ingest import incident_inputs
from fleetscope.assets.partitions import incidents
from fleetscope.ingest.topology import latest_topology
from fleetscope.incidents import INCIDENTS_TABLE, group_incidents
from fleetscope.reports import fleet_report, incident_report
from fleetscope.resources import LandingResource, WarehouseResource

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


@asset(partitions_def=incidents, group_name="operations", deps=[incident_inputs], kinds={"duckdb"},
       automation_condition=AutomationCondition.eager(),
       description="Hang diagnosis from the stack dumps of every rank and ring progress (XPUTimer): the culprit rank or the faulty link.")
def hang_verdicts(context: AssetExecutionContext, warehouse: WarehouseResource, landing: LandingResource) -> MaterializeResult:
    from fleetscope.xputimer.hang import diagnose_hang

    wh = warehouse.get()
    key = context.partition_key
    folder = landing.root / "stacks" / key
    if not folder.is_dir() or not any(folder.glob("rank*.txt")):
        md = write_verdicts(wh, "hang", key, None)
        return MaterializeResult(metadata={**md, "note": MetadataValue.text("no stack dumps for this incident")})
    req = wh.read("incidents", where=f"incident_id = '{key}'")
    job_id = req["job_id"][0] if req.height else None
    ranks, verdicts = diagnose_hang(folder, job_id=job_id)
    md = write_verdicts(wh, "hang", key, verdicts)
    md["ranks"] = preview(ranks, 32)
    return MaterializeResult(metadata=md)


def scoped_verdicts(verdicts: pl.DataFrame, req: dict, job_clusters: pl.DataFrame, topology: pl.DataFrame) -> pl.DataFrame:
    """Verdicts about the incident's job, hosts or ips, overlapping its time span."""
    hosts, ips = set(req.get("hosts") or []), set(req.get("ips") or [])
    if topology.height and hosts:
        ips |= set(topology.filter(pl.col("host").is_in(list(hosts)))["ip"].to_list())
    if req.get("job_id") and job_clusters.height:
        ips |= set(job_clusters.filter(pl.col("job_id") == req["job_id"])["ip"].to_list())
    cond = pl.lit(False)
    if req.get("job_id"):
        cond = cond | (pl.col("job_id") == req["job_id"]) | (pl.col("evidence").fill_null("").str.contains(req["job_id"], literal=True))
    if hosts:
        cond = cond | ((pl.col("scope") == "host") & pl.col("subject").is_in(list(hosts)))
    if ips:
        cond = cond | (pl.col("scope").is_in(["gpu", "link"]) & pl.col("subject").is_in(list(ips)))
    if req.get("incident_id"):
        cond = cond | (pl.col("window_id") == req["incident_id"])
    if not (req.get("job_id") or hosts or ips):
        cond = pl.lit(True)
    v = verdicts.filter(cond)
    lo, hi = req.get("from_ns"), req.get("to_ns")
    if lo is not None:
        v = v.filter(pl.col("end_ns").is_null() | (pl.col("end_ns") >= lo))
    if hi is not None:
        v = v.filter(pl.col("start_ns").is_null() | (pl.col("start_ns") <= hi))
    return v


@asset(name="incident_report", partitions_def=incidents, group_name="operations", deps=[incident_inputs, hang_verdicts], kinds={"duckdb"},
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
    inc, _ = group_incidents(v, topo, jc)
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


def _all_verdict_deps():
    return [AssetDep(k, partition_mapping=_ALL) for k in ("flow_verdicts", "hang_verdicts", "xputimer_verdicts",
                                                         "perftracker_verdicts", "prism_verdicts", "trace_verdicts")]


@asset(group_name="operations", deps=_all_verdict_deps(), kinds={"duckdb"},
       description="All verdicts grouped into problems: findings from several detectors about the same job, switch, host or GPU "
                   "in overlapping time spans become one row with the evidence from each (stable ids).")
def verdict_incidents(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    wh = warehouse.get()
    v = wh.read("anomaly_verdicts")
    inc, members = group_incidents(v, latest_topology(wh.read("topology")), wh.read("job_clusters"))
    _, md = write_table(wh, "verdict_incidents", "all", inc, INCIDENTS_TABLE)
    wh.write_partition("verdict_incident_members", "all", members)
    md["verdicts"] = MetadataValue.int(v.height)
    md["by_team"] = MetadataValue.json(dict(v.filter(pl.col("severity") != "info").group_by("team").len().iter_rows()) if v.height else {})
    return MaterializeResult(metadata=md)


@asset(name="fleet_report", group_name="operations", deps=[verdict_incidents], kinds={"duckdb"},
       description="The nightly fleet report: jobs and step-time trends, worst verdicts by team, recurring switches and hosts, "
                   "plots of step-time trends, switch bandwidth and issue-latency CDFs.")
def fleet_report_asset(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    wh = warehouse.get()
    day = context.run.tags.get("fleetscope/day") or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d")
    steps = wh.read("step_timelines")
    flows = wh.read("flows", columns=["start_ns", "duration_ns", "bytes", "path"])
    md, plots = fleet_report(day, wh.read("jobs"), steps, wh.read("anomaly_verdicts"), wh.read("verdict_incidents"),
                             flows, wh.read("timings", where="kind = 'kernel'"), wh.read("topology"))
    path = _write_report(wh.exports_dir("reports"), f"fleet-{day}", md, plots)
    plot_md = {f"plot/{n}": MetadataValue.path(str(path.parent / f"fleet-{day}-{n}")) for n in plots}
    return MaterializeResult(metadata={"report": MetadataValue.md(_md_with_images(md, plots)),
                                       "report_path": MetadataValue.path(str(path)), **plot_md,
                                       "dagster/row_count": MetadataValue.int(len(md.splitlines()))})


ASSETS = [hang_verdicts, incident_report_asset, verdict_incidents, fleet_report_asset]
