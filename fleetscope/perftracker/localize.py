"""PerfTracker 4.3 localization over behaviour patterns, and the verdicts it raises.

- distance from expectation d_exp: Manhattan distance from p = (beta, mu, sigma) to what is
  expected of the function. Expectations are learned, not fixed: from the job's healthy history
  (earlier captures of the same job: per function and stage, beta above its usual value by more
  than k robust sigmas and the materiality floor), and from boxes per category only where a user
  configures them (`LocalizeConfig.expected`; none by default: the paper's production boxes, e.g.
  "Python functions beta <= 0.01", raise dozens of false alarms on a healthy real fleet, where a
  function that takes the same share on every rank of a stage is the job's shape).
- differential distance d_diff: patterns max-normalized within the peer group; d_diff(w) = the
  number of workers of a seeded random sample S (|S| = min(100, N)) whose normalized pattern
  differs from w's by more than theta = 0.4 (L1).
- abnormal: beta > 0.01 and (d_exp > 0 or d_diff > median + 5 MAD of the group). One guard the
  paper does not state: d_diff must also reach `min_diff_share` of |S| (w differs from most of
  its sample). Without it a tight healthy group (median = MAD = 0) flags any worker with a single
  differing peer. And materiality: a finding must matter to the step time. `impact` is the share of
  the window it costs (beta above the peers' median or the expectation, beta x the utilization
  lost against the peers', or all its beta when it runs on another resource than its peers, e.g. a
  collective fallen back from NVLink to PCIe); below `min_impact` it is not abnormal, unless the
  worker's findings of the same category add up to it (a slow link under every collective).

Peers are pipeline-stage aware: a worker is compared with the workers of its own stage (middle
stages legitimately send and receive more). Imbalance between whole stages is a separate check
(`stage_differential`, differential distance across stages): for compute functions each stage's median pattern is compared with the other
stages' by the same differential rule; a stage that stands out is a partitioning problem.

The differential distance is brute force over |S| in cache-sized chunks of float32 (one numpy
pass per sampled peer): 1,000,000 workers x 20 functions in seconds, see benchmarks/perftracker_scale.py.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from fleetscope.common import robust_sigma
from fleetscope.perftracker.schemas import BEHAVIOR_PATTERNS, CATEGORIES, DIMENSIONS, finish_patterns
from fleetscope.schemas.base import conform

CATEGORY_CODES = {c: i for i, c in enumerate(CATEGORIES)}
# PerfTracker's production boxes per category, for a user who wants them
# (LocalizeConfig(expected=PAPER_EXPECTED)); not applied by default (see the module docstring).
PAPER_EXPECTED: dict[str, dict[str, tuple[float, float]]] = {
    "python": {"beta": (0.0, 0.01)},
    "compute": {},
    "memory": {"beta": (0.0, 0.2)},
    "collective": {"beta": (0.0, 0.3)},
}
DEFAULT_EXPECTED: dict[str, dict[str, tuple[float, float]]] = {}
OP_LEVEL_EXPECTED = DEFAULT_EXPECTED  # (kept for callers: op-level timings expect nothing by default either)


@dataclass(frozen=True)
class LocalizeConfig:
    expected: dict = field(default_factory=dict)  # configured boxes {category: {dimension: (lo, hi)}} only
    theta: float = 0.4
    k_mad: float = 5.0
    sample_size: int = 100
    min_beta: float = 0.01
    min_diff_share: float = 0.5
    # a worker that differs from this share of its sampled peers is abnormal even when the peers
    # themselves are spread (several healthy sub-clusters inflate the MAD in small jobs)
    majority_share: float = 0.7
    stage_aware: bool = True
    # categories compared within their pipeline stage; GPU compute is compared across all workers
    # (stage partitioning is meant to balance compute, and a whole stage that stands out is
    # reported by stage_differential instead of worker by worker)
    stage_aware_categories: tuple = ("collective", "memory", "python")
    seed: int = 0
    chunk: int = 1 << 15  # rows per cache-sized block in the differential distance
    # floor of the max-normalization per dimension (beta, mu, sigma): a dimension whose largest
    # value in the group is tiny (sigma 0.02 vs 0.05) is not blown up to a 0.6 difference
    norm_floor: tuple = (0.01, 0.1, 0.1)
    # materiality: a finding must cost at least this share of the step (window) to be abnormal,
    # and this much to be critical
    min_impact: float = 0.05
    critical_impact: float = 0.10
    # expectations from the job's history: beta above its usual value (median over earlier captures)
    # by more than this many robust sigmas (and more than min_impact)
    history_k: float = 4.0
    # the straggling rank (fleetscope.perftracker.ranks): its own work (everything but communication)
    # exceeds its same-stage peers' by min_impact of its window and, with 3 or more peers, by rank_k
    # robust sigmas of theirs and rank_min_ratio; with 1 or 2 peers (no noise estimate: DP2 stages)
    # by rank_min_ratio_few_peers
    rank_min_ratio: float = 1.10
    rank_min_ratio_few_peers: float = 1.25
    rank_k: float = 5.0


class LocalizeError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# distances (numpy)


def differential_counts(xn, group_bounds: np.ndarray, theta: float, sample_size: int, seed: int,
                        chunk: int = 1 << 15) -> tuple[np.ndarray, np.ndarray]:
    """d_diff for rows sorted by group (group g = rows group_bounds[g]:group_bounds[g+1]) of
    normalized patterns xn (n x 3 float32, or a list of 3 arrays): per row, how many of the group's sampled peers lie
    farther than theta (L1). Returns (d_diff int64, |S| per row)."""
    n = len(xn[0]) if isinstance(xn, (list, tuple)) else xn.shape[0]
    out = np.zeros(n, np.int32)
    m_row = np.zeros(n, np.int32)
    rng = np.random.default_rng(seed)
    th = np.float32(theta)
    x0, x1, x2 = (np.ascontiguousarray(xn[k], dtype=np.float32) for k in range(3)) if isinstance(xn, (list, tuple)) else \
        (np.ascontiguousarray(xn[:, k]) for k in range(3))
    sizes = np.diff(group_bounds)
    small_groups = np.nonzero((sizes > 0) & (sizes <= sample_size))[0]
    # small groups: S is the whole group; all pairs at once, in blocks of ~4M pairs
    if small_groups.size:
        starts = group_bounds[small_groups]
        sz = sizes[small_groups]
        rows = np.repeat(starts, sz) + (np.arange(sz.sum()) - np.repeat(np.cumsum(sz) - sz, sz))
        row_sz = np.repeat(sz, sz)
        row_start = np.repeat(starts, sz)
        m_row[rows] = row_sz
        pos = 0
        while pos < rows.size:
            cum = np.cumsum(row_sz[pos:])
            take = max(1, int(np.searchsorted(cum, 4_000_000, side="right")))
            r = rows[pos:pos + take]
            k = row_sz[pos:pos + take]
            a = np.repeat(r, k)
            b = np.repeat(row_start[pos:pos + take], k) + (np.arange(k.sum()) - np.repeat(np.cumsum(k) - k, k))
            d = np.abs(x0[a] - x0[b]) + np.abs(x1[a] - x1[b]) + np.abs(x2[a] - x2[b])
            out[r] = np.add.reduceat((d > th).astype(np.int64), np.cumsum(k) - k)
            pos += take
    # large groups: one shared random sample; one vectorized pass per sampled peer per block
    buf = np.empty(chunk, np.float32)
    tmp = np.empty(chunk, np.float32)
    msk = np.empty(chunk, bool)
    for g in np.nonzero(sizes > sample_size)[0]:
        lo, hi = int(group_bounds[g]), int(group_bounds[g + 1])
        peers = lo + rng.choice(hi - lo, size=sample_size, replace=False)
        m_row[lo:hi] = sample_size
        sp = np.stack([x0[peers], x1[peers], x2[peers]], axis=1)
        for c0 in range(lo, hi, chunk):
            c1 = min(c0 + chunk, hi)
            L = c1 - c0
            a0, a1, a2 = x0[c0:c1], x1[c0:c1], x2[c0:c1]
            bb, tt, mm = buf[:L], tmp[:L], msk[:L]
            cnt = np.zeros(L, np.int32)
            for s0, s1, s2 in sp:
                np.subtract(a0, s0, out=bb); np.abs(bb, out=bb)
                np.subtract(a1, s1, out=tt); np.abs(tt, out=tt); bb += tt
                np.subtract(a2, s2, out=tt); np.abs(tt, out=tt); bb += tt
                np.greater(bb, th, out=mm); cnt += mm
            out[c0:c1] = cnt
    return out, m_row


def _group_median_mad(values: np.ndarray, gid: np.ndarray, n_groups: int, vmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD of small non-negative integers per group, by histograms (no sort)."""
    def median_from_hist(h: np.ndarray) -> np.ndarray:
        cnt = h.sum(1)
        cum = np.cumsum(h, axis=1)
        k1 = (cnt - 1) // 2
        k2 = cnt // 2
        v1 = (cum > k1[:, None]).argmax(1)
        v2 = (cum > k2[:, None]).argmax(1)
        return (v1 + v2) / 2.0

    w = vmax + 1
    gid = gid.astype(np.int64)
    values = values.astype(np.int64)
    h = np.bincount(gid * w + values, minlength=n_groups * w).reshape(n_groups, w)
    med = median_from_hist(h)
    dev2 = np.abs(2 * values - (2 * med[gid]).astype(np.int64))  # 2|x - med| is an integer
    h2 = np.bincount(gid * (2 * w) + dev2, minlength=n_groups * 2 * w).reshape(n_groups, 2 * w)
    mad = median_from_hist(h2) / 2.0
    return med, mad


