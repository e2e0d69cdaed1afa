"""Figure (issue 2): ingest of a 16,384-GPU fleet minute of flows, from landed files to validated
warehouse tables: seconds, rows per second, peak memory.

    .venv/bin/python -m benchmarks.ingest_flows [--gpus 16384] [--workdir /tmp/fleetscope-bench]

The landing folder is simulated once (fleetscope.sim, flows only) and reused; the measured part is
registration (hashing) + read/normalize/validate/write of every flow file, in one process."""
import argparse
import shutil
import time
from pathlib import Path

from benchmarks.memory import PeakTreeRSS
from fleetscope.ingest.partitions import ingest_file
from fleetscope.ingest.registry import register_landing
from fleetscope.warehouse import Warehouse


def _ingest_one(args):
    wh_path, landing, key = args
    s = ingest_file(Warehouse(wh_path), Path(landing), "flows", key)
    return s.rows_in, s.rows_kept, s.rows_rejected


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--workdir", default="/tmp/fleetscope-bench")
    ap.add_argument("--workers", type=int, default=2, help="parallel ingestion processes (Dagster runs partitions in parallel too)")
    a = ap.parse_args()
    work = Path(a.workdir) / f"sim{a.gpus}"
    if not (work / "landing" / "flows").exists():
        from fleetscope.sim import simulate
        t = time.perf_counter()
        simulate(work, gpus=a.gpus, minutes=a.minutes, seed=1, captures=False, overwrite=True)
        print(f"(simulated {a.gpus} GPUs x {a.minutes} min in {time.perf_counter() - t:.1f} s; not part of the figure)")
    wh_path = Path(a.workdir) / f"wh{a.gpus}" / "warehouse.duckdb"
    shutil.rmtree(wh_path.parent, ignore_errors=True)
    wh = Warehouse(wh_path)
    mem = PeakTreeRSS().__enter__()  # this process and its workers together
    t0 = time.perf_counter()
    wh.init()
    reg = register_landing(work / "landing", wh, settle_s=0)
    t_reg = time.perf_counter() - t0
    rows = kept = rejected = 0
    for key in reg.to_run.get("topology_files", []):
        ingest_file(wh, work / "landing", "topology", key)
    keys = reg.to_run.get("flow_files", [])
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    # spawn, not fork: polars' thread pool is already running in this process and is not fork-safe
    with ProcessPoolExecutor(max_workers=a.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for s in pool.map(_ingest_one, [(str(wh_path), str(work / "landing"), k) for k in keys]):
            rows += s[0]
            kept += s[1]
            rejected += s[2]
    total = time.perf_counter() - t0
    mem.__exit__(None, None, None)
    check = wh.sql("SELECT count(*) AS n FROM flows")["n"][0]
    peak = mem.peak_mib
    files = len(reg.to_run.get("flow_files", []))
    print(f"\ningest of a {a.gpus}-GPU fleet, {a.minutes:g} min of flows ({files} files):")
    print(f"  {'rows in':<28}{rows:>14,}")
    print(f"  {'rows kept / rejected':<28}{kept:>14,} / {rejected:,}")
    print(f"  {'registration (hashing) s':<28}{t_reg:>14.2f}")
    print(f"  {'landed -> validated s':<28}{total:>14.2f}   (target < 10 s)")
    print(f"  {'rows per second':<28}{rows / total:>14,.0f}")
    print(f"  {'peak RSS MiB (main+workers)':<28}{peak:>14,.0f}   (sum over the process tree, sampled; target < 4096)")
    print(f"  {'workers':<28}{a.workers:>14}")
    assert check == kept, (check, kept)


if __name__ == "__main__":
    main()
