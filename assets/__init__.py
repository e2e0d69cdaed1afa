"""Dagster assets, one module per domain, each thin wiring over one fleetscope analysis; every
asset key is the name of the warehouse table it writes (fleetscope.tables), except the files
people read (incident_report, fleet_health) and each analysis' verdicts asset (its slice of
anomaly_verdicts)."""
from __future__ import annotations

from fleetscope.assets import flows, ingest, operations, perftracker, prism, traces, xputimer

ASSET_MODULES = [ingest, flows, traces, perftracker, xputimer, prism, operations]
ALL_ASSETS = [a for m in ASSET_MODULES for a in m.ASSETS]
ALL_ASSET_CHECKS = [c for m in ASSET_MODULES for c in getattr(m, "ASSET_CHECKS", [])]


def assets_partitioned_by(pdef) -> list:
    return [a for a in ALL_ASSETS if getattr(a, "partitions_def", None) == pdef]


def unpartitioned_assets() -> list:
    return [a for a in ALL_ASSETS if getattr(a, "partitions_def", None) is None]
