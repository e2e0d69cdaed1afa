"""XPUTimer's two entry points, each returning the Analysis (fleetscope.analysis) the assets write:
a capture's timings -> the aggregated metric tables, degradation (PerfTracker 4.1) and verdicts;
a hang incident's stack dumps (and ring progress) -> the per-rank picture and the culprit."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetscope.analysis import Analysis, skipped
from fleetscope.findings.verdicts import make_verdicts
from fleetscope.xputimer.degradation import degradation_verdicts, detect_degradation
from fleetscope.xputimer.detectors import analyze
from fleetscope.xputimer.flight import dump_files
from fleetscope.xputimer.hang import diagnose_hang

METRIC_TABLES = ("xputimer_step_throughput", "xputimer_job_throughput", "xputimer_kernel_flops", "xputimer_comm_instances",
                 "xputimer_comm_bandwidth", "xputimer_issue_latency", "xputimer_issue_latency_summary", "xputimer_void",
                 "xputimer_stage_metrics", "xputimer_iterations", "xputimer_degradations")


def analyze_capture(timings: pl.DataFrame, history: pl.DataFrame | None = None, job_id: str | None = None) -> Analysis:
    """history: timings of the same job's earlier captures (its own baseline for issue latency and
    void percentages)."""
    if timings.height == 0:
        return skipped("no timings in this capture (traces only): nothing to aggregate")
    out = analyze(timings, history=history, job_id=job_id)
    its, deg = detect_degradation(timings)
    out["xputimer_iterations"], out["xputimer_degradations"] = its, deg
    verdicts = make_verdicts(pl.concat([out.pop("verdicts"), degradation_verdicts(deg, job_id)], how="diagonal_relaxed"))
    notes = [] if history is not None and history.height else \
        ["no earlier capture of this job: issue latency and void percentages compared with fixed bounds only"]
    return Analysis(tables={k: out[k] for k in METRIC_TABLES}, verdicts=verdicts, notes=notes)


def analyze_hang(incident_dir: str | Path, job_id: str | None = None) -> Analysis:
    """stacks/<incident>/: rank<R>.txt stack dumps, fr_rank<R>.json collective progress (Flight
    Recorder or the tracer's), ring.json -> xputimer_hang_ranks, xputimer_hang_collectives and the
    hang verdict."""
    folder = Path(incident_dir)
    if not folder.is_dir() or not (any(folder.glob("rank*.txt")) or dump_files(folder)):
        return skipped("no stack dumps or collective progress for this incident")
    h = diagnose_hang(folder, job_id=job_id)
    return Analysis(tables={"xputimer_hang_ranks": h.ranks, "xputimer_hang_collectives": h.collectives},
                    verdicts=h.verdicts, notes=list(h.notes))
