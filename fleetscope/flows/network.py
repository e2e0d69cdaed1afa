"""Network localization (LLMPrism IV-D switch-level diagnosis, made relative and explained across jobs):
which NIC or switch slows the flows that cross it, judged against the flows' peers, never against a
nominal bandwidth.

Each DP/PP data flow gets a rate residual (log bytes over duration) against its peers, the flows of
the same job, type and size class (of its transfer: the records of one stream that abut in time) in
the same time bin: for a collective over three or more GPU pairs, the flow-weighted
median of its pairs' levels (one slowed ring among a job's rings cannot drag it), else the trimmed mean
of the flows (a pipeline's hops move activations one way and gradients the other). A second residual
compares it with the same pair's level over the span (its own history) or in earlier windows, for a
fault that slows most of a collective for a while. Levels are trimmed means (stats.trimmed_mean): a
ring's chunks often move at two rates, and a median of two equal modes flips between them.

Localization is Boolean network tomography with the collectives' behaviour built in. Every flow is
an observation of its path (both NICs and every switch it crosses). A candidate element is suspect in
a time bin when the trimmed mean residual of the flows crossing it is significantly below zero (Yuen's
test against the cell's own spread, never below the fleet's, a Bonferroni bar from the detector's
false-alarm budget, fleetscope.flows.stats) and by more than a practical floor (min_bw_drop). Suspects
explain the slow flows greedily, the largest explained variance first. A chosen cause explains not only
the flows crossing it but every flow of the collectives they belong to (a ring moves at its slowest
hop's pace, so its other hops' flows slow down too: the median of the collective's other flows, up to
the median of its own hops across the cause), in the bins it was named in and their neighbours (its
onset falls inside a bin), and every transfer moving in lockstep with its own (with_cohorts: a ring
whose hops are pairs of their own in the flows is one collective only by its timing). The rest are re-tested, so the NICs and rail leaves of a ring through a
congested spine are never named for it. Equal explanations: a cause an earlier window named (prior
suspects: the evidence that told it from its neighbours then may be gone), then the one carrying the
most slow hops itself; both ends of the same slow flows tied with the switch between them name the
switch. One ring paced as a whole cannot tell its elements apart: the tie is said in the evidence, with
the elements that carry the same slow flows and whose other flows never needed more than the slow ones
got (fair_share_evidence: they cannot clear it).

A link that flaps stalls a few flows in episodes (stall_causes, a Poisson test per candidate)."""
from __future__ import annotations

import json

import numpy as np
import polars as pl
from numba import njit

from fleetscope.flows.config import FlowConfig
from fleetscope.flows.order import over_runs, sort_by
from fleetscope.common import MAD_TO_SIGMA
from fleetscope.flows.stats import TRIM, bonferroni_z, trimmed_mean, window_alpha, winsorized_std


def window_levels(res: pl.DataFrame, wid: str, window_start_ns: int) -> pl.DataFrame:
    """The window's contribution to the pairs' history (table flow_pair_rates): per directed pair, route
    (the switches its flows crossed, '>'-joined; empty when the records give none) and size class of
    its transfers, its flows and its healthy level in the window (flow_residuals' lvl_win)."""
    return res.group_by("src_ip", "dst_ip", "route", size_class="size").agg(n_flows=pl.len().cast(pl.Int64),
                                                                         log_rate=pl.col("lvl_win").first()) \
        .with_columns(window_id=pl.lit(wid), window_start_ns=pl.lit(window_start_ns, dtype=pl.Int64)) \
        .sort("src_ip", "dst_ip", "route", "size_class")


def _route() -> pl.Expr:
    return pl.col("path").list.join(">").fill_null("")


def history_levels(history: pl.DataFrame | None, cfg: FlowConfig) -> pl.DataFrame | None:
    """Per directed pair, route and size class, its level over earlier windows (flow_pair_rates rows): the median of the
    windows' medians, where they hold at least min_peer_flows flows. None without history."""
    if history is None or history.height == 0:
        return None
    return history.group_by("src_ip", "dst_ip", "route", size="size_class").agg(lvl_prev=pl.col("log_rate").median(), n_prev=pl.col("n_flows").sum()) \
        .filter(pl.col("n_prev") >= cfg.min_peer_flows)


