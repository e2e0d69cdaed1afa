"""Trace ingestion throughput and peak memory: fleetscope.traces.read_trace vs Holistic Trace Analysis.

Loads the same real traces (shared/data/real/hta) in both, each load in a fresh subprocess (so peak RSS
is that load's), and prints events/s (raw Chrome-trace events in the file / load wall time), the peak
RSS above the interpreter-with-imports baseline, and the ratios. HTA (holistictraceanalysis==0.5.0 with
pandas<3) is installed into its own virtualenv if absent (default /tmp/hta-venv, --hta-venv to change).

    .venv/bin/python -m benchmarks.traces_ingest_vs_hta [--big N] [--repeat R]

--big N also builds a synthetic large trace (the largest real trace's events repeated N times, written
gzipped to /tmp) to show throughput and bounded memory on big files."""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / ".." / "shared" / "data" / "real" / "hta"

# Each measurement: warm up on a tiny trace (library initialization is not parsing), then take the
# current RSS as the base, load the trace, and report wall time, CPU time (all threads) and peak RSS.
COMMON = r"""
import json, os, resource, sys, time
def rss_kb():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
"""

OURS = COMMON + r"""
from fleetscope.ingest.traces import read_trace
read_trace({warm!r}, "warm")
base = rss_kb()
t, c = time.perf_counter(), cpu()
tf = read_trace({path!r}, "bench")
dt, dc = time.perf_counter() - t, cpu() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"s": dt, "cpu": dc, "rows": tf.events.height, "base_kb": base, "peak_kb": peak}}))
"""

HTA = COMMON + r"""
import logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir={warm_folder!r})
base = rss_kb()
t, c = time.perf_counter(), cpu()
a = TraceAnalysis(trace_dir={folder!r})
dt, dc = time.perf_counter() - t, cpu() - c
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rows = sum(len(a.t.get_trace(r)) for r in a.t.get_all_traces())
print(json.dumps({{"s": dt, "cpu": dc, "rows": rows, "base_kb": base, "peak_kb": peak}}))
"""


