"""Network localization (LLMPrism IV-D switch-level diagnosis, made relative): which NIC or switch
slows the flows that cross it, judged against the flows' peers, never against a nominal bandwidth.

Each DP/PP data flow gets a rate residual: log(bytes / duration) minus the median of its peers, the
flows of the same job, type and size class in the same time bin (the same collective moving the same
chunks at the same time). A second residual compares it with the same pair's flows of that size over
the whole span (its own history), for a fault that slows most of a collective for a while. Per candidate (both
NICs of each flow and every switch on its path) and time bin, the median residual is tested against
the fleet's residual spread; the bar is the Bonferroni z of the detector's false-alarm budget over
all the cells tested (fleetscope.flows.stats), plus a practical floor (min_bw_drop).

Flagged candidates explain one another away greedily: the one carrying the most slow flows is taken,
its flows are removed from every other candidate, the rest re-tested; so a congested leaf is named,
not every NIC under it, and a degraded NIC is named, not its ring neighbours or its leaf."""
from __future__ import annotations

import json

import numpy as np
import polars as pl

from fleetscope.flows.config import FlowConfig
from fleetscope.common import MAD_TO_SIGMA
from fleetscope.flows.stats import bonferroni_z, window_alpha


def flow_residuals(flows: pl.DataFrame, pairs: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """Per DP/PP data flow: fid, job_id, bin, start/end, src_ip, dst_ip, path, e_peer, e_hist."""
    f = flows.join(pairs.filter(pl.col("comm_type").is_in(["DP", "PP"])).select("pid", "job_id", "comm_type"), on="pid")
    f = f.filter((pl.col("end_ns") > pl.col("start_ns")) & (pl.col("bytes") >= cfg.min_data_bytes))
    if f.height == 0:
        return f
    f = f.with_row_index("fid").with_columns(
        x=(pl.col("bytes").cast(pl.Float64) / (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)).log(),
        size=pl.col("bytes").cast(pl.Float64).log(2).round(0).cast(pl.Int32),  # chunks of one size class
        bin=(pl.col("start_ns") // cfg.diag_bin_ns),
    )
    key = ["job_id", "comm_type", "size"]
    # history: the same pair moving the same size over the span (in a small ring most of a
    # collective's flows may cross the faulty NIC, and then its peers are no baseline)
    f = f.with_columns(
        n_peer=pl.len().over(key + ["bin"]), base_peer=pl.col("x").median().over(key + ["bin"]),
        n_hist=pl.len().over(["pid", "size"]), base_hist=pl.col("x").median().over(["pid", "size"]),
    )
    return f.with_columns(
        e_peer=pl.when(pl.col("n_peer") >= cfg.min_peer_flows).then(pl.col("x") - pl.col("base_peer")),
        e_hist=pl.when(pl.col("n_hist") >= cfg.min_peer_flows).then(pl.col("x") - pl.col("base_hist")),
    ).select("fid", "job_id", "bin", "start_ns", "end_ns", "src_ip", "dst_ip", "path", "e_peer", "e_hist")


def _candidates(r: pl.DataFrame) -> pl.DataFrame:
    sw = r.filter(pl.col("path").is_not_null()).select("fid", "bin", cand=pl.col("path")).explode("cand") \
        .with_columns(kind=pl.lit("switch"))
    nic = pl.concat([r.select("fid", "bin", cand=pl.col(c)) for c in ("src_ip", "dst_ip")]).with_columns(kind=pl.lit("nic"))
    return pl.concat([sw, nic]).filter(pl.col("cand").is_not_null()).unique(["fid", "kind", "cand"])


def localize(r: pl.DataFrame, n_jobs: int, window: tuple[int, int], cfg: FlowConfig,
             cand: pl.DataFrame | None = None) -> tuple[pl.DataFrame, dict]:
    """r: flow_residuals; cand: _candidates(r). -> (accepted causes: kind, cand, value (rate vs
    peers), n_slow, n, s, e, bins, jobs, z), stats {n_tests, z_bar}."""
    empty = pl.DataFrame(schema={"kind": pl.Utf8, "cand": pl.Utf8, "value": pl.Float64, "n_slow": pl.Int64,
                                 "n": pl.Int64, "s": pl.Int64, "e": pl.Int64, "bins": pl.Int64, "jobs": pl.Utf8,
                                 "z": pl.Float64})
    if r.height == 0:
        return empty, {"n_tests": 0, "z_bar": None}
    # the spread of a healthy flow's residual, robust to the slow ones
    sig = {}
    for col in ("e_peer", "e_hist"):
        v = r[col].drop_nulls().to_numpy()
        sig[col] = max(MAD_TO_SIGMA * float(np.median(np.abs(v - np.median(v)))) if len(v) else 0.0, 0.02)
    cand = _candidates(r) if cand is None else cand
    x = cand.join(r.select("fid", "e_peer", "e_hist", "start_ns", "end_ns", "job_id"), on="fid")
    floor = float(np.log(1 - cfg.min_bw_drop))

    slow_e = pl.min_horizontal(pl.col("e_peer").fill_null(0.0), pl.col("e_hist").fill_null(0.0)) < floor
    # how often a flow of the job is that slow anyway (the job's own rate, some jobs jitter more):
    # the base rate of the share test, per flow
    x = x.with_columns(p0=slow_e.mean().over("job_id").clip(1e-3, 0.5))

    def cells(xx: pl.DataFrame) -> pl.DataFrame:
        c = xx.group_by("kind", "cand", "bin").agg(
            n=pl.len(), m_peer=pl.col("e_peer").median(), m_hist=pl.col("e_hist").median(),
            n_peer=pl.col("e_peer").count(), n_hist=pl.col("e_hist").count(), k_slow=slow_e.sum(),
            k0=pl.col("p0").sum(), v0=(pl.col("p0") * (1 - pl.col("p0"))).sum())
        c = c.filter(pl.col("n") >= cfg.min_flows_per_cell)
        # z of a median of n residuals: sigma * 1.2533 / sqrt(n); and of the share of slow flows
        # against the base rate (a link that flaps stalls some flows, not the typical one)
        return c.with_columns(
            z_peer=pl.col("m_peer") / (sig["e_peer"] * 1.2533 / pl.col("n_peer").clip(lower_bound=1).sqrt()),
            z_hist=pl.col("m_hist") / (sig["e_hist"] * 1.2533 / pl.col("n_hist").clip(lower_bound=1).sqrt()),
            z_share=-(pl.col("k_slow") - pl.col("k0")) / pl.col("v0").sqrt())

    c0 = cells(x)
    n_tests = max(3 * c0.height, 1)
    zb = bonferroni_z(window_alpha(cfg.fa_per_job_hour, n_jobs, window[1] - window[0]), n_tests)

    def flag(c: pl.DataFrame) -> pl.DataFrame:
        peer = (pl.col("z_peer") < -zb) & (pl.col("m_peer") < floor)
        hist = (pl.col("z_hist") < -zb) & (pl.col("m_hist") < floor)
        share = (pl.col("z_share") < -zb) & (pl.col("k_slow") >= pl.max_horizontal(
            cfg.min_slow_share * pl.col("n"), 3 * pl.col("k0")))
        return c.filter(peer.fill_null(False) | hist.fill_null(False) | share.fill_null(False))

    accepted = []
    # only candidates flagged on all the flows can be causes: taking flows away leaves the others
    # as they were or less slow, so the explain-away loop works on the flagged ones' rows alone
    f0 = flag(c0).select("kind", "cand").unique()
    remaining = x.join(f0, on=["kind", "cand"], how="semi")
    for _ in range(cfg.max_causes):
        fl = flag(cells(remaining))
        if fl.height == 0:
            break
        # the cause: the most specific candidate (the largest share of its flows slow, in steps of 5 %),
        # then the one holding the most slow flows: a degraded NIC before the leaf it hangs on (a few
        # slow flows among many), a congested leaf before each NIC under it (all slow, fewer flows)
        best = fl.group_by("kind", "cand").agg(n=pl.col("n").sum(), k=pl.col("k_slow").sum()) \
            .with_columns(sh=(pl.col("k") / pl.col("n") * 20).round()) \
            .sort(["sh", "k", "n", "kind", "cand"], descending=[True, True, True, True, False]).row(0, named=True)
        bins = fl.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]))["bin"]
        mine = remaining.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"])
                                & pl.col("bin").is_in(bins.implode()))
        e = pl.min_horizontal(pl.col("e_peer").fill_null(0.0), pl.col("e_hist").fill_null(0.0))
        slow = mine.filter(e < floor)
        zmin = fl.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"])) \
            .select(pl.min_horizontal("z_peer", "z_hist", "z_share").min()).item()
        accepted.append({
            "kind": best["kind"], "cand": best["cand"],
            # a minority of stalled flows (a flapping link): how slow those are
            "value": float(np.exp(mine.select(e.median()).item())) if 2 * slow.height >= mine.height
            else float(np.exp(slow.select(e.median()).item())), "n_slow": slow.height, "n": mine.height,
            "s": int(mine["start_ns"].min()), "e": int(mine["end_ns"].max()), "bins": bins.n_unique(),
            "jobs": ",".join(sorted(mine["job_id"].unique().to_list())), "z": float(zmin)})
        # its flows are explained: no other candidate may claim them
        remaining = remaining.join(mine.select("fid").unique(), on="fid", how="anti")
    out = pl.DataFrame(accepted, schema=empty.schema) if accepted else empty
    return out, {"n_tests": n_tests, "z_bar": zb}


