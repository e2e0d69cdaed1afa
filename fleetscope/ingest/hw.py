"""GPU hardware samples (docs/CONTRACT.md 1.5)."""
from __future__ import annotations

from pathlib import Path

from fleetscope.ingest.tabular import IngestResult, ingest_table
from fleetscope.schemas.landing import HW


def read_hw(path: Path | str) -> IngestResult:
    path = Path(path)
    return ingest_table(path, HW, required=["ts_ns", "host", "gpu"], constants={"source_file": path.name})
