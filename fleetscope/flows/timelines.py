"""Reconstructed step timelines (LLMPrism IV-C) and their Chrome/Perfetto trace export.

Per GPU address, its DP flows (both directions) are split into steps with the same online
change-point split; a step ends where its DP traffic ends, starts where the previous one ended;
PP flows between are the PP events, the rest is compute. An ip with no DP pair (pure PP) uses
its PP flows instead (boundary_source).

Steps: per job the step period (autocorrelation of its flows, fleetscope.flows.period); each
address's sequence splits at the largest gap of every period.

Windows: the caller passes the window's flows plus a margin before it. A step belongs to the window
holding its closing boundary (the first flow of the next step) plus a guard longer than half of any
step period (a boundary closer than that to the end of the data may still be overturned by flows
after it); an address's last step (no closing boundary: its job stopped) belongs to the window
holding its end plus two guards (more than a period, so a following step would have been seen).
Both windows see the same boundaries, so no step is lost or counted twice; the margin must exceed
two periods plus the guard."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

import numpy as np

from fleetscope.common import robust_sigma
from fleetscope.flows.changepoint import sequence_gaps, split_steps, step_index
from fleetscope.flows.config import FlowConfig
from fleetscope.flows.period import UNIT, job_periods, periodic_boundaries, warped_units
from fleetscope.flows.pipeline import drained_gaps
from fleetscope.flows.stats import typical
from fleetscope.flows.volume import balance_boundaries, partial_first


def ip_flows(flows: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """Each labeled flow twice: once for its sender (role send), once for its receiver."""
    # the job's traffic: a DP group's pair with only a few messages (comm_types: dp_group_member)
    # carries no step of its own
    job = pl.col("comm_type").is_in(["DP", "PP"])
    if "method" in pairs.columns:
        job = job & (pl.col("method") != "dp_group_member")
    lab = flows.join(pairs.filter(job).select("pid", "job_id", "comm_type"), on="pid")
    # the connection (pair and ports, when the exporter gives them): a DP pair may carry a data
    # connection and a control one (gloo opens one per process group)
    lab = lab.with_columns(conn=pl.col("pid") * 4_294_967_296 + pl.min_horizontal("src_port", "dst_port") * 65_536
                           + pl.max_horizontal("src_port", "dst_port"))
    if "packets" not in lab.columns:
        lab = lab.with_columns(packets=pl.lit(None, dtype=pl.Int64))
    cols = ["job_id", "comm_type", "start_ns", "end_ns", "bytes", "packets", "conn"]
    # ix: the ip's integer index (from the pair key), the key of the per-ip sorts and group-bys
    a_ix, b_ix = pl.col("pid") // (1 << 32), pl.col("pid") % (1 << 32)
    src_is_a = pl.col("src_ip") == pl.col("ip_a")
    return pl.concat([
        lab.select(*cols, ip=pl.col("src_ip"), peer=pl.col("dst_ip"), role=pl.lit("send"),
                   ix=pl.when(src_is_a).then(a_ix).otherwise(b_ix)),
        lab.select(*cols, ip=pl.col("dst_ip"), peer=pl.col("src_ip"), role=pl.lit("recv"),
                   ix=pl.when(src_is_a).then(b_ix).otherwise(a_ix)),
    ])


def reconstruct_steps(ipf: pl.DataFrame, window_start_ns: int, window_end_ns: int, window_id: str,
                      cfg: FlowConfig) -> pl.DataFrame:
    """ip_flows rows (window + margin) -> step rows: those claimed by this window (`claimed`, the
    step_timelines table) and the margin's earlier steps (history for the verdicts' baselines)."""
    has_dp = ipf.filter(pl.col("comm_type") == "DP").select("ix").unique()
    src = ipf.join(has_dp.with_columns(dp=pl.lit(True)), on="ix", how="left").with_columns(
        source=pl.when(pl.col("dp")).then(pl.lit("DP")).otherwise(pl.lit("PP")))
    bnd = src.filter((pl.col("comm_type") == pl.col("source")) & (pl.col("bytes") >= cfg.min_data_bytes))
    seg, periods = split_ip_steps(bnd, cfg)
    steps = seg.group_by("ix", "seg").agg(
        job_id=pl.col("job_id").first(), ip=pl.col("ip").first(), boundary_source=pl.col("source").first(),
        dp_start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max(),
        dp_send_start_ns=pl.col("start_ns").filter(pl.col("role") == "send").min(),
        dp_bytes=pl.col("bytes").sum().cast(pl.Int64), n_dp_flows=pl.len().cast(pl.Int64),
    ).sort("ix", "seg").with_columns(next_first=pl.col("dp_start_ns").shift(-1).over("ix"))
    # the step's collective ends with its last message, small ones included (a bias tensor's
    # all-reduce, a protocol's last handshake): messages under min_data_bytes on the same data
    # connections, between the step's last data flow and the next step's first, nearer the former,
    # extend its end (nearer the latter, they open the next collective); a lone packet extends only
    # its receiver's: a segment the transport re-sends after the sender was done (a tail-loss
    # probe, a retransmission timeout) ends the wait of the rank that needed it, not the sender's
    # step. They never place a boundary (a probe or a barrier would split a step's quiet time).
    # A collective has the same shape every step, so its tail ends about as far after its last
    # data flow every time: a message far later than the address's usual tail (beyond the spread
    # of its tails and of its step times) is apart from the collective, the next step's setup
    # (DDP's bucket rebuild after the first step, a slow rank's handshake before its forward pass),
    # however near it falls.
    data_conn = bnd.select("conn").unique()
    # Collectives only: a pipeline hop's messages are activations, all data-sized; a small one
    # there is the transport's control (a receiver announcing its next receive).
    tail = src.filter((pl.col("comm_type") == pl.col("source")) & (pl.col("source") == "DP")
                      & (pl.col("bytes") < cfg.min_data_bytes)
                      & ((pl.col("role") == "recv") | pl.col("packets").is_null() | (pl.col("packets") > 1))
                      & (pl.col("conn").is_null() | pl.col("conn").is_in(data_conn["conn"].implode())))
    if tail.height:
        iv = steps.select("ix", "seg", t=pl.col("dp_start_ns"), last=pl.col("end_ns"), nxt=pl.col("next_first")).sort("ix", "t")
        tj = tail.select("ix", t=pl.col("start_ns"), e=pl.col("end_ns")).sort("ix", "t").join_asof(
            iv, on="t", by="ix", strategy="backward", check_sortedness=False)
        tj = tj.filter(pl.col("seg").is_not_null() & (pl.col("nxt").is_null() | (pl.col("t") < pl.col("nxt")))
                       & (pl.col("nxt").is_null() | (pl.col("t") - pl.col("last") < pl.col("nxt") - pl.col("t"))))
        ext = tj.with_columns(off=pl.col("e") - pl.col("last")).group_by("ix", "seg").agg(off=pl.col("off").max())
        usual = steps.select("ix", "seg", dur=pl.col("end_ns") - pl.col("end_ns").shift(1).over("ix"),
                             span=pl.col("end_ns") - pl.col("dp_start_ns")).join(
            ext, on=["ix", "seg"], how="left").with_columns(pl.col("off").fill_null(0)).with_columns(
            rel=pl.col("off") / pl.col("span"))

        def upper(c):   # the usual value and its robust spread, to the same bar as the steps' outliers
            return pl.col(c).median() + 3 * robust_sigma(pl.col(c))
        # in time (the steps' jitter included) or in proportion to the step's own collective (a
        # congested link stretches the collective and its tail alike)
        usual = usual.group_by("ix").agg(abs_bar=upper("off") + 3 * robust_sigma(pl.col("dur")), rel_bar=upper("rel"))
        bars = steps.select("ix", "seg", span=pl.col("end_ns") - pl.col("dp_start_ns")).join(usual, on="ix").select(
            "ix", "seg", bar=pl.max_horizontal("abs_bar", pl.col("rel_bar") * pl.col("span")))
        ext = tj.join(bars, on=["ix", "seg"]).filter(pl.col("e") - pl.col("last") <= pl.col("bar")) \
            .group_by("ix", "seg").agg(tail_end=pl.col("e").max())
        steps = steps.join(ext, on=["ix", "seg"], how="left").with_columns(
            end_ns=pl.max_horizontal("end_ns", "tail_end")).drop("tail_end")
    # an address's first segment with less than a step's volume is no step (volume.partial_first);
    # its end opens the next step
    part = partial_first(steps.select("ix", "seg", vol="dp_bytes"), cfg.size_tol)
    opens = steps.filter(part).select("ix", opened=pl.col("end_ns"))
    steps = steps.filter(~part).join(opens, on="ix", how="left", maintain_order="left")
    first_seen = ipf.group_by("ix").agg(first=pl.col("start_ns").min())
    steps = steps.join(first_seen, on="ix").with_columns(
        prev=pl.coalesce(pl.col("end_ns").shift(1).over("ix"), "opened")).drop("opened").with_columns(
        start_observed=pl.col("prev").is_not_null(),
        start_ns=pl.coalesce("prev", pl.min_horizontal("first", "dp_start_ns")),
    )
    # PP events inside each step: PP flows attach to the first step ending at or after them
    pp = ipf.filter(pl.col("comm_type") == "PP").select("ix", t=pl.col("end_ns")).sort("ix", "t")
    cnt = pp.join_asof(steps.select("ix", "seg", t=pl.col("end_ns")).sort("ix", "t"), on="t", by="ix",
                       strategy="forward", check_sortedness=False).group_by("ix", "seg").agg(n_pp_flows=pl.len().cast(pl.Int64))
    steps = steps.join(cnt, on=["ix", "seg"], how="left").with_columns(pl.col("n_pp_flows").fill_null(0))
    steps = steps.with_columns(
        dp_start_ns=pl.when(pl.col("boundary_source") == "DP").then("dp_start_ns"),
        dp_end_ns=pl.when(pl.col("boundary_source") == "DP").then("end_ns"),
        dp_send_start_ns=pl.when(pl.col("boundary_source") == "DP").then("dp_send_start_ns"),
        dp_bytes=pl.when(pl.col("boundary_source") == "DP").then("dp_bytes").otherwise(0),
        n_dp_flows=pl.when(pl.col("boundary_source") == "DP").then("n_dp_flows").otherwise(0),
    )
    # claims: a step belongs to the window holding its closing boundary (the next step's first flow)
    # shifted by a guard of about half a period (a boundary nearer the data's end than that is not
    # yet sure); an address's last step (its job stopped) to the window holding its end + 2 guards.
    # Windows see the same boundaries, so no step is claimed twice or lost (timelines module doc).
    # a job whose traffic streams through its steps keeps its period for the jobs table (its steps
    # are withheld: window.withheld_jobs). Not a pipelined job's: its DP collectives run after the
    # pipeline's flush, and the step-scale period (a ladder that took its microbatches' rhythm)
    # splits its steps as any period does
    piped = ipf.filter(pl.col("comm_type") == "PP").select("job_id").unique()["job_id"].implode()
    periods = periods.with_columns(streaming=pl.col("streaming") & ~pl.col("job_id").is_in(piped))
    steps = steps.join(periods.select("job_id", "guard_ns", streaming_period_ns=pl.when("streaming").then("period_ns")),
                       on="job_id", how="left").with_columns(pl.col("guard_ns").fill_null(cfg.edge_guard_ns))
    steps = steps.with_columns(
        when=pl.coalesce(pl.col("next_first") + pl.col("guard_ns"), pl.col("end_ns") + 2 * pl.col("guard_ns")))
    claim = (pl.col("when") >= window_start_ns) & (pl.col("when") < window_end_ns)
    # steps before the window (its margin) stay as the jobs' recent history (baselines), unclaimed
    steps = steps.filter(pl.col("when") < window_end_ns).with_columns(claimed=claim).drop("when", "next_first", "guard_ns")
    steps = steps.sort("ip", "end_ns").with_columns(
        step=(pl.col("claimed").cast(pl.Int64).cum_sum() - 1).over("ip").cast(pl.Int64), window_id=pl.lit(window_id))
    return _align_job_steps(steps)


def split_ip_steps(bnd: pl.DataFrame, cfg: FlowConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Boundary flows (ix, job_id, start_ns, end_ns, ...) -> (the rows sorted by ix and start with
    `seg`, the step index per address; per job period_ns and the claim guard_ns).

    Addresses of a job with a known period split at the largest gap of each period
    (period.periodic_boundaries); the others with the online two-level filter (changepoint). A
    pipeline job's gaps are those after a drain (pipeline.py) where that split is regular; then
    steps are balanced by their gradient volume (volume.py)."""
    if bnd.height == 0:
        return bnd.with_columns(seg=pl.lit(0, dtype=pl.Int64)), pl.DataFrame(
            schema={"job_id": pl.Utf8, "period_ns": pl.Float64, "streaming": pl.Boolean, "guard_ns": pl.Int64})
    df = bnd.sort("ix", "start_ns")
    gid = df["ix"].to_numpy()
    start = df["start_ns"].to_numpy()
    gaps = sequence_gaps(gid, start, df["end_ns"].to_numpy())
    b, periods, _ = _gap_boundaries(df, gid, gaps, cfg)
    if "source" in df.columns and "role" in df.columns:
        # a pipeline job's (no address with DP pairs) step starts after its hops were drained
        # (pipeline module doc); where its pairs were mislabeled (DP hops read as pipeline ones)
        # the drains make no regular steps (fewer typical than a job's steps must be to be
        # reported), and the gaps' split stays. (The gaps' split is no yardstick: a pipeline's
        # microbatches are as regular as its steps.)
        pp = df.select((pl.col("source") == "PP").all().over("job_id"))["source"].to_numpy()
        if pp.any():
            dg = gaps.copy()
            dg[pp] = drained_gaps(df.filter(pl.Series(pp)).with_columns(gap=pl.Series(gaps[pp])))
            bd, pd_, clock = _gap_boundaries(df, gid, dg, cfg)
            jobs = df["job_id"].to_numpy()
            reg = _regularity(jobs, gid, clock, bd, cfg.max_rel_spread)
            use = pp & np.array([reg.get(j, 0.0) >= cfg.min_typical for j in jobs])
            if use.any():
                b = np.where(use, bd, b)
                gaps = np.where(use, dg, gaps)
                chosen = set(jobs[use].tolist())
                periods = pl.concat([periods.filter(~pl.col("job_id").is_in(list(chosen))),
                                     pd_.filter(pl.col("job_id").is_in(list(chosen)))])
    df = df.with_columns(gap=pl.Series(gaps))
    # a step moves the same gradient volume however long it takes: pieces of one step are joined,
    # double steps split (volume module doc)
    b = balance_boundaries(gid, gaps, df["bytes"].to_numpy(), b, cfg.size_tol)
    return df.with_columns(seg=pl.Series(step_index(gid, b), dtype=pl.Int64)).drop("gap"), periods


