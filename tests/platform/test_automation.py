"""Declarative automation: a derived asset reruns when its input partition changes (evaluated
against a real Dagster instance with the project's own definitions)."""
import json
import os
import time

from dagster import AssetKey, DagsterInstance, evaluate_automation_conditions

from fleetscope.definitions import defs
from fleetscope.jobs.runner import QUIET


def test_derived_assets_rerun_when_inputs_change(fleet_env):
    landing, warehouse, home = fleet_env
    (landing / "incidents").mkdir()
    (landing / "incidents" / "hang1.json").write_text(json.dumps({"kind": "hang", "job_id": "j"}))
    os.utime(landing / "incidents" / "hang1.json", (time.time() - 60,) * 2)
    from fleetscope.ingest.registry import register_landing
    from fleetscope.warehouse import Warehouse
    wh = Warehouse(warehouse)
    wh.init()
    reg = register_landing(landing, wh, settle_s=0)
    key = reg.to_run["incidents"][0]
    with DagsterInstance.get() as instance:
        instance.add_dynamic_partitions("incidents", [key])
        graph = defs.resolve_asset_graph()
        auto_keys = [n.key for n in graph.asset_nodes if n.automation_condition is not None]
        assert AssetKey("hang_verdicts") in auto_keys
        # first evaluation: nothing materialized upstream yet -> nothing to do
        r0 = evaluate_automation_conditions(defs=defs, instance=instance)
        assert r0.get_requested_partitions(AssetKey("hang_verdicts")) == set()
        # the input partition is materialized (as the landing sensor's run would do)
        job = defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={AssetKey("incidents"), AssetKey("stacks"), AssetKey("ring_progress"), AssetKey("collective_progress")})
        assert job.execute_in_process(instance=instance, partition_key=key, run_config=QUIET).success
        r1 = evaluate_automation_conditions(defs=defs, instance=instance, cursor=r0.cursor)
        assert r1.get_requested_partitions(AssetKey("hang_verdicts")) == {key}
