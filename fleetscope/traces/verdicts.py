"""Verdicts from a replay and its what-ifs (through fleetscope.findings.verdicts.make_verdicts).

  detector traces.sync_cost      removing the synchronizing calls would speed the iteration up by
                                 more than SYNC_GAIN (info only: pipelines legitimately synchronize,
                                 and the simulator's healthy 1F1B job gains 12 % without its syncs)
  detector traces.gpu_idle       the GPU is idle for more than IDLE_SHARE of the iterations while the
                                 CPU runs: CPU- or input-bound loop (team algorithm)
  detector traces.exposed_comm   communication not overlapped with compute takes more than
                                 EXPOSED_COMM_SHARE of the iterations (team infrastructure: overlap,
                                 bucket sizes, fabric); about the job, a symptom, never a rank's fault
  detector traces.replay_error   the replay misses the measured iterations by more than 5 %: the
                                 graph does not explain this capture (info only)

Shares are measured on the trace (actual_* breakdown), mean over iterations, worst rank."""
from __future__ import annotations

import json

import polars as pl

from fleetscope.findings.verdicts import make_verdicts

SYNC_GAIN = 0.05
IDLE_SHARE = 0.10
EXPOSED_COMM_SHARE = 0.40
REPLAY_ERROR_PCT = 5.0


def trace_verdicts(replays: pl.DataFrame, whatif: pl.DataFrame | None = None, job_id: str | None = None) -> pl.DataFrame:
    """replays (+ optional whatif with a `no_sync` remove_sync scenario) -> anomaly_verdicts rows."""
    rows = []
    if replays.height:
        cid = replays["capture_id"][0]
        per = replays.group_by("rank").agg(
            idle=(pl.col("actual_idle_ns").sum() / pl.col("actual_ns").sum()),
            comm=(pl.col("actual_exposed_comm_ns").sum() / pl.col("actual_ns").sum()),
            err=pl.col("error_pct").mean(),
            start=pl.col("actual_ns").sum())
        base = {"job_id": job_id, "capture_id": cid}
        gpu_ranks = per.filter(pl.col("idle") < 1.0)  # a rank with no GPU activity at all is CPU-only
        # ties (ranks alike to the nanosecond) go to the lowest rank: the same capture names the same rank every run
        worst = gpu_ranks.sort(["idle", "rank"], descending=[True, False]).row(0, named=True) if gpu_ranks.height else {"idle": 0.0}
        if worst["idle"] > IDLE_SHARE:
            rows.append({**base, "detector": "traces.gpu_idle", "scope": "rank", "subject": str(worst["rank"]),
                         "metric": "gpu_idle_share", "value": worst["idle"], "baseline": IDLE_SHARE,
                         "severity": "critical" if worst["idle"] > 0.5 else "warning", "team": "algorithm",
                         "explanation": f"rank {worst['rank']}: the GPU is idle {worst['idle']:.0%} of the iteration time "
                                        "while the CPU works: the loop is CPU- or input-bound (data loading, Python "
                                        "overhead, small kernels).",
                         "evidence": json.dumps({"ranks_over": int((per["idle"] > IDLE_SHARE).sum())})})
        worst = per.sort(["comm", "rank"], descending=[True, False]).row(0, named=True)
        if worst["comm"] > EXPOSED_COMM_SHARE:
            # a symptom of the job (its communication waits: a slow link or switch, too little overlap),
            # not a fault of the rank that shows it most
            rows.append({**base, "detector": "traces.exposed_comm", "scope": "job", "subject": job_id or cid,
                         "metric": "exposed_comm_share", "value": worst["comm"], "baseline": EXPOSED_COMM_SHARE,
                         "severity": "warning", "team": "infrastructure",
                         "evidence": json.dumps({"worst_rank": int(worst["rank"]),
                                                 "ranks_over": int((per["comm"] > EXPOSED_COMM_SHARE).sum())}),
                         "explanation": f"communication not overlapped with compute takes {worst['comm']:.0%} of the "
                                        f"iteration time (rank {worst['rank']}, the worst): the job waits on its "
                                        "collectives (a slow link or switch on their path, or too little overlap)."})
        worst = per.sort(["err", "rank"], descending=[True, False]).row(0, named=True)
        if worst["err"] > REPLAY_ERROR_PCT:
            rows.append({**base, "detector": "traces.replay_error", "scope": "rank", "subject": str(worst["rank"]),
                         "metric": "replay_error_pct", "value": worst["err"], "baseline": REPLAY_ERROR_PCT,
                         "severity": "info", "team": "infrastructure",
                         "explanation": f"the replay misses rank {worst['rank']}'s iterations by {worst['err']:.1f} % on "
                                        "average: its execution graph leaves dependencies out; what-if results for "
                                        "this capture are less reliable."})
    if whatif is not None and whatif.height:
        ns = whatif.filter(pl.col("parameters").str.contains('"edit": "remove_sync"'))
        if ns.height:
            r = ns.row(0, named=True)
            gain = 1 - r["predicted_ns"] / r["baseline_ns"]
            if gain > SYNC_GAIN:
                rows.append({"job_id": job_id, "capture_id": r["capture_id"], "detector": "traces.sync_cost", "scope": "job",
                             "subject": job_id or r["capture_id"], "metric": "sync_removal_gain", "value": gain,
                             "baseline": SYNC_GAIN, "severity": "info", "team": "algorithm",
                             "explanation": f"host-device synchronizations (cudaStreamSynchronize / DeviceSynchronize / "
                                            f"blocking copies, e.g. .item() or .cpu() in the loop) cost {gain:.0%} of the "
                                            "iteration: without them the replayed iteration is that much shorter."})
    return make_verdicts(rows)