# ---------------------------------------------------------------------------------------------
# localization


def history_expectations(history: pl.DataFrame | None, config: LocalizeConfig = LocalizeConfig()) -> pl.DataFrame:
    """behavior_patterns of a job's earlier captures -> (function, stage, expected_beta, expected_beta_hi,
    n_history): the usual beta of the function on that stage and the highest one expected. localize
    flags the workers above expected_beta_hi where the stage's median is above it too (a regression
    of the stage or job; one worker above its peers is the differential's and the rank check's). Per capture the stage's median beta
    (workers flagged abnormal left out, so a past incident does not become the norm), then over the
    captures: median + max(history_k robust sigmas, min_impact)."""
    schema = {"function": pl.Utf8, "stage": pl.Int32, "expected_beta": pl.Float64, "expected_beta_hi": pl.Float64, "n_history": pl.UInt32}
    if history is None or history.height == 0:
        return pl.DataFrame(schema=schema)
    h = history
    if "stage" not in h.columns:
        h = h.with_columns(stage=pl.lit(None, pl.Int32))
    if "abnormal" in h.columns:
        h = h.filter(~pl.col("abnormal").fill_null(False))
    per = h.group_by("capture_id", "function", "stage").agg(b=pl.col("beta").median())
    out = per.group_by("function", "stage").agg(m=pl.col("b").median(), s=robust_sigma(pl.col("b")), n_history=pl.len())
    hi = pl.col("m") + pl.max_horizontal(config.history_k * pl.col("s").fill_null(0.0), pl.lit(config.min_impact))
    return out.select("function", pl.col("stage").cast(pl.Int32), pl.col("m").alias("expected_beta"), hi.alias("expected_beta_hi"),
                      pl.col("n_history").cast(pl.UInt32))


