"""Late ranks: compute faults seen in flows (issue 25, item 2).

A GPU that computes slowly (a slow or throttled GPU, a straggling process, a busy host) moves no
byte slower: its flows keep their rate, so the rate tomography (fleetscope.flows.network) cannot
see it. What it changes is *when* its traffic leaves: every step, its first message (the next
stage's activation, its first gradient bucket) leaves later than its same-stage peers' (the
members of its DP group, which run the same code on the same shapes), while they wait for it.

Per step and rank, the own lag is how much later its first sent message leaves than its DP-group
peers' (the median of the others'), less how much later its first pipeline input arrived than
theirs (a stage behind a slow one inherits its delay: that is waiting, not computing). A rank is
late when its own lag is positive step after step: Yuen's trimmed-mean test over the window's
steps (trimmed: a checkpoint or a collective hiccup in one step is not a pattern), its bar from
the detector's false-alarm budget over every rank tested (Bonferroni, fleetscope.flows.stats).

A pipeline replica holding a slow stage is late on every stage (the others wait in turn); the
stage named is the one with the largest own lag, its pipeline neighbours' lags are its symptoms.
Several late ranks of one host at once (a tensor-parallel group shares one slow GPU's delay, a
host's CPU or PCIe slows all its GPUs) name the host: which of its GPUs holds the group back is
not in the flows."""
from __future__ import annotations

import json

import numpy as np
import polars as pl

from fleetscope.flows.config import FlowConfig
from fleetscope.common import robust_sigma
from fleetscope.flows.stats import bonferroni_z, fmt_ms, window_alpha

# the shortest run of steps a rank must be late in (one or two late steps are hiccups, not a pattern)
MIN_RUN = 5

LAG_SCHEMA = {"job_id": pl.Utf8, "ip": pl.Utf8, "g": pl.Int64, "job_step": pl.Int64, "start_ns": pl.Int64,
              "end_ns": pl.Int64, "lag": pl.Float64, "end_lag": pl.Float64}


def _others_median(x: str, by: list[str]) -> pl.Expr:
    """The median of x over the group's other members (with two members: the other one; with more,
    the group's median, which one member moves little)."""
    n = pl.col(x).count().over(by)
    return pl.when(n == 2).then(pl.col(x).sum().over(by) - pl.col(x)).when(n >= 3).then(pl.col(x).median().over(by))


