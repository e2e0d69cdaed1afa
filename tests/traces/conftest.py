import gzip
import json
from pathlib import Path

import pytest

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "real" / "hta"
ALL_TRACES = sorted(REAL.glob("*.json.gz"))
# a missing data folder fails collection here instead of parametrizing nothing
assert len(ALL_TRACES) >= 10, f"the real HTA traces are missing from {REAL} (found {len(ALL_TRACES)})"
GPU_TRACES = [p for p in ALL_TRACES if not p.name.startswith(("cpu_only", "distributed_info_unavailable"))]


def load_json(path: Path) -> dict:
    """Ground truth with the standard library (the code under test never uses it for events)."""
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


@pytest.fixture(scope="session")
def real_dir() -> Path:
    assert REAL.is_dir(), f"real data missing: {REAL}"
    return REAL


def real(name_prefix: str) -> Path:
    hits = [p for p in ALL_TRACES if p.name.startswith(name_prefix)]
    assert len(hits) == 1, (name_prefix, hits)
    return hits[0]