def localize(patterns: pl.DataFrame, config: LocalizeConfig = LocalizeConfig(), validate: bool = True,
             history: pl.DataFrame | None = None) -> pl.DataFrame:
    """behavior_patterns -> the same rows with d_exp, d_diff, abnormal and the explanation columns
    (peer_stage, n_peers, d_diff_threshold, diff_dim, diff_delta, exp_dim, reason, impact,
    expected_source, expected_beta_hi) filled. history: behavior_patterns of the job's earlier
    captures (see history_expectations), the expectation learned from the job itself.

    Numpy (float32, one array per dimension) over the rows in (capture, function, stage) order;
    the frame itself is never re-sorted (results are scattered back). validate=False skips the
    pandera validation of the output (the writer validates anyway; at 20 million rows it costs
    as much as the localization)."""
    need = ["capture_id", "rank", "function", "category", "beta", "mu", "sigma"]
    missing = [c for c in need if c not in patterns.columns]
    if missing:
        raise LocalizeError(f"behavior patterns lack column(s) {missing}")
    if patterns.height == 0:
        return finish_patterns(patterns)
    bad_beta = pl.col("beta").is_null() | ~pl.col("beta").is_between(0.0, 1.0)
    if patterns.select(bad_beta.any()).item():
        bad = patterns.select("rank", "function", "beta").filter(bad_beta)
        raise LocalizeError(f"{bad.height} pattern rows have beta outside [0, 1] or null (e.g. rank {bad['rank'][0]}, {bad['function'][0]!r})")
    unknown = set(patterns["category"].unique().cast(pl.Utf8).to_list()) - set(CATEGORY_CODES)
    if unknown:
        raise LocalizeError(f"unknown function categories {sorted(unknown)}; expected {list(CATEGORY_CODES)}")
    df = patterns
    if "stage" not in df.columns:
        df = df.with_columns(stage=pl.lit(None, dtype=pl.Int32))
    hist = history_expectations(history, config)
    if hist.height:
        df = df.drop([c for c in ("expected_beta", "expected_beta_hi", "n_history") if c in df.columns]).join(
            hist, on=["function", "stage"], how="left", nulls_equal=True, maintain_order="left")
        hist_hi = df["expected_beta_hi"].cast(pl.Float32).fill_null(float("nan")).to_numpy()
        hist_m = df["expected_beta"].cast(pl.Float32).fill_null(float("nan")).to_numpy()
        # the stage as a whole must be above its history: one worker above it is for the peers to judge
        hist_stage = df.select(pl.col("beta").median().over("capture_id", "function", "stage")).to_series().cast(pl.Float32).to_numpy()
        df = df.drop("n_history", "expected_beta")
    else:
        hist_hi = None
    cat_code = pl.col("category").cast(pl.Utf8).cast(pl.Enum(CATEGORIES)).to_physical().cast(pl.Int8)
    staged_codes = [CATEGORY_CODES[c] for c in config.stage_aware_categories if c in CATEGORY_CODES]
    # group = (capture, function, stage if the category is compared within its stage): a 64-bit
    # hash of the strings (no per-row string copies), then one argsort by (group, rank)
    keys = df.select(
        _h=pl.struct(pl.col("capture_id"), pl.col("function")).hash(seed=7),
        _cat=cat_code,
        rank=pl.col("rank"),
        _src=(pl.col("mu_source").cast(pl.Utf8) == "hw_alg1").fill_null(False) if "mu_source" in df.columns else pl.lit(False),
        _stage=pl.col("stage").cast(pl.Int32),
    ).with_columns(_staged=pl.col("_cat").is_in(staged_codes) & pl.lit(config.stage_aware))
    keys = keys.with_columns(_st=pl.when("_staged").then(pl.col("_stage").cast(pl.Int64).fill_null(-1)).otherwise(-2))
    # measured on another resource than most of its peer group (a collective over PCIe while its
    # peers use NVLink: a link fallback): utilizations do not compare, the function's time is at stake
    if "resource" in df.columns:
        odd = df.select((pl.col("resource") != pl.col("resource").drop_nulls().mode().sort().first().over(
            pl.col("capture_id"), pl.col("function"), keys["_st"])).fill_null(False)).to_series().to_numpy()
    else:
        odd = np.zeros(df.height, bool)
    # group code = (index of the hash among the few distinct ones, stage); a stable radix sort on
    # it (16-bit codes) keeps each group's rows in frame order, so the sampling is deterministic
    h = keys["_h"].to_numpy()
    uh = np.sort(keys["_h"].unique().to_numpy())
    st = keys["_st"].to_numpy()
    st_min = int(st.min())
    n_st = int(st.max()) - st_min + 1
    graw = np.searchsorted(uh, h).astype(np.int64) * n_st + (st - st_min)
    del h, st
    perm = np.argsort(graw.astype(np.uint16) if graw.max() < 65536 else graw, kind="stable")
    graw = graw[perm]
    n = graw.size
    change = np.empty(n, bool)
    change[0] = True
    change[1:] = graw[1:] != graw[:-1]
    del graw
    gid = (np.cumsum(change) - 1).astype(np.int32)
    bounds = np.concatenate([np.nonzero(change)[0], [n]])
    del change
    n_groups = bounds.size - 1
    cat = keys["_cat"].to_numpy()[perm]
    waiting = (cat == CATEGORY_CODES["collective"]) & ~keys["_src"].to_numpy()[perm]
    X = [df[c].cast(pl.Float32).fill_null(float("nan")).to_numpy()[perm] for c in DIMENSIONS]

    # distance from expectation: per dimension, the configured boxes looked up by category code
    # (a dimension nobody configured is [0, 1]: never out), then beta above the job's history
    d_exp = np.zeros(n, np.float32)
    exp_best = np.zeros(n, np.float32)
    exp_code = np.full(n, -1, np.int8)
    exp_impact = np.zeros(n, np.float32)
    exp_src = np.zeros(n, np.int8)  # 0 none, 1 config, 2 history
    for k, dim in enumerate(DIMENSIONS):
        lo_t = np.array([config.expected.get(c, {}).get(dim, (0.0, 1.0))[0] for c in CATEGORIES], np.float32)
        hi_t = np.array([config.expected.get(c, {}).get(dim, (0.0, 1.0))[1] for c in CATEGORIES], np.float32)
        dk = np.maximum(np.maximum(lo_t[cat] - X[k], X[k] - hi_t[cat]), np.float32(0))
        dk[np.isnan(dk)] = 0
        d_exp += dk
        better = dk > exp_best
        exp_code[better] = k
        exp_best = np.maximum(exp_best, dk)
        if k == 0:  # the time above the box
            exp_impact = np.maximum(exp_impact, np.nan_to_num(X[0] - hi_t[cat]))
        elif k == 1:  # the time lost running below the expected utilization
            lo_c = lo_t[cat]
            with np.errstate(invalid="ignore", divide="ignore"):
                lost = np.where(lo_c > 0, X[0] * (lo_c - X[1]) / lo_c, 0)
            exp_impact = np.maximum(exp_impact, np.nan_to_num(lost))
    exp_src[d_exp > 0] = 1
    if hist_hi is not None:
        hh = hist_hi[perm]
        dh = np.where(hist_stage[perm] > hh, np.nan_to_num(np.maximum(X[0] - hh, np.float32(0))), np.float32(0))
        d_exp += dh
        exp_code[dh > exp_best] = 0
        # what it costs: the time above its usual share
        exp_impact = np.maximum(exp_impact, np.where(dh > 0, np.nan_to_num(X[0] - hist_m[perm]), 0))
        exp_src[dh > 0] = 2
    del exp_best

    # max-normalization within the peer group (with floors); unknown dimensions count as 0
    scale, XN = [], []
    for k in range(3):
        x0 = np.where(np.isnan(X[k]), np.float32(0), X[k])
        sk = np.maximum(np.maximum.reduceat(x0, bounds[:-1]), np.float32(config.norm_floor[k]))
        scale.append(sk)
        XN.append(x0 / sk[gid])
    d_diff, m_row = differential_counts(XN, bounds, config.theta, config.sample_size, config.seed, config.chunk)
    del XN
    med, mad = _group_median_mad(d_diff, gid, n_groups, int(config.sample_size))
    thr = med + config.k_mad * mad
    diff_flag = ((d_diff > thr[gid]) | (d_diff >= config.majority_share * m_row)) & (d_diff >= config.min_diff_share * m_row) & (m_row >= 3)
    # a worker whose function runs on another resource than most of its peers' differs whatever the
    # distance (PerfTracker saw the NVLink-down workers by their PCIe traffic)
    diff_flag |= odd[perm] & (m_row >= 3)

    # how it differs: the normalized dimension farthest from the group's median (raw delta kept)
    DELTA, DN = [], []
    for k in range(3):
        # rows are contiguous per group: a median per slice (groups are functions x stages: few)
        with warnings.catch_warnings():  # all-NaN groups (mu of Python functions) give NaN: fine
            warnings.simplefilter("ignore", RuntimeWarning)
            gm = np.array([np.nanmedian(X[k][bounds[g]:bounds[g + 1]]) for g in range(n_groups)], np.float32)
        mk = gm[gid]
        dk = X[k] - mk
        dk[np.isnan(dk)] = 0
        DELTA.append(dk)
        DN.append(np.abs(dk) / scale[k][gid])
    dn0, dn1, dn2 = DN
    del DN
    kdim = np.where(dn1 > dn0, 1, 0).astype(np.int8)
    kdim = np.where(dn2 > np.maximum(dn0, dn1), 2, kdim).astype(np.int8)
    # a collective's beta includes waiting for slower peers unless Algorithm 1 refined it: when its
    # utilization also differs materially, that is how it differs (the waiting is the symptom).
    # (waiting also lowers the mean link utilization a little, so a collective's mu must differ by a
    # full theta; other functions report beta or mu once they differ by 0.75 theta)
    material = 0.75 * config.theta
    kdim = np.where(waiting & (dn1 >= config.theta), 1, np.where(waiting & (kdim == 0) & (dn2 >= config.theta), 2, kdim))
    # otherwise a material difference in beta or mu is the finding, rather than the spread (sigma)
    primary = np.where(dn1 > dn0, 1, 0)
    kdim = np.where(~waiting & (np.maximum(dn0, dn1) >= material), primary, kdim).astype(np.int8)
    # a finding is material when its reported dimension is beta or mu and differs by at least
    # 0.75 theta (a full theta for a waiting collective's mu); else the verdict stays info
    chosen = np.where(kdim == 0, dn0, np.where(kdim == 1, dn1, dn2))
    need = np.where(waiting & (kdim == 1), np.float32(config.theta), np.float32(material))
    diff_material = (kdim != 2) & (chosen >= need)
    del dn0, dn1, dn2, primary, chosen, need
    diff_delta = np.choose(kdim, DELTA)
    DELTA_BETA, DELTA_MU = DELTA[0], DELTA[1]
    del DELTA

    # materiality: the share of the window a finding costs. Against the peers: beta above their
    # median, or the time lost running below their utilization (beta x utilization gap / theirs)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu_ref = X[1] - DELTA_MU
        lost = np.where(mu_ref > 0, X[0] * np.maximum(-DELTA_MU, 0) / mu_ref, 0)
    diff_impact = np.maximum(np.nan_to_num(DELTA_BETA), np.nan_to_num(lost))
    diff_impact = np.where(odd[perm], np.maximum(diff_impact, np.nan_to_num(X[0])), diff_impact).astype(np.float32)
    del DELTA_BETA, DELTA_MU, mu_ref, lost
    exp_flag = d_exp > 0
    impact = np.maximum(np.where(exp_flag, exp_impact, 0), np.where(diff_flag, diff_impact, 0)).astype(np.float32)
    flag = (X[0] > config.min_beta) & (exp_flag | diff_flag)
    abnormal = flag & (impact >= np.float32(config.min_impact))
    # a worker whose functions of one category each cost a little but together matter (a slow link
    # under every collective, a throttled GPU under every kernel): material together
    idx = np.flatnonzero(flag & ~abnormal)
    if idx.size:
        both = np.flatnonzero(flag)
        rows = perm[both]
        sub = df.select("capture_id", "rank").with_row_index("_r").filter(pl.col("_r").is_in(pl.Series(rows, dtype=pl.UInt32).implode()))
        sub = pl.DataFrame({"_r": rows.astype(np.uint32), "_i": both, "_cat": cat[both], "_imp": impact[both]}).join(sub, on="_r")
        tot = sub.with_columns(_tot=pl.col("_imp").sum().over("capture_id", "rank", "_cat")).filter(pl.col("_tot") >= config.min_impact)
        abnormal[tot["_i"].to_numpy()] = True
    reason = np.where(exp_flag & diff_flag, 3, np.where(exp_flag, 1, np.where(diff_flag, 2, 0))).astype(np.int8)

    def back(a: np.ndarray) -> np.ndarray:  # sorted order -> the frame's row order
        out = np.empty_like(a)
        out[perm] = a
        return out

    def labels(codes: np.ndarray, names: list[str]) -> pl.Series:  # small int codes -> strings (-1/0 null as asked)
        idx = pl.Series(np.clip(codes, 0, None).astype(np.uint32))
        lab = pl.Series(names, dtype=pl.Utf8).gather(idx)
        return pl.select(pl.when(pl.Series(codes >= 0)).then(lab)).to_series()

    out = df.with_columns(
        d_exp=pl.Series(back(d_exp)).cast(pl.Float64),
        d_diff=pl.Series(back(d_diff), dtype=pl.Int64),
        n_peers=pl.Series(back(m_row), dtype=pl.Int64),
        d_diff_threshold=pl.Series(back(thr[gid]), dtype=pl.Float64),
        abnormal=pl.Series(back(abnormal), dtype=pl.Boolean),
        diff_dim=labels(back(kdim), DIMENSIONS),
        diff_delta=pl.Series(back(diff_delta)).cast(pl.Float64),
        diff_material=pl.Series(back(diff_material), dtype=pl.Boolean),
        exp_dim=labels(back(exp_code), DIMENSIONS),
        reason=labels(back(reason) - 1, ["expectation", "differential", "both"]),
        peer_stage=pl.when(keys["_staged"]).then(keys["_stage"]),
        impact=pl.Series(back(impact)).cast(pl.Float64),
        expected_source=labels(back(exp_src) - 1, ["config", "history"]),
        expected_beta_hi=(pl.Series(hist_hi).cast(pl.Float64).fill_nan(None) if hist_hi is not None else pl.lit(None, pl.Float64)),
    )
    # workers of a stage that stands out as a whole are explained by the stage (one stage verdict)
    stages = stage_differential(out, config)
    if stages.height:
        out = out.join(stages.select("capture_id", "function", "stage", _st_flag=pl.lit(True)), on=["capture_id", "function", "stage"],
                       how="left", maintain_order="left").with_columns(
            abnormal=pl.when(pl.col("_st_flag").fill_null(False) & (pl.col("reason") == "differential")).then(False).otherwise(pl.col("abnormal")),
            reason=pl.when(pl.col("_st_flag").fill_null(False)).then(pl.lit("stage_imbalance")).otherwise(pl.col("reason")),
        ).drop("_st_flag")
    return finish_patterns(out) if validate else conform(out, BEHAVIOR_PATTERNS)


