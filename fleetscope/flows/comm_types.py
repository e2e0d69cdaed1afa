"""Communication-type labels of a job's pairs (LLMPrism IV-B, Algorithm 2, made robust).

The paper counts distinct flow sizes per step (one size: PP, several: DP). That fails whenever a
pipeline's activations vary with the sequence length, or a job pads its gradient buckets to one
size, or reduces a single bucket. What does not vary is how the two kinds of traffic move:

- a collective hop (ring or tree all-reduce, reduce-scatter, all-gather, a two-rank exchange)
  either runs one way (a ring's hop carries one direction) or both ways at once: its two
  directions overlap in time MORE often than chance;
- a pipeline hop carries activations forward and gradients back, in turn: both directions, every
  step, and they overlap LESS often than chance (a microbatch's gradient comes back only after the
  next stages computed it).

Chance is measured on the pair itself: the share of its flows that would overlap a flow of the
other direction if that direction were shifted by fractions of the pair's period (its own duty
cycle and burst structure kept). So no cut-off on the overlap decides: the label is the sign of
(observed - chance): together when significantly above chance (z against the binomial noise of
both shares, a Bonferroni bar over the window's pairs), in turn when not above it; a pair whose
directions carry significantly unequal shares of its bytes is no pipeline hop (an activation
forward and its gradient back, tensors of one shape: as many bytes each way, though a transport
may cut one direction in more flows) but a collective hop that runs (mostly) one way. The job's structure then checks the labels (LLMPrism's transitivity): a DP group (connected
DP pairs) never holds a PP pair, and pairs the timing does not settle take the label the
structure gives them (inside a DP group: DP), else the size count. A pair whose directions START
together significantly less often than chance (`start_z`, against the same shifted chance) is a
pipeline hop whatever its overlap: both ends of a collective hop send at once, while a pipeline's
gradient waits for the stages after it (a streaming activation overlaps it all the same); one whose
overlap settles nothing (at chance: a hop busy most of the time) but whose directions start together
significantly MORE often than chance is a collective hop (`starts_together`); a pair inside a DP group
with only a few messages, one of them as large as the group's usual message (a ring's
non-neighbours: the group's broadcast), is the group's too (`dp_group_member`). Inside one job, the split between the two kinds comes from
the job's own pairs: the two modes of their overlap (`overlap_split`), else of how often their
directions start together (`start_split`: a 1F1B or streaming pipeline hop overlaps its gradient
about half the time, no two-fold gap to a collective's overlap, yet starts with it seldom), kept
only where the job's structure bears it out (every rank of a pipeline hop in a DP group too). `method` says which evidence decided. The size-count label stays as `raw_type` (evidence). Pairs inside a job that are not job
traffic are `other`."""
from __future__ import annotations

import numpy as np
import polars as pl
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from fleetscope.flows.config import FlowConfig
from fleetscope.flows.stats import bonferroni_z

N_SHIFTS = 8  # shifted copies that measure the chance overlap (fractions (k - 0.5) / 8 of the period)