def flow_residuals(flows: pl.DataFrame, pairs: pl.DataFrame, cfg: FlowConfig,
                   history: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per data flow (DP, PP and background): fid, job_id (null: background), unit (the collective it
    belongs to: its job's DP group, or its pair), bin, start/end, src_ip, dst_ip, path, route, e_peer,
    e_hist, and lvl_win: the pair's healthy level in this window (its history for later windows)."""
    # background transfers (storage reads, checkpoint writes) are observations of their paths too: a
    # spine that only one job's rings cross is told from the other spine those rings cross by the
    # storage reads that go through each
    # (data records and the columns used here first, then their pairs' labels: no copy of every column)
    used = [c for c in ("start_ns", "end_ns", "bytes", "src_ip", "dst_ip", "src_port", "dst_port", "src_qp", "dst_qp",
                        "path", "pid") if c in flows.columns]
    f = flows.filter((pl.col("end_ns") > pl.col("start_ns")) & (pl.col("bytes") >= cfg.min_data_bytes)).select(used)
    f = f.join(pairs.filter(pl.col("comm_type").is_in(["DP", "PP"])).select("pid", "job_id", "comm_type", "dp_group"),
               on="pid", how="left").with_columns(pl.col("comm_type").fill_null("bg"))
    if f.height == 0:
        return f
    # a transfer: the records of one stream (pair, ports, queue pairs) that abut in time (an exporter
    # cutting a long transfer by time writes pieces end to end; a slowed transfer is cut into more,
    # smaller pieces, so the pieces' size would tell slowed from healthy flows and hide the fault)
    # ... but records that abut because whole transfers ran back to back (a bucket exporter's records of
    # a ring paced by a congested switch: the sender is never idle) are as many transfers: chunks of one
    # size (three or more: a collector mirroring both ends writes each record twice; and a last, smaller
    # one) moving at one rate, where a time cut's pieces take as many sizes as the rate varies, or end on
    # a remainder moved at another rate (an exporter writing equal bytes per piece). Merged, a slowed ring's chunks became a size class with no healthy level, and its hops
    # through the switch had no baseline (demo seed 806). One rate: within 1 %, the jitter of exporters'
    # clocks on such records. Collectives only: storage transfers are judged by their server, not size
    stream = [c for c in ("src_ip", "dst_ip", "src_port", "dst_port", "src_qp", "dst_qp") if c in f.columns]
    # abut: within the records' clock tick (an exporter's timer piece may start a nanosecond after the
    # one before ends, its times rounded: demo seed 811's pieces were all transfers of their own, the
    # wait of an early ring member stayed in one piece and read as a stall)
    tick = clock_tick(f["start_ns"])
    # (a complete order: records mirrored at both ends tie on the stream and, with microsecond stamps, on
    # the start; which came first must not depend on the order the rows arrived in). Only the columns used
    # here travel through the sort (order.sort_by: packed keys)
    keep = dict.fromkeys(["start_ns", "end_ns", "bytes", *stream, "path", "pid", "job_id", "comm_type", "dp_group"])
    f = sort_by(f.select([c for c in keep if c in f.columns]), [*stream, "start_ns", "end_ns", "bytes"])
    # a stream's first record, from the sorted rows themselves (a window per stream key cost a hash group
    # of six columns, twice)
    first = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in stream]) | (pl.int_range(pl.len()) == 0)
    f = f.with_columns(run=first | (pl.col("start_ns") > pl.col("end_ns").shift(1) + tick))
    f = f.with_columns(tid=pl.col("run").cum_sum())
    rate = pl.col("bytes").cast(pl.Float64) / (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)
    # an exporter's timer: a duration that pieces followed by another piece of their stream share to the
    # nanosecond, pieces of different sizes (a stalled transfer's pieces are all alike, and may have no
    # remainder in the window, but the timer cut other transfers too: 64-GPU seed 2174)
    dur = pl.col("end_ns") - pl.col("start_ns")
    f = f.with_columns(d=dur, cont=~pl.col("run").shift(-1).fill_null(True))
    timer = f.filter("cont").group_by("d").agg(n=pl.len(), nb=pl.col("bytes").n_unique()) \
        .filter((pl.col("n") >= cfg.min_peer_flows) & (pl.col("nb") >= 2))["d"]
    # (per transfer: the rows are in stream and time order, so each tid is a contiguous run: order.over_runs)
    same = f.group_by("tid", "bytes").len().group_by("tid").agg(same=pl.col("len").max())
    # (the timer test per row first: a list literal inside the runs' aggregation is copied to every run)
    f = f.with_columns(on_timer=pl.col("d").is_in(timer.implode()) & pl.col("cont"))
    f = over_runs(f, "tid", timed=pl.col("on_timer").any(),
                  n_b=pl.col("bytes").n_unique(), r_max=rate.max(), r_min=rate.min())
    f = f.with_columns(same=same.sort("tid")["same"].gather(pl.Series(f["tid"].to_numpy().astype(np.int64) - 1)))
    chunks = (pl.col("same") >= 3) & (pl.col("n_b") <= 2) & ~pl.col("timed") \
        & (pl.col("r_max") <= 1.01 * pl.col("r_min")) & (pl.col("comm_type") != "bg")
    f = f.with_columns(tid=(pl.col("run") | chunks).cum_sum()).drop("run", "same", "d", "cont", "on_timer", "timed", "n_b", "r_max", "r_min")
    f = collective_wait(f)
    # a transfer's rate is its bytes over its pieces' time, on each of its pieces: an exporter that cuts
    # it by time may split its bytes equally over the pieces, and a short remainder then "moves" at many
    # times the link's rate (demo seed 821: e^8.6 bytes/ns, lifting a healthy ring's level over its
    # peers). Time summed, not spanned: a record mirrored from both ends overlaps its twin
    f = over_runs(f.with_row_index("fid"), "tid", tb=pl.col("bytes").sum(),
                  tt=(pl.col("end_ns") - pl.max_horizontal("start_ns", "t0")).clip(lower_bound=0).sum())
    f = f.with_columns(
        x=(pl.col("tb").cast(pl.Float64) / pl.col("tt").cast(pl.Float64)).log(),
        # transfers of one size class
        size=pl.col("tb").cast(pl.Float64).log(2).round(0).cast(pl.Int32),
        bin=(pl.col("start_ns") // cfg.diag_bin_ns),
        # a transfer timed within the clock's resolution has no rate of its own (a 512 KB record of 1 ns
        # "moves" at e^13.5 bytes/ns; four such among a two-member pair's eight transfers of a size set
        # its median level to e^7: 64-GPU seed 2196): the single-transfer (stall) levels leave it out.
        # (The rate levels keep it: their trimmed means and the localization were built with it)
        clocked=pl.col("tt") >= tick,
    ).drop("tb", "tt")
    key = ["job_id", "comm_type", "size"]
    # history: the same pair in the same direction on the same path moving transfers of the same size
    # over the span (in a small ring most of a collective's flows may cross the faulty NIC, and then its
    # peers are no baseline; a link slowed one way leaves the other way at its usual rate; ECMP spreads
    # one pair's flows over spines, and only those crossing a congested one slow; a pair's small
    # messages move slower than its large ones): pair_levels
    f = f.with_columns(route=_route())
    f = f.with_columns(hid=pl.struct("src_ip", "dst_ip", "route", "size").hash())
    # a pair's level is a trimmed mean of its flows (stats.trimmed_mean: a median of a ring's chunks moving
    # at two rates flips between the modes). The peers' level of a collective's flows is the median of its
    # pairs' levels, weighted by their flows (the pairs of one slowed ring, a minority of a job's rings,
    # cannot drag it as they would a mean); a pipeline's few hops carry activations one way and
    # gradients the other, at rates of their own: their peers' level is the trimmed mean of their flows
    # (so is a collective's over fewer than three pairs of GPUs, where a median is no more robust than a mean)
    pairs_lv = f.group_by(*key, "bin", "src_ip", "dst_ip").agg(lp=trimmed_mean(pl.col("x")), k=pl.len()) \
        .sort(*key, "bin", "lp", nulls_last=True).with_columns(
            cum=pl.col("k").cum_sum().over(key + ["bin"]), n_peer=pl.col("k").sum().over(key + ["bin"]))
    pairs_lv = pairs_lv.with_columns(n_pairs=pl.struct(a=pl.min_horizontal("src_ip", "dst_ip"), b=pl.max_horizontal(
        "src_ip", "dst_ip")).n_unique().over(key + ["bin"]))
    peer = pairs_lv.filter(2 * pl.col("cum") >= pl.col("n_peer")).group_by(*key, "bin").agg(
        med=pl.col("lp").first(), n_peer=pl.col("n_peer").first(), n_pairs=pl.col("n_pairs").first()) \
        .join(f.group_by(*key, "bin").agg(tm=trimmed_mean(pl.col("x")), base_peer_s=pl.col("x").filter("clocked").median()),
              on=[*key, "bin"], nulls_equal=True) \
        .select(*key, "bin", "n_peer", "base_peer_s", "n_pairs", base_peer=pl.when((pl.col("comm_type") == "DP") & (pl.col("n_pairs") >= 3))
                .then("med").otherwise("tm"))
    f = f.join(peer, on=[*key, "bin"], how="left", nulls_equal=True).with_columns(n_hist=pl.len().over("hid"))
    # stall_causes judges single transfers against medians (a stalled transfer is an outlier of its
    # pair's and its peers' typical one): the _s levels
    lv = pair_levels(f, levels={"trim": trimmed_mean}).select("hid", base_hist="base_step_trim").join(
        pair_levels(f.filter("clocked"), levels={"med": lambda x: x.median()}).select("hid", base_hist_s="base_step_med"),
        on="hid", how="left")
    # a pair's rate that steps down within the span: its faster side is its healthy level, whether or
    # not the job's steps slowed (a congested switch on overlapped communication slows its flows by
    # half and the steps by 1 %; gating this on slowed steps left a spine that every flow of its job
    # crosses, slow for most of the span, with no baseline at all: demo seed 384). A neighbour that
    # stops and speeds a pair up is judged by the same test as any element: its slow side must be
    # shared by the flows crossing one element, against the Bonferroni bar
    f = f.join(lv, on="hid", how="left")
    f = f.with_columns(lvl_win=pl.col("base_hist"))
    # the pair's level in earlier windows: a fault present through the whole window has its onset there
    # (the level the pair had before, where that is higher than the window's own)
    prev = history_levels(history, cfg)
    if prev is not None:
        f = f.join(prev, on=["src_ip", "dst_ip", "route", "size"], how="left").with_columns(
            base_hist=pl.max_horizontal("base_hist", "lvl_prev"), base_hist_s=pl.max_horizontal("base_hist_s", "lvl_prev"),
            n_hist=pl.max_horizontal("n_hist", pl.col("n_prev").fill_null(0)))
    # a route class's place among its peers: hops through a spine (or across pods) may move slower
    # than a ring's hops inside a leaf on a healthy fabric (oversubscribed uplinks, longer round
    # trips), every bin, on every spine. The fleet's typical offset of each path length (the median
    # over its pairs, so one congested spine among several cannot set it) is the class's own level,
    # not a fault of the element its flows share; only a slower class is corrected (a faster one
    # never makes its peers look slow)
    peer_ok = (pl.col("n_peer") >= cfg.min_peer_flows) & (pl.col("comm_type") != "bg")
    f = f.with_columns(plen=pl.col("path").list.len(), off=pl.when(peer_ok).then(pl.col("x") - pl.col("base_peer")))
    cls = f.filter(pl.col("off").is_not_null()).group_by("plen", "src_ip", "dst_ip").agg(po=pl.col("off").median()) \
        .group_by("plen").agg(cls_off=pl.col("po").median())
    f = f.join(cls, on="plen", how="left", nulls_equal=True).with_columns(
        base_peer=pl.col("base_peer") + pl.min_horizontal(pl.col("cls_off").fill_null(0.0), 0.0),
        base_peer_s=pl.col("base_peer_s") + pl.min_horizontal(pl.col("cls_off").fill_null(0.0), 0.0))
    f = with_cohorts(f, cfg).join(background_levels(f), on="fid", how="left")
    f = f.join(_stall_levels(f.filter("clocked"), cfg), on=["src_ip", "dst_ip", "route", "size"], how="left", nulls_equal=True)
    return f.with_columns(
        # background transfers have no peers moving the same thing at the same time (two storage
        # servers serve at their own rates): only their own history is a baseline
        e_peer=pl.when((pl.col("n_peer") >= cfg.min_peer_flows) & (pl.col("comm_type") != "bg"))
        .then(pl.col("x") - pl.col("base_peer")),
        e_hist=pl.when(pl.col("n_hist") >= cfg.min_peer_flows).then(pl.col("x") - pl.col("base_hist")),
        # (a single transfer's peers are other pairs: a two-member group's one pair is no baseline for itself)
        e_peer_s=pl.when((pl.col("n_peer") >= cfg.min_peer_flows) & (pl.col("comm_type") != "bg") & (pl.col("n_pairs") >= 2)
                         & pl.col("clocked"))
        .then(pl.col("x") - pl.col("base_peer_s")),
        e_hist_s=pl.when(~pl.col("clocked")).then(None).when(pl.col("own_ok")).then(pl.col("x") - pl.col("base_hist_s"))
        .otherwise(pl.col("x") - pl.col("floor_s")),
        unit=pl.when(pl.col("comm_type") == "DP").then(pl.lit("dp:") + pl.col("job_id") + "/" + pl.col("dp_group").cast(pl.Utf8))
        .otherwise(pl.col("comm_type") + ":" + pl.col("pid").cast(pl.Utf8)),
        cohort=pl.col("job_id") + "/" + pl.col("cohort").cast(pl.Utf8),
    ).select("fid", "job_id", "unit", "cohort", "bin", "start_ns", "end_ns", "src_ip", "dst_ip", "path", "route", "size", "x", "e_peer",
             "e_hist", "lvl_win", "e_peer_s", "e_hist_s", "e_bg")


def clock_tick(ns: pl.Series) -> int:
    """The resolution of a clock's timestamps (the largest power of ten that divides them all, a
    nanosecond at least) plus two nanoseconds of rounding: times closer than this are the same time."""
    v = ns.drop_nulls()
    k = next((k for k in range(9, 0, -1) if v.len() and ((v % 10 ** k) == 0).all()), 0)
    return 10 ** k + 2


def collective_wait(f: pl.DataFrame) -> pl.DataFrame:
    """t0: when each transfer (tid: the records of one stream that abut) could move, its start less the
    wait for its collective's last member. A rank enters a collective on its own and sends its own chunk
    at once; the chunks it forwards move only once every member entered. An exporter that merges the
    burst, the idle wait and the rest (a flowlet's idle timeout longer than the wait) writes a record
    whose rate counts the wait: healthy rings whose members arrive a few ms apart then "stall" on the
    early members' links. Judged per transfer, not per record: an exporter that cuts by time (active
    timeout) spreads the wait over pieces that end on its timer, and only the transfer's last piece ends
    with the collective (demo seed 811: three NICs "stalled" by their rings' waits).
    A collective's transfers end together (the ring completes at once): per DP group, transfers whose
    ends follow each other by less than a tenth of the shorter one's duration are one collective (a
    pipelined ring's hops end within microseconds of each other; gloo's chunks, passed on one after
    the other, end a fair part of their own time apart: taken for one collective at half of it, the
    real recording flow_faults/seed10/pp2dp3-straggler-s10 had its chunks sped up and a leaf
    "stalled" in place of its straggler), and a transfer starts no earlier than the latest start among
    that collective's transfers of at least its size that began before it ended (the last member's hop,
    or an early member's remainder once the others entered). A transfer that follows its pair's
    previous one back to back is mid-stream: its sender was sending, not entering the collective, and
    its time is its own (a congested hop of a ring moves each chunk continuously at half the rate while
    the ring's fast hops start each chunk late and end with it: taken for waits, the slow hops moved at
    the fast ones' rate and the congested leaf of demo seed 819 went unseen); an entry follows compute.
    (An early member that enters collectives back to back, always ahead of a slow peer, looks the same
    in the records and keeps its wait: its rate reads low against the late member's; the records'
    times cannot tell it from a congested hop, and a missed congestion was the worse error.)
    A slowed link, a congested switch or a stall slow every hop of their rings alike from the same
    start: only the wait is removed."""
    dp = (pl.col("comm_type") == "DP") & pl.col("dp_group").is_not_null()
    g = ["job_id", "dp_group"]
    dur = pl.col("end_ns") - pl.col("start_ns")
    x = f.filter(dp).group_by("tid").agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("bytes").sum(),
                                         *[pl.col(c).first() for c in ("src_ip", "dst_ip", *g)])
    if x.height == 0:
        return f.with_columns(t0=pl.col("start_ns"))
    hop = [*g, "src_ip", "dst_ip"]
    x = sort_by(x, [*hop, "start_ns", "end_ns", "tid"])
    new_hop = pl.any_horizontal([pl.col(c).ne_missing(pl.col(c).shift(1)) for c in hop]) | (pl.int_range(pl.len()) == 0)
    x = sort_by(x.with_columns(prev_end=pl.when(new_hop).then(None).otherwise(pl.col("end_ns").shift(1))),
                [*g, "end_ns", "start_ns", "tid"])
    x = x.with_columns(
        new=((pl.col("end_ns").diff() > 0.1 * pl.min_horizontal(dur, dur.shift(1))).fill_null(True)
             | (pl.struct(g) != pl.struct(g).shift(1)).fill_null(True))).with_columns(inst=pl.col("new").cum_sum())
    # per transfer: the latest start among its collective's transfers of at least its size (cumulative
    # maximum over the collective's transfers by size, largest first; equal sizes share it) that began
    # before it ended
    x = sort_by(x.with_columns(nb=-pl.col("bytes")), ["inst", "nb"]).drop("nb").with_columns(
        s_big=pl.col("start_ns").cum_max().over("inst")).with_columns(s_big=pl.col("s_big").max().over("inst", "bytes"))
    mid = (pl.col("start_ns") - pl.col("prev_end")) < 0.1 * (pl.col("end_ns") - pl.col("s_big"))
    x = x.with_columns(t0=pl.when((pl.col("s_big") < pl.col("end_ns")) & ~mid.fill_null(False))
                       .then(pl.max_horizontal("start_ns", "s_big")).otherwise("start_ns"))
    # (each record's transfer looked up by its id, a position: tids count up from 1)
    tids = x["tid"].to_numpy()
    t0 = np.zeros(int(max(tids.max(), f["tid"].max())) + 1, dtype=np.int64)
    has = np.zeros(len(t0), dtype=bool)
    t0[tids], has[tids] = x["t0"].to_numpy(), True
    ft = f["tid"].to_numpy()
    return f.with_columns(t0=pl.when(pl.Series(has[ft])).then(pl.Series(t0[ft])).otherwise(pl.col("start_ns")))