def stage_differential(patterns: pl.DataFrame, config: LocalizeConfig = LocalizeConfig()) -> pl.DataFrame:
    """Compute functions whose whole pipeline stage differs from the other stages: per (capture,
    function, stage) the median pattern; stages compared with each other by the differential rule
    (normalize by the max over stages, count the other stages farther than theta, flag above
    median + k MAD and at least min_diff_share of them) and only when the stage holds the
    critical path longer than the others (beta above their median by min_impact or more).
    Returns (capture_id, function, stage, beta, beta_others, d_diff, n_stages, ranks)."""
    schema = {"capture_id": pl.Utf8, "function": pl.Utf8, "stage": pl.Int32, "beta": pl.Float64, "beta_others": pl.Float64,
              "d_diff": pl.Int64, "n_stages": pl.Int64, "ranks": pl.List(pl.Int32)}
    if "stage" not in patterns.columns or patterns["stage"].null_count() == patterns.height:
        return pl.DataFrame(schema=schema)
    s = (patterns.select("capture_id", "function", "stage", "category", *DIMENSIONS)
         .filter((pl.col("category") == "compute") & pl.col("stage").is_not_null())
         .group_by("capture_id", "function", "stage")
         .agg(*[pl.col(c).median() for c in DIMENSIONS]))
    s = s.with_columns(n_stages=pl.len().over("capture_id", "function")).filter(pl.col("n_stages") >= 3)
    if s.height == 0:
        return pl.DataFrame(schema=schema)
    s = s.with_columns(*[(pl.col(c).fill_null(0.0) / pl.col(c).fill_null(0.0).max().over("capture_id", "function")).fill_nan(0.0).fill_null(0.0).alias(f"_n{c}")
                         for c in DIMENSIONS])
    pairs = s.join(s.select("capture_id", "function", pl.col("stage").alias("o_stage"), *[pl.col(f"_n{c}").alias(f"_o{c}") for c in DIMENSIONS],
                            pl.col("beta").alias("o_beta")), on=["capture_id", "function"]).filter(pl.col("stage") != pl.col("o_stage"))
    pairs = pairs.with_columns(dist=pl.sum_horizontal(*[(pl.col(f"_n{c}") - pl.col(f"_o{c}")).abs() for c in DIMENSIONS]))
    per = pairs.group_by("capture_id", "function", "stage").agg(
        d_diff=(pl.col("dist") > config.theta).sum().cast(pl.Int64), beta_others=pl.col("o_beta").median(),
        beta=pl.col("beta").first(), n_stages=pl.col("n_stages").first(),
    )
    per = per.with_columns(
        _med=pl.col("d_diff").median().over("capture_id", "function"),
    ).with_columns(_mad=(pl.col("d_diff") - pl.col("_med")).abs().median().over("capture_id", "function"))
    flagged = per.filter(
        (pl.col("d_diff") > pl.col("_med") + config.k_mad * pl.col("_mad"))
        & (pl.col("d_diff") >= config.min_diff_share * (pl.col("n_stages") - 1))
        & (pl.col("beta") > pl.col("beta_others")) & (pl.col("beta") > config.min_beta)
        & (pl.col("beta") - pl.col("beta_others") >= config.min_impact)  # it must matter to the step
    )
    if flagged.height == 0:
        return pl.DataFrame(schema=schema)
    # the ranks of the flagged stages only (a list per stage of a million-worker job is costly)
    ranks = (patterns.select("capture_id", "function", "stage", "rank").join(flagged.select("capture_id", "function", "stage"), on=["capture_id", "function", "stage"], how="semi")
             .group_by("capture_id", "function", "stage").agg(ranks=pl.col("rank").unique().sort()))
    flagged = flagged.join(ranks, on=["capture_id", "function", "stage"], how="left")
    return flagged.select(list(schema)).cast({"stage": pl.Int32, "ranks": pl.List(pl.Int32)}).sort("capture_id", "function", "stage")
