"""Online change-point split of a flow sequence into training steps (LLMPrism IV-B step division).

The paper runs BOCD on inter-flow gaps with "P(r_t = 0) > 0.95". With a constant hazard that
posterior equals the hazard at every t, so the rule never fires (DESIGN.md); and the big gaps
between steps are isolated outliers, not regimes. What works here is an online two-level filter
on log gaps, a sequential 2-means with robust (clipped) updates:

* lo tracks the level of within-step gaps, hi the level of between-step gaps;
* gap t is a change point (a new step starts) when log(gap) lies above lo + 0.75 (hi - lo) and at
  least `min_ratio` times above lo;
* only the level the gap was assigned to moves, by alpha * clip(x - level, +-clip), so a single
  huge gap (job pause, missing flows) cannot drag a level away.

The levels start from the first `warmup` gaps (median, and second largest; a bounded lag, like BOCD's lagged P(r_{t+L})).
It is causal after the warm-up and runs vectorized across all sequences at once: the Python
loop is over the position inside a sequence (hundreds to a few thousands), never over rows."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SplitParams:
    min_ratio: float = 4.0  # a step gap is at least this many times the within-step gap
    alpha: float = 0.2  # learning rate of the two levels
    clip: float = 1.0  # max move of a level per update, in log units (robust to outliers)
    warmup: int = 128  # gaps used to initialise the two levels (a bounded lag)
    min_gap_ns: int = 1_000  # gaps below 1 us (overlapping channels) count as 1 us
    # a change point lies above lo + hi_weight * (hi - lo) in log space: closer to hi than the
    # midpoint, because gaps between buckets or collective phases form levels of their own below it
    hi_weight: float = 0.75
    one_flow_gap_ratio: float = 10.0  # flat sequences whose gaps are 10x their flows: a flow per step


def sequence_gaps(group: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Gap before each flow to the latest end of the earlier flows of the same group (flows of
    parallel channels overlap, so the previous flow's end alone is wrong). Rows must be sorted by
    (group, start). The first flow of a group gets NaN."""
    n = len(group)
    out = np.full(n, np.nan)
    if n == 0:
        return out
    first = np.ones(n, dtype=bool)
    first[1:] = group[1:] != group[:-1]
    # running max of end within each group: offset groups so a plain cumulative max works
    seg = np.cumsum(first) - 1
    end = end_ns.astype(np.float64)
    span = end.max() - min(end.min(), start_ns.min()) + 1.0
    run = np.maximum.accumulate(end + seg * span) - seg * span
    out[1:] = start_ns[1:].astype(np.float64) - run[:-1]
    out[first] = np.nan
    return out


def split_steps(group: np.ndarray, gaps: np.ndarray, params: SplitParams = SplitParams(),
                durations: np.ndarray | None = None) -> np.ndarray:
    """Boolean array, True where a flow starts a new step (the first flow of each group too).
    `group` sorted and contiguous; `gaps` from sequence_gaps (NaN at group starts).

    A sequence that never shows two gap levels but whose gaps dwarf its flows (one flow per step:
    a single bucket on one channel) is split at every flow, given `durations`."""
    n = len(group)
    if n == 0:
        return np.zeros(0, dtype=bool)
    first = np.ones(n, dtype=bool)
    first[1:] = group[1:] != group[:-1]
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, n))
    # a flow that starts before the earlier ones ended (parallel channels, concurrent buckets)
    # is inside a burst: no information about step boundaries, never a change point
    valid = ~first & (np.nan_to_num(gaps, nan=0.0) > params.min_gap_ns)
    x = np.log(np.maximum(np.nan_to_num(gaps, nan=params.min_gap_ns), params.min_gap_ns))
    lmin = np.log(params.min_ratio)
    vcs = np.cumsum(valid)
    vpos = vcs - np.repeat(vcs[starts] - valid[starts], lengths)  # 1-based rank among valid gaps

    # initial levels from the first `warmup` gaps of each group: lo = their median (most gaps are
    # inside a step), hi = the typical gap well above it (the warm-up spans step boundaries when
    # steps have fewer flows than the warm-up); gaps of several within-step levels (channels, buckets) then all
    # fall under the midpoint
    import polars as pl

    w = valid & (vpos <= params.warmup)
    gid_all = np.cumsum(first) - 1
    # hi = the second largest warm-up gap that clears lo by min_ratio: the warm-up spans several
    # steps, so this is a step gap, not a bucket or reduce-scatter/all-gather gap (several levels
    # lie below it), and not a one-off pause such as the job's start-up (the largest)
    lv = (pl.DataFrame({"g": gid_all[w], "x": x[w]}).with_columns(lo=pl.col("x").median().over("g"))
          .group_by("g").agg(lo=pl.col("lo").first(),
                             hi=pl.col("x").filter(pl.col("x") > pl.col("lo") + lmin).sort(descending=True)
                             .get(1, null_on_oob=True)))
    lv = lv.with_columns(pl.col("hi").fill_null(pl.col("lo")))
    lo = np.zeros(len(starts))
    hi = np.zeros(len(starts))
    gi = lv["g"].to_numpy()
    lo[gi] = lv["lo"].to_numpy()
    hi[gi] = lv["hi"].to_numpy()
    hi = np.where(hi - lo < lmin, lo, hi)  # levels closer than min_ratio: no step gap seen yet

    boundary = first.copy()
    ever = hi - lo >= lmin
    maxlen = int(lengths.max())
    for t in range(1, maxlen):
        act = np.flatnonzero(lengths > t)
        idx = starts[act] + t
        xt = x[idx]
        l, h = lo[act], hi[act]
        established = h - l >= lmin
        thr = l + np.maximum(lmin, np.where(established, params.hi_weight * (h - l), 0.0))
        v = valid[idx]
        b = v & (xt > thr)
        boundary[idx] = b
        c = params.clip
        # the level the gap belongs to follows it (hi jumps to the first step gap it sees)
        new_h = np.where(established, h + params.alpha * np.clip(xt - h, -c, c), xt)
        hi[act] = np.where(b, new_h, h)
        lo[act] = np.where(b | ~v, l, l + params.alpha * np.clip(xt - l, -c, c))
        ever[act] |= b
    if durations is not None:
        gid = np.cumsum(first) - 1
        flat_g = ~ever & (lengths >= 3)
        if flat_g.any():
            import polars as pl  # per-group medians, vectorized

            rows = flat_g[gid] & valid
            med = (pl.DataFrame({"g": gid[rows], "gap": gaps[rows], "dur": durations[rows]})
                   .group_by("g").agg(pl.col("gap").median(), pl.col("dur").median()))
            one = med.filter(pl.col("gap") > params.one_flow_gap_ratio * pl.col("dur").clip(lower_bound=1.0))["g"]
            if one.len():
                sel = np.zeros(len(starts), dtype=bool)
                sel[one.to_numpy()] = True
                boundary |= sel[gid] & valid
    return boundary


def step_index(group: np.ndarray, boundary: np.ndarray) -> np.ndarray:
    """0-based step number of each flow within its group."""
    first = np.ones(len(group), dtype=bool)
    first[1:] = group[1:] != group[:-1]
    cs = np.cumsum(boundary)
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, len(group)))
    return cs - np.repeat(cs[starts], lengths)
