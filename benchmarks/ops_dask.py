"""In-process vs Dask (issue 26): the 2,048-GPU, 3-minute simulated fleet through `fleetscope run`,
once with every run in one process and once with the runs' steps on a Dask LocalCluster of 2
worker processes (2 runs at a time). Prints wall seconds, peak memory of the whole process tree and
of each Dask worker, the per-window and per-capture cost (from the Dagster run records), and checks
that both produced the same tables with the same rows.

    .venv/bin/python -m benchmarks.ops_dask [--gpus 2048] [--minutes 3] [--seed 11] [--workers 2] [--data /tmp/fs_ops_dask]
                                            [--reuse in_process]   # keep a previous run's figures and warehouse
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import polars as pl

from benchmarks.memory import PeakPerProcess

# columns that record when something happened on this machine, not what the data says
WALL_CLOCK = {"landed_files": {"registered_ns", "mtime_ns"}, "rejected_records": {"detected_ns"}}


def table_digest_of(wh, t: str) -> pl.DataFrame:
    """One table, columns and rows sorted, without wall-clock columns."""
    df = wh.read(t)
    df = df.drop([c for c in WALL_CLOCK.get(t, ()) if c in df.columns])
    df = df.select(sorted(df.columns))
    return df.sort(df.columns, nulls_last=True) if df.height else df


def table_digest(wh) -> dict[str, pl.DataFrame]:
    """Every table as table_digest_of gives it (small warehouses: it loads them all)."""
    from fleetscope.tables import TABLES
    return {t: table_digest_of(wh, t) for t in TABLES}


_NUMBER = r"-?\d+\.\d+(?:[eE][-+]?\d+)?"


def _close(a: pl.Series, b: pl.Series, rel: float = 1e-6) -> bool:
    """Equal but for float rounding (sums whose order differs between runs); in text (fitted
    parameters as JSON) the numbers are compared the same way."""
    if a.dtype.is_float():
        d = pl.DataFrame({"a": a, "b": b}).select(
            ok=((pl.col("a") - pl.col("b")).abs() <= rel * pl.max_horizontal(pl.col("a").abs(), pl.col("b").abs()))
            .fill_null(pl.col("a").is_null() & pl.col("b").is_null()))
        return bool(d["ok"].all())
    if a.dtype == pl.Utf8:
        ta, tb = a.str.replace_all(_NUMBER, "#"), b.str.replace_all(_NUMBER, "#")
        if not ta.equals(tb):
            return False
        na = a.str.extract_all(_NUMBER).explode().cast(pl.Float64)
        nb = b.str.extract_all(_NUMBER).explode().cast(pl.Float64)
        return len(na) == len(nb) and _close(na, nb, rel)
    return False


def differing_tables(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> list[str]:
    """Tables of two digests that differ in rows, columns or values (floats to 1e-6 relative: PRISM fits
    a gamma with a shape of 10^5 to a few digits past that)."""
    out = []
    for t in a:
        x, y = a[t], b[t]
        if x.equals(y):
            continue
        if x.shape != y.shape or x.columns != y.columns or \
                not all(x[c].equals(y[c]) or _close(x[c], y[c]) for c in x.columns):
            out.append(t)
    return out


def _run(data: Path, name: str, extra: list[str], workers: int = 0) -> dict:
    """`fleetscope run` in a subprocess; with `workers`, on a LocalCluster started here (so each
    worker's memory is known). Figures also go to <data>/<name>.json (--reuse reads them back)."""
    landing, warehouse, home = data / name / "landing", data / name / "w.duckdb", data / name / "home"
    shutil.rmtree(data / name, ignore_errors=True)
    shutil.copytree(data / "sim" / "landing", landing)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEETSCOPE_", "DAGSTER_"))}
    env["DAGSTER_HOME"] = str(home)
    cmd = [sys.executable, "-m", "fleetscope.cli", "run", "--landing", str(landing), "--warehouse", str(warehouse),
           "--settle-seconds", "0", *extra]
    with ExitStack() as stack:
        worker_pids: dict[int, str] = {}
        if workers:
            from dask.distributed import Client, LocalCluster
            # the workers import the code location with the run's environment
            os.environ.update({"FLEETSCOPE_LANDING": str(landing.resolve()), "FLEETSCOPE_WAREHOUSE": str(warehouse.resolve()),
                               "DAGSTER_HOME": str(home.resolve())})
            cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                       dashboard_address=None))
            client = stack.enter_context(Client(cluster))
            worker_pids = {pid: addr for addr, pid in client.run(os.getpid).items()}
            env["FLEETSCOPE_DASK_ADDRESS"] = cluster.scheduler_address
        t0 = time.perf_counter()
        with open(data / f"{name}.log", "w") as log, PeakPerProcess(os.getpid()) as mem:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            rc = proc.wait()
        wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{name}: fleetscope run failed ({rc}); see {data / f'{name}.log'}")
    out = dict(name=name, wall=wall, tree_peak=mem.total_peak_mib, runner=mem.peaks[proc.pid][0],
               workers={str(p): mem.peaks.get(p, (0.0, ""))[0] for p in worker_pids}, warehouse=str(warehouse), home=str(home),
               load=os.getloadavg())
    (data / f"{name}.json").write_text(json.dumps(out))
    return out


