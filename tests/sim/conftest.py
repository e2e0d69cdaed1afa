"""Simulated fleets shared by the simulator tests (each simulated once per session)."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from fleetscope.ingest.flows import read_flows
from fleetscope.sim import simulate

ALL_FAULTS = ("congested_switch:1,degraded_nic:1,slow_gpu:1,nvlink_down:1,gc_stall:1,sync_in_forward:1,"
              "slow_dataloader:1,hang:1,throttled_racks:1")


class Fleet:
    def __init__(self, root: Path, summary: dict):
        self.root, self.summary = root, summary
        self.landing, self.truth_dir = root / "landing", root / "ground_truth"

    def truth(self, name: str) -> pl.DataFrame:
        return pl.read_csv(self.truth_dir / f"{name}.csv", infer_schema_length=None)

    def flows(self) -> pl.DataFrame:
        """All landed flow records, read and normalized by the real ingestion code."""
        if not hasattr(self, "_flows"):
            parts = []
            for p in sorted((self.landing / "flows").iterdir()):
                res = read_flows(p)
                assert res.rejected.height == 0, (p.name, res.rejected.head())
                parts.append(res.kept.with_columns(file=pl.lit(p.name)))
            self._flows = pl.concat(parts, how="diagonal_relaxed")
        return self._flows

    @property
    def window(self) -> tuple[int, int]:
        return tuple(json.loads((self.truth_dir / "summary.json").read_text())["window"])


def _sim(tmp_path_factory, name, **kw) -> Fleet:
    root = tmp_path_factory.mktemp(name)
    return Fleet(root, simulate(root, **kw))


@pytest.fixture(scope="session")
def healthy64(tmp_path_factory) -> Fleet:
    return _sim(tmp_path_factory, "healthy64", gpus=64, seed=0, captures=False)


@pytest.fixture(scope="session")
def healthy256(tmp_path_factory) -> Fleet:
    return _sim(tmp_path_factory, "healthy256", gpus=256, seed=3, captures=False)


@pytest.fixture(scope="session")
def faulty256(tmp_path_factory) -> Fleet:
    """Same seed as healthy256, so the same jobs on the same hosts: the faults are the only difference."""
    return _sim(tmp_path_factory, "faulty256", gpus=256, seed=3, faults=ALL_FAULTS, captures=False)
