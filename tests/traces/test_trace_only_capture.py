"""A capture of nothing but PyTorch profiler traces, as most users will land it (issue 23), through the
real Dagster jobs and warehouse: a held-out real gloo job (tests/data/heldout/pp2_dp2, made by
benchmarks/traces_heldout_job.py: torch.distributed.pipelining 1F1B, DeviceMesh groups, layers no
span names; no capture.json, no timings) gets its layout in `captures` / `capture_ranks` as the job
wrote it in its truth files (never read by the platform), and every capture analysis: DP / PP / layer
what-ifs, a baseline step forecast, variability models and XPUTimer throughput. A real trace with no
ProfilerStep# annotation (an HTA inference benchmark) says in the run summary what it cannot give."""
import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.paths import REAL

HELDOUT = Path(__file__).resolve().parents[1] / "data" / "heldout" / "pp2_dp2"
NO_STEPS = REAL / "hta" / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"


@pytest.mark.slow
def test_trace_only_capture_gets_its_layout_and_every_analysis(fleet_env):
    from fleetscope.jobs.runner import run_all
    from fleetscope.warehouse import Warehouse

    landing, warehouse, _ = fleet_env
    (landing / "traces" / "ho").mkdir(parents=True)
    for f in HELDOUT.glob("*.pt.trace.json.gz"):
        shutil.copy(f, landing / "traces" / "ho" / f.name)
    (landing / "traces" / "nosteps").mkdir()
    shutil.copy(NO_STEPS, landing / "traces" / "nosteps" / "rank0.json.gz")
    report = run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    assert not report.failed
    wh = Warehouse(warehouse)
    truth = [json.loads(f.read_text()) for f in sorted((HELDOUT / "truth").glob("rank*.json"))]
    cap = wh.read("captures", partitions=["ho"]).row(0, named=True)
    assert (cap["pp"], cap["dp"], cap["tp"], cap["world_size"]) == (truth[0]["pp"], truth[0]["dp"], 1, len(truth))
    assert cap["layout_source"].startswith("traces:")
    ranks = wh.read("capture_ranks", partitions=["ho"]).sort("rank")
    assert ranks.select("stage", "dp_rank").rows() == [(t["stage"], t["dp_rank"]) for t in sorted(truth, key=lambda t: t["rank"])]
    scen = set(wh.read("whatif", partitions=["ho"])["scenario"].to_list())
    assert {"dp_x2", "dp_half", "pp_x2", "pp_half", "layers_x2"} <= scen, scen
    fc = wh.read("step_forecasts", partitions=["ho"])
    assert fc.filter(pl.col("scenario") == "baseline").height == 1
    vm = wh.read("variability_models", partitions=["ho"])
    assert {"forward-compute", "backward-compute"} <= set(vm["op_name"].to_list())
    steps = wh.read("trace_events", partitions=["ho"]).filter(pl.col("name").str.starts_with("ProfilerStep#"))["name"].unique()
    assert wh.read("xputimer_step_throughput", partitions=["ho"])["step"].n_unique() == steps.len()
    # the capture without steps: its notes and the run summary say why its step analyses are empty
    nos = wh.read("captures", partitions=["nosteps"]).row(0, named=True)
    assert "ProfilerStep#" in (nos["notes"] or "")
    said = " ".join(note for (key, note) in report.notes if key == "nosteps")
    assert "ProfilerStep#" in said and "no op rows" in said, report.notes