def stall_causes(r: pl.DataFrame, n_jobs: int, window: tuple[int, int], cfg: FlowConfig,
                 exclude: set[str] | None = None, cand: pl.DataFrame | None = None) -> pl.DataFrame:
    """A link that flaps stalls the few flows crossing it while it is down, many times their peers'
    duration, in episodes scattered over the window; no typical flow of it is slow. Per candidate
    (NIC or switch): its stalled flows (rate below stall_ratio of their peers') against the number
    its flows' jobs stall anyway (a Poisson test, Bonferroni over the candidates), in >= 2 episodes
    (stalls more than a second apart). The most specific candidate explains the others: the NIC
    whose stalls involve several peers, not each peer."""
    empty = pl.DataFrame(schema={"kind": pl.Utf8, "cand": pl.Utf8, "k": pl.Int64, "lam": pl.Float64,
                                 "episodes": pl.Int64, "s": pl.Int64, "e": pl.Int64, "jobs": pl.Utf8})
    if r.height == 0:
        return empty
    from scipy.stats import poisson

    thr = float(np.log(cfg.stall_ratio))
    r = r.with_columns(stall=(pl.min_horizontal(pl.col("e_peer").fill_null(0.0), pl.col("e_hist").fill_null(0.0)) < thr))
    r = r.with_columns(p0=pl.col("stall").mean().over("job_id").clip(1e-5, 0.5))
    cand = _candidates(r) if cand is None else cand
    x = cand.join(r.select("fid", "stall", "p0", "start_ns", "end_ns", "job_id", "src_ip", "dst_ip"), on="fid")
    # only candidates with stalled flows can be causes (their other flows set the expectation)
    x = x.join(x.filter("stall").select("kind", "cand").unique(), on=["kind", "cand"], how="semi")
    if exclude:
        x = x.filter(~pl.col("cand").is_in(list(exclude)))
    n_tests = max(cand.select(pl.struct("kind", "cand").n_unique()).item(), 1)
    alpha = window_alpha(cfg.fa_per_job_hour, n_jobs, window[1] - window[0]) / n_tests
    out = []
    remaining = x
    for _ in range(cfg.max_causes):
        st = remaining.filter("stall").sort("start_ns").with_columns(
            ep=(pl.col("start_ns").diff().over("kind", "cand").fill_null(1 << 62) > 1_000_000_000).cast(pl.Int64))
        agg = st.group_by("kind", "cand").agg(k=pl.len(), episodes=pl.col("ep").sum(),
                                               peers=pl.concat([pl.col("src_ip"), pl.col("dst_ip")]).n_unique(),
                                               s=pl.col("start_ns").min(), e=pl.col("end_ns").max(),
                                               jobs=pl.col("job_id").unique().sort().str.join(","))
        lam = remaining.group_by("kind", "cand").agg(lam=pl.col("p0").sum())
        agg = agg.join(lam, on=["kind", "cand"]).filter(pl.col("episodes") >= 2)
        if agg.height == 0:
            break
        pv = poisson.sf(agg["k"].to_numpy() - 1, agg["lam"].to_numpy())
        agg = agg.with_columns(pv=pl.Series(pv)).filter(pl.col("pv") <= alpha)
        if agg.height == 0:
            break
        best = agg.sort(["episodes", "peers", "k", "kind", "cand"], descending=[True, True, True, False, False]).row(0, named=True)
        out.append({k: best[k] for k in empty.columns})
        mine = remaining.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]) & pl.col("stall"))
        remaining = remaining.join(mine.select("fid").unique(), on="fid", how="anti")
    return pl.DataFrame(out, schema=empty.schema) if out else empty


