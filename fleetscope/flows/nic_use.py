"""NIC overload: a job that funnels a host's traffic through one of its NICs (issue 25, item 3).

A job whose launch pins the transport to one interface (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, a
gloo interface) sends every channel of every GPU on a host through that NIC: its collectives share
one NIC's bandwidth among all of the host's ranks while the host's other GPU NICs sit idle. Rates
against peers cannot see it (every host of the job is funnelled alike: the peers are as slow), and
nothing in a step changes (it is there from the launch on). What the flows do show is where the
job's traffic goes: on each of its hosts one NIC carries all of it, and the host's other NICs
carry no job's traffic at all.

Where the traffic goes is structural evidence (the topology's NICs per host against the NICs the
job's pairs use), but not enough alone: a job whose collectives are small may use one NIC per host
on purpose (NCCL picks few channels; one GPU per host), and costs nothing. What a funnel costs is
time on the one NIC: all of the host's traffic queues on it, so it is busy for a larger share of
the job's time than any NIC of a job that spreads its traffic. The finding is loud only when the
funnel NIC is busier (the union of its flows' spans over its active span) than the NICs of every
other job in the fleet: the fleet is the baseline, no nominal duty decides. Otherwise it is kept
as information."""
from __future__ import annotations

import json

import polars as pl

DETECTOR = "flows.nic_overload"


def nic_duty(flows: pl.DataFrame, jp: pl.DataFrame) -> pl.DataFrame:
    """Per NIC with job traffic: job_id, ip, duty = the union of its job flows' spans (sent or
    received) over the span from its first to its last one, and load = the bytes they moved per
    second of that span."""
    f = flows.join(jp.select("pid", "job_id"), on="pid")
    x = pl.concat([f.select("job_id", "bytes", ip="src_ip", s="start_ns", e="end_ns"),
                   f.select("job_id", "bytes", ip="dst_ip", s="start_ns", e="end_ns")]).sort("ip", "s")
    # a flow adds what it reaches past every earlier flow's end (the union of intervals, in one pass)
    x = x.with_columns(m=pl.col("e").cum_max().shift(1).over("ip"))
    added = (pl.col("e") - pl.max_horizontal("s", pl.col("m").fill_null(pl.col("s")))).clip(lower_bound=0)
    return x.group_by("job_id", "ip").agg(busy=added.sum(), span=pl.col("e").max() - pl.col("s").min(), b=pl.col("bytes").sum()) \
        .filter(pl.col("span") > 0).select("job_id", "ip", duty=pl.col("busy") / pl.col("span"),
                                            load=pl.col("b").cast(pl.Float64) / pl.col("span") * 1e9)


def _idle_confirmed(bad: pl.DataFrame, flows: pl.DataFrame, host: pl.DataFrame, jp: pl.DataFrame,
                    busy: pl.Series) -> pl.DataFrame:
    """Keep the jobs whose hosts' idle NICs (no job's endpoints: busy holds those) carry nothing like
    the job's traffic to the job's other hosts: at most control messages, storage or monitoring. A
    job the flows split by rail (each part on one NIC per host, its other parts unlabelled) has its
    other NICs moving as much between the same hosts as its own pairs do: not a funnel. The job's
    least-loaded pair is the yardstick."""
    least = flows.join(jp.select("pid", "job_id"), on="pid").group_by("job_id", "pid").agg(b=pl.col("bytes").sum()) \
        .group_by("job_id").agg(least=pl.col("b").min())
    # (the bytes each address moved to each peer host, summed before they meet the jobs' hosts: a record
    # joined per job sharing its host grew with jobs x records, 58 s at 8,192 GPUs)
    pair_bytes = flows.group_by("src_ip", "dst_ip").agg(pl.col("bytes").sum())
    ends = pl.concat([pair_bytes.select("bytes", ip="src_ip", peer="dst_ip"), pair_bytes.select("bytes", ip="dst_ip", peer="src_ip")]) \
        .join(host, on="ip").join(host.select(peer="ip", peer_host="host"), on="peer")
    jh = bad.select("job_id", host="host_names").explode("host").unique()
    # per job: idle NICs of its hosts and what they move to its other hosts
    reach = jh.join(ends, on="host").join(jh.select("job_id", peer_host="host"), on=["job_id", "peer_host"]) \
        .filter((pl.col("peer_host") != pl.col("host")) & ~pl.col("ip").is_in(busy)) \
        .group_by("job_id", "ip").agg(b=pl.col("bytes").sum()).join(least, on="job_id") \
        .filter(pl.col("b") >= pl.col("least"))
    return bad.join(reach.select("job_id").unique(), on="job_id", how="anti")


