"""PerfTracker localization at scale: 1,000,000 workers x 20 functions of behaviour patterns.

    .venv/bin/python -m benchmarks.perftracker_scale [--workers 1000000] [--functions 20] [--stages 8]

Generates patterns (seeded) with planted anomalies (a few hundred workers with low mu on one
compute kernel, high beta on a Python function), writes them to a temporary parquet, then a
child process reads them and runs fleetscope.perftracker.localize.localize: prints the
localization seconds, the child's peak RSS (and its RSS before localizing), and the recall /
precision of the planted anomalies."""
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


def make_patterns(n_workers: int, n_functions: int, n_stages: int, seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    cats = np.array(["compute"] * (n_functions // 2) + ["collective"] * (n_functions // 4) + ["python"] * (n_functions - n_functions // 2 - n_functions // 4))
    n = n_workers * n_functions
    rank = np.repeat(np.arange(n_workers, dtype=np.int32), n_functions)
    f = np.tile(np.arange(n_functions), n_workers)
    cat = cats[f]
    stage = (rank // max(1, n_workers // n_stages)).clip(0, n_stages - 1).astype(np.int32)
    base_beta = np.where(cat == "compute", 0.05, np.where(cat == "collective", 0.04, 0.002))
    beta = np.clip(base_beta[np.arange(n)] * (1 + 0.05 * rng.standard_normal(n)), 0, 1)
    mu = np.clip(0.8 + 0.02 * rng.standard_normal(n), 0, 1)
    sigma = np.clip(0.1 + 0.01 * rng.standard_normal(n), 0, 1)
    mu = np.where(cat == "python", np.nan, mu)
    sigma = np.where(cat == "python", np.nan, sigma)
    # planted: 300 throttled workers (compute kernel 0: mu 0.4), 200 workers with a GC-like stall
    # in the first Python function (beta 0.08)
    thr = rng.choice(n_workers, 300, replace=False)
    gc = rng.choice(n_workers, 200, replace=False)
    py0 = int(np.nonzero(cats == "python")[0][0])
    i_thr = thr * n_functions + 0
    i_gc = gc * n_functions + py0
    mu[i_thr] = 0.4
    beta[i_gc] = 0.08
    df = pl.DataFrame({
        "capture_id": pl.repeat("scale", n, eager=True),
        "rank": rank, "function": pl.Series([f"fn{k:02d}" for k in range(n_functions)], dtype=pl.Utf8).gather(f),
        "category": pl.Series(cats.tolist(), dtype=pl.Utf8).gather(f), "beta": beta, "mu": mu, "sigma": sigma,
        "stage": stage, "mu_source": pl.repeat("hw_alg1", n, eager=True),
    }).with_columns(pl.col("mu").fill_nan(None), pl.col("sigma").fill_nan(None))
    truth = pl.DataFrame({"rank": np.concatenate([thr, gc]).astype(np.int32),
                          "function": [f"fn{0:02d}"] * len(thr) + [f"fn{py0:02d}"] * len(gc)})
    return df, truth


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(path: str) -> None:
    from fleetscope.perftracker.localize import localize

    df = pl.read_parquet(path)
    before = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    out = localize(df, validate=False)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    # "loud": what patterns_verdicts raises as warning/critical (a differential finding without a
    # material beta/mu difference stays info; these planted functions are not waiting collectives)
    flagged = out.filter("abnormal").select("rank", pl.col("function").cast(pl.Utf8),
                                            loud=(pl.col("reason") != "differential") | pl.col("diff_material"))
    flagged.write_parquet(path + ".flagged.parquet")
    print(json.dumps({"rows": out.height, "localize_s": round(dt, 2), "localize_cpu_s": round(cpu, 2), "rss_before_mb": round(before), "peak_rss_mb": round(rss_mb()),
                      "flagged": flagged.height}))


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
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    t0 = time.perf_counter()
    df, truth = make_patterns(a.workers, a.functions, a.stages)
    print(f"generated {df.height:,} pattern rows ({a.workers:,} workers x {a.functions} functions, {a.stages} stages) in "
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
    tp = flagged.join(truth, on=["rank", "function"], how="semi").height
    loud = flagged.filter("loud")
    tpl = loud.join(truth, on=["rank", "function"], how="semi").height
    stats["calibration_s"] = round(calibration_s(), 2)
    stats.update(planted=truth.height, true_positives=tp, recall=round(tp / truth.height, 4),
                 precision=round(tp / flagged.height, 4) if flagged.height else None,
                 loud_flagged=loud.height, loud_recall=round(tpl / truth.height, 4),
                 loud_precision=round(tpl / loud.height, 4) if loud.height else None)
    print(json.dumps(stats))
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[0]
    print(f"localization of {stats['rows']:,} patterns: {stats['localize_s']} s wall, {stats['localize_cpu_s']} s CPU "
          f"(load average {load} on this 2-core machine; calibration loop {stats['calibration_s']} s, 2.0 s idle), peak RSS {stats['peak_rss_mb']} MB "
          f"(RSS {stats['rss_before_mb']} MB with the patterns loaded); planted {truth.height}: abnormal rows recall {stats['recall']}, "
          f"precision {stats['precision']}; warning/critical-level rows recall {stats['loud_recall']}, precision {stats['loud_precision']}")


if __name__ == "__main__":
    main()