def host_groups(causes: pl.DataFrame, topology: pl.DataFrame) -> pl.DataFrame:
    """NIC causes sharing a host and a job: the NICs of one tensor-parallel group, slowed together
    because the group computes late (one slow GPU holds back its TP peers, and the collectives they
    join wait for them). Adds `group` (the NICs, worst first) and keeps one row per group."""
    nic = causes.filter(pl.col("kind") == "nic").join(topology.select(cand="ip", host="host"), on="cand", how="left")
    nic = nic.filter(pl.col("host").is_not_null())
    if nic.height == 0:
        return causes.head(0).with_columns(group=pl.lit(None, dtype=pl.List(pl.Utf8)))
    g = nic.sort("value", "cand").group_by("host", "jobs", maintain_order=True).agg(
        pl.col("cand").alias("group"), pl.all().first()).filter(pl.col("group").list.len() >= 2)
    return g.drop("host")


def network_verdicts(flows: pl.DataFrame, pairs: pl.DataFrame, n_jobs: int, window: tuple[int, int], wid: str,
                     cfg: FlowConfig, topology: pl.DataFrame | None = None) -> list[dict]:
    res = flow_residuals(flows, pairs, cfg)
    cand = _candidates(res) if res.height else None
    causes, st = localize(res, n_jobs, window, cfg, cand=cand)
    out = []
    if topology is not None and causes.height:
        groups = host_groups(causes, topology)
        in_group = set(x for g in groups["group"].to_list() for x in g)
        for r in groups.iter_rows(named=True):
            jobs = r["jobs"].split(",") if r["jobs"] else []
            peers = [x for x in r["group"] if x != r["cand"]]
            out.append(dict(
                detector="flows.slow_gpu", scope="gpu", subject=r["cand"], job_id=jobs[0] if len(jobs) == 1 else None,
                start_ns=r["s"], end_ns=r["e"], metric="flow_rate_vs_peers", value=r["value"], baseline=1.0,
                severity="warning", team="operations", window_id=wid,
                evidence=json.dumps({"tensor_parallel_peers": peers, "jobs": jobs, "bins": r["bins"], "z": round(r["z"], 2)}),
                explanation=f"the NICs of one tensor-parallel group on one host ({r['cand']} and {len(peers)} peers: "
                            f"{', '.join(peers)}) all move their job's flows at ~{r['value']:.0%} of their peers' rate while "
                            "the rest of the fabric does not: the group computes late, most likely one slow GPU "
                            f"({r['cand']}, the slowest) holding back its peers"))
        causes = causes.filter(~((pl.col("kind") == "nic") & pl.col("cand").is_in(list(in_group))))
    named = set(causes["cand"].to_list())
    stalls = stall_causes(res, n_jobs, window, cfg, exclude=named, cand=cand) if res.height else pl.DataFrame()
    for r in stalls.iter_rows(named=True):
        jobs = r["jobs"].split(",") if r["jobs"] else []
        scope = "switch" if r["kind"] == "switch" else "link"
        out.append(dict(
            detector="flows.link_stalls", scope=scope, subject=r["cand"], job_id=jobs[0] if len(jobs) == 1 else None,
            start_ns=r["s"], end_ns=r["e"], metric="stalled_flows", value=float(r["k"]), baseline=float(r["lam"]),
            severity="warning", team="operations", window_id=wid,
            evidence=json.dumps({"episodes": r["episodes"], "jobs": jobs}),
            explanation=f"{r['k']} flows through {scope} {r['cand']} stalled (under {cfg.stall_ratio:.0%} of their peers' rate) "
                        f"in {r['episodes']} episodes, where its jobs would stall {r['lam']:.1f}: a flapping link or port"))
    for r in causes.iter_rows(named=True):
        jobs = r["jobs"].split(",") if r["jobs"] else []
        ev = json.dumps({"jobs": jobs, "bins": r["bins"], "flows": r["n"], "slow_flows": r["n_slow"],
                         "z": round(r["z"], 2), "z_bar": round(st["z_bar"], 2), "n_tests": st["n_tests"]})
        sev = "critical" if r["value"] < 0.5 else "warning"
        if r["kind"] == "switch":
            out.append(dict(detector="flows.switch_bandwidth", scope="switch", subject=r["cand"], job_id=None,
                            start_ns=r["s"], end_ns=r["e"], metric="flow_rate_vs_peers", value=r["value"], baseline=1.0,
                            severity=sev, team="operations", window_id=wid, evidence=ev,
                            explanation=f"flows through switch {r['cand']} move at {r['value']:.0%} of the rate of the same "
                                        f"jobs' other flows of the same kind and size (jobs {', '.join(jobs)}): "
                                        "congestion or a degraded switch"))
        else:
            out.append(dict(detector="flows.nic_bandwidth", scope="link", subject=r["cand"],
                            job_id=jobs[0] if len(jobs) == 1 else None, start_ns=r["s"], end_ns=r["e"],
                            metric="flow_rate_vs_peers", value=r["value"], baseline=1.0, severity=sev, team="operations",
                            window_id=wid, evidence=ev,
                            explanation=f"flows to and from NIC {r['cand']} move at {r['value']:.0%} of the rate of their "
                                        "peers in the same collective, with every peer: a degraded NIC, cable or port, "
                                        "or too many channels on it"))
    return out
