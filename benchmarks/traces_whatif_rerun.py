"""Lumos what-ifs checked against real re-runs: a real gloo job (benchmarks/traces_whatif_job.py) is
recorded at one configuration, the what-if predicts another configuration from that trace alone,
the job is run at that configuration, and the prediction is compared with the re-run's measured
step time (the job's own clock, mean over the profiled steps, slowest rank).

Ranks run in network namespaces, one per emulated host (`--ranks-per-host` ranks each: ranks of a
host talk over loopback, hosts over a bridge whose links are rate-limited to `--mbit`), so the trace
holds both intra-host and inter-host collectives.

    sudo .venv/bin/python -m benchmarks.traces_whatif_rerun [--record DIR] [--only dp,pp,layers]

--record DIR re-records every configuration into DIR (default: a temporary folder); without it the
committed recordings in tests/data/whatif are used (the tests read the same ones). Needs root (ip
netns, tc) and torch."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "whatif"

# name -> (pp, dp, stage_layers, ranks_per_host); every job: 4 microbatches, layers of 6 ms forward and
# 12 ms backward, 64 KB activations, 1 MB gradients per layer
CONFIGS = {
    "pp2_dp2": (2, 2, "4,4", 2),      # the base: DP groups inside a host, PP across hosts
    "pp2_dp4": (2, 4, "4,4", 2),      # DP x2: DP groups now span two hosts
    "pp2_dp1": (2, 1, "4,4", 2),      # DP removed
    "pp4_dp2": (4, 2, "2,2,2,2", 2),  # PP re-partitioned: 4 stages of 2 layers
    "pp1_dp2": (1, 2, "8", 2),        # PP removed: one stage of 8 layers
    "pp2_dp2_l12": (2, 2, "6,6", 2),  # 12 layers instead of 8
}
BASE = "pp2_dp2"
# (label, target config, what-if edit, parameters)
CHECKS = [
    ("dp 2->4 (DP groups across hosts)", "pp2_dp4", "dp_degree", {"dp_new": 4, "dp_old": 2}),
    ("dp 2->1", "pp2_dp1", "dp_degree", {"dp_new": 1, "dp_old": 2}),
    ("pp 2->4 (4 stages x 2 layers)", "pp4_dp2", "pp_repartition", {"layers_new": [2, 2, 2, 2]}),
    ("pp 2->1 (1 stage x 8 layers)", "pp1_dp2", "pp_repartition", {"layers_new": [8]}),
    ("layers 8->12", "pp2_dp2_l12", "layers", {"layers_new": 12}),
]
# (label, base config, target config, edit, parameters): what-ifs from another base
OTHER_BASE = [("dp 1->2 (from pp2_dp1: gradients sized from the layers' shapes)", "pp2_dp1", "pp2_dp2", "dp_degree", {"dp_new": 2, "dp_old": 1})]


def record(out: Path, name: str, mbit: float, timeout_s: float = 240) -> Path:
    """Run one configuration in fresh namespaces; its traces and step logs land in out/name."""
    pp, dp, stage_layers, rph = CONFIGS[name]
    return run_job(out / name, "benchmarks.traces_whatif_job", pp * dp, rph, mbit,
                   ["--pp", str(pp), "--stage-layers", stage_layers], timeout_s)


def run_job(d: Path, module: str, world: int, rph: int, mbit: float, args: list[str], timeout_s: float = 240,
            port: int = 29533) -> Path:
    """Run `python -m module --rank R --world W --master IP --port N --host H --out d <args>` for every rank,
    `rph` ranks per emulated host (a network namespace each; hosts joined by links shaped to `mbit`)."""
    from fleetscope.collectors.recorder.fabric import Fabric, Host, sh

    n_hosts = -(-world // rph)
    hosts = [Host(f"node{i}", f"10.97.0.{i + 1}", "leaf0") for i in range(n_hosts)]
    fab = Fabric(hosts, ["leaf0"], "spine0", prefix_len=24, tag=f"fsw{os.getpid()}")
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    procs = []
    try:
        fab.up()
        for h in hosts:  # a small bucket: messages of tens of KB are rate-limited too, not sent as one burst
            sh("tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", f"{int(mbit * 1e6)}bit", "burst", "10000",
               "latency", "200ms", ns=h.ns)
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "PYTHONPATH": str(REPO)}
        for r in range(world):
            h = hosts[r // rph]
            cmd = ["ip", "netns", "exec", h.ns, sys.executable, "-m", module, "--rank", str(r), "--world", str(world),
                   "--master", hosts[0].ip, "--port", str(port), "--host", h.name, "--out", str(d), *args]
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=open(d / f"rank{r}.log", "w")))
        t0 = time.time()
        for p in procs:
            p.wait(timeout=max(1.0, timeout_s - (time.time() - t0)))
        bad = [i for i, p in enumerate(procs) if p.returncode != 0]
        if bad:
            raise RuntimeError(f"{d.name}: ranks {bad} failed: {(d / f'rank{bad[0]}.log').read_text()[-800:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        fab.down()
    for f in d.glob("rank*.log"):
        f.unlink()
    return d


def measured_step_ns(d: Path) -> float:
    """Mean step time of the profiled steps by the job's own clock, slowest rank."""
    per_rank = []
    for f in sorted(d.glob("steps/rank*.json")):
        st = [s["dur_ns"] for s in json.loads(f.read_text())["steps"] if s["profiled"]]
        per_rank.append(sum(st) / len(st))
    return max(per_rank)


