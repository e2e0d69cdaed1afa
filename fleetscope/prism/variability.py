"""Latency variability models (PRISM section II/III): per capture and operation, how an op's
duration varies across iterations on one rank (temporal) and between ranks (spatial).

Each distribution is fitted with several families (normal, lognormal, gamma, a two-component
lognormal mixture whose second component is a rare slow mode, and the empirical distribution);
every fit is kept as a row with its goodness of fit, and the family that fits is flagged
``selected``: the lowest AIC among parametric fits that a KS test does not reject (p >= 0.01),
else the empirical distribution. PRISM itself assumes Gaussians; real op latencies are skewed
and often bimodal (a waiting or throttled mode), which is why the choice is made per op.

Temporal values are ratios to the slot's typical duration (its median over steps on that
rank), so ops of different size pool into one dimensionless model; spatial values are each
rank's typical duration in ns."""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import numpy as np
import polars as pl
from scipy import stats

from fleetscope.prism.structure import JobGraph

FAMILIES = ("normal", "lognormal", "gamma", "mixture", "empirical")
_MAX_FIT = 20_000  # fit on at most this many values (subsampled deterministically)
# NVML clocks-event reasons that mean the GPU was slowed (not idle / app clocks)
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
THROTTLE_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}


@dataclass
class Dist:
    family: str
    params: dict
    data: np.ndarray | None = None  # sorted values, for the empirical family

    def sample(self, rng: np.random.Generator, size) -> np.ndarray:
        p, f = self.params, self.family
        if f == "constant":
            return np.full(size, p["value"])
        if f == "normal":
            return np.maximum(rng.normal(p["mu"], p["sigma"], size), 0.0)
        if f == "lognormal":
            return np.exp(rng.normal(p["mu"], p["sigma"], size))
        if f == "gamma":
            return rng.gamma(p["shape"], p["scale"], size)
        if f == "mixture":
            slow = rng.random(size) < p["w_slow"]
            z = rng.standard_normal(size)
            return np.exp(np.where(slow, p["mu_slow"] + p["sigma_slow"] * z, p["mu"] + p["sigma"] * z))
        if f == "empirical":
            return self.data[rng.integers(0, len(self.data), size)]
        raise ValueError(f"unknown family {f}")

    def cdf(self, x: np.ndarray) -> np.ndarray:
        p, f = self.params, self.family
        x = np.asarray(x, dtype=float)
        if f == "constant":
            return (x >= p["value"]).astype(float)
        if f == "normal":
            return stats.norm.cdf(x, p["mu"], p["sigma"])
        if f == "lognormal":
            return stats.lognorm.cdf(x, p["sigma"], scale=np.exp(p["mu"]))
        if f == "gamma":
            return stats.gamma.cdf(x, p["shape"], scale=p["scale"])
        if f == "mixture":
            return ((1 - p["w_slow"]) * stats.lognorm.cdf(x, p["sigma"], scale=np.exp(p["mu"]))
                    + p["w_slow"] * stats.lognorm.cdf(x, p["sigma_slow"], scale=np.exp(p["mu_slow"])))
        if f == "empirical":
            return np.searchsorted(self.data, x, side="right") / len(self.data)
        raise ValueError(f"unknown family {f}")

    def ppf(self, q: np.ndarray) -> np.ndarray:
        p, f = self.params, self.family
        q = np.asarray(q, dtype=float)
        if f == "constant":
            return np.full(q.shape, p["value"])
        if f == "normal":
            return np.maximum(stats.norm.ppf(q, p["mu"], p["sigma"]), 0.0)
        if f == "lognormal":
            return stats.lognorm.ppf(q, p["sigma"], scale=np.exp(p["mu"]))
        if f == "gamma":
            return stats.gamma.ppf(q, p["shape"], scale=p["scale"])
        if f == "empirical":
            return np.quantile(self.data, np.clip(q, 0, 1))
        # mixture: invert numerically on a grid
        lo, hi = np.exp(min(p["mu"], p["mu_slow"]) - 8 * max(p["sigma"], p["sigma_slow"])), np.exp(max(p["mu"], p["mu_slow"]) + 8 * max(p["sigma"], p["sigma_slow"]))
        grid = np.geomspace(lo, hi, 4096)
        return np.interp(q, self.cdf(grid), grid)

    def mean(self) -> float:
        p, f = self.params, self.family
        return {"constant": lambda: p["value"], "normal": lambda: p["mu"],
                "lognormal": lambda: np.exp(p["mu"] + p["sigma"] ** 2 / 2),
                "gamma": lambda: p["shape"] * p["scale"],
                "mixture": lambda: (1 - p["w_slow"]) * np.exp(p["mu"] + p["sigma"] ** 2 / 2) + p["w_slow"] * np.exp(p["mu_slow"] + p["sigma_slow"] ** 2 / 2),
                "empirical": lambda: float(self.data.mean())}[f]()


