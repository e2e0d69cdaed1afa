"""Step periods of jobs and the periodic step split of each GPU address's flow sequence.

A two-level gap filter (changepoint.py) splits a sequence where gaps jump far above the typical
gap. That breaks on fast jobs (a step's compute gap barely exceeds the gaps between its buckets),
on jobs whose DP traffic spreads over the backward pass (DDP buckets), and on pauses that look like
steps. Every step of a job repeats with one period, though, and the job's many addresses and flows
estimate it well:

1. job_periods: per job, the autocorrelation of its boundary flows' start times (binned, FFT) peaks
   at the step period; the smallest lag whose autocorrelation is close to the peak's is taken, so a
   multiple of the period (every other step alike) is never chosen over the period itself.
2. periodic_boundaries: per address, a gap starts a step when it is the largest gap within half a
   period on either side of it, and clearly above the address's typical gap: one boundary per
   period wherever the step's longest quiet time falls, robust to jitter and to single long steps
   (a stall leaves one long gap, still one boundary).
"""
from __future__ import annotations

import numpy as np
import polars as pl

UNIT = 1_000_000  # a period in normalized time units


def autocorr_period(t: np.ndarray, min_lag_ns: int, bin_ns: int | None = None, near: float = 0.85,
                    smooth_bins: int = 4) -> float | None:
    """Step period (ns) of an event train (start times), or None when it shows no repetition."""
    if len(t) < 8:
        return None
    t0, t1 = int(t.min()), int(t.max())
    span = t1 - t0
    if span <= 4 * min_lag_ns:
        return None
    b = bin_ns or max(min_lag_ns // 8, span // (1 << 15), 1)
    x = np.bincount(((t - t0) // b).astype(np.int64)).astype(np.float64)
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
    best = pk[np.argmax(seg[pk])]
    top = seg[best]
    if top < 0.2 * len(k):
        return None
    # the smallest lag nearly as self-similar as the best one (the period, not a multiple of it)
    first = pk[seg[pk] >= near * top][0]
    lag = first + lo
    # refine to sub-bin precision with a parabola through the peak
    if 1 <= lag < len(ac) - 1:
        y0, y1, y2 = ac[lag - 1], ac[lag], ac[lag + 1]
        den = y0 - 2 * y1 + y2
        off = 0.5 * (y0 - y2) / den if den < 0 else 0.0
    else:
        off = 0.0
    return float((lag + off) * b)


def job_periods(bnd: pl.DataFrame, min_lag_ns: int, max_ips: int = 32) -> pl.DataFrame:
    """bnd: boundary flows (job_id, ix, start_ns). Per job its step period (period_ns, null when no
    repetition shows). A job's first max_ips addresses are enough: they all step together."""
    if bnd.height == 0:
        return pl.DataFrame(schema={"job_id": pl.Utf8, "period_ns": pl.Float64})
    sub = bnd.select("job_id", "ix", "start_ns").with_columns(
        r=pl.col("ix").rank("dense").over("job_id")).filter(pl.col("r") <= max_ips)
    out = []
    for (job,), g in sub.group_by(["job_id"]):
        out.append((job, autocorr_period(g["start_ns"].to_numpy(), min_lag_ns)))
    return pl.DataFrame(out, schema={"job_id": pl.Utf8, "period_ns": pl.Float64}, orient="row")


def periodic_boundaries(seq: pl.DataFrame, min_ratio: float, half: float = 0.45) -> pl.Series:
    """seq: rows sorted by (ix, start_ns) with gap (ns, null at a group's first row), period_ns
    (the job's, null: unknown) and ix. True where a flow starts a new step."""
    x = seq.select("ix", "start_ns", "gap", "period_ns").with_row_index("_i").with_columns(
        u=((pl.col("start_ns") - pl.col("start_ns").min()).cast(pl.Float64) * (UNIT / pl.col("period_ns"))).cast(pl.Int64),
        g=pl.col("gap").fill_null(-1.0).fill_nan(-1.0),
    )
    w = f"{int(half * UNIT)}i"
    known = x.filter(pl.col("period_ns").is_not_null())
    fwd = known.with_columns(bmax=pl.col("g").rolling_max_by("u", window_size=w).over("ix"))
    rev = known.with_columns(ur=-pl.col("u")).sort("ix", "ur").with_columns(
        fmax=pl.col("g").rolling_max_by("ur", window_size=w).over("ix")).select("_i", "fmax")
    k = fwd.join(rev, on="_i")
    # the address's typical gap: boundaries stand well above it (a lone flow inside a long pause
    # is not a step); its typical boundary gap: a boundary is at least a fair share of it
    k = k.with_columns(med=pl.col("g").filter(pl.col("g") > 0).median().over("ix"))
    k = k.with_columns(cand=(pl.col("g") >= pl.col("bmax")) & (pl.col("g") >= pl.col("fmax"))
                       & (pl.col("g") > min_ratio * pl.col("med")))
    k = k.with_columns(typ=pl.col("g").filter("cand").median().over("ix"))
    k = k.with_columns(b=pl.col("cand") & (pl.col("g") >= 0.25 * pl.col("typ")))
    out = x.select("_i").join(k.select("_i", "b"), on="_i", how="left").sort("_i")["b"].fill_null(False)
    return out
