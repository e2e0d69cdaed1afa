"""Scoring against ground truth (used by tests and benchmarks; the algorithms never see it).

The scorer lives in fleetscope.sim.scoring (it counts misses and false labels: pairs over the union
of true and labelled pairs, spurious steps, false alarms per job-hour); these are the names the
flow tests and benchmarks have always called."""
from __future__ import annotations

import polars as pl

from fleetscope.sim.scoring import score_jobs, score_pairs, score_steps, score_tables, score_verdicts  # noqa: F401


def job_sets_exact(job_clusters: pl.DataFrame, truth_jobs: pl.DataFrame) -> tuple[int, int, int]:
    """(exact, n_true, n_found): true jobs (job_id, ip) whose ip set equals one found job's."""
    s = score_jobs(job_clusters, truth_jobs)
    return s["jobs_exact"], s["jobs_true"], s["jobs_found"]


def comm_type_accuracy(comm_pairs: pl.DataFrame, truth_pairs: pl.DataFrame, col: str = "comm_type") -> tuple[float, int]:
    """(accuracy, n) over the union of true DP/PP pairs and pairs labelled DP/PP by `col` (comm_type,
    or raw_type = no refinement): a true pair absent or mislabelled is wrong, and so is a DP/PP
    label on a pair that is not a true one."""
    s = score_pairs(comm_pairs, truth_pairs, None, col)
    return s["pair_accuracy"], s["pairs_union"]


def step_errors(steps: pl.DataFrame, truth_steps: pl.DataFrame) -> pl.DataFrame:
    """Match each reconstructed step (start observed) to the true step of the same ip with the
    nearest end; rel_err = |reconstructed - true duration| / true duration. Coverage and spurious
    steps: fleetscope.sim.scoring.score_steps."""
    s = steps.filter("start_observed").select("ip", "start_ns", "end_ns").sort("ip", "end_ns")
    t = truth_steps.select("ip", t_start=pl.col("start_ns"), t_end=pl.col("end_ns")).sort("ip", "t_end")
    j = s.join_asof(t, left_on="end_ns", right_on="t_end", by="ip", strategy="nearest", check_sortedness=False)
    return j.with_columns(
        rel_err=((pl.col("end_ns") - pl.col("start_ns")) - (pl.col("t_end") - pl.col("t_start"))).abs()
        / (pl.col("t_end") - pl.col("t_start")))