def _fit_mixture(x: np.ndarray, iters: int = 60):
    """Two-component Gaussian mixture on log durations by EM, the second component being the
    slower one; returns (params, loglik) in the duration domain or None when it collapses."""
    y = np.log(x)
    thr = np.quantile(y, 0.9)
    mu1, mu2 = np.median(y[y <= thr]), np.median(y[y > thr]) if (y > thr).any() else y.max()
    s = max(np.std(y), 1e-6)
    s1 = s2 = s
    w = 0.1
    def pdf(v, m, sd):
        return np.exp(-0.5 * ((v - m) / sd) ** 2) / (sd * 2.5066282746310002)
    for _ in range(iters):
        l1 = (1 - w) * pdf(y, mu1, s1)
        l2 = w * pdf(y, mu2, s2)
        tot = l1 + l2 + 1e-300
        r2 = l2 / tot
        w = float(np.clip(r2.mean(), 1e-4, 0.5))
        n2 = r2.sum()
        n1 = len(y) - n2
        if n2 < 2 or n1 < 2:
            return None
        mu1, mu2 = (np.sum((1 - r2) * y) / n1, np.sum(r2 * y) / n2)
        s1 = max(np.sqrt(np.sum((1 - r2) * (y - mu1) ** 2) / n1), 1e-6)
        s2 = max(np.sqrt(np.sum(r2 * (y - mu2) ** 2) / n2), 1e-6)
    if mu2 < mu1:  # keep the slow component second
        mu1, mu2, s1, s2, w = mu2, mu1, s2, s1, 1 - w
    if w > 0.5:
        return None
    ll = np.sum(np.log((1 - w) * pdf(y, mu1, s1) + w * pdf(y, mu2, s2) + 1e-300) - y)
    return {"mu": float(mu1), "sigma": float(s1), "mu_slow": float(mu2), "sigma_slow": float(s2), "w_slow": float(w)}, float(ll)


