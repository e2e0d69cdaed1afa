"""Step periods of jobs and the periodic step split of each GPU address's flow sequence.

A two-level gap filter (changepoint.py) splits a sequence where gaps jump far above the typical
gap. That breaks on fast jobs (a step's compute gap barely exceeds the gaps between its buckets),
on jobs whose DP traffic spreads over the backward pass (DDP buckets), and on pauses that look like
steps. Every step of a job repeats, though, and the job's many addresses and flows estimate its pace
well, even where a fault slows it for a while:

1. job_periods: per job, the gap ladder of its first addresses (gap_ladder_fit: the k largest gaps
   whose starts tile the time evenly, a run of consistently longer spacings judged against its own
   level), else the autocorrelation of their flows; and a step clock (step_warp) from the address
   with the shortest ladder period of at least half the job's: time counted in steps, one unit per
   step through a slower stretch.
2. periodic_boundaries: per address, a gap starts a step when it is the largest gap within half a
   step on either side of it on that clock, and clearly above the address's typical gap: one
   boundary per step wherever the step's longest quiet time falls, robust to jitter and to single
   long steps (a stall leaves one long gap, still one boundary).
"""
from __future__ import annotations

import numpy as np
import polars as pl

UNIT = 1_000_000  # a period in normalized time units


def autocorr_period(t: np.ndarray, min_lag_ns: int, bin_ns: int | None = None, near: float = 0.85,
                    smooth_bins: int = 4, min_peak: float = 0.2, weights: np.ndarray | None = None) -> float | None:
    """Step period (ns) of an event train (start times; `weights`, e.g. bytes, weigh each event), or
    None when it shows no repetition."""
    if len(t) < 8:
        return None
    t0, t1 = int(t.min()), int(t.max())
    span = t1 - t0
    if span <= 4 * min_lag_ns:
        return None
    b = bin_ns or max(min_lag_ns // 8, span // (1 << 15), 1)
    x = np.bincount(((t - t0) // b).astype(np.int64), weights=weights).astype(np.float64)
    n = len(x)
    x -= x.mean()
    nfft = 1 << int(np.ceil(np.log2(2 * n)))
    f = np.fft.rfft(x, nfft)
    ac = np.fft.irfft(f * np.conj(f), nfft)[:n]
    if ac[0] <= 0:
        return None
    # unbiased (each lag averaged over the overlap), lags up to half the span (>= 2 repetitions)
    max_lag = n // 2
    lo = max(int(min_lag_ns // b), 2)
    if max_lag <= lo + 2:
        return None
    ac = ac[:max_lag] / (n - np.arange(max_lag)) / (ac[0] / n)
    # jitter spreads a repetition over neighbouring bins: judge peaks by their mass over a few bins
    k = np.ones(2 * smooth_bins + 1)
    acs = np.convolve(ac, k, mode="same")
    seg = acs[lo:]
    # local maxima (peaks) of the autocorrelation beyond the minimum lag
    pk = np.flatnonzero((seg[1:-1] >= seg[:-2]) & (seg[1:-1] >= seg[2:]) & (seg[1:-1] > 0)) + 1
    if len(pk) == 0:
        return None
    mass0 = ac[0] + 2 * ac[1:smooth_bins + 1].sum()  # the same kernel at lag 0: perfect repetition
    best = int(pk[np.argmax(seg[pk])])
    top = seg[best]
    if top < min_peak * mass0:
        return None
    # the smallest lag nearly as self-similar as the best one and dividing it (the period, not a
    # multiple of it; and not the spacing of buckets or microbatches inside a step, which repeats
    # less and seldom divides the best lag)
    lag = best + lo
    for c in pk[seg[pk] >= near * top]:
        r = (best + lo) / (c + lo)
        if abs(r - round(r)) <= 0.1:
            lag = int(c + lo)
            break
    # refine to sub-bin precision with a parabola through the peak
    if 1 <= lag < len(ac) - 1:
        y0, y1, y2 = ac[lag - 1], ac[lag], ac[lag + 1]
        den = y0 - 2 * y1 + y2
        # (the lag was picked on the smoothed autocorrelation: where the raw one has no peak at it, the
        # parabola's vertex may lie anywhere, even at a negative lag; it refines within half a bin)
        off = float(np.clip(0.5 * (y0 - y2) / den, -0.5, 0.5)) if den < 0 else 0.0
    else:
        off = 0.0
    return float((lag + off) * b)


def _regime_ratio(sp: np.ndarray, far: float = 1.5, spread: float = 0.25, min_run: int = 5,
                  typical: float | None = None) -> np.ndarray:
    """Each spacing over its reference: the typical spacing over time (the median weighted by
    duration: the level that holds half of the time), or, inside a stretch of slower steps (a
    straggler, a congested link), that stretch's median. A stretch is a run of at least min_run
    consecutive spacings all `far` above the typical, three in four of them within `spread` of
    their own median (a missed boundary inside it is still a double spacing; a stretch whose
    spacings scatter more is missed boundaries, not a pace). Isolated long spacings (the
    pauses between bursts, merged steps) keep the typical one, and so do runs of short ones: the
    flows of one step's burst are as regular as a pace of steps. (A slower stretch holding more than
    half of the time becomes the typical one, and the faster steps around it read as parts of
    steps: a known limit.) `typical` overrides the reference (the step clock: the ladder's period)."""
    if typical is None:
        o = np.argsort(sp, kind="stable")
        cum = np.cumsum(sp[o])
        typical = float(sp[o][np.searchsorted(cum, 0.5 * cum[-1])])
    med = typical
    r = sp / med
    side = (r > far).astype(np.int8)
    edge = np.flatnonzero(np.diff(side) != 0) + 1
    lo, hi = np.r_[0, edge], np.r_[edge, len(sp)]
    long_slow = (side[lo] == 1) & (hi - lo >= min_run)   # (the only runs with work to do)
    for a, b in zip(lo[long_slow].tolist(), hi[long_slow].tolist()):
        m = float(np.median(sp[a:b]))
        if np.mean(np.abs(sp[a:b] / m - 1) <= spread) >= 0.75:
            r[a:b] = sp[a:b] / m
    return r


def gap_ladder_fit(t: np.ndarray, gap: np.ndarray, max_irregular: float = 0.45) -> tuple[float, float, np.ndarray] | None:
    """Step period of one address's flow sequence from its gaps, and the step starts it rests on:
    the gap level whose occurrences are evenly spaced. Taking the k largest gaps as boundaries, for
    k on a geometric ladder: too few (only pauses, or some steps merged) leaves spacings of several
    periods; too many (buckets, ring chunks) leaves most of the time in a few long spacings between
    bursts of short ones. At the step level the spacings tile the time evenly, but a job may run
    slower for a while (a straggler, a congested link): a run of consistently longer spacings is
    judged against its own level (_regime_ratio), isolated long ones against the level that holds
    half of the time.
    t: start time after each gap (ns), gap: > 0. Returns (score: the spread of the spacings around
    their references, 1 for perfectly even steps; median spacing; sorted boundary times) or None."""
    n = len(gap)
    if n < 3:
        return None
    order = np.argsort(-gap, kind="stable")
    best = None
    # at least 8 spacings where there are gaps enough: two or three largest gaps are always
    # "evenly spaced" and would name a multiple of the period
    k0 = min(9, max(3, n // 2))
    ks = np.round(np.geomspace(k0, n, num=min(n - k0 + 1, 48))).astype(int)
    # ... but a job that launched late in the span shows a few steps only: fewer largest gaps are a
    # level too where they stand apart from the rest, at the sequence's steepest drop in gap size
    # (a forward pass against a bucket's gap); spacings still judge it
    gs = np.log(gap[order])
    drop = int(np.argmax(gs[:-1] - gs[1:])) + 1 if n > 1 else 0
    if 3 <= drop < k0:
        ks = np.r_[drop, ks]
    for k in np.unique(ks):
        tb = np.sort(t[order[:k]])
        sp = np.diff(tb).astype(np.float64)
        if len(sp) < 2 or np.median(sp) <= 0:
            continue
        # share of the span in spacings far longer than their reference: merged steps, or bursts
        # with pauses between them
        r = _regime_ratio(sp)
        irregular = float(sp[r > 1.5].sum() / sp.sum())
        if irregular > max_irregular:
            continue
        # spread around the reference: many short spacings (a burst's flows) far under the level
        # that holds the time are as uneven as long ones over it. Times the boundaries the level
        # gets wrong per spacing: a spacing of r references misses r - 1 of them, one far under the
        # reference is one too many. A level that splits a step's buckets evenly leaves the step's
        # longest quiet time (the forward pass) one long spacing per step: few by count (they hide
        # under the 90th percentile), many missed boundaries
        q10, q90 = np.quantile(r, [0.1, 0.9])
        wrong = float((r[r > 1.5] - 1.0).sum() + (r < 1 / 1.5).sum())
        score = max(q90, 1.0) / max(min(q10, 1.0), 1e-9) * (1.0 + wrong / len(sp))
        if best is None or score < best[0]:
            best = (score, float(np.median(sp)), tb)
    return best


def gap_ladder(t: np.ndarray, gap: np.ndarray, max_irregular: float = 0.45) -> tuple[float, np.ndarray] | None:
    """gap_ladder_fit's (period, boundary times), or None."""
    r = gap_ladder_fit(t, gap, max_irregular)
    return None if r is None else (r[1], r[2])


def step_warp(tb: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The knots (t, u) of a job's step clock from step starts tb, and the periods at its two ends:
    u counts steps, each spacing over its reference (_regime_ratio: the median spacing, or inside a
    stretch of slower steps that stretch's), so a slower stretch keeps one unit per step while an
    isolated long spacing (a pause, missed starts) counts its steps. Beyond
    the knots the clock runs at the reference of the nearest end."""
    sp = np.diff(tb).astype(np.float64)
    # the ladder's period (the median spacing) is the reference here: among the chosen starts a few
    # missed ones hold much time and would raise a time-weighted one
    r = _regime_ratio(sp, typical=float(np.median(sp)))
    ref = sp / np.maximum(r, 1e-12)
    u = np.concatenate([[0.0], np.cumsum(r)])
    return tb.astype(np.float64), u, float(ref[0]), float(ref[-1])


def job_periods(bnd: pl.DataFrame, min_lag_ns: int, max_ips: int = 4) -> tuple[pl.DataFrame, dict]:
    """bnd: boundary flows (job_id, ix, start_ns, end_ns, gap) sorted by (ix, start_ns). Per job its
    step period (period_ns, null when no repetition shows): the median of its first max_ips
    addresses' gap-ladder periods, else the autocorrelation of their flows; and per job with a
    gap ladder the step clock's knots (step_warp; from its address with the shortest ladder period
    of at least half the job's): the job's steps may be slower for a while."""
    if bnd.height == 0:
        return pl.DataFrame(schema={"job_id": pl.Utf8, "period_ns": pl.Float64}), {}
    sub = bnd.select("job_id", "ix", "start_ns", "gap").with_columns(
        r=pl.col("ix").rank("dense").over("job_id")).filter(pl.col("r") <= max_ips)
    out, warps = [], {}
    for (job,), g in sub.group_by(["job_id"]):
        per = []
        for (_,), h in g.group_by(["ix"]):
            pos = h.filter((pl.col("gap") > 0) & pl.col("gap").is_not_nan())
            lad = gap_ladder(pos["start_ns"].to_numpy(), pos["gap"].to_numpy())
            if lad is not None and lad[0] >= min_lag_ns:
                per.append(lad)
        if per:
            p = float(np.median([x[0] for x in per]))
            # the clock from the address with the shortest ladder period of at least half the job's:
            # addresses disagree when a job slows for a while (some ladders hold the slow stretch's
            # steps, and a faster clock never merges steps) or one ladder took a burst's flows (far
            # under the job's period)
            fast = min((x for x in per if x[0] >= 0.5 * p), key=lambda x: x[0])
            warps[job] = step_warp(fast[1])
        else:
            p = autocorr_period(g["start_ns"].to_numpy(), min_lag_ns)
        out.append((job, p))
    return pl.DataFrame(out, schema={"job_id": pl.Utf8, "period_ns": pl.Float64}, orient="row"), warps


def warped_units(job: np.ndarray | pl.Series, t: np.ndarray, period: np.ndarray, warps: dict) -> np.ndarray:
    """Each row's time on its job's step clock in UNITs per step: the warp's knots where the job has
    one (linear beyond them, at the edge steps' pace), else time over the job's one period."""
    u = (t - t.min()).astype(np.float64) * (UNIT / period)
    if not warps or len(job) == 0:
        return u
    # each job's rows found once (a mask per job over every row grew with jobs x rows)
    sel = pl.DataFrame({"j": job if isinstance(job, pl.Series) else pl.Series(job, dtype=pl.Utf8)}).with_row_index("i").filter(pl.col("j").is_in(list(warps))) \
        .sort("j", maintain_order=True)
    cnt = sel.group_by("j", maintain_order=True).len()
    ii, off = sel["i"].to_numpy().astype(np.int64), np.concatenate([[0], np.cumsum(cnt["len"].to_numpy())]).astype(np.int64)
    where = {j: ii[off[k]:off[k + 1]] for k, j in enumerate(cnt["j"].to_list())}
    for j, (kt, ku, p0, p1) in warps.items():
        m = where.get(j)
        if m is None or len(m) == 0 or len(kt) < 2:
            continue
        x = t[m].astype(np.float64)
        v = np.interp(x, kt, ku)
        lo, hi = x < kt[0], x > kt[-1]
        v[lo] = ku[0] - (kt[0] - x[lo]) / p0
        v[hi] = ku[-1] + (x[hi] - kt[-1]) / p1
        u[m] = (v - v.min()) * UNIT
    return u


def periodic_boundaries(seq: pl.DataFrame, warps: dict | None = None, half: float = 0.45, min_share: float = 0.25) -> pl.Series:
    """seq: rows sorted by (ix, start_ns) with job_id, gap (ns, null at a group's first row),
    period_ns (the job's, null: unknown) and ix; warps: job_periods' step clocks. True where a flow
    starts a new step."""
    x = seq.select("ix", "start_ns", "gap", "period_ns").with_row_index("_i").with_columns(
        g=pl.col("gap").fill_null(-1.0).fill_nan(-1.0))
    known_rows = x["period_ns"].is_not_null().to_numpy()
    u = np.zeros(x.height, dtype=np.int64)
    if known_rows.any():
        u[known_rows] = warped_units(seq["job_id"].filter(pl.Series(known_rows)), x["start_ns"].to_numpy()[known_rows],
                                     x["period_ns"].to_numpy()[known_rows], warps or {}).astype(np.int64)
    x = x.with_columns(u=pl.Series(u))
    w = f"{int(half * UNIT)}i"
    known = x.filter(pl.col("period_ns").is_not_null())
    fwd = known.with_columns(bmax=pl.col("g").rolling_max_by("u", window_size=w).over("ix"))
    rev = known.with_columns(ur=-pl.col("u")).sort("ix", "ur").with_columns(
        fmax=pl.col("g").rolling_max_by("ur", window_size=w).over("ix")).select("_i", "fmax")
    # (rows matched by their index, a position: scattered and gathered, not joined)
    fm = np.empty(x.height, dtype=np.float64)
    fm[rev["_i"].to_numpy()] = rev["fmax"].to_numpy()
    k = fwd.with_columns(fmax=pl.Series(fm[fwd["_i"].to_numpy()]))
    # a boundary is at least a fair share of the address's typical boundary gap (a lone small gap
    # with no bigger one within half a period, inside a long pause or a sparse stretch, is not one)
    k = k.with_columns(cand=(pl.col("g") >= pl.col("bmax")) & (pl.col("g") >= pl.col("fmax")) & (pl.col("g") > 0))
    k = k.with_columns(typ=pl.col("g").filter("cand").median().over("ix"))
    k = k.with_columns(b=pl.col("cand") & (pl.col("g") >= min_share * pl.col("typ")))
    b = np.zeros(x.height, dtype=bool)
    b[k["_i"].to_numpy()] = k["b"].fill_null(False).to_numpy()
    return pl.Series("b", b)
