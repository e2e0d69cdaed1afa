"""Steps by gradient volume: a step moves the same DP bytes every time.

A data-parallel step exchanges the model's gradients (or its ZeRO shards), whose size does not
change from step to step, however long the step takes. The gap-based split (period.py,
changepoint.py) looks at time alone, and a stall inside a slow DP phase (a congested link, a
retransmission timeout) can be the longest quiet time of a step: the step comes out in pieces that
each carry a fraction of the usual volume and together carry one. A boundary whose gap fell in the
middle of two steps' traffic leaves one segment with twice the volume.

Per address, the usual step volume is the median of its segments' DP bytes, where at least half
of its segments carry it (whole steps are the rule; else nothing is changed). Its interior segments
(the first and last may be cut by the data's edges) are regrouped: among all ways to join
consecutive segments, the one whose groups' volumes are closest to whole steps (least squared log
ratio, a dynamic program run for every address at once), a join allowed only where it comes nearer
a whole step than each segment it joins: pieces of a step are joined, a piece is never joined to a
whole step (a short step stays short), nor whole steps to each other. A segment carrying k volumes
(within the noise whole steps show) is split at the widest gaps where its cumulative bytes reach
each multiple."""
from __future__ import annotations

import numpy as np
import polars as pl
from numba import njit

from fleetscope.common import MAD_TO_SIGMA

MAX_PIECES = 6  # a step split into more pieces than this is left as it is


def balance_boundaries(gid: np.ndarray, gaps: np.ndarray, nbytes: np.ndarray, b: np.ndarray,
                       tol: float) -> np.ndarray:
    """gid: address per flow (sorted, contiguous), gaps (ns, NaN at a group start), nbytes, b:
    True where a flow starts a step (every group start included). Returns the boundaries with
    pieces of one step joined and double steps split. `tol`: the relative volume difference that is
    noise (a step whose volume is within it of k usual volumes counts as k)."""
    n = len(gid)
    if n == 0:
        return b
    seg = np.cumsum(b) - 1
    nseg = int(seg[-1]) + 1
    vol = np.bincount(seg, weights=nbytes.astype(np.float64), minlength=nseg)
    seg_start = np.flatnonzero(b)
    seg_gid = gid[seg_start]
    # segments per address, and each segment's position in its address
    first_seg = np.ones(nseg, dtype=bool)
    first_seg[1:] = seg_gid[1:] != seg_gid[:-1]
    last_seg = np.ones(nseg, dtype=bool)
    last_seg[:-1] = seg_gid[1:] != seg_gid[:-1]
    # the volume noise of whole steps (retransmitted bytes, a control message counted in): the
    # spread of the interior segments around their address's median, most of which are whole steps
    mid = ~first_seg & ~last_seg
    if mid.any():
        med = pl.DataFrame({"g": seg_gid[mid], "v": vol[mid]}).select(pl.col("v").median().over("g"))["v"].to_numpy()
        dev = np.abs(vol[mid] / np.where(med > 0, med, 1.0) - 1)
        tol = max(tol, 3 * MAD_TO_SIGMA * float(np.median(dev)))
    usual = _usual_volume(seg_gid, vol, first_seg | last_seg, tol)
    G = usual[seg_gid]
    u = np.where(G > 0, vol / np.where(G > 0, G, 1.0), np.nan)
    ok = np.isfinite(u) & (u > 0)
    b = b.copy()
    # -- join pieces: interior segments of addresses with a usual volume
    inner = ok & ~first_seg & ~last_seg
    keep_start = _join_pieces(seg_gid, u, inner)         # [nseg] False: the segment joins the one before
    b[seg_start[~keep_start]] = False
    # -- split double steps (recomputed on the joined segments)
    seg = np.cumsum(b) - 1
    nseg = int(seg[-1]) + 1
    vol = np.bincount(seg, weights=nbytes.astype(np.float64), minlength=nseg)
    seg_start = np.flatnonzero(b)
    Gs = usual[gid[seg_start]]
    k = np.where(Gs > 0, np.rint(vol / np.where(Gs > 0, Gs, 1.0)), 0).astype(np.int64)
    multi = (k >= 2) & (k <= MAX_PIECES) & (np.abs(vol - k * Gs) <= k * tol * Gs)
    if multi.any():
        b |= _split_points(seg, multi, nbytes, gaps, Gs, tol, n)
    return b


def _usual_volume(seg_gid: np.ndarray, vol: np.ndarray, edge: np.ndarray, tol: float) -> np.ndarray:
    """[n_addresses] the median volume of the interior segments, where most of them carry it (at
    least half within `tol` of it: whole steps are the rule); else 0 (no usual volume: the
    address's steps are left as the gaps split them)."""
    df = pl.DataFrame({"g": seg_gid, "v": vol}).filter(pl.Series(~edge) & (pl.col("v") > 0))
    n_g = int(seg_gid.max()) + 1 if len(seg_gid) else 0
    out = np.zeros(n_g)
    if df.height == 0:
        return out
    m = (df.with_columns(med=pl.col("v").median().over("g"))
         .group_by("g").agg(pl.col("med").first(), whole=((pl.col("v") / pl.col("med")).log().abs() <= tol).mean())
         .filter(pl.col("whole") >= 0.5))
    out[m["g"].to_numpy()] = m["med"].to_numpy()
    return out


