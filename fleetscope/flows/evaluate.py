"""Scoring against ground truth (used by tests and benchmarks; the algorithms never see it)."""
from __future__ import annotations

import polars as pl


def job_sets_exact(job_clusters: pl.DataFrame, truth_jobs: pl.DataFrame) -> tuple[int, int, int]:
    """(exact, n_true, n_found): true jobs (job_id, ip) whose ip set equals one found job's."""
    found = {frozenset(g["ip"].to_list()) for _, g in job_clusters.group_by("job_id")}
    true = {frozenset(g["ip"].to_list()) for _, g in truth_jobs.group_by("job_id")}
    return len(found & true), len(true), len(found)


def comm_type_accuracy(comm_pairs: pl.DataFrame, truth_pairs: pl.DataFrame, col: str = "comm_type") -> tuple[float, int]:
    """Share of true DP/PP pairs labeled right by `col` (comm_type, or raw_type = no refinement);
    a true pair absent from comm_pairs counts as wrong."""
    t = truth_pairs.filter(pl.col("comm_type").is_in(["DP", "PP"])).with_columns(
        a=pl.min_horizontal("ip_a", "ip_b"), b=pl.max_horizontal("ip_a", "ip_b")).select(
        ip_a="a", ip_b="b", truth="comm_type")
    j = t.join(comm_pairs.select("ip_a", "ip_b", got=pl.col(col)), on=["ip_a", "ip_b"], how="left")
    if j.height == 0:
        return float("nan"), 0
    return float((j["got"] == j["truth"]).fill_null(False).mean()), j.height


def step_errors(steps: pl.DataFrame, truth_steps: pl.DataFrame) -> pl.DataFrame:
    """Match each reconstructed step (start observed) to the true step of the same ip with the
    nearest end; rel_err = |reconstructed - true duration| / true duration."""
    s = steps.filter("start_observed").select("ip", "start_ns", "end_ns").sort("ip", "end_ns")
    t = truth_steps.select("ip", t_start=pl.col("start_ns"), t_end=pl.col("end_ns")).sort("ip", "t_end")
    j = s.join_asof(t, left_on="end_ns", right_on="t_end", by="ip", strategy="nearest", check_sortedness=False)
    return j.with_columns(
        rel_err=((pl.col("end_ns") - pl.col("start_ns")) - (pl.col("t_end") - pl.col("t_start"))).abs()
        / (pl.col("t_end") - pl.col("t_start")))
