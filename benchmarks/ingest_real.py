"""Figure (issue 2): ingest of the real traces in shared/data/real through the real pipeline:
every file registered, what was rejected and why.

    .venv/bin/python -m benchmarks.ingest_real [--workdir /tmp/fleetscope-real]"""
import argparse
import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/fleetscope-real")
    ap.add_argument("--real", default=str(REPO.parent / "shared" / "data" / "real"))
    a = ap.parse_args()
    work = Path(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    from fleetscope.ingest.real_data import layout_real_landing
    placed = layout_real_landing(Path(a.real), work / "landing")
    from fleetscope.jobs.runner import run_all
    from fleetscope.warehouse import Warehouse
    t0 = time.perf_counter()
    report = run_all(work / "landing", work / "warehouse.duckdb", settle_s=0, log=lambda *_: None)
    dt = time.perf_counter() - t0
    wh = Warehouse(work / "warehouse.duckdb")
    landed = wh.read("landed_files")
    rej = wh.read("rejected_records")
    ev = wh.sql("SELECT source_file, count(*) AS events, min(rank) AS rank FROM trace_events GROUP BY 1 ORDER BY 1")
    print(f"real data: {len(placed)} files laid out, {landed.height} registered, {len(report.runs)} Dagster runs "
          f"({len(report.failed)} failed) in {dt:.1f} s\n")
    print(f"{'file':<92}{'events/rows':>12}  status")
    events = dict(zip(ev["source_file"], ev["events"]))
    timings = wh.sql("SELECT source_file, count(*) AS n FROM timings GROUP BY 1")
    events.update(dict(zip(timings["source_file"], timings["n"])))
    reasons = {r["source_file"]: r["reason"] for r in rej.iter_rows(named=True)}
    for src, dest in placed:
        if dest.endswith(".yaml"):
            print(f"{dest:<92}{'':>12}  layout (meta)")
            continue
        n = events.get(dest, 0)
        print(f"{dest:<92}{n:>12,}  {'REJECTED: ' + reasons[dest] if dest in reasons else 'ingested'}")
    print(f"\nrejected: {rej.height}")


if __name__ == "__main__":
    main()