def _stall_levels(f: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """Per directed pair, route and size class: own_ok, whether the class's level was measured at
    min_peer_flows moments or more (its DP flows' cohorts, else its transfers), and floor_s, the
    lowest such level among the pair's classes on that route: a single transfer's baseline (the stall
    test's) where its own class has none. A link that goes down holds what it carries, and an exporter
    merges the held pieces into one long record of a size of its own (64-GPU seed 2191: a 119 MB
    record in 650 ms, four queue pairs, two moments, where the pair moves 26 MB pieces in 4 ms): that
    class's level is the stall itself. The slowest credible class, not the largest smaller one: a
    paced ring hop moves its larger transfers slower than its small ones all the time (seed 2195)."""
    moment = pl.coalesce(pl.col("cohort").cast(pl.Utf8), pl.lit("t") + pl.col("tid").cast(pl.Utf8))
    cls = f.group_by("src_ip", "dst_ip", "route", "size").agg(lv=pl.col("x").median(), m=moment.n_unique()) \
        .with_columns(own_ok=pl.col("m") >= cfg.min_peer_flows)
    return cls.with_columns(floor_s=pl.when("own_ok").then("lv").min().over("src_ip", "dst_ip", "route")) \
        .select("src_ip", "dst_ip", "route", "size", "own_ok", "floor_s")


def background_levels(f: pl.DataFrame) -> pl.DataFrame:
    """fid, e_bg of each background transfer: its log rate against the concurrent transfers of the
    address it shares with them (a storage server's reads to its clients in the same time bin: the
    median of its pairs' levels, over three or more pairs). What a server sends at once meets its own
    load alike; a client behind a congested switch gets its share slower. None where the address has
    fewer partners in the bin."""
    bg = f.filter(pl.col("comm_type") == "bg")
    out = []
    for side in ("src_ip", "dst_ip"):
        lv = bg.group_by("src_ip", "dst_ip", "bin").agg(lp=trimmed_mean(pl.col("x"))) \
            .group_by(side, "bin").agg(ref=pl.col("lp").median(), n_pairs=pl.len()).filter(pl.col("n_pairs") >= 3)
        out.append(bg.join(lv, on=[side, "bin"]).select("fid", "n_pairs", e_bg=pl.col("x") - pl.col("ref")))
    # the address with more partners is the shared end (the server)
    return pl.concat(out).sort("fid", "n_pairs", descending=[False, True]).unique("fid", keep="first").select("fid", "e_bg")


@njit(cache=True)
def _cohorts(job: np.ndarray, s: np.ndarray, e: np.ndarray, iou: float) -> np.ndarray:
    """Cohort ids of intervals sorted by (job, start): each joins the open cohort whose first interval
    overlaps it most (intersection over union >= iou, the largest), else opens its own. Open cohorts
    are those whose first interval has not ended."""
    n = s.shape[0]
    out = np.empty(n, np.int64)
    ls = np.empty(n, np.int64)
    le = np.empty(n, np.int64)
    lid = np.empty(n, np.int64)
    k, nid, cur = 0, 0, -1
    for i in range(n):
        if job[i] != cur:
            k, cur = 0, job[i]
        j = 0
        for t in range(k):
            if le[t] > s[i]:
                ls[j], le[j], lid[j] = ls[t], le[t], lid[t]
                j += 1
        k = j
        best, bid = iou, -1
        for t in range(k):
            inter = min(le[t], e[i]) - max(ls[t], s[i])
            union = max(le[t], e[i]) - min(ls[t], s[i])
            if union > 0 and inter / union >= best:
                best, bid = inter / union, lid[t]
        if bid < 0:
            bid = nid
            nid += 1
            ls[k], le[k], lid[k] = s[i], e[i], bid
            k += 1
        out[i] = bid
    return out


def with_cohorts(f: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """`cohort` of each DP flow: the job's DP flows that move together: each shares its time span with
    the cohort's first as closely as a transfer slower by the detector's practical floor would
    (intersection over union >= 1 - min_bw_drop), so a ring paced by a fault and the rings moving at
    their usual rate beside it, started at once, are cohorts of their own (demo seed 747: a spine
    halving one channel's rings). A collective is the transfers that move together, not the pairs
    its addresses connect: a ring over hosts whose ranks meet inside each host (FSDP over three hosts
    with tensor parallelism inside them) shows each of its network hops as its own pair and DP group,
    and a ring paced by a congested spine on one hop moves its other hops, on other spines, in
    lockstep with it (demo seed 725); its reverse ring and the job's other rings, not paced, end
    sooner and are cohorts of their own. Where a job's rings all move alike they are one cohort,
    which changes nothing: none of them is slow."""
    dp = (pl.col("comm_type") == "DP") & pl.col("job_id").is_not_null()
    d = f.filter(dp).select("fid", "job_id", "start_ns", "end_ns").sort("job_id", "start_ns", "end_ns")
    if d.height == 0:
        return f.with_columns(cohort=pl.lit(None, dtype=pl.Int64))
    jc = d["job_id"].rank("dense").cast(pl.Int64).to_numpy()
    coh = _cohorts(jc, d["start_ns"].to_numpy(), d["end_ns"].to_numpy(), 1.0 - cfg.min_bw_drop)
    return f.join(d.select("fid", cohort=pl.Series(coh)), on="fid", how="left")


SPREAD_FLOOR = 0.01   # log-rate jitter of one pair's transfers below which their spread is ties, not noise


def pair_levels(f: pl.DataFrame, min_side: int = 8, level=trimmed_mean, levels: dict | None = None) -> pl.DataFrame:
    """Per pair and direction (hid): base_med, its level over the span (`level` of its log rates: a trimmed
    mean; stall_causes uses medians), and base_step, its healthy level
    when its rate steps at one point (a fault's onset or end): the split of its flows in time with the
    largest t of the difference of the two sides' means, against the pair's robust spread, past a
    Bonferroni bar over every pair and split, gives the faster side; else base_med (a fault lasting
    most of the span would otherwise make the slow level the baseline). `levels` ({name: level}) gives
    several levels from one split: base_med_<name> and base_step_<name>."""
    # the sides' means of rates winsorized at the pair's own 1st and 99th percentiles: an exporter's
    # degenerate record (a piece cut to 1 ns carries its bytes at a petabyte per second) would
    # otherwise lift one side's mean, and the faster side is the pair's healthy level. Their spread is
    # robust (the median absolute deviation) unless it is below the rates' jitter floor: a ring's
    # chunks move at two rates, and where more than half of them move at exactly one rate (the
    # simulator's exact rates) it is zero and a chance change in the two rates' shares passes for a
    # step (simulator seed 0's healthy job: every large transfer of one job "slow" against its faster
    # side); there the winsorized values' standard deviation, the mixture's own scale, is the spread
    # (ties in time, a record mirrored at both ends with microsecond stamps, ordered by rate: the split's
    # running sums must not depend on the order rows happened to arrive in)
    g = sort_by(f.select("hid", "start_ns", "x"), ["hid", "start_ns", "x"])
    # (the rows are sorted by pair: each pair is a contiguous run, numbered in order; order.over_runs)
    g = g.with_columns(run=(pl.col("hid") != pl.col("hid").shift(1)).fill_null(True).cum_sum())
    g = over_runs(g, "run", q_lo=pl.col("x").quantile(0.01), q_hi=pl.col("x").quantile(0.99), n=pl.len())
    g = g.with_columns(pl.col("x").clip(pl.col("q_lo"), pl.col("q_hi"))).drop("q_lo", "q_hi")
    g = over_runs(g, "run", tot=pl.col("x").sum(), mad=MAD_TO_SIGMA * (pl.col("x") - pl.col("x").median()).abs().median(),
                  sd=pl.col("x").std())
    run = g["run"].to_numpy().astype(np.int64)
    k, cs = _run_cumsum(run, g["x"].to_numpy())
    g = g.with_columns(k=pl.Series(k), cs=pl.Series(cs))
    g = g.with_columns(sig=pl.when(pl.col("mad") >= SPREAD_FLOOR).then("mad").otherwise(pl.max_horizontal(SPREAD_FLOOR, "sd")))
    g = g.filter((pl.col("k") >= min_side) & (pl.col("n") - pl.col("k") >= min_side)).with_columns(
        ml=pl.col("cs") / pl.col("k"), mr=(pl.col("tot") - pl.col("cs")) / (pl.col("n") - pl.col("k")))
    g = g.with_columns(t=(pl.col("ml") - pl.col("mr")).abs()
                       / (pl.col("sig") * (1 / pl.col("k") + 1 / (pl.col("n") - pl.col("k"))).sqrt()))
    # (the largest t of each pair, the first of equal ones)
    best = g.group_by("hid").agg(pl.col("t", "ml", "mr").get(pl.col("t").arg_max()))
    bar = bonferroni_z(0.01, max(g.height, 1))
    named = {"": level} if levels is None else {f"_{k}": v for k, v in levels.items()}
    base = f.group_by("hid").agg(**{f"base_med{k}": v(pl.col("x")) for k, v in named.items()}) \
        .join(best.select("hid", "t", "ml", "mr"), on="hid", how="left")
    return base.select("hid", *[c for k in named for c in (
        pl.col(f"base_med{k}"),
        pl.when(pl.col("t") > bar).then(pl.max_horizontal("ml", "mr")).otherwise(f"base_med{k}").alias(f"base_step{k}"))])


@njit(cache=True)
def _run_cumsum(run: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of contiguous runs: its 1-based position in its run and the running sum of x over the run."""
    n = len(x)
    k = np.empty(n, np.int64)
    cs = np.empty(n, np.float64)
    for i in range(n):
        if i == 0 or run[i] != run[i - 1]:
            k[i], cs[i] = 1, x[i]
        else:
            k[i], cs[i] = k[i - 1] + 1, cs[i - 1] + x[i]
    return k, cs


def _candidates(r: pl.DataFrame) -> pl.DataFrame:
    """The elements each flow crosses: switches on its path and both NICs. Hosts are not candidates
    of this rate test: a host whose GPUs compute late moves no byte slower, it delays when its
    messages leave (fleetscope.flows.late_ranks); as a candidate it only competed with the switch
    whose rings pace its flows (the demo's congested spine was named as a host)."""
    # the switches of each distinct route once (a fleet's flows take a few hundred routes), then joined to
    # the flows by route: exploding every flow's path and deduplicating the result grew with flows x hops
    if "route" not in r.columns:
        r = r.with_columns(route=_route())
    rt = r.filter(pl.col("path").is_not_null()).select("route", cand=pl.col("path")).unique("route") \
        .explode("cand").drop_nulls("cand").unique()
    sw = r.filter(pl.col("path").is_not_null()).select("fid", "bin", "route").join(rt, on="route").drop("route") \
        .with_columns(kind=pl.lit("switch"))
    # (a flow's two NICs differ: flows never loop back to their source)
    nic = pl.concat([r.select("fid", "bin", cand=pl.col(c)) for c in ("src_ip", "dst_ip")]).with_columns(kind=pl.lit("nic"))
    return pl.concat([sw, nic]).filter(pl.col("cand").is_not_null())


def element_tier(r: pl.DataFrame) -> pl.DataFrame:
    """Per switch on the flows' paths, the order in which elements carrying the same flows are named
    (localize): 2 for a spine (inside some path: it joins switches), 3 for a leaf (only at a path's
    ends, next to NICs). NICs are 0 (set by localize). cand, tier."""
    p = r.filter(pl.col("path").is_not_null()).select(pl.col("path")).with_columns(n=pl.col("path").list.len()) \
        .with_row_index("fid").explode("path").with_columns(pos=pl.int_range(pl.len()).over("fid"))
    inner = (pl.col("pos") > 0) & (pl.col("pos") < pl.col("n") - 1)
    return p.group_by(cand="path").agg(tier=pl.when(inner.any()).then(2).otherwise(3))


def fair_share_evidence(x: pl.DataFrame, floor: float) -> pl.DataFrame:
    """Per candidate and time bin, the flows whose rate can show its slowness. A congested or degraded
    element leaves its flows a share of what it carries (max-min fairness): the jobs' slow flows across
    it reach their share, and a flow that needed less than that moves at its own pace through it, so
    its healthy rate says nothing of the element (a DP group's 64-byte control messages, or an FSDP
    job's transfers spread over its backward pass at a seventh of the fabric's rate, beside a ring
    slowed to half of 42 GB/s: the congested leaf looked healthy, and the other leaf on the ring's
    path was named alone, demo seed 733). Kept: flows whose healthy rate (rate minus residual) reaches
    the highest rate the candidate's slow job flows reached in the bin (the share it left them: slow
    flows of fewer bytes reach less, their latency paid on top); every flow where it has none.
    localize uses it only to say which elements a named cause cannot be told from: whether an element
    is raised at all stays with all of its flows (without them a job slowed as a whole in one bin of a
    healthy fleet, simulator seed 2181, was pinned on the switch its bulk flows crossed).
    x: candidates joined with the flows' fid, e (log-rate residual), x (log rate), unit."""
    job = pl.col("isjob") if "isjob" in x.columns else ~pl.col("unit").str.starts_with("bg:")
    share = x.filter(job & (pl.col("e") < floor)).group_by("kind", "cand", "bin").agg(x_share=pl.col("x").max())
    return x.join(share, on=["kind", "cand", "bin"], how="left") \
        .filter(pl.col("x_share").is_null() | (pl.col("x") - pl.col("e") >= pl.col("x_share"))).drop("x_share")


def localize(r: pl.DataFrame, n_jobs: int, window: tuple[int, int], cfg: FlowConfig,
             cand: pl.DataFrame | None = None, prior: set[str] | None = None) -> tuple[pl.DataFrame, dict]:
    """r: flow_residuals (with `unit`, the collective a flow belongs to); cand: _candidates(r); prior:
    elements named as causes in the windows just before (see below). ->
    (accepted causes: kind, cand, value (rate vs peers), n_slow, n, s, e, bins, jobs, z), stats
    {n_tests, z_bar}.

    Additive tomography, greedy: each flow's standardized residual z (per kind of traffic: a ring's
    chunks move in lockstep, storage reads vary with the server's load) is explained by the elements
    on its path. A candidate c, in a time bin, fits beta per job for the flows crossing it (their
    mean log-rate residual weighted by 1/sigma: a job's flows measure the shift against the job's own
    baselines) and, per collective it carries, gamma between its job's beta and 0 for that
    collective's other flows (a ring paced by its slowest hop slows its other hops too). Its gain is
    the variance it explains, sum W_direct x beta^2 + sum W_pacing x gamma^2 (W: the flows' summed
    weights). Candidates qualify in a bin when the median of
    their own flows' z is significantly below zero (Bonferroni over every candidate and bin, the
    detector's false-alarm budget) and their flows lose more than min_bw_drop of their rate. The
    largest gain is named; its fitted slowness is taken off its flows and the rest re-tested; at the end a
    cause whose cells the other named causes' fits leave unflagged is dropped (backward). Elements
    in series on every slow path explain the same flows: a NIC is named before a switch (endpoint
    faults are the commonest), a spine before a leaf (a leaf's own fault shows on its local flows)."""
    empty = pl.DataFrame(schema={"kind": pl.Utf8, "cand": pl.Utf8, "value": pl.Float64, "n_slow": pl.Int64,
                                 "n": pl.Int64, "s": pl.Int64, "e": pl.Int64, "bins": pl.Int64, "jobs": pl.Utf8,
                                 "z": pl.Float64, "alts": pl.Utf8, "paced": pl.Utf8, "top_ring": pl.Float64,
                                 "top_ring_ips": pl.Utf8})
    if r.height == 0:
        return empty, {"n_tests": 0, "z_bar": None}
    r = r.with_columns(e=pl.min_horizontal(pl.col("e_peer").fill_null(0.0), pl.col("e_hist").fill_null(0.0)))
    for c, t in (("cohort", pl.Utf8), ("e_bg", pl.Float64), ("x", pl.Float64)):
        if c not in r.columns:
            r = r.with_columns(pl.lit(None, dtype=t).alias(c))
    kind_of = pl.col("unit").str.slice(0, 2)   # (dp, PP or bg: the prefix of every unit)
    r = r.with_columns(sig=pl.max_horizontal(pl.lit(0.02), MAD_TO_SIGMA * (pl.col("e") - pl.col("e").median()).abs().median()
                                             ).over(kind_of))
    r = r.with_columns(zf=pl.col("e") / pl.col("sig"))
    cand = _candidates(r) if cand is None else cand
    floor = float(np.log(1 - cfg.min_bw_drop))
    # (whether a flow is the jobs' own, computed per flow once rather than on each of its candidates' rows)
    r = r.with_columns(isjob=~pl.col("unit").str.starts_with("bg:"))
    # (each candidate row takes its flow's values by the flow's position: fid is unique in r)
    pos = np.zeros(int(r["fid"].max()) + 1, dtype=np.int64)
    pos[r["fid"].to_numpy()] = np.arange(r.height)
    at = pl.Series(pos[cand["fid"].to_numpy()])
    x = cand.with_columns(r[c].gather(at) for c in ("e", "zf", "unit", "isjob", "x"))
    xf = None   # fair_share_evidence(x), when a cause is named

    def cells(xx: pl.DataFrame) -> pl.DataFrame:
        # Yuen's trimmed mean (20 %, Wilcox's usual choice) rather than a median: a pair's flows are often
        # bimodal (chunks of a ring at two rates), and a median of two equal modes flips between them on a
        # small shift; the test's scale is the cell's own winsorized spread (never below the fleet's)
        job = pl.col("isjob")
        cell = ["kind", "cand", "bin"]
        c = xx.group_by(cell).agg(n=pl.len(), has_job=job.any(), k_slow=(pl.col("e") < floor).sum())
        # background transfers only exonerate or confirm: a suspect must slow the jobs' own flows
        c = c.filter((pl.col("n") >= cfg.min_flows_per_cell) & pl.col("has_job"))
        # the trimmed statistics only where flag() can pass: a trimmed mean under the floor needs the cell's
        # lower trim quantile under it, so more than TRIM of its flows under it (the rest of a healthy
        # fleet's cells cost one count each)
        may = c.filter(pl.col("k_slow") >= (TRIM * (pl.col("n") - 1)).floor())
        full = xx.join(may.select(cell), on=cell, how="semi").group_by(cell).agg(
            m=trimmed_mean(pl.col("e")), mz=trimmed_mean(pl.col("zf")), sw=winsorized_std(pl.col("zf")).fill_null(0.0),
            mj=trimmed_mean(pl.col("e").filter(job)))
        return c.join(full, on=cell, how="left").drop("has_job").with_columns(
            z=pl.col("mz") / (pl.max_horizontal("sw", 1.0) / ((1 - 2 * TRIM) * pl.col("n").sqrt())))

    c0 = cells(x)
    n_tests = max(c0.height, 1)
    zb = bonferroni_z(window_alpha(cfg.fa_per_job_hour, n_jobs, window[1] - window[0]), n_tests)

    def flag(c: pl.DataFrame) -> pl.DataFrame:
        return c.filter((pl.col("z") < -zb) & (pl.col("m") < floor) & (pl.col("mj") < floor))

    f0 = flag(c0).select("kind", "cand").unique()
    if f0.height == 0:
        return empty, {"n_tests": n_tests, "z_bar": zb}
    # the flows that matter: those of the collectives a suspect carries (the rest stay as they are)
    # ... and those moving in lockstep with a suspect's (its cohorts: with_cohorts)
    touched = x.join(f0, on=["kind", "cand"], how="semi").select("unit", "bin").unique()
    tc = r.join(x.join(f0, on=["kind", "cand"], how="semi").select("fid"), on="fid", how="semi").select("cohort").drop_nulls().unique()
    flows = pl.concat([r.join(touched, on=["unit", "bin"], how="semi"), r.join(tc, on="cohort", how="semi")]).unique("fid") \
        .select("fid", "unit", "cohort", "bin", "zf", "e", "start_ns", "end_ns", "job_id", w=1.0 / pl.col("sig"))
    memb = x.join(f0, on=["kind", "cand"], how="semi").select("kind", "cand", "fid", "unit", "isjob", "bin")
    tier = element_tier(r)
    bgx = cand.join(r.filter(pl.col("e_bg").is_not_null()).select("fid", "e_bg"), on="fid")
    accepted, fits = [], []
    flows0 = flows
    jkey = ["job_id"]
    for _ in range(cfg.max_causes):
        xm = memb.join(flows.select("fid", "zf", "e", "w", "job_id"), on="fid")
        fl = flag(cells(xm))
        if fl.height == 0:
            break
        fm = xm.join(fl.select("kind", "cand", "bin"), on=["kind", "cand", "bin"])
        # the candidates' gains are compared over the same bins: every bin where any of them was flagged
        # (a candidate whose cell in the onset's bin just passed the flag while its rival's just missed
        # it gained that bin alone: demo seed 814, a NIC of a ring under a congested leaf, named with a
        # bin the leaf explained as well)
        fg = xm.join(fl.select("kind", "cand").unique(), on=["kind", "cand"]).join(fl.select("bin").unique(), on="bin")
        # direct level per (candidate, bin, job): a weighted mean of its flows' log-rate residuals (a
        # fault divides the rate of every flow crossing it; each job's baseline is its own, so each
        # job's flows measure the shift afresh), weights 1/sigma of the flow's kind of traffic
        # ... the jobs' flows only: a background transfer has no peers to tell its own slowness from the
        # pacing of a ring it may belong to (a job's pair whose label was lost in this window moves at
        # its ring's pace, on a path that avoids the cause), so it confirms or exonerates (cells), and
        # never outweighs the element the jobs' slow flows share
        dj = fg.filter("isjob").group_by("kind", "cand", "bin", *jkey).agg(nd=pl.col("w").sum(), sd=(pl.col("w") * pl.col("e")).sum()) \
            .with_columns(beta=pl.min_horizontal(pl.col("sd") / pl.col("nd"), pl.lit(0.0)))
        g = dj.group_by("kind", "cand", "bin").agg(dgain=(pl.col("nd") * pl.col("beta") ** 2).sum(), nd=pl.col("nd").sum(),
                                                   beta=pl.col("sd").sum() / pl.col("nd").sum())
        # pacing per collective it carries: each ring waits on its own slowest hop, as much as that
        # hop is slowed, and no more
        du = fg.group_by("kind", "cand", "unit", "bin", *jkey).agg(n_cu=pl.col("w").sum(), s_cu=(pl.col("w") * pl.col("e")).sum())
        ut = flows.group_by("unit", "bin").agg(n_u=pl.col("w").sum(), s_u=(pl.col("w") * pl.col("e")).sum())
        # bounded by the collective's own hops through the candidate (a job's other collectives across it
        # may be slowed less: a ring crossing it on one hop of many, a pipeline pair)
        pu = du.join(ut, on=["unit", "bin"]).with_columns(npc=pl.col("n_u") - pl.col("n_cu"), spc=pl.col("s_u") - pl.col("s_cu"),
                                                           beta=pl.min_horizontal(pl.col("s_cu") / pl.col("n_cu"), 0.0)).with_columns(
            gamma=pl.when(pl.col("npc") > 1e-9).then(pl.max_horizontal(
                pl.col("beta"), pl.min_horizontal(pl.col("spc") / pl.col("npc").clip(lower_bound=1e-9), 0.0))).otherwise(0.0))
        pace = pu.group_by("kind", "cand", "bin").agg(pgain=(pl.col("npc") * pl.col("gamma") ** 2).sum())
        g = g.join(pace, on=["kind", "cand", "bin"], how="left").with_columns(gain=pl.col("dgain") + pl.col("pgain").fill_null(0.0))
        sev = g.group_by("kind", "cand").agg(gain=pl.col("gain").sum(), dgain=pl.col("dgain").sum()).join(tier, on="cand", how="left") \
            .with_columns(pl.col("tier").fill_null(0))
        top = sev["gain"].max()
        equal = sev.filter(pl.col("gain") >= 0.99 * top)
        # equal explanations: the one whose own flows carry the most of the slowness it explains (the
        # most slow hops cross it) before those that need more of their rings' pacing to explain the
        # rest (each NIC of a ring under a congested leaf carries two of its hops; the leaf most of them)
        # ... and a cause named in the windows just before, when it explains them as well as any other: the
        # evidence that told it from its neighbours then (a job crossing only it) may be gone, while one ring
        # through both, paced as a whole, cannot tell them apart
        known = equal.filter(pl.col("cand").is_in(list(prior or ())))
        pool = known if known.height else equal
        # ... and of elements the jobs' flows cannot tell apart, one whose background transfers (storage
        # reads and writes, against the same server's other transfers at the time) slowed with them
        # before one whose background transfers kept their pace: those only confirm or exonerate
        # (a ring over two leaves paced as a whole, the congested leaf's clients reading slowly)
        # ... while its jobs' flows were slow (its flagged bins and their neighbours: a checkpoint's burst
        # falls where it falls)
        fb = fl.select("kind", "cand", "bin")
        fb = pl.concat([fb, fb.with_columns(pl.col("bin") - 1), fb.with_columns(pl.col("bin") + 1)]).unique()
        ev = bgx.join(fb, on=["kind", "cand", "bin"]).group_by("kind", "cand") \
            .agg(n_bg=pl.len(), m_bg=trimmed_mean(pl.col("e_bg")))
        pool = pool.join(ev, on=["kind", "cand"], how="left")
        seen = pl.col("n_bg").fill_null(0) >= cfg.min_flows_per_cell
        if pool.filter(seen & (pl.col("m_bg") < floor)).height:
            pool = pool.filter(~(seen & (pl.col("m_bg") >= floor)))
        tied = pool.filter(pl.col("dgain") >= 0.99 * pl.col("dgain").max()) \
            .sort(["tier", "gain", "cand"], descending=[False, True, False])
        best = tied.row(0, named=True)
        # candidates the flows cannot tell from it (they carry nearly the same flows: the two ends of one
        # link, a leaf and the spine on every path of one ring): named with it, in its evidence
        own = fm.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"])).select("fid")
        alts, paced = [], []
        for t in equal.filter((pl.col("kind") != best["kind"]) | (pl.col("cand") != best["cand"])).sort("cand").iter_rows(named=True):
            other = fm.filter((pl.col("kind") == t["kind"]) & (pl.col("cand") == t["cand"])).select("fid")
            inter = own.join(other, on="fid").height
            # ... or explain as much through the same rings' pacing (each NIC of a ring slowed as a whole)
            (alts if inter >= 0.9 * max(own.height, other.height) else paced).append(t["cand"])
        # ... and elements that carry the same slow flows but looked healthy only through flows that
        # could not show their slowness (fair_share_evidence): not raised on their own, said with it
        if xf is None:
            xf = fair_share_evidence(x, floor)
        # (a leaf carrying two of a ring's four slow hops beside another job's slower transfers); those
        # carrying the same slow flows are its equals, the others explain them through the rings' pacing
        bb = fm.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]))["bin"].unique()
        xb = xf.filter(pl.col("bin").is_in(bb.implode()))
        own_f = xb.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]))
        units = own_f.filter(pl.col("e") < floor)["unit"].unique()
        # (a rival listed as pacing it by the gains, whose flows that could show a slowness carry the same
        # slow flows, is its equal: the other leaf of a ring's every hop, beside another job's unsaturated
        # transfers)
        other = xb.filter(~pl.col("cand").is_in([best["cand"], *alts])).group_by("kind", "cand").agg(
            n_c=pl.len(), m=trimmed_mean(pl.col("e")), inter=pl.col("fid").is_in(own_f["fid"].implode()).sum(),
            foreign=(pl.col("e") < floor).filter(~pl.col("unit").is_in(units.implode())).sum())
        cannot_clear = other.filter((pl.col("n_c") >= cfg.min_flows_per_cell) & (pl.col("m") < floor) & (pl.col("foreign") == 0))
        same = pl.col("inter") >= 0.9 * pl.max_horizontal(pl.col("n_c"), pl.lit(own_f.height))
        twins = sorted(cannot_clear.filter(same)["cand"].to_list())
        alts += twins
        paced = [p for p in paced if p not in twins] + [c for c in sorted(cannot_clear.filter(~same)["cand"].to_list()) if c not in paced]
        # both ends of the same slow flows tied with the switch between them (a pair under one leaf):
        # neither NIC can be preferred to the other, the switch they share explains both at once
        sw_alt = tied.filter((pl.col("kind") == "switch") & pl.col("cand").is_in(alts))
        if best["kind"] == "nic" and sw_alt.height and tied.filter((pl.col("kind") == "nic") & pl.col("cand").is_in(alts)).height:
            alts = [a for a in alts if a != sw_alt["cand"][0]] + [best["cand"]]
            best = sw_alt.row(0, named=True)
        bins = fl.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]))["bin"]
        mine_ids = fm.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"])).select("fid", "unit", "bin")
        mine = flows.join(mine_ids.select("fid"), on="fid")
        slow = mine.filter(pl.col("e") < floor)
        zmin = fl.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]))["z"].min()
        accepted.append({
            "kind": best["kind"], "cand": best["cand"], "value": float(np.exp(mine.select(trimmed_mean(pl.col("e"))).item())),
            "n_slow": slow.height, "n": mine.height, "s": int(mine["start_ns"].min()), "e": int(mine["end_ns"].max()),
            "bins": bins.n_unique(), "z": float(zmin),
            "jobs": _slowed_jobs(mine, floor),
            "alts": ",".join(alts), "paced": ",".join(paced),
            # the collective (DP group, or pair; not a lockstep cohort: one instance of a collective in time)
            # holding the largest share of its slow flows, that share and its members: a slow GPU paces its
            # own rings only (problems: _may_pace)
            **_top_ring(slow, r)})
        # take its slowness off: all of its own flows' (named, it explains them; a fit per time bin would
        # leave the flows after an onset inside the bin slow, to be pinned on their NICs), and gamma from
        # the rest of their collectives
        # ... in the bins it was named in and their neighbours (its onset or end falls inside a bin, which
        # then holds too few slow flows to be named on its own, and would be pinned on a neighbour)
        # ... and every other bin where the flows that can show its slowness (fair_share_evidence) are
        # as slow: a ring paced by a congested spine for a minute, flagged in two bins only (another job's
        # unsaturated transfers through it dilute the rest), left the ring's other bins to its leaf
        # (demo seed 800, in a draft that gave merged transfers a baseline). Only a named cause reaches that
        # far: nothing is raised on those flows alone
        own_bins = xf.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"])).group_by("bin").agg(
            n=pl.len(), m=trimmed_mean(pl.col("e"))).filter((pl.col("n") >= cfg.min_flows_per_cell) & (pl.col("m") < floor))["bin"]
        near = pl.concat([bins, bins - 1, bins + 1, own_bins]).unique()
        fit_ids = memb.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]) & pl.col("bin").is_in(near)) \
            .select("fid")
        fits.append(fit_ids)
        flows = take_off(flows, fit_ids)
    # a backward pass: a cause named early (it explained the most then) whose flows the causes named
    # after it explain through their rings' pacing is not a cause of its own (demo seed 820: an innocent
    # rail-0 leaf named first for a job whose rings also cross the congested rail-4 leaf, named second
    # for another job): the smallest set that explains every flagged cell
    keep = list(range(len(accepted)))
    for i in range(len(accepted)):
        if len(keep) < 2 or i not in keep:
            continue
        rest = flows0
        for k in keep:
            if k != i:
                rest = take_off(rest, fits[k])
        mine = memb.filter((pl.col("kind") == accepted[i]["kind"]) & (pl.col("cand") == accepted[i]["cand"]))
        if flag(cells(mine.join(rest.select("fid", "zf", "e", "w", "job_id"), on="fid"))).height == 0:
            keep.remove(i)
    accepted = [accepted[k] for k in keep]
    out = pl.DataFrame(accepted, schema=empty.schema) if accepted else empty
    return out, {"n_tests": n_tests, "z_bar": zb}


