"""PerfTracker localization at scale: 1,000,000 workers x 20 functions of behaviour patterns.

    .venv/bin/python -m benchmarks.perftracker_scale [--workers 1000000] [--functions 20] [--stages 8] [--seed 1]

Generates patterns (seeded) with heavy-tailed noise (real fleets have outliers) and per-stage differences, and plants anomalies of realistic, varied sizes:
throttled GPUs (every compute kernel 1.05-1.5x longer at a proportionally lower utilization),
GC-like stalls in a Python function (+0.5 to 6 % of the step), slow links (every collective at 50-95 %
of its peers' utilization, longer by as much). Noise: Student t with 5 degrees of freedom. Writes them to a temporary parquet; a child process reads
them and runs what analyze_capture runs after the patterns, validation on: localize (pandera
validation of the output included), straggling_ranks and patterns_verdicts. Prints the seconds,
the child's peak RSS, and detection against the planted truth: recall of the material anomalies
(costing >= min_impact of the step: the ones PerfTracker must report), how many immaterial ones
were flagged, and the precision of the flagged rows."""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]


def make_patterns(n_workers: int, n_functions: int, n_stages: int, seed: int = 1) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    cats = np.array(["compute"] * (n_functions // 2) + ["collective"] * (n_functions // 4) + ["python"] * (n_functions - n_functions // 2 - n_functions // 4))
    n = n_workers * n_functions
    rank = np.repeat(np.arange(n_workers, dtype=np.int32), n_functions)
    f = np.tile(np.arange(n_functions), n_workers)
    cat = cats[f]
    stage = (rank // max(1, n_workers // n_stages)).clip(0, n_stages - 1).astype(np.int32)
    base_beta = np.where(cat == "compute", 0.05, np.where(cat == "collective", 0.04, 0.002))
    # stages differ (middle stages send and receive more), noise with heavy tails
    stage_k = np.where(cat == "collective", 1 + 0.3 * stage / max(1, n_stages - 1), 1.0)
    t = lambda size: rng.standard_t(5, size).astype(np.float64)  # noqa: E731
    beta = np.clip(base_beta[np.arange(n)] * stage_k * (1 + 0.04 * t(n)), 0, 1)
    mu = np.clip(0.8 + 0.03 * t(n), 0, 1)
    sigma = np.clip(0.1 + 0.01 * t(n), 0, 1)
    mu = np.where(cat == "python", np.nan, mu)
    sigma = np.where(cat == "python", np.nan, sigma)
    py0 = int(np.nonzero(cats == "python")[0][0])
    picked = rng.choice(n_workers, 600, replace=False)
    thr, gc, link = picked[:300], picked[300:500], picked[500:]
    rows = []
    comp = np.nonzero(cats == "compute")[0]
    colls = np.nonzero(cats == "collective")[0]
    # throttled GPUs: every compute kernel takes k x longer at 1/k the utilization (cost: beta x (k - 1))
    k = rng.uniform(1.05, 1.5, thr.size)
    for fi in comp:
        i = thr * n_functions + fi
        rows.append((thr, fi, "throttled GPU", beta[i] * (k - 1)))
        beta[i] *= k
        mu[i] /= k
    # GC-like stalls: a Python function gains 0.5-6 % of the step
    add = rng.uniform(0.005, 0.06, gc.size)
    i = gc * n_functions + py0
    beta[i] += add
    rows.append((gc, py0, "GC stall", add))
    # slow links: every collective runs at u x its peers' utilization, 1/u longer
    u = rng.uniform(0.5, 0.95, link.size)
    for fi in colls:
        i = link * n_functions + fi
        rows.append((link, fi, "slow link", beta[i] * (1 / u - 1)))
        beta[i] /= u
        mu[i] *= u
    df = pl.DataFrame({
        "capture_id": pl.repeat("scale", n, eager=True),
        "rank": rank, "function": pl.Series([f"fn{k:02d}" for k in range(n_functions)], dtype=pl.Utf8).gather(f),
        "category": pl.Series(cats.tolist(), dtype=pl.Utf8).gather(f), "beta": np.clip(beta, 0, 1), "mu": mu, "sigma": sigma,
        "stage": stage, "mu_source": pl.repeat("hw_alg1", n, eager=True), "window_ns": pl.repeat(3_000_000_000, n, eager=True),
    }).with_columns(pl.col("mu").fill_nan(None), pl.col("sigma").fill_nan(None))
    truth = pl.concat([pl.DataFrame({"rank": r.astype(np.int32), "function": f"fn{fi:02d}", "kind": kind, "cost": c}) for r, fi, kind, c in rows])
    return df, truth


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(path: str) -> None:
    from fleetscope.perftracker.localize import localize, stage_differential
    from fleetscope.perftracker.verdicts import patterns_verdicts
    from fleetscope.perftracker.ranks import straggling_ranks

    df = pl.read_parquet(path)
    before = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    out = localize(df)  # validation on
    t1 = time.perf_counter()
    ranks = straggling_ranks(out)
    verdicts = patterns_verdicts(out, stage_differential(out), ranks=ranks)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    flagged = out.filter("abnormal").select("rank", pl.col("function").cast(pl.Utf8), "reason", "impact")
    flagged.write_parquet(path + ".flagged.parquet")
    ranks.select("rank").write_parquet(path + ".ranks.parquet")
    print(json.dumps({"rows": out.height, "localize_s": round(t1 - t0, 2), "total_s": round(dt, 2), "total_cpu_s": round(cpu, 2),
                      "rss_before_mb": round(before), "peak_rss_mb": round(rss_mb()), "flagged": flagged.height,
                      "verdicts_loud": verdicts.filter(pl.col("severity") != "info").height, "straggling_ranks": ranks.height}))


def calibration_s() -> float:
    """The differential distance's inner kernel alone (20 M float32 rows x 100 peers, one numpy pass
    per peer over cache-sized blocks): 2.0 s on this machine when idle. Printed so a reader can
    tell how loaded the machine was when the figures were taken."""
    rng = np.random.default_rng(0)
    n, C = 20_000_000, 1 << 15
    P = rng.random((3, n), dtype=np.float32)
    S = rng.random((100, 3), dtype=np.float32)
    th = np.float32(0.4)
    buf, b2, m = np.empty(C, np.float32), np.empty(C, np.float32), np.empty(C, bool)
    cnt = np.zeros(n, np.uint8)
    t0 = time.perf_counter()
    for c0 in range(0, n, C):
        x, y, z = P[0, c0:c0 + C], P[1, c0:c0 + C], P[2, c0:c0 + C]
        L = len(x)
        bb, b, mm, cc = buf[:L], b2[:L], m[:L], cnt[c0:c0 + C]
        for s in S:
            np.subtract(x, s[0], out=bb); np.abs(bb, out=bb)
            np.subtract(y, s[1], out=b); np.abs(b, out=b); bb += b
            np.subtract(z, s[2], out=b); np.abs(b, out=b); bb += b
            np.greater(bb, th, out=mm); cc += mm
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1_000_000)
    ap.add_argument("--functions", type=int, default=20)
    ap.add_argument("--stages", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    from fleetscope.perftracker.localize import LocalizeConfig

    min_impact = LocalizeConfig().min_impact
    t0 = time.perf_counter()
    df, truth = make_patterns(a.workers, a.functions, a.stages, a.seed)
    print(f"generated {df.height:,} pattern rows ({a.workers:,} workers x {a.functions} functions, {a.stages} stages; seed {a.seed}) in "
          f"{time.perf_counter() - t0:.1f} s")
    with tempfile.TemporaryDirectory(prefix="pt_scale_") as tmp:
        path = str(Path(tmp) / "patterns.parquet")
        df.write_parquet(path)
        del df
        res = subprocess.run([sys.executable, "-m", "benchmarks.perftracker_scale", "--child", path], capture_output=True, text=True, cwd=ROOT)
        if res.returncode:
            print(res.stderr)
            raise SystemExit(res.returncode)
        stats = json.loads(res.stdout.strip().splitlines()[-1])
        flagged = pl.read_parquet(path + ".flagged.parquet")
        strag = pl.read_parquet(path + ".ranks.parquet")
    # what was planted, at the level a person acts on: a worker (throttled GPU: all its kernels; slow
    # link: all its collectives) or a function on a worker (a GC stall); material = costs >= min_impact
    # of the step. Found: a flagged pattern row of it, or (worker-level) a straggling-rank verdict on it.
    found_rows = flagged.select("rank", "function", row=pl.lit(True))
    t = truth.join(found_rows, on=["rank", "function"], how="left").with_columns(pl.col("row").fill_null(False))
    units = t.group_by("kind", "rank").agg(cost=pl.col("cost").sum(), row=pl.col("row").any()).join(
        strag.with_columns(strag=pl.lit(True)), on="rank", how="left").with_columns(
        found=pl.col("row") | (pl.col("strag").fill_null(False) & (pl.col("kind") != "GC stall")),
        material=pl.col("cost") >= min_impact)
    stats["calibration_s"] = round(calibration_s(), 2)
    planted_ranks = set(truth["rank"].to_list())
    false_rows = flagged.join(truth, on=["rank", "function"], how="anti").height
    false_ranks = strag.filter(~pl.col("rank").is_in(list(planted_ranks))).height
    mat = units.filter("material")
    stats.update(planted_units=units.height, material=mat.height, material_recall=round(float(mat["found"].mean()), 4) if mat.height else None,
                 immaterial_found=int(units.filter(~pl.col("material"))["found"].sum()), false_rows=false_rows, false_ranks=false_ranks,
                 flagged_rows=flagged.height, straggling=strag.height)
    print(json.dumps(stats))
    with pl.Config(tbl_rows=20, tbl_hide_dataframe_shape=True):
        print(units.group_by("kind", "material").agg(planted=pl.len(), found=pl.col("found").sum(),
                                                     cost_min=pl.col("cost").min().round(3), cost_max=pl.col("cost").max().round(3)).sort("kind", "material"))
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    print(f"localize (validated) + straggling ranks + verdicts over {stats['rows']:,} patterns: {stats['total_s']} s wall "
          f"({stats['localize_s']} s localize), {stats['total_cpu_s']} s CPU (load average {load} on this 2-core machine; calibration "
          f"loop {stats['calibration_s']} s, 2.0 s idle), peak RSS {stats['peak_rss_mb']} MB (RSS {stats['rss_before_mb']} MB with the "
          f"patterns loaded); planted {units.height} anomalies of realistic size, {stats['material']} costing >= {min_impact:g} of the step: "
          f"recall {stats['material_recall']}; {stats['immaterial_found']} of the {units.height - stats['material']} immaterial ones reported; "
          f"false: {stats['false_rows']} flagged pattern rows and {stats['false_ranks']} straggling ranks not planted "
          f"(of {stats['flagged_rows']} rows, {stats['straggling']} ranks); {stats['verdicts_loud']} warning/critical verdicts")

if __name__ == "__main__":
    main()