def ensure_hta(venv: Path) -> Path:
    py = venv / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-c", "import hta"], capture_output=True).returncode == 0
    if not ok:
        print(f"installing holistictraceanalysis==0.5.0 into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "holistictraceanalysis==0.5.0", "pandas<3"], check=True)
    return py


def run_json(cmd: list[str], timeout: int = 900) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def count_raw_events(path: Path) -> int:
    with gzip.open(path, "rt") if path.name.endswith(".gz") else open(path) as fh:
        return len(json.load(fh)["traceEvents"])


def make_big(src: Path, n: int, out: Path) -> Path:
    """src's events repeated n times (time-shifted so they do not overlap), one rank, gzipped."""
    with gzip.open(src, "rt") as fh:
        doc = json.load(fh)
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("pid"), int)]
    t0 = min(e["ts"] for e in ev)
    span = max(e["ts"] + e.get("dur", 0) for e in ev) - t0 + 1000
    meta = [e for e in doc["traceEvents"] if e.get("ph") != "X"]
    with gzip.open(out, "wt", compresslevel=1) as fh:
        fh.write('{"schemaVersion": 1, "distributedInfo": ' + json.dumps(doc.get("distributedInfo", {"rank": 0})) + ',\n  "traceEvents": [\n')
        first = True
        for k in range(n):
            for e in meta if k == 0 else []:
                fh.write(("" if first else ",\n") + "  " + json.dumps(e))
                first = False
            for e in ev:
                e2 = dict(e)
                e2["ts"] = e["ts"] + k * span
                fh.write(("" if first else ",\n") + "  " + json.dumps(e2))
                first = False
        fh.write("\n]}\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hta-venv", default=os.environ.get("HTA_VENV", "/tmp/hta-venv"))
    ap.add_argument("--big", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="loads per file and tool (best time, max memory)")
    ap.add_argument("--files", nargs="*", default=None)
    args = ap.parse_args()
    hta_py = ensure_hta(Path(args.hta_venv))
    files = [Path(f) for f in args.files] if args.files else sorted(REAL.resolve().glob("*.json.gz"))
    tmp = Path(tempfile.mkdtemp(prefix="fleetscope-bench-"))
    if args.big:
        largest = max(files, key=lambda p: p.stat().st_size)
        files = files + [make_big(largest, args.big, tmp / f"big_x{args.big}_rank0.json.gz")]
    warm = REAL.resolve() / "critical_path__cuda_event_sync__event_sync_trace.json.gz"
    warm_folder = tmp / "warm"
    warm_folder.mkdir(exist_ok=True)
    (warm_folder / "rank0.json.gz").symlink_to(warm)
    print(f"{'trace':50s} {'events':>8s} | {'ours ev/s':>9s} {'ev/cpu-s':>9s} {'MB':>6s} | {'HTA ev/s':>8s} {'ev/cpu-s':>8s} {'MB':>6s} | {'wall x':>6s} {'cpu x':>6s} {'mem x':>6s}")
    tot = {"raw": 0, "o_s": 0.0, "h_s": 0.0, "o_c": 0.0, "h_c": 0.0}
    mem = []
    for f in files:
        raw = count_raw_events(f)
        folder = tmp / f.name.replace(".", "_")
        folder.mkdir(exist_ok=True)
        link = folder / "rank0.json.gz"  # HTA reads a folder of traces
        if not link.exists():
            link.symlink_to(f.resolve())
        ours = [run_json([sys.executable, "-c", OURS.format(repo=str(REPO), path=str(f), warm=str(warm))]) for _ in range(args.repeat)]
        try:
            hta = [run_json([str(hta_py), "-c", HTA.format(folder=str(folder), warm_folder=str(warm_folder))]) for _ in range(args.repeat)]
        except Exception as exc:  # noqa: BLE001 - report HTA failures, keep going
            print(f"{f.name[:50]:50s} {raw:8d} | HTA failed: {str(exc).strip().splitlines()[-1][:80]}")
            continue
        o_s, h_s = min(r["s"] for r in ours), min(r["s"] for r in hta)
        o_c, h_c = min(r["cpu"] for r in ours), min(r["cpu"] for r in hta)
        o_mb = max(r["peak_kb"] - r["base_kb"] for r in ours) / 1024
        h_mb = max(r["peak_kb"] - r["base_kb"] for r in hta) / 1024
        for k, v in (("raw", raw), ("o_s", o_s), ("h_s", h_s), ("o_c", o_c), ("h_c", h_c)):
            tot[k] += v
        mem.append((raw, o_mb, h_mb))
        print(f"{f.name[:50]:50s} {raw:8d} | {raw / o_s:9.0f} {raw / o_c:9.0f} {o_mb:6.1f} | {raw / h_s:8.0f} {raw / h_c:8.0f} {h_mb:6.1f} | "
              f"{h_s / o_s:6.1f} {h_c / o_c:6.1f} {h_mb / max(o_mb, 0.1):6.1f}")
    big = [m for m in mem if m[0] >= 20000]
    print(f"ALL {tot['raw']} events: ours {tot['raw'] / tot['o_s']:.0f} ev/s ({tot['raw'] / tot['o_c']:.0f} ev/cpu-s), "
          f"HTA {tot['raw'] / tot['h_s']:.0f} ev/s ({tot['raw'] / tot['h_c']:.0f} ev/cpu-s); "
          f"throughput ratio wall {tot['h_s'] / tot['o_s']:.1f}x, cpu {tot['h_c'] / tot['o_c']:.1f}x")
    if big:
        print("peak memory above baseline on traces >= 20K events: " + ", ".join(
            f"{n} ev: ours {o:.0f} MB vs HTA {h:.0f} MB ({h / max(o, 0.1):.1f}x)" for n, o, h in big))


if __name__ == "__main__":
    main()
