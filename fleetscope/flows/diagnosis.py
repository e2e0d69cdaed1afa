"""Flow verdicts (LLMPrism IV-D): cross-step, cross-group, switch-level and per-NIC diagnosis,
plus late GPUs, all through fleetscope.findings.verdicts.make_verdicts.

k-sigma as in the paper (k = 3), made robust: baseline = median, sigma = 1.4826 * MAD, so the
straggler being judged cannot inflate the deviation it is judged by; a relative floor
(min_rel_excess) keeps the jitter of a perfectly regular job from being an anomaly.

Cross-step and job life events: fleetscope.flows.job_health; NICs, switches and flapping links:
fleetscope.flows.network (rates against peers and history, bars from the false-alarm budget); ranks
that compute late (their messages leave after their DP-group peers'): fleetscope.flows.late_ranks;
jobs that funnel a host's traffic through one NIC: fleetscope.flows.nic_use.
Job-level findings a localized cause explains are kept as info."""
from __future__ import annotations

import json

import polars as pl

from fleetscope.common import robust_sigma
from fleetscope.flows.config import FlowConfig
from fleetscope.flows.job_health import job_health
from fleetscope.flows.late_ranks import late_rank_rows
from fleetscope.flows.network import network_verdicts
from fleetscope.flows.nic_use import DETECTOR as NIC_OVERLOAD, nic_overload_rows
from fleetscope.findings.verdicts import make_verdicts



def robust_high(x: pl.Expr, k: float, min_rel: float, base: pl.Expr | None = None) -> pl.Expr:
    """x above median + max(k * robust sigma, min_rel * |median|) (use inside a context)."""
    med = x.median() if base is None else base
    sig = robust_sigma(x)
    return x > med + pl.max_horizontal(k * sig, min_rel * med.abs())


def _cross_group(st: pl.DataFrame, pairs: pl.DataFrame, wid: str, cfg: FlowConfig) -> list[dict]:
    dp = pairs.filter(pl.col("comm_type") == "DP")
    if dp.height == 0:
        return []
    grp = pl.concat([dp.select("job_id", ip="ip_a", g="dp_group"), dp.select("job_id", ip="ip_b", g="dp_group")]).unique()
    s = st.filter(pl.col("dp_start_ns").is_not_null()).join(grp, on=["job_id", "ip"])
    # DP time of a group in a step: from its last member's entry (its first send) to the end, so a
    # late member (compute) does not count as a slow network
    gs = s.group_by("job_id", "g", "job_step").agg(
        dur=pl.col("dp_end_ns").max() - pl.coalesce(pl.col("dp_send_start_ns"), pl.col("dp_start_ns")).max(),
        s=pl.col("dp_start_ns").min(), e=pl.col("dp_end_ns").max())
    g = gs.group_by("job_id", "g").agg(dur=pl.col("dur").median(), s=pl.col("s").min(), e=pl.col("e").max(),
                                       n=pl.len())
    g = g.filter(pl.col("n") >= cfg.min_steps_for_verdict).with_columns(
        med=pl.col("dur").median().over("job_id"),
        sig=robust_sigma(pl.col("dur")).over("job_id"),
        ng=pl.len().over("job_id"))
    bad = g.filter((pl.col("ng") >= 3) & (pl.col("dur") > pl.col("med") + pl.max_horizontal(
        cfg.k_sigma * pl.col("sig"), cfg.min_rel_excess * pl.col("med"))))
    return [dict(detector="flows.cross_group", scope="dp_group", subject=f"{r['job_id']}/dp{r['g']}",
                 job_id=r["job_id"], start_ns=r["s"], end_ns=r["e"], metric="dp_comm_ns", value=float(r["dur"]),
                 baseline=float(r["med"]), severity="info", team="operations", window_id=wid,
                 explanation=f"DP group {r['g']} of {r['job_id']} spends {r['dur'] / 1e6:.2f} ms per step in its "
                             f"collective vs {r['med'] / 1e6:.2f} ms for the job's other groups")
            for r in bad.iter_rows(named=True)]


