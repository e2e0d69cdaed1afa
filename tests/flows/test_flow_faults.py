"""Fault localization on real recordings (tests/data/flow_faults: real gloo jobs, truth from the
scripts' logs and the recorder's fault log, which the analysis never sees): healthy fleets raise no
warning or critical verdict, and a slowed host link is named on its own address."""
from pathlib import Path

import polars as pl
import pytest

from benchmarks.flows_accuracy import run_folder

ROOT = Path(__file__).resolve().parents[1] / "data" / "flow_faults" / "seed5"


def _loud(name: str) -> tuple[pl.DataFrame, dict]:
    r = run_folder(ROOT / name, tail_ns=0)
    return r["_tables"]["anomaly_verdicts"].filter(pl.col("severity").is_in(["warning", "critical"])), r


@pytest.mark.parametrize("name", ["dp4-healthy-s5", "pp2dp2+dp2-healthy-s5", "pp2dp3-healthy-s5"])
def test_a_healthy_real_fleet_raises_nothing(name):
    loud, _ = _loud(name)
    assert loud.height == 0, loud.select("detector", "subject").rows()


@pytest.mark.parametrize("name", ["dp4-slow_link-s5", "pp2dp2+dp2-slow_link-s5"])
def test_a_slowed_host_link_is_named_on_its_address(name):
    loud, r = _loud(name)
    subject = pl.read_csv(ROOT / name / "ground_truth" / "faults.csv")["subject"][0]
    assert subject in set(loud.filter(pl.col("scope") == "link")["subject"].to_list())