def _slowed_jobs(mine: pl.DataFrame, floor: float) -> str:
    """The jobs a named cause slowed, ','-joined: those whose flows across it lost more than
    min_bw_drop, by the trimmed mean its cells and its value are judged by (a ring's chunks at two
    rates, half of them slowed: its median missed the job whose symptoms it explains, demo seed 621);
    else the job with the most slow flows (a cause named on no job explains no job's slowdown)."""
    j = mine.filter(pl.col("job_id").is_not_null()).group_by("job_id").agg(
        m=trimmed_mean(pl.col("e")), k=(pl.col("e") < floor).sum())
    slowed = j.filter(pl.col("m") < floor)
    if slowed.height == 0:
        slowed = j.filter(pl.col("k") > 0).sort(["k", "job_id"], descending=[True, False]).head(1)
    return ",".join(sorted(slowed["job_id"].to_list()))


def take_off(flows: pl.DataFrame, fit_ids: pl.DataFrame) -> pl.DataFrame:
    """flows (localize's frame: fid, unit, cohort, bin, e, w, ...) with a named cause's slowness taken off:
    all of its own flows' (fit_ids: it explains them), and the pace of their collectives' other flows."""
    direct = fit_ids.join(flows.select("fid", "e"), on="fid").select("fid", fit="e")
    # the pace taken off each of its collectives (paced_by)
    pacing = paced_by(flows, fit_ids, ["unit", "bin"])
    # ... and the pace of the transfers moving in lockstep with its own (with_cohorts: a ring whose hops
    # are pairs of their own, each its own DP group in the flows, moves at its slowest hop's pace just
    # the same), the same bound: the median of its own hops in the cohort
    in_step = paced_by(flows, fit_ids, ["cohort"])
    # a flow paced both ways takes the larger of the two paces
    fit = pl.concat([direct, pl.concat([pacing, in_step]).group_by("fid").agg(pl.col("fit").min())])
    return flows.join(fit, on="fid", how="left").with_columns(pl.col("fit").fill_null(0.0)).with_columns(
        e=pl.min_horizontal(pl.col("e") - pl.col("fit"), pl.lit(0.0))).with_columns(
        zf=pl.col("e") * pl.col("w")).drop("fit")


