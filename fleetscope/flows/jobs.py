"""Job recognition (LLMPrism IV-A, Algorithm 1): union-find over communicating NIC pairs, then
merge cross-machine clusters through the hosts they share (TP traffic never leaves a host).

Refinements over the paper: only periodic pairs (job traffic) are edges, so background traffic
cannot create or bridge jobs; clusters are merged when they share a host *and* their flows move
in lockstep, so a tenant's two small jobs on the same hosts stay two jobs, and a job whose DP
rings walk local members over NVLink (clusters on overlapping, not identical, host sets) is one."""
from __future__ import annotations

import hashlib

import numpy as np
import polars as pl
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from fleetscope.flows.config import FlowConfig


def pair_summary(seg_flows: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """Per unordered pair: n_flows, bytes, n_steps, mode of distinct sizes per step, step period,
    duty cycle inside steps, and `periodic` (job traffic). `seg_flows` has ip_a, ip_b, seg.

    Sizes are counted only for data flows (>= min_data_bytes) and when they recur (>= 2 flows of
    the pair have that size, within size_tol, and >= 3 flows): collective
    chunks and activations repeat every step, while the pieces of a flow split by a
    retransmission have one-off sizes that would otherwise make a PP pair look like DP."""
    # sizes within size_tol of each other are one size (headers or control messages coalesced into
    # a burst shift a message's size by a few bytes); flows under min_data_bytes are control traffic
    f = seg_flows.sort("pid", "bytes").with_columns(
        size_cl=(pl.col("bytes") > pl.col("bytes").shift(1) * (1 + cfg.size_tol)).fill_null(True)
        .cum_sum().over("pid"))
    # a size recurs when it makes up a real share of the pair's flows (a bucket's chunks every step);
    # the pieces of retransmission splits are scattered one-offs even if two happen to be close
    f = f.with_columns(rec=(pl.len().over("pid", "size_cl")
                            >= pl.max_horizontal(pl.lit(3), cfg.min_size_share * pl.len().over("pid")))
                       & (pl.col("bytes") >= cfg.min_data_bytes))
    steps = f.group_by("pid", "seg").agg(
        n=pl.len(), sizes=pl.col("size_cl").filter("rec").n_unique(),
        first=pl.col("start_ns").min(), last=pl.col("end_ns").max(),
        busy=(pl.col("end_ns") - pl.col("start_ns")).sum(),
    )
    steps = steps.sort("pid", "seg").with_columns(
        period=pl.col("last").diff().over("pid"),
        duty=pl.when(pl.col("n") >= 2).then(pl.col("busy") / (pl.col("last") - pl.col("first")).clip(lower_bound=1)),
    )
    out = steps.filter(pl.col("sizes") > 0).group_by("pid").agg(
        # mode of distinct sizes per step; ties go to the larger count (DP), which refinement never undoes
        mode_distinct_sizes=pl.col("sizes").mode().max().cast(pl.Int64),
    )
    base = steps.group_by("pid").agg(
        n_flows=pl.col("n").sum().cast(pl.Int64),
        n_steps=pl.len().cast(pl.Int64),
        period_ns=pl.col("period").median(),
        duty=pl.col("duty").median(),
        # how much of a step the pair's traffic spans: a collective is a burst, PP sends follow the
        # microbatches through forward and backward
        span_frac=((pl.col("last") - pl.col("first")).median() / pl.col("period").median()),
        first_ns=pl.col("first").min(), last_ns=pl.col("last").max(),
    )
    by = f.group_by("pid").agg(ip_a=pl.col("ip_a").first(), ip_b=pl.col("ip_b").first(), bytes=pl.col("bytes").sum().cast(pl.Int64),
                                        max_flow_bytes=pl.col("bytes").max().cast(pl.Int64),
                                        n_recurring=pl.col("rec").sum().cast(pl.Int64))
    out = base.join(out, on="pid", how="left").join(by, on="pid")
    # job traffic repeats: enough flows of recurring sizes (one-off control or copy flows do not),
    # over more than one step (a checkpoint copy cut into equal messages is one burst) ... or, where
    # the split saw one gap level only, with a period of its own over the window (repeats)
    return out.join(repeats(seg_flows, out, cfg), on="pid", how="left").with_columns(
        periodic=(pl.col("n_recurring") >= cfg.min_pair_flows)
        & ((pl.col("n_steps") >= 2) | pl.col("repeats").fill_null(False))).drop("repeats").sort("ip_a", "ip_b")


def repeats(seg_flows: pl.DataFrame, pairs: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """pid, repeats: for the pairs the step split left whole (one segment: every gap it saw was of one
    level, so it could not tell step gaps from the rest) with enough recurring flows, whether their
    traffic repeats with a period over the window (flow starts weighted by bytes, autocorrelation:
    period.autocorr_period), at least twice. A DP pair whose NIC streams all step and rests only
    between steps, or that moves one burst of parallel channels per step, is such a pair (simulator
    seeds 2168 and 2217: jobs never found). pairs: pair_summary's rows so far (pid, ip_a, ip_b,
    n_steps, n_recurring, first_ns, last_ns)."""
    from fleetscope.flows.period import autocorr_period

    # ... and for as long as its ends are active at all (the longer of the two ends' spans over all
    # their pairs, half of it at least): a GPU's job traffic lasts as long as it works in the job,
    # an episode of copies (a checkpoint cut into equal writes, as regular inside as any step) does not
    ends = pl.concat([pairs.select(ip="ip_a", s="first_ns", e="last_ns"), pairs.select(ip="ip_b", s="first_ns", e="last_ns")]) \
        .group_by("ip").agg(span=pl.col("e").max() - pl.col("s").min())
    flat = pairs.filter((pl.col("n_steps") < 2) & (pl.col("n_recurring") >= cfg.min_pair_flows)) \
        .join(ends.select(ip_a="ip", sa="span"), on="ip_a").join(ends.select(ip_b="ip", sb="span"), on="ip_b") \
        .filter(2 * (pl.col("last_ns") - pl.col("first_ns")) >= pl.max_horizontal("sa", "sb")).select("pid")
    out = {"pid": [], "repeats": [], "repeat_period_ns": []}
    if flat.height:
        f = seg_flows.join(flat, on="pid").select("pid", "start_ns", "bytes").sort("pid", "start_ns")
        for (pid,), g in f.group_by(["pid"], maintain_order=True):
            t = g["start_ns"].to_numpy()
            per = autocorr_period(t, cfg.min_period_ns, weights=g["bytes"].to_numpy().astype(np.float64))
            ok = per is not None and per > 0 and t[-1] - t[0] >= 2 * per
            out["pid"].append(pid)
            out["repeats"].append(ok)
            out["repeat_period_ns"].append(float(per) if ok else None)
    return pl.DataFrame(out, schema={"pid": pairs.schema["pid"], "repeats": pl.Boolean, "repeat_period_ns": pl.Float64})


def period_cycles(flows: pl.DataFrame, period: pl.DataFrame) -> pl.DataFrame:
    """flows (pid, start_ns, ..., seg) with each pair's step index cut again by its own period where
    `period` (pid, repeat_period_ns) has one: its flow starts folded onto one cycle, a new step where
    the cycle is quietest (the middle of the widest arc with no flow start). The pairs the step split
    left whole (one level of gaps) then end a step once per cycle like any other, so their step ends
    can be matched with their job's."""
    per = period.filter(pl.col("repeat_period_ns").is_not_null()).select("pid", P="repeat_period_ns")
    if per.height == 0 or flows.height == 0:
        return flows
    cut = flows.join(per, on="pid").with_columns(u=(pl.col("start_ns") - pl.col("start_ns").min().over("pid")) / pl.col("P"))
    ph = cut.select("pid", ph=pl.col("u") % 1.0).sort("pid", "ph").with_columns(
        arc=(pl.col("ph").shift(-1).over("pid") - pl.col("ph")).fill_null(pl.col("ph").first().over("pid") + 1.0 - pl.col("ph")))
    quiet = ph.sort("arc", descending=True).unique("pid", keep="first").select("pid", c=pl.col("ph") + pl.col("arc") / 2)
    cut = cut.join(quiet, on="pid").with_columns(seg=(pl.col("u") - pl.col("c")).floor().cast(pl.Int64) + 1)
    return pl.concat([flows.join(per.select("pid"), on="pid", how="anti"), cut.select(flows.columns)])


def hub_addresses(pairs: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """Addresses (ip) whose data peers (pairs with data flows, periodic or not) far outnumber their
    peers' own: services (storage, monitoring, probe servers) that talk to many GPUs of many jobs.
    A GPU's peers are its ring or tree neighbours, pipeline stages and a service or two, about as
    many as each of those peers has."""
    e = pairs.filter(pl.col("n_steps") > 0).select("ip_a", "ip_b")  # pairs with data flows
    if e.height == 0:
        return pl.DataFrame(schema={"ip": pl.Utf8, "peers": pl.UInt32})
    und = pl.concat([e.select(ip="ip_a", peer="ip_b"), e.select(ip="ip_b", peer="ip_a")])
    deg = und.group_by("ip").agg(peers=pl.len())
    nb = und.join(deg.rename({"ip": "peer", "peers": "peer_peers"}), on="peer").group_by("ip").agg(
        nb=pl.col("peer_peers").median())
    return deg.join(nb, on="ip").filter(
        (pl.col("peers") >= cfg.hub_min_peers) & (pl.col("peers") >= cfg.hub_factor * pl.col("nb"))).select("ip", "peers")


def _components(edges: pl.DataFrame, ips: pl.Series) -> tuple[pl.DataFrame, np.ndarray]:
    idx = pl.DataFrame({"ip": ips, "i": np.arange(ips.len())})
    e = edges.join(idx.rename({"ip": "ip_a", "i": "a"}), on="ip_a").join(idx.rename({"ip": "ip_b", "i": "b"}), on="ip_b")
    n = ips.len()
    g = coo_matrix((np.ones(e.height), (e["a"].to_numpy(), e["b"].to_numpy())), shape=(n, n))
    return idx, connected_components(g, directed=False)[1]


def job_edges(pairs: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """The pairs that make jobs: periodic, not negligible for either end, and between no service.

    - strength: a pair's bytes are at least min_pair_share of the biggest pair of each of its ends
      (a GPU's ring and pipeline peers carry comparable volumes; a storage read, a monitoring scrape
      or a probe is a tiny share of a busy GPU's traffic);
    - services: addresses with far more data peers than their peers have (hub_addresses), and
      addresses whose data peers lie in two or more jobs other than their own (a GPU belongs to one
      job; a storage or monitoring server serves many)."""
    data = pairs.filter(pl.col("n_steps") > 0)
    top = pl.concat([data.select(ip="ip_a", b="bytes"), data.select(ip="ip_b", b="bytes")]).group_by("ip").agg(top=pl.col("b").max())
    periodic = data.filter("periodic")
    cand = periodic.join(top.rename({"ip": "ip_a", "top": "ta"}), on="ip_a") \
        .join(top.rename({"ip": "ip_b", "top": "tb"}), on="ip_b") \
        .filter(pl.col("bytes") >= cfg.min_pair_share * pl.max_horizontal("ta", "tb")).drop("ta", "tb")
    hubs = hub_addresses(pairs, cfg)["ip"]
    if hubs.len():
        cand = cand.filter(~pl.col("ip_a").is_in(hubs.implode()) & ~pl.col("ip_b").is_in(hubs.implode()))
    ips = pl.concat([cand["ip_a"], cand["ip_b"]]).unique().sort()
    if ips.len() == 0:
        return cand
    idx, comp = _components(cand, ips)
    cm = idx.select("ip", c=pl.Series(comp, dtype=pl.Int64)).with_columns(size=pl.len().over("c"))
    und = pl.concat([data.select(ip="ip_a", peer="ip_b"), data.select(ip="ip_b", peer="ip_a")])
    # a GPU's data peers are mostly in its own job (its pipeline neighbours may still be apart
    # here); a service's are nearly all in other jobs, and in several of them
    peers = und.join(cm.select("ip", "c"), on="ip", how="left").join(
        cm.filter(pl.col("size") >= 2).select(peer="ip", pc="c"), on="peer", how="left") \
        .with_columns(out=pl.col("c").is_null() | pl.col("pc").is_null() | (pl.col("pc") != pl.col("c")))
    other = peers.group_by("ip").agg(n=pl.col("pc").filter("out").drop_nulls().n_unique(), out_share=pl.col("out").mean())
    services = other.filter((pl.col("n") >= 2) & (pl.col("out_share") >= 0.75))["ip"]
    if services.len():
        cand = cand.filter(~pl.col("ip_a").is_in(services.implode()) & ~pl.col("ip_b").is_in(services.implode()))
    # the strength share keeps weak pairs from joining jobs; a weak periodic pair whose ends the strong
    # ones already put in one job joins nothing: it is that job's traffic (a tree's or a hierarchical
    # all-reduce's light hops carry a thousandth of a ring's bytes)
    ips = pl.concat([cand["ip_a"], cand["ip_b"]]).unique().sort()
    if ips.len():
        idx, comp = _components(cand, ips)
        cm = idx.select("ip", c=pl.Series(comp, dtype=pl.Int64))
        weak = periodic.join(cand.select("pid"), on="pid", how="anti") \
            .join(cm.rename({"ip": "ip_a", "c": "ca"}), on="ip_a").join(cm.rename({"ip": "ip_b", "c": "cb"}), on="ip_b") \
            .filter(pl.col("ca") == pl.col("cb")).drop("ca", "cb")
        if weak.height:
            cand = pl.concat([cand, weak.select(cand.columns)]).sort("ip_a", "ip_b")
    return cand


def job_id_for(keys: list[str]) -> str:
    return "job-" + hashlib.sha1(",".join(sorted(keys)).encode()).hexdigest()[:12]


def lockstep_pairs(cand: pl.DataFrame, events: pl.DataFrame, cfg: FlowConfig, max_sample: int = 2000) -> pl.DataFrame:
    """Candidate cluster pairs (a, b) that step in lockstep. events: (cluster_id, t) the step ends of
    each cluster's pairs. b's events are matched to a's nearest within sync_tol_ns; the share that
    match must be >= sync_min_share and well above chance (the share a's events would catch if b's
    fell at random: a's distinct event times per unit time x twice the tolerance). No flow sizes
    involved: headers and retransmissions shift sizes across rails."""
    if cand.height == 0 or events.height == 0:
        return cand.head(0)
    tol = cfg.sync_tol_ns
    ev = events.unique().sort("cluster_id", "t")
    # distinct event times (a cluster's pairs end a step within microseconds of each other)
    distinct = ev.with_columns(new=(pl.col("t").diff().over("cluster_id").fill_null(tol + 1) > tol)).filter("new") \
        .group_by("cluster_id").agg(n=pl.len(), span=pl.col("t").max() - pl.col("t").min())
    chance = distinct.select("cluster_id", chance=(pl.col("n") * 2 * tol / pl.col("span").clip(lower_bound=1)).clip(upper_bound=1.0))
    c = cand.with_row_index("k")
    a = c.join(ev.rename({"cluster_id": "a", "t": "ta"}), on="a").select("k", "ta").sort("k", "ta")
    # b's events: an even sample is enough for a share
    evb = ev.with_columns(i=pl.int_range(pl.len()).over("cluster_id"), n=pl.len().over("cluster_id")).filter(
        pl.col("i") % (pl.col("n") // max_sample).clip(lower_bound=1) == 0).select("cluster_id", "t")
    b = c.join(evb.rename({"cluster_id": "b", "t": "tb"}), on="b").select("k", "tb").sort("k", "tb")
    j = b.join_asof(a, left_on="tb", right_on="ta", by="k", strategy="nearest", check_sortedness=False)
    sc = j.group_by("k").agg(share=((pl.col("ta") - pl.col("tb")).abs() <= tol).mean())
    sc = sc.join(c, on="k").join(chance.rename({"cluster_id": "a"}), on="a", how="left").with_columns(pl.col("chance").fill_null(1.0))
    ok = sc.filter((pl.col("share") >= cfg.sync_min_share) & (pl.col("share") >= 2 * pl.col("chance") + 0.1))
    return ok.select("a", "b")


def phase_locked_pairs(cand: pl.DataFrame, events: pl.DataFrame, cfg: FlowConfig, bins: int = 1 << 14) -> pl.DataFrame:
    """Candidate cluster pairs (a, b) that step with one period and one phase although their flows
    do not coincide one by one (data-parallel replicas of a stage, pipeline-only NICs): periods
    (autocorrelation of each cluster's flow starts) within period_tol, and the cross-correlation of
    their flow starts highest within phase_tol of a period around zero lag. A tenant's two jobs on
    the same hosts step with their own period, or at least their own phase."""
    if cand.height == 0 or events.height == 0:
        return cand.head(0)
    from fleetscope.flows.period import autocorr_period

    t0, t1 = int(events["t"].min()), int(events["t"].max()) + 1
    b = max((t1 - t0) // bins, 1)
    series, period = {}, {}
    involved = set(cand["a"].to_list()) | set(cand["b"].to_list())
    for (cid,), g in events.filter(pl.col("cluster_id").is_in(list(involved))).group_by(["cluster_id"]):
        t = g["t"].to_numpy()
        period[cid] = autocorr_period(t, cfg.min_period_ns)
        x = np.bincount(((t - t0) // b).astype(np.int64), minlength=bins + 1).astype(np.float64)
        x -= x.mean()
        series[cid] = np.fft.rfft(x, 2 * len(x))
    keep = []
    for a, c in cand.iter_rows():
        pa, pc = period.get(a), period.get(c)
        if pa is None or pc is None or abs(pa - pc) > cfg.period_tol * max(pa, pc):
            continue
        xc = np.fft.irfft(series[a] * np.conj(series[c]))
        lag = max(int(cfg.phase_tol * pa // b), 1)
        span = max(int(pa // b), lag + 1)  # compare with the best lag within one period
        near = max(xc[:lag + 1].max(), xc[-lag:].max())
        best = max(xc[:span + 1].max(), xc[-span:].max())
        if near > 0 and near >= 0.7 * best:
            keep.append((a, c))
    return pl.DataFrame(keep, schema={"a": pl.Int64, "b": pl.Int64}, orient="row")


def _distinct(t: np.ndarray, tol: int) -> np.ndarray:
    t = np.unique(t)
    return t[np.concatenate([[True], np.diff(t) > tol])] if len(t) else t


def cycle_phases(ta: np.ndarray, tb: np.ndarray, tol: int) -> np.ndarray:
    """The phase (0..1) of each event of tb in the interval of a's consecutive events holding it
    (intervals longer than twice a's usual one are gaps, not cycles). Events within tol are one (a
    step's pairs end together)."""
    ta, tb = _distinct(ta, tol), _distinct(tb, tol)
    if len(ta) < 3 or len(tb) < 3:
        return np.zeros(0)
    gaps = np.diff(ta)
    i = np.searchsorted(ta, tb, side="right") - 1
    ok = (i >= 0) & (i < len(gaps))
    i, t = i[ok], tb[ok]
    keep = gaps[i] <= 2 * np.median(gaps)
    return (t[keep] - ta[i[keep]]) / gaps[i[keep]]


def phase_lock_p(ph: np.ndarray) -> float:
    """p-value of n phases (0..1) this concentrated if they were uniform on the circle: the smaller
    of Rayleigh's test (Zar's approximation; powerful for a broad lump over many cycles) and the scan
    test (powerful for a tight lump over few: k of the n phases inside an arc of width w has
    probability at most k C(n, k) w^(k-1), tried for k from half the phases up, Bonferroni
    over the k's), doubled for taking the smaller. A job of multi-second steps shows few cycles
    per window, but its clusters' step ends keep their offset to a few hundredths of a cycle."""
    from scipy.special import gammaln

    n = len(ph)
    if n < 3:
        return 1.0
    r = float(np.abs(np.exp(2j * np.pi * ph).mean()))
    p_r = float(np.exp(np.sqrt(1 + 4 * n + 4 * (n * n - (n * r) ** 2)) - (1 + 2 * n)))
    s = np.sort(np.mod(ph, 1.0))
    ring = np.concatenate([s, s + 1.0])
    ks = np.unique(np.linspace(max(3, (n + 1) // 2), n, 32).astype(np.int64))  # (a few dozen k's are plenty)
    # the narrowest arc holding k phases, for every k (in logs: C(n, k) overflows where w^k underflows)
    w = np.array([(ring[k - 1:k - 1 + n] - ring[:n]).min() for k in ks])
    log_p = np.log(ks) + gammaln(n + 1) - gammaln(ks + 1) - gammaln(n - ks + 1) \
        + (ks - 1) * np.log(np.maximum(w, 1e-300)) + np.log(len(ks))
    return min(1.0, 2 * min(p_r, float(np.exp(log_p.min()))))


# a phase drifting by one cycle or more over the window leaves R at most max |sin(pi c) / (pi c)| over
# c >= 1 (0.217, at c = 1.43): a larger R is a phase the window never lost
_DRIFT_R = 0.2172


def step_phase_locked(cand: pl.DataFrame, events: pl.DataFrame, cfg: FlowConfig, alpha: float = 0.01) -> pl.DataFrame:
    """Candidate cluster pairs (a, b) whose step ends (events: cluster_id, t) keep one phase of each
    other's cycles, either way round: phases too concentrated for uniform ones (phase_lock_p,
    Bonferroni over the pairs, at alpha) and R above what a phase drifting by a cycle over the window
    could leave. One job's clusters end their steps at a fixed offset (a pipeline hop's last send
    before the ring's last chunk), whatever the jitter; two jobs with their own step periods drift
    through every phase even when the chunks inside their steps share one cadence (the transport's),
    which is all the autocorrelation of flow starts sees (phase_locked_pairs; simulator seed 2204: a
    job funnelled through one NIC per host merged with its neighbour on the same hosts)."""
    if cand.height == 0 or events.height == 0:
        return cand.head(0)
    t = {c: g["t"].to_numpy() for (c,), g in events.group_by(["cluster_id"])}
    a_ = alpha / cand.height
    keep = []
    for a, b in cand.iter_rows():
        if a not in t or b not in t:
            continue
        for x, y in ((a, b), (b, a)):
            ph = cycle_phases(t[x], t[y], cfg.sync_tol_ns)
            r = float(np.abs(np.exp(2j * np.pi * ph).mean())) if len(ph) else 0.0
            if r > _DRIFT_R and phase_lock_p(ph) <= a_:
                keep.append((a, b))
                break
    return pl.DataFrame(keep, schema={"a": pl.Int64, "b": pl.Int64}, orient="row")


def recognize_jobs(pairs: pl.DataFrame, seg_flows: pl.DataFrame, topology: pl.DataFrame,
                   cfg: FlowConfig) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """pairs: pair_summary rows of in-topology pairs. Returns (membership: ip, host, gpu,
    cluster_id, job_id), (job_pairs: ip_a, ip_b, job_id for every in-topology pair whose two ends
    are in one job; aperiodic pairs between jobs are left out and reported as background), (edges:
    the pairs that made the jobs)."""
    edges = job_edges(pairs, cfg)
    ips = pl.concat([edges["ip_a"], edges["ip_b"]]).unique().sort()
    empty_m = pl.DataFrame(schema={"ip": pl.Utf8, "host": pl.Utf8, "gpu": pl.Utf8, "cluster_id": pl.Int64, "job_id": pl.Utf8})
    if ips.len() == 0:
        return empty_m, pl.DataFrame(schema={"ip_a": pl.Utf8, "ip_b": pl.Utf8, "job_id": pl.Utf8}), edges
    idx, comp = _components(edges, ips)
    members = idx.with_columns(cluster_id=pl.Series(comp, dtype=pl.Int64)).join(
        topology.select("ip", "host", "gpu"), on="ip", how="left")

    # clusters sharing a host are one job when they step in lockstep: TP groups never leave a host,
    # so each tensor-parallel rank's DP/PP traffic is a cluster of its own, all ending their steps
    # together; a tenant's two jobs on the same hosts do not (lockstep_pairs)
    cids_all = sorted(members["cluster_id"].unique().to_list())
    parent = {c: c for c in cids_all}

    def find(c: int) -> int:
        while parent[c] != c:
            parent[c] = parent[parent[c]]
            c = parent[c]
        return c

    ch = members.filter(pl.col("host").is_not_null()).select("cluster_id", "host").unique()
    cand = ch.join(ch, on="host").filter(pl.col("cluster_id") < pl.col("cluster_id_right")) \
        .select(a="cluster_id", b="cluster_id_right").unique().sort("a", "b")
    if cand.height:
        cl_of = members.select(pl.col("ip").alias("ip_a"), "cluster_id")
        ef = seg_flows.join(edges.select("pid"), on="pid", how="semi").join(cl_of, on="ip_a")
        # two kinds of lockstep evidence, each against its own chance level: the flows' start times
        # (tensor-parallel ranks send each microbatch's activations and each bucket together; too
        # dense to tell apart when traffic streams) and the pairs' step ends (sparse, but noisier)
        # (a slice of the window is enough to see flows coincide, and keeps this cheap)
        t_mid = int(ef["start_ns"].median()) if ef.height else 0
        starts = ef.filter((pl.col("start_ns") - t_mid).abs() <= cfg.lockstep_slice_ns // 2).select("cluster_id", t=pl.col("start_ns"))
        # (pairs the step split left whole end a step once per cycle of their own period)
        if "repeat_period_ns" in pairs.columns:
            ef = period_cycles(ef, pairs.select("pid", "repeat_period_ns"))
        ends = ef.group_by("pid", "seg").agg(cluster_id=pl.col("cluster_id").first(), t=pl.col("end_ns").max()) \
            .select("cluster_id", "t")
        ok = pl.concat([lockstep_pairs(cand, starts, cfg), lockstep_pairs(cand, ends, cfg)]).unique()
        for a, b in ok.sort("a", "b").iter_rows():
            parent[find(b)] = find(a)
        # what is left: clusters whose flows do not coincide one by one (data-parallel replicas of
        # one stage, pipeline-only NICs) still repeat with the job's period and phase
        rest = cand.filter(pl.struct("a", "b").map_elements(lambda r: find(r["a"]) != find(r["b"]),
                                                            return_dtype=pl.Boolean))
        # ... with their step ends keeping one phase of each other (step_phase_locked): a shared cadence
        # of chunks inside the steps is not one job
        locked = phase_locked_pairs(rest, ef.select("cluster_id", t=pl.col("start_ns")), cfg)
        for a, b in step_phase_locked(locked, ends, cfg).iter_rows():
            parent[find(b)] = find(a)
    root = pl.DataFrame({"cluster_id": list(parent), "root": [find(c) for c in parent]},
                        schema={"cluster_id": pl.Int64, "root": pl.Int64})
    members = members.join(root, on="cluster_id")
    # the id names the job the same in every window even when a NIC of it is quiet in one: its hosts
    # (its addresses without a topology); two jobs on the same hosts (a tenant's jobs split by GPU) add
    # each host's lowest address
    anchor = members.with_columns(h=pl.coalesce("host", "ip")).group_by("root", "h").agg(a=pl.col("ip").min())
    keys = anchor.group_by("root").agg(hk=pl.col("h").sort().str.join(","), ak=(pl.col("h") + "@" + pl.col("a")).sort().str.join(","))
    keys = keys.with_columns(k=pl.when(pl.len().over("hk") > 1).then("ak").otherwise("hk"))
    jid = keys.with_columns(job_id=pl.col("k").map_elements(lambda k: job_id_for(k.split(",")), return_dtype=pl.Utf8))
    members = members.join(jid.select("root", "job_id"), on="root").drop("root").sort("job_id", "ip")

    m = members.select("ip", "job_id")
    job_pairs = (pairs.select("ip_a", "ip_b")
                 .join(m.rename({"ip": "ip_a", "job_id": "ja"}), on="ip_a")
                 .join(m.rename({"ip": "ip_b", "job_id": "jb"}), on="ip_b")
                 .filter(pl.col("ja") == pl.col("jb")).select("ip_a", "ip_b", job_id="ja"))
    return members, job_pairs, edges
