"""Topology snapshots (docs/CONTRACT.md 1.1)."""
from __future__ import annotations

from pathlib import Path

import polars as pl

from fleetscope.ingest.tabular import IngestResult, ingest_table
from fleetscope.schemas.landing import TOPOLOGY


def _normalize(df: pl.DataFrame) -> pl.DataFrame:
    if "gpu" not in df.columns:
        df = df.with_columns(gpu=pl.col("ip"))
    return df.with_columns(gpu=pl.coalesce("gpu", "ip"))


def read_topology(path: Path | str) -> IngestResult:
    path = Path(path)
    return ingest_table(path, TOPOLOGY, required=["ip", "host"], normalize=_normalize, constants={"source_file": path.name})


def latest_topology(topology: pl.DataFrame) -> pl.DataFrame:
    """The topology table (every snapshot ingested) -> one row per ip, a later row winning."""
    return topology.unique("ip", keep="last", maintain_order=True)