def _top_ring(slow: pl.DataFrame, r: pl.DataFrame) -> dict:
    """top_ring: the largest share of the slow flows (fid, unit) one collective holds; top_ring_ips: that
    collective's addresses (every flow of it in r), ','-joined."""
    if not slow.height:
        return {"top_ring": None, "top_ring_ips": None}
    t = slow.group_by("unit").len().sort("len", "unit", descending=[True, False]).row(0, named=True)
    m = r.filter(pl.col("unit") == t["unit"])
    ips = sorted(set(m["src_ip"].to_list()) | set(m["dst_ip"].to_list()))
    return {"top_ring": t["len"] / slow.height, "top_ring_ips": ",".join(ips)}


def paced_by(flows: pl.DataFrame, own: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """fid, fit: the pace a named cause takes off the other flows of each group (key: a collective and
    bin, or a cohort) that its own flows (fid in `own`) belong to: the median of the group's other
    flows, bounded by the median of its own flows there (medians: a ring's flows are bimodal, a share
    of its chunks moving faster than the pair's usual level, and a mean would leave the ring half slow)."""
    mine = flows.join(own, on="fid")
    g = flows.join(mine.select(key).drop_nulls().unique(), on=key)
    rest = g.join(own, on="fid", how="anti")
    lvl = rest.group_by(key).agg(m_o=pl.col("e").median()).join(mine.group_by(key).agg(m_c=pl.col("e").median()), on=key) \
        .with_columns(gamma=pl.max_horizontal(pl.min_horizontal("m_c", 0.0), pl.min_horizontal("m_o", 0.0)))
    return rest.join(lvl.select(*key, "gamma"), on=key).select("fid", fit="gamma")


def stall_causes(r: pl.DataFrame, n_jobs: int, window: tuple[int, int], cfg: FlowConfig,
                 exclude: set[str] | None = None, cand: pl.DataFrame | None = None,
                 witnesses: pl.DataFrame | None = None) -> pl.DataFrame:
    """A link that flaps stalls the few flows crossing it while it is down, many times their peers'
    duration, in episodes scattered over the window; no typical flow of it is slow. Per candidate
    (NIC or switch): its stalled flows (rate below stall_ratio of their peers') against the number
    its flows' jobs stall anyway (a Poisson test, Bonferroni over the candidates; the job's rate
    without the candidate's flows and without its collectives' flows that moved while its own
    stalled: _paced_with), in >= 2 episodes of more than one transfer each: held outages (overlapping
    stalled flows holding most of what it carried, longer than its usual gap between flows), or
    scattered stalls (a second apart) on two pairs or on one pair's transfers of two sizes. The most
    specific candidate explains the others: the NIC whose stalls involve several peers, not each peer;
    a NIC whose stalls are all with one peer is named with that peer (alts).

    A ring moves at its slowest hop's pace: every hop of a ring through a down link stalls with it, and
    its members are equal on the ring's flows. What else crossed each of them while the ring stalled
    tells them apart (witnesses: held_witnesses' probes, monitoring and storage transfers held far
    beyond their own pair's usual time); a named cause explains its rings' stalls at those moments, and
    members it leaves with no evidence of their own are its equals (alts), not causes of their own."""
    empty = pl.DataFrame(schema={"kind": pl.Utf8, "cand": pl.Utf8, "k": pl.Int64, "lam": pl.Float64,
                                 "episodes": pl.Int64, "s": pl.Int64, "e": pl.Int64, "jobs": pl.Utf8, "w_held": pl.Int64,
                                 "alts": pl.Utf8})
    if r.height == 0:
        return empty
    from scipy.stats import poisson

    thr = float(np.log(cfg.stall_ratio))
    # stalled against both baselines it has: slower than the flows moving the same thing at the same time
    # (not a slow moment of its whole collective) and than its own pair's usual (not a pair that is
    # always that slow, a channel or a message of its own kind), both against median levels (e_peer_s, e_hist_s)
    r = r.with_columns(stall=(pl.max_horizontal("e_peer_s", "e_hist_s") < thr).fill_null(False))
    cand = _candidates(r) if cand is None else cand
    # only candidates with stalled flows can be causes (their other flows set the expectation): found from the
    # stalled flows first, so only their candidates' flows are joined
    stalled = cand.join(r.filter("stall").select("fid"), on="fid", how="semi").select("kind", "cand").unique()
    x = cand.join(stalled, on=["kind", "cand"], how="semi") \
        .join(r.select("fid", "stall", "start_ns", "end_ns", "job_id", "src_ip", "dst_ip", "unit", "size"), on="fid")
    if exclude:
        # a named cause explains its flows' stalls too (the rate it moves at is its verdict): they are no
        # evidence against its neighbours
        mine = x.filter(pl.col("cand").is_in(list(exclude))).select("fid").unique()
        x = x.join(mine, on="fid", how="anti")
    n_tests = max(int(cand.group_by("kind").agg(n=pl.col("cand").n_unique())["n"].sum()), 1)
    alpha = window_alpha(cfg.fa_per_job_hour, n_jobs, window[1] - window[0]) / n_tests
    out = []
    remaining = x
    for _ in range(cfg.max_causes):
        # episodes, two ways a link's stalls come (a candidate has the larger count of the two):
        # - scattered: stalls more than a second apart start a new episode (a congested or lossy port
        #   stalls one transfer here, one there: the real recording congested_uplink's spine);
        # - held: a link that is down holds everything it carries until it is back, so its stalled
        #   flows overlap; a new episode starts once every earlier one has ended (two flaps 0.4 s apart,
        #   bridged by a held pipeline hop, were one scattered episode: 64-GPU seed 2191). It counts
        #   only if most of the candidate's flows in flight then stalled and it lasted longer than the
        #   candidate's typical gap between flow starts (a two-member group's small messages, slow all
        #   window beside its fast ones, are each an episode by time: seed 2193's healthy job)
        # (complete orders here and in the sums below: a pair's two ends tie on every count, and float
        # sums in the order rows happened to arrive named one end or the other from run to run)
        st = remaining.filter("stall").sort("start_ns", "end_ns", "kind", "cand", "fid")
        apart = pl.col("start_ns").diff().over("kind", "cand").fill_null(1 << 62) > 1_000_000_000
        after = (pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).over("kind", "cand")).fill_null(True)
        st = _episodes(st.with_columns(ep=apart.cast(pl.Int64)), None).rename({"ep": "ep_apart"}) \
            .with_columns(ep=after.cast(pl.Int64))
        st = _episodes(st, remaining)
        agg = st.group_by("kind", "cand").agg(k=pl.len(), episodes=pl.max_horizontal(pl.col("ep").sum(), pl.col("ep_apart").sum()),
                                               held_eps=pl.col("ep").sum(), apart_eps=pl.col("ep_apart").sum(),
                                               peers=pl.concat([pl.col("src_ip"), pl.col("dst_ip")]).n_unique(),
                                               ips=pl.concat([pl.col("src_ip"), pl.col("dst_ip")]).unique().sort(),
                                               kinds=pl.struct(a=pl.min_horizontal("src_ip", "dst_ip"),
                                                               b=pl.max_horizontal("src_ip", "dst_ip"), n=pl.col("size")).n_unique(),
                                               held=pl.col("held").mean(),
                                               hold=pl.col("cov").filter(pl.col("hop_first")).mean(),
                                               s=pl.col("start_ns").min(), e=pl.col("end_ns").max(),
                                               jobs=pl.col("job_id").drop_nulls().unique().sort().str.join(","))
        # what its flows would stall anyway: each job's stall rate on its flows that do not cross the
        # candidate (a degraded element's own stalls would otherwise raise the bar it is judged by)
        # ... nor move in its stalled flows' collectives while those stalled (a ring moves at its slowest
        # hop's pace: the other hops of a ring through a down link stall with it, and are no evidence of
        # how often the job stalls anyway: 64-GPU seed 2206's three-member ring)
        # ... per size class of transfer: a kind of message that waits on its collective's slowest member
        # stalls in every group of the job alike (healthy 64-GPU seed 2636: a fifth of two groups' 1 MB
        # transfers at a thirtieth of their rate, every step), and a link carrying one such group is
        # judged by that class's rate, not by the job's all-sizes rate (a leaf "flapping" at 55 stalls
        # against 4.3)
        fl = remaining.unique("fid")
        tot = fl.group_by("job_id", "size").agg(n_j=pl.len(), k_j=pl.col("stall").sum())
        jc = ["kind", "cand", "job_id", "size"]
        paced = _paced_with(remaining, fl)
        lam = remaining.group_by(jc).agg(n_c=pl.len(), k_c=pl.col("stall").sum()) \
            .join(paced, on=jc, how="left", nulls_equal=True) \
            .with_columns(pl.col("n_p", "k_p").fill_null(0)).with_columns(
            n_x=pl.col("n_c") + pl.col("n_p"), k_x=pl.col("k_c") + pl.col("k_p")) \
            .join(tot, on=["job_id", "size"], nulls_equal=True).with_columns(
            p0=((pl.col("k_j") - pl.col("k_x")) / (pl.col("n_j") - pl.col("n_x")).clip(lower_bound=1)).clip(1e-5, 0.5)) \
            .sort(jc, nulls_last=True).group_by("kind", "cand", maintain_order=True).agg(lam=(pl.col("n_c") * pl.col("p0")).sum())
        # (outages that held what the candidate carried count on their own; scattered stalls only where
        # they hit two pairs, or one pair's transfers of two sizes or more: a slow or lossy link slows
        # whatever crosses it (the real recordings' shaped host links: one ring hop, every bucket size),
        # while one pair's messages of one size, slow all window beside its other transfers, are that
        # kind of message's, not the link's: 64-GPU seeds 2193 and 2420)
        agg = agg.join(lam, on=["kind", "cand"]).filter(
            (pl.col("held_eps") >= 2) | ((pl.col("apart_eps") >= 2) & ((pl.col("peers") >= 3) | (pl.col("kinds") >= 2))))
        if agg.height == 0:
            break
        pv = poisson.sf(agg["k"].to_numpy() - 1, agg["lam"].to_numpy())
        agg = _witnessed(agg.with_columns(pv=pl.Series(pv)).filter(pl.col("pv") <= alpha), st, witnesses, cfg.stall_ratio)
        if agg.height == 0:
            break
        # equal evidence (a leaf and the spine on the same stalled paths, the members of one ring): the
        # one whose other traffic was held while its flows stalled (w_held: a down link holds the probes
        # and storage reads crossing it; its ring neighbours' moved: 64-GPU seeds 2651, 2654), then the
        # one that held the most of what it carried while its flows stalled (a down element holds all of
        # it: seed 2411's NIC over its leaf), then the one whose own stalled hops were held longest through
        # its episodes (hold: a ring's hops that a down link paces move in short pieces meanwhile, seed
        # 2206), then the one whose stalls are least expected from its other flows
        best = agg.sort(["episodes", "w_held", "held", "hold", "peers", "k", "pv", "kind", "cand"],
                        descending=[True, True, True, True, True, True, False, False, False], nulls_last=True).row(0, named=True)
        # a NIC whose stalled flows are all with one peer: the other end of that pair shows the same
        # stalls (a two-member group's only pair), named with it (its own other flows, where it has any,
        # already ordered the two)
        other = [a for a in best["ips"] if a != best["cand"]] if best["kind"] == "nic" and len(best["ips"]) == 2 else []
        mine = remaining.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") == best["cand"]) & pl.col("stall"))
        # it explains its stalled flows and its collectives' other stalled flows while its own stalled
        # (the ring it paces); a candidate left with none of its own, as strong as it on them and with
        # no witness of its own, is its equal: said, not named
        gone = pl.concat([mine.select("fid"), _paced_flows(mine, remaining.unique("fid")).filter("stall").select("fid")]).unique()
        left = remaining.filter("stall").join(gone, on="fid", how="anti").select("kind", "cand").unique()
        ties = agg.filter((pl.col("kind") == best["kind"]) & (pl.col("cand") != best["cand"])
                          & (pl.col("episodes") == best["episodes"]) & (pl.col("w_held") == best["w_held"])) \
            .join(left, on=["kind", "cand"], how="anti")["cand"].sort().to_list()
        other = other + [c for c in ties if c not in other]
        out.append({k: best[k] for k in empty.columns if k != "alts"} | {"alts": ",".join(other)})
        remaining = remaining.join(gone, on="fid", how="anti")
    return pl.DataFrame(out, schema=empty.schema) if out else empty