def fit_families(x: np.ndarray) -> list[tuple[Dist, float, float, float]]:
    """Fit every applicable family to the values x -> [(dist, ks_stat, ks_pvalue, aic)], the
    empirical fit last (its KS is 0 by construction and it has no AIC)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        raise ValueError("no values to fit")
    xs = np.sort(x)
    if len(x) > _MAX_FIT:
        x = xs[np.linspace(0, len(xs) - 1, _MAX_FIT).astype(int)]
    out = []
    if np.ptp(x) <= 1e-12 * max(abs(x).max(), 1e-300):
        return [(Dist("constant", {"value": float(x[0])}), 0.0, 1.0, float("nan"))]
    cands = []
    mu, sd = float(x.mean()), float(x.std(ddof=1))
    cands.append((Dist("normal", {"mu": mu, "sigma": sd}), np.sum(stats.norm.logpdf(x, mu, sd)), 2))
    if (x > 0).all():
        ly = np.log(x)
        lm, ls = float(ly.mean()), float(max(ly.std(), 1e-9))
        cands.append((Dist("lognormal", {"mu": lm, "sigma": ls}), np.sum(stats.lognorm.logpdf(x, ls, scale=np.exp(lm))), 2))
        # gamma MLE in closed form (Minka's approximation; no optimizer: fast on many kernels)
        sg = float(np.log(x.mean()) - ly.mean())
        if sg > 0:
            a = (3 - sg + np.sqrt((sg - 3) ** 2 + 24 * sg)) / (12 * sg)
            sc = float(x.mean() / a)
            cands.append((Dist("gamma", {"shape": float(a), "scale": sc}), np.sum(stats.gamma.logpdf(x, a, scale=sc)), 2))
        if len(x) >= 20:
            m = _fit_mixture(x)
            if m is not None:
                cands.append((Dist("mixture", m[0]), m[1], 5))
    xs_fit = np.sort(x)
    n = len(xs_fit)
    for d, ll, k in cands:
        if not np.isfinite(ll):
            continue
        c = d.cdf(xs_fit)
        ks = float(max((np.arange(1, n + 1) / n - c).max(), (c - np.arange(n) / n).max()))
        # asymptotic Kolmogorov p-value (Stephens' small-sample correction): fast on many kernels
        pv = float(stats.kstwobign.sf(ks * (np.sqrt(n) + 0.12 + 0.11 / np.sqrt(n))))
        out.append((d, ks, min(max(pv, 0.0), 1.0), float(2 * k - 2 * ll)))
    out.append((Dist("empirical", {}, xs), 0.0, 1.0, float("nan")))
    return out


def select(fits) -> int:
    """Index of the family that fits: lowest AIC among parametric fits KS does not reject."""
    ok = [(aic, i) for i, (d, ks, p, aic) in enumerate(fits) if d.family not in ("empirical",) and p >= 0.01 and np.isfinite(aic)]
    if fits[0][0].family == "constant":
        return 0
    return min(ok)[1] if ok else len(fits) - 1


MIN_SCALED_NS = 10_000   # slots typically shorter than this carry no meaningful ratio
MIN_SCALED_SHARE = 0.05  # nor those under this share of their op's typical duration


def scaled_slots(g: JobGraph, typ: np.ndarray) -> np.ndarray:
    """Slots whose step-to-step variation is modelled as a ratio to their typical duration.
    A receive that usually finds its data already there has a typical of ~0: ratios of such
    slots are noise (and would inflate the pooled model); they are replayed from their own
    measured values instead."""
    names = g.slot_names()
    out = np.zeros(len(typ), dtype=bool)
    for nm in np.unique(names):
        sel = names == nm
        ref = np.median(typ[sel])
        out[sel] = (typ[sel] >= MIN_SCALED_NS) & (typ[sel] >= MIN_SCALED_SHARE * ref)
    return out


def temporal_ratios(g: JobGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per slot: its typical duration (median over steps) and the [n_slots, n_steps] ratios of
    each step's duration to it (1 for slots that are not `scaled_slots`)."""
    typ = np.median(g.dur, axis=1)
    ok = scaled_slots(g, typ)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ok[:, None], g.dur / np.where(ok, typ, 1.0)[:, None], 1.0)
    return typ, ratio


VARIABILITY_COLUMNS = {
    "capture_id": pl.Utf8, "op_name": pl.Utf8, "dimension": pl.Utf8, "unit": pl.Utf8, "family": pl.Utf8,
    "selected": pl.Boolean, "n": pl.Int64, "mean": pl.Float64, "std": pl.Float64, "cv": pl.Float64,
    "p5": pl.Float64, "p50": pl.Float64, "p95": pl.Float64, "p99": pl.Float64,
    "ks_stat": pl.Float64, "ks_pvalue": pl.Float64, "aic": pl.Float64, "params": pl.Utf8,
}