def _oversubscription(flows: pl.DataFrame, pairs: pl.DataFrame, topo: pl.DataFrame, wid: str, cfg: FlowConfig) -> list[dict]:
    """Peak concurrent DP flows per switch (sweep line) against its capacity: configured, else
    dp_flows_per_nic x the NICs under it (a leaf: its NICs; a spine: the NICs of its leaves)."""
    f = flows.join(pairs.filter(pl.col("comm_type") == "DP").select("pid"), on="pid")
    f = f.filter(pl.col("path").is_not_null())
    if f.height == 0:
        return []
    x = f.select("start_ns", "end_ns", sw=pl.col("path")).explode("sw")
    ev = pl.concat([x.select("sw", t=pl.col("start_ns"), d=pl.lit(1)), x.select("sw", t=pl.col("end_ns"), d=pl.lit(-1))])
    ev = ev.sort("sw", "t", "d").with_columns(c=pl.col("d").cum_sum().over("sw"))
    peak = ev.group_by("sw").agg(peak=pl.col("c").max(), t=pl.col("t").filter(pl.col("c") == pl.col("c").max()).first())
    nics = pl.concat([topo.group_by(sw=pl.col("leaf")).agg(nics=pl.len()),
                      topo.group_by(sw=pl.col("spine")).agg(nics=pl.len())]).filter(pl.col("sw").is_not_null())
    peak = peak.join(nics, on="sw", how="left").with_columns(
        cap=pl.lit(cfg.switch_dp_flow_capacity, dtype=pl.Int64) if cfg.switch_dp_flow_capacity
        else (pl.col("nics") * cfg.dp_flows_per_nic))
    bad = peak.filter(pl.col("cap").is_not_null() & (pl.col("peak") > pl.col("cap")))
    return [dict(detector="flows.switch_oversubscription", scope="switch", subject=r["sw"], job_id=None,
                 start_ns=r["t"], end_ns=r["t"], metric="concurrent_dp_flows", value=float(r["peak"]),
                 baseline=float(r["cap"]), severity="warning", team="operations", window_id=wid,
                 explanation=f"switch {r['sw']} carried {r['peak']} concurrent DP flows, more than the {r['cap']} "
                             "it can carry at line rate: placement or parallel layout oversubscribes it")
            for r in bad.iter_rows(named=True)]


def flow_verdicts(tables: dict[str, pl.DataFrame], flows: pl.DataFrame, topology: pl.DataFrame, window_id: str,
                  cfg: FlowConfig, ipf: pl.DataFrame | None = None, pairs: pl.DataFrame | None = None,
                  steps_all: pl.DataFrame | None = None, ipf_all: pl.DataFrame | None = None,
                  bg_ip: pl.DataFrame | None = None, data_span: tuple[int, int] | None = None,
                  window: tuple[int, int] | None = None, history: pl.DataFrame | None = None,
                  levels_out: dict | None = None, suspects: set[str] | None = None) -> pl.DataFrame:
    """All flow verdicts of a window. flows: the window's in-topology flows with ip_a/ip_b and the
    pair key pid; pairs: classify_pairs output (with pid; default tables["comm_pairs"]);
    ipf: timelines.ip_flows of them (PP timing), optional; steps_all / ipf_all: steps and ip flows
    of window + margin (the jobs' history); bg_ip: GPU addresses' non-job traffic; history: the pairs'
    rates in earlier windows (flow_pair_rates); levels_out: receives this window's ("levels");
    suspects: the elements earlier windows named (network.localize's prior)."""
    st = tables["step_timelines"]
    pairs = tables["comm_pairs"] if pairs is None else pairs
    rows = []
    if st.height:
        if steps_all is not None and window is not None:
            jr, _ = job_health(steps_all, ipf_all if ipf_all is not None else ipf, bg_ip if bg_ip is not None else
                               pl.DataFrame(schema={"ip": pl.Utf8, "start_ns": pl.Int64, "end_ns": pl.Int64, "bytes": pl.Int64}),
                               data_span or window, window[0], window[1], window_id, cfg)
            rows += jr
        rows += _cross_group(st, pairs, window_id, cfg)
        if ipf_all is not None or ipf is not None:
            # the margin's steps too: the onset's baseline where a fault begins with the window
            lag_steps = st
            if steps_all is not None and window is not None and "claimed" in steps_all.columns:
                lag_steps = pl.concat([steps_all.filter(~pl.col("claimed") & (pl.col("start_ns") < window[0])).select(st.columns), st])
            rows += late_rank_rows(lag_steps, ipf_all if ipf_all is not None else ipf, pairs, topology,
                                   max(tables["jobs"].height, 1) if "jobs" in tables else 1,
                                   window or (int(st["start_ns"].min()), int(st["end_ns"].max()) + 1), window_id, cfg,
                                   suspects=suspects)
    if pairs.height:
        n_jobs = max(tables["jobs"].height, 1) if "jobs" in tables else 1
        win = window or (int(flows["start_ns"].min()), int(flows["end_ns"].max()) + 1) if flows.height else (0, 1)
        rows += network_verdicts(flows, pairs, n_jobs, win, window_id, cfg,
                                 history=history, levels_out=levels_out, suspects=suspects)
        if cfg.switch_dp_flow_capacity:
            rows += _oversubscription(flows, pairs, topology, window_id, cfg)
        rows += nic_overload_rows(flows, pairs, topology, win, window_id)
    impact = (lambda c, job: network_impact(c, job, flows, pairs, st)) if pairs.height and st.height else None
    feeds = (lambda c, ips: inputs_cross(c, ips, flows, pairs)) if pairs.height else None
    return make_verdicts(explain_symptoms(explain_late_ranks(rows, impact, feeds, resolution_ns=cfg.diag_bin_ns)))