def _gap_boundaries(df: pl.DataFrame, gid: np.ndarray, gaps: np.ndarray, cfg: FlowConfig) -> tuple[np.ndarray, pl.DataFrame, np.ndarray]:
    """Boundaries from gaps: the job's period and the largest gap of each period where a period
    shows (period.periodic_boundaries), else the online two-level filter (changepoint); per job
    period_ns and the claim guard_ns; and each row's time on its job's step clock (in steps; the
    start time in ns where the job shows no period)."""
    d = df.with_columns(gap=pl.Series(gaps))
    periods, warps = job_periods(d, cfg.min_period_ns)
    # the guard is one constant for every job (longer than half of any step period): a guard
    # computed from each window's own period estimate could differ between two windows and let
    # both, or neither, claim a step
    periods = periods.with_columns(guard_ns=pl.lit(cfg.edge_guard_ns, dtype=pl.Int64))
    d = d.join(periods.select("job_id", "period_ns"), on="job_id", how="left", maintain_order="left")
    periodic = periodic_boundaries(d, warps).to_numpy()
    known = d["period_ns"].is_not_null().to_numpy()
    clock = d["start_ns"].to_numpy().astype(np.float64)
    if known.any():
        clock[known] = warped_units(d["job_id"].filter(pl.Series(known)), d["start_ns"].to_numpy()[known],
                                    d["period_ns"].to_numpy()[known], warps) / UNIT
    if (~known).any():
        dur = (d["end_ns"] - d["start_ns"]).to_numpy().astype(np.float64)
        b = np.where(known, periodic, split_steps(gid, gaps, cfg.split, durations=dur))
    else:
        b = periodic
    first = np.ones(len(gid), dtype=bool)
    first[1:] = gid[1:] != gid[:-1]
    return b | first, periods, clock