def _paced_flows(x: pl.DataFrame, fl: pl.DataFrame) -> pl.DataFrame:
    """kind, cand, fid, job_id, size, stall: per candidate (x: its flows, with stall and unit), the
    flows (fl: one row per flow) it does not carry that moved in the collective (unit) of one of its
    stalled flows while that stalled. Its stalled spans are merged per collective first (few
    intervals), then matched by time."""
    g = ["kind", "cand", "unit"]
    sp = x.filter("stall").select(*g, "start_ns", "end_ns").sort(*g, "start_ns").with_columns(
        iv=(pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).over(g)).fill_null(True).cum_sum().over(g)) \
        .group_by(*g, "iv").agg(s=pl.col("start_ns").min(), e=pl.col("end_ns").max())
    hit = sp.join(fl.select("fid", "unit", "job_id", "size", "stall", "start_ns", "end_ns"), on="unit") \
        .filter((pl.col("start_ns") < pl.col("e")) & (pl.col("end_ns") > pl.col("s"))) \
        .select("kind", "cand", "fid", "job_id", "size", "stall").unique()
    # (its own flows are counted as its own)
    return hit.join(x.select("kind", "cand", "fid"), on=["kind", "cand", "fid"], how="anti")


def _paced_with(x: pl.DataFrame, fl: pl.DataFrame) -> pl.DataFrame:
    """kind, cand, job_id, size, n_p, k_p: per candidate (x: every flow of every candidate), how many
    flows its stalls paced (_paced_flows), and how many of them stalled."""
    return _paced_flows(x, fl).group_by("kind", "cand", "job_id", "size").agg(n_p=pl.len(), k_p=pl.col("stall").sum())


