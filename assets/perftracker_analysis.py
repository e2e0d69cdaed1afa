"""PerfTracker over a capture: behaviour patterns per (function, worker) from the profiler trace
(or op-level timings when there is no trace), localization and verdicts."""
import polars as pl
from dagster import AssetExecutionContext, AssetSpec, AutomationCondition, MaterializeResult, MetadataValue, multi_asset

from fleetscope.assets._capture import capture_hw, capture_info
from fleetscope.assets._tables import write_table, write_verdicts
from fleetscope.assets.partitions import captures
from fleetscope.perftracker.analyze import diagnose_op_capture, diagnose_trace_capture
from fleetscope.perftracker.schemas import BEHAVIOR_PATTERNS
from fleetscope.resources import WarehouseResource


@multi_asset(
    specs=[AssetSpec("behavior_patterns", partitions_def=captures, group_name="perftracker", deps=["trace_events", "timings", "hw"],
                     automation_condition=AutomationCondition.eager(), kinds={"duckdb"},
                     description="PerfTracker behaviour pattern (beta, mu, sigma) of every function on every worker, distances "
                                 "from expectation and from peers (stage-aware), abnormal flag."),
           AssetSpec("perftracker_verdicts", partitions_def=captures, group_name="perftracker", deps=["trace_events", "timings"],
                     automation_condition=AutomationCondition.eager(), kinds={"duckdb"},
                     description="The abnormal functions and the workers they are abnormal on, how they differ, and the team.")],
    can_subset=False)
def perftracker_capture(context: AssetExecutionContext, warehouse: WarehouseResource):
    wh = warehouse.get()
    key = context.partition_key
    info = capture_info(wh, key)
    ev = wh.read("trace_events", partitions=[key])
    t = wh.read("timings", partitions=[key])
    source = "none"
    if ev.height:
        hw = capture_hw(wh, ev, "ts_ns", "end_ns")
        pats, verdicts = diagnose_trace_capture(ev, key, hw=hw, timings=t if t.height else None, layout=info["layout"], job_id=info["job_id"])
        source = "trace" + (" + hw samples" if hw is not None else "")
    elif t.filter(pl.col("kind") == "op").height:
        pats, verdicts = diagnose_op_capture(t, key, job_id=info["job_id"])
        source = "op-level timings"
    else:
        from fleetscope.schemas.base import empty_frame
        from fleetscope.verdicts import make_verdicts
        pats, verdicts = empty_frame(BEHAVIOR_PATTERNS), make_verdicts([])
    _, md = write_table(wh, "behavior_patterns", key, pats, BEHAVIOR_PATTERNS)
    md["source"] = MetadataValue.text(source)
    if pats.height:
        md["abnormal"] = MetadataValue.int(int(pats["abnormal"].sum()))
    yield MaterializeResult(asset_key="behavior_patterns", metadata=md)
    yield MaterializeResult(asset_key="perftracker_verdicts", metadata=write_verdicts(wh, "perftracker", key, verdicts, capture_id=key))


ASSETS = [perftracker_capture]