def base_graph(base_dir: Path):
    """The base capture's graph with the layout the traces themselves give (fleetscope.traces.layout; the
    job's own steps/*.json are truth, never read here)."""
    import polars as pl

    from fleetscope.ingest.partitions import _trace_file_row
    from fleetscope.ingest.traces import read_trace, trace_files
    from fleetscope.traces.graph import build_graph
    from fleetscope.traces.layout import capture_layout

    rows, evs = [], []
    for f in trace_files(base_dir):
        tf = read_trace(f, "base")
        rows.append(_trace_file_row("base", f.name, tf.meta, tf.events.height))
        evs.append(tf.events)
    ev = pl.concat(evs, how="diagonal_relaxed")
    places = capture_layout(pl.DataFrame(rows), ev).as_dict()["ranks"]
    return build_graph(ev, "base", stage_of_rank={r: v[0] for r, v in places.items()}, places=places), places


def predict_check(base_dir: Path, edit: str, params: dict) -> int:
    from fleetscope.traces.whatif import EDITS, iteration_time

    g, places = base_graph(base_dir)
    p = dict(params)
    if edit in ("pp_repartition", "layers"):
        layers = [int(x) for x in CONFIGS[BASE][2].split(",")]
        p["stage_of_rank"] = {r: v[0] for r, v in places.items()}
        p["layers_old"] = layers if edit == "pp_repartition" else sum(layers)
    return iteration_time(EDITS[edit](g, **p))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", default="", help="re-record every configuration into this folder")
    ap.add_argument("--mbit", type=float, default=200.0, help="inter-host link rate")
    ap.add_argument("--only", default="", help="comma-separated edits to check (dp_degree, pp_repartition, layers)")
    a = ap.parse_args()
    src = DATA
    tmp = None
    if a.record:
        src = Path(a.record)
        src.mkdir(parents=True, exist_ok=True)
        for name in CONFIGS:
            t = time.perf_counter()
            record(src, name, a.mbit)
            print(f"recorded {name} in {time.perf_counter() - t:.0f} s")
    rows = []
    from fleetscope.traces.whatif import iteration_time
    base = src / BASE
    base_meas = measured_step_ns(base)
    base_sim = iteration_time(base_graph(base)[0])
    print(f"base {BASE}: measured step {base_meas / 1e6:.1f} ms, replayed {base_sim / 1e6:.1f} ms "
          f"({(base_sim - base_meas) / base_meas * 100:+.1f} %)")
    for label, target, edit, params in CHECKS:
        if a.only and edit not in a.only.split(","):
            continue
        pred = predict_check(base, edit, params)
        meas = measured_step_ns(src / target)
        rows.append({"what-if": label, "edit": edit, "base_ms": base_meas / 1e6, "predicted_ms": pred / 1e6,
                     "rerun_ms": meas / 1e6, "error_pct": (pred - meas) / meas * 100,
                     "naive_error_pct": (base_meas - meas) / meas * 100})
    for label, b, target, edit, params in OTHER_BASE:
        if a.only and edit not in a.only.split(","):
            continue
        pred = predict_check(src / b, edit, params)
        meas, m0 = measured_step_ns(src / target), measured_step_ns(src / b)
        rows.append({"what-if": label, "edit": edit, "base_ms": m0 / 1e6, "predicted_ms": pred / 1e6, "rerun_ms": meas / 1e6,
                     "error_pct": (pred - meas) / meas * 100, "naive_error_pct": (m0 - meas) / meas * 100})
    df = pl.DataFrame(rows)
    with pl.Config(tbl_rows=20, tbl_cols=10, tbl_width_chars=200, float_precision=1, fmt_str_lengths=40):
        print(df)
    print(f"RESULT what-ifs vs real re-runs (out-of-sample: each prediction sees only the base trace): mean |error| "
          f"{df['error_pct'].abs().mean():.1f} %, worst {df['error_pct'].abs().max():.1f} %; "
          f"'no change' would be off by {df['naive_error_pct'].abs().mean():.1f} % on average")
    if tmp:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