def _model_rows(cap: str, op_name: str, dims) -> list[dict]:
    rows = []
    qs = np.array([0.05, 0.5, 0.95, 0.99])
    for dim, unit, x in dims:
        x = np.asarray(x, dtype=float)
        x = x[np.isfinite(x)]
        if len(x) == 0:
            continue
        fits = fit_families(x)
        best = select(fits)
        for i, (d, ks, p, aic) in enumerate(fits):
            q = d.ppf(qs) if d.family != "empirical" else np.quantile(x, qs)
            m = d.mean()
            sd = float(np.std(x, ddof=1)) if d.family == "empirical" and len(x) > 1 else float(np.sqrt(_var(d, x)))
            rows.append({
                "capture_id": cap, "op_name": op_name, "dimension": dim, "unit": unit, "family": d.family,
                "selected": i == best, "n": len(x), "mean": float(m), "std": sd, "cv": sd / m if m else None,
                "p5": float(q[0]), "p50": float(q[1]), "p95": float(q[2]), "p99": float(q[3]),
                "ks_stat": ks, "ks_pvalue": p, "aic": aic if np.isfinite(aic) else None,
                "params": json.dumps(d.params),
            })
    return rows


def variability_models(g: JobGraph) -> pl.DataFrame:
    """One row per (op, dimension, fitted family) of a capture; see the module doc. Quantiles
    are those of the fitted family (of the data for the empirical one). Durations are the
    intrinsic ones of the step structure (waits for peers removed)."""
    from fleetscope.prism.schemas import VARIABILITY_MODELS  # local: schemas import nothing from here
    typ, ratio = temporal_ratios(g)
    scaled = scaled_slots(g, typ)
    names = g.slot_names()
    rows = []
    for nm in np.unique(names):
        sel = names == nm
        dims = []
        pos = sel & scaled
        if pos.any():
            dims.append(("temporal", "ratio", ratio[pos].ravel()))
        # spatial: each rank's typical duration of this op (median over its slots and steps)
        ranks = g.slot_rank[sel]
        vals = g.dur[sel]
        dims.append(("spatial", "ns", [np.median(vals[ranks == r]) for r in np.unique(ranks)]))
        rows += _model_rows(g.capture_id, nm, dims)
    return VARIABILITY_MODELS.validate(pl.DataFrame(rows, schema=VARIABILITY_COLUMNS))


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def trace_kernel_executions(events: pl.DataFrame) -> pl.DataFrame:
    """trace_events (fleetscope.traces) -> one row per GPU kernel / memcpy / memset with its
    iteration: the last `ProfilerStep#N` annotation that started before it (null without
    annotations), and its occurrence index among same-named kernels of that rank and step."""
    k = events.filter(pl.col("cat").is_in(GPU_CATS) & pl.col("dur_ns").is_not_null())
    cols = ["capture_id", "rank", "name", "ts_ns", "dur_ns"]
    steps = (events.filter(pl.col("name").str.starts_with("ProfilerStep#") & pl.col("cat").is_in(["user_annotation", "gpu_user_annotation", "cpu_op", "python_function"]))
             .select("capture_id", "rank", pl.col("ts_ns").alias("step_ts"),
                     pl.col("name").str.extract(r"#(\d+)").cast(pl.Int64).alias("step"))
             .unique(["capture_id", "rank", "step"], keep="first").sort("step_ts"))
    k = k.select(cols).sort("ts_ns")
    if steps.height:
        with warnings.catch_warnings():  # both sides are sorted on time; polars cannot verify it per group
            warnings.simplefilter("ignore", UserWarning)
            k = k.join_asof(steps, left_on="ts_ns", right_on="step_ts", by=["capture_id", "rank"], strategy="backward").drop("step_ts")
    else:
        k = k.with_columns(step=pl.lit(None, dtype=pl.Int64))
    return k.with_columns(occ=pl.int_range(pl.len()).over("capture_id", "rank", "step", "name"))


