"""Shared helpers of the flow benchmarks: load a simulated landing folder and its ground truth."""
from __future__ import annotations

from pathlib import Path

import polars as pl


def load_landing(landing: Path) -> tuple[pl.DataFrame, pl.DataFrame, dict]:
    """(flows, topology, stats) through the platform ingestion (fleetscope.ingest)."""
    from fleetscope.ingest.flows import read_flows
    from fleetscope.ingest.topology import read_topology

    files = sorted(p for p in (landing / "flows").iterdir() if p.is_file())
    parts, rejected = [], 0
    for p in files:
        r = read_flows(p)
        parts.append(r.kept)
        rejected += r.rejected.height
    flows = pl.concat(parts, how="diagonal_relaxed")
    topo = pl.concat([read_topology(p).kept for p in sorted((landing / "topology").iterdir())], how="diagonal_relaxed")
    return flows, topo, {"files": len(files), "rejected": rejected, "flows": flows.height}


def load_truth(gt: Path) -> dict[str, pl.DataFrame]:
    out = {}
    for name in ("jobs", "pairs", "steps", "faults", "job_layout"):
        p = gt / f"{name}.csv"
        out[name] = pl.read_csv(p, infer_schema_length=None) if p.exists() else pl.DataFrame()
    return out