def nic_overload_rows(flows: pl.DataFrame, pairs: pl.DataFrame, topology: pl.DataFrame | None,
                      window: tuple[int, int], wid: str) -> list[dict]:
    """Jobs that use exactly one NIC on each of their (>= 2) hosts while every one of those hosts has
    NICs that carry no job's traffic -> verdict rows (flows.nic_overload, scope job, team algorithm:
    the job's launch configuration); warning when the funnel NICs are busier than every other job's
    NICs, else info. flows: the window's flows with their pair key pid; pairs: classify_pairs output
    (pid, job_id, ip_a, ip_b, comm_type); topology: ip -> host."""
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
    if bad.height == 0:
        return []
    bad = _idle_confirmed(bad, flows, host, jp, busy)
    if bad.height == 0:
        return []
    duty = nic_duty(flows, jp).group_by("job_id").agg(pl.col("duty", "load").median(), load_max=pl.col("load").max())
    d = dict(zip(duty["job_id"].to_list(), duty["duty"].to_list()))
    ld = dict(zip(duty["job_id"].to_list(), duty["load"].to_list()))
    ld_max = dict(zip(duty["job_id"].to_list(), duty["load_max"].to_list()))
    # the other jobs on each job's hosts
    jh = per.select("job_id", "host").unique()
    co: dict[str, set] = {}
    for a, b in jh.join(jh, on="host").filter(pl.col("job_id") != pl.col("job_id_right")).select("job_id", "job_id_right").unique().iter_rows():
        co.setdefault(a, set()).add(b)
    out = []
    for r in bad.iter_rows(named=True):
        own = d.get(r["job_id"])
        others = [v for j, v in d.items() if j != r["job_id"]]
        ref = max(others) if others else None
        # ... and, beside other jobs on its hosts, it moves more per second than any NIC of theirs: all
        # of its host's traffic is on it. A NIC busy longer for the same bytes as its neighbours' is
        # slowed, not funnelled (a job's rail behind a congested switch, recognized apart from the rest
        # of its job on the same hosts in one window: demo seed 728). Jobs elsewhere are no yardstick
        # for bytes: a heavier job's NICs move more without a funnel (64-GPU seed 2173)
        near = co.get(r["job_id"], set())
        ref_load = max((ld_max[j] for j in near if j in ld_max), default=None)
        loud = own is not None and ref is not None and own > ref and (
            ref_load is None or (ld.get(r["job_id"]) is not None and ld[r["job_id"]] > ref_load))
        cost = (f"its NICs are busy {own:.0%} of the time, more than any NIC of the fleet's other {len(others)} jobs "
                f"(at most {ref:.0%})" if loud else
                f"its NICs are busy {own:.0%} of the time, " + (f"no more than the busiest NICs of the fleet's other jobs "
                                                                 f"({ref:.0%}): no cost seen" if ref is not None else
                                                                 "with no other job to compare")) if own is not None else \
            "its NICs' use could not be measured"
        out.append(dict(
            detector=DETECTOR, scope="job", subject=r["job_id"], job_id=r["job_id"],
            start_ns=int(window[0]), end_ns=int(window[1]), metric="nic_duty", value=own,
            baseline=ref, severity="warning" if loud else "info", team="algorithm", window_id=wid,
            evidence=json.dumps({"jobs": [r["job_id"]], "ips": r["ips"], "hosts": r["host_names"],
                                 "nics_per_host": r["nics"], "idle_nics_per_host": r["idle"]}),
            explanation=(f"job {r['job_id']} sends all of its traffic on each of its {r['hosts']} hosts through one NIC "
                         f"({', '.join(r['ips'][:4])}{' ...' if len(r['ips']) > 4 else ''}) while each host has "
                         f"{r['nics']} NICs and at least {r['idle']} of them carry no job's traffic; {cost}: "
                         + ("its launch pins the transport to one interface (NCCL_IB_HCA / NCCL_SOCKET_IFNAME), so all of "
                            "a host's ranks share one NIC's bandwidth" if loud else
                            "a launch pinned to one interface, or a job whose collectives need no more"))))
    return out
