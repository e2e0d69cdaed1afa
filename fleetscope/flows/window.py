"""One window of flows -> the Analysis (fleetscope.analysis) with the tables jobs, job_clusters,
comm_pairs, step_timelines, flow_background and the flow verdicts: the entry point the Dagster
assets call."""
from __future__ import annotations

import time

import numpy as np
import polars as pl

from fleetscope.analysis import Analysis, skipped
from fleetscope.flows.comm_types import classify_pairs
from fleetscope.flows.config import FlowConfig
from fleetscope.flows.diagnosis import flow_verdicts
from fleetscope.flows.jobs import pair_summary, recognize_jobs
from fleetscope.flows.prepare import add_pairs, check_flows, check_topology, empty_topology, segment
from fleetscope.flows.schemas import COMM_PAIRS, FLOW_BACKGROUND, FLOW_PAIR_RATES, JOB_CLUSTERS, JOBS, STEP_TIMELINES
from fleetscope.flows.timelines import ip_flows, perfetto_trace, reconstruct_steps
from fleetscope.flows.stats import typical, typical_split
from fleetscope.schemas.base import conform
from fleetscope.ingest.windows import window_id_for

def analyze_window(flows: pl.DataFrame, topology: pl.DataFrame | None, window_start_ns: int, window_end_ns: int,
                   config: FlowConfig | None = None, window_id: str | None = None,
                   timings: dict | None = None, export_timelines: bool = False,
                   history: pl.DataFrame | None = None, suspects: set[str] | None = None) -> Analysis:
    """flows: normalized flows (docs/CONTRACT.md 1.2) starting in [window_start_ns - margin, window_end_ns);
    the margin (recommended: >= 2 step periods + edge_guard_ns; 30 s is plenty) lets the first
    steps of the window be delimited. Jobs and comm types come from the flows inside the window,
    step timelines from all of them. Returns the Analysis with tables jobs, job_clusters, comm_pairs,
    step_timelines, flow_background, the flow verdicts, what was skipped as notes and what needs a
    person (no topology, flows but no job) as warnings; with export_timelines, one Perfetto trace per job as artifact
    `perfetto/<window>/<job>.json`. `timings`, when a dict, receives per-stage seconds. `history`: the
    flow_pair_rates rows of earlier windows (the pairs' levels before this window), optional; the
    window's own rows are the table flow_pair_rates. `suspects`: the subjects of the NIC, switch and host
    verdicts of earlier windows (prior_suspects), optional: of equal explanations, the one named before."""
    cfg = config or FlowConfig()
    if window_end_ns <= window_start_ns:
        raise ValueError(f"empty window [{window_start_ns}, {window_end_ns})")
    wid = window_id or window_id_for(window_start_ns, window_end_ns)
    if flows.height == 0:
        return skipped(f"window {wid}: no flow records")
    tm = timings if timings is not None else {}
    t = time.perf_counter()

    notes: list[str] = []
    f = add_pairs(check_flows(flows))
    topo = check_topology(topology) if topology is not None and topology.height else None
    f = f.filter(pl.col("start_ns") < window_end_ns)
    if topo is None:
        # flows alone still give jobs, pairs and steps; what needs hosts is skipped, and said so
        ips_seen = pl.concat([f["src_ip"], f["dst_ip"]]).unique().sort()
        topo = empty_topology(ips_seen)
        notes.append(
            "WARNING: no topology (missing or rejected): every address in the flows was taken as a GPU NIC. "
            "Skipped: the host merge (a job's tensor-parallel ranks on the same hosts stay separate jobs), host "
            "and leaf names in job_clusters and verdicts, and the split of background traffic by address. "
            "Land a topology (docs/CONTRACT.md 1.1: ip, host) to get them.")
        has_hosts = False
    else:
        has_hosts = True
    # a topology that names the GPU of its addresses and none for some (its gpu left empty, or the
    # address as ingestion defaults it) lists service hosts too (storage, monitoring): their traffic with
    # a job (data loading, checkpoints) is never the job's own
    named = pl.col("gpu").is_not_null() & (pl.col("gpu") != pl.col("ip"))
    gpus = topo.filter(named) if topo.select(named.any()).item() else topo
    known = gpus["ip"].implode()
    is_in = pl.col("src_ip").is_in(known) & pl.col("dst_ip").is_in(known)
    inside, outside = f.filter(is_in), f.filter(~is_in)
    # (what is still needed of all flows; the frame itself is not: at 16,384 GPUs each copy of the flows
    # is gigabytes, so frames are dropped as soon as they are used)
    data_span = (int(f["start_ns"].min()), int(f["end_ns"].max())) if f.height else (window_start_ns, window_end_ns)
    n_flows = f.height
    del f
    if has_hosts and n_flows and inside.height < 0.5 * n_flows:
        notes.append(
            f"WARNING: {outside.height} of {n_flows} flows ({outside.height / n_flows:.0%}) have an address outside "
            "the topology: is the topology stale or of another cluster? Those flows were set aside as background.")
    # an integer key per pair: the heavy sorts and group-bys run on it, not on address strings
    ips, ixs = topo["ip"].to_list(), list(range(topo.height))
    inside = inside.with_columns(pid=pl.col("ip_a").replace_strict(ips, ixs, return_dtype=pl.Int64) * (1 << 32)
                                 + pl.col("ip_b").replace_strict(ips, ixs, return_dtype=pl.Int64))
    win = inside.filter(pl.col("start_ns") >= window_start_ns)
    tm["prepare"] = time.perf_counter() - t

    t = time.perf_counter()
    # control messages (credits, notifications, store polls) carry no step timing: the split and
    # the size count run on data flows; pairs with control traffic only are aperiodic (`other`)
    # jobs and pairs from the window and its margin: a job that stopped just before the window still
    # owns the steps it leaves to it (claimed by their closing boundary); the tables list the jobs
    # with traffic in the window
    seg = segment(inside.filter(pl.col("bytes") >= cfg.min_data_bytes), ["pid"], cfg.split)
    pairs = pair_summary(seg, cfg)
    ctrl = win.join(pairs.select("pid"), on="pid", how="anti").group_by("pid").agg(
        ip_a=pl.col("ip_a").first(), ip_b=pl.col("ip_b").first(), n_flows=pl.len().cast(pl.Int64), bytes=pl.col("bytes").sum().cast(pl.Int64),
        max_flow_bytes=pl.col("bytes").max().cast(pl.Int64),
        first_ns=pl.col("start_ns").min(), last_ns=pl.col("end_ns").max())
    pairs = pl.concat([pairs, ctrl.with_columns(n_steps=pl.lit(0, dtype=pl.Int64), periodic=pl.lit(False))],
                      how="diagonal_relaxed").sort("ip_a", "ip_b")
    members, job_pairs, edges = recognize_jobs(pairs, seg, topo, cfg)
    tm["jobs"] = time.perf_counter() - t

    t = time.perf_counter()
    labeled = classify_pairs(pairs, job_pairs, seg, cfg, edges=edges)
    del seg
    tm["comm_types"] = time.perf_counter() - t

    t = time.perf_counter()
    ipf = ip_flows(inside, labeled)
    steps_all = reconstruct_steps(ipf, window_start_ns, window_end_ns, wid, cfg)
    withheld = withheld_jobs(steps_all, cfg)
    notes += [f"NOTE: steps of {j} withheld: {why}; its jobs and pairs are reported" for j, why in withheld.items()]
    # a job streaming through its steps: the period its flows repeat with still says its pace
    streaming = steps_all.filter(pl.col("streaming_period_ns").is_not_null()).group_by("job_id").agg(
        repeat_period_ns=pl.col("streaming_period_ns").first().cast(pl.Int64))
    steps_all = steps_all.filter(~pl.col("job_id").is_in(list(withheld))).drop("streaming_period_ns")
    steps = steps_all.filter("claimed")
    tm["timelines"] = time.perf_counter() - t

    # tables
    period = steps.with_columns(d=pl.col("end_ns") - pl.col("start_ns")).filter("start_observed") \
        .group_by("job_id").agg(step_period_ns=pl.col("d").median().cast(pl.Int64))
    span = win.join(labeled.select("pid", "job_id"), on="pid").group_by("job_id").agg(
        first_ns=pl.col("start_ns").min(), last_ns=pl.col("end_ns").max(), n_flows=pl.len().cast(pl.Int64))
    jobs = members.group_by("job_id").agg(
        n_gpus=pl.col("ip").n_unique().cast(pl.Int64), n_hosts=pl.col("host").drop_nulls().n_unique().cast(pl.Int64),
        n_clusters=pl.col("cluster_id").n_unique().cast(pl.Int64),
    ).join(span, on="job_id", how="left").join(period, on="job_id", how="left").join(
        streaming, on="job_id", how="left").with_columns(
        window_id=pl.lit(wid), n_flows=pl.col("n_flows").fill_null(0)).sort("job_id")
    active = jobs.filter(pl.col("n_flows") > 0)["job_id"].implode()
    jobs = jobs.filter(pl.col("job_id").is_in(active))
    tables = {
        "jobs": JOBS.validate(conform(jobs, JOBS)),
        "job_clusters": JOB_CLUSTERS.validate(conform(members.filter(pl.col("job_id").is_in(active))
                                                      .with_columns(window_id=pl.lit(wid)), JOB_CLUSTERS)),
        "comm_pairs": COMM_PAIRS.validate(conform(labeled.join(win.select("pid").unique(), on="pid", how="semi")
                                                  .filter(pl.col("job_id").is_in(active))
                                                  .with_columns(window_id=pl.lit(wid)), COMM_PAIRS)),
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
    # GPU addresses' traffic with non-job peers (storage, monitoring): tells a checkpoint from a stall
    jobpid = labeled.filter(pl.col("comm_type").is_in(["DP", "PP"])).select("pid")
    cols = ["src_ip", "dst_ip", "start_ns", "end_ns", "bytes"]
    bgf = pl.concat([inside.join(jobpid, on="pid", how="anti").select(cols), outside.select(cols)])
    bg_ip = pl.concat([bgf.select(ip="src_ip", start_ns="start_ns", end_ns="end_ns", bytes="bytes"),
                       bgf.select(ip="dst_ip", start_ns="start_ns", end_ns="end_ns", bytes="bytes")])
    # (the window's own flows are `win`; the ip flows of window and margin serve every detector)
    verdicts = flow_verdicts(tables, win, topo, wid, cfg, pairs=labeled, steps_all=steps_all, ipf_all=ipf, bg_ip=bg_ip,
                             data_span=data_span, window=(window_start_ns, window_end_ns), history=history,
                             levels_out=(levels := {}), suspects=suspects)
    tables["flow_pair_rates"] = FLOW_PAIR_RATES.validate(conform(levels.get("levels", pl.DataFrame()), FLOW_PAIR_RATES))
    tm["verdicts"] = time.perf_counter() - t
    notes += no_job_notes(win, outside.filter(pl.col("start_ns") >= window_start_ns), pairs, tables["jobs"])
    artifacts = {}
    if export_timelines:
        for job in tables["step_timelines"]["job_id"].unique().sort().to_list():
            artifacts[f"perfetto/{wid}/{job}.json"] = perfetto_trace(tables["step_timelines"], ipf, job, topology=topo)
    return Analysis(tables=tables, verdicts=verdicts, artifacts=artifacts,
                    notes=[n.removeprefix("NOTE: ") for n in notes if not n.startswith("WARNING: ")],
                    warnings=[n.removeprefix("WARNING: ") for n in notes if n.startswith("WARNING: ")])


def no_job_notes(win: pl.DataFrame, outside: pl.DataFrame, pairs: pl.DataFrame, jobs: pl.DataFrame) -> list[str]:
    """Flows landed but no job was found: a warning with the likely cause, never a quiet success."""
    n_win = win.height + outside.height
    if n_win == 0 or jobs.height:
        return []
    if win.height == 0:
        return [f"WARNING: {n_win} flows in the window but none between two topology addresses: no job can be "
                "found. Likely cause: the topology lists other addresses than the flow records (another cluster, "
                "a renumbering, or management instead of RDMA NIC addresses)."]
    n_pairs = pairs.height
    n_periodic = int(pairs["periodic"].sum()) if n_pairs else 0
    if n_periodic == 0:
        return [f"WARNING: {n_win} flows over {n_pairs} address pairs but no pair repeats traffic of recurring sizes, "
                "so no training job was found. Likely causes: the window holds only background traffic (storage, "
                "monitoring, control), the jobs' steps are longer than the window, or the collector exports one "
                "record per connection instead of per message/burst."]
    return [f"WARNING: {n_periodic} pairs carry recurring traffic but none forms a training job (too few steps or "
            "traffic judged background). Check the window length against the jobs' step time."]


def withheld_jobs(steps_all: pl.DataFrame, cfg: FlowConfig) -> dict[str, str]:
    """{job_id: why} for the jobs whose reconstructed steps are not to be judged (by any detector).

    A job whose steps mostly stray from its typical step was not split reliably (its step gaps do
    not stand out: traffic streaming through the whole step). Typical of its level, which may shift
    once (stats.typical_split, on the job's per-step medians: a slowdown's onset is no straying);
    each address's steps are judged against the level of their side. A job whose period came from
    its flows' repetition at the step's scale (period.step_scale_period: its largest gaps are
    inside its steps) has no boundary to split at.

    And a job whose steps are not job-wide: every step of a synchronous job involves all its ranks,
    so its median step covers at least half of its addresses. Pieces of one collective are not: a
    job launched late in the window shows one all-reduce, whose ring chunks are evenly spaced and
    each ring's seen on its own addresses only (a 2,048-GPU healthy fleet: 17 ms "steps" of a
    3.7 s job, each on one ring of eight, read as a slowdown)."""
    out = {}
    if "streaming_period_ns" in steps_all.columns:
        for j, per in steps_all.filter(pl.col("streaming_period_ns").is_not_null()).group_by("job_id").agg(
                pl.col("streaming_period_ns").first()).iter_rows():
            out[j] = (f"its traffic streams through its steps (no quiet time marks where one ends: an FSDP job's "
                      f"all-gathers and reduce-scatters); its flows repeat every {per / 1e6:.0f} ms (its step, or one "
                      f"microbatch of it where the step adds little to that pattern: jobs.repeat_period_ns)")
    d = steps_all.filter("start_observed").with_columns(d=pl.col("end_ns") - pl.col("start_ns"))
    per_step = d.group_by("job_id", "job_step").agg(pl.col("d").median(), n=pl.col("ip").n_unique()).sort("job_id", "job_step")
    cuts = [(j, st[k] if k else None) for j, st, x in per_step.group_by("job_id", maintain_order=True).agg(
        pl.col("job_step"), pl.col("d")).iter_rows() for k in [typical_split(np.asarray(x), cfg.max_rel_spread, cfg.step_run)[1]]]
    cut = pl.DataFrame(cuts, schema={"job_id": pl.Utf8, "cut": d.schema["job_step"]}, orient="row")
    spread = d.join(cut, on="job_id", how="left").with_columns(seg=(pl.col("job_step") >= pl.col("cut")).fill_null(False)) \
        .with_columns(ref=pl.col("d").median().over("job_id", "seg")).group_by("job_id").agg(
        share=typical(pl.col("d"), pl.col("ref"), cfg.max_rel_spread).mean(), n=pl.len())
    for j in spread.filter((pl.col("share") < cfg.min_typical) & (pl.col("n") >= 4))["job_id"].to_list():
        out.setdefault(j, "its step boundaries do not stand out in its flows (most reconstructed steps stray from its typical step)")
    cover = per_step.join(steps_all.group_by("job_id").agg(n_ip=pl.col("ip").n_unique()), on="job_id") \
        .group_by("job_id").agg(cov=(pl.col("n") / pl.col("n_ip")).median(), n=pl.len())
    for j, c in cover.filter((pl.col("cov") < 0.5) & (pl.col("n") >= 4)).select("job_id", "cov").iter_rows():
        out.setdefault(j, f"its reconstructed steps are not job-wide (the median step is seen on {c:.0%} of its addresses)")
    return out
