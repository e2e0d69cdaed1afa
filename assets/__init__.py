"""Dagster assets, grouped by domain; each module is thin wiring over a fleetscope.* analysis.

PARTITIONED maps each dynamic partition set to the assets partitioned by it (one job each)."""
from __future__ import annotations

from fleetscope.assets import ingest
from fleetscope.assets.partitions import captures, flow_files, flow_windows, hw_files, incidents, topology_files

ASSET_MODULES = [ingest]
for _name in ("flows_analysis", "traces_analysis", "perftracker_analysis", "xputimer_analysis",
              "prism_analysis", "operations"):
    try:  # analysis modules are added as their libraries land; each is optional wiring
        ASSET_MODULES.append(__import__(f"fleetscope.assets.{_name}", fromlist=["_"]))
    except ModuleNotFoundError as exc:
        if exc.name != f"assets.{_name}":
            raise

ALL_ASSETS = [a for m in ASSET_MODULES for a in getattr(m, "ASSETS", getattr(m, "INGEST_ASSETS", []))]
ALL_ASSET_CHECKS = [c for m in ASSET_MODULES for c in getattr(m, "ASSET_CHECKS", [])]


def assets_partitioned_by(pdef) -> list:
    return [a for a in ALL_ASSETS if getattr(a, "partitions_def", None) == pdef]


def unpartitioned_assets() -> list:
    return [a for a in ALL_ASSETS if getattr(a, "partitions_def", None) is None]


PARTITION_SETS = [topology_files, flow_files, hw_files, captures, incidents, flow_windows]