def direction_features(seg_flows: pl.DataFrame, pids: pl.DataFrame, max_flows: int = 400) -> pl.DataFrame:
    """Per pair (pid): dir_share (minority direction's share of its data flows), dir_byte_share (of
    their bytes) and n_eff_bytes (the flows' effective number for it), overlap (share of an evenly spread sample of
    its flows that overlap a flow of the other direction), overlap_chance (the same with the other
    direction shifted by fractions of the pair's period), n_sample. pids: pid, period_ns."""
    # (bytes weigh the one-way share; a frame without them, timing alone, weighs flows alike)
    w = pl.col("bytes").cast(pl.Float64) if "bytes" in seg_flows.columns else pl.lit(1.0)
    f = seg_flows.join(pids.select("pid"), on="pid").select(
        "pid", "start_ns", "end_ns", ab=pl.col("src_ip") == pl.col("ip_a"), w=w)
    cnt = f.group_by("pid").agg(n=pl.len(), n_ab=pl.col("ab").sum(), b=pl.col("w").sum(),
                                b_ab=pl.col("w").filter("ab").sum(), b2=(pl.col("w") ** 2).sum())
    # a sample is enough for a share and keeps this linear in flows
    s = f.with_columns(k=pl.int_range(pl.len()).over("pid"), n=pl.len().over("pid")).filter(
        pl.col("k") % (pl.col("n") // max_flows).clip(lower_bound=1) == 0).drop("k", "n")
    s = s.join(pids.select("pid", "period_ns"), on="pid", how="left")
    shifts = pl.DataFrame({"shift": list(range(N_SHIFTS + 1))}, schema={"shift": pl.Int32})
    hits = []
    for d in (True, False):
        # each sampled flow of this direction, as it is (shift 0) and shifted: a pure time shift of
        # one direction keeps both directions' own structure and breaks only their alignment
        a = s.filter(pl.col("ab") == d).join(shifts, how="cross").with_columns(
            off=pl.when(pl.col("shift") == 0).then(0.0)
            .otherwise(pl.col("period_ns").fill_null(0.0) * (pl.col("shift") - 0.5) / N_SHIFTS).cast(pl.Int64))
        a = a.with_columns(s2=pl.col("start_ns") + pl.col("off"), e2=pl.col("end_ns") + pl.col("off")).sort("pid", "e2")
        b = f.filter(pl.col("ab") != d).select("pid", bs="start_ns", be="end_ns").sort("pid", "bs")
        # the latest flow of the other direction starting before this one ends: does it reach into it?
        j = a.join_asof(b, left_on="e2", right_on="bs", by="pid", strategy="backward", check_sortedness=False)
        # and does one of the other direction's flows start with it (within a tenth of its own
        # length)? Both ends of an exchange send at once; a pipeline's activation and gradient
        # meet only by chance. The nearest start either side is the later of the two asof hits.
        j = j.sort("pid", "s2").join_asof(b.select("pid", ns="bs"), left_on="s2", right_on="ns", by="pid",
                                          strategy="nearest", check_sortedness=False)
        tol = ((pl.col("e2") - pl.col("s2")) // 10).clip(lower_bound=1)
        hits.append(j.select("pid", "shift", ov=(pl.col("be") >= pl.col("s2")).fill_null(False),
                             co=((pl.col("ns") - pl.col("s2")).abs() <= tol).fill_null(False)))
    h = pl.concat(hits)
    ov = h.group_by("pid").agg(overlap=pl.col("ov").filter(pl.col("shift") == 0).mean(),
                               overlap_chance=pl.col("ov").filter(pl.col("shift") > 0).mean(),
                               start_co=pl.col("co").filter(pl.col("shift") == 0).mean(),
                               start_co_chance=pl.col("co").filter(pl.col("shift") > 0).mean(),
                               n_sample=(pl.col("shift") == 0).sum())
    return cnt.join(ov, on="pid", how="left").select(
        "pid", dir_share=(pl.min_horizontal(pl.col("n_ab"), pl.col("n") - pl.col("n_ab")) / pl.col("n")).cast(pl.Float64),
        dir_byte_share=(pl.min_horizontal(pl.col("b_ab"), pl.col("b") - pl.col("b_ab")) / pl.col("b")).cast(pl.Float64),
        # the flows' effective number for a share of bytes (each flow's direction a coin, weighted by its bytes)
        n_eff_bytes=(pl.col("b") ** 2 / pl.col("b2")).cast(pl.Float64),
        overlap=pl.col("overlap").fill_null(0.0), overlap_chance=pl.col("overlap_chance").fill_null(0.0),
        start_co=pl.col("start_co").fill_null(0.0), start_co_chance=pl.col("start_co_chance").fill_null(0.0),
        n_sample=pl.col("n_sample").fill_null(0).cast(pl.Int64))


def _z_vs_chance(share: str, chance: str) -> pl.Expr:
    """z of (observed share - its chance level) per pair: binomial noise of the observed share and of the
    chance estimate (N_SHIFTS times as many draws); a share of exactly 0 or 1 still has the other's noise,
    and one flow's worth is the floor (no division by a zero spread)."""
    n = pl.col("n_sample").clip(lower_bound=1)
    o, c = pl.col(share), pl.col(chance)
    se = ((o * (1 - o) + c * (1 - c) / N_SHIFTS) / n).sqrt()
    return (o - c) / pl.max_horizontal(se, 0.5 / n)


def _midpoint(lo: float, hi: float, eps: float) -> float:
    """Between two overlap levels on a log scale (shares near zero differ by orders of magnitude;
    eps: half a flow's share keeps zero finite)."""
    return float(np.sqrt((lo + eps) * (hi + eps)) - eps)


def overlap_split(ov: np.ndarray, z: np.ndarray, zbar: float, n_sample: int = 400) -> float | None:
    """The cut between the two modes of ov (balanced pairs' overlaps; z: each pair's overlap z against
    chance), or None when the data show no two kinds: the 2-means split of the sorted values (Otsu),
    kept when the groups are two regimes, not one spread out: Ashman's D = sqrt(2)|m1 - m2| /
    sqrt(s1^2 + s2^2) > 2 (the usual bar for a clean separation), the upper group overlapping at
    least twice as often as the lower, and its median pair together above chance (z > zbar): a
    collective hop's directions run together, a pipeline hop's meet now and then. Each group >= 2."""
    o = np.argsort(ov)
    x, zz = ov[o], z[o]
    n = len(x)
    if n < 4:
        return None
    c1, c2 = np.cumsum(x), np.cumsum(x * x)
    k = np.arange(1, n)                      # left group x[:k]
    m1, m2 = c1[:-1] / k, (c1[-1] - c1[:-1]) / (n - k)
    v1 = np.maximum(c2[:-1] / k - m1 ** 2, 0.0)
    v2 = np.maximum((c2[-1] - c2[:-1]) / (n - k) - m2 ** 2, 0.0)
    ok = (k >= 2) & (n - k >= 2)
    if not ok.any():
        return None
    i = int(np.argmin(np.where(ok, k * v1 + (n - k) * v2, np.inf)))
    d = np.sqrt(2) * abs(m2[i] - m1[i]) / np.sqrt(max(v1[i] + v2[i], 1e-12))
    if d <= 2 or m2[i] < 2 * m1[i] or np.median(zz[i + 1:]) <= zbar:
        return None
    return _midpoint(float(x[i]), float(x[i + 1]), 0.5 / max(n_sample, 1))


def _consistent(g: pl.DataFrame, dp: pl.Expr, uniform: bool = False) -> bool:
    """Whether labelling one job's pairs g DP where one-way or `dp` (else PP) fits a parallel layout:
    no PP pair inside a DP group (a pipeline hop joins different stages, never two members of one
    data-parallel group) and, with `uniform`, the DP groups of the job all of one size (every stage
    is replicated alike; addresses without DP traffic aside; a group missing a pair the flows did
    not show breaks this, so it only guards the weakest evidence)."""
    ips = pl.concat([g["ip_a"], g["ip_b"]]).unique().sort()
    idx = pl.DataFrame({"ip": ips, "i": np.arange(ips.len())})
    e = g.join(idx.rename({"ip": "ip_a", "i": "a"}), on="ip_a").join(idx.rename({"ip": "ip_b", "i": "b"}), on="ip_b") \
        .with_columns(dp=pl.col("one_way") | dp.fill_null(False))
    comp = _components(e, pl.col("dp"), ips.len())
    pp = e.filter(~pl.col("dp"))
    if (comp[pp["a"].to_numpy()] == comp[pp["b"].to_numpy()]).any():
        return False
    sizes = np.bincount(comp)
    return not uniform or len(set(sizes[sizes > 1].tolist())) <= 1


def _chains(g: pl.DataFrame, dp: pl.Expr) -> bool:
    """Whether the pipeline hops of one job's pairs g (balanced pairs not `dp`, not one way) form
    chains: no address with more than two of them (one neighbour per adjacent stage)."""
    pp = g.filter(~(pl.col("one_way") | dp.fill_null(False)))
    deg = pl.concat([pp["ip_a"], pp["ip_b"]]).value_counts()
    return deg.height == 0 or int(deg["count"].max()) <= 2


def _both_kinds(g: pl.DataFrame, dp: pl.Expr) -> bool:
    """Whether every end of one job's pipeline hops (balanced pairs not `dp`) also has a collective
    hop: in a layout with both kinds every rank belongs to a data-parallel group and a pipeline, so
    a split that leaves a rank with pipeline hops only found two levels of one kind (two-rank
    groups on different hosts start together at two levels, and their ranks have no other pair)."""
    e = g.with_columns(d=pl.col("one_way") | dp.fill_null(False))
    pp, coll = e.filter(~pl.col("d")), e.filter("d")
    return set(pl.concat([pp["ip_a"], pp["ip_b"]]).to_list()) <= set(pl.concat([coll["ip_a"], coll["ip_b"]]).to_list())


def _components(p: pl.DataFrame, mask: pl.Expr, n: int) -> np.ndarray:
    e = p.filter(mask)
    g = coo_matrix((np.ones(e.height), (e["a"].to_numpy(), e["b"].to_numpy())), shape=(n, n))
    return connected_components(g, directed=False)[1]


def classify_pairs(pairs: pl.DataFrame, job_pairs: pl.DataFrame, seg_flows: pl.DataFrame,
                   cfg: FlowConfig, edges: pl.DataFrame | None = None) -> pl.DataFrame:
    """pairs (pair_summary) x job_pairs -> ip_a, ip_b, job_id, comm_type, raw_type, method,
    refined, dp_group, n_flows, bytes, n_steps, mode_distinct_sizes, dir_share, overlap,
    overlap_chance, overlap_z. edges: the pairs that made the jobs (jobs.job_edges); job traffic is
    one of them."""
    p = pairs.join(job_pairs, on=["ip_a", "ip_b"])
    is_edge = pl.lit(True) if edges is None else pl.col("pid").is_in(edges["pid"].implode())
    p = p.with_columns(job_traffic=is_edge & pl.col("periodic"))
    p = p.with_columns(
        raw_type=pl.when(~pl.col("periodic")).then(pl.lit("other"))
        .when(pl.col("mode_distinct_sizes") == 1).then(pl.lit("PP")).otherwise(pl.lit("DP")))
    jt = p.filter("job_traffic")
    df = direction_features(seg_flows, jt.select("pid", "period_ns")) if jt.height else pl.DataFrame(
        schema={"pid": pl.Int64, "dir_share": pl.Float64, "dir_byte_share": pl.Float64, "n_eff_bytes": pl.Float64, "overlap": pl.Float64,
                "overlap_chance": pl.Float64, "start_co": pl.Float64, "start_co_chance": pl.Float64,
                "n_sample": pl.Int64})
    p = p.join(df, on="pid", how="left")
    p = p.with_columns(overlap_z=_z_vs_chance("overlap", "overlap_chance"), start_z=_z_vs_chance("start_co", "start_co_chance"))
    zbar = bonferroni_z(cfg.label_alpha, max(jt.height, 1))
    # a pipeline hop carries one activation forward and its gradient back per microbatch: tensors
    # of one shape, as many bytes each way (not always as many flows: a transport may cut one
    # direction's messages in more pieces). A pair whose minority direction carries significantly
    # less than half of its bytes (each flow's direction a coin weighted by its bytes) is no
    # pipeline hop: a collective hop (mostly) one way
    bal_z = (0.5 - pl.col("dir_byte_share")) / (0.25 / pl.col("n_eff_bytes").clip(lower_bound=1)).sqrt()
    one_way = bal_z > zbar
    together = pl.col("overlap_z") > zbar
    # the split between pipeline and collective hops from the data: the two modes of the overlap
    # among the balanced pairs of the job, else of the whole window (overlap_split). Where the data
    # show no two kinds, the test against chance decides.
    p = p.with_columns(one_way=one_way.fill_null(False), together=together.fill_null(False))
    # Per job, the first labelling of its balanced pairs that agrees with the job's structure
    # (_consistent: no pipeline hop inside a DP group, DP groups of one size):
    # 1. its own split (both kinds in the job); 2. the window's cut, between the highest pipeline and
    # the lowest collective overlap the jobs with both kinds showed (a transport and library set the
    # levels; a job of one kind has nothing to split); 3. the test against chance; 4. all in turn.
    jt_pairs = p.filter("job_traffic")
    own, own_start = {}, {}
    for (j,), g in jt_pairs.group_by(["job_id"]):
        b = g.filter(~pl.col("one_way"))
        c = overlap_split(b["overlap"].to_numpy(), b["overlap_z"].to_numpy(), zbar, int(b["n_sample"].max() or 1))
        own[j] = c if c is not None and _consistent(g, pl.col("overlap") > c) else None
        if own[j] is None:
            # the same two modes in how often the directions START together: a streaming
            # activation or a 1F1B pipeline overlaps its gradient about half the time (no two-fold
            # gap to a collective's overlap), but both ends of a collective hop send at once and a
            # pipeline hop's two directions start together seldom. Only a split the job's
            # structure bears out in full: no pipeline hop inside a DP group, DP groups of one
            # size, pipeline hops in chains, every rank of a pipeline hop in a DP group too
            c = overlap_split(b["start_co"].to_numpy(), b["start_z"].to_numpy(), zbar, int(b["n_sample"].max() or 1))
            dp = pl.col("start_co") > (c if c is not None else 2.0)
            if c is not None and _consistent(g, dp, uniform=True) and _chains(g, dp) and _both_kinds(g, dp):
                own_start[j] = c
    split = jt_pairs.filter(~pl.col("one_way")).join(
        pl.DataFrame({"job_id": list(own), "c": list(own.values())}, schema={"job_id": pl.Utf8, "c": pl.Float64}),
        on="job_id").filter(pl.col("c").is_not_null())
    fleet_cut, lo_dp = None, None
    eps = 0.5 / max(int(jt_pairs["n_sample"].max() or 1), 1)
    if split.height:
        hi_pp = split.filter(pl.col("overlap") <= pl.col("c"))["overlap"].max()
        lo_dp = split.filter(pl.col("overlap") > pl.col("c"))["overlap"].min()
        if hi_pp is not None and lo_dp is not None and lo_dp > hi_pp:
            fleet_cut = _midpoint(hi_pp, lo_dp, eps)
    # in turn, by the test: not together, and even the upper confidence bound of its overlap (Wilson,
    # at the same bar) below the lowest overlap collective hops showed here (half, when none did):
    # with few flows a pair cannot be told, and then the structure or the size count decides
    # with no level from the data, a collective hop's directions overlap in most of its flows: above
    # chance alone is not enough (a 1F1B pipeline hop sends an activation while the next gradient
    # arrives, now and then). And a pair whose directions start together LESS often than chance
    # (significantly) avoids the other direction: no collective hop does that (both ends send at
    # once); a pipeline hop's gradient waits for the stages after it. In turn, whatever its overlap
    # (a large activation streams while the gradient comes back)
    p = p.with_columns(apart=(pl.col("start_z") < -zbar).fill_null(False))
    # ... unless its two ends also START together significantly more often than chance (a two-rank
    # FSDP group overlapping under half). Not a clean line: a 1F1B hop's next activation may leave
    # as a gradient arrives, a little beyond chance (96-GPU seed 40: start z 3.8-4.5, just over the
    # bar, read DP; docs/figures/flows.md, stop 55)
    p = p.with_columns(together=pl.col("together") & ~pl.col("apart")
                       & ((pl.col("overlap") >= 0.5) | pl.lit(lo_dp is not None) | (pl.col("start_z") > zbar).fill_null(False)))
    together_ov = p.filter(pl.col("job_traffic") & pl.col("together") & ~pl.col("one_way"))["overlap"]
    dp_level = lo_dp if split.height and lo_dp is not None else (together_ov.min() if together_ov.len() else 0.5)
    nn, ph = pl.col("n_sample").clip(lower_bound=1).cast(pl.Float64), pl.col("overlap")
    upper = (ph + zbar ** 2 / (2 * nn) + zbar * (ph * (1 - ph) / nn + zbar ** 2 / (4 * nn ** 2)).sqrt()) / (1 + zbar ** 2 / nn)
    p = p.with_columns(in_turn=(~pl.col("together") & ((upper < dp_level) | pl.col("apart"))).fill_null(False))
    rule = {}  # job -> (cut or None, how); start_split's cut is on start_co, the others' on overlap
    for j, c in own.items():
        g = jt_pairs.filter(pl.col("job_id") == j)
        if c is not None:
            rule[j] = (c, "overlap_split")
        elif j in own_start:
            rule[j] = (own_start[j], "start_split")
        elif fleet_cut is not None and _consistent(g, pl.col("overlap") > fleet_cut):
            rule[j] = (fleet_cut, "window_split")
        elif _consistent(g, pl.col("together"), uniform=True):
            rule[j] = (None, "test")
        else:
            rule[j] = (2.0, "structure")  # no overlap exceeds 2: every balanced pair in turn
    rules = pl.DataFrame({"job_id": list(rule), "cut": [r[0] for r in rule.values()], "how": [r[1] for r in rule.values()]},
                         schema={"job_id": pl.Utf8, "cut": pl.Float64, "how": pl.Utf8})
    p = p.join(rules, on="job_id", how="left")
    feature = pl.when(pl.col("how") == "start_split").then("start_co").otherwise("overlap")
    cut_dp = pl.col("cut").is_not_null() & (feature > pl.col("cut")) & ~pl.col("apart")
    p = p.with_columns(
        timing=pl.when(~pl.col("job_traffic")).then(pl.lit(None, pl.Utf8))
        .when("one_way").then(pl.lit("one_way"))
        .when(cut_dp & (pl.col("how") == "structure")).then(pl.lit("structure_dp"))
        .when(pl.col("cut").is_not_null()).then(
            pl.when(cut_dp).then(pl.col("how") + "_dp").otherwise(pl.col("how") + "_pp"))
        .when("together").then(pl.lit("both_ways_together"))
        .when("in_turn").then(pl.lit("both_ways_in_turn"))
        # the overlap at chance level says nothing where a hop is busy most of the time (an FSDP
        # group of two all-gathers every unit: any shift of one direction still overlaps the
        # other); its two ends still START together significantly more often than chance: a
        # collective hop (the mirror of `apart`)
        .when(pl.col("start_z") > zbar).then(pl.lit("starts_together"))
        .otherwise(pl.lit("unsettled")))
    p = p.with_columns(comm_type=pl.when(~pl.col("job_traffic")).then(pl.lit("other"))
                       .when(pl.col("timing").is_in(["one_way", "both_ways_together", "starts_together"]) | pl.col("timing").str.ends_with("_dp"))
                       .then(pl.lit("DP"))
                       .when((pl.col("timing") == "both_ways_in_turn") | pl.col("timing").str.ends_with("_pp")).then(pl.lit("PP"))
                       .otherwise(pl.lit(None, pl.Utf8)),
                       method=pl.when(~pl.col("periodic")).then(pl.lit("aperiodic"))
                       .when(~pl.col("job_traffic")).then(pl.lit("not_job_traffic"))
                       .otherwise(pl.col("timing")),
                       refined=pl.lit(False))
    # the job's structure (index the addresses once)
    ips = pl.concat([p["ip_a"], p["ip_b"]]).unique().sort()
    n = ips.len()
    idx = pl.DataFrame({"ip": ips, "i": np.arange(n)})
    p = p.join(idx.rename({"ip": "ip_a", "i": "a"}), on="ip_a").join(idx.rename({"ip": "ip_b", "i": "b"}), on="ip_b")
    if n:
        # pairs the timing did not settle take what the structure says:
        # - a triangle: pipeline hops form chains (one partner per neighbouring stage), so a pair
        #   closing a triangle of job pairs is a collective hop (a ring or clique of three or more);
        # - transitivity: a pair whose ends the DP pairs already connect lies inside one DP group.
        jt_e = p.filter(pl.col("comm_type") != "other")
        adj = coo_matrix((np.ones(2 * jt_e.height), (np.r_[jt_e["a"].to_numpy(), jt_e["b"].to_numpy()],
                                                     np.r_[jt_e["b"].to_numpy(), jt_e["a"].to_numpy()])), shape=(n, n)).tocsr()
        adj.data[:] = 1.0
        tri = np.asarray((adj @ adj)[p["a"].to_numpy(), p["b"].to_numpy()]).ravel() > 0
        in_tri = pl.Series(tri) & pl.col("comm_type").is_null()
        p = p.with_columns(comm_type=pl.when(in_tri).then(pl.lit("DP")).otherwise("comm_type"),
                           method=pl.when(in_tri).then(pl.lit("dp_triangle")).otherwise("method"),
                           refined=in_tri)
        comp = _components(p, pl.col("comm_type") == "DP", n)
        p = p.with_columns(ca=pl.Series(comp).gather(p["a"].to_numpy()), cb=pl.Series(comp).gather(p["b"].to_numpy()))
        inside = (pl.col("ca") == pl.col("cb")) & (pl.col("comm_type").is_null())
        p = p.with_columns(comm_type=pl.when(inside).then(pl.lit("DP")).otherwise("comm_type"),
                           method=pl.when(inside).then(pl.lit("dp_transitivity")).otherwise("method"),
                           refined=pl.col("refined") | inside)
        # a pair inside a DP group that carried a few messages in this window, one of them as
        # large as the group's usual message (a ring's non-neighbours: the group's broadcast of
        # the model at launch) is the group's pair: DP, said by its method. Control messages,
        # probes and barriers (smaller than what the group moves) and pairs across groups stay `other`
        if "max_flow_bytes" in p.columns:
            msg = p.filter(pl.col("comm_type") == "DP").group_by("ca").agg(
                group_msg=(pl.col("bytes") / pl.col("n_flows").clip(lower_bound=1)).median())
            p = p.join(msg, on="ca", how="left")
            big = (pl.col("max_flow_bytes") >= pl.col("group_msg")).fill_null(False)
        else:
            big = pl.lit(False)
        member = (pl.col("ca") == pl.col("cb")) & (pl.col("method") == "aperiodic") & big
        p = p.with_columns(comm_type=pl.when(member).then(pl.lit("DP")).otherwise("comm_type"),
                           method=pl.when(member).then(pl.lit("dp_group_member")).otherwise("method"),
                           refined=pl.col("refined") | member)
        # what neither timing nor structure settles keeps the size count
        rest = pl.col("comm_type").is_null()
        p = p.with_columns(comm_type=pl.when(rest).then("raw_type").otherwise("comm_type"),
                           method=pl.when(rest).then(pl.lit("size_count")).otherwise("method"))
        # DP groups: connected components of the DP pairs
        comp = pl.Series(_components(p, pl.col("comm_type") == "DP", n), dtype=pl.Int64)
        p = p.with_columns(dp_group=pl.when(pl.col("comm_type") == "DP").then(comp.gather(p["a"].to_numpy())))
    else:
        p = p.with_columns(dp_group=pl.lit(None, dtype=pl.Int64))
    return p.select("pid", "ip_a", "ip_b", "job_id", "comm_type", "n_flows", "bytes", "n_steps", "mode_distinct_sizes",
                    "raw_type", "method", "refined", "dp_group", "dir_share", "dir_byte_share", "overlap", "overlap_chance",
                    "overlap_z", "start_co", "start_z").sort("job_id", "ip_a", "ip_b")
