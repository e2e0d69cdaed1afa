"""Fleet simulator throughput: seconds, flow records per second and peak RSS to generate one
simulated minute (landing folder + ground truth, no captures) for 64, 2,048 and 16,384 GPUs, for
one or more seeds (each seed draws its own conventions: record cutting, formats, job mix...).

    .venv/bin/python -m benchmarks.sim_generate [--sizes 64,2048,16384] [--seeds 0] [--minutes 1] [--faults SPEC]

Each run is its own process so its peak RSS is its own. Times measured on a shared machine are
provisional."""
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
out, gpus, minutes, faults, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
t = time.perf_counter()
s = simulate(out, gpus=gpus, minutes=minutes, faults=faults, seed=seed, captures=False)
wall = time.perf_counter() - t
ru = resource.getrusage(resource.RUSAGE_SELF)
conv = json.load(open(f"{out}/ground_truth/conventions.json"))
print(json.dumps({"gpus": gpus, "seed": seed, "jobs": s["jobs"], "seconds": wall, "model_s": s["seconds_model"],
                  "render_s": s["seconds_render"], "cpu_s": ru.ru_utime + ru.ru_stime,
                  "flow_records": s["flow_records"], "flow_files": s["flow_files"], "steps": s["steps"],
                  "pairs": s["pairs"], "peak_rss_mib": ru.ru_maxrss / 1024,
                  "cutting": conv["collectors"]["cutting"],
                  "formats": "/".join(sorted({c["format"] for c in conv["collectors"]["per_collector"]}))}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="64,2048,16384")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--faults", default="random:3")
    a = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    print(f"{'gpus':>6} {'seed':>5} {'jobs':>5} {'seconds':>8} {'model_s':>8} {'cpu_s':>7} {'records':>11} {'records/s':>10} "
          f"{'files':>6} {'steps':>8} {'peak_RSS_MiB':>12}  cutting / formats")
    for gpus in [int(x) for x in a.sizes.split(",")]:
        for seed in [int(x) for x in a.seeds.split(",")]:
            with tempfile.TemporaryDirectory() as tmp:
                r = subprocess.run([sys.executable, "-c", CHILD, str(Path(tmp) / "sim"), str(gpus), str(a.minutes), a.faults,
                                    str(seed)], cwd=root, capture_output=True, text=True, check=False)
                if r.returncode:
                    sys.exit(f"simulate failed for {gpus} GPUs, seed {seed}:\n{r.stderr[-3000:]}")
                d = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"{d['gpus']:>6} {d['seed']:>5} {d['jobs']:>5} {d['seconds']:>8.2f} {d['model_s']:>8.2f} {d['cpu_s']:>7.2f} "
                  f"{d['flow_records']:>11,} {d['flow_records'] / d['seconds']:>10,.0f} {d['flow_files']:>6} "
                  f"{d['steps']:>8,} {d['peak_rss_mib']:>12,.0f}  {d['cutting']} / {d['formats']}", flush=True)


if __name__ == "__main__":
    main()