def held_witnesses(flows: pl.DataFrame, pairs: pl.DataFrame, cfg: FlowConfig) -> pl.DataFrame:
    """kind, cand, fid, start_ns, end_ns: the records outside the jobs' collectives (probes, monitoring,
    storage, control: no DP or PP pair) that moved at under stall_ratio of their own directed pair's
    median rate in the data (min_peer_flows records or more), per element they cross: a link that is
    down holds every packet crossing it, whatever its size, while the ring neighbours it paces carry
    their other traffic as usual. Any size: a probe's few bytes, held, take the outage's time. fid
    numbers the records (one record crosses several elements)."""
    cols = [c for c in ("start_ns", "end_ns", "bytes", "src_ip", "dst_ip", "path", "pid") if c in flows.columns]
    f = flows.select(cols).filter(pl.col("end_ns") > pl.col("start_ns"))
    if "pid" in f.columns and pairs.height:
        f = f.join(pairs.filter(pl.col("comm_type").is_in(["DP", "PP"])).select("pid"), on="pid", how="anti")
    x = (pl.col("bytes").cast(pl.Float64) / (pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64)).log()
    h = f.with_columns(x=x).filter(
        (pl.len().over("src_ip", "dst_ip") >= cfg.min_peer_flows)
        & (pl.col("x") - pl.col("x").median().over("src_ip", "dst_ip") < float(np.log(cfg.stall_ratio))))
    if "path" not in h.columns:
        h = h.with_columns(path=pl.lit(None, dtype=pl.List(pl.Utf8)))
    h = h.with_row_index("fid").with_columns(bin=pl.lit(0))
    return _candidates(h).join(h.select("fid", "start_ns", "end_ns"), on="fid").select("kind", "cand", "fid", "start_ns", "end_ns")


