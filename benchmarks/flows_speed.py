"""Speed of the flow analytics: landed flow files -> verdicts (ingest through fleetscope.ingest, then
one analyze_window) for simulated fleets of 2k to 16k GPUs, one minute each, conventions drawn per
seed (CSV dialects, parquet codecs, record cutting). Prints per-stage wall seconds, the process's CPU
seconds (less sensitive to other work on a shared machine), microseconds per flow and the peak memory
of the process that does the work (a fresh subprocess per size: the simulator's memory does not count).

    .venv/bin/python -m benchmarks.flows_speed [--gpus 2048 16384] [--seed 1001] [--data /tmp/fs_flows_speed]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _measure(folder: Path) -> dict:
    from benchmarks.flows_common import load_landing

    from fleetscope.flows import analyze_window

    c0 = time.process_time()
    t0 = time.perf_counter()
    flows, topo, stats = load_landing(folder / "landing")
    t_read = time.perf_counter() - t0
    w = json.loads((folder / "ground_truth" / "summary.json").read_text())["window"]
    tm: dict = {}
    t1 = time.perf_counter()
    out = analyze_window(flows, topo, w[0], w[1], timings=tm)
    t_an = time.perf_counter() - t1
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu = time.process_time() - c0
    return {"flows": flows.height, "files": stats["files"], "read_s": t_read, **{f"{k}_s": v for k, v in tm.items()},
            "analyze_s": t_an, "total_s": t_read + t_an, "cpu_s": cpu, "peak_mb": peak_mb, "jobs": out["jobs"].height,
            "pairs": out["comm_pairs"].height, "steps": out["step_timelines"].height,
            "verdicts": out.verdicts.height,
            # a healthy fleet (faults=''): every warning or critical verdict is a false alarm
            "loud_verdicts": out.verdicts.filter(out.verdicts["severity"] != "info").height}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--seed", type=int, default=1001)
    ap.add_argument("--data", default="/tmp/fs_flows_speed")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(_measure(Path(a.measure))))
        return 0
    rows = []
    for g in a.gpus:
        folder = Path(a.data) / f"g{g}-s{a.seed}"
        if not (folder / "ground_truth" / "summary.json").exists():
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"from fleetscope.sim import simulate; simulate({str(folder)!r}, "
                            f"gpus={g}, minutes=1.0, faults='', seed={a.seed}, captures=False, overwrite=True)"],
                           check=True, cwd=REPO)
            print(f"simulated {g} GPUs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        r = subprocess.run([sys.executable, "-m", "benchmarks.flows_speed", "--measure", str(folder)], check=True, cwd=REPO,
                           capture_output=True, text=True)
        rows.append({"gpus": g, **json.loads(r.stdout.strip().splitlines()[-1])})
        print(rows[-1], file=sys.stderr)
    cols = ["gpus", "flows", "read_s", "prepare_s", "jobs_s", "comm_types_s", "timelines_s", "verdicts_s", "total_s",
            "cpu_s", "peak_mb", "us_per_flow", "jobs", "loud_verdicts"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        r["us_per_flow"] = r["total_s"] / r["flows"] * 1e6
        print("| " + " | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
