"""The real traces made by others go through the same path as users' files: every file is
registered and ingested, ranks and layouts come out right; the one trace whose rank cannot be
known (a rank of an NCCL job without distributedInfo, under a name with no rank in it) is
quarantined with the reason, not read as rank 0."""
import polars as pl
import pytest

from tests.paths import REAL
from fleetscope.ingest.real_data import layout_real_landing
from fleetscope.warehouse import Warehouse
from fleetscope.jobs.runner import run_all


@pytest.mark.slow
def test_every_real_file_is_ingested(fleet_env):
    landing, warehouse, _ = fleet_env
    placed = layout_real_landing(REAL, landing)
    report = run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    assert not report.failed
    wh = Warehouse(warehouse)
    rej = wh.read("rejected_records")
    assert rej["source_file"].to_list() == ["traces/hta-distributed-info-unavailable/distributed_info_unavailable__distributed_info_not_found.json.gz"]
    assert "cannot tell which rank" in rej["reason"][0]
    # every placed file is registered; the rest are the incident requests `fleetscope run` filed itself
    # for the critical problems it found (fleetscope.jobs.planner)
    landed = wh.read("landed_files")
    filed = landed.filter(pl.col("path").str.starts_with("incidents/") & pl.col("path").str.contains("-critical-"))
    assert landed.height - filed.height == len(placed)
    assert sorted(filed["path"].to_list()) == sorted(f"incidents/{n}" for n in report.filed)
    ev = wh.sql("SELECT source_file, count(*) AS n, min(rank) AS r, count(*) FILTER (WHERE cat = 'kernel') AS k "
                "FROM trace_events GROUP BY 1")
    traces = [d for _, d in placed if d.startswith("traces/") and "distributed_info_unavailable" not in d]
    assert sorted(ev["source_file"].to_list()) == sorted(traces)
    assert (ev["n"] > 0).all()
    by = {r["source_file"]: r for r in ev.iter_rows(named=True)}
    assert by["traces/hta-sampled-128rank/rank1.json.gz"]["r"] == 1
    cpu = [f for f in by if "cpu_only" in f][0]
    assert by[cpu]["k"] == 0 and by[cpu]["r"] == 34   # CPU-only gloo rank 34 of a 300-rank job
    amd = [f for f in by if "amd_trace" in f][0]
    assert by[amd]["k"] > 0
    caps = wh.read("captures").filter(pl.col("capture_id") == "straggler-ST")
    assert caps.select("dp", "pp", "tp").row(0) == (2, 4, 1)
    t = wh.read("timings")
    assert t.height == 6784 and t["stage"].n_unique() == 4