def rank_lags(steps: pl.DataFrame, ipf: pl.DataFrame, pairs: pl.DataFrame, min_bytes: int = 0) -> pl.DataFrame:
    """steps: step rows (job_id, ip, job_step, start_ns, end_ns); ipf: timelines.ip_flows rows;
    pairs: labeled pairs with dp_group; min_bytes: a data message's least size (config
    min_data_bytes). -> per (job_id, ip, job_step) the own lag in ns (LAG_SCHEMA),
    for ranks in a DP group of >= 2 members that sent in the step."""
    dp = pairs.filter((pl.col("comm_type") == "DP") & pl.col("dp_group").is_not_null())
    if steps.height == 0 or ipf.height == 0 or dp.height == 0:
        return pl.DataFrame(schema=LAG_SCHEMA)
    grp = pl.concat([dp.select("job_id", ip="ip_a", g="dp_group"), dp.select("job_id", ip="ip_b", g="dp_group")]).unique(
        ["job_id", "ip"])
    s = steps.select("job_id", "ip", "job_step", "start_ns", "end_ns").join(grp, on=["job_id", "ip"])
    # each message to the step of its rank that holds it, when it started: a send when the rank had
    # it ready, a pipeline input when its sender had (its end is late when the receiver, busy,
    # drains it late: that delay is the receiver's own)
    key = ["job_id", "ip", "job_step"]
    ev = pl.concat([
        ipf.filter(pl.col("role") == "send").select("job_id", "ip", "packets", t="start_ns", inp=pl.lit(False),
                                                    data=pl.col("bytes") >= min_bytes),
        # pipeline inputs: data only (a transport's control messages carry no activation)
        ipf.filter((pl.col("role") == "recv") & (pl.col("comm_type") == "PP") & (pl.col("bytes") >= min_bytes))
        .select("job_id", "ip", "packets", t="start_ns", inp=pl.lit(True), data=pl.lit(True)),
    ]).sort("t")
    at = ev.join_asof(s.sort("start_ns").select("job_id", "ip", "job_step", "start_ns", "end_ns"), left_on="t",
                      right_on="start_ns", by=["job_id", "ip"], strategy="backward", check_sortedness=False) \
        .filter(pl.col("job_step").is_not_null() & (pl.col("t") < pl.col("end_ns")))
    # its arrival: the first message it sends in the step, small ones included (over gloo's or NCCL's
    # rendezvous a rank announces it is ready, and a collective's data leaves only once every peer
    # is: the data starts together, the announcement does not), but not a lone packet (the last
    # collective's acknowledgements and probes spill past the step's boundary; timelines likewise)
    sends = at.filter(~pl.col("inp") & (pl.col("data") | (pl.col("packets").fill_null(2) > 1)))
    first = at.filter("inp").group_by(key).agg(r1=pl.col("t").min())
    # ... and its first send after its first input (below)
    arrival = sends.join(first, on=key, how="left").group_by(key).agg(
        s0=pl.col("t").min(), s_in=pl.col("t").filter(pl.col("t") > pl.col("r1")).min())
    first = first.join(arrival, on=key, how="right")
    by = ["job_id", "g", "job_step"]
    x = s.join(first, on=["job_id", "ip", "job_step"]).filter(pl.col("s0").is_not_null())
    # a rank of a stage that receives its pipeline input before it sends anything (every stage but
    # the first) sends nothing of a step before that input: a send before it is the previous step's
    # tail (a slow rank's last backward message leaves after its DP group's step boundary), and taken
    # for its arrival it makes the rank early and its punctual peers late by most of a step. Its
    # arrival is then its first send after its input, where its peers (the others of its group: its own
    # tail cannot decide it) receive before they send, and that send is nearer their first sends (a
    # first stage's rank whose peer got such a tail as "input" keeps its first send)
    x = x.with_columns(rf=(pl.col("r1") < pl.col("s0")).fill_null(False).cast(pl.Float64)).with_columns(
        peers_rf=_others_median("rf", by), ref_s0=_others_median("s0", by).cast(pl.Float64))
    x = x.with_columns(s1=pl.when((pl.col("peers_rf") > 0.5) & pl.col("s_in").is_not_null() & (
        (pl.col("s_in") - pl.col("ref_s0")).abs() < (pl.col("s0") - pl.col("ref_s0")).abs())).then("s_in").otherwise("s0"))
    # an input counts only when it came before the rank's first send (it waited for it)
    x = x.with_columns(r1=pl.when(pl.col("r1") < pl.col("s1")).then("r1"))
    x = x.with_columns(s1=pl.col("s1").cast(pl.Float64), r1=pl.col("r1").cast(pl.Float64))
    x = x.with_columns(e1=pl.col("end_ns").cast(pl.Float64))
    x = x.with_columns(ref_s=_others_median("s1", by), ref_r=_others_median("r1", by), ref_e=_others_median("e1", by))
    lag = (pl.col("s1") - pl.col("ref_s")) - pl.when(pl.col("r1").is_not_null() & pl.col("ref_r").is_not_null()).then(
        pl.col("r1") - pl.col("ref_r")).otherwise(0.0)
    # end_lag: how much later its step ends than its peers' (their collective ends together when the
    # group is one; a late member's peers wait for it)
    return x.filter(pl.col("ref_s").is_not_null()).with_columns(lag=lag, end_lag=pl.col("e1") - pl.col("ref_e")) \
        .select(list(LAG_SCHEMA))