def table_fingerprints(wh) -> dict[str, tuple[int, int]]:
    """table -> (rows, an order-free hash of its rows), computed in DuckDB without loading the tables:
    wall-clock columns left out, floats as 9 significant digits (sums in another order differ in
    the last bits)."""
    from fleetscope.tables import TABLES
    out = {}
    with wh.connect() as con:
        for t in TABLES:
            if t not in wh.table_names():
                continue
            cols = con.execute(f'DESCRIBE "{t}"').fetchall()
            exprs = [f"printf('%.9g', \"{c}\")" if typ in ("DOUBLE", "FLOAT") else f'"{c}"'
                     for c, typ, *_ in cols if c not in WALL_CLOCK.get(t, ())]
            out[t] = con.execute(f'SELECT count(*), coalesce(sum(hash({", ".join(exprs)}) % 1000000007), 0) FROM "{t}"').fetchone()
    return out


def _costs(home: Path) -> dict[str, list[float]]:
    from dagster import DagsterInstance
    with DagsterInstance.from_config(str(home)) as instance:
        out: dict[str, list[float]] = {}
        for rec in instance.get_run_records():
            if rec.start_time and rec.end_time:
                out.setdefault(rec.dagster_run.job_name, []).append(rec.end_time - rec.start_time)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2048)
    ap.add_argument("--minutes", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--data", default="/tmp/fs_ops_dask")
    ap.add_argument("--reuse", nargs="*", default=[], choices=["in_process", "dask"],
                    help="print these runs' saved figures and compare their warehouses instead of running them again")
    args = ap.parse_args()
    data = Path(args.data)
    from fleetscope.sim import simulate
    from fleetscope.warehouse import Warehouse

    if not (data / "sim" / "landing").exists():
        simulate(data / "sim", gpus=args.gpus, minutes=args.minutes, faults="slow_gpu:1", seed=args.seed)
    n_records = sum(pl.scan_parquet(p).select(pl.len()).collect().item() for p in (data / "sim" / "landing" / "flows").glob("*.parquet"))
    print(f"fleet: {args.gpus} GPUs, {args.minutes:g} min, seed {args.seed}, {n_records:,} flow records (parquet files)")
    print(f"machine: {os.cpu_count()} cores; load before: {os.getloadavg()}")
    results = []
    for name, extra, workers in (("in_process", [], 0), ("dask", ["--executor", "dask", "--workers", str(args.workers)], args.workers)):
        saved = data / f"{name}.json"
        results.append(json.loads(saved.read_text()) if name in args.reuse and saved.exists() else _run(data, name, extra, workers))
    for r in results:
        costs = _costs(Path(r["home"]))
        tree = f"{r['tree_peak'] / 1024:.2f} GiB" if r.get("tree_peak") else "not recorded"
        print(f"\n{r['name']}: {r['wall']:.1f} s wall (load after {r['load'][0]:.1f}), peak of the whole process tree "
              f"{tree}, `fleetscope run` process {r['runner'] / 1024:.2f} GiB")
        for pid, mib in sorted(r["workers"].items()):
            print(f"  dask worker pid {pid}: peak {mib / 1024:.2f} GiB")
        for job in ("flow_window_analysis", "capture_analysis", "ingest_flows", "fleet_analysis"):
            if job in costs:
                xs = costs[job]
                print(f"  {job:<22} {len(xs):3d} runs, mean {statistics.mean(xs):6.1f} s, max {max(xs):6.1f} s, total {sum(xs):7.1f} s")
    a, b = table_fingerprints(Warehouse(results[0]["warehouse"])), table_fingerprints(Warehouse(results[1]["warehouse"]))
    differ = sorted(t for t in set(a) | set(b) if a.get(t) != b.get(t))
    for t in list(differ):  # a small table whose text holds floats (fitted parameters): compare to 1e-6 relative
        if a.get(t, (0,))[0] == b.get(t, (0,))[0] and a[t][0] < 100_000:
            if not differing_tables({t: table_digest_of(Warehouse(results[0]["warehouse"]), t)},
                                    {t: table_digest_of(Warehouse(results[1]["warehouse"]), t)}):
                differ.remove(t)
    rows = {t: n for t, (n, _) in a.items() if n}
    print(f"\ntables with rows: {len(rows)}, rows in all: {sum(rows.values()):,}; "
          + ("the same rows in both runs" if not differ else f"DIFFER: {[(t, a.get(t), b.get(t)) for t in differ]}"))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
