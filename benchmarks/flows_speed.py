"""Speed of the flow analytics: landed flow files -> verdicts (ingest through fleetscope.ingest, then the
window analysis the way the wiring runs it: 60 s windows, each with a 30 s margin before it) for simulated
fleets of 1k to 16k GPUs, conventions drawn per seed (CSV dialects, parquet codecs, record cutting, mirroring:
the record counts differ by seed). Per size: wall seconds, the work's CPU seconds (less sensitive to other work
on a shared machine), records per second, the peak resident memory of the process tree that does the work (a
fresh subprocess per size: the simulator's memory does not count; benchmarks.memory), and the stage breakdown
(seconds summed over the windows). Issue 21's figures: a 16,384-GPU minute of >= 9 M records in <= 30 s at
<= 8 GB, and 2,048 GPUs x 3 minutes in <= 10 s (`--minutes 3 --gpus 2048`).

    .venv/bin/python -m benchmarks.flows_speed [--gpus 1024 2048 4096 8192 16384] [--minutes 1] [--seed 1001]
        [--data /tmp/fs_flows_speed]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ["prepare", "jobs", "comm_types", "timelines", "verdicts"]


def _measure(folder: Path) -> dict:
    from benchmarks.flows_common import analyze_span, load_landing

    c0 = time.process_time()
    t0 = time.perf_counter()
    flows, topo, stats = load_landing(folder / "landing")
    t_read = time.perf_counter() - t0
    w = json.loads((folder / "ground_truth" / "summary.json").read_text())["window"]
    tm: dict = {}
    t1 = time.perf_counter()
    out = analyze_span(flows, topo, (int(w[0]), int(w[1])), timings=tm)
    t_an = time.perf_counter() - t1
    cpu = time.process_time() - c0
    v = out.get("anomaly_verdicts")
    return {"records": flows.height, "files": stats["files"], "read_s": t_read, **{f"{k}_s": tm.get(k, 0.0) for k in STAGES},
            "analyze_s": t_an, "total_s": t_read + t_an, "cpu_s": cpu,
            "windows": int(out["jobs"]["window_id"].n_unique()) if "jobs" in out and out["jobs"].height else 0,
            "jobs": int(out["jobs"]["job_id"].n_unique()) if "jobs" in out and out["jobs"].height else 0,
            # a healthy fleet (faults=''): every warning or critical verdict is a false alarm
            "loud_verdicts": int((v["severity"] != "info").sum()) if v is not None and v.height else 0}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=1001)
    ap.add_argument("--data", default="/tmp/fs_flows_speed")
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(_measure(Path(a.measure))))
        return 0
    from benchmarks.memory import PeakTreeRSS

    rows = []
    for g in a.gpus:
        folder = Path(a.data) / (f"g{g}-s{a.seed}" if a.minutes == 1.0 else f"g{g}-m{a.minutes:g}-s{a.seed}")
        if not (folder / "ground_truth" / "summary.json").exists():
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", f"from fleetscope.sim import simulate; simulate({str(folder)!r}, "
                            f"gpus={g}, minutes={a.minutes}, faults='', seed={a.seed}, captures=False, overwrite=True)"],
                           check=True, cwd=REPO)
            print(f"simulated {g} GPUs x {a.minutes:g} min in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        p = subprocess.Popen([sys.executable, "-m", "benchmarks.flows_speed", "--measure", str(folder)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
        with PeakTreeRSS(pid=p.pid) as mem:
            out, _ = p.communicate()
        if p.returncode:
            rows.append({"gpus": g, "error": f"exit {p.returncode}", "peak_mb": mem.peak_mib})
            print(rows[-1], file=sys.stderr)
            continue
        rows.append({"gpus": g, "minutes": a.minutes, **json.loads(out.strip().splitlines()[-1]), "peak_mb": mem.peak_mib})
        rows[-1]["records_per_s"] = rows[-1]["records"] / rows[-1]["total_s"]
        print(rows[-1], file=sys.stderr)
    cols = ["gpus", "minutes", "records", "windows", "read_s", *[f"{s}_s" for s in STAGES], "total_s", "cpu_s",
            "records_per_s", "peak_mb", "jobs", "loud_verdicts"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        if "error" in r:
            print(f"| {r['gpus']} | failed: {r['error']}, peak {r['peak_mb']:.0f} MB |")
            continue
        print("| " + " | ".join(f"{r[c]:,.0f}" if c in ("records", "records_per_s", "peak_mb") else
                                (f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c])) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