def kernel_variability_models(events: pl.DataFrame, min_count: int = 8) -> pl.DataFrame:
    """variability_models from profiler traces (trace_events), per capture and kernel name:
    temporal = each execution over the median of the same kernel slot (rank, step position)
    across iterations when the trace has >= 2 ProfilerSteps, else over the rank's median of that
    kernel; spatial = each rank's median. Kernels with fewer than min_count executions are
    skipped (nothing to fit)."""
    from fleetscope.prism.schemas import VARIABILITY_MODELS
    ex = trace_kernel_executions(events)
    rows = []
    for (cap,), e in ex.group_by("capture_id", maintain_order=True):
        multi = e["step"].drop_nulls().n_unique() >= 2
        key = ["rank", "name", "occ"] if multi else ["rank", "name"]
        e = e.with_columns(ratio=pl.col("dur_ns") / pl.col("dur_ns").median().over(key))
        counts = e.group_by("name").len().filter(pl.col("len") >= min_count)
        for (nm,), x in e.filter(pl.col("name").is_in(counts["name"].implode())).group_by("name", maintain_order=True):
            ok = x.filter(pl.col("ratio").is_finite())
            dims = [("temporal", "ratio", ok["ratio"].to_numpy()),
                    ("spatial", "ns", x.group_by("rank").agg(pl.col("dur_ns").median())["dur_ns"].to_numpy())]
            rows += _model_rows(str(cap), str(nm), dims)
    return VARIABILITY_MODELS.validate(pl.DataFrame(rows, schema=VARIABILITY_COLUMNS))


def _var(d: Dist, x: np.ndarray) -> float:
    p, f = d.params, d.family
    if f == "constant":
        return 0.0
    if f == "normal":
        return p["sigma"] ** 2
    if f == "lognormal":
        return (np.exp(p["sigma"] ** 2) - 1) * np.exp(2 * p["mu"] + p["sigma"] ** 2)
    if f == "gamma":
        return p["shape"] * p["scale"] ** 2
    return float(np.var(x, ddof=1)) if len(x) > 1 else 0.0


HW_METRICS = ("sm_clock_mhz", "power_w", "temp_c")


