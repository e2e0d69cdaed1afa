"""Operations: hang diagnosis and the report of each incident request (incidents partitions), the
grouping of all verdicts into problems people act on, and the nightly fleet report (unpartitioned)."""
import base64
import datetime as dt
from pathlib import Path

import polars as pl
from dagster import (AllPartitionMapping, AssetDep, AssetExecutionContext, AssetSpec, MaterializeResult, MetadataValue, asset,
                     multi_asset)

from fleetscope.assets._tables import analysis_specs, materialize_analysis, write_table
from fleetscope.assets.partitions import incidents
from fleetscope.incidents import scoped_verdicts
from fleetscope.ingest.topology import latest_topology
from fleetscope.problems import group_problems
from fleetscope.reports import fleet_report, incident_report
from fleetscope.resources import LandingResource, WarehouseResource
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


HANG_TABLES = {"xputimer_hang_ranks": "Per rank of a hung job: its main thread's top frame, whether it waits in a collective, "
                                      "and the culprit.",
               "xputimer_hang_collectives": "Per process group of a hung job: the first collective not the same on every member "
                                            "(ranks missing from it, a different collective or sizes, not completed)."}


@multi_asset(specs=analysis_specs(HANG_TABLES, "hang_verdicts", "Hang diagnosis from the stack dumps of every rank, their "
                                  "collective progress (Flight Recorder) and ring progress (XPUTimer): the culprit rank, a "
                                  "diverged program or the faulty link.",
                                  partitions_def=incidents, group="operations",
                                  deps=["incidents", "stacks", "ring_progress", "collective_progress"]),
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
    inc, _ = group_problems(v, topo, jc)
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


@multi_asset(specs=[AssetSpec("problems", group_name="operations", kinds={"duckdb", "parquet"},
                              deps=[AssetDep(k, partition_mapping=_ALL) for k in VERDICT_ASSETS],
                              description="All verdicts grouped into problems: findings from several detectors about the same "
                                          "job, switch, host or GPU in overlapping time spans become one row with the evidence "
                                          "from each (stable ids)."),
                    AssetSpec("problem_members", group_name="operations", kinds={"duckdb", "parquet"}, deps=["problems"],
                              description="Which verdicts (verdict_id) make up which problem (problem_id).")],
             can_subset=False)
def problems_asset(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    v = wh.read("anomaly_verdicts")
    problems, members = group_problems(v, latest_topology(wh.read("topology")), wh.read("job_clusters"))
    _, md = write_table(wh, "problems", "all", problems)
    md["verdicts"] = MetadataValue.int(v.height)
    md["by_team"] = MetadataValue.json(dict(v.filter(pl.col("severity") != "info").group_by("team").len().iter_rows()) if v.height else {})
    yield MaterializeResult(asset_key="problems", metadata=md)
    yield MaterializeResult(asset_key="problem_members", metadata=write_table(wh, "problem_members", "all", members)[1])


@asset(name="fleet_report", group_name="operations", deps=["problems"], kinds={"duckdb"},
       description="The nightly fleet report: jobs and step-time trends, worst verdicts by team, recurring switches and hosts, "
                   "plots of step-time trends, switch bandwidth and issue-latency CDFs.")
def fleet_report_asset(context: AssetExecutionContext, warehouse: WarehouseResource) -> MaterializeResult:
    wh = warehouse.get()
    day = context.run.tags.get("fleetscope/day") or dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d")
    steps = wh.read("step_timelines")
    flows = wh.read("flows", columns=["start_ns", "duration_ns", "bytes", "path"])
    md, plots = fleet_report(day, wh.read("jobs"), steps, wh.read("anomaly_verdicts"), wh.read("problems"),
                             flows, wh.read("timings", where="kind = 'kernel'"), wh.read("topology"))
    path = _write_report(wh.exports_dir("reports"), f"fleet-{day}", md, plots)
    plot_md = {f"plot/{n}": MetadataValue.path(str(path.parent / f"fleet-{day}-{n}")) for n in plots}
    return MaterializeResult(metadata={"report": MetadataValue.md(_md_with_images(md, plots)),
                                       "report_path": MetadataValue.path(str(path)), **plot_md,
                                       "dagster/row_count": MetadataValue.int(len(md.splitlines()))})


ASSETS = [hang_diagnosis, incident_report_asset, problems_asset, fleet_report_asset]