def inputs_cross(c: dict, ips: set, flows: pl.DataFrame, pairs: pl.DataFrame) -> bool:
    """Whether pipeline inputs of the addresses ips (PP flows into them) cross switch c during its span."""
    if c["scope"] != "switch" or "path" not in flows.columns or not ips:
        return False
    pp = pairs.filter(pl.col("comm_type") == "PP").select("pid")
    f = flows.join(pp, on="pid").filter(pl.col("dst_ip").is_in(list(ips)) & (pl.col("start_ns") >= c["start_ns"])
                                        & (pl.col("start_ns") <= c["end_ns"]) & pl.col("path").is_not_null())
    return f.height > 0 and bool(f.select(pl.col("path").list.contains(c["subject"]).any()).item())


def network_impact(c: dict, job: str, flows: pl.DataFrame, pairs: pl.DataFrame, st: pl.DataFrame) -> float | None:
    """What a NIC or switch rate finding costs one job per step: the extra transfer time of the job's
    flows through it (duration x (1 - rate vs peers)) over the job's steps in its span, in ns; None
    where the finding is no rate (stalls)."""
    if c["detector"] not in ("flows.nic_bandwidth", "flows.switch_bandwidth") or not c.get("value"):
        return None
    f = flows.join(pairs.filter(pl.col("job_id") == job).select("pid"), on="pid").filter(
        (pl.col("start_ns") >= c["start_ns"]) & (pl.col("start_ns") <= c["end_ns"]))
    through = (pl.col("src_ip") == c["subject"]) | (pl.col("dst_ip") == c["subject"]) if c["scope"] == "link" \
        else pl.col("path").list.contains(c["subject"])
    extra = f.filter(through).select(((pl.col("end_ns") - pl.col("start_ns")) * (1 - c["value"])).sum()).item() or 0.0
    n = st.filter((pl.col("job_id") == job) & (pl.col("end_ns") >= c["start_ns"]) & (pl.col("start_ns") <= c["end_ns"])) \
        ["job_step"].n_unique()
    return float(extra) / max(n, 1)