def _witnessed(agg: pl.DataFrame, st: pl.DataFrame, witnesses: pl.DataFrame | None, share: float) -> pl.DataFrame:
    """agg (kind, cand) with w_held: its held witnesses (held_witnesses) in flight while one of its own
    flows stalled (st: its stalled flows), each for at least `share` of that stall: held by the
    same outage, not a probe's jitter (64-GPU seed 2659: a probe of 0.25 ms, ten times its pair's usual
    time, passing through a spine during a NIC's 763 ms stall tipped the spine over the NIC that
    flapped: a spine that was down would have held it for as long)."""
    if witnesses is None or witnesses.height == 0 or agg.height == 0:
        return agg.with_columns(w_held=pl.lit(0, dtype=pl.UInt32))
    w = st.select("kind", "cand", s="start_ns", e="end_ns").join(agg.select("kind", "cand"), on=["kind", "cand"]) \
        .join(witnesses, on=["kind", "cand"]).filter(
            (pl.col("start_ns") < pl.col("e")) & (pl.col("end_ns") > pl.col("s"))
            & (pl.col("end_ns") - pl.col("start_ns") >= share * (pl.col("e") - pl.col("s")))) \
        .group_by("kind", "cand").agg(w_held=pl.col("fid").n_unique())
    return agg.join(w, on=["kind", "cand"], how="left").with_columns(pl.col("w_held").fill_null(0))


def _episodes(st: pl.DataFrame, x: pl.DataFrame | None) -> pl.DataFrame:
    """st (a candidate's stalled flows in time order, ep: 1 where an episode starts) with ep kept only
    on episodes of two or more transfers: a link stalls what it carries, transfer after transfer, and
    one stalled transfer (its queue pairs, concurrent flows of one pair, stall together) while the
    rest of the link's traffic moved is that transfer's, not the link's. With x (every flow of every
    candidate), also only on episodes that held the link (_held_share)."""
    grp = ["kind", "cand", "epid", "src_ip", "dst_ip"]
    st = st.with_columns(epid=pl.col("ep").cum_sum().over("kind", "cand")).sort(*grp, "start_ns", "end_ns", "fid").with_columns(
        new=(pl.col("start_ns") > pl.col("end_ns").cum_max().shift(1).over(grp)).fill_null(True))
    keep = pl.col("new").sum().over("kind", "cand", "epid") >= 2
    if x is not None:
        st = st.join(_held_share(st, x), on=["kind", "cand", "epid"], how="left")
        keep = keep & (pl.col("held") > 0.5) & pl.col("long")
        # cov: how much of the episode each of its stalled hops was held for (its longest stalled flow
        # over the episode's span), once per hop (hop_first): the down link's own hops are held through
        # the outage; the hops of its rings that it paces move in short pieces meanwhile
        ep_cols = ["kind", "cand", "epid"]
        span = pl.col("end_ns").max().over(ep_cols) - pl.col("start_ns").min().over(ep_cols)
        st = st.with_columns(cov=pl.when(keep).then((pl.col("end_ns") - pl.col("start_ns")).max().over(grp) / span),
                             hop_first=pl.int_range(pl.len()).over(grp) == 0)
    return st.with_columns(ep=pl.when(keep).then("ep").otherwise(0)).drop("epid", "new", "long", strict=False) \
        .sort("start_ns", "end_ns", "kind", "cand", "fid")


def _held_share(st: pl.DataFrame, x: pl.DataFrame) -> pl.DataFrame:
    """kind, cand, epid, held: per stall episode of a candidate (st: its stalled flows, with epid), the
    share of the candidate's flows in flight during the episode's span (x: every flow of every
    candidate) that stalled. Counted by binary search over each candidate's starts and ends, keyed
    by candidate then time (a flow overlaps [s, e) when it starts before e and does not end by s)."""
    ep = st.group_by("kind", "cand", "epid").agg(s=pl.col("start_ns").min(), e=pl.col("end_ns").max(), k=pl.len())
    if ep.height == 0:
        return ep.select("kind", "cand", "epid", held=pl.lit(None, dtype=pl.Float64), long=pl.lit(None, dtype=pl.Boolean))
    fl = x.join(ep.select("kind", "cand").unique(), on=["kind", "cand"], how="semi") \
        .unique(["kind", "cand", "fid"]).select("kind", "cand", "start_ns", "end_ns")
    codes = fl.select("kind", "cand").unique().sort("kind", "cand").with_row_index("c")
    fl, ep = fl.join(codes, on=["kind", "cand"]), ep.join(codes, on=["kind", "cand"])
    t0 = int(min(fl["start_ns"].min(), ep["s"].min()))
    span = int(max(fl["end_ns"].max(), ep["e"].max())) - t0 + 1
    c, ce = fl["c"].to_numpy().astype(np.int64), ep["c"].to_numpy().astype(np.int64)
    starts = np.sort(c * span + (fl["start_ns"].to_numpy() - t0))
    ends = np.sort(c * span + (fl["end_ns"].to_numpy() - t0))
    n = (np.searchsorted(starts, ce * span + (ep["e"].to_numpy() - t0), "left")
         - np.searchsorted(ends, ce * span + (ep["s"].to_numpy() - t0), "right"))
    # the candidate's typical spacing of flow starts (the median gap between distinct starts)
    gap = fl.select("c", "start_ns").unique().sort("c", "start_ns").with_columns(
        g=pl.col("start_ns").diff().over("c")).group_by("c").agg(gap=pl.col("g").median())
    ep = ep.with_columns(held=ep["k"] / pl.Series(np.maximum(n, 1))).join(gap, on="c", how="left")
    return ep.select("kind", "cand", "epid", "held", long=(pl.col("e") - pl.col("s")) > pl.col("gap").fill_null(0))


# the detectors whose subject is a localized element (localize's causes)
LOCALIZED = ("flows.switch_bandwidth", "flows.nic_bandwidth", "flows.late_rank")


def prior_suspects(verdicts: pl.DataFrame | None) -> set[str]:
    """The elements earlier windows' verdicts (anomaly_verdicts rows) named as warning or critical
    causes: localize's prior."""
    if verdicts is None or verdicts.height == 0:
        return set()
    return set(verdicts.filter(pl.col("detector").is_in(LOCALIZED) & pl.col("severity").is_in(["warning", "critical"]))
               ["subject"].to_list())


def network_verdicts(flows: pl.DataFrame, pairs: pl.DataFrame, n_jobs: int, window: tuple[int, int], wid: str,
                     cfg: FlowConfig, history: pl.DataFrame | None = None, levels_out: dict | None = None,
                     suspects: set[str] | None = None) -> list[dict]:
    """history: flow_pair_rates rows of earlier windows; levels_out, a dict, receives this window's
    rows ("levels"); suspects: the NICs, switches and hosts earlier windows named (localize's prior)."""
    res = flow_residuals(flows, pairs, cfg, history=history)
    if levels_out is not None and res.height:
        levels_out["levels"] = window_levels(res, wid, window[0])
    cand = _candidates(res) if res.height else None
    causes, st = localize(res, n_jobs, window, cfg, cand=cand, prior=suspects)
    out = []
    named = set(causes["cand"].to_list())
    stalls = stall_causes(res, n_jobs, window, cfg, exclude=named, cand=cand,
                          witnesses=held_witnesses(flows, pairs, cfg)) if res.height else pl.DataFrame()
    for r in stalls.iter_rows(named=True):
        jobs = r["jobs"].split(",") if r["jobs"] else []
        alts = [a for a in (r["alts"] or "").split(",") if a]
        scope = "switch" if r["kind"] == "switch" else "link"
        out.append(dict(
            detector="flows.link_stalls", scope=scope, subject=r["cand"], job_id=jobs[0] if len(jobs) == 1 else None,
            start_ns=r["s"], end_ns=r["e"], metric="stalled_flows", value=float(r["k"]), baseline=float(r["lam"]),
            severity="warning", team="operations", window_id=wid,
            evidence=json.dumps({"episodes": r["episodes"], "jobs": jobs, "or_equally": alts, "held_witnesses": r["w_held"]}),
            explanation=f"{r['k']} flows through {scope} {r['cand']} stalled (under {cfg.stall_ratio:.0%} of their peers' rate) "
                        f"in {r['episodes']} episodes, where its jobs would stall {r['lam']:.1f}: a flapping link or port"
                        + (f"; {r['w_held']} of its other transfers (probes, storage) were held meanwhile" if r["w_held"] else "")
                        + (f" (or {'NIC' if scope == 'link' else 'switch'} {', '.join(alts)}: "
                           f"{'they carry' if len(alts) > 1 else 'it carries'} the same stalled flows, their ring moves at its "
                           "slowest hop's pace, and nothing else crossing them told them apart; check each)" if alts else "")))
    for r in causes.iter_rows(named=True):
        jobs = r["jobs"].split(",") if r["jobs"] else []
        alts = [a for a in (r["alts"] or "").split(",") if a]
        paced = [a for a in (r["paced"] or "").split(",") if a]
        ev = json.dumps({"jobs": jobs, "bins": r["bins"], "flows": r["n"], "slow_flows": r["n_slow"],
                         "z": round(r["z"], 2), "z_bar": round(st["z_bar"], 2), "n_tests": st["n_tests"],
                         "or_equally": alts, "or_in_its_rings": paced,
                         "top_ring_share": None if r["top_ring"] is None else round(r["top_ring"], 3),
                         "top_ring_ips": (r["top_ring_ips"] or "").split(",") if r["top_ring_ips"] else []})
        sev = "critical" if r["value"] < 0.5 else "warning"
        tie = (f" (the flows cannot tell it from {', '.join(alts)}: {'they carry' if len(alts) > 1 else 'it carries'} "
               "the same slow flows; check both)") if alts else ""
        if paced:
            tie += (f" (or {', '.join(paced)}: its rings slowed as a whole, and a ring moves at its slowest hop's pace, "
                    "so their flows cannot tell which of them holds it back)")
        if r["kind"] == "switch":
            out.append(dict(detector="flows.switch_bandwidth", scope="switch", subject=r["cand"], job_id=None,
                            start_ns=r["s"], end_ns=r["e"], metric="flow_rate_vs_peers", value=r["value"], baseline=1.0,
                            severity=sev, team="operations", window_id=wid, evidence=ev,
                            explanation=f"flows through switch {r['cand']} move at {r['value']:.0%} of the rate of the same "
                                        f"jobs' other flows of the same kind and size, or of their own rate at other times "
                                        f"(jobs {', '.join(jobs)}){tie}: congestion or a degraded switch"))
        else:
            out.append(dict(detector="flows.nic_bandwidth", scope="link", subject=r["cand"],
                            job_id=jobs[0] if len(jobs) == 1 else None, start_ns=r["s"], end_ns=r["e"],
                            metric="flow_rate_vs_peers", value=r["value"], baseline=1.0, severity=sev, team="operations",
                            window_id=wid, evidence=ev,
                            explanation=f"flows to and from NIC {r['cand']}, with every peer, move at {r['value']:.0%} of the "
                                        f"rate of their peers in the same collective or of their own rate at other times{tie}: "
                                        "a degraded NIC, cable or port, or too many channels on it"))
    return out