def _join_pieces(seg_gid: np.ndarray, u: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """[nseg] True where a segment keeps its own start. Over each address's runs of consecutive
    interior segments, the grouping whose groups' volumes are closest to whole steps (least sum of
    log(volume / usual)^2), where a group of several segments must come nearer a whole step than
    each of its members (a piece is never joined to a whole step, nor two near-whole steps of a
    slow stretch to each other); at most MAX_PIECES segments a group. One compiled pass over the
    runs (a matrix of runs x the longest run grew with addresses x segments: 20 GB at 16,384 GPUs
    when one job's addresses showed thousands of segments)."""
    keep = np.ones(len(u), dtype=bool)
    idx = np.flatnonzero(inner)
    if len(idx) < 2:
        return keep
    # runs: consecutive interior segments of one address
    brk = np.ones(len(idx), dtype=bool)
    brk[1:] = (np.diff(idx) != 1) | (seg_gid[idx[1:]] != seg_gid[idx[:-1]])
    starts = np.flatnonzero(brk)
    lens = np.diff(np.append(starts, len(idx)))
    joined = _join_runs(u[idx].astype(np.float64), starts.astype(np.int64), lens.astype(np.int64), MAX_PIECES)
    keep[idx] = ~joined
    return keep


@njit(cache=True)
def _join_runs(u: np.ndarray, starts: np.ndarray, lens: np.ndarray, max_pieces: int) -> np.ndarray:
    """The dynamic program of _join_pieces per run of u (volumes over the usual one): True where a
    position joins the segment before it."""
    joined = np.zeros(len(u), np.bool_)
    for r in range(len(starts)):
        a, n = starts[r], lens[r]
        if n < 2:
            continue
        P = np.zeros(n + 1)
        for i in range(n):
            P[i + 1] = P[i] + u[a + i]
        best = np.full(n + 1, np.inf)
        best[0] = 0.0
        choice = np.ones(n + 1, np.int64)
        dev = np.empty(n)
        for i in range(n):
            dev[i] = abs(np.log(max(u[a + i], 1e-9)))
        for t in range(1, n + 1):
            closest = np.inf          # the member nearest a whole step, of the group t-k .. t-1
            for k in range(1, min(max_pieces, t) + 1):
                d = abs(np.log(max(P[t] - P[t - k], 1e-9)))
                closest = min(closest, dev[t - k])
                c = best[t - k] + d * d
                if k > 1 and not d < closest:   # a join must come nearer a whole step than any member
                    c = np.inf
                if c < best[t]:
                    best[t] = c
                    choice[t] = k
        # backtrack from the run's end: a group of k segments starting at t-k keeps its first start
        t = n
        while t > 0:
            k = choice[t]
            for j in range(1, k):
                joined[a + t - j] = True
            t -= k
    return joined


def _split_points(seg: np.ndarray, multi: np.ndarray, nbytes: np.ndarray, gaps: np.ndarray, Gs: np.ndarray,
                  tol: float, n: int) -> np.ndarray:
    """[n] new boundaries inside segments carrying k usual volumes: for each j < k, the flow with the
    widest gap before it among those whose segment bytes before them are within tol of j volumes."""
    rows = np.flatnonzero(multi[seg])
    s = seg[rows]
    before = pl.DataFrame({"s": s, "b": nbytes[rows].astype(np.float64)}).select(
        c=pl.col("b").cum_sum().over("s") - pl.col("b"))["c"].to_numpy()
    G = Gs[s]
    j = np.rint(before / G)
    cand = (j >= 1) & (np.abs(before - j * G) <= tol * G * np.maximum(j, 1)) & (np.nan_to_num(gaps[rows], nan=0.0) > 0)
    out = np.zeros(n, dtype=bool)
    if not cand.any():
        return out
    c = pl.DataFrame({"row": rows[cand], "s": s[cand], "j": j[cand], "gap": gaps[rows][cand]})
    pick = c.sort("gap", descending=True).group_by("s", "j").agg(pl.col("row").first())["row"].to_numpy()
    out[pick] = True
    return out


def partial_first(seg: pl.DataFrame, tol: float) -> pl.Series:
    """seg: one row per segment (ix, seg, vol: its boundary bytes). True on an address's first
    segment where it carries clearly less than the address's usual step volume (as
    balance_boundaries judges it: the interior segments' median, where at least half of them carry
    it, to within their own spread): a step cut by the data's start, or a job's setup (DDP's first
    parameter broadcast, the process groups' handshakes) before its first step. Neither is a step;
    its end still opens the next one."""
    s = seg.with_columns(first=pl.col("seg") == pl.col("seg").min().over("ix"),
                         last=pl.col("seg") == pl.col("seg").max().over("ix"))
    inner = s.filter(~pl.col("first") & ~pl.col("last") & (pl.col("vol") > 0)).with_columns(
        med=pl.col("vol").median().over("ix")).with_columns(dev=(pl.col("vol") / pl.col("med") - 1).abs())
    noise = pl.max_horizontal(pl.lit(tol), 3 * MAD_TO_SIGMA * pl.col("dev").median())
    usual = inner.group_by("ix").agg(med=pl.col("med").first(), tol=noise, whole=(pl.col("dev") <= noise).mean())
    usual = usual.filter(pl.col("whole") >= 0.5)
    out = s.join(usual, on="ix", how="left", maintain_order="left").select(
        pl.col("first") & (pl.col("vol") < (1 - pl.col("tol")) * pl.col("med")))
    return out.to_series().fill_null(False)
