"""NIC overload: a job that funnels a host's traffic through one of its NICs (issue 25, item 3).

A job whose launch pins the transport to one interface (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, a
gloo interface) sends every channel of every GPU on a host through that NIC: its collectives share
one NIC's bandwidth among all of the host's ranks while the host's other GPU NICs sit idle. Rates
against peers cannot see it (every host of the job is funnelled alike: the peers are as slow), and
nothing in a step changes (it is there from the launch on). What the flows do show is where the
job's traffic goes: on each of its hosts one NIC carries all of it, and the host's other NICs
carry no job's traffic at all.

No cut-off decides: the evidence is structural (the topology's NICs per host against the NICs
the job's pairs use). A job with one GPU per host on otherwise idle hosts looks the same; schedulers
hand multi-host jobs whole hosts (or equal shares of them), so the finding names both readings."""
from __future__ import annotations

import json

import polars as pl


def nic_overload_rows(pairs: pl.DataFrame, topology: pl.DataFrame | None, window: tuple[int, int],
                      wid: str) -> list[dict]:
    """Jobs that use exactly one NIC on each of their (>= 2) hosts while every one of those hosts has
    NICs that carry no job's traffic -> verdict rows (flows.nic_overload, scope job, team algorithm:
    the job's launch configuration). pairs: classify_pairs output (job_id, ip_a, ip_b, comm_type);
    topology: ip -> host."""
    if topology is None or topology.height == 0 or "host" not in topology.columns or pairs.height == 0:
        return []
    jp = pairs.filter(pl.col("job_id").is_not_null() & pl.col("comm_type").is_in(["DP", "PP"]))
    if jp.height == 0:
        return []
    ends = pl.concat([jp.select("job_id", ip="ip_a"), jp.select("job_id", ip="ip_b")]).unique()
    host = topology.filter(pl.col("host").is_not_null()).select("ip", "host").unique("ip")
    busy = ends["ip"].unique().implode()
    # per host: its NICs, and those that carry no job's traffic in the window
    h = host.group_by("host").agg(nics=pl.len(), idle=(~pl.col("ip").is_in(busy)).sum())
    per = ends.join(host, on="ip").group_by("job_id", "host").agg(used=pl.col("ip").n_unique(), ip=pl.col("ip").min()) \
        .join(h, on="host")
    jobs = per.group_by("job_id").agg(
        hosts=pl.len(), funnel=((pl.col("used") == 1) & (pl.col("idle") >= 1)).all(),
        ips=pl.col("ip").sort(), host_names=pl.col("host").sort(), nics=pl.col("nics").min(), idle=pl.col("idle").min())
    bad = jobs.filter((pl.col("hosts") >= 2) & pl.col("funnel")).sort("job_id")
    out = []
    for r in bad.iter_rows(named=True):
        out.append(dict(
            detector="flows.nic_overload", scope="job", subject=r["job_id"], job_id=r["job_id"],
            start_ns=int(window[0]), end_ns=int(window[1]), metric="nics_per_host", value=1.0,
            baseline=float(r["nics"]), severity="warning", team="algorithm", window_id=wid,
            evidence=json.dumps({"jobs": [r["job_id"]], "ips": r["ips"], "hosts": r["host_names"],
                                 "nics_per_host": r["nics"], "idle_nics_per_host": r["idle"]}),
            explanation=(f"job {r['job_id']} sends all of its traffic on each of its {r['hosts']} hosts through one NIC "
                         f"({', '.join(r['ips'][:4])}{' ...' if len(r['ips']) > 4 else ''}) while each host has "
                         f"{r['nics']} NICs and at least {r['idle']} of them carry no job's traffic: its launch pins the "
                         "transport to one interface (NCCL_IB_HCA / NCCL_SOCKET_IFNAME), so all of a host's ranks share "
                         "one NIC's bandwidth (or the job has one GPU per host on otherwise idle hosts)")))
    return out
