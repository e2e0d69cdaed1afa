"""End to end on the ground-truth simulator: what lands (traces, timings, hw) -> patterns ->
verdicts, scored against the scenario's truth rows (which the analysis never sees)."""
import json

import polars as pl

import fleetscope.sim.capture as sim

from fleetscope.ingest.hw import read_hw  # noqa: E402
from fleetscope.ingest.timings import read_capture_layout, read_timings  # noqa: E402
from fleetscope.perftracker.analyze import diagnose_trace_capture  # noqa: E402
from fleetscope.ingest.traces import read_capture  # noqa: E402


def _diagnose(tmp_path, scenario):
    landing, truth = sim.scenario_capture(tmp_path / scenario, scenario, 0)
    cap_dir = next((landing / "traces").iterdir())
    cap = cap_dir.name
    hw = pl.concat([read_hw(p).kept for p in sorted((landing / "hw").iterdir())])
    pats, verdicts = diagnose_trace_capture(read_capture(cap_dir, cap), cap, hw=hw, timings=read_timings(landing / "timings" / cap, cap),
                                            layout=read_capture_layout(cap_dir))
    return pats, verdicts.filter(pl.col("severity").is_in(["warning", "critical"])), truth


def test_healthy_capture_raises_nothing(tmp_path):
    pats, loud, truth = _diagnose(tmp_path, "healthy")
    assert truth == []
    assert pats.height > 100 and pats["rank"].n_unique() == 16
    assert loud.height == 0, loud["explanation"].to_list()


def test_nvlink_down_names_the_collective_the_workers_and_operations(tmp_path):
    pats, loud, truth = _diagnose(tmp_path, "nvlink_down")
    t = pl.DataFrame(truth)
    want_ranks = set(t["rank"].to_list())
    hit = loud.filter(pl.col("subject") == t["kernel"][0])
    assert hit.height == 1
    assert hit["team"][0] == t["team"][0] == "operations"
    ev = json.loads(hit["evidence"][0])
    assert set(ev["ranks"]) == want_ranks
    assert ev["dimension"] == "mu"
    # the down GPUs move their intra-host traffic over PCIe: measured on that link
    res = pats.filter(pl.col("function") == t["kernel"][0], pl.col("rank").is_in(list(want_ranks)))["resource"]
    assert set(res) == {"pcie"}
    # nothing is reported on workers outside the fault
    for e in loud["evidence"].to_list():
        assert set(json.loads(e)["ranks"]) <= want_ranks