def explain_late_ranks(rows: list[dict], impact=None, feeds=None, resolution_ns: int | None = None) -> list[dict]:
    """Late ranks against the NIC and switch findings of their job at the same time: the one that
    costs the job's steps less is the other's symptom (info, pointing at it; a finding that slowed
    other jobs too stays a cause of its own). A rank that computes
    late slows its rings (its peers wait, its inputs drain late): a rate finding on its job costing
    a few ms per step is its effect; a slow link makes the ranks behind it start late by about its
    extra transfer time: a late rank by no more than that is the link's. A switch that the late
    rank's own pipeline inputs cross is the cause whatever its average cost: the rank waits for
    activations the switch delays, microbatch after microbatch, which the lag (measured from when the
    inputs start) counts as its own. impact(c, job): the finding's cost per step (network_impact);
    unknown (a stall finding, no flows): the late rank yields. feeds(c, ips): whether the rank's
    pipeline inputs cross switch c (inputs_cross).

    A cause comes before its effect: a rank late from steps before a rate finding began (by more than
    the finding's time resolution, resolution_ns: its bins) did not become late through it, and a rate
    finding that began after the rank was late is not the rank's waiting either; both stay causes
    (64-GPU seed 2643: a straggler late from the window's start, a congested leaf flagged 30 s later;
    the leaf's summed extra transfer time, 1.5 s per step, made the straggler its symptom). Only rate
    findings whose onsets fall together are weighed against each other. Stalls and switches the rank's
    inputs cross are not timed so: a stall finding starts at its first stall, and a congested spine
    under a real pipeline made a rank late before its first stall (the recording pp2dp2+dp2-congested
    of flow_faults/seed9).

    A job whose traffic is funnelled through one NIC per host (a loud NIC-overload finding) queues its
    ranks' sends on that NIC: some of them leave a few ms after their DP peers' every step, however fast
    the GPUs compute (64-GPU seed 2664: three ranks of such a job "late" by 0.9-3.9 ms, at z in the
    thousands). Its late ranks are the funnel's symptoms."""
    funnel = {r["job_id"] for r in rows if r["detector"] == NIC_OVERLOAD and r["severity"] != "info" and r.get("job_id")}
    for r in rows:
        if r["detector"] == "flows.late_rank" and r["severity"] != "info" and r.get("job_id") in funnel:
            r["severity"] = "info"
            r["explanation"] += (f" (job {r['job_id']} sends through one NIC per host: its ranks' sends queue there, and "
                                 "that may be the wait)")
    net = [r for r in rows if r["scope"] in ("link", "switch") and r["severity"] != "info"
           and r["detector"] != "flows.late_rank"]

    def jobs(c: dict) -> set:
        return set(json.loads(c.get("evidence") or "{}").get("jobs") or []) | ({c["job_id"]} if c.get("job_id") else set())

    for r in [r for r in rows if r["detector"] == "flows.late_rank" and r["severity"] != "info"]:
        ips = set(json.loads(r.get("evidence") or "{}").get("ips", []))
        for c in net:
            if not (r["start_ns"] <= c["end_ns"] and r["end_ns"] >= c["start_ns"]) or \
                    (c["subject"] not in ips and r.get("job_id") not in jobs(c)):
                continue
            cost = impact(c, r["job_id"]) if impact is not None else None
            fed = feeds is not None and feeds(c, ips)
            if cost is not None and not fed and resolution_ns is not None and abs(r["start_ns"] - c["start_ns"]) > resolution_ns:
                continue
            if cost is not None and r["value"] > cost and not fed:
                # ... for the late rank's job only: a finding that slowed another job too has that job's
                # slowdown as evidence of its own (demo seed 613: a congested leaf under two jobs, one with
                # a slow GPU, was set to info and the other job's slowdown left unexplained)
                if jobs(c) - {r["job_id"]}:
                    continue
                c["severity"] = "info"
                c["explanation"] += (f" (its extra transfer time, {cost / 1e6:.1f} ms per step of {r['job_id']}, is less than "
                                     f"{r['scope']} {r['subject']} starting {r['value'] / 1e6:.1f} ms late: the rings wait on it)")
            else:
                r["severity"] = "info"
                r["explanation"] += (f" (its job's traffic is slowed at the same time by {c['scope']} {c['subject']}"
                                     + (f", {cost / 1e6:.1f} ms per step" if cost is not None else "")
                                     + (", which its pipeline inputs cross" if fed else "") + ": it may wait on it)")
                break
    return rows


def explain_symptoms(rows: list[dict]) -> list[dict]:
    """Job-level findings of a job a localized cause (a NIC, a switch, a GPU) already explains are
    its symptoms: kept as info, pointing at the cause."""
    causes = [r for r in rows if r["scope"] in ("switch", "link", "gpu", "host") and r["severity"] != "info"]
    if not causes:
        return rows
    for r in rows:
        # a job's own launch configuration (its NICs) is a cause, not a symptom
        if r["scope"] not in ("job", "dp_group", "step") or r["severity"] == "info" or r["detector"] == NIC_OVERLOAD:
            continue
        for c in causes:
            jobs = json.loads(c.get("evidence") or "{}").get("jobs", []) + ([c["job_id"]] if c.get("job_id") else [])
            if r.get("job_id") in jobs and r["start_ns"] <= c["end_ns"] and r["end_ns"] >= c["start_ns"]:
                r["severity"] = "info"
                r["explanation"] += f" (explained by {c['scope']} {c['subject']})"
                break
    return rows
