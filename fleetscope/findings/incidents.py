"""Incident requests (docs/CONTRACT.md 1.7): what an SRE or a sensor asks fleetscope to look at.
Their scope (which flow windows and captures to analyse, which verdicts belong in the report)
is domain logic, kept here so the sensors and assets stay wiring."""
from __future__ import annotations

import polars as pl

from fleetscope.ingest.windows import parse_window_id


def incident_scope(request: dict, windows: list[str], jobs_seen: pl.DataFrame, captures: pl.DataFrame) -> tuple[list[str], list[str]]:
    """(flow windows, captures) a request needs: the windows overlapping its time span (or, with no
    span, every window its job was seen in) and the captures of its job (plus the one it names).

    windows: every known window id; jobs_seen: the jobs table (window_id, job_id); captures: the
    captures table (capture_id, job_id)."""
    lo, hi, job = request.get("from_ns"), request.get("to_ns"), request.get("job_id")
    if lo is None and hi is None and job:
        out = jobs_seen.filter(pl.col("job_id") == job)["window_id"].unique().to_list() if jobs_seen.height else []
    else:
        out = []
        for w in windows:
            ws, we = parse_window_id(w)
            if (lo is None or we >= lo) and (hi is None or ws <= hi):
                out.append(w)
    caps = captures.filter(pl.col("job_id") == job)["capture_id"].to_list() if job and captures.height else []
    if request.get("capture"):
        caps.append(request["capture"])
    return sorted(set(out)), sorted(set(caps))


def scoped_verdicts(verdicts: pl.DataFrame, request: dict, job_clusters: pl.DataFrame, topology: pl.DataFrame) -> pl.DataFrame:
    """Verdicts about the request's job, hosts or ips, overlapping its time span."""
    hosts, ips = set(request.get("hosts") or []), set(request.get("ips") or [])
    if topology.height and hosts:
        ips |= set(topology.filter(pl.col("host").is_in(list(hosts)))["ip"].to_list())
    if request.get("job_id") and job_clusters.height:
        ips |= set(job_clusters.filter(pl.col("job_id") == request["job_id"])["ip"].to_list())
    cond = pl.lit(False)
    if request.get("job_id"):
        cond = cond | (pl.col("job_id") == request["job_id"]) | \
            (pl.col("evidence").fill_null("").str.contains(request["job_id"], literal=True))
    if hosts:
        cond = cond | ((pl.col("scope") == "host") & pl.col("subject").is_in(list(hosts)))
    if ips:
        cond = cond | (pl.col("scope").is_in(["gpu", "link"]) & pl.col("subject").is_in(list(ips)))
    if request.get("incident_id"):
        cond = cond | (pl.col("window_id") == request["incident_id"])
    if not (request.get("job_id") or hosts or ips):
        cond = pl.lit(True)
    v = verdicts.filter(cond)
    lo, hi = request.get("from_ns"), request.get("to_ns")
    if lo is not None:
        v = v.filter(pl.col("end_ns").is_null() | (pl.col("end_ns") >= lo))
    if hi is not None:
        v = v.filter(pl.col("start_ns").is_null() | (pl.col("start_ns") <= hi))
    return v
