"""Simulated fleets shared by the simulator tests (each simulated once per session). Every seed draws
its own conventions, so the tests check properties that hold under all of them."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from fleetscope.sim import simulate
from tests.sim.contract import flows_per_contract, read_table

ALL_FAULTS = ("congested_switch:1,degraded_nic:1,slow_gpu:1,straggler:1,flapping_link:1,nic_overload:1,nvlink_down:1,"
              "gc_stall:1,sync_in_forward:1,slow_dataloader:1,hang:1,throttled_racks:1")


class Fleet:
    def __init__(self, root: Path, summary: dict):
        self.root, self.summary = root, summary
        self.landing, self.truth_dir = root / "landing", root / "ground_truth"

    def truth(self, name: str) -> pl.DataFrame:
        return pl.read_csv(self.truth_dir / f"{name}.csv", infer_schema_length=None)

    @property
    def conventions(self) -> dict:
        return json.loads((self.truth_dir / "conventions.json").read_text())

    def files(self, role: str | None = None, kind: str = "flows") -> pl.DataFrame:
        f = self.truth("files").filter(pl.col("kind") == kind)
        return f if role is None else f.filter(pl.col("role") == role)

    def flows(self, unique: bool = True) -> pl.DataFrame:
        """Every landed flow record, read per CONTRACT by an independent reader (the resent copy
        left out when unique)."""
        key = "_flows" if unique else "_flows_all"
        if not hasattr(self, key):
            files = self.files()
            if unique:
                files = files.filter(pl.col("role") != "duplicate")
            parts = [flows_per_contract(self.landing / f).with_columns(file=pl.lit(f)) for f in files["file"]]
            setattr(self, key, pl.concat(parts, how="diagonal_relaxed"))
        return getattr(self, key)

    def topology(self) -> pl.DataFrame:
        return pl.concat([read_table(self.landing / f) for f in self.files(kind="topology")["file"]], how="diagonal_relaxed")

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


@pytest.fixture(scope="session")
def many_seeds(tmp_path_factory) -> list[Fleet]:
    """Small fleets over several seeds (each its own conventions), some healthy, some with random faults."""
    out = []
    for seed in range(6):
        faults = "" if seed % 3 == 0 else f"random:{1 + seed % 3}"
        out.append(_sim(tmp_path_factory, f"seed{seed}", gpus=128, seed=seed, faults=faults, minutes=0.5, captures=False))
    return out