def hw_correlation(timings: pl.DataFrame, hw: pl.DataFrame, capture_id: str | None = None,
                   tolerance_ns: int | None = None) -> pl.DataFrame:
    """PRISM Figure 4 for a capture: how op durations move with the GPU's SM clock, power,
    temperature and NVML throttle reasons. Each op execution (timings rows with a host) is
    matched to the hw sample of its GPU nearest its midpoint (GPU = the rank's position among the
    host's ranks when hw names GPUs `<host>/gpu<k>` or `<k>`, else the host's mean). Per op and
    metric: Spearman correlation of duration ratio (to the op's median) with the metric, the mean
    ratio below/above the metric's median, and for throttling the share of throttled executions
    and the mean ratio with and without. Empty (with the schema) when nothing can be matched."""
    from fleetscope.prism.schemas import HW_CORRELATION
    empty = pl.DataFrame(schema={c: d for c, d in HW_CORRELATION_COLUMNS.items()})
    if timings.height == 0 or hw.height == 0 or "host" not in timings.columns or timings["host"].null_count() == timings.height:
        return empty
    cap = capture_id or str(timings["capture_id"][0])
    t = timings.filter(pl.col("host").is_not_null() & pl.col("kind").is_in(["op", "kernel"]))
    t = t.with_columns(mid=((pl.col("start_ns") + pl.col("end_ns")) // 2),
                       dur=(pl.col("end_ns") - pl.col("start_ns")).cast(pl.Float64))
    # GPU index of a rank: its position among the ranks seen on its host
    loc = (t.select("host", "rank").unique().sort("host", "rank")
           .with_columns(local=pl.int_range(pl.len()).over("host").cast(pl.Int64)))
    t = t.join(loc, on=["host", "rank"])
    h = hw.with_columns(local=pl.col("gpu").str.extract(r"(\d+)$").cast(pl.Int64, strict=False))
    if h["local"].null_count() == 0:
        keys = ["host", "local"]
    else:
        agg = [pl.col(c).mean() for c in HW_METRICS if c in h.columns]
        if "throttle_reasons" in h.columns:
            agg.append(pl.col("throttle_reasons").max())
        h = h.group_by("host", "ts_ns").agg(agg)
        keys = ["host"]
    if tolerance_ns is None:
        d = h.sort("ts_ns")["ts_ns"].diff().drop_nulls()
        d = d.filter(d > 0)
        tolerance_ns = int(2 * d.median()) if d.len() else 1_000_000_000
    with warnings.catch_warnings():  # both sides are sorted on the time key; polars cannot verify it per group
        warnings.simplefilter("ignore", UserWarning)
        m = t.sort("mid").join_asof(h.sort("ts_ns"), left_on="mid", right_on="ts_ns", by=keys,
                                    strategy="nearest", tolerance=tolerance_ns)
    m = m.with_columns(ratio=pl.col("dur") / pl.col("dur").median().over("name"))
    rows = []
    for (nm,), grp in m.group_by("name"):
        for metric in HW_METRICS:
            if metric not in grp.columns:
                continue
            x = grp.filter(pl.col(metric).is_not_null() & pl.col("ratio").is_finite())
            if x.height < 8 or x[metric].n_unique() < 2:
                continue
            v, r = x[metric].to_numpy(), x["ratio"].to_numpy()
            rho, pv = stats.spearmanr(v, r)
            med = np.median(v)
            rows.append({"capture_id": cap, "op_name": nm, "metric": metric, "n": x.height,
                         "spearman_r": float(rho), "p_value": float(pv),
                         "ratio_low": float(r[v <= med].mean()), "ratio_high": float(r[v > med].mean()) if (v > med).any() else None,
                         "share_high": float((v > med).mean())})
        if "throttle_reasons" in grp.columns:
            x = grp.filter(pl.col("throttle_reasons").is_not_null())
            if x.height >= 8:
                bits = x["throttle_reasons"].to_numpy()
                r = x["ratio"].to_numpy()
                for bit, reason in THROTTLE_REASONS.items():  # Figure 4b: which reason slows it
                    on = (bits & bit) != 0
                    if on.any():
                        rows.append({"capture_id": cap, "op_name": nm, "metric": f"throttle:{reason}", "n": x.height,
                                     "spearman_r": None, "p_value": None, "ratio_low": float(r[~on].mean()) if (~on).any() else None,
                                     "ratio_high": float(r[on].mean()), "share_high": float(on.mean())})
                th = (bits & THROTTLE_MASK) != 0
                r = x["ratio"].to_numpy()
                rho, pv = (stats.spearmanr(th, r) if 0 < th.sum() < len(th) else (np.nan, np.nan))
                rows.append({"capture_id": cap, "op_name": nm, "metric": "throttled", "n": x.height,
                             "spearman_r": None if np.isnan(rho) else float(rho), "p_value": None if np.isnan(pv) else float(pv),
                             "ratio_low": float(r[~th].mean()) if (~th).any() else None,
                             "ratio_high": float(r[th].mean()) if th.any() else None, "share_high": float(th.mean())})
    if not rows:
        return empty
    return HW_CORRELATION.validate(pl.DataFrame(rows, schema=HW_CORRELATION_COLUMNS))


HW_CORRELATION_COLUMNS = {
    "capture_id": pl.Utf8, "op_name": pl.Utf8, "metric": pl.Utf8, "n": pl.Int64, "spearman_r": pl.Float64,
    "p_value": pl.Float64, "ratio_low": pl.Float64, "ratio_high": pl.Float64, "share_high": pl.Float64,
}
