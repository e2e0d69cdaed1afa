"""Sensitivity of the issue-latency metric to unnecessary synchronization, on real CPU runs
(fleetscope.collectors.demo_train: 4 ranks, gloo), and its false-alarm rate on healthy runs.

    .venv/bin/python -m benchmarks.xputimer_sensitivity [--healthy 4] [--syncs 1,2,4] [--steps 30]

Runs `healthy` healthy runs and one run per sync count (N tiny all-reduces per forward through
c10d directly, i.e. untraced), in interleaved order. Slowdown of a sync run = its median step /
the median of the healthy runs' median steps - 1. Detection: issue_stall_rows against the pooled
healthy runs; false alarms: each healthy run against the other healthy runs (leave one out).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path



def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--healthy", type=int, default=4)
    ap.add_argument("--syncs", default="1,2,4")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--thresholds", default="0.1,0.15,0.2", help="one-sided KS thresholds to report")
    a = ap.parse_args(argv)
    import polars as pl

    from fleetscope.collectors import demo_train
    from fleetscope.ingest.timings import read_timings
    from fleetscope.xputimer.detectors import issue_stall_rows

    syncs = [int(x) for x in a.syncs.split(",")]
    plan = []
    for i in range(max(a.healthy, len(syncs))):  # interleave healthy and sync runs against load drift
        if i < a.healthy:
            plan.append(("healthy", i, 0))
        if i < len(syncs):
            plan.append(("sync", i, syncs[i]))
    with tempfile.TemporaryDirectory() as tmp:
        land = Path(tmp) / "landing"
        med = {}
        for kind, i, n in plan:
            cap = f"{kind}{i}"
            extra = ["--sync-in-forward", str(n)] if n else []
            res = demo_train.run(["--world", "4", "--steps", str(a.steps), "--landing", str(land), "--capture", cap,
                                  "--job-id", "sens", *extra])
            med[cap] = statistics.median(statistics.median(r["step_times"][3:]) for r in res)
            print(f"run {cap:9s} sync/forward={n}  median step {med[cap] * 1e3:6.2f} ms", flush=True)
        T = {c: read_timings(land / "timings" / c) for c in med}
        healthy = [c for c in med if c.startswith("healthy")]
        base = statistics.median(med[c] for c in healthy)
        hist_all = pl.concat([T[c] for c in healthy])
        ths = [float(x) for x in a.thresholds.split(",")]
        flagged = {th: 0 for th in ths}
        alarms = {th: 0 for th in ths}

        def decide(summ, tally):
            ks, p = summ["ks_vs_history"][0], summ["p_value"][0]
            for th in ths:
                tally[th] += bool(ks is not None and ks > th and p < 1e-3)
            return ks

        print("\nsync runs vs pooled healthy history:")
        for kind, i, n in plan:
            if kind != "sync":
                continue
            cap = f"sync{i}"
            rows, summ = issue_stall_rows(T[cap], hist_all, job_id="sens")
            ks = decide(summ, flagged)
            print(f"  sync/forward={n}: slowdown {100 * (med[cap] / base - 1):+6.1f} %  one-sided KS {ks:.3f}  "
                  f"-> {'FLAGGED ' + rows[0]['team'] if rows else 'not flagged'}")
        fa = 0
        print("healthy runs, leave-one-out:")
        for c in healthy:
            hist = pl.concat([T[o] for o in healthy if o != c])
            rows, summ = issue_stall_rows(T[c], hist, job_id="sens")
            decide(summ, alarms)
            fa += bool(rows)
            print(f"  {c}: step {100 * (med[c] / base - 1):+6.1f} % vs median, KS {summ['ks_vs_history'][0]:.3f} -> "
                  f"{'FALSE ALARM' if rows else 'ok'}")
        print(f"false alarms at the default threshold: {fa}/{len(healthy)}")
        n_sync = sum(1 for k, _, _ in plan if k == "sync")
        for th in ths:
            print(f"threshold {th:.2f}: sync runs flagged {flagged[th]}/{n_sync}, healthy false alarms {alarms[th]}/{len(healthy)}")


if __name__ == "__main__":
    main()
