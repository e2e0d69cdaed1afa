"""One window of flows -> the Analysis (fleetscope.analysis) with the tables jobs, job_clusters,
comm_pairs, step_timelines, flow_background and the flow verdicts: the entry point the Dagster
assets call."""
from __future__ import annotations

import time

import polars as pl

from fleetscope.analysis import Analysis, skipped
from fleetscope.flows.comm_types import classify_pairs
from fleetscope.flows.config import FlowConfig
from fleetscope.flows.diagnosis import flow_verdicts
from fleetscope.flows.jobs import pair_summary, recognize_jobs
from fleetscope.flows.prepare import add_pairs, check_flows, check_topology, segment
from fleetscope.flows.schemas import COMM_PAIRS, FLOW_BACKGROUND, JOB_CLUSTERS, JOBS, STEP_TIMELINES
from fleetscope.flows.timelines import ip_flows, perfetto_trace, reconstruct_steps
from fleetscope.schemas.base import conform
from fleetscope.windows import window_id_for


def analyze_window(flows: pl.DataFrame, topology: pl.DataFrame, window_start_ns: int, window_end_ns: int,
                   config: FlowConfig | None = None, window_id: str | None = None,
                   timings: dict | None = None, export_timelines: bool = False) -> Analysis:
    """flows: normalized flows (docs/CONTRACT.md 1.2) starting in [window_start_ns - margin,
    window_end_ns); the margin (recommended: >= 2 step periods + edge_guard_ns; 30 s is plenty) lets
    the first steps of the window be delimited. Jobs and comm types come from the flows inside the
    window, step timelines from all of them. Returns the Analysis with tables jobs, job_clusters,
    comm_pairs, step_timelines, flow_background and the flow verdicts; with export_timelines, one
    Perfetto trace per job as artifact `perfetto/<window>/<job>.json`. `timings`, when a dict,
    receives per-stage seconds."""
    cfg = config or FlowConfig()
    if window_end_ns <= window_start_ns:
        raise ValueError(f"empty window [{window_start_ns}, {window_end_ns})")
    wid = window_id or window_id_for(window_start_ns, window_end_ns)
    if flows.height == 0:
        return skipped(f"window {wid}: no flow records")
    if topology.height == 0:
        return skipped(f"window {wid}: {flows.height} flow records but no topology (docs/CONTRACT.md 1.1): jobs need the "
                       "host of every address; land a topology file", warn=True)
    tm = timings if timings is not None else {}
    t = time.perf_counter()

    f = add_pairs(check_flows(flows))
    topo = check_topology(topology)
    f = f.filter(pl.col("start_ns") < window_end_ns)
    known = topo["ip"].implode()
    is_in = pl.col("src_ip").is_in(known) & pl.col("dst_ip").is_in(known)
    inside, outside = f.filter(is_in), f.filter(~is_in)
    # an integer key per pair: the heavy sorts and group-bys run on it, not on address strings
    ips, ixs = topo["ip"].to_list(), list(range(topo.height))
    inside = inside.with_columns(pid=pl.col("ip_a").replace_strict(ips, ixs, return_dtype=pl.Int64) * (1 << 32)
                                 + pl.col("ip_b").replace_strict(ips, ixs, return_dtype=pl.Int64))
    win = inside.filter(pl.col("start_ns") >= window_start_ns)
    tm["prepare"] = time.perf_counter() - t

    t = time.perf_counter()
    # control messages (credits, notifications, store polls) carry no step timing: the split and
    # the size count run on data flows; pairs with control traffic only are aperiodic (`other`)
    seg = segment(win.filter(pl.col("bytes") >= cfg.min_data_bytes), ["pid"], cfg.split)
    pairs = pair_summary(seg, cfg)
    ctrl = win.join(pairs.select("pid"), on="pid", how="anti").group_by("pid").agg(
        ip_a=pl.col("ip_a").first(), ip_b=pl.col("ip_b").first(), n_flows=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum().cast(pl.Int64),
        first_ns=pl.col("start_ns").min(), last_ns=pl.col("end_ns").max())
    pairs = pl.concat([pairs, ctrl.with_columns(n_steps=pl.lit(0, dtype=pl.Int64), periodic=pl.lit(False))],
                      how="diagonal_relaxed").sort("ip_a", "ip_b")
    members, job_pairs = recognize_jobs(pairs, seg, topo, cfg)
    tm["jobs"] = time.perf_counter() - t

    t = time.perf_counter()
    labeled = classify_pairs(pairs, job_pairs, seg, cfg)
    tm["comm_types"] = time.perf_counter() - t

    t = time.perf_counter()
    ipf = ip_flows(inside, labeled)
    steps = reconstruct_steps(ipf, window_start_ns, window_end_ns, wid, cfg)
    tm["timelines"] = time.perf_counter() - t

    # tables
    period = steps.with_columns(d=pl.col("end_ns") - pl.col("start_ns")).filter("start_observed") \
        .group_by("job_id").agg(step_period_ns=pl.col("d").median().cast(pl.Int64))
    span = win.join(labeled.select("pid", "job_id"), on="pid").group_by("job_id").agg(
        first_ns=pl.col("start_ns").min(), last_ns=pl.col("end_ns").max(), n_flows=pl.len().cast(pl.Int64))
    jobs = members.group_by("job_id").agg(
        n_gpus=pl.col("ip").n_unique().cast(pl.Int64), n_hosts=pl.col("host").n_unique().cast(pl.Int64),
        n_clusters=pl.col("cluster_id").n_unique().cast(pl.Int64),
    ).join(span, on="job_id", how="left").join(period, on="job_id", how="left").with_columns(
        window_id=pl.lit(wid), n_flows=pl.col("n_flows").fill_null(0)).sort("job_id")
    tables = {
        "jobs": JOBS.validate(conform(jobs, JOBS)),
        "job_clusters": JOB_CLUSTERS.validate(conform(members.with_columns(window_id=pl.lit(wid)), JOB_CLUSTERS)),
        "comm_pairs": COMM_PAIRS.validate(conform(labeled.with_columns(window_id=pl.lit(wid)), COMM_PAIRS)),
        "step_timelines": STEP_TIMELINES.validate(conform(steps, STEP_TIMELINES)),
    }
    bg_out = outside.filter(pl.col("start_ns") >= window_start_ns).group_by("src_ip", "dst_ip").agg(
        n_flows=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum().cast(pl.Int64)).with_columns(reason=pl.lit("outside_topology"))
    aper = win.join(pairs.filter(~pl.col("periodic")).select("pid"), on="pid", how="semi") \
        .join(labeled.select("pid"), on="pid", how="anti")
    bg_ap = aper.group_by("src_ip", "dst_ip").agg(
        n_flows=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum().cast(pl.Int64)).with_columns(reason=pl.lit("aperiodic"))
    bg = pl.concat([bg_out, bg_ap], how="diagonal").with_columns(window_id=pl.lit(wid)).sort("reason", "src_ip", "dst_ip")
    tables["flow_background"] = FLOW_BACKGROUND.validate(conform(bg, FLOW_BACKGROUND))

    t = time.perf_counter()
    verdicts = flow_verdicts(tables, inside.filter(pl.col("start_ns") >= window_start_ns),
                             topo, wid, cfg, ipf=ipf.filter(pl.col("start_ns") >= window_start_ns), pairs=labeled)
    tm["verdicts"] = time.perf_counter() - t
    artifacts = {}
    if export_timelines:
        for job in tables["step_timelines"]["job_id"].unique().sort().to_list():
            artifacts[f"perfetto/{wid}/{job}.json"] = perfetto_trace(tables["step_timelines"], ipf, job, topology=topo)
    return Analysis(tables=tables, verdicts=verdicts, artifacts=artifacts)