def late_ranks(lags: pl.DataFrame, n_jobs: int, window: tuple[int, int], cfg: FlowConfig,
               known: set[str] | None = None) -> pl.DataFrame:
    """rank_lags rows of the window's steps -> per rank late for a run of steps: job_id, ip, g, n
    (steps in the run), lag (its median, ns), z (the run's statistic), z_bar, s, e (the run's span),
    p (the job's median step, ns).

    A fault may last part of a window and start anywhere in it: each rank's lag series is scanned
    for runs of MIN_RUN, 2 x MIN_RUN, 4 x MIN_RUN ... steps (rolling medians: a checkpoint or a
    collective hiccup in one step of a run is not a pattern). The noise scale is the rank's own
    step-to-step jitter (the spread of successive differences: an onset, or a lag present all along,
    does not inflate it). Bonferroni over every run of every rank tested, within the detector's
    false-alarm budget for the window. known: addresses an earlier window named late (they need no
    onset in this one). The lags may include steps of the window's margin (the job's steps just
    before the window): they are the onset's baseline, never a run of their own (a run must end in the
    window; its span is the window's part)."""
    empty = pl.DataFrame(schema={"job_id": pl.Utf8, "ip": pl.Utf8, "g": pl.Int64, "n": pl.Int64, "lag": pl.Float64,
                                 "z": pl.Float64, "z_bar": pl.Float64, "s": pl.Int64, "e": pl.Int64, "p": pl.Float64})
    key = ["job_id", "ip", "g"]
    x = lags.sort(*key, "job_step").with_columns(
        k=pl.int_range(pl.len()).over(key), n=pl.len().over(key), dl=pl.col("lag").diff().over(key))
    x = x.filter(pl.col("n") >= MIN_RUN)
    if x.height == 0:
        return empty
    # jitter: robust spread of successive differences / sqrt(2), never below 1 us (clock resolution)
    x = x.with_columns(sig=pl.max_horizontal(pl.lit(1e3), robust_sigma(pl.col("dl")) / np.sqrt(2)).over(key))
    runs, n_tests = [], 0
    n_of = x.group_by(key).agg(n=pl.first("n"))["n"].to_numpy()
    L = MIN_RUN
    while L <= int(n_of.max()):
        # runs that end in the window (the margin's steps are baseline only)
        n_tests += x.filter((pl.col("n") >= L) & (pl.col("k") >= L - 1) & (pl.col("start_ns") >= window[0])).height
        # the median's standard error is sqrt(pi / 2) times the mean's
        r = x.filter(pl.col("n") >= L).with_columns(
            med=pl.col("lag").rolling_median(L).over(key)).with_columns(
            z=pl.col("med") / pl.col("sig") * np.sqrt(L / (np.pi / 2)), L=pl.lit(L))
        runs.append(r.filter(pl.col("med").is_not_null() & (pl.col("start_ns") >= window[0])).select(*key, "k", "L", "z", "med"))
        L *= 2
    alpha = window_alpha(cfg.fa_per_job_hour, n_jobs, window[1] - window[0])
    z_bar = bonferroni_z(alpha, n_tests)
    hit = pl.concat(runs).filter(pl.col("z") > z_bar)
    if hit.height == 0:
        return empty
    # per rank its strongest run; its median lag, and its span: the run's steps late by more than half
    # of it (a run of 2^j steps may reach past the fault's onset or end)
    best = hit.sort("z", descending=True).group_by(key, maintain_order=True).first()
    # ... and it sets the job's pace: the run's steps are longer than the rank's others, to the same
    # bar: its peers wait, so the job's steps slow (by the lag, or by more where the rank is late in
    # every microbatch: a pipeline stage's first send lags by one microbatch's delay, its step by all
    # of them) against their own step-to-step jitter outside the run (the run's steps, and the step
    # after it, would count the fault in its noise). A loaded host's few-millisecond lag leaves the
    # steps within their noise. With too few steps outside the run to compare, the lag itself must
    # exceed the job's step-to-step jitter (the same robust spread over all its ranks' steps), unless
    # an earlier window named the rank (its run there had the steps before it).
    jit = x.with_columns(dd=(pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64).diff().over(key)).group_by(key).agg(
        j=robust_sigma(pl.col("dd")) / np.sqrt(2)).group_by("job_id").agg(jitter=pl.col("j").median())
    d = x.with_columns(d=(pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)).with_columns(
        dd=pl.col("d").diff().over(key)).join(best.select(*key, k_end="k", L="L"), on=key).with_columns(
        run=(pl.col("k") > pl.col("k_end") - pl.col("L")) & (pl.col("k") <= pl.col("k_end")))
    outside = ~pl.col("run") & (pl.col("k") != pl.col("k_end") + 1)
    slow = d.group_by(key).agg(
        nq=pl.col("dd").filter(outside).drop_nulls().len(),
        qj=pl.max_horizontal(pl.lit(1e3), robust_sigma(pl.col("dd").filter(outside)) / np.sqrt(2)),
        more=pl.col("d").filter("run").median() - pl.col("d").filter(~pl.col("run")).median())
    best = best.join(slow, on=key, how="left").join(jit, on="job_id", how="left").filter(
        pl.when(pl.col("nq").fill_null(0) < MIN_RUN).then((pl.col("med") > pl.col("jitter")) | pl.col("ip").is_in(list(known or ())))
        .otherwise(pl.col("more") / pl.col("qj") * (pl.col("L") / (np.pi / 2)).sqrt() > z_bar)
    ).drop("nq", "qj", "more", "jitter")
    span = x.join(best.select(*key, "med", k_end="k", L="L"), on=key).filter(
        (pl.col("k") > pl.col("k_end") - pl.col("L")) & (pl.col("k") <= pl.col("k_end")) & (pl.col("lag") > pl.col("med") / 2)
        & (pl.col("start_ns") >= window[0])
    ).group_by(key).agg(n=pl.len().cast(pl.Int64), lag=pl.col("lag").median(), end_lag=pl.col("end_lag").median(),
                        s=pl.col("start_ns").min(), e=pl.col("end_ns").max())
    # the peers wait: the member that starts late finishes the step with them (a collective ends
    # together). A member late at both ends by as much is not in the same collective as its "peers"
    # (a pipeline hop taken for a DP pair: the stages' steps are offset, not waiting on each other)
    # ... and by less than half a step: steps of one job are matched across its ranks by ending within
    # half a step (timelines), so a larger lag cannot be told from a step taken for its neighbour
    per = x.with_columns(d=pl.col("end_ns") - pl.col("start_ns")).group_by("job_id").agg(p=pl.col("d").median().cast(pl.Float64))
    span = span.join(per, on="job_id").filter(
        (pl.col("end_lag").abs() < pl.col("lag") / 2) & (pl.col("n") >= MIN_RUN) & (pl.col("lag") < pl.col("p") / 2))
    # an onset: the rank was not late before the run, in at least MIN_RUN steps of the window and its
    # margin (the job's own history is the baseline: a constant offset between "peers" from the job's
    # start is their layout, or a pipeline hop taken for a DP pair), unless an earlier window named it
    before = x.join(span.select(*key, "lag", s0="s"), on=key).filter(pl.col("start_ns") < pl.col("s0")).group_by(key).agg(
        nb=pl.len(), lb=pl.col("lag").median())
    span = span.join(before, on=key, how="left").filter(
        ((pl.col("nb").fill_null(0) >= MIN_RUN) & (pl.col("lb").abs() < pl.col("lag") / 4))
        | pl.col("ip").is_in(list(known or ())))
    # ... and late by more than the job's other DP groups' members differ from their peers in any one
    # step (their per-step lags' robust spread, to the same bar): a lag its own series holds steadily
    # but that the job's punctual ranks show as often is how this job's sends line up (the order a
    # collective's chunks leave in), not a rank holding its peers back. A job of one DP group has no
    # such reference and keeps the tests above.
    if span.height:
        groups = x.select("job_id", "g", "lag")
        ref = span.select("job_id", "g").unique().join(groups.rename({"g": "g_o"}), on="job_id") \
            .filter(pl.col("g_o") != pl.col("g")).group_by("job_id", "g").agg(ref=robust_sigma(pl.col("lag")))
        span = span.join(ref, on=["job_id", "g"], how="left").filter(
            pl.col("ref").is_null() | (pl.col("lag") > z_bar * pl.col("ref")))
    return span.join(best.select(*key, "z"), on=key).with_columns(z_bar=pl.lit(z_bar)).select(list(empty.columns))


