"""Hang detection without a human, on real CPU training runs (fleetscope.collectors.demo_train: 4
ranks, gloo): each hang run stops one rank outside any collective for `--hang-s` seconds at a
step; the other ranks' tracer watchdogs must file one incident whose stacks and collective
progress name that rank. Healthy runs of the same job must file nothing.

    .venv/bin/python -m benchmarks.xputimer_hang [--runs 4] [--healthy 2] [--hang-s 12] [--min-s 1.5]

Hang rank and step vary per run (seeded). Prints per run: detection latency = the incident's
creation (file mtime) - the moment the rank stopped, the bound the watchdog had learned (from the
incident note), and whether the diagnosis named the rank (from the stacks and from the collective
progress alone)."""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMON = ["--world", "4", "--layers", "6", "--hidden", "256", "--batch", "32", "--steps", "24"]


def _run(landing: Path, cap: str, extra: list[str], env: dict) -> int:
    code = f"from fleetscope.collectors import demo_train; demo_train.run({[*COMMON, '--landing', str(landing), '--capture', cap, '--job-id', cap, *extra]!r})"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, timeout=900).returncode


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--healthy", type=int, default=2)
    ap.add_argument("--hang-s", type=float, default=12.0)
    ap.add_argument("--min-s", type=float, default=1.5, help="the watchdog's lower bound (FLEETSCOPE_HANG_MIN_S)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    from fleetscope.xputimer.hang import diagnose_hang

    rng = random.Random(a.seed)
    env = dict(os.environ, FLEETSCOPE_HANG_MIN_S=str(a.min_s))
    lat, named, named_fr, false_inc = [], 0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        plan = [("hang", i) for i in range(a.runs)] + [("healthy", i) for i in range(a.healthy)]
        rng.shuffle(plan)
        for kind, i in plan:
            land = Path(tmp) / f"{kind}{i}" / "landing"
            cap = f"{kind}{i}"
            if kind == "healthy":
                rc = _run(land, cap, [], env)
                n = len(list((land / "incidents").glob("*.json"))) if (land / "incidents").is_dir() else 0
                false_inc += n
                print(f"healthy run {i}: exit {rc}, incidents filed {n}", flush=True)
                continue
            rank, step = rng.randrange(4), rng.randrange(8, 20)
            marker = land.parent / "m"
            rc = _run(land, cap, ["--hang-rank", str(rank), "--hang-step", str(step), "--hang-s", str(a.hang_s),
                                  "--hang-marker", str(marker)], env)
            incs = sorted((land / "incidents").glob("*.json")) if (land / "incidents").is_dir() else []
            if not incs:
                print(f"hang run {i} (rank {rank}, step {step}): exit {rc}, NO incident", flush=True)
                continue
            stall = int(Path(str(marker) + ".ns").read_text())
            created = incs[0].stat().st_mtime_ns
            body = json.loads(incs[0].read_text())
            bound = float(re.search(r"bound of ([\d.]+) s", body["note"]).group(1))
            folder = land / "stacks" / incs[0].stem
            h = diagnose_hang(folder, job_id=cap)
            ok = h.verdicts.filter(h.verdicts["scope"] == "rank")["subject"].to_list() == [str(rank)]
            for p in folder.glob("rank*.txt"):
                p.unlink()
            ok_fr = diagnose_hang(folder, job_id=cap).verdicts["subject"].to_list() == [str(rank)]
            lat.append((created - stall) / 1e9)
            named += ok
            named_fr += ok_fr
            print(f"hang run {i} (rank {rank}, step {step}): exit {rc}, incidents {len(incs)}, latency {lat[-1]:.2f} s "
                  f"(learned bound {bound:.2f} s), named rank {rank}: stacks+progress {ok}, progress alone {ok_fr}", flush=True)
    lat.sort()
    print(f"\nhang runs {a.runs}: incidents {len(lat)}, rank named {named} (progress alone {named_fr}); "
          f"latency median {lat[len(lat) // 2] if lat else float('nan'):.2f} s, max {max(lat) if lat else float('nan'):.2f} s; "
          f"healthy runs {a.healthy}: incidents {false_inc}")


if __name__ == "__main__":
    main()
