"""The landing registry (fleetscope.ingest.registry) against a real warehouse folder."""
import os
import time
from pathlib import Path

import polars as pl

from fleetscope.ingest.registry import register_landing
from fleetscope.warehouse import Warehouse


def _flow_file(path: Path, t0: int, n: int, age_s: float) -> None:
    pl.DataFrame({"start_ns": [t0 + i for i in range(n)], "duration_ns": [10] * n, "src_ip": ["10.0.0.1"] * n,
                  "dst_ip": ["10.0.0.2"] * n, "bytes": [100] * n}).write_parquet(path)
    old = time.time() - age_s
    os.utime(path, (old, old))


def test_a_file_rewritten_with_new_content_is_registered_once_then_left_alone(tmp_path):
    """A collector that replaces a file (or a demo simulated again into the same landing folder) lands
    new content at an old path: it is a new partition, registered once; the next rounds see nothing new.
    The old partition's row for that path used to win half the time, and `fleetscope run` registered
    and ingested the path again every round (demo seed 7 after the simulator changed)."""
    landing, wh = tmp_path / "landing", Warehouse(tmp_path / "w.duckdb")
    wh.init()
    (landing / "flows").mkdir(parents=True)
    names = [f"{c}.parquet" for c in "abcdefghij"]
    for i, name in enumerate(names):
        _flow_file(landing / "flows" / name, 1_700_000_000_000_000_000 + 1000 * i, 4, 120)
    first = register_landing(landing, wh, settle_s=0)
    assert sum(len(v) for v in first.to_run.values()) == len(names)
    for i, name in enumerate(names):   # rewritten: other rows, a newer mtime
        _flow_file(landing / "flows" / name, 1_700_000_000_000_000_000 + 1000 * i, 9, 60)
    second = register_landing(landing, wh, settle_s=0)
    assert sum(len(v) for v in second.to_run.values()) == len(names)
    keys = lambda reg: {k for v in reg.to_run.values() for k in v}   # noqa: E731
    assert not keys(second) & keys(first)   # new content, new partitions
    for _ in range(3):
        again = register_landing(landing, wh, settle_s=0)
        assert sum(len(v) for v in again.to_run.values()) == 0, again.to_run