def late_rank_verdicts(late: pl.DataFrame, pairs: pl.DataFrame, host: dict[str, str], wid: str,
                       known_hosts: set[str] | None = None) -> list[dict]:
    """Late ranks -> verdict rows (flows.late_rank): per host with several late ranks of one job, the
    host; else the GPU address. A late unit with a pipeline neighbour later by more of its own is that
    neighbour's symptom (info). host: address -> host name (topology); known_hosts: hosts an earlier
    window named: one late rank of such a host is that host's finding going on (the GPUs of a
    tensor-parallel group wait on the slow one together; a window where only one of them passes the bar
    named that GPU, a healthy one, on its own: demo seed 752)."""
    if late.height == 0:
        return []
    late = late.with_columns(host=pl.col("ip").replace_strict(host, default=None, return_dtype=pl.Utf8))
    # units: a host's late ranks of one job together, a rank with no known host alone
    late = late.with_columns(unit=pl.when(pl.col("host").is_not_null() & (
        (pl.len().over("job_id", "host") >= 2) | pl.col("host").is_in(list(known_hosts or ()))))
                             .then(pl.concat_str(pl.lit("host:"), "host")).otherwise(pl.concat_str(pl.lit("ip:"), "ip")))
    units = late.group_by("job_id", "unit").agg(ips=pl.col("ip").sort(), lag=pl.col("lag").median(), n=pl.col("n").min(),
                                               z=pl.col("z").min(), z_bar=pl.col("z_bar").max(), s=pl.col("s").min(),
                                               e=pl.col("e").max(), host=pl.col("host").first(), p=pl.col("p").first())
    pp = pairs.filter(pl.col("comm_type") == "PP").select("ip_a", "ip_b")
    nb = set(zip(pp["ip_a"].to_list(), pp["ip_b"].to_list()))
    rows = units.sort("lag", descending=True).to_dicts()
    out = []
    for i, u in enumerate(rows):
        # a pipeline neighbour late by more of its own: this unit waits for it in turn
        cause = next((v for v in rows[:i] if v["job_id"] == u["job_id"] and v["lag"] > u["lag"]
                      and any((a, b) in nb or (b, a) in nb for a in u["ips"] for b in v["ips"])), None)
        is_host = u["unit"].startswith("host:")
        subject = u["host"] if is_host else u["ips"][0]
        share = u["lag"] / u["p"] if u["p"] else None
        what = (f"host {subject}'s ranks {', '.join(u['ips'])} of job {u['job_id']} start" if is_host
                else f"GPU {subject} (job {u['job_id']}) starts")
        expl = (f"{what} {'their' if is_host else 'its'} traffic {fmt_ms(u['lag'])} after the DP-group peers every step "
                f"({u['n']} steps, z = {u['z']:.1f} over a bar of {u['z_bar']:.1f}"
                + (f"; {share:.1%} of its step" if share is not None else "") + ") while the peers wait: ")
        expl += ("a slow or throttled GPU, a straggling process or a busy host (its flows move at full rate: not the "
                 "network)" if cause is None else
                 f"it waits for its pipeline neighbour {cause['host'] if cause['unit'].startswith('host:') else cause['ips'][0]}, "
                 "which is later by more of its own")
        out.append(dict(detector="flows.late_rank", scope="host" if is_host else "gpu", subject=subject,
                        job_id=u["job_id"], start_ns=int(u["s"]), end_ns=int(u["e"]), metric="own_lag_ns",
                        value=float(u["lag"]), baseline=0.0, severity="info" if cause is not None else "warning",
                        team="operations", window_id=wid,
                        evidence=_ev(u, cause),
                        explanation=expl))
    return out


