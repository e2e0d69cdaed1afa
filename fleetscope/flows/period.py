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
   A ladder may settle on a step's inner rhythm instead: an FSDP job all-gathers and
   reduce-scatters every unit through forward and backward, so its units' spacings tile the time
   more evenly than its steps (whose boundary need not be its longest quiet time).
   step_scale_period looks for a longer repetition at the scale of the step itself.
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
    # refine to sub-bin precision with a parabola through the peak (the lag was picked on the
    # smoothed autocorrelation: where the raw one has no peak at it, _vertex keeps within half a bin)
    off = _vertex(ac, lag) if 1 <= lag < len(ac) - 1 else 0.0
    return float((lag + off) * b)


def _vertex(y: np.ndarray, i: int) -> float:
    """The offset (bins, within half a bin) of the vertex of the parabola through y[i-1..i+1]
    from i; 0 where the three points do not bend down (no peak to refine)."""
    y0, y1, y2 = y[i - 1], y[i], y[i + 1]
    den = y0 - 2 * y1 + y2
    return float(np.clip(0.5 * (y0 - y2) / den, -0.5, 0.5)) if den < 0 else 0.0


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


def _byte_spectrum(trains: list[tuple[np.ndarray, np.ndarray]], bin_ns: float) -> tuple[np.ndarray, float, float]:
    """Summed power spectrum of the trains' byte rates (bins of bin_ns, mean removed): (power,
    frequency step in cycles per ns, span in ns)."""
    t0 = min(int(t.min()) for t, _ in trains)
    span = float(max(int(t.max()) for t, _ in trains) - t0)
    n = int(span // bin_ns) + 1
    nfft = 1 << int(np.ceil(np.log2(2 * n)))
    pw = np.zeros(nfft // 2 + 1)
    for t, w in trains:
        x = np.bincount(((t - t0) // bin_ns).astype(np.int64), weights=w, minlength=n)
        X = np.fft.rfft(x, nfft)
        pw += X.real ** 2 + X.imag ** 2
    pw[0] = 0.0
    return pw, 1.0 / (nfft * bin_ns), span


def _scale_peaks(pw: np.ndarray, df: float, span: float, s: float, ratio: float) -> list[tuple[float, float]]:
    """Peaks (lag ns, correlation) of the trains' autocorrelation at lags within a factor
    sqrt(ratio) of s, the trains band-passed to the scale s: smoothed over s/10 (finer detail,
    a step's units, drops out) and without what varies over much more than s (a job's load
    changing over the window would make every long lag look alike)."""
    f = np.arange(len(pw)) * df
    g = np.exp(-0.5 * (2 * np.pi * f * s / 10) ** 2) - np.exp(-0.5 * (2 * np.pi * f * s / 2) ** 2)
    keep = np.flatnonzero(g * g > 1e-6)
    if len(keep) == 0:
        return []
    kc = int(keep.max()) + 2
    m = 2 * (kc - 1)
    ac = np.fft.irfft(pw[:kc] * g[:kc] ** 2, m)      # the band's autocorrelation, lag step 1/(m df)
    if ac[0] <= 0:
        return []
    dl = 1.0 / (m * df)
    lag = np.arange(m // 2) * dl
    ok = lag < 0.5 * span
    # each lag as a share of the overlap it has (fewer repetitions at longer lags)
    r = ac[: m // 2][ok] / ac[0] / np.maximum(1 - lag[ok] / span, 1e-3)
    idx = np.flatnonzero((lag[ok] >= s / np.sqrt(ratio)) & (lag[ok] < s * np.sqrt(ratio)))
    return [((i + _vertex(r, i)) * dl, float(r[i])) for i in idx[(idx > 0) & (idx < len(r) - 1)]
            if r[i] >= r[i - 1] and r[i] >= r[i + 1]]


def step_scale_period(trains: list[tuple[np.ndarray, np.ndarray]], p: float, near: float = 0.95,
                      min_reps: int = 8) -> float | None:
    """A step period longer than p (a ladder's) when p is only the step's inner rhythm, else None.

    trains: (start times ns, bytes) of a job's addresses. Each lag is judged on the trains
    band-passed to its own scale (_scale_peaks), so a unit's rhythm counts at its scale and a
    step's pattern (forward against backward, microbatches) at its own. The longer period is the
    smallest lag nearly as self-similar as the best one and dividing it, among lags past p's own
    harmonics (4 p) with at least min_reps repetitions in the data; it replaces p when it repeats
    beyond chance and at least half as strongly as the strongest repetition at any lag (a job whose
    period p is right shows little beyond it: correlations near 0)."""
    span = max(float(t.max()) for t, _ in trains) - min(float(t.min()) for t, _ in trains)
    if p <= 0 or span < 2 * min_reps * p:
        return None
    pw, df, span = _byte_spectrum(trains, max(p / 16, span / (1 << 17)))
    ratio = 1.5
    peaks, s = [], p / 1.2
    while s <= span / min_reps * np.sqrt(ratio):
        peaks += _scale_peaks(pw, df, span, s, ratio)
        s *= ratio
    # beyond p's own harmonics: a stretch of slower steps (a straggler, a slow GPU) makes a job's
    # traffic self-similar at a few times p too (two slow steps against p), never at many
    cand = [(c, v) for c, v in peaks if 4.2 * p <= c <= span / min_reps]
    if not cand:
        return None
    best, top = max(cand, key=lambda x: x[1])
    # the step's pattern must repeat beyond chance (a correlation over span / best repetitions: its
    # noise about 1 / sqrt of that; twice it) and at least half as strongly as anything in the
    # job's traffic does (a job whose period p is right, or nearly: a ladder moved by a slow
    # stretch, repeats far more strongly near p)
    if top < 2.0 / np.sqrt(span / best) or top < 0.5 * max(v for _, v in peaks):
        return None
    P = best
    for c, v in sorted(cand):
        r = best / c
        if v >= near * top and abs(r - round(r)) <= 0.05:
            P = c
            break
    return _refine_period(pw, df, span, P)


def _refine_period(pw: np.ndarray, df: float, span: float, P0: float) -> float:
    """P0 refined on the autocorrelation near each of its multiples (the trains smoothed over
    P0 / 40), least squares through the origin."""
    f = np.arange(len(pw)) * df
    g2 = np.exp(-(2 * np.pi * f * P0 / 40) ** 2)
    kc = min(int(np.flatnonzero(g2 > 1e-9).max()) + 2, len(pw))
    m = 2 * (kc - 1)
    dl = 1.0 / (m * df)
    lag = np.arange(m // 2) * dl
    # each lag as a share of its overlap: the raw sum falls with the lag and would tilt every
    # peak toward shorter lags
    ac = np.fft.irfft(pw[:kc] * g2[:kc], m)[: m // 2] / np.maximum(1 - lag / span, 1e-3)
    js, ls = [], []
    for j in range(1, int(span / 3 / P0) + 1):
        a, z = int((j * P0 * 0.97) / dl), int((j * P0 * 1.03) / dl) + 1
        if a < 1 or z >= len(ac) - 1:
            break
        i = a + int(np.argmax(ac[a:z]))
        js.append(j)
        ls.append((i + _vertex(ac, i)) * dl)
    if not js:
        return float(P0)
    j, at = np.asarray(js, dtype=np.float64), np.asarray(ls)
    return float((j * at).sum() / (j * j).sum())


def job_periods(bnd: pl.DataFrame, min_lag_ns: int, max_ips: int = 4) -> tuple[pl.DataFrame, dict]:
    """bnd: boundary flows (job_id, ix, start_ns, end_ns, gap, bytes) sorted by (ix, start_ns). Per
    job its step period (period_ns, null when no repetition shows): the median of its first max_ips
    addresses' gap-ladder periods, else the autocorrelation of their flows, or a longer period at the
    step's own scale where the ladders held the step's inner rhythm (step_scale_period; `streaming`:
    the job's largest gaps are not its step boundaries); and per job with a gap ladder the step
    clock's knots (step_warp; from its address with the shortest ladder period of at least half the
    job's): the job's steps may be slower for a while."""
    schema = {"job_id": pl.Utf8, "period_ns": pl.Float64, "streaming": pl.Boolean}
    if bnd.height == 0:
        return pl.DataFrame(schema=schema), {}
    # a pipeline's hops (boundary source PP) carry activations, not collectives streaming through
    # the step: its steps come from where it drains (pipeline.py)
    pipe = set(bnd.group_by("job_id").agg(pp=(pl.col("source") == "PP").all()).filter("pp")["job_id"].to_list()) \
        if "source" in bnd.columns else set()
    sub = bnd.select("job_id", "ix", "start_ns", "gap", "bytes").with_columns(
        r=pl.col("ix").rank("dense").over("job_id")).filter(pl.col("r") <= max_ips)
    out, warps = [], {}
    for (job,), g in sub.group_by(["job_id"]):
        per = []
        for (_,), h in g.group_by(["ix"]):
            pos = h.filter((pl.col("gap") > 0) & pl.col("gap").is_not_nan())
            lad = gap_ladder(pos["start_ns"].to_numpy(), pos["gap"].to_numpy())
            if lad is not None and lad[0] >= min_lag_ns:
                per.append(lad)
        trains = [(h["start_ns"].to_numpy(), h["bytes"].to_numpy().astype(np.float64)) for _, h in g.group_by("ix")]
        if per:
            p = float(np.median([x[0] for x in per]))
            longer = None if job in pipe else step_scale_period(trains, p)
            streaming = longer is not None
            if streaming:
                # the ladders held the step's inner rhythm: a steady clock at the step's period
                p = longer
            else:
                # the clock from the address with the shortest ladder period of at least half the
                # job's: addresses disagree when a job slows for a while (some ladders hold the slow
                # stretch's steps, and a faster clock never merges steps) or one ladder took a
                # burst's flows (far under the job's period)
                fast = min((x for x in per if x[0] >= 0.5 * p), key=lambda x: x[0])
                warps[job] = step_warp(fast[1])
        else:
            p = autocorr_period(g["start_ns"].to_numpy(), min_lag_ns)
            longer = None if p is None or job in pipe else step_scale_period(trains, p)
            streaming = longer is not None
            p = longer if streaming else p
        out.append((job, p, streaming))
    return pl.DataFrame(out, schema=schema, orient="row"), warps


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