def _regularity(jobs: np.ndarray, gid: np.ndarray, clock: np.ndarray, b: np.ndarray, spread: float) -> dict:
    """Per job: the share of its time (boundary to boundary, per address, on the job's step clock:
    a stretch of slower steps keeps one unit per step) in steps within `spread` of the job's
    median step: how regular a split is. Time, not steps: a split that misses boundaries leaves
    few steps, each two or three long."""
    d = (pl.DataFrame({"job": jobs[b], "ix": gid[b], "t": clock[b]})
         .with_columns(dt=pl.col("t").diff().over("ix")).filter(pl.col("dt") > 0))
    ok = typical(pl.col("dt"), pl.col("dt").median(), spread)
    r = d.group_by("job").agg(share=pl.col("dt").filter(ok).sum() / pl.col("dt").sum())
    return dict(zip(r["job"].to_list(), r["share"].to_list()))


def _align_job_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """job_step: steps of one job's ips ending together (within half a step) share an index."""
    if steps.height == 0:
        return steps.with_columns(job_step=pl.lit(0, dtype=pl.Int64))
    s = steps.with_columns(dur=pl.col("end_ns") - pl.col("start_ns")).sort("job_id", "end_ns")
    s = s.with_columns(med=pl.col("dur").median().over("job_id")).with_columns(
        new=(pl.col("end_ns").diff().over("job_id").fill_null(1 << 62) > 0.5 * pl.col("med")))
    return s.with_columns(job_step=(pl.col("new").cum_sum().over("job_id") - 1).cast(pl.Int64)).drop("dur", "med", "new")


