"""PerfTracker 4.2 behaviour patterns: per (capture, function, worker) p = (beta, mu, sigma).

- beta  = sum_e d_e / T: share of the profiling window T the function holds the critical path.
- mu    = sum_e d_e u_e / sum_e d_e: duration-weighted mean utilization of the resource that
          bounds the function (SM for compute, NVLink for intra-host and NIC for inter-host
          collectives, memory-controller for memory ops, CPU for Python when sampled).
- sigma = the matching duration-weighted standard deviation (within-run variance of the samples
          plus the spread of u_e across executions: the law of total variance).

d_e is the critical duration of execution piece e, refined with hardware samples by Algorithm 1
(the longest run of samples above `intense_threshold` with at most `max_zero_run` consecutive
quiet samples; a collective that mostly waits for its peers keeps only its transfer time).
Without hardware samples the trace itself gives a utilization proxy, named in `mu_source`:
`trace_bytes` (collectives: achieved bandwidth msg_bytes/duration over the capture's 90th
percentile for that function), `trace_speed` (kernels / memory ops: the capture's 10th
percentile duration of that function over this duration: a throttled GPU runs the same kernel
slower), `none` (CPU functions: a trace has no CPU utilization; mu and sigma are null).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from fleetscope.perftracker.critical_path import (
    classify_events,
    classify_timings,
    critical_pieces,
    worker_windows,
)
from fleetscope.perftracker.schemas import BEHAVIOR_PATTERNS, finish_patterns

HW_LINKS = {"nvlink": ("nvlink_tx_bps", "nvlink_rx_bps"), "pcie": ("pcie_tx_bps", "pcie_rx_bps"), "nic": ("nic_tx_bps", "nic_rx_bps")}


@dataclass(frozen=True)
class PatternConfig:
    intense_threshold: float = 0.05  # Algorithm 1: a sample is intense above this utilization (0..1)
    max_zero_run: int = 2  # Algorithm 1: k, quiet samples allowed inside one run
    min_samples: int = 3  # fewer samples inside a piece: d_e unrefined, u_e = mean/nearest sample
    speed_quantile: float = 0.1  # trace_speed reference: this quantile of the function's durations
    bytes_quantile: float = 0.9  # trace_bytes reference: this quantile of achieved bandwidth
    # peak link bandwidth (bytes/s, tx+rx) per resource; None: the capture's 99.9th percentile
    link_peak_bps: dict = field(default_factory=lambda: {"nvlink": None, "pcie": None, "nic": None})
    nic_share_inter_host: float = 0.5  # a collective is inter-host when the NIC carries this share of its bytes


class PatternError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# trace-derived utilization


def _trace_utilization(pieces: pl.DataFrame, cfg: PatternConfig) -> pl.DataFrame:
    """Per piece: u (0..1 or null), resource, mu_source, from the trace alone. References are per
    function and, when known, per pipeline stage (the same op name does different work on
    different stages: the last stage's forward-compute carries the loss head)."""
    ref_keys = ["function", "stage"] if "stage" in pieces.columns else ["function"]
    has_bytes = pl.col("msg_bytes").is_not_null() & (pl.col("msg_bytes") > 0)
    bw = pl.col("msg_bytes").cast(pl.Float64) / pl.col("dur_ns").cast(pl.Float64)
    speed_ref = pl.col("dur_ns").cast(pl.Float64).quantile(cfg.speed_quantile).over(ref_keys)
    bw_ref = pl.when(has_bytes).then(bw).quantile(cfg.bytes_quantile).over(ref_keys)
    cat = pl.col("category")
    u_speed = (speed_ref / pl.col("dur_ns").cast(pl.Float64)).clip(0.0, 1.0)
    u_bytes = (bw / bw_ref).clip(0.0, 1.0)
    return pieces.with_columns(
        u=pl.when(cat == "python").then(None)
        .when((cat == "collective") & has_bytes).then(u_bytes)
        .otherwise(u_speed),
        u_var=pl.lit(0.0),
        d_ns=pl.col("crit_ns").cast(pl.Float64),
        mu_source=pl.when(cat == "python").then(pl.lit("none"))
        .when((cat == "collective") & has_bytes).then(pl.lit("trace_bytes"))
        .otherwise(pl.lit("trace_speed")),
        resource=pl.when(cat == "python").then(pl.lit("cpu"))
        .when(cat == "compute").then(pl.lit("sm"))
        .when(cat == "memory").then(pl.lit("memory"))
        .otherwise(pl.lit("link")),
    )


# ---------------------------------------------------------------------------------------------
# hardware samples


def hw_utilization(hw: pl.DataFrame, cfg: PatternConfig = PatternConfig()) -> pl.DataFrame:
    """hw samples (docs/CONTRACT.md 1.5) -> (host, gpu, ts_ns, sm, memory, nvlink, pcie, nic, cpu), each
    a utilization in [0, 1] or null. SM utilization is util_gpu_pct scaled by the clock ratio
    sm_clock/sm_clock_max: a throttled GPU stays 100 % busy at a lower clock, so busy-ness
    alone would hide it. Link utilization is (tx + rx) over the peak (configured, or the
    capture's 99.9th percentile)."""
    missing = [c for c in ("ts_ns", "host", "gpu") if c not in hw.columns]
    if missing:
        raise PatternError(f"hw samples lack required column(s) {missing}")

    def col(c):
        return pl.col(c).cast(pl.Float64) if c in hw.columns else pl.lit(None, dtype=pl.Float64)

    clock = pl.when(col("sm_clock_max_mhz") > 0).then((col("sm_clock_mhz") / col("sm_clock_max_mhz")).clip(0.0, 1.0)).otherwise(1.0)
    exprs = [
        pl.col("host").cast(pl.Utf8), pl.col("gpu").cast(pl.Utf8), pl.col("ts_ns").cast(pl.Int64),
        ((col("util_gpu_pct") / 100.0).clip(0.0, 1.0) * clock.fill_null(1.0)).alias("sm"),
        (col("util_mem_pct") / 100.0).clip(0.0, 1.0).alias("memory"),
        (col("cpu_util_pct") / 100.0).clip(0.0, 1.0).alias("cpu"),
    ]
    out = hw.select(exprs + [(col(tx).fill_null(0.0) + col(rx).fill_null(0.0)).alias(f"_{k}_bps") if (tx in hw.columns or rx in hw.columns)
                             else pl.lit(None, dtype=pl.Float64).alias(f"_{k}_bps") for k, (tx, rx) in HW_LINKS.items()])
    for k in HW_LINKS:
        peak = cfg.link_peak_bps.get(k)
        if peak is None:
            peak = out[f"_{k}_bps"].quantile(0.999)
        peak = float(peak) if peak else None
        out = out.with_columns(
            (pl.col(f"_{k}_bps") / peak).clip(0.0, 1.0).alias(k) if peak else pl.lit(None, dtype=pl.Float64).alias(k)
        )
    return out.sort("host", "gpu", "ts_ns")


def _collective_resources(pieces: pl.DataFrame, samples: pl.DataFrame, cfg: PatternConfig) -> dict[str, str]:
    """function -> 'nic' or 'nvlink': inter-host when the NIC carries most of the bytes sampled
    during the function's critical pieces, over all workers (one decision per function so every
    worker is measured on the same resource)."""
    coll = pieces.filter(pl.col("category") == "collective")
    if coll.height == 0:
        return {}
    pairs = _pair_samples(coll, samples)
    if pairs.height == 0:
        return {}
    agg = pairs.group_by("function").agg(
        nic=pl.col("_nic_bps").fill_null(0).sum(), intra=(pl.col("_nvlink_bps").fill_null(0) + pl.col("_pcie_bps").fill_null(0)).sum()
    )
    out = {}
    for f, nic, intra in agg.iter_rows():
        tot = nic + intra
        out[f] = "nic" if tot > 0 and nic / tot >= cfg.nic_share_inter_host else "nvlink"
    return out


def _pair_samples(pieces: pl.DataFrame, samples: pl.DataFrame) -> pl.DataFrame:
    """(piece, sample) pairs: every hw sample of the piece's GPU inside [start_ns, stop_ns).
    pieces need wid (worker index into samples' wid) and _pid; samples are sorted by (wid, ts)."""
    if pieces.height == 0 or samples.height == 0:
        return pl.DataFrame()
    t0 = min(int(samples["ts_ns"].min()), int(pieces["start_ns"].min()))
    span = max(int(samples["ts_ns"].max()), int(pieces["stop_ns"].max())) - t0 + 1
    nw = int(max(samples["wid"].max(), pieces["wid"].max())) + 1
    if nw * span >= 2**62:
        raise PatternError("hw samples span too long to key (workers x time overflow int64); split the capture")
    skey = samples["wid"].to_numpy().astype(np.int64) * span + (samples["ts_ns"].to_numpy() - t0)
    pw = pieces["wid"].to_numpy().astype(np.int64) * span
    lo = np.searchsorted(skey, pw + (pieces["start_ns"].to_numpy() - t0), side="left")
    hi = np.searchsorted(skey, pw + (pieces["stop_ns"].to_numpy() - t0), side="left")
    cnt = hi - lo
    idx = np.repeat(np.arange(pieces.height), cnt)
    j = lo[idx] + (np.arange(idx.size) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    return pl.concat([pieces[idx].select("_pid", "function"), samples[j].drop("wid", "host", "gpu", "ts_ns")], how="horizontal").with_columns(
        _j=pl.Series(j, dtype=pl.Int64)
    )


def _algorithm1(pairs: pl.DataFrame, period_ns: float, cfg: PatternConfig) -> pl.DataFrame:
    """Per piece with >= min_samples samples: the longest run of intense samples with at most k
    consecutive quiet ones (Algorithm 1) -> d_ns (run length x sample period), u (mean over the
    run), u_var (variance over the run). Pieces without an intense sample get d_ns = 0."""
    k = cfg.max_zero_run
    p = pairs.sort("_pid", "_j").with_columns(pos=pl.int_range(pl.len()).over("_pid"), n=pl.len().over("_pid"))
    p = p.filter(pl.col("n") >= cfg.min_samples)
    if p.height == 0:
        return pl.DataFrame(schema={"_pid": pl.Int64, "d_ns": pl.Float64, "u": pl.Float64, "u_var": pl.Float64})
    p = p.with_columns(active=pl.col("uval").fill_null(0.0) > cfg.intense_threshold, cs=pl.col("uval").fill_null(0.0).cum_sum().over("_pid"),
                       cs2=(pl.col("uval").fill_null(0.0) ** 2).cum_sum().over("_pid"))
    act = p.filter("active").with_columns(prev=pl.col("pos").shift(1).over("_pid"))
    act = act.with_columns(new=pl.col("prev").is_null() | ((pl.col("pos") - pl.col("prev") - 1) > k))
    act = act.with_columns(run=pl.col("new").cast(pl.Int64).cum_sum().over("_pid"))
    runs = act.group_by("_pid", "run").agg(first=pl.col("pos").min(), last=pl.col("pos").max())
    runs = runs.with_columns(length=pl.col("last") - pl.col("first") + 1).sort("_pid", "length", "first", descending=[False, True, False]).unique("_pid", keep="first")
    # sums over the run's span (quiet samples inside it included) from the prefix sums
    ends = p.select("_pid", "pos", "cs", "cs2")
    runs = runs.join(ends.rename({"pos": "last", "cs": "cs_l", "cs2": "cs2_l"}), on=["_pid", "last"]).join(
        ends.with_columns(pos=pl.col("pos") + 1).rename({"pos": "first", "cs": "cs_f", "cs2": "cs2_f"}), on=["_pid", "first"], how="left"
    )
    runs = runs.with_columns(
        s1=pl.col("cs_l") - pl.col("cs_f").fill_null(0.0), s2=pl.col("cs2_l") - pl.col("cs2_f").fill_null(0.0)
    ).with_columns(u=pl.col("s1") / pl.col("length"), d_ns=pl.col("length").cast(pl.Float64) * period_ns)
    runs = runs.with_columns(u_var=(pl.col("s2") / pl.col("length") - pl.col("u") ** 2).clip(0.0, None))
    quiet = p.select("_pid").unique().join(runs.select("_pid"), on="_pid", how="anti").with_columns(
        d_ns=pl.lit(0.0), u=pl.lit(None, dtype=pl.Float64), u_var=pl.lit(0.0)
    )
    return pl.concat([runs.select("_pid", "d_ns", "u", "u_var"), quiet.select("_pid", "d_ns", "u", "u_var")])


def _hw_utilization_for_pieces(pieces: pl.DataFrame, hw: pl.DataFrame, workers: pl.DataFrame, cfg: PatternConfig) -> pl.DataFrame:
    samples = hw_utilization(hw, cfg)
    wmap = workers.select(pl.col("rank").cast(pl.Int32), pl.col("host").cast(pl.Utf8), pl.col("gpu").cast(pl.Utf8)).unique("rank")
    gpus = samples.select("host", "gpu").unique().sort("host", "gpu").with_columns(wid=pl.int_range(pl.len(), dtype=pl.Int64))
    samples = samples.join(gpus, on=["host", "gpu"]).sort("wid", "ts_ns")
    period = samples.group_by("wid").agg(d=pl.col("ts_ns").diff().median())["d"].median()
    period = float(period) if period else 1.0
    pieces = pieces.join(wmap.join(gpus, on=["host", "gpu"]).select("rank", "wid"), on="rank", how="left")
    coll_res = _collective_resources(pieces.filter(pl.col("wid").is_not_null()), samples, cfg)
    res = (
        pl.when(pl.col("category") == "compute").then(pl.lit("sm"))
        .when(pl.col("category") == "memory").then(pl.lit("memory"))
        .when(pl.col("category") == "python").then(pl.lit("cpu"))
        .otherwise(pl.col("function").replace_strict(coll_res, default="nvlink", return_dtype=pl.Utf8))
    )
    # the intra-host link a GPU actually uses: PCIe when it moved more bytes over PCIe than over
    # NVLink during the capture (NVLink down: NCCL falls back to PCIe); its utilization is then
    # the PCIe one, as PerfTracker saw the three NVLink-down workers by their PCIe bandwidth
    link = samples.group_by("wid").agg(
        pcie_first=pl.col("_pcie_bps").fill_null(0).sum() > pl.col("_nvlink_bps").fill_null(0).sum())
    pieces = pieces.with_columns(resource=res).join(link, on="wid", how="left").with_columns(
        resource=pl.when((pl.col("resource") == "nvlink") & pl.col("pcie_first").fill_null(False)).then(pl.lit("pcie"))
        .otherwise(pl.col("resource"))).drop("pcie_first")
    has_res = {r: samples[r].null_count() < samples.height for r in ("sm", "memory", "cpu", "nvlink", "pcie", "nic")}
    covered = pl.col("wid").is_not_null() & pl.col("resource").replace_strict(has_res, default=False, return_dtype=pl.Boolean)
    hw_p = pieces.filter(covered)
    if hw_p.height == 0:
        return pieces.drop("wid")
    pairs = _pair_samples(hw_p, samples)
    if pairs.height:
        pairs = pairs.join(hw_p.select("_pid", "resource"), on="_pid")
        pairs = pairs.with_columns(uval=pl.coalesce([pl.when(pl.col("resource") == r).then(pl.col(r)) for r in ("sm", "memory", "cpu", "nvlink", "pcie", "nic")]))
        refined = _algorithm1(pairs.select("_pid", "_j", "uval"), period, cfg)
        inside = pairs.group_by("_pid").agg(u_in=pl.col("uval").mean(), u_in_var=pl.col("uval").var(ddof=0), n_in=pl.len())
    else:
        refined = pl.DataFrame(schema={"_pid": pl.Int64, "d_ns": pl.Float64, "u": pl.Float64, "u_var": pl.Float64})
        inside = pl.DataFrame(schema={"_pid": pl.Int64, "u_in": pl.Float64, "u_in_var": pl.Float64, "n_in": pl.UInt32})
    # pieces shorter than a few sample periods: the nearest sample (asof) stands for the piece
    mid = hw_p.select("_pid", "wid", "resource", t=(pl.col("start_ns") + pl.col("stop_ns")) // 2).sort("t")
    near = mid.join_asof(samples.sort("wid", "ts_ns").select("wid", "ts_ns", "sm", "memory", "cpu", "nvlink", "pcie", "nic"),
                         left_on="t", right_on="ts_ns", by="wid", strategy="nearest", tolerance=int(2 * period),
                         check_sortedness=False)
    near = near.select("_pid", u_near=pl.coalesce([pl.when(pl.col("resource") == r).then(pl.col(r)) for r in ("sm", "memory", "cpu", "nvlink", "pcie", "nic")]))
    hw_p = hw_p.drop("d_ns", "u", "u_var", "mu_source").join(refined, on="_pid", how="left").join(inside, on="_pid", how="left").join(
        near, on="_pid", how="left")
    hw_p = hw_p.with_columns(
        d_ns=pl.when(pl.col("d_ns").is_not_null()).then(pl.min_horizontal("d_ns", pl.col("crit_ns").cast(pl.Float64)))
        .otherwise(pl.col("crit_ns").cast(pl.Float64)),
        u=pl.when(pl.col("d_ns").is_not_null()).then(pl.col("u")).otherwise(pl.coalesce("u_in", "u_near")),
        u_var=pl.when(pl.col("d_ns").is_not_null()).then(pl.col("u_var")).otherwise(pl.col("u_in_var").fill_null(0.0)),
        mu_source=pl.when(pl.col("d_ns").is_not_null()).then(pl.lit("hw_alg1")).otherwise(pl.lit("hw_nearest")),
    )
    # pieces the samples do not cover keep the trace proxy
    hw_p = hw_p.with_columns(
        mu_source=pl.when(pl.col("u").is_null() & (pl.col("d_ns") > 0)).then(pl.col("_trace_source")).otherwise(pl.col("mu_source")),
        u=pl.when(pl.col("u").is_null() & (pl.col("d_ns") > 0)).then(pl.col("_trace_u")).otherwise(pl.col("u")),
    )
    cols = pieces.columns
    rest = pieces.filter(~covered)
    hw_p = hw_p.select([c for c in cols if c not in ("d_ns", "u", "u_var", "mu_source")] + ["d_ns", "u", "u_var", "mu_source"])
    rest = rest.select(hw_p.columns)
    return pl.concat([hw_p, rest]).drop("wid")


# ---------------------------------------------------------------------------------------------
# patterns


def patterns_from_pieces(
    pieces: pl.DataFrame,
    windows: pl.DataFrame,
    capture_id: str,
    hw: pl.DataFrame | None = None,
    workers: pl.DataFrame | None = None,
    config: PatternConfig = PatternConfig(),
) -> pl.DataFrame:
    """Critical pieces + per-worker windows (rank, window_ns) -> behavior_patterns rows (d_exp,
    d_diff, abnormal still empty: fill them with localize.localize)."""
    if pieces.height == 0:
        return finish_patterns(pl.DataFrame(schema={"capture_id": pl.Utf8}))
    stage = workers.select(pl.col("rank").cast(pl.Int32), pl.col("stage").cast(pl.Int32)).unique("rank") if (
        workers is not None and "stage" in workers.columns) else None
    if stage is not None:
        pieces = pieces.join(stage, on="rank", how="left")
    p = _trace_utilization(pieces, config).with_columns(_pid=pl.int_range(pl.len(), dtype=pl.Int64))
    if hw is not None and hw.height and workers is not None and workers.height:
        p = p.with_columns(_trace_u=pl.col("u"), _trace_source=pl.col("mu_source"))
        p = _hw_utilization_for_pieces(p, hw, workers, config)
    g = p.group_by("rank", "function").agg(
        category=pl.col("category").first(), function_name=pl.col("function_name").first(),
        container=pl.col("container").first() if "container" in p.columns else pl.lit(None, dtype=pl.Boolean),
        resource=pl.col("resource").mode().first(), mu_source=pl.col("mu_source").mode().sort().first(),
        stage=pl.col("stage").first() if "stage" in p.columns else pl.lit(None, dtype=pl.Int32),
        n_exec=pl.col("event_id").n_unique(), crit_ns=pl.col("crit_ns").sum(), d_sum=pl.col("d_ns").sum(),
        du=(pl.col("d_ns") * pl.col("u")).sum(), d_u=pl.when(pl.col("u").is_not_null()).then(pl.col("d_ns")).sum(),
        _u=pl.col("u"), _v=pl.col("u_var"), _d=pl.col("d_ns"),
    )
    g = g.with_columns(mu=pl.when(pl.col("d_u") > 0).then(pl.col("du") / pl.col("d_u")))
    # sigma^2 = sum d (var_e + (u_e - mu)^2) / sum d over executions with a utilization
    ex = g.select("rank", "function", "mu", "_u", "_v", "_d").explode("_u", "_v", "_d").filter(pl.col("_u").is_not_null())
    sig = ex.group_by("rank", "function").agg(
        s2=(pl.col("_d") * (pl.col("_v").fill_null(0.0) + (pl.col("_u") - pl.col("mu")) ** 2)).sum() / pl.col("_d").sum()
    )
    g = g.drop("_u", "_v", "_d").join(sig, on=["rank", "function"], how="left")
    g = g.join(windows.select(pl.col("rank").cast(pl.Int32), "window_ns"), on="rank", how="left")
    if g["window_ns"].null_count():
        raise PatternError("a rank has critical pieces but no profiling window")
    g = g.with_columns(
        capture_id=pl.lit(capture_id),
        beta=(pl.col("d_sum") / pl.col("window_ns").cast(pl.Float64)).clip(0.0, 1.0),
        sigma=pl.when(pl.col("mu").is_not_null()).then(pl.col("s2").fill_null(0.0).sqrt().clip(0.0, 1.0)),
        mu=pl.col("mu").clip(0.0, 1.0),
        crit_ns=pl.col("crit_ns").cast(pl.Int64),
    )
    return finish_patterns(g)


def behavior_patterns(
    events: pl.DataFrame,
    capture_id: str | None = None,
    hw: pl.DataFrame | None = None,
    workers: pl.DataFrame | None = None,
    window: tuple[int, int] | None = None,
    config: PatternConfig = PatternConfig(),
) -> pl.DataFrame:
    """trace_events of one capture -> behavior_patterns (unlocalized: run localize.localize).

    workers: optional (rank, host, gpu[, stage]) mapping ranks to the hw samples' GPUs and to
    their pipeline stage. window: optional [start_ns, end_ns) profiling window (default: each
    worker's trace span)."""
    if events.height == 0:
        raise PatternError("no trace events")
    cap = capture_id or (events["capture_id"][0] if "capture_id" in events.columns else "")
    ev = events
    if window is not None:
        end = pl.col("end_ns") if "end_ns" in ev.columns else pl.col("ts_ns") + pl.col("dur_ns")
        ev = ev.filter((pl.col("ts_ns") < window[1]) & (end > window[0]))
    pieces = critical_pieces(classify_events(ev))
    if window is not None:
        pieces = pieces.with_columns(start_ns=pl.col("start_ns").clip(window[0], window[1]), stop_ns=pl.col("stop_ns").clip(window[0], window[1])
                                     ).with_columns(crit_ns=pl.col("stop_ns") - pl.col("start_ns")).filter(pl.col("crit_ns") > 0)
    return patterns_from_pieces(pieces, worker_windows(ev, window=window), cap, hw=hw, workers=workers, config=config)


def op_patterns(timings: pl.DataFrame, capture_id: str | None = None, config: PatternConfig = PatternConfig()) -> pl.DataFrame:
    """Normalized timings (e.g. the StragglerAnalysis per-op trace) -> behavior_patterns with ops
    as functions. Critical path per (rank, step) because op times may restart every step; the
    window is the sum of the step spans; stage comes from the timings when present."""
    if timings.height == 0:
        raise PatternError("no timings rows")
    cap = capture_id or (timings["capture_id"][0] if "capture_id" in timings.columns else "")
    by_step = "step" in timings.columns and timings["step"].null_count() < timings.height
    cls = classify_timings(timings)
    pieces = critical_pieces(cls, by_step=by_step)
    ev = cls.select("rank", "step", "ts_ns", "end_ns")
    workers = None
    if "stage" in timings.columns:
        workers = timings.group_by("rank").agg(pl.col("stage").drop_nulls().mode().first()).with_columns(pl.col("rank").cast(pl.Int32))
    return patterns_from_pieces(pieces, worker_windows(ev, by_step=by_step), cap, workers=workers, config=config)


__all__ = ["PatternConfig", "PatternError", "behavior_patterns", "op_patterns", "patterns_from_pieces", "hw_utilization", "workers_from_capture", "BEHAVIOR_PATTERNS"]


def workers_from_capture(events: pl.DataFrame | None = None, timings: pl.DataFrame | None = None,
                         hw: pl.DataFrame | None = None, layout: dict | None = None) -> pl.DataFrame:
    """(rank, host, gpu, stage) for a capture from what landed: host and stage per rank from the
    timings (host column, stage column), the GPU from the trace (device index of its kernels)
    matched to the hw samples' GPU ids on that host (`<host>/gpu<device>`, or an id on the host
    ending in the device index). Columns it cannot find stay null (hw then cannot be joined for
    that rank and the trace proxy is used; the table says so in mu_source)."""
    parts = []
    if timings is not None and timings.height:
        t = timings.with_columns(pl.col("rank").cast(pl.Int32))
        if "stage" in t.columns:
            parts.append(t.group_by("rank").agg(pl.col("stage").drop_nulls().mode().first().cast(pl.Int32).alias("stage")))
        if "host" in t.columns:
            # a rank's host: of the names its rows carry, the one the fewest ranks share (a name every
            # rank of a multi-host job reports, e.g. a container's hostname, says nothing), then the commonest
            h = t.filter(pl.col("host").is_not_null()).group_by("rank", pl.col("host").cast(pl.Utf8)).agg(n=pl.len())
            h = h.with_columns(k=pl.col("rank").n_unique().over("host")).sort(["rank", "k", "n", "host"], descending=[False, False, True, False])
            parts.append(h.unique("rank", keep="first", maintain_order=True).select("rank", "host"))
    if events is not None and events.height and "device" in events.columns:
        parts.append(events.filter(pl.col("device").is_not_null()).group_by(pl.col("rank").cast(pl.Int32))
                     .agg(device=pl.col("device").mode().first().cast(pl.Int32)))
    if not parts:
        return pl.DataFrame(schema={"rank": pl.Int32, "host": pl.Utf8, "gpu": pl.Utf8, "stage": pl.Int32})
    w = parts[0]
    for p in parts[1:]:
        w = w.join(p, on="rank", how="full", coalesce=True)
    for c, t in (("host", pl.Utf8), ("stage", pl.Int32), ("device", pl.Int32)):
        if c not in w.columns:
            w = w.with_columns(pl.lit(None, dtype=t).alias(c))
    if layout and w["stage"].null_count() == w.height and layout.get("ranks"):
        # each rank's stage from the capture's layout (fleetscope.traces.layout)
        w = w.with_columns(stage=pl.col("rank").replace_strict({k: v[0] for k, v in layout["ranks"].items()}, default=None,
                                                               return_dtype=pl.Int32))
    elif layout and w["stage"].null_count() == w.height and layout.get("pp"):
        # Megatron rank order (tp fastest, then dp, then pp) when only the layout is known
        per_stage = int(layout.get("tp", 1)) * int(layout.get("dp", 1))
        w = w.with_columns(stage=(pl.col("rank") // per_stage).cast(pl.Int32))
    gpu = pl.lit(None, dtype=pl.Utf8)
    if hw is not None and hw.height:
        ids = hw.select(pl.col("host").cast(pl.Utf8), pl.col("gpu").cast(pl.Utf8)).unique()
        ids = ids.with_columns(device=pl.col("gpu").str.extract(r"(\d+)$").cast(pl.Int32))
        w = w.join(ids, on=["host", "device"], how="left")
        gpu = pl.col("gpu")
    return w.select("rank", "host", gpu.alias("gpu"), "stage").sort("rank")
