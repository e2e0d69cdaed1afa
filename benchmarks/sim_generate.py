"""Fleet simulator throughput: seconds, flow records per second and peak RSS to generate one
simulated minute (landing folder + ground truth, no captures) for 64, 2,048 and 16,384 GPUs.

    .venv/bin/python -m benchmarks.sim_generate [--sizes 64,2048,16384] [--minutes 1] [--faults SPEC] [--repeat 1]

Each size runs in its own process so its peak RSS is its own. Target: the 16,384-GPU minute in
under 60 s on the 2-core development machine."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from fleetscope.sim import simulate
out, gpus, minutes, faults = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
t = time.perf_counter()
s = simulate(out, gpus=gpus, minutes=minutes, faults=faults, seed=0, captures=False)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
cpu = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"gpus": gpus, "jobs": s["jobs"], "seconds": wall, "model_s": s["seconds_model"],
                  "render_s": s["seconds_render"], "cpu_s": cpu.ru_utime + cpu.ru_stime,
                  "flow_records": s["flow_records"], "flow_files": s["flow_files"], "steps": s["steps"],
                  "pairs": s["pairs"], "peak_rss_mib": rss}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,2048,16384")
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--faults", default="congested_switch:1,degraded_nic:1,slow_gpu:1")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    print(f"{'gpus':>6} {'jobs':>5} {'seconds':>8} {'model_s':>8} {'cpu_s':>7} {'records':>10} {'records/s':>10} "
          f"{'files':>6} {'steps':>7} {'peak_RSS_MiB':>12}")
    for gpus in [int(x) for x in a.sizes.split(",")]:
        for _ in range(a.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                r = subprocess.run([sys.executable, "-c", CHILD, str(Path(tmp) / "sim"), str(gpus), str(a.minutes), a.faults],
                                   cwd=root, capture_output=True, text=True, check=False)
                if r.returncode:
                    sys.exit(f"simulate failed for {gpus} GPUs:\n{r.stderr[-3000:]}")
                d = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{d['gpus']:>6} {d['jobs']:>5} {d['seconds']:>8.2f} {d['model_s']:>8.2f} {d['cpu_s']:>7.2f} "
                  f"{d['flow_records']:>10,} {d['flow_records'] / d['seconds']:>10,.0f} {d['flow_files']:>6} "
                  f"{d['steps']:>7,} {d['peak_rss_mib']:>12,.0f}", flush=True)


if __name__ == "__main__":
    main()
