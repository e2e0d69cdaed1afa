"""XPUTimer's detectors on the real recordings (tests/data/recordings: real gloo jobs in network
namespaces, faults injected by the recorder; data nobody tuned a threshold on): per recording, job
and window, the warning/critical verdicts against the ground truth (faults.csv: which job, window
and rank the fault touched). Each window is judged with the job's other window as its history
(its own earlier capture, as the platform does), and without history.

    .venv/bin/python -m benchmarks.xputimer_recordings

Prints one line per window (truth, verdicts) and the counts: windows with a fault the detectors
should see, and false verdicts on windows without one."""
from __future__ import annotations

import csv
from pathlib import Path

import polars as pl

REC = Path(__file__).resolve().parents[1] / "tests" / "data" / "recordings"


def main(argv=None):
    from fleetscope.ingest.timings import read_timings
    from fleetscope.xputimer import analyze_capture

    n_false = n_faulty = n_found = n_clean = 0
    for scen in sorted(p.name for p in REC.iterdir() if p.is_dir()):
        gt = REC / scen / "ground_truth"
        faults = list(csv.DictReader((gt / "faults.csv").open()))
        caps = {r["capture_id"]: r for r in csv.DictReader((gt / "captures.csv").open())}
        tdir = REC / scen / "landing" / "timings"
        by_job: dict[str, list[str]] = {}
        for c in sorted(p.name for p in tdir.iterdir()):
            by_job.setdefault(caps[c]["job_id"], []).append(c)
        for job, cs in by_job.items():
            frames = {c: read_timings(tdir / c) for c in cs}
            for c in cs:
                other = [o for o in cs if o != c]
                for hist_name, hist in (("other window", frames[other[0]] if other else None), ("none", None)):
                    a = analyze_capture(frames[c], history=hist, job_id=job)
                    bad = a.verdicts.filter(pl.col("severity").is_in(["warning", "critical"]))
                    touched = [f for f in faults if job in f["affected_jobs"].split("|") and c in f["captures"].split("|")]
                    got = sorted(set(bad.select("detector", "metric", "scope", "subject", "team").rows()))
                    truth = [(f["kind"], f["scope"], f["subject"], "ranks=" + f["ranks"], f["team"]) for f in touched]
                    if touched:
                        n_faulty += 1
                        n_found += bool(got)
                    else:
                        n_clean += 1
                        n_false += len(got)
                    print(f"{scen:17s} {c:28s} history={hist_name:12s} truth={truth or 'none'}  verdicts={got or 'none'}")
    print(f"\nwindows with a fault touching the job: {n_faulty}, with at least one verdict: {n_found}")
    print(f"windows without a fault: {n_clean}, warning/critical verdicts on them: {n_false}")


if __name__ == "__main__":
    main()
