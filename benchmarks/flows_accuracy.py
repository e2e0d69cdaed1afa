"""Accuracy of the flow analytics against the simulator's ground truth (which the analysis never
sees), like LLMPrism's Table I, for windows of 1, 3, 5 and 10 minutes:

- job recognition: true jobs whose GPU set is found exactly / true jobs (found jobs in brackets)
- comm-type accuracy of DP/PP pairs, with and without DP-transitivity refinement (raw_type is the
  size-count rule, with the timing fallback, before refinement)
- step-duration error |reconstructed - true| / true: median and p99 over matched steps
- verdict precision / recall per injected fault kind: localizing verdicts (scope switch, link, gpu,
  host; warning or critical) are correct when (scope, subject) is the injected fault's
- false verdicts (warning or critical, any scope) on a healthy fleet

    .venv/bin/python -m benchmarks.flows_accuracy [--gpus 128] [--seeds 1 2] [--minutes 1 3 5 10]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from benchmarks.flows_common import load_landing, load_truth  # noqa: E402

from fleetscope.flows import analyze_window  # noqa: E402
from fleetscope.sim.scoring import comm_type_accuracy, job_sets_exact, step_errors  # noqa: E402
from fleetscope.sim import simulate  # noqa: E402

KINDS = ["congested_switch", "degraded_nic", "slow_gpu"]
LOCAL = ["switch", "link", "gpu", "host"]


def run_one(tmp: Path, gpus: int, minutes: float, faults: str, seed: int) -> dict:
    folder = tmp / f"m{minutes}-{faults or 'healthy'}-{seed}"
    simulate(folder, gpus=gpus, minutes=minutes, faults=faults, seed=seed, captures=False)
    flows, topo, _ = load_landing(folder / "landing")
    truth = load_truth(folder / "ground_truth")
    w = json.loads((folder / "ground_truth" / "summary.json").read_text())["window"]
    t = time.perf_counter()
    out = analyze_window(flows, topo, w[0], w[1])
    secs = time.perf_counter() - t
    exact, n_true, n_found = job_sets_exact(out["job_clusters"], truth["jobs"])
    acc, n_pairs = comm_type_accuracy(out["comm_pairs"], truth["pairs"])
    raw, _ = comm_type_accuracy(out["comm_pairs"], truth["pairs"], "raw_type")
    err = step_errors(out["step_timelines"], truth["steps"])["rel_err"].to_numpy()
    v = out["anomaly_verdicts"].filter(pl.col("severity").is_in(["warning", "critical"]))
    loc = v.filter(pl.col("scope").is_in(LOCAL))
    want = set(truth["faults"].select("scope", "subject").iter_rows()) if truth["faults"].height else set()
    got = list(loc.select("scope", "subject").iter_rows())
    return {"exact": exact, "n_true": n_true, "n_found": n_found, "acc_ok": acc * n_pairs, "raw_ok": raw * n_pairs,
            "n_pairs": n_pairs, "err": err, "n_loud": v.height, "tp": sum(g in want for g in got), "n_local": len(got),
            "found": len(want & set(got)), "n_faults": len(want), "secs": secs, "flows": flows.height,
            "verdicts": loc.select("detector", "scope", "subject").rows(), "want": sorted(want)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 3, 5, 10])
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="fs_flows_acc_") as td:
        tmp = Path(td)
        for m in a.minutes:
            runs = {"healthy": [run_one(tmp, a.gpus, m, "", 0)]}
            for k in KINDS:
                runs[k] = [run_one(tmp, a.gpus, m, f"{k}:1", s) for s in a.seeds]
            allr = [r for rs in runs.values() for r in rs]
            err = np.concatenate([r["err"] for r in allr])
            row = {"window_min": m,
                   "jobs_exact": f"{sum(r['exact'] for r in allr)}/{sum(r['n_true'] for r in allr)} "
                                 f"({sum(r['n_found'] for r in allr)} found)",
                   "comm_type": sum(r["acc_ok"] for r in allr) / sum(r["n_pairs"] for r in allr),
                   "comm_type_no_refine": sum(r["raw_ok"] for r in allr) / sum(r["n_pairs"] for r in allr),
                   "step_err_median": float(np.median(err)), "step_err_p99": float(np.quantile(err, 0.99)),
                   "n_steps": len(err), "healthy_false_verdicts": runs["healthy"][0]["n_loud"],
                   "analyze_s": sum(r["secs"] for r in allr), "flows": sum(r["flows"] for r in allr)}
            for k in KINDS:
                rs = runs[k]
                nl = sum(r["n_local"] for r in rs)
                row[f"{k}_recall"] = f"{sum(r['found'] for r in rs)}/{sum(r['n_faults'] for r in rs)}"
                row[f"{k}_precision"] = (sum(r["tp"] for r in rs) / nl) if nl else float("nan")
                for r in rs:
                    print(f"  {m} min {k}: want {r['want']} got {r['verdicts']}", file=sys.stderr)
            rows.append(row)
            print(row, file=sys.stderr)
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.4g}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