def export_perfetto(steps: pl.DataFrame, ipf: pl.DataFrame, job_id: str, path: str | Path,
                    topology: pl.DataFrame | None = None) -> Path:
    """Write perfetto_trace(...) to path."""
    path = Path(path)
    path.write_bytes(perfetto_trace(steps, ipf, job_id, topology))
    return path


def perfetto_trace(steps: pl.DataFrame, ipf: pl.DataFrame, job_id: str, topology: pl.DataFrame | None = None) -> bytes:
    """One job's reconstructed timeline as a Chrome trace (JSON, opens in ui.perfetto.dev):
    one track (tid) per GPU; X events `DP` (the step's DP phase), `PP send`/`PP recv` per PP flow,
    and `compute` for the gaps between communication inside a step. Times in microseconds."""
    st = steps.filter(pl.col("job_id") == job_id).sort("ip", "step")
    if st.height == 0:
        raise ValueError(f"no reconstructed steps for job {job_id!r}")
    ips = st["ip"].unique().sort().to_list()
    tid = {ip: i for i, ip in enumerate(ips)}
    names = {}
    if topology is not None and "gpu" in topology.columns:
        names = dict(zip(topology["ip"].to_list(), topology["gpu"].to_list()))
    t0 = int(st["start_ns"].min())
    lo, hi = t0, int(st["end_ns"].max())
    ev = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": job_id}}]
    ev += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": tid[ip],
            "args": {"name": f"{names.get(ip) or ip} ({ip})"}} for ip in ips]

    def us(ns):
        return (ns - t0) / 1000.0

    comm = []
    for r in st.filter(pl.col("dp_start_ns").is_not_null()).iter_rows(named=True):
        comm.append((r["ip"], r["dp_start_ns"], r["dp_end_ns"], "DP", {"step": r["step"], "dp_bytes": r["dp_bytes"]}))
    pp = ipf.filter((pl.col("job_id") == job_id) & (pl.col("comm_type") == "PP")
                    & (pl.col("end_ns") >= lo) & (pl.col("start_ns") <= hi)
                    & pl.col("ip").is_in(ips))
    for r in pp.iter_rows(named=True):
        comm.append((r["ip"], r["start_ns"], r["end_ns"], f"PP {r['role']}", {"peer": r["peer"], "bytes": r["bytes"]}))
    for ip, s, e, name, args in comm:
        ev.append({"ph": "X", "pid": 0, "tid": tid[ip], "name": name, "cat": "comm", "ts": us(s),
                   "dur": max((e - s) / 1000.0, 0.001), "args": args})
    # compute = the gaps between merged communication intervals inside each step
    cf = pl.DataFrame(comm, schema={"ip": pl.Utf8, "s": pl.Int64, "e": pl.Int64, "name": pl.Utf8, "args": pl.Object},
                      orient="row").select("ip", "s", "e") if comm else pl.DataFrame(schema={"ip": pl.Utf8, "s": pl.Int64, "e": pl.Int64})
    bounds = st.select("ip", s=pl.col("start_ns"), e=pl.col("start_ns"))  # zero-length marks at step starts
    ends = st.select("ip", s=pl.col("end_ns"), e=pl.col("end_ns"))
    iv = pl.concat([cf, bounds, ends]).sort("ip", "s").with_columns(
        run_end=pl.col("e").cum_max().over("ip")).with_columns(prev_end=pl.col("run_end").shift(1).over("ip"))
    gaps = iv.filter(pl.col("prev_end").is_not_null() & (pl.col("s") > pl.col("prev_end")))
    # keep only gaps inside a step (not before the first step start of the ip)
    first = st.group_by("ip").agg(f=pl.col("start_ns").min(), l=pl.col("end_ns").max())
    gaps = gaps.join(first, on="ip").filter((pl.col("prev_end") >= pl.col("f")) & (pl.col("s") <= pl.col("l")))
    for r in gaps.iter_rows(named=True):
        ev.append({"ph": "X", "pid": 0, "tid": tid[r["ip"]], "name": "compute", "cat": "compute",
                   "ts": us(r["prev_end"]), "dur": (r["s"] - r["prev_end"]) / 1000.0})
    return json.dumps({"traceEvents": ev, "displayTimeUnit": "ms",
                       "otherData": {"source": "fleetscope.flows", "job_id": job_id, "t0_ns": t0}}).encode()
