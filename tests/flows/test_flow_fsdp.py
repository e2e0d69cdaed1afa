"""The flow analytics on real FSDP2 jobs (tests/data/flow_fsdp: gloo, 2 and 4 ranks; truth from the
scripts' logs). Their traffic streams through every step (each unit's all-gathers and
reduce-scatters), so no quiet time marks where a step ends: the job is found whole, its step time
comes from its flows' repetition at the step's scale (period.step_scale_period: jobs.repeat_period_ns),
and its steps are withheld with that reason rather than split at the wrong gaps. The bars held on the held-out
recordings when they were first scored (benchmarks/flows_accuracy.py prints the figures)."""
from pathlib import Path

import polars as pl
import pytest

from tests.flows.recordings import recorded_runs

ROOT = Path(__file__).resolve().parents[1] / "data" / "flow_fsdp"


@pytest.fixture(scope="module")
def runs():
    return recorded_runs(ROOT, 4)


def _truth_step_ns(r) -> float:
    t = r["_truth"]["steps"]
    return float((t["end_ns"] - t["start_ns"]).median())


def test_an_fsdp_job_is_found_whole(runs):
    bad = {k: (r["jobs_exact"], r["jobs_found"]) for k, r in runs.items()
           if r["jobs_exact"] < 1 or r["jobs_found"] != r["jobs_true"]}
    assert not bad, bad


def test_an_fsdp_jobs_pace_comes_from_its_flows_repetition_not_its_units_rhythm(runs):
    # (these jobs accumulate over at most two microbatches: the step's own pattern is clear)
    off = {}
    for k, r in runs.items():
        jobs = r["_tables"]["jobs"].filter(pl.col("n_gpus") >= 2)
        got = jobs["repeat_period_ns"].drop_nulls().to_list()
        true = _truth_step_ns(r)
        if not got or any(abs(g / true - 1) > 0.03 for g in got):
            off[k] = ([round(g / 1e6, 1) for g in got], round(true / 1e6, 1))
    assert not off, off


def test_an_fsdp_jobs_steps_are_withheld_with_their_reason_not_split_at_the_wrong_gaps(runs):
    bad = {}
    for k, r in runs.items():
        n_steps = r["_tables"]["step_timelines"].height
        said = [n for n in r["notes"] if "streams through its steps" in n]
        if n_steps or not said:
            bad[k] = (n_steps, r["notes"])
    assert not bad, bad


def test_a_healthy_fsdp_job_raises_nothing(runs):
    loud = {k: r["verdicts_loud"] for k, r in runs.items() if r["verdicts_loud"]}
    assert not loud, loud