def _ev(u: dict, cause: dict | None) -> str:
    return json.dumps({"jobs": [u["job_id"]], "ips": u["ips"], "steps": u["n"], "z": round(float(u["z"]), 2),
                       "z_bar": round(float(u["z_bar"]), 2), "waits_for": None if cause is None else cause["unit"]})


def late_rank_rows(steps: pl.DataFrame, ipf: pl.DataFrame, pairs: pl.DataFrame, topology: pl.DataFrame | None,
                   n_jobs: int, window: tuple[int, int], wid: str, cfg: FlowConfig,
                   suspects: set[str] | None = None) -> list[dict]:
    """The window's late-rank verdict rows (flow_verdicts' entry point). steps: the window's and its
    margin's (a fault that begins as the window does has its baseline there); suspects: subjects earlier
    windows named (network.prior_suspects): a rank named there, or on a host named there, needs no
    onset in this window."""
    host = dict(zip(topology["ip"].to_list(), topology["host"].to_list())) if topology is not None and topology.height else {}
    lags = rank_lags(steps, ipf, pairs, cfg.min_data_bytes)
    known = {ip for ip in lags["ip"].unique().to_list() if ip in (suspects or ()) or host.get(ip) in (suspects or ())}
    return late_rank_verdicts(late_ranks(lags, n_jobs, window, cfg, known=known), pairs, host, wid,
                              known_hosts=set(host.values()) & set(suspects or ()))
