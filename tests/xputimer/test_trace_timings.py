"""Profiler traces as timings, on the real recordings (tests/data/recordings, real gloo jobs): the
op rows derived from each trace's step structure against the op rows the ranks logged themselves
during the same steps (written by the training script, never read by the derivation), and a
trace-only capture going through the platform: XPUTimer and PRISM tables in the warehouse, the
straggler of the straggler recording found from its traces alone."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from fleetscope.ingest.timings import read_timings
from fleetscope.ingest.trace_timings import ops_from_trace_events, timings_from_trace_events
from fleetscope.ingest.traces import read_capture

RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "recordings"
CAPTURES = sorted(p for p in RECORDINGS.glob("*/landing/traces/*") if p.is_dir())
KEY = ["rank", "step", "name"]


def test_every_recording_has_traced_windows():
    assert len(CAPTURES) == 16, CAPTURES  # 4 scenarios x 2 jobs x 2 windows: a missing folder must fail


def _nth(x: pl.DataFrame, col: str) -> pl.DataFrame:
    """Ops matched by name and order within the rank's step (microbatch labels of fused p2p slots
    follow conventions: the recorder labels a fused send+recv with the forward microbatch)."""
    return x.sort("start_ns").with_columns(k=pl.int_range(pl.len()).over(KEY)).select(
        *KEY, "k", (pl.col("end_ns") - pl.col("start_ns")).alias(col))


@pytest.mark.parametrize("cap", CAPTURES, ids=lambda p: f"{p.parts[-4]}-{p.name[-12:]}")
def test_ops_derived_from_traces_match_what_the_ranks_logged(cap):
    ev = read_capture(cap)
    layout = json.loads((cap / "capture.json").read_text()).get("parallel")
    ops = ops_from_trace_events(ev, layout)
    truth = read_timings(cap.parents[1] / "timings" / cap.name).filter(pl.col("kind") == "op")
    steps = ev.filter(pl.col("name").str.starts_with("ProfilerStep#"))["name"].str.extract(r"#(\d+)").cast(pl.Int64).unique()
    assert sorted(ops["step"].unique().to_list()) == sorted(steps.to_list())
    truth = truth.filter(pl.col("step").is_in(steps.implode()))
    j = _nth(truth, "d_true").join(_nth(ops, "d"), on=[*KEY, "k"], how="full", coalesce=True)
    missed, spurious = j.filter(pl.col("d").is_null()), j.filter(pl.col("d_true").is_null())
    assert missed.height == 0 and spurious.height == 0, (missed, spurious)
    err = (j["d"] - j["d_true"]).abs()
    assert err.median() < 2e6  # ms-level agreement on the typical op
    assert ((err <= 5e6) | (err <= 0.1 * j["d_true"])).mean() >= 0.9
    if layout:  # stage and dp_rank from the capture's layout (Megatron order), as the ranks logged them
        lay = truth.select("rank", "stage", "dp_rank").unique().sort("rank")
        assert ops.select("rank", "stage", "dp_rank").unique().sort("rank").rows() == lay.rows()


def test_cpu_trace_timings_keep_groups_apart():
    """gloo annotations carry no process-group name in torch 2.13's CPU traces: their collectives
    are timed (communication time, p2p bandwidth) but not matched across ranks into instances of a
    made-up group (the DP all-reduces of different pipeline stages are different collectives)."""
    from fleetscope.xputimer import metrics as M

    cap = next(c for c in CAPTURES if c.parts[-4] == "healthy" and (c / "capture.json").read_text().count('"pp": 2'))
    t = timings_from_trace_events(read_capture(cap))
    ar = t.filter(pl.col("name") == "gloo:AllReduce")
    assert ar.height > 0 and ar["group"].null_count() == ar.height and (ar["bytes"] > 0).all()
    inst = M.comm_instances(t)
    assert inst.filter(pl.col("collective") == "allreduce").height == 0
    assert inst.filter(pl.col("collective").is_in(["send", "recv"])).height > 0


def _straggler_truth() -> tuple[str, int]:
    (row,) = list(csv.DictReader((RECORDINGS / "straggler" / "ground_truth" / "faults.csv").open()))
    return row["captures"], int(row["ranks"])


@pytest.mark.slow
def test_trace_only_capture_gets_xputimer_and_prism_in_the_warehouse(fleet_env):
    """The straggler recording's PP job, traces only (its timings folders left out): both windows
    get XPUTimer and PRISM tables through the platform; the window with the fault names the rank
    the recorder slowed (ground_truth/faults.csv), the window before it does not."""
    from fleetscope.jobs.runner import run_all
    from fleetscope.warehouse import Warehouse

    landing, warehouse, _ = fleet_env
    faulty, rank = _straggler_truth()
    job = faulty.split("-")[0]
    src = RECORDINGS / "straggler" / "landing" / "traces"
    caps = sorted(p.name for p in src.iterdir() if p.name.startswith(job))
    assert faulty in caps and len(caps) == 2
    for c in caps:
        shutil.copytree(src / c, landing / "traces" / c)
    report = run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    assert not report.failed
    wh = Warehouse(warehouse)
    assert wh.read("timings").height == 0  # nothing but traces landed
    for c in caps:
        st = wh.read("xputimer_step_throughput", partitions=[c])
        prof = wh.read("trace_events", partitions=[c]).filter(pl.col("name").str.starts_with("ProfilerStep#"))
        assert sorted(st["step"].to_list()) == sorted({int(n.split("#")[1]) for n in prof["name"].to_list()})
        vm = wh.read("variability_models", partitions=[c])
        assert {"forward-compute", "backward-compute", "forward-send", "backward-recv"} <= set(vm["op_name"].to_list())
        assert wh.read("step_forecasts", partitions=[c]).height > 0
    sm = wh.read("xputimer_stage_metrics", partitions=[faulty]).sort("compute_ratio_to_median", descending=True)
    assert sm["rank"][0] == rank and sm["compute_ratio_to_median"][0] > 1.5
    before = [c for c in caps if c != faulty][0]
    assert wh.read("xputimer_stage_metrics", partitions=[before])["compute_ratio_to_median"].max() < 1.3
    v = wh.read("anomaly_verdicts").filter(pl.col("severity").is_in(["warning", "critical"]) & (pl.col("scope") == "rank"))
    assert set(v.filter(pl.col("capture_id") == faulty)["subject"].to_list()) == {str(rank)}
    assert v.filter(pl.col("capture_id") == before).height == 0


@pytest.mark.parametrize("scenario,seed", [("healthy", 3), ("slow_stage_worker", 4)])
def test_ops_derived_from_gpu_traces_match_the_simulators_timings(tmp_path, scenario, seed):
    """GPU traces (the simulator's Megatron-like captures: backward on the autograd engine's thread,
    tensor-parallel all-reduces between the forward's operators, python frames around the optimizer):
    per rank the same forward / backward microbatches as the timings the simulator wrote for the same
    steps (never read by the derivation), each op's span on the device within a few percent."""
    from fleetscope.sim.capture.scenarios import scenario_capture

    landing, _ = scenario_capture(tmp_path, scenario, seed=seed)
    cap = next((landing / "traces").iterdir())
    ops = ops_from_trace_events(read_capture(cap))
    truth = read_timings(landing / "timings" / cap.name).filter(pl.col("kind") == "op")
    comp = ["forward-compute", "backward-compute"]
    count = lambda x: x.filter(pl.col("name").is_in(comp)).group_by("rank", "step", "name").len().sort("rank", "step", "name")  # noqa: E731
    assert count(ops).equals(count(truth.filter(pl.col("step").is_in(ops["step"].unique().implode()))))
    j = _nth(truth.filter(pl.col("name").is_in(comp)), "d_true").join(_nth(ops.filter(pl.col("name").is_in(comp)), "d"), on=[*KEY, "k"])
    rel = ((j["d"] - j["d_true"]).abs() / j["d_true"])
    assert rel.median() < 0.05 and rel.quantile(0.9) < 0.15, rel.describe()
    assert {"grads-all-reduce", "optimizer"} <= set(ops["name"].to_list())


def test_step_throughput_names_the_lowest_of_ranks_with_equal_spans():
    """Ranks whose steps span the same time: the slowest rank is the lowest of them, whatever the row order."""
    from fleetscope.xputimer.metrics import step_throughput

    for order in ([6, 2, 4], [4, 6, 2], [2, 4, 6]):
        t = pl.DataFrame({"capture_id": "c", "rank": order, "kind": "kernel", "name": "gemm", "step": 1, "issue_ns": 0,
                          "start_ns": 0, "end_ns": 1000}).with_columns(pl.col("rank").cast(pl.Int32))
        assert step_throughput(t)["slowest_rank"].to_list() == [2], order
